//! What a run and a seed simulate: the [`Variant`] of the whole run (chosen by the test, or by the
//! `SIM_*` environment in a replay), the extra counter definitions of the `definitions` and
//! `sums` variants, and the [`Plan`] each seed derives from its seed and the variant.

use std::sync::Arc;
use std::time::Duration;

use bson::Timestamp;
use counterd::budget::Budget;
use counterd::config::InitialSnapshot;
use counterd::config::OnHistoryLost;
use counterd::core::classify::Attribution;
use counterd::core::cost;
use counterd::core::key::CounterIx;
use counterd::core::partition::{stream_names, Partition};
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::snapshot::SnapshotSettings;
use counterd::worker::WorkerSettings;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::sim_store::{Broken, SimStore};
use crate::{CATCH_UP, STREAM};

/// A variant of the whole simulation.
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    pub broken: Broken,
    /// Ask for pre-images (the collection has them enabled) in every seed, not only in some,
    /// and let writers remove and set `post_id` in them too.
    pub pre_images: bool,
    /// Truncate the oplog under the worker now and then, so that it finds its history lost.
    pub history_lost: bool,
    /// Configure `start_at` in seeds that lose history too.
    pub lost_start_time: bool,
    /// Every seed's server describes no update (like the fake test server, whose update spec
    /// is incomplete) and has no pre-images: updates are classified from `updateLookup`.
    pub lookups: bool,
    /// Hot posts: most writes and old-row changes go to post 0 (see `State::hot`).
    pub hot: bool,
    /// A share of the writes are multi-document transactions of 2 to 4 comment changes (one
    /// cluster time, one `lsid` + `txnNumber`, all visible at once).
    pub transactions: bool,
    /// Every seed with one stream keeps two counter definitions beyond the default
    /// (`definitions()`), and writers approve, unapprove, change and remove authors.
    pub definitions: bool,
    /// With `definitions`: two sums beside them (`sums()`), and writers change, remove and
    /// spoil (a string) the summed values, which are integers, halves and missing.
    pub sums: bool,
    /// With `definitions`: every seed splits the posts across 2 to 4 partitions, so the
    /// per-author counters (and sums) are written by several partitions, each under its own
    /// guard (issue 42, part B).
    pub partitioned: bool,
}

/// The counter definitions beyond the default of the seeds that keep several: comments per
/// author (`author_id`, which writers change and remove) and approved comments per post
/// (`approved: true`, which writers set and clear), each with its own counters and dirty set.
pub fn definitions() -> Vec<counterd::core::definition::Definition> {
    let definition = |name: &str, group: &str, condition: bson::Document| {
        counterd::core::definition::Definition {
            name: name.into(),
            group: group.into(),
            condition: counterd::core::condition::Condition::parse(&condition)
                .expect("a condition of the supported subset"),
            collection: format!("{name}_counters"),
            kind: counterd::core::definition::Kind::Count,
        }
    };
    vec![
        definition("per_author", "author_id", bson::doc! {}),
        definition("approved", "post_id", bson::doc! {"approved": true}),
    ]
}

/// The sums of the `sums` variant: the ratings per author (integers, halves, missing values and
/// strings, which add nothing) with their row count (`with_count`), and the scores of approved
/// comments per post (halves).
pub fn sums() -> Vec<counterd::core::definition::Definition> {
    let sum = |name: &str, group: &str, field: &str, condition: bson::Document| {
        counterd::core::definition::Definition {
            name: name.into(),
            group: group.into(),
            condition: counterd::core::condition::Condition::parse(&condition)
                .expect("a condition of the supported subset"),
            collection: format!("{name}_counters"),
            kind: counterd::core::definition::Kind::Sum {
                field: field.into(),
            },
        }
    };
    let rows = counterd::core::definition::Definition {
        name: "rating_per_author_rows".into(),
        kind: counterd::core::definition::Kind::Rows {
            of: "rating_per_author".into(),
        },
        ..sum("rating_per_author", "author_id", "rating", bson::doc! {})
    };
    vec![
        sum("rating_per_author", "author_id", "rating", bson::doc! {}),
        rows,
        sum(
            "approved_score",
            "post_id",
            "score",
            bson::doc! {"approved": true},
        ),
    ]
}

/// Share of the writes that are transactions in the `transactions` variants.
pub const TRANSACTION_SHARE: f64 = 0.1;

