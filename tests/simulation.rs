//! Deterministic simulation of counterd: the real classification, coalescing, guard, intent
//! recovery, row-level recount and fold code (`Worker`, `Reconciler`), driven against an
//! in-process store behind the same seam as MongoDB (`counterd::store::memory`, wrapped in the
//! simulation's hooks by `tests/support/sim_store/`).
//!
//! One seed is one run: a seeded RNG, a simulated clock, no threads racing. In each round,
//! writers change comments (insert, also back-dated, some to before the simulation began; soft
//! delete, undelete, move, remove `post_id`, hard delete, replace, body and `created_at`
//! edits, re-insert of a deleted `_id`), often of the oldest rows, whose events change settled
//! buckets; in most rounds a reconciler runs one to three passes (a requested sweep, the dirty
//! posts, a step of the background sweep) racing them; in some an operator edits counters by
//! hand; and the real worker of each stream tails the oplog. They are futures polled in a
//! seeded order on one thread, interleaving at every store call and between the statements of
//! a multi-statement write. Worker and reconciler read time from the simulated clock
//! (`with_clock`): their pauses (the reconciler's wait for the worker, 20 looks at most, the
//! worker's idle pause and backoff) only yield to the other actors. A drained stream sometimes
//! answers "nothing new" while others run, so workers record drained positions mid-round and
//! quiet-window recounts can complete; a reconciler whose worker is stopped gives up and leaves
//! its posts dirty. Store calls fail by injected faults (before, with only some statements of a
//! write applied, after the write landed but its reply was lost, transient or fatal), so the
//! worker crashes at every step boundary: after reading, after the intent, after some of the
//! writes, after all writes, before the checkpoint; and reconcile passes fail midway. Every
//! worker start takes a new epoch and adopts the checkpoint, as the lease does; in a takeover
//! the previous worker keeps running until it is fenced out. Between rounds an operator moves
//! the checkpoint back (`replay`), so events are redelivered from older positions, and may edit
//! or delete a counter. Seeds also vary the server flavour (pre-images, `updateDescription`,
//! post-batch tokens) and split posts across 1 to 3 partitions, each with its own stream,
//! worker, epoch, ledger and reconciler.
//!
//! Drift is injected by hand only: add `k != 0` to `base_count`, or to `live_delta` together
//! with one of its buckets at or below the clock's bucket (during rounds too), or delete the
//! counter of a post with live rows (between rounds, with no batch of that post in flight).
//! The store records per post the drift each edit caused (displayed minus truth), and the drift
//! every installed fold corrected. Every reconcile pass's report is kept: the corrections it
//! reports must be exactly those its installed folds made; a pass that fails midway reports
//! nothing, so the folds it installed before failing are counted from the store instead.
//!
//! Checks:
//! * wherever every stream's worker has caught up (nothing in flight, every event after its
//!   resume position at or below its high water, none lost to a truncated oplog), at every
//!   store-call boundary at which the store changed since the last look (`SIM_PROBE_RATE`, 1 by
//!   default, samples them) and at every round boundary: the increments applied equal the
//!   truth per post and creation bucket (no event applied twice or lost), and every post
//!   displays (`base_count + live_delta`, 0 without a counter) its truth plus exactly the drift
//!   injected into it and not yet corrected;
//! * at every installed fold: the corrections of the post so far, high and low apart, never
//!   exceed the drift injected into it of that sign (the reconciler never invents drift);
//! * at every round: `live_delta` is the sum of the buckets and a pending batch is below the
//!   high water;
//! * after the last round, once the workers caught up: the caught-up checks;
//! * after a final reconcile (the requested sweep, then the dirty posts) past the settle time
//!   and every row's bucket: no post is dirty, the caught-up checks hold, and every bucket at
//!   or above a counter's watermark holds exactly its live rows plus what the operator put
//!   there by hand;
//! * after a final full sweep past every bucket: every counter equals the truth, no post is
//!   dirty, and the corrections reported per post, with sign, sum to exactly the drift injected
//!   into it.
//!
//! Seeds that lost history (a gap recorded, or a resume position truncated away) are exempt
//! from the exact-drift checks, the caught-up checks and the missing-bucket part of the bucket
//! check (events in a gap were never seen: their corrections are real drift), but must still
//! end with every counter equal to the truth.
//!
//! With `transactions` (`with_transactions`), writers sometimes write 2 to 4 comment changes in
//! one multi-document transaction (one cluster time, one `lsid` + `txnNumber`, all in the oplog
//! at once), and every batch end the worker records is checked not to fall inside one
//! (`State::check_batch_end`, which explains why this store, without snapshot reads, could not
//! show a cut as a wrong count).
//!
//! With `definitions` (`with_several_counters`), every seed with one stream keeps two counter
//! definitions beyond the default (per author, approved per post), writers also approve,
//! unapprove and change or remove authors, one reconciler per definition runs, and every
//! counter of every definition must equal its truth wherever the caught-up checks run and after
//! the final sweep, with no fold of theirs correcting drift (none is injected there).
//!
//! `removing_the_guard_is_caught`, `removing_the_recount_condition_is_caught`,
//! `ignoring_the_recount_window_is_caught`, `the_seed_fold_formula_is_caught` and
//! `cutting_batches_inside_transactions_is_caught` run deliberately broken variants and expect
//! a failure. A bug the simulation finds is kept as an ignored test that names it (run them
//! with `-- --ignored`) until it is fixed; none is open now. The faithful run leaves out what the `with_*` variants need (expired
//! pre-images together with rows that lose `post_id`; a truncated oplog). Small deterministic
//! cases guard bugs the simulation found.
//!
//! Environment: `SIM_SEEDS` (default 3000) and `SIM_SEED_START` choose the seeds;
//! `SIM_SEED=<n>` replays one (`SIM_TRACE=1` prints every step);
//! `SIM_BROKEN=no_guard|seed_fold|unconditioned_recount|window_ignored|cut_transactions`,
//! `SIM_HOT=1` (hot posts), `SIM_TRANSACTIONS=1`, `SIM_DEFINITIONS=1`, `SIM_PRE_IMAGES=1`,
//! `SIM_HISTORY_LOST=1`, `SIM_LOST_START_TIME=1` and `SIM_LOOKUPS=1` (no update descriptions)
//! select the variant, of one seed or of a range. A failing seed prints the exact command that
//! replays it.

#[path = "support/sim_store/mod.rs"]
mod sim_store;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bson::Timestamp;
use counterd::budget::Budget;
use counterd::config::InitialSnapshot;
use counterd::config::OnHistoryLost;
use counterd::core::batch::{bucket_of, DirtyMark};
use counterd::core::classify::Attribution;
use counterd::core::cost;
use counterd::core::event::Token;
use counterd::core::key::CounterIx;
use counterd::core::key::PostId;
use counterd::core::partition::{stream_names, Partition};
use counterd::reconcile::{run_requested_sweeps, ReconcileSettings, Reconciler, RunReport};
use counterd::recount::CatchUp;
use counterd::snapshot::SnapshotSettings;
use counterd::store::prelude::*;
use counterd::store::{Fence, Position, StoreError, StoreResult};
use counterd::worker::{Worker, WorkerError, WorkerSettings, WorkerStatus};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use sim_store::{yield_now, Broken, Faults, Probe, SimStore, State, INJECTED};

const STREAM: &str = "comments";
/// 2100-01-01T00:00:00Z: where the simulated clock starts (`src` reads only the simulated
/// clock; this start just keeps simulated times apart from the real ones).
const START_CLOCK: i64 = 4_102_444_800;
/// The reconciler's wait for the worker in the simulation: 20 looks, 100 ms apart (a look only
/// yields to the other actors), then the counted posts stay dirty.
/// No lease is held in the simulation, so the reconciler's own read of a stream without a
/// worker is off (it would race the workers' streams): it waits for the workers.
const CATCH_UP: CatchUp = CatchUp {
    timeout: Duration::from_secs(2),
    poll: Duration::from_millis(100),
    probe_without_worker: false,
};
const DEFAULT_SEEDS: u64 = 3000;

/// A variant of the whole simulation.
#[derive(Clone, Copy, Debug)]
struct Variant {
    broken: Broken,
    /// Ask for pre-images (the collection has them enabled) in every seed, not only in some,
    /// and let writers remove and set `post_id` in them too.
    pre_images: bool,
    /// Truncate the oplog under the worker now and then, so that it finds its history lost.
    history_lost: bool,
    /// Configure `start_at` in seeds that lose history too.
    lost_start_time: bool,
    /// Every seed's server describes no update (like the fake test server, whose update spec
    /// is incomplete) and has no pre-images: updates are classified from `updateLookup`.
    lookups: bool,
    /// Hot posts: most writes and old-row changes go to post 0 (see `State::hot`).
    hot: bool,
    /// A share of the writes are multi-document transactions of 2 to 4 comment changes (one
    /// cluster time, one `lsid` + `txnNumber`, all visible at once).
    transactions: bool,
    /// Every seed with one stream keeps two counter definitions beyond the default
    /// (`definitions()`), and writers approve, unapprove, change and remove authors.
    definitions: bool,
    /// With `definitions`: two sums beside them (`sums()`), and writers change, remove and
    /// spoil (a string) the summed values, which are integers, halves and missing.
    sums: bool,
}

/// The counter definitions beyond the default of the seeds that keep several: comments per
/// author (`author_id`, which writers change and remove) and approved comments per post
/// (`approved: true`, which writers set and clear), each with its own counters and dirty set.
fn definitions() -> Vec<counterd::core::definition::Definition> {
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
fn sums() -> Vec<counterd::core::definition::Definition> {
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
const TRANSACTION_SHARE: f64 = 0.1;

impl Variant {
    const FAITHFUL: Variant = Variant {
        broken: Broken::None,
        pre_images: false,
        history_lost: false,
        lost_start_time: false,
        lookups: false,
        hot: false,
        transactions: false,
        definitions: false,
        sums: false,
    };

    fn from_env() -> Variant {
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
            definitions: flag("SIM_DEFINITIONS") || flag("SIM_SUMS"),
            sums: flag("SIM_SUMS"),
        }
    }

    fn env_prefix(&self) -> String {
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
        } else if self.definitions {
            prefix.push_str("SIM_DEFINITIONS=1 ");
        }
        prefix
    }
}