impl Variant {
    pub const FAITHFUL: Variant = Variant {
        broken: Broken::None,
        pre_images: false,
        history_lost: false,
        lost_start_time: false,
        lookups: false,
        hot: false,
        transactions: false,
        definitions: false,
        sums: false,
        partitioned: false,
    };

    pub fn from_env() -> Variant {
        let broken = match std::env::var("SIM_BROKEN").as_deref() {
            Ok("no_guard") => Broken::NoGuard,
            Ok("seed_fold") => Broken::SeedFold,
            Ok("unconditioned_recount") => Broken::UnconditionedRecount,
            Ok("window_ignored") => Broken::WindowIgnored,
            Ok("cut_transactions") => Broken::CutTransactions,
            _ => Broken::None,
        };
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        Variant {
            broken,
            pre_images: flag("SIM_PRE_IMAGES"),
            history_lost: flag("SIM_HISTORY_LOST"),
            lost_start_time: flag("SIM_LOST_START_TIME"),
            lookups: flag("SIM_LOOKUPS"),
            hot: flag("SIM_HOT"),
            transactions: flag("SIM_TRANSACTIONS"),
            definitions: flag("SIM_DEFINITIONS") || flag("SIM_SUMS") || flag("SIM_PARTITIONED"),
            sums: flag("SIM_SUMS"),
            partitioned: flag("SIM_PARTITIONED"),
        }
    }

    pub fn env_prefix(&self) -> String {
        let mut prefix = String::new();
        match self.broken {
            Broken::None => {}
            Broken::NoGuard => prefix.push_str("SIM_BROKEN=no_guard "),
            Broken::SeedFold => prefix.push_str("SIM_BROKEN=seed_fold "),
            Broken::UnconditionedRecount => prefix.push_str("SIM_BROKEN=unconditioned_recount "),
            Broken::WindowIgnored => prefix.push_str("SIM_BROKEN=window_ignored "),
            Broken::CutTransactions => prefix.push_str("SIM_BROKEN=cut_transactions "),
        }
        if self.pre_images {
            prefix.push_str("SIM_PRE_IMAGES=1 ");
        }
        if self.history_lost {
            prefix.push_str("SIM_HISTORY_LOST=1 ");
        }
        if self.lost_start_time {
            prefix.push_str("SIM_LOST_START_TIME=1 ");
        }
        if self.lookups {
            prefix.push_str("SIM_LOOKUPS=1 ");
        }
        if self.hot {
            prefix.push_str("SIM_HOT=1 ");
        }
        if self.transactions {
            prefix.push_str("SIM_TRANSACTIONS=1 ");
        }
        if self.sums {
            prefix.push_str("SIM_SUMS=1 ");
        }
        if self.partitioned {
            prefix.push_str("SIM_PARTITIONED=1 ");
        } else if self.definitions && !self.sums {
            prefix.push_str("SIM_DEFINITIONS=1 ");
        }
        prefix
    }
}