/// What one seed simulates, derived from the seed.
#[derive(Clone, Debug)]
struct Plan {
    rounds: usize,
    posts: i64,
    bucket_width: i64,
    settle: i64,
    batch_size: usize,
    read_max: usize,
    fault_rate: f64,
    yield_rate: f64,
    transient_share: f64,
    replays: bool,
    takeovers: bool,
    /// Posts split across this many streams, each with its own worker, epoch, checkpoint,
    /// ledger and reconciler.
    partitions: u32,
    truncation: bool,
    /// `start_at` is time 0 (the worker starts at the beginning when it has no position, and
    /// operators may also move a checkpoint to "unset"); otherwise the worker pins "now" on its
    /// first start, which a first worker run does before anything is written.
    start_at_zero: bool,
    /// The server flavour: pre-images asked for and enabled, `updateDescription` in update
    /// events, post-batch resume tokens.
    pre_images: bool,
    update_descriptions: bool,
    post_batch_tokens: bool,
    /// Writers remove `post_id` from rows and set it again.
    unset_post_ids: bool,
    /// Some pre-images have expired when read. A known bug double counts rows without `post_id`
    /// when expired and live pre-images mix (see `with_pre_images`), so the faithful run does
    /// not combine the two.
    pre_image_expiry: bool,
    /// How often a drained stream answers "nothing new" while others run (else it waits).
    drained_answers: f64,
    /// Posts recounted before one shared wait for the worker.
    group_size: usize,
    /// An operator edits and deletes counters by hand now and then (drift to be found).
    hand_edits: bool,
    /// Share of store-call boundaries at which the caught-up checks run.
    probe_rate: f64,
    variant: Variant,
    /// The workers take the initial snapshot (else `initial_snapshot = never`), in chunks of
    /// this many rows, of the writes made before the first worker starts.
    snapshot: bool,
    snapshot_chunk_rows: usize,
    existing_writes: usize,
    /// The process's memory budget, shared by every current worker of the seed (a takeover's
    /// previous holder has its own: it is another process): in half the seeds a
    /// tiny one (each stream's reply reserve and room for a few events), so that reads and
    /// read aheads are cut by bytes, snapshot chunks are split by bytes and workers of several
    /// partitions wait for each other's room.
    budget: Budget,
    /// Row ids a recount group may hold: in a third of the seeds a handful, so that posts with
    /// more rows are recounted by a count alone (which must refuse while their rows change).
    recount_rows: usize,
    /// Two counter definitions beyond the default (see [`definitions`]) are kept from the same
    /// stream, and writers approve, unapprove and change authors (one stream only: the
    /// configuration refuses definitions with partitions).
    definitions: bool,
    /// The two sums of [`sums`] beside them (with `definitions` only).
    sums: bool,
}

impl Plan {
    fn new(seed: u64, variant: Variant) -> Plan {
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
            partitions: [1, 1, 1, 2, 3][r.random_range(0..5)],
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
        plan.definitions = plan.partitions == 1 && variant.definitions;
        plan.sums = plan.definitions && variant.sums;
        plan
    }

    /// The counter definitions this seed keeps beyond the default.
    fn extra(&self) -> Vec<counterd::core::definition::Definition> {
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
    fn definitions(&self) -> Vec<CounterIx> {
        (0..=self.extra().len()).map(CounterIx).collect()
    }

    /// The streams: the base stream, or one per partition.
    fn streams(&self) -> Vec<(String, Option<Partition>)> {
        stream_names(STREAM, self.partitions)
    }

    fn worker_settings(&self, stream: &str, partition: Option<Partition>) -> WorkerSettings {
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
            schema: counterd::core::schema::Schema {
                counters: self.extra(),
                ..counterd::core::schema::Schema::default()
            },
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
    fn reconcile_settings(
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
    fn reconcilers(
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

    fn start_at(&self) -> Option<Timestamp> {
        self.worker_settings(STREAM, None).start_at
    }
}

/// What a seed did, for coverage.
#[derive(Clone, Debug, Default)]
struct Summary {
    stats: BTreeMap<String, u64>,
    events: usize,
}

/// A failed seed.
struct Failure {
    seed: u64,
    plan: Plan,
    message: String,
    trace_tail: Vec<String>,
}

impl Failure {
    fn report(&self) -> String {
        let mut out = format!(
            "simulation seed {} FAILED: {}\nplan: {:?}\nlast steps:\n",
            self.seed, self.message, self.plan
        );
        for line in &self.trace_tail {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!(
            "replay: {}SIM_SEED={} cargo test --test simulation -- --nocapture   (add SIM_TRACE=1 for every step)\n",
            self.plan.variant.env_prefix(),
            self.seed
        ));
        out
    }
}

type Errors = Rc<RefCell<Vec<String>>>;
type Actor<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Polls every actor, in order, until all are done: the seeded interleaving (actors yield at
/// store calls) is the only source of concurrency.
async fn join_in_order(mut actors: Vec<Actor<'_>>) {
    let mut done = vec![false; actors.len()];
    std::future::poll_fn(|cx| {
        for (actor, done) in actors.iter_mut().zip(done.iter_mut()) {
            if !*done && actor.as_mut().poll(cx).is_ready() {
                *done = true;
            }
        }
        if done.iter().all(|d| *d) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// A fault the simulation injected (workers it stops end with `Ok`, through their shutdown).
fn injected(e: &StoreError) -> bool {
    match e {
        StoreError::Transient { message, .. } | StoreError::Fatal { message, .. } => {
            message.starts_with(INJECTED)
        }
        _ => false,
    }
}

fn writer(store: Arc<SimStore>, ops: usize) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..ops {
            {
                let mut s = store.lock();
                let what = s.write_random();
                let line = format!("write @{}: {what}", s.clock);
                s.note(line);
            }
            store.maybe_yield().await;
        }
        store.lock().others_running -= 1;
    })
}

/// The corrections reconcile runs reported, per post with sign.
type Reported = Rc<RefCell<BTreeMap<PostId, i64>>>;

/// Runs one reconcile pass and keeps the corrections it reports. Only one reconcile runs at a
/// time, so the folds the store saw installed meanwhile are this run's: a run that completes
/// must report exactly those. A run that fails (an injected fault) returns no report, so the
/// folds it installed before failing are taken from the store instead (and counted).
async fn accounted(
    store: &SimStore,
    reported: &Reported,
    errors: &Errors,
    what: String,
    run: impl Future<Output = StoreResult<Option<RunReport>>>,
) {
    let start = store.lock().fold_log.len();
    let outcome = run.await;
    let mut s = store.lock();
    let installed = s.fold_log[start..].to_vec();
    let kept = match outcome {
        Ok(report) => {
            let Some(report) = report else {
                return;
            };
            if !report.summary.counter.is_empty() {
                // Another definition's run: nothing is injected into its counters, so a fold
                // that corrected drift there is caught where it is installed (`seam.rs`).
                s.stat(format!("{} run of another definition", report.summary.kind));
                s.note(format!(
                    "  {what}: corrections {:?}, in flight {}",
                    report.corrections, report.summary.in_flight
                ));
                return;
            }
            let mut got: Vec<(PostId, i64)> = report
                .corrections
                .iter()
                .map(|c| (c.post.clone(), c.drift.as_i64()))
                .collect();
            let mut want = installed;
            got.sort();
            want.sort();
            if got != want {
                errors.borrow_mut().push(format!(
                    "{what} reported the corrections {got:?}, but the folds it installed corrected {want:?}"
                ));
            }
            for (key, n) in [
                ("recount in flight", report.summary.in_flight),
                ("folded but still dirty", report.summary.waiting),
            ] {
                if n > 0 {
                    *s.stats.entry(key.into()).or_default() += n;
                }
            }
            if !got.is_empty() {
                s.stat(format!("{} run corrected drift", report.summary.kind));
            }
            s.note(format!(
                "  {what}: corrections {got:?}, in flight {}, contended {:?}",
                report.summary.in_flight, report.contended
            ));
            got
        }
        Err(e) => {
            if !injected(&e) {
                errors.borrow_mut().push(format!("{what} failed: {e}"));
            }
            if !installed.is_empty() {
                s.stat("corrections of a failed run (unreported)");
            }
            s.note(format!(
                "  {what} failed ({e}); it had corrected {installed:?}"
            ));
            installed
        }
    };
    let mut reported = reported.borrow_mut();
    for (post, drift) in kept {
        *reported.entry(post).or_default() += drift;
    }
}

/// The sweep a lost history requested, of every definition of one stream (cleared once all
/// of them swept), as the daemon's reconcile loop runs it; the default definition's report
/// (the one [`accounted`] checks against the folds installed).
async fn requested_sweeps(
    definitions: &[Reconciler<SimStore>],
    now: i64,
) -> StoreResult<Option<RunReport>> {
    let reports = run_requested_sweeps(definitions, now, None).await?;
    Ok(reports.into_iter().find(|r| r.summary.counter.is_empty()))
}

/// `runs` reconcile passes, each of a stream chosen at random, as its replica's reconcile loop
/// runs them: a requested sweep first, then the dirty posts, then (usually) a step of the
/// background sweep. They start at a random point of the round and race the writers and
/// workers.
fn reconciler(
    store: Arc<SimStore>,
    plan: &Plan,
    runs: usize,
    errors: Errors,
    reported: Reported,
) -> Actor<'static> {
    let (max_posts, delay) = {
        let mut s = store.lock();
        (
            s.rng.random_range(1..=plan.posts as usize + 1),
            s.rng.random_range(0..8),
        )
    };
    let reconcilers: Vec<(String, Vec<Reconciler<SimStore>>)> = plan
        .streams()
        .into_iter()
        .map(|(stream, partition)| {
            let settings = plan.reconcile_settings(&stream, partition, max_posts);
            (stream, plan.reconcilers(&store, settings))
        })
        .collect();
    Box::pin(async move {
        for _ in 0..delay {
            yield_now().await;
        }
        for _ in 0..runs {
            let (now, which, background) = {
                let mut s = store.lock();
                let which = s.rng.random_range(0..reconcilers.len());
                let background = s.rng.random_bool(0.6);
                let now = s.clock;
                s.note(format!("reconcile {} @{now}", reconcilers[which].0));
                (now, which, background)
            };
            let (stream, definitions) = &reconcilers[which];
            let run = |what: &str| format!("{what} of {stream} @{now}");
            accounted(
                &store,
                &reported,
                &errors,
                run("requested sweep"),
                requested_sweeps(definitions, now),
            )
            .await;
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let run = |what: &str| format!("{what} of {stream} ({counter}) @{now}");
                accounted(&store, &reported, &errors, run("reconcile"), async {
                    reconciler.run_dirty(now).await.map(Some)
                })
                .await;
                if background {
                    accounted(
                        &store,
                        &reported,
                        &errors,
                        run("background step"),
                        reconciler.background_step(now, now % 2 == 0),
                    )
                    .await;
                }
            }
            store.maybe_yield().await;
        }
        store.lock().others_running -= 1;
    })
}

/// One hand edit of a counter by an operator: add `k != 0` to `base_count`, or to `live_delta`
/// together with one of its buckets at or below the clock's bucket, or (with `delete`) delete
/// the counter of a post that has live rows. The store records the drift each causes.
fn hand_edit(s: &mut State, delete: bool) {
    let posts: Vec<PostId> = s.displayed().into_keys().collect();
    if posts.is_empty() {
        return;
    }
    let post = posts[s.rng.random_range(0..posts.len())].clone();
    let k = [-3, -2, -1, 1, 2, 3][s.rng.random_range(0..6)];
    let now_bucket = bucket_of(Some(s.now()), s.bucket_width);
    let has_rows = s.truth().get(&post).is_some_and(|n| *n > 0);
    match s.rng.random_range(0..3) {
        1 => {
            let buckets: Vec<i64> = s
                .counter_buckets(&post)
                .unwrap_or_default()
                .into_iter()
                .filter(|b| *b <= now_bucket)
                .collect();
            if buckets.is_empty() {
                s.inject_base(&post, k);
            } else {
                let bucket = buckets[s.rng.random_range(0..buckets.len())];
                s.inject_bucket(&post, bucket, k);
            }
        }
        2 if delete && has_rows => {
            if s.delete_counter(&post).is_none() {
                s.inject_base(&post, k);
            }
        }
        _ => {
            s.inject_base(&post, k);
        }
    }
}

/// An operator editing counters by hand while everything else runs.
fn operator(store: Arc<SimStore>, edits: usize) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..edits {
            let turns = store.lock().rng.random_range(0..12);
            for _ in 0..turns {
                yield_now().await;
            }
            // Not a delete: a worker that lost its lease may still be writing this round.
            hand_edit(&mut store.lock(), false);
        }
        store.lock().others_running -= 1;
    })
}