/// What one seed simulates, derived from the seed.
#[derive(Clone, Debug)]
pub struct Plan {
    pub rounds: usize,
    pub posts: i64,
    pub bucket_width: i64,
    pub settle: i64,
    pub batch_size: usize,
    pub read_max: usize,
    pub fault_rate: f64,
    pub yield_rate: f64,
    pub transient_share: f64,
    pub replays: bool,
    pub takeovers: bool,
    /// Posts split across this many streams, each with its own worker, epoch, checkpoint,
    /// ledger and reconciler.
    pub partitions: u32,
    pub truncation: bool,
    /// `start_at` is time 0 (the worker starts at the beginning when it has no position, and
    /// operators may also move a checkpoint to "unset"); otherwise the worker pins "now" on its
    /// first start, which a first worker run does before anything is written.
    pub start_at_zero: bool,
    /// The server flavour: pre-images asked for and enabled, `updateDescription` in update
    /// events, post-batch resume tokens.
    pub pre_images: bool,
    pub update_descriptions: bool,
    pub post_batch_tokens: bool,
    /// Writers remove `post_id` from rows and set it again.
    pub unset_post_ids: bool,
    /// Some pre-images have expired when read. A known bug double counts rows without `post_id`
    /// when expired and live pre-images mix (see `with_pre_images`), so the faithful run does
    /// not combine the two.
    pub pre_image_expiry: bool,
    /// How often a drained stream answers "nothing new" while others run (else it waits).
    pub drained_answers: f64,
    /// Posts recounted before one shared wait for the worker.
    pub group_size: usize,
    /// An operator edits and deletes counters by hand now and then (drift to be found).
    pub hand_edits: bool,
    /// Share of store-call boundaries at which the caught-up checks run.
    pub probe_rate: f64,
    pub variant: Variant,
    /// The workers take the initial snapshot (else `initial_snapshot = never`), in chunks of
    /// this many rows, of the writes made before the first worker starts.
    pub snapshot: bool,
    pub snapshot_chunk_rows: usize,
    pub existing_writes: usize,
    /// The process's memory budget, shared by every current worker of the seed (a takeover's
    /// previous holder has its own: it is another process): in half the seeds a
    /// tiny one (each stream's reply reserve and room for a few events), so that reads and
    /// read aheads are cut by bytes, snapshot chunks are split by bytes and workers of several
    /// partitions wait for each other's room.
    pub budget: Budget,
    /// Row ids a recount group may hold: in a third of the seeds a handful, so that posts with
    /// more rows are recounted by a count alone (which must refuse while their rows change).
    pub recount_rows: usize,
    /// Two counter definitions beyond the default (see [`definitions`]) are kept from the same
    /// stream, and writers approve, unapprove and change authors (one stream only, unless the
    /// variant is `partitioned`).
    pub definitions: bool,
    /// The two sums of [`sums`] beside them (with `definitions` only).
    pub sums: bool,
}

impl Plan {
    pub fn new(seed: u64, variant: Variant) -> Plan {
        let mut r = StdRng::seed_from_u64(seed ^ 0x5EED_0FC0_DE00_u64);
        let truncation = variant.history_lost;
        let pre_images = !variant.lookups && (variant.pre_images || r.random_bool(0.3));
        let mut plan = Plan {
            rounds: r.random_range(4..=24),
            posts: r.random_range(1..=8),
            bucket_width: [5, 10, 60][r.random_range(0..3)],
            settle: r.random_range(0..=30),
            batch_size: r.random_range(1..=25),
            read_max: r.random_range(1..=12),
            fault_rate: [0.0, 0.03, 0.1, 0.25][r.random_range(0..4)],
            yield_rate: [0.0, 0.25, 0.6][r.random_range(0..3)],
            transient_share: r.random_range(0.0..0.5),
            replays: r.random_bool(0.35),
            takeovers: r.random_bool(0.3),
            truncation,
            // A known bug: after history is lost the worker restarts at the configured
            // `start_at`, which is lost too, in a hot loop (`with_history_lost_and_start_at`).
            start_at_zero: !truncation || variant.lost_start_time,
            partitions: match variant.partitioned {
                false => [1, 1, 1, 2, 3][r.random_range(0..5)],
                true => [2, 3, 4][r.random_range(0..3)],
            },
            pre_images,
            // Servers with pre-images (6.0+) always describe updates.
            update_descriptions: !variant.lookups && (r.random_bool(0.75) || pre_images),
            post_batch_tokens: r.random_bool(0.75),
            unset_post_ids: true,
            pre_image_expiry: false,
            drained_answers: [0.1, 0.3, 0.7][r.random_range(0..3)],
            group_size: [1, 2, 100][r.random_range(0..3)],
            hand_edits: r.random_bool(0.75),
            probe_rate: std::env::var("SIM_PROBE_RATE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(1.0),
            variant,
            snapshot: false,
            snapshot_chunk_rows: 1,
            existing_writes: 0,
            budget: Budget::unlimited(),
            recount_rows: usize::MAX,
            definitions: false,
            sums: false,
        };
        // Drawn last, so that the plans of the other fields stay what they were per seed.
        plan.snapshot = r.random_bool(0.7);
        plan.snapshot_chunk_rows = r.random_range(1..=6);
        plan.existing_writes = [0, 5, 30][r.random_range(0..3)];
        if r.random_bool(0.5) {
            // Every stream's reply reserve, then room for a read of one event (a simulated
            // event is charged about 2.5 KiB) and up to five more; snapshot rows (512 B each)
            // are cut to what is left.
            let streams = plan.partitions as usize;
            let room = cost::MIN_READ + r.random_range(0..=5) * 2600 + r.random_range(0..2048);
            plan.budget = Budget::new(streams * cost::REPLY_RESERVE + room);
        }
        if !plan.snapshot && !plan.start_at_zero {
            plan.existing_writes = 0; // nothing would count them before the final sweep
        }
        if plan.pre_images && !variant.pre_images {
            // Either expired pre-images or rows that lose `post_id`, not both.
            plan.pre_image_expiry = r.random_bool(0.5);
            plan.unset_post_ids = !plan.pre_image_expiry;
        } else {
            plan.pre_image_expiry = plan.pre_images;
        }
        // Drawn after everything else, so that each seed's other fields stay what they were.
        if r.random_bool(1.0 / 3.0) {
            plan.recount_rows = r.random_range(0..=4);
        }
        // A variant's, not a draw: every seed of the other variants runs exactly as it did
        // before definitions existed (replay commands name seeds).
        plan.definitions = (plan.partitions == 1 || variant.partitioned) && variant.definitions;
        plan.sums = plan.definitions && variant.sums;
        plan
    }

    /// The counter definitions this seed keeps beyond the default.
    pub fn extra(&self) -> Vec<counterd::core::definition::Definition> {
        let mut extra = if self.definitions {
            definitions()
        } else {
            Vec::new()
        };
        if self.sums {
            extra.extend(sums());
        }
        extra
    }

    /// The counter definitions this seed keeps: the default (per post) first.
    pub fn definitions(&self) -> Vec<CounterIx> {
        (0..=self.extra().len()).map(CounterIx).collect()
    }

    /// The streams: the base stream, or one per partition.
    pub fn streams(&self) -> Vec<(String, Option<Partition>)> {
        stream_names(STREAM, self.partitions)
    }

    pub fn worker_settings(&self, stream: &str, partition: Option<Partition>) -> WorkerSettings {
        WorkerSettings {
            stream: stream.into(),
            partition,
            batch_size: self.batch_size,
            max_batch_wait: Duration::ZERO,
            idle_interval: Duration::ZERO,
            max_await: Duration::ZERO,
            attribution: Attribution::Auto,
            bucket_width_secs: self.bucket_width,
            on_history_lost: OnHistoryLost::Resweep,
            start_at: self.start_at_zero.then_some(Timestamp {
                time: 0,
                increment: 0,
            }),
            pre_images: self.pre_images,
            pipeline: Vec::new(),
            retry_min_delay: Duration::ZERO,
            retry_max_delay: Duration::ZERO,
            budget: self.budget.clone(),
            schema: counterd::core::schema::Schema::default().with_more(self.extra()),
            snapshot: SnapshotSettings {
                initial: if self.snapshot {
                    InitialSnapshot::Auto
                } else {
                    InitialSnapshot::Never
                },
                chunk_rows: self.snapshot_chunk_rows,
                rows_per_second: 0,
            },
            ..WorkerSettings::default()
        }
    }

    // `..default()` keeps this compiling when a setting is added.
    #[allow(clippy::needless_update)]
    pub fn reconcile_settings(
        &self,
        stream: &str,
        partition: Option<Partition>,
        max_posts: usize,
    ) -> ReconcileSettings {
        ReconcileSettings {
            stream: stream.into(),
            partition,
            bucket_width_secs: self.bucket_width,
            settle_secs: self.settle,
            max_posts,
            counts_per_second: 0,
            fold_retries: 3,
            sweep_window: 3,
            group_size: self.group_size,
            catch_up: CATCH_UP,
            recount_rows: self.recount_rows,
            // A background pass over every post in about six steps.
            background_pass: Some(Duration::from_secs(60)),
            interval: Duration::from_secs(10),
            ..ReconcileSettings::default()
        }
    }

    /// One reconciler per counter definition of the seed, with `settings` (of one stream).
    pub fn reconcilers(
        &self,
        store: &Arc<SimStore>,
        settings: ReconcileSettings,
    ) -> Vec<Reconciler<SimStore>> {
        let names = self.extra();
        self.definitions()
            .into_iter()
            .map(|ix| {
                let name = match ix {
                    CounterIx::DEFAULT => counterd::core::definition::DEFAULT_COUNTER,
                    CounterIx(n) => &names[n - 1].name,
                };
                let settings = settings.clone().for_counter(ix, name);
                Reconciler::with_clock(store.clone(), settings, store.clock())
            })
            .collect()
    }

    pub fn start_at(&self) -> Option<Timestamp> {
        self.worker_settings(STREAM, None).start_at
    }
}