/// Records, for each stream, what its worker does when it finds the stream drained: every event
/// before the server's position now is applied. Only where nothing is in flight.
async fn record_drained(store: &SimStore, streams: &[String]) -> StoreResult<()> {
    let at = store.read_position().await?.lower;
    for stream in streams {
        let epoch = store.lock().checkpoint_view(stream).map_or(0, |c| c.epoch);
        let fence = Fence {
            stream: stream.clone(),
            epoch,
        };
        store.record_caught_up(&fence, at).await?;
    }
    Ok(())
}

/// A reconciler on the simulated clock, with the simulation's short wait for the worker.
fn sim_reconciler(store: &Arc<SimStore>, settings: ReconcileSettings) -> Reconciler<SimStore> {
    let settings = ReconcileSettings {
        catch_up: CATCH_UP,
        ..settings
    };
    Reconciler::with_clock(store.clone(), settings, store.clock())
}

/// One run of the real worker, from whatever the store holds, until it is stopped or crashed.
/// `adopt`: the worker took the lease with a new epoch and stamps the checkpoint with it first
/// (a worker that does not adopt is the previous holder, still running during a takeover);
/// `newest`: the newest epoch of the round (being fenced out by it is expected).
fn worker(
    store: Arc<SimStore>,
    settings: WorkerSettings,
    epoch: i64,
    adopt: bool,
    delay: usize,
    newest: i64,
    errors: Errors,
) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..delay {
            yield_now().await;
        }
        let stream = settings.stream.clone();
        store.lock().note(format!(
            "worker {stream} epoch {epoch} starts{}",
            if adopt { " (takeover)" } else { "" }
        ));
        let outcome = async {
            let fence = Fence {
                stream: stream.clone(),
                epoch,
            };
            if adopt {
                store
                    .adopt_checkpoint(&fence)
                    .await
                    .map_err(WorkerError::Store)?;
            }
            let (handle, shutdown) = store.for_worker();
            let w = Worker::new(
                Arc::new(handle),
                settings,
                Arc::new(WorkerStatus::default()),
            )
            .with_clock(store.clock());
            w.run(epoch, shutdown).await
        }
        .await;
        let verdict = match &outcome {
            Ok(()) => None,
            Err(WorkerError::Store(e) | WorkerError::Startup(e)) if injected(e) => None,
            Err(WorkerError::Store(StoreError::Fenced { .. })) if epoch < newest => None,
            Err(e) => Some(format!("worker {stream} epoch {epoch} stopped: {e}")),
        };
        {
            let mut s = store.lock();
            let line = match &outcome {
                Ok(()) => format!("worker {stream} epoch {epoch} stopped (shut down)"),
                Err(e) => format!("worker {stream} epoch {epoch} stopped: {e}"),
            };
            s.note(line);
            if matches!(outcome, Err(WorkerError::Store(StoreError::Fenced { .. }))) {
                s.stat("previous holder fenced out");
            }
            s.workers_running -= 1;
        }
        if let Some(v) = verdict {
            errors.borrow_mut().push(v);
        }
    })
}

/// The checks that hold wherever every stream's worker has caught up (nothing in flight, no
/// event left to count) and no history was lost: the increments applied equal the truth per
/// post and creation bucket (no event was applied twice or never), and every post displays
/// its truth plus exactly the drift injected into it by hand and not yet corrected by a fold (a
/// reconcile that installed a recount which had seen an event in flight shows up here as drift
/// nobody injected). Returns whether the point was checked.
fn check_when_caught_up(
    s: &State,
    streams: &[String],
    start_at: Option<Timestamp>,
) -> Result<bool, String> {
    if s.has_gaps() || !s.caught_up(streams, start_at) {
        return Ok(false);
    }
    let by_bucket = s.truth_by_bucket();
    let mut keys: Vec<&(PostId, i64)> = by_bucket.keys().chain(s.shadow.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let want = by_bucket.get(key).copied().unwrap_or(0);
        let got = s.shadow.get(key).copied().unwrap_or(0);
        if want != got {
            return Err(format!(
                "post {} bucket {}: the increments applied sum to {got}, the truth is {want} (an event was applied twice or never)",
                key.0, key.1
            ));
        }
    }
    let truth = s.truth();
    let displayed = s.displayed();
    let mut posts: Vec<&PostId> = truth
        .keys()
        .chain(displayed.keys())
        .chain(s.injected.keys())
        .chain(s.corrected.keys())
        .collect();
    posts.sort();
    posts.dedup();
    for post in posts {
        let shown = displayed.get(post).copied().unwrap_or(0);
        let want = truth.get(post).copied().unwrap_or(0);
        let injected = s.injected.get(post).copied().unwrap_or_default();
        let corrected = s.corrected.get(post).copied().unwrap_or_default();
        if shown - want != injected.net - corrected.net {
            return Err(format!(
                "post {post} displays {shown}, its truth is {want} (off by {:+}), but the drift injected by hand and not yet corrected is {:+} (injected {injected:?}, corrected {corrected:?}): a fold invented drift, or an event was counted twice or never",
                shown - want,
                injected.net - corrected.net
            ));
        }
    }
    check_other_definitions(s, "at a caught-up point")?;
    Ok(true)
}

/// Every counter of every definition beyond the default displays exactly its truth (nothing is
/// injected into them) and its `count` field agrees.
fn check_other_definitions(s: &State, when: &str) -> Result<(), String> {
    for counter in s.memory.counter_ixs().into_iter().skip(1) {
        let truth = s.truth_of(counter);
        let displayed = s.displayed_of(counter);
        let mut groups: Vec<&PostId> = truth.keys().chain(displayed.keys()).collect();
        groups.sort();
        groups.dedup();
        for group in groups {
            let want = truth.get(group).copied().unwrap_or_default();
            let (shown, count) = displayed.get(group).copied().unwrap_or_default();
            if shown.differs(want) || count.differs(shown) {
                return Err(format!(
                    "definition #{} ({}), group {group} {when}: displays {shown} (count {count}), its truth is {want}",
                    counter.0,
                    s.memory.definitions[counter.0 - 1].name
                ));
            }
        }
    }
    Ok(())
}

/// The simulation of one seed, past the set-up.
struct Sim {
    plan: Plan,
    store: Arc<SimStore>,
    /// The newest epoch of each stream.
    epochs: Vec<i64>,
    errors: Errors,
    /// The corrections every reconcile run reported, per post with sign (and those a failed
    /// run installed but could not report).
    reported: Reported,
}

impl Sim {
    fn stream_names(&self) -> Vec<String> {
        self.plan.streams().into_iter().map(|(s, _)| s).collect()
    }

    /// The first error an actor reported, or the first failure the probe or the drift bounds
    /// found.
    fn take_errors(&self) -> Result<(), String> {
        let errors = std::mem::take(&mut *self.errors.borrow_mut());
        if let Some(e) = errors.first() {
            return Err(e.clone());
        }
        let failures = std::mem::take(&mut self.store.lock().probe_failures);
        match failures.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// One round: writers, an operator editing counters, reconcile passes and the streams'
    /// workers running interleaved. With `quiesce`, only the workers, without faults, until
    /// they have caught up.
    async fn round(&mut self, quiesce: bool) -> Result<(), String> {
        let plan = self.plan.clone();
        let streams = plan.streams();
        let (writers, ops, runs, edits, modes, delay) = {
            let mut s = self.store.lock();
            if quiesce {
                s.faults = Faults::none();
                s.read_budget = None;
                (0, 0, 0, 0, vec![1; streams.len()], 0)
            } else {
                s.faults = Faults {
                    rate: if s.rng.random_bool(0.7) {
                        plan.fault_rate
                    } else {
                        0.0
                    },
                    transient_share: plan.transient_share,
                    yield_rate: plan.yield_rate,
                    budget: 4,
                };
                s.read_budget = s.rng.random_bool(0.4).then(|| s.rng.random_range(1..=6));
                let writers = s.rng.random_range(0..=3);
                let ops = s.rng.random_range(1..=12);
                // Reconcile passes race the writers and workers in most rounds.
                let runs = if s.rng.random_bool(0.85) {
                    s.rng.random_range(1..=3)
                } else {
                    0
                };
                let edits = if plan.hand_edits && s.rng.random_bool(0.3) {
                    s.rng.random_range(1..=2)
                } else {
                    0
                };
                // Per stream: no worker, one, or a takeover (two).
                let modes: Vec<i64> = streams
                    .iter()
                    .map(|_| match s.rng.random_range(0..10) {
                        0 => 0,
                        1 if plan.takeovers => 2,
                        _ => 1,
                    })
                    .collect();
                let delay = s.rng.random_range(0..6);
                (writers, ops, runs, edits, modes, delay)
            }
        };
        let mut actors: Vec<Actor<'static>> = Vec::new();
        for _ in 0..writers {
            actors.push(writer(self.store.clone(), ops));
        }
        if runs > 0 {
            actors.push(reconciler(
                self.store.clone(),
                &plan,
                runs,
                self.errors.clone(),
                self.reported.clone(),
            ));
        }
        if edits > 0 {
            actors.push(operator(self.store.clone(), edits));
        }
        // Every worker start acquires the lease, which raises the epoch, and adopts the
        // checkpoint with it; in a takeover the previous worker keeps running meanwhile.
        for (((stream, partition), mode), epoch) in
            streams.iter().zip(&modes).zip(self.epochs.iter_mut())
        {
            let settings = plan.worker_settings(stream, *partition);
            if *mode == 2 {
                // The previous holder runs in another process, with that process's own
                // budget: sharing this one would hold two reply reserves for one stream,
                // which no process ever does, and leave a worker waiting for room that only
                // a stop frees (a wait the real clock's operation timeout then ends).
                let previous = WorkerSettings {
                    budget: Budget::new(plan.budget.total()),
                    ..settings.clone()
                };
                actors.push(worker(
                    self.store.clone(),
                    previous,
                    *epoch,
                    false,
                    0,
                    *epoch + 1,
                    self.errors.clone(),
                ));
            }
            if *mode >= 1 {
                *epoch += 1;
                actors.push(worker(
                    self.store.clone(),
                    settings,
                    *epoch,
                    true,
                    if *mode == 2 { delay } else { 0 },
                    *epoch,
                    self.errors.clone(),
                ));
            }
        }
        {
            let mut s = self.store.lock();
            s.others_running = writers + usize::from(runs > 0) + usize::from(edits > 0);
            s.workers_running = modes.iter().sum::<i64>() as usize;
            let mut order: Vec<usize> = (0..actors.len()).collect();
            order.shuffle(&mut s.rng);
            let mut slots: Vec<Option<Actor<'static>>> = actors.into_iter().map(Some).collect();
            actors = order.iter().map(|i| slots[*i].take().unwrap()).collect();
            let line = format!(
                "round: {writers} writers x {ops}, {runs} reconciles, {edits} hand edits, workers {modes:?}, epochs {:?}",
                self.epochs
            );
            s.note(line);
        }
        join_in_order(actors).await;
        {
            let mut s = self.store.lock();
            s.shutdown.clear();
            s.faults = Faults::none();
            if s.others_running != 0 || s.workers_running != 0 {
                return Err("an actor did not finish".into());
            }
        }
        // Every worker has stopped: whatever they held of the memory budget is given back.
        if self.plan.budget.in_use() != 0 {
            return Err(format!(
                "{} bytes of the memory budget still held after every worker stopped",
                self.plan.budget.in_use()
            ));
        }
        self.take_errors()?;
        self.check_invariants()?;
        // The round boundary is a point to check too, when the workers caught up.
        let mut s = self.store.lock();
        if check_when_caught_up(&s, &self.stream_names(), plan.start_at())? {
            s.stat("round ended caught up");
        }
        Ok(())
    }

    /// Checks that hold at every round boundary.
    fn check_invariants(&self) -> Result<(), String> {
        let s = self.store.lock();
        for (post, count, parts) in s.counts() {
            if count != parts {
                return Err(format!(
                    "counter {post}: count {count} != base_count + live_delta {parts}"
                ));
            }
        }
        if self.plan.variant.broken != Broken::SeedFold {
            for (post, (_, _, live, buckets)) in s.counters() {
                let sum: i64 = buckets.values().sum();
                if sum != live {
                    return Err(format!(
                        "counter {post}: live_delta {live} != sum of its buckets {sum} ({buckets:?})"
                    ));
                }
            }
        }
        for counter in s.memory.counter_ixs().into_iter().skip(1) {
            for (group, c) in s.memory.counters_of(counter).into_iter().flatten() {
                let sum: counterd::core::num::Num = c.buckets.values().sum();
                if c.count.differs(c.displayed())
                    || (sum.differs(c.live_delta) && !self.seed_fold())
                {
                    return Err(format!(
                        "definition #{} counter {group}: count {}, base_count {} + live_delta {}, buckets {:?}",
                        counter.0, c.count, c.base_count, c.live_delta, c.buckets
                    ));
                }
            }
        }
        for (stream, _) in self.plan.streams() {
            let Some(c) = s.checkpoint_view(&stream) else {
                continue;
            };
            if let (Some(p), Some(h)) = (&c.pending, &c.high_water) {
                if p.end > *h {
                    return Err(format!(
                        "{stream}: pending batch {} above the high water {h}",
                        p.end
                    ));
                }
            }
            if c.pending.is_some() && c.high_water.is_none() {
                return Err(format!("{stream}: pending batch without a high water"));
            }
        }
        Ok(())
    }

    /// The broken variant whose folds leave `live_delta` apart from its buckets.
    fn seed_fold(&self) -> bool {
        self.plan.variant.broken == Broken::SeedFold
    }

    /// Between rounds: an operator moves the checkpoint back, or edits or deletes a counter by
    /// hand, or the oplog window moves on; then time passes.
    async fn between_rounds(&mut self) -> Result<(), String> {
        let (replay, truncate) = {
            let mut s = self.store.lock();
            let replay = self.plan.replays && s.rng.random_bool(0.2);
            let truncate = self.plan.truncation && s.rng.random_bool(0.2);
            (replay, truncate)
        };
        if replay {
            let streams = self.plan.streams();
            let (stream, position) = {
                let mut s = self.store.lock();
                let stream = streams[s.rng.random_range(0..streams.len())].0.clone();
                let checkpoint = s.checkpoint_view(&stream).and_then(|c| c.token);
                let end = match &checkpoint {
                    Some(t) => s.oplog.partition_point(|e| e.token.as_str() <= t.as_str()),
                    None => 0,
                };
                let floor = s.oplog_floor.min(end);
                if end > floor {
                    let i = s.rng.random_range(floor..end);
                    let entry = s.oplog[i].clone();
                    let position = match s.rng.random_range(0..8) {
                        5 | 6 => Position::Time(entry.time),
                        7 if self.plan.start_at_zero => Position::Unset,
                        _ => Position::Token(Token(entry.token.clone())),
                    };
                    s.note(format!("operator: replay {stream} from {position:?}"));
                    s.stat("operator replay");
                    (stream, Some(position))
                } else {
                    (stream, None)
                }
            };
            if let Some(position) = position {
                self.store
                    .move_checkpoint(&stream, &position)
                    .await
                    .map_err(|e| format!("move_checkpoint failed: {e}"))?;
            }
        }
        let mut s = self.store.lock();
        if self.plan.hand_edits && s.rng.random_bool(0.3) {
            // No worker runs now: a counter may be deleted too.
            hand_edit(&mut s, true);
        }
        if truncate {
            let len = s.oplog.len();
            let floor = s.oplog_floor;
            if len > floor {
                let new_floor = s.rng.random_range(floor..=len);
                s.oplog_floor = new_floor;
                s.note(format!("oplog truncated below index {new_floor}"));
                s.stat("oplog truncated");
                // A real oplog loses only history older than now: the clock moves past the
                // truncated writes (a worker restarting "now" must not land inside them).
                s.clock += 1;
            }
        }
        let step = s.rng.random_range(0..=3 * self.plan.bucket_width);
        s.clock += step;
        Ok(())
    }

    fn caught_up(&self) -> bool {
        self.store
            .lock()
            .caught_up(&self.stream_names(), self.plan.start_at())
    }

    /// The checks once the workers have caught up after the last round, before the final
    /// reconcile: see [`check_when_caught_up`].
    fn check_caught_up(&self) -> Result<(), String> {
        let s = self.store.lock();
        if s.recount_truth() != *s.truth_by_bucket() {
            return Err(
                "the store's live rows per bucket drifted from its rows (harness bug)".into(),
            );
        }
        check_when_caught_up(&s, &self.stream_names(), self.plan.start_at()).map(|_| ())
    }

    /// Records for every stream that its worker found it drained now, as a drained worker that
    /// keeps running does (the harness stopped them, caught up, and nothing writes any more).
    async fn drained_now(&self) -> Result<(), String> {
        record_drained(&self.store, &self.stream_names())
            .await
            .map_err(|e| format!("record the drained position: {e}"))
    }

    /// After the final reconcile: no post is dirty, the caught-up checks hold, and every bucket
    /// at or above a counter's watermark (never folded) holds exactly its live rows, plus what
    /// the operator put there by hand.
    fn check_final_reconcile(&self) -> Result<(), String> {
        let s = self.store.lock();
        for counter in s.counter_ixs() {
            let dirty = s.dirty_posts(counter);
            if !dirty.is_empty() {
                return Err(format!(
                    "definition #{}: groups still dirty after the final reconcile: {dirty:?}",
                    counter.0
                ));
            }
        }
        check_when_caught_up(&s, &self.stream_names(), self.plan.start_at())?;
        if self.plan.variant.broken == Broken::None {
            let by_bucket = s.truth_by_bucket();
            // After lost history only the buckets a counter has are compared: a full recount
            // whose total already matched installs nothing and leaves the old watermark, below
            // rows its base now counts (see `a_noop_full_recount_keeps_its_watermark`).
            let gaps = s.has_gaps();
            for (post, (base, watermark, live, buckets)) in s.counters() {
                let above = |(p, b): &&(PostId, i64)| *p == post && *b >= watermark && !gaps;
                let mut keys: Vec<i64> = buckets
                    .keys()
                    .copied()
                    .filter(|b| *b >= watermark)
                    .collect();
                keys.extend(by_bucket.keys().filter(above).map(|(_, b)| *b));
                keys.extend(s.injected_buckets.keys().filter(above).map(|(_, b)| *b));
                keys.sort();
                keys.dedup();
                for bucket in keys {
                    let key = (post.clone(), bucket);
                    if gaps && s.injected_buckets.contains_key(&key) {
                        // What a deleted counter lacked is known from the increments applied,
                        // which after lost history are not the truth.
                        continue;
                    }
                    let truth = by_bucket.get(&key).copied().unwrap_or(0);
                    let edited = s.injected_buckets.get(&key).copied().unwrap_or(0);
                    let got = buckets.get(&bucket).copied().unwrap_or(0);
                    if got != truth + edited {
                        return Err(format!(
                            "post {post} bucket {bucket} (>= watermark {watermark}): {got} != truth {truth} + {edited} put there by hand (counter: base {base}, live {live}, buckets {buckets:?}; truth {:?})",
                            s.truth().get(&post)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// After the final sweep: every counter equals the truth, no post is dirty, and (no history
    /// lost) the corrections reported per post, with sign, are exactly the drift injected.
    fn check_final(&self) -> Result<(), String> {
        let s = self.store.lock();
        let truth = s.truth();
        let counters = s.counters();
        let mut posts: Vec<&PostId> = truth.keys().chain(counters.keys()).collect();
        posts.sort();
        posts.dedup();
        for post in posts {
            let want = truth.get(post).copied().unwrap_or(0);
            let got = counters.get(post).map_or(0, |(b, _, l, _)| b + l);
            if want != got {
                return Err(format!(
                    "post {post}: displayed {got} != truth {want} after the final sweep (counter {:?})",
                    counters.get(post)
                ));
            }
        }
        for counter in s.counter_ixs() {
            let dirty = s.dirty_posts(counter);
            if !dirty.is_empty() {
                return Err(format!(
                    "definition #{}: groups still dirty after the final sweep: {dirty:?}",
                    counter.0
                ));
            }
        }
        check_other_definitions(&s, "after the final sweep")?;
        if !s.has_gaps() {
            let reported = self.reported.borrow();
            let mut posts: Vec<&PostId> = reported.keys().chain(s.injected.keys()).collect();
            posts.sort();
            posts.dedup();
            for post in posts {
                let got = reported.get(post).copied().unwrap_or(0);
                let want = s.injected.get(post).map_or(0, |d| d.net);
                if got != want {
                    return Err(format!(
                        "post {post}: the reconcile runs reported corrections summing to {got:+}, but the drift injected by hand was {want:+}"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The end of a seed: a final reconcile once writes have stopped for longer than the settle
    /// time and every row's bucket (clock skew included), after the sweep a lost history
    /// requested; then a full sweep, which finds the drift no dirty mark points at.
    async fn finish(&mut self) -> Result<(), String> {
        let now = {
            let mut s = self.store.lock();
            // Rows are created at most 29 s ahead of the clock.
            s.clock += 30 + self.plan.settle + 2 * self.plan.bucket_width + 1;
            let now = s.clock;
            s.note(format!("final reconcile @{now}"));
            now
        };
        self.drained_now().await?;
        let reconcilers: Vec<(String, Vec<Reconciler<SimStore>>)> = self
            .plan
            .streams()
            .into_iter()
            .map(|(stream, partition)| {
                let settings = self.plan.reconcile_settings(&stream, partition, 1 << 20);
                (stream, self.plan.reconcilers(&self.store, settings))
            })
            .collect();
        let (store, reported, errors) = (&self.store, &self.reported, &self.errors);
        for (stream, definitions) in &reconcilers {
            let what = format!("final requested sweep of {stream}");
            accounted(
                store,
                reported,
                errors,
                what,
                requested_sweeps(definitions, now),
            )
            .await;
            let reconciler = &definitions[0];
            let waiting = store
                .lock()
                .checkpoint_view(stream)
                .filter(|c| c.sweep_requested);
            if let Some(c) = waiting {
                let watermark = reconciler.watermark(now).await.map_err(|e| e.to_string())?;
                return Err(format!(
                    "{stream}: the sweep requested after lost history never runs once writes stop: the watermark {watermark} (capped by the checkpoint's event time {:?}) stays below the gap's end {:?}",
                    c.token_time.map(|t| t.time),
                    c.gaps.last().map(|g| g.to.timestamp_millis() / 1000)
                ));
            }
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let what = format!("final reconcile of {stream} ({counter})");
                accounted(store, reported, errors, what, async {
                    reconciler.run_dirty(now).await.map(Some)
                })
                .await;
            }
        }
        self.take_errors()?;
        self.check_final_reconcile()?;
        self.store.lock().note(format!("final sweep @{now}"));
        for (stream, definitions) in &reconcilers {
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let what = format!("final sweep of {stream} ({counter})");
                accounted(store, reported, errors, what, async {
                    reconciler.sweep(now, |_| {}, None).await.map(Some)
                })
                .await;
            }
        }
        self.take_errors()?;
        self.check_final()
    }

    async fn run(&mut self) -> Result<Summary, String> {
        {
            // The application's history before counterd is deployed: the initial snapshot
            // counts it (or, without one, the stream from time 0 or the reconciler does).
            let mut s = self.store.lock();
            for _ in 0..self.plan.existing_writes {
                let what = s.write_random();
                let line = format!("write before deployment @{}: {what}", s.clock);
                s.note(line);
            }
        }
        if !self.plan.start_at_zero {
            // Starting "now": the first worker takes its position before anything is written.
            self.round(true).await?;
        }
        for _ in 0..self.plan.rounds {
            self.round(false).await?;
            self.between_rounds().await?;
        }
        // Quiesce: no more writes or faults; the worker catches up.
        for _ in 0..4 {
            if self.caught_up() {
                break;
            }
            self.round(true).await?;
        }
        if !self.caught_up() {
            let s = self.store.lock();
            let checkpoints: Vec<_> = self
                .plan
                .streams()
                .iter()
                .map(|(stream, _)| s.checkpoint_view(stream))
                .collect();
            return Err(format!(
                "the workers did not catch up: checkpoints {checkpoints:?}, last event {:?}",
                s.last_token()
            ));
        }
        self.check_caught_up()?;
        self.check_invariants()?;
        self.finish().await?;
        let s = self.store.lock();
        Ok(Summary {
            stats: s.stats.clone(),
            events: s.oplog.len(),
        })
    }
}

/// Sets a seed up: its plan, and a store configured for it.
fn set_up(seed: u64, variant: Variant, trace: bool) -> Sim {
    let plan = Plan::new(seed, variant);
    let store = SimStore::new(seed, plan.bucket_width, plan.posts, START_CLOCK);
    {
        let mut s = store.lock();
        s.broken = variant.broken;
        s.hot = variant.hot;
        if variant.transactions {
            s.transactions = TRANSACTION_SHARE;
        }
        s.pre_images_enabled = plan.pre_images;
        s.update_descriptions = plan.update_descriptions;
        s.post_batch_tokens = plan.post_batch_tokens;
        s.unset_post_ids = plan.unset_post_ids;
        s.pre_image_expiry = if plan.pre_image_expiry { 0.1 } else { 0.0 };
        s.read_max = plan.read_max;
        s.drained_answers = plan.drained_answers;
        s.trace_all = trace;
        s.drift_bounds = true;
        let streams: Vec<String> = plan.streams().into_iter().map(|(s, _)| s).collect();
        let start_at = plan.start_at();
        s.probe = Some(Probe {
            rate: plan.probe_rate,
            rng: StdRng::seed_from_u64(seed ^ 0x9B0B_E5EE_D000),
            check: Box::new(move |s: &State| check_when_caught_up(s, &streams, start_at)),
        });
        s.stat(format!("seeds with {} streams", plan.partitions));
        s.budget = Some(plan.budget.clone());
        s.snapshot_chunk_rows = plan.snapshot_chunk_rows;
        if plan.definitions {
            s.memory.define_counters(plan.extra());
            s.stat("seeds with several counter definitions");
        }
        if plan.sums {
            s.stat("seeds with sums");
        }
    }
    Sim {
        store: Arc::new(store),
        epochs: vec![0; plan.partitions as usize],
        plan,
        errors: Rc::new(RefCell::new(Vec::new())),
        reported: Rc::default(),
    }
}

/// Runs a seed on a single-threaded runtime; a panic in `src` is a failure of the seed.
fn execute(sim: &mut Sim) -> Result<Summary, String> {
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(sim.run())
    }));
    match result {
        Ok(outcome) => outcome,
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// Runs one seed to the end.
fn run_seed(seed: u64, variant: Variant, trace: bool) -> Result<Summary, Box<Failure>> {
    let mut sim = set_up(seed, variant, trace);
    let message = match execute(&mut sim) {
        Ok(summary) => return Ok(summary),
        Err(message) => message,
    };
    let s = sim.store.lock();
    let tail = s.trace.len().saturating_sub(40);
    Err(Box::new(Failure {
        seed,
        plan: sim.plan.clone(),
        message,
        trace_tail: s.trace[tail..].to_vec(),
    }))
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs seeds `start..start + count` on all cores (each seed is single-threaded and
/// deterministic). Stops early after `stop_after` failures.
fn run_seeds(
    start: u64,
    count: u64,
    variant: Variant,
    stop_after: usize,
) -> (Vec<Failure>, BTreeMap<String, u64>, usize) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let failures = std::sync::Mutex::new(Vec::new());
    let stats = std::sync::Mutex::new(BTreeMap::new());
    let events = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (failures, stats, events) = (&failures, &stats, &events);
            scope.spawn(move || {
                let mut seed = start + t;
                while seed < start + count {
                    if failures.lock().unwrap().len() >= stop_after {
                        return;
                    }
                    match run_seed(seed, variant, false) {
                        Ok(summary) => {
                            events.fetch_add(summary.events, std::sync::atomic::Ordering::Relaxed);
                            let mut all = stats.lock().unwrap();
                            for (k, v) in summary.stats {
                                *all.entry(k).or_insert(0) += v;
                            }
                        }
                        Err(f) => failures.lock().unwrap().push(*f),
                    }
                    seed += threads;
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.seed);
    (failures, stats.into_inner().unwrap(), events.into_inner())
}

/// Every crash point of the worker's batch, and every recovery path, was exercised.
const COVERAGE: &[&str] = &[
    "fault next_batch before",
    "fault read_ledger before",
    "fault record_intent before",
    "fault record_intent after",
    "fault apply_counters before",
    "fault apply_counters partial",
    "fault apply_counters after",
    "fault write_ledger before",
    "fault write_ledger partial",
    "fault write_ledger after",
    "fault mark_dirty before",
    "fault mark_dirty after",
    "fault save_checkpoint before",
    "fault save_checkpoint after",
    "fault rows_after before",
    "fault save_snapshot before",
    "fault save_snapshot after",
    "fault claim_ledger partial",
    "fault claim_ledger after",
    "fault apply_snapshot_counters partial",
    "fault apply_snapshot_counters after",
    "snapshot chunk planned",
    "snapshot chunk finished after a restart",
    "snapshot chunk read again after a restart",
    "snapshot claim found the stream's entry",
    "snapshot increment already applied",
    "snapshot done",
    "fault install_fold before",
    "fault install_fold after",
    "fault live_ids_below before",
    "recount settled rows changed in its window",
    "fold installed",
    "fold corrected drift",
    "fold installed while others run",
    "fold corrected drift while others run",
    "drained answer while others run",
    "recount in flight",
    "folded but still dirty",
    "dirty run corrected drift",
    "background run corrected drift",
    "sweep run corrected drift",
    "corrections of a failed run (unreported)",
    "operator edit base",
    "operator edit bucket",
    "operator deleted counter",
    "probe checked a caught-up point while others run",
    "round ended caught up",
    "operator replay",
    "fault transient",
    "pause budget",
    "pause caught up",
    "stop caught up",
    "previous holder fenced out",
    "seeds with 2 streams",
    "read cut by the budget",
    "read cut to nothing by the budget",
    "snapshot chunk cut by the budget",
    "worker stopped while a worker waited for budget",
    "seeds with 3 streams",
    "recount by count alone",
    "counters carried across batches",
    "counter written for several batches at once",
    "fault while counters are carried",
    "carried counters re-applied by a restart",
    "carried batches re-read in pages",
];

#[test]
fn simulation() {
    if let Some(seed) = env_u64("SIM_SEED") {
        let variant = Variant::from_env();
        let trace = std::env::var("SIM_TRACE").is_ok_and(|v| v == "1");
        match run_seed(seed, variant, trace) {
            Ok(summary) => {
                eprintln!("seed {seed} passed: {:?}", Plan::new(seed, variant));
                eprintln!("{} events; {:?}", summary.events, summary.stats);
            }
            Err(f) => panic!("{}", f.report()),
        }
        return;
    }
    let start = env_u64("SIM_SEED_START").unwrap_or(0);
    let count = env_u64("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let variant = Variant::from_env();
    let began = Instant::now();
    let (failures, stats, events) = run_seeds(start, count, variant, 5);
    eprintln!(
        "simulated seeds {start}..{} ({events} events) in {:.1?}",
        start + count,
        began.elapsed()
    );
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!(
            "{} seed(s) failed, first: seed {} ({}); replay: {}SIM_SEED={} cargo test --test simulation -- --nocapture",
            failures.len(),
            failures[0].seed,
            failures[0].message,
            variant.env_prefix(),
            failures[0].seed
        );
    }
    eprintln!("coverage: {stats:?}");
    if count >= 500 {
        let missing: Vec<&&str> = COVERAGE
            .iter()
            .filter(|k| !stats.contains_key(**k))
            .collect();
        assert!(
            missing.is_empty(),
            "the simulation no longer reaches {missing:?}; seen: {stats:?}"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    // Seeds with faults (transient ones too), interleaving, takeovers and partitions.
    let seeds: Vec<u64> = (0..)
        .filter(|seed| {
            let plan = Plan::new(*seed, Variant::FAITHFUL);
            plan.fault_rate >= 0.1 && plan.yield_rate > 0.0 && plan.takeovers
        })
        .take(12)
        .collect();
    for seed in seeds {
        let run = || {
            let mut sim = set_up(seed, Variant::FAITHFUL, false);
            let result = execute(&mut sim).map(|summary| summary.stats);
            let s = sim.store.lock();
            (result, s.trace.clone(), format!("{:?}", s.counters()))
        };
        assert!(run() == run(), "seed {seed} ran differently twice");
    }
}

/// Runs the first seeds of a broken variant and expects the simulation to catch it.
fn expect_caught(variant: Variant, seeds: u64) {
    let (failures, _, _) = run_seeds(0, seeds, variant, 1);
    let first = failures.first().unwrap_or_else(|| {
        panic!("the simulation did not catch the broken variant {variant:?} in {seeds} seeds")
    });
    eprintln!(
        "caught {variant:?} at seed {}: {}\nreplay: {}SIM_SEED={} cargo test --test simulation -- --nocapture",
        first.seed,
        first.message,
        variant.env_prefix(),
        first.seed
    );
}

#[test]
fn removing_the_guard_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::NoGuard,
            ..Variant::FAITHFUL
        },
        200,
    );
}

#[test]
fn removing_the_recount_condition_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::UnconditionedRecount,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// The row-level recount with its window ignored (the counter's log names no changed row, so
/// every row keeps the state the recount read) installs counts that saw events the counter had
/// not applied, or missed ones it had: on hot posts the simulation catches it.
#[test]
fn ignoring_the_recount_window_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::WindowIgnored,
            hot: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Reads (and so batches) cut inside multi-document transactions. On this store's row-level
/// recount that cannot miscount (see `State::check_batch_end` for why); the simulation catches
/// the broken invariant itself: a batch end between two events of one transaction.
#[test]
fn cutting_batches_inside_transactions_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::CutTransactions,
            transactions: true,
            ..Variant::FAITHFUL
        },
        50,
    );
}

#[test]
fn the_seed_fold_formula_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::SeedFold,
            ..Variant::FAITHFUL
        },
        400,
    );
}

/// Runs the first seeds of a variant and expects every one to pass.
fn expect_clean(variant: Variant, seeds: u64) {
    let stop = env_u64("SIM_STOP_AFTER").unwrap_or(3) as usize;
    let (failures, _, _) = run_seeds(0, seeds, variant, stop);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{variant:?}: seed {} failed: {}", first.seed, first.message);
    }
}

/// Hot posts: post 0 receives most inserts and most old-row changes, so its recounts nearly
/// always have rows changed inside their window; they must settle them exactly, on servers
/// that describe updates and on ones that only look rows up (like the fake test server).
#[test]
fn with_hot_posts() {
    expect_clean(
        Variant {
            hot: true,
            ..Variant::FAITHFUL
        },
        200,
    );
    expect_clean(
        Variant {
            hot: true,
            lookups: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Several counters from one stream: in every seed with one stream, comments per author and
/// approved comments per post beside the default per post, with writers approving,
/// unapproving, changing and removing authors besides moving, soft-deleting, undeleting and
/// hard-deleting rows. Every counter of every definition equals its truth at every caught-up
/// moment and after the final sweep, no fold of theirs corrects drift (none is injected
/// there), and every dirty set is empty at the end; the default definition keeps every check
/// it always had.
/// Sums beside counts: ratings per author (integers, halves, missing and string values) and
/// approved scores per post (halves), with value changes, moves, soft and hard deletes,
/// crashes and takeovers; every sum must equal its `$sum` truth at every caught-up point and
/// after the final sweep, with no fold of theirs correcting drift.
#[test]
fn with_sums() {
    let variant = Variant {
        definitions: true,
        sums: true,
        ..Variant::FAITHFUL
    };
    let seeds = env_u64("SIM_SUMS_SEEDS").unwrap_or(150);
    let (failures, stats, _) = run_seeds(0, seeds, variant, 3);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{variant:?}: seed {} failed: {}", first.seed, first.message);
    }
    for key in [
        "seeds with sums",
        "change rating of",
        "change score of",
        "fold of another definition installed",
        "probe checked a caught-up point while others run",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "never happened: {key} ({stats:?})"
        );
    }
}

#[test]
fn with_several_counters() {
    let several = Variant {
        definitions: true,
        ..Variant::FAITHFUL
    };
    let (failures, stats, _) = run_seeds(0, 200, several, 3);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{several:?}: seed {} failed: {}", first.seed, first.message);
    }
    // The checks ran where they matter: the other definitions' folds, snapshots and
    // caught-up points with writers running.
    for key in [
        "seeds with several counter definitions",
        "fold of another definition installed",
        "dirty run of another definition",
        "snapshot done",
        "probe checked a caught-up point while others run",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "never happened: {key} ({stats:?})"
        );
    }
    expect_clean(
        Variant {
            lookups: true,
            ..several
        },
        50,
    );
    expect_clean(
        Variant {
            pre_images: true,
            ..several
        },
        50,
    );
}

/// Writers sometimes write 2 to 4 comment changes (inserts, soft deletes, moves across posts)
/// in one transaction: counters stay exact, no fold invents drift, and no batch ends inside a
/// transaction (`State::check_batch_end`, at every intent and checkpoint).
#[test]
fn with_transactions() {
    expect_clean(
        Variant {
            transactions: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

/// Transactions on hot posts, on a server that describes no update (lookups only). Seed 102
/// once installed a fold that corrected post 0 by +1 and then by -1 with no drift injected of
/// that sign. Not a transaction bug (it failed the same with reads cut inside transactions):
/// a recount had read post 0's rows while the stream's first worker had not yet begun the
/// initial snapshot, and was folded after that worker took the whole snapshot, which claimed
/// a row inserted after the read (fixed in `counterd::recount::snapshot_moved`; the small
/// case is `a_recount_across_the_initial_snapshot_is_not_folded`). Replay:
/// `SIM_TRANSACTIONS=1 SIM_HOT=1 SIM_LOOKUPS=1 SIM_SEED=102 cargo test --test simulation -- --nocapture`.
#[test]
fn with_transactions_on_hot_posts_with_lookups() {
    expect_clean(
        Variant {
            transactions: true,
            hot: true,
            lookups: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Transactions and pre-images. Seed 52 (two partitions, one tiny budget) once stopped making
/// progress until the real clock's operation timeouts ended it (minutes per seed): a worker
/// holding a read ahead (a transaction taken whole) asked for room for a snapshot chunk
/// *waiting* (the "holding" flag was passed inverted), queued behind the other partition's wait
/// for its reply reserve, which needed the bytes the first worker would free only by writing
/// what it held. A read ahead that takes a transaction whole holds more than its grant, which
/// makes that state likely; with reads cut inside transactions seed 52 never reached it. Fixed in `counterd::budget::Budget::take_for`, which
/// decides from the grant held. Replay:
/// `SIM_TRANSACTIONS=1 SIM_PRE_IMAGES=1 SIM_SEED=52 SIM_TRACE=1 cargo test --test simulation -- --nocapture`.
#[test]
fn with_transactions_and_pre_images() {
    expect_clean(
        Variant {
            transactions: true,
            pre_images: true,
            ..Variant::FAITHFUL
        },
        100,
    );
}

#[test]
fn with_pre_images() {
    expect_clean(
        Variant {
            pre_images: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

#[test]
fn with_history_lost() {
    expect_clean(
        Variant {
            history_lost: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

#[test]
fn with_history_lost_and_start_at() {
    expect_clean(
        Variant {
            history_lost: true,
            lost_start_time: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

/// `reconcile --post` looks its post's dirty version up with `dirty_list(.., usize::MAX)`. It
/// used to reach the server as `limit(-1)`, which the driver turns into a single batch of one
/// document, so only the oldest entry came back and the reconciled post stayed dirty.
#[test]
fn reconciling_one_post_clears_its_dirty_entry() {
    let store = Arc::new(SimStore::new(1, 60, 2, START_CLOCK));
    let fence = Fence {
        stream: STREAM.into(),
        epoch: 1,
    };
    let (older, newer) = (PostId::Int(1), PostId::Int(2));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let now = bson::DateTime::from_millis(START_CLOCK * 1000);
        store
            .mark_dirty(&fence, &[DirtyMark::settled(older.clone())], now)
            .await
            .unwrap();
        store
            .mark_dirty(&fence, &[DirtyMark::settled(newer.clone())], now)
            .await
            .unwrap();
        // The worker that marked them has applied everything and found the stream drained.
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        let reconciler = sim_reconciler(&store, ReconcileSettings::default());
        reconciler.run_post(&newer, START_CLOCK).await.unwrap();
    });
    assert_eq!(
        store.lock().dirty_posts(CounterIx::DEFAULT),
        vec![older],
        "the reconciled post is still dirty"
    );
}

/// History was lost: the worker restarts from "now", records the gap and requests a sweep. A
/// sweep at the usual watermark (a settle time behind) would leave a row created just before
/// the restart, whose insert event was in the gap, above the watermark where only its (never
/// filed) bucket counts, then clear its request, and the post is not dirty: it was never
/// counted. The requested sweep must wait until the watermark has passed the gap.
#[test]
fn a_sweep_after_lost_history_counts_recent_rows() {
    let store = Arc::new(SimStore::new(1, 60, 1, START_CLOCK));
    let now = START_CLOCK + 3600;
    {
        let mut s = store.lock();
        s.clock = now - 5;
        let created = bson::DateTime::from_millis((now - 5) * 1000);
        s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": created});
        s.clock = now;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let fence = Fence {
            stream: STREAM.into(),
            epoch: 1,
        };
        store.adopt_checkpoint(&fence).await.unwrap();
        let gap = counterd::store::Gap {
            from: None,
            to: bson::DateTime::from_millis(now * 1000),
        };
        store.record_gap(&fence, &gap).await.unwrap();
        let settings = ReconcileSettings {
            bucket_width_secs: 60,
            settle_secs: 30,
            ..ReconcileSettings::default()
        };
        let reconciler = sim_reconciler(&store, settings);
        // Reconcile passes as `run_loop` runs them: now, and an hour later, writes long paused,
        // while the restarted worker keeps finding the stream drained.
        for at in [now, now + 3600] {
            store.lock().clock = at;
            record_drained(&store, &[STREAM.into()]).await.unwrap();
            reconciler.run_requested_sweep(at, None).await.unwrap();
            reconciler.run_dirty(at).await.unwrap();
        }
    });
    let s = store.lock();
    let displayed = s
        .counters()
        .get(&PostId::Int(0))
        .map_or(0, |(base, _, live, _)| base + live);
    assert_eq!(displayed, 1, "the row whose insert was lost is not counted");
}

/// A recount that starts before the stream's first worker has recorded anything (no
/// snapshot yet, so "not running") reads the post's rows and waits for the worker; the worker
/// starts, takes the whole initial snapshot (claiming a row inserted after the recount's read)
/// and finds the stream drained. The claim left no entry in the counter's log, so the recount
/// took its read's version of the row (absent) while the counter counts the claim: the fold
/// installed +1 of drift that nobody injected (seed 102 of the transactions + hot posts +
/// lookups variant). A recount across any snapshot progress must not be folded.
#[test]
fn a_recount_across_the_initial_snapshot_is_not_folded() {
    let store = Arc::new(SimStore::new(1, 10, 1, START_CLOCK));
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = 10;
    plan.settle = 5;
    plan.snapshot = true;
    plan.snapshot_chunk_rows = 5;
    plan.start_at_zero = false;
    plan.budget = Budget::unlimited();
    let settings = plan.worker_settings(STREAM, None);
    let old = bson::DateTime::from_millis((START_CLOCK - 100) * 1000);
    let now = {
        let mut s = store.lock();
        s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": old});
        s.clock += 100;
        s.clock
    };
    let reconciler = sim_reconciler(&store, plan.reconcile_settings(STREAM, None, 100));
    let report: Rc<RefCell<Option<RunReport>>> = Rc::default();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let recount: Actor<'_> = Box::pin({
            let report = report.clone();
            let reconciler = &reconciler;
            async move {
                let r = reconciler.run_post(&PostId::Int(0), now).await.unwrap();
                *report.borrow_mut() = Some(r);
            }
        });
        // Polled once the recount has read the rows and waits for the worker.
        let first_worker: Actor<'_> = Box::pin({
            let store = store.clone();
            async move {
                store
                    .lock()
                    .insert_row(bson::doc! {"_id": 2_i64, "post_id": 0_i64, "created_at": old});
                catch_up(&store, settings, 1).await;
            }
        });
        join_in_order(vec![recount, first_worker]).await;
    });
    let report = report.borrow_mut().take().expect("the recount ran");
    let s = store.lock();
    let snapshot = s.checkpoint_view(STREAM).and_then(|c| c.snapshot);
    assert_eq!(
        snapshot.map(|p| p.rows_counted),
        Some(2),
        "the snapshot claimed both rows"
    );
    assert!(
        report.corrections.is_empty(),
        "a recount across the snapshot was folded: corrections {:?}, counters {:?}",
        report.corrections,
        s.counters()
    );
    assert!(off_truth(&s).is_empty(), "{:?}", off_truth(&s));
}

/// Runs one worker alone until it has caught up (a quiescent round).
async fn catch_up(store: &Arc<SimStore>, settings: WorkerSettings, epoch: i64) {
    {
        let mut s = store.lock();
        s.others_running = 0;
        s.workers_running = 1;
    }
    let errors: Errors = Rc::default();
    join_in_order(vec![worker(
        store.clone(),
        settings,
        epoch,
        true,
        0,
        epoch,
        errors.clone(),
    )])
    .await;
    store.lock().shutdown.clear();
    assert!(errors.borrow().is_empty(), "{:?}", errors.borrow());
}

/// When the worker cannot derive an update's after-state at event time it takes the row as it
/// is when the event is read, and the transitions telescope: a comment that moved to post 1
/// and on to post 2 before the worker read either event is counted as one move to post 2. Post
/// 1 never gets a delta nor a dirty mark. But a reconcile that ran while the comment sat on
/// post 1 counted it there, and post 1 keeps the extra count for good. This happens on a real
/// server when the ledger knows the row only as "not counted" (it had no `post_id`), and on a
/// server without update descriptions for any move.
fn passes_through(descriptions: bool) -> Vec<String> {
    let store = Arc::new(SimStore::new(1, 10, 3, START_CLOCK));
    store.lock().update_descriptions = descriptions;
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = 10;
    plan.settle = 5;
    let settings = plan.worker_settings(STREAM, None);
    let recount =
        |store: &Arc<SimStore>| sim_reconciler(store, plan.reconcile_settings(STREAM, None, 100));
    let created = bson::DateTime::from_millis(START_CLOCK * 1000);
    let mut first = bson::doc! {"_id": 1_i64, "created_at": created};
    if !descriptions {
        first.insert("post_id", 0_i64);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        {
            let mut s = store.lock();
            s.insert_row(first);
            s.insert_row(bson::doc! {"_id": 2_i64, "post_id": 1_i64, "created_at": created});
            s.clock += 100;
            // A later write elsewhere, applied: the watermark moves past the rows' creation.
            let later = bson::DateTime::from_millis(s.clock * 1000);
            s.insert_row(bson::doc! {"_id": 3_i64, "post_id": 2_i64, "created_at": later});
        }
        catch_up(&store, settings.clone(), 1).await;
        let now = {
            let mut s = store.lock();
            s.clock += 1;
            s.update(1, bson::doc! {"post_id": 1_i64}, &[]);
            s.clock
        };
        // Post 1 is dirty (comment 2): the recount sees comment 1 there too, while the event
        // that moved it there is not applied, so it must not be installed.
        let report = recount(&store).run_dirty(now).await.unwrap();
        assert!(
            report.corrections.is_empty(),
            "a recount that saw a move in flight was installed: {:?}",
            report.corrections
        );
        store.lock().update(1, bson::doc! {"post_id": 2_i64}, &[]);
        catch_up(&store, settings, 2).await;
        let now = {
            let mut s = store.lock();
            s.clock += 100;
            s.clock
        };
        // The worker, still running, finds the stream drained.
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        recount(&store).run_dirty(now).await.unwrap();
    });
    let s = store.lock();
    let mut wrong = off_truth(&s);
    if !s.dirty_posts(CounterIx::DEFAULT).is_empty() {
        wrong.push(format!(
            "still dirty: {:?}",
            s.dirty_posts(CounterIx::DEFAULT)
        ));
    }
    wrong
}

#[test]
fn a_post_a_row_passed_through_is_recounted() {
    let wrong = [true, false].map(passes_through);
    assert!(
        wrong.iter().all(Vec::is_empty),
        "a row without post_id that gets one: {:?}; a server without update descriptions: {:?}",
        wrong[0],
        wrong[1]
    );
}

/// A server without update descriptions (the fake test server, whose update spec is
/// incomplete) has updates classified from `updateLookup`: the row as it is when the event is
/// read. Here a row is restamped into a settled bucket and then deleted before the worker reads
/// either event. Meanwhile a recount reads the row below the watermark. The restamp is
/// classified against a row that is gone (no change: no delta), the delete against the ledger
/// (-1 in the row's old bucket, above the watermark). Under the quiet window no touch below the
/// watermark was recorded after the counter was first read, the recount was installed, and the
/// counter was corrected by drift nobody injected (the minimal form of simulation seed 7202).
/// Under the row-level rule the delete's batch names the row, so it takes its ledger state
/// (gone) and the recount matches the counter.
#[test]
fn a_change_hidden_by_a_lookup_voids_a_recount() {
    let width = 60;
    let store = Arc::new(SimStore::new(1, width, 1, START_CLOCK));
    store.lock().update_descriptions = false;
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = width;
    plan.settle = 0;
    let settings = plan.worker_settings(STREAM, None);
    let t = START_CLOCK + 3600;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let report = runtime.block_on(async {
        {
            let mut s = store.lock();
            s.clock = t;
            let created = bson::DateTime::from_millis(t * 1000);
            s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": created});
        }
        // The insert is applied (+1 in bucket t); the post is dirty.
        catch_up(&store, settings.clone(), 1).await;
        {
            let mut s = store.lock();
            s.clock = t + 10;
            let long_ago = bson::DateTime::from_millis((t - 1800) * 1000);
            s.update(1, bson::doc! {"created_at": long_ago}, &[]);
            s.others_running = 1;
            s.workers_running = 1;
            s.drained_answers = 1.0;
        }
        // A reconcile at t + 10: its watermark is t (the worker drained the stream at t), so
        // bucket t is not settled and the restamped row is.
        let reconciler = sim_reconciler(&store, plan.reconcile_settings(STREAM, None, 100));
        let report: Rc<RefCell<Option<RunReport>>> = Rc::default();
        let reconcile: Actor<'_> = Box::pin({
            let (store, report) = (store.clone(), report.clone());
            let reconciler = &reconciler;
            async move {
                *report.borrow_mut() = Some(reconciler.run_dirty(t + 10).await.unwrap());
                store.lock().others_running -= 1;
            }
        });
        // Once the row is counted, it is deleted, and only then does the worker read both
        // events (drained answers end each read, so the recount's wait sees it catch up).
        let errors: Errors = Rc::default();
        let script: Actor<'_> = Box::pin({
            let (store, errors) = (store.clone(), errors.clone());
            async move {
                while !store.lock().stats.contains_key("call live_ids_below") {
                    yield_now().await;
                }
                store.lock().delete_row(1);
                worker(store, settings, 2, true, 0, 2, errors).await;
            }
        });
        join_in_order(vec![reconcile, script]).await;
        assert!(errors.borrow().is_empty(), "{:?}", errors.borrow());
        let report = report.borrow_mut().take().expect("the reconcile ran");
        report
    });
    let s = store.lock();
    let displayed = s.displayed().get(&PostId::Int(0)).copied().unwrap_or(0);
    assert!(
        report.corrections.is_empty() && displayed == 0,
        "a recount that saw a row restamped into a settled bucket (a change hidden by the lookup of a later state) was installed: corrections {:?}, post 0 displays {displayed}, truth 0",
        report.corrections
    );
}

/// After lost history the requested sweep recounts each post in full, above every row and
/// bucket it has. When that recount already matches the counter (here a lost delete of an old
/// row and a lost insert of a future-dated row cancel out) and no bucket is dropped, the fold
/// is skipped as a no-op, and the counter keeps its old, lower watermark although its base now
/// counts the future-dated row. The next ordinary fold, at a watermark below that row, counts
/// below its own watermark only and keeps the buckets above it, where the row never was: it
/// loses the row and reports a correction nobody needed (found as seeds 87 and 227 of
/// `with_history_lost`, where a bucket above a counter's watermark missed a live row).
#[test]
fn a_noop_full_recount_keeps_its_watermark() {
    let width = 60;
    let store = Arc::new(SimStore::new(1, width, 1, START_CLOCK));
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = width;
    plan.settle = 0;
    let settings = plan.worker_settings(STREAM, None);
    let reconciler = sim_reconciler(&store, plan.reconcile_settings(STREAM, None, 100));
    let t = START_CLOCK + 3600;
    let at = |secs: i64| bson::DateTime::from_millis(secs * 1000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let report = runtime.block_on(async {
        let set_clock = |secs: i64| store.lock().clock = secs;
        // An old row, counted, then folded into the base.
        set_clock(t - 600);
        store
            .lock()
            .insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": at(t - 600)});
        catch_up(&store, settings.clone(), 1).await;
        set_clock(t - 480);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        reconciler.sweep(t - 480, |_| {}, None).await.unwrap();
        // History lost: the old row deleted, a row dated 20 s ahead inserted, both unseen.
        set_clock(t - 100);
        {
            let mut s = store.lock();
            s.delete_row(1);
            s.insert_row(bson::doc! {"_id": 2_i64, "post_id": 0_i64, "created_at": at(t + 20)});
            s.oplog_floor = s.oplog.len();
        }
        set_clock(t - 50);
        catch_up(&store, settings.clone(), 2).await;
        // The requested sweep, once the watermark passed the gap: a full recount (above the
        // future-dated row) that matches the counter, so nothing is written.
        set_clock(t + 30);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        let swept = reconciler.run_requested_sweep(t + 30, None).await.unwrap();
        assert!(swept.is_some(), "the requested sweep ran");
        // A new comment dirties the post; the next fold is at watermark t.
        set_clock(t + 35);
        store
            .lock()
            .insert_row(bson::doc! {"_id": 3_i64, "post_id": 0_i64, "created_at": at(t + 35)});
        catch_up(&store, settings, 3).await;
        set_clock(t + 40);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        reconciler.run_dirty(t + 40).await.unwrap()
    });
    let s = store.lock();
    let displayed = s.displayed().get(&PostId::Int(0)).copied().unwrap_or(0);
    let truth = s.truth().get(&PostId::Int(0)).copied().unwrap_or(0);
    assert!(
        displayed == truth && report.corrections.is_empty(),
        "post 0 displays {displayed}, truth {truth}, after a fold that corrected {:?} (counter {:?})",
        report.corrections,
        s.counters().get(&PostId::Int(0))
    );
}

/// History was lost while comments moved: their ledger entries still describe them as they were
/// before the gap. The sweep after the gap recounts every post, but a later event of such a
/// comment used to be classified against its stale entry: with a complete update description
/// the after-state is derived from it, so a soft delete of a comment that now sits on post 1
/// was filed on post 0 (still its old post, now "deleted"), and post 1, never touched nor
/// dirty, kept counting it. Guessing instead (as if the ledger had no entry) is not enough: a
/// comment that moved to post 2 in the gap and then moves back to post 0 leaves post 2 unknown
/// and counting it; the sweep rebuilds the ledger entries of the rows it counts. (Found by
/// `with_history_lost_and_start_at`, `SIM_HISTORY_LOST=1 SIM_LOST_START_TIME=1 SIM_SEED=104`,
/// before the recount change.)
///
/// Run twice: with the recounts' whole share, the rebuild reads the group's rows at once; with
/// a share of no rows, it rebuilds each post's rows before it reads the next post's.
#[test]
fn events_after_lost_history_are_not_classified_against_stale_ledger_entries() {
    for recount_rows in [0, usize::MAX] {
        stale_ledger_entries_case(recount_rows);
    }
}

fn stale_ledger_entries_case(recount_rows: usize) {
    let store = Arc::new(SimStore::new(1, 10, 3, START_CLOCK));
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = 10;
    plan.settle = 5;
    plan.pre_images = false;
    plan.recount_rows = recount_rows;
    let settings = plan.worker_settings(STREAM, None);
    let reconciler = Reconciler::new(store.clone(), plan.reconcile_settings(STREAM, None, 100));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let created = bson::DateTime::from_millis(START_CLOCK * 1000);
        {
            let mut s = store.lock();
            s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": created});
            s.insert_row(bson::doc! {"_id": 2_i64, "post_id": 0_i64, "created_at": created});
        }
        catch_up(&store, settings.clone(), 1).await;
        {
            // The comments move to posts 1 and 2, and the oplog loses the moves.
            let mut s = store.lock();
            s.clock += 100;
            s.update(1, bson::doc! {"post_id": 1_i64}, &[]);
            s.update(2, bson::doc! {"post_id": 2_i64}, &[]);
            s.oplog_floor = s.oplog.len();
            s.clock += 1; // the worker's "now" is after the lost writes
        }
        // The worker finds its history lost, records the gap and restarts from now.
        catch_up(&store, settings.clone(), 2).await;
        assert_eq!(store.lock().checkpoint_view(STREAM).unwrap().gaps.len(), 1);
        // Writes long paused: the requested sweep recounts every post.
        let now = settle(&store, 100).await;
        let swept = reconciler.run_requested_sweep(now, None).await.unwrap();
        assert!(swept.is_some(), "the sweep after lost history did not run");
        {
            let mut s = store.lock();
            s.clock += 1;
            let deleted = bson::DateTime::from_millis(s.clock * 1000);
            s.update(1, bson::doc! {"deleted_at": deleted}, &[]);
            s.update(2, bson::doc! {"post_id": 0_i64}, &[]);
        }
        catch_up(&store, settings, 3).await;
        let now = settle(&store, 100).await;
        reconciler.run_dirty(now).await.unwrap();
    });
    let s = store.lock();
    let wrong = off_truth(&s);
    assert!(wrong.is_empty(), "recount_rows {recount_rows}: {wrong:?}");
    let dirty = s.dirty_posts(CounterIx::DEFAULT);
    assert!(
        dirty.is_empty(),
        "recount_rows {recount_rows}: still dirty: {dirty:?}"
    );
}

/// Moves the clock on by `secs` with writes paused, and records for the stopped worker that it
/// is drained at the new position, as a running worker would.
async fn settle(store: &Arc<SimStore>, secs: i64) -> i64 {
    let now = {
        let mut s = store.lock();
        s.clock += secs;
        s.clock
    };
    record_drained(store, &[STREAM.into()]).await.unwrap();
    now
}

/// Every counter whose displayed value differs from its post's truth, described.
fn off_truth(s: &State) -> Vec<String> {
    let truth = s.truth();
    s.counters()
        .into_iter()
        .filter_map(|(post, (base, _, live, _))| {
            let want = truth.get(&post).copied().unwrap_or(0);
            (base + live != want).then(|| format!("post {post}: {} != truth {want}", base + live))
        })
        .collect()
}
