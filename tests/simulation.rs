//! Deterministic simulation of counterd: the real classification, coalescing, guard, intent
//! recovery and fold code (`Worker`, `Reconciler`), driven against an in-process store behind
//! the same seam as MongoDB (`tests/support/memory_store.rs`).
//!
//! One seed is one run: a seeded RNG, a simulated clock, no threads racing. In each round,
//! writers change comments (insert, soft delete, undelete, move, remove `post_id`, hard delete,
//! replace, body and `created_at` edits, re-insert of a deleted `_id`), a reconciler recounts
//! dirty posts (after a requested sweep), and the real worker tails the oplog. They are
//! futures polled in a seeded order on one thread, interleaving at every store call and between
//! the statements of a multi-statement write. Store calls fail by injected faults (before, with
//! only some statements of a write applied, after the write landed but its reply was lost), so
//! the worker
//! crashes at every step boundary: after reading, after the intent, after some of the writes,
//! after all writes, before the checkpoint. Every worker start takes a new epoch and adopts the
//! checkpoint, as the lease does; in a takeover the previous worker keeps running until it is
//! fenced out. Between rounds an operator moves the checkpoint back (`replay`), so events are
//! redelivered from older positions. Seeds also vary the server flavour (pre-images,
//! `updateDescription`, post-batch tokens) and split posts across 1 to 3 partitions, each with
//! its own stream, worker, epoch, ledger and reconciler.
//!
//! Checks: at every round, `live_delta` is the sum of the buckets and a pending batch is below
//! the high water. Once writers stop and the worker has caught up (before any further
//! reconcile), the increments that landed equal the truth per post and creation bucket: no
//! event was applied twice or lost (and the counters equal the truth outright when no reconcile
//! ever ran). After one reconcile run past the settle time, every counter equals the truth, no
//! post is dirty, and every bucket at or above a counter's watermark is exact.
//!
//! `removing_the_guard_is_caught` and `the_seed_fold_formula_is_caught` run deliberately broken
//! variants and expect a failure. The ignored `with_*` variants currently fail because of bugs
//! in `src` (each names its bug; run them with `-- --ignored`); the faithful run leaves out what
//! they need (expired pre-images together with rows that lose `post_id`; a truncated oplog).
//! Two small deterministic cases guard bugs the simulation found and `src` fixed.
//!
//! Environment: `SIM_SEEDS` (default 3000) and `SIM_SEED_START` choose the seeds;
//! `SIM_SEED=<n>` replays one (`SIM_TRACE=1` prints every step); `SIM_BROKEN=no_guard|seed_fold`,
//! `SIM_PRE_IMAGES=1`, `SIM_HISTORY_LOST=1` and `SIM_LOST_START_TIME=1` select the variant of
//! the seed to replay. A failing seed prints the exact command that replays it.

#[path = "support/memory_store.rs"]
mod memory_store;

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
use counterd::classify::Attribution;
use counterd::batch::DirtyMark;
use counterd::event::{PostId, Token};
use counterd::partition::{stream_names, Partition};
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::store::{Fence, Position, Store, StoreError};
use counterd::worker::{OnHistoryLost, Worker, WorkerError, WorkerSettings, WorkerStatus};
use memory_store::{yield_now, Broken, Faults, MemoryStore};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const STREAM: &str = "comments";
/// 2100-01-01T00:00:00Z: the simulated clock runs after the wall clock, so that a "now" that
/// `src` reads from the wall clock (the start position it pins) lies before every simulated
/// event, as a real "now" lies before the events that follow it.
const START_CLOCK: i64 = 4_102_444_800;
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
}

impl Variant {
    const FAITHFUL: Variant = Variant {
        broken: Broken::None,
        pre_images: false,
        history_lost: false,
        lost_start_time: false,
    };

    fn from_env() -> Variant {
        let broken = match std::env::var("SIM_BROKEN").as_deref() {
            Ok("no_guard") => Broken::NoGuard,
            Ok("seed_fold") => Broken::SeedFold,
            Ok("unconditioned_recount") => Broken::UnconditionedRecount,
            _ => Broken::None,
        };
        let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        Variant {
            broken,
            pre_images: flag("SIM_PRE_IMAGES"),
            history_lost: flag("SIM_HISTORY_LOST"),
            lost_start_time: flag("SIM_LOST_START_TIME"),
        }
    }

    fn env_prefix(&self) -> String {
        let mut prefix = String::new();
        match self.broken {
            Broken::None => {}
            Broken::NoGuard => prefix.push_str("SIM_BROKEN=no_guard "),
            Broken::SeedFold => prefix.push_str("SIM_BROKEN=seed_fold "),
            Broken::UnconditionedRecount => {
                prefix.push_str("SIM_BROKEN=unconditioned_recount ")
            }
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
    variant: Variant,
}

impl Plan {
    fn new(seed: u64, variant: Variant) -> Plan {
        let mut r = StdRng::seed_from_u64(seed ^ 0x5EED_0FC0_DE00_u64);
        let truncation = variant.history_lost;
        let pre_images = variant.pre_images || r.random_bool(0.3);
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
            update_descriptions: r.random_bool(0.75) || pre_images,
            post_batch_tokens: r.random_bool(0.75),
            unset_post_ids: true,
            pre_image_expiry: false,
            variant,
        };
        if plan.pre_images && !variant.pre_images {
            // Either expired pre-images or rows that lose `post_id`, not both.
            plan.pre_image_expiry = r.random_bool(0.5);
            plan.unset_post_ids = !plan.pre_image_expiry;
        } else {
            plan.pre_image_expiry = plan.pre_images;
        }
        plan
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
            ..ReconcileSettings::default()
        }
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

/// An error the simulation injected (a fault or the pause that ends a worker run).
fn injected(e: &StoreError) -> bool {
    match e {
        StoreError::Transient { message, .. } | StoreError::Fatal { message, .. } => {
            message.starts_with("sim:")
        }
        _ => false,
    }
}

fn writer(store: Arc<MemoryStore>, ops: usize) -> Actor<'static> {
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

/// `runs` reconcile runs, each of a stream chosen at random, as its replica's reconcile loop
/// does: a requested sweep first, then the dirty posts.
fn reconciler(store: Arc<MemoryStore>, plan: &Plan, runs: usize, errors: Errors) -> Actor<'static> {
    let max_posts = store.lock().rng.random_range(1..=plan.posts as usize + 1);
    let reconcilers: Vec<(String, Reconciler<MemoryStore>)> = plan
        .streams()
        .into_iter()
        .map(|(stream, partition)| {
            let settings = plan.reconcile_settings(&stream, partition, max_posts);
            (stream, Reconciler::new(store.clone(), settings))
        })
        .collect();
    Box::pin(async move {
        for _ in 0..runs {
            let (now, which) = {
                let mut s = store.lock();
                let which = s.rng.random_range(0..reconcilers.len());
                let now = s.clock;
                s.note(format!("reconcile {} @{now}", reconcilers[which].0));
                (now, which)
            };
            let reconciler = &reconcilers[which].1;
            if let Err(e) = reconciler.run_requested_sweep(now, None).await {
                if !injected(&e) {
                    errors.borrow_mut().push(format!("sweep failed: {e}"));
                }
            }
            if let Err(e) = reconciler.run_dirty(now).await {
                if !injected(&e) {
                    errors.borrow_mut().push(format!("reconcile failed: {e}"));
                }
            }
            store.maybe_yield().await;
        }
        store.lock().others_running -= 1;
    })
}

/// One run of the real worker, from whatever the store holds, until it is stopped or crashed.
/// `adopt`: the worker took the lease with a new epoch and stamps the checkpoint with it first
/// (a worker that does not adopt is the previous holder, still running during a takeover);
/// `newest`: the newest epoch of the round (being fenced out by it is expected).
fn worker(
    store: Arc<MemoryStore>,
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
            let (tx, rx) = tokio::sync::watch::channel(false);
            store.lock().shutdown.push(tx);
            let w = Worker::new(store.clone(), settings, Arc::new(WorkerStatus::default()));
            w.run(epoch, rx).await
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
                Ok(()) => format!("worker {stream} epoch {epoch} stopped (caught up)"),
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

/// The simulation of one seed, past the set-up.
struct Sim {
    plan: Plan,
    store: Arc<MemoryStore>,
    /// The newest epoch of each stream.
    epochs: Vec<i64>,
    errors: Errors,
}

impl Sim {
    fn take_errors(&self) -> Result<(), String> {
        let errors = std::mem::take(&mut *self.errors.borrow_mut());
        match errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// One round: writers, a reconciler and the streams' workers running interleaved. With
    /// `quiesce`, only the workers, without faults, until they have caught up.
    async fn round(&mut self, quiesce: bool) -> Result<(), String> {
        let plan = self.plan.clone();
        let streams = plan.streams();
        let (writers, ops, runs, modes, delay) = {
            let mut s = self.store.lock();
            if quiesce {
                s.faults = Faults::none();
                s.read_budget = None;
                (0, 0, 0, vec![1; streams.len()], 0)
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
                let runs = if s.rng.random_bool(0.5) {
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
                (writers, ops, runs, modes, delay)
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
            ));
        }
        // Every worker start acquires the lease, which raises the epoch, and adopts the
        // checkpoint with it; in a takeover the previous worker keeps running meanwhile.
        for (((stream, partition), mode), epoch) in
            streams.iter().zip(&modes).zip(self.epochs.iter_mut())
        {
            let settings = plan.worker_settings(stream, *partition);
            if *mode == 2 {
                actors.push(worker(
                    self.store.clone(),
                    settings.clone(),
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
            s.others_running = writers + usize::from(runs > 0);
            s.workers_running = modes.iter().sum::<i64>() as usize;
            let mut order: Vec<usize> = (0..actors.len()).collect();
            order.shuffle(&mut s.rng);
            let mut slots: Vec<Option<Actor<'static>>> = actors.into_iter().map(Some).collect();
            actors = order.iter().map(|i| slots[*i].take().unwrap()).collect();
            let line = format!(
                "round: {writers} writers x {ops}, {runs} reconciles, workers {modes:?}, epochs {:?}",
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
        self.take_errors()?;
        self.check_invariants()
    }

    /// Checks that hold at every round boundary.
    fn check_invariants(&self) -> Result<(), String> {
        let s = self.store.lock();
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

    /// Between rounds: an operator moves the checkpoint back, or the oplog window moves on.
    async fn operator(&mut self) -> Result<(), String> {
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
        if truncate {
            let mut s = self.store.lock();
            let len = s.oplog.len();
            let floor = s.oplog_floor;
            if len > floor {
                let new_floor = s.rng.random_range(floor..=len);
                s.oplog_floor = new_floor;
                s.note(format!("oplog truncated below index {new_floor}"));
                s.stat("oplog truncated");
            }
        }
        let mut s = self.store.lock();
        let step = s.rng.random_range(0..=3 * self.plan.bucket_width);
        s.clock += step;
        Ok(())
    }

    /// Every stream has nothing in flight and, resumed now, would count no event anew: the
    /// events after its resume position (a token, else a start time) are all at or below its
    /// high water.
    fn caught_up(&self) -> bool {
        let s = self.store.lock();
        let start_at = self.plan.worker_settings(STREAM, None).start_at;
        self.plan.streams().iter().all(|(stream, _)| {
            let Some(c) = s.checkpoint_view(stream) else {
                return s.oplog.is_empty();
            };
            let from = match (&c.token, c.start_time.or(start_at)) {
                (Some(token), _) => s
                    .oplog
                    .partition_point(|e| e.token.as_str() <= token.as_str()),
                (None, Some(at)) => s.oplog.partition_point(|e| e.time < at),
                (None, None) => s.oplog.len(),
            };
            c.pending.is_none()
                && s.oplog[from.max(s.oplog_floor).min(s.oplog.len())..]
                    .iter()
                    .all(|e| {
                        c.high_water
                            .as_ref()
                            .is_some_and(|h| e.token.as_str() <= h.as_str())
                    })
        })
    }

    fn gaps(&self) -> usize {
        let s = self.store.lock();
        self.plan
            .streams()
            .iter()
            .filter_map(|(stream, _)| s.checkpoint_view(stream))
            .map(|c| c.gaps.len())
            .sum()
    }

    /// The checks once the worker has caught up, before any further reconcile.
    fn check_caught_up(&self) -> Result<(), String> {
        if self.gaps() > 0 {
            return Ok(()); // history was lost: events were never seen, the sweep repairs it
        }
        let s = self.store.lock();
        let truth = s.truth_by_bucket();
        let mut keys: Vec<&(PostId, i64)> = truth.keys().chain(s.shadow.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let want = truth.get(key).copied().unwrap_or(0);
            let got = s.shadow.get(key).copied().unwrap_or(0);
            if want != got {
                return Err(format!(
                    "post {} bucket {}: the increments applied sum to {got}, the truth is {want} (an event was applied twice or never)",
                    key.0, key.1
                ));
            }
        }
        if !s.stats.contains_key("fold installed") {
            // No reconcile ever touched the counters: they are exactly the applied increments.
            let truth = s.truth();
            for (post, (base, _, live, _)) in s.counters() {
                let want = truth.get(&post).copied().unwrap_or(0);
                if base + live != want {
                    return Err(format!(
                        "post {post}: counter {} != truth {want} after catching up, no reconcile ran",
                        base + live
                    ));
                }
            }
        }
        Ok(())
    }

    /// The checks after the final reconcile: every counter equals the truth.
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
                    "post {post}: displayed {got} != truth {want} after the final reconcile (counter {:?})",
                    counters.get(post)
                ));
            }
        }
        let dirty = s.dirty_posts();
        if !dirty.is_empty() {
            return Err(format!(
                "posts still dirty after the final reconcile: {dirty:?}"
            ));
        }
        if self.plan.variant.broken == Broken::None {
            // Buckets at or above a counter's watermark were never folded: they hold exactly
            // the live rows created in them.
            let by_bucket = s.truth_by_bucket();
            for (post, (_, watermark, _, buckets)) in &counters {
                for (bucket, n) in buckets.iter().filter(|(b, _)| **b >= *watermark) {
                    let want = by_bucket
                        .get(&(post.clone(), *bucket))
                        .copied()
                        .unwrap_or(0);
                    if *n != want {
                        return Err(format!(
                            "post {post} bucket {bucket} (>= watermark {watermark}): {n} != truth {want}"
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    async fn run(&mut self) -> Result<Summary, String> {
        if !self.plan.start_at_zero {
            // Starting "now": the first worker takes its position before anything is written.
            self.round(true).await?;
        }
        for _ in 0..self.plan.rounds {
            self.round(false).await?;
            self.operator().await?;
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
        // One reconcile run (per stream) once writes have paused for longer than the settle
        // time, after the sweep a lost history requested.
        let now = {
            let mut s = self.store.lock();
            s.clock += self.plan.settle + 2 * self.plan.bucket_width + 1;
            let now = s.clock;
            s.note(format!("final reconcile @{now}"));
            now
        };
        for (stream, partition) in self.plan.streams() {
            // A drained worker that keeps running records, once a second, that it is caught up;
            // the harness stopped it, so record that for it at the new time.
            let epoch = self
                .store
                .lock()
                .checkpoint_view(&stream)
                .map_or(0, |c| c.epoch);
            let fence = Fence {
                stream: stream.clone(),
                epoch,
            };
            self.store
                .record_caught_up(
                    &fence,
                    Timestamp {
                        time: 0,
                        increment: 0,
                    },
                )
                .await
                .map_err(|e| format!("record caught up on {stream}: {e}"))?;
            let settings = self.plan.reconcile_settings(&stream, partition, 1 << 20);
            let reconciler = Reconciler::new(self.store.clone(), settings);
            reconciler
                .run_requested_sweep(now, None)
                .await
                .map_err(|e| format!("final sweep of {stream} failed: {e}"))?;
            let waiting = self
                .store
                .lock()
                .checkpoint_view(&stream)
                .filter(|c| c.sweep_requested);
            if let Some(c) = waiting {
                let watermark = reconciler.watermark(now).await.map_err(|e| e.to_string())?;
                return Err(format!(
                    "{stream}: the sweep requested after lost history never runs once writes stop: the watermark {watermark} (capped by the checkpoint's event time {:?}) stays below the gap's end {:?}",
                    c.token_time.map(|t| t.time),
                    c.gaps.last().map(|g| g.to.timestamp_millis() / 1000)
                ));
            }
            reconciler
                .run_dirty(now)
                .await
                .map_err(|e| format!("final reconcile of {stream} failed: {e}"))?;
        }
        self.check_final()?;
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
    let store = MemoryStore::new(seed, plan.bucket_width, plan.posts, START_CLOCK);
    {
        let mut s = store.lock();
        s.broken = variant.broken;
        s.pre_images_enabled = plan.pre_images;
        s.update_descriptions = plan.update_descriptions;
        s.post_batch_tokens = plan.post_batch_tokens;
        s.unset_post_ids = plan.unset_post_ids;
        s.pre_image_expiry = if plan.pre_image_expiry { 0.1 } else { 0.0 };
        s.read_max = plan.read_max;
        s.trace_all = trace;
        s.stat(format!("seeds with {} streams", plan.partitions));
    }
    Sim {
        store: Arc::new(store),
        epochs: vec![0; plan.partitions as usize],
        plan,
        errors: Rc::new(RefCell::new(Vec::new())),
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
    "fault install_fold before",
    "fault install_fold after",
    "fault count_live_below before",
    "fold installed",
    "fold corrected drift",
    "operator replay",
    "fault transient",
    "pause budget",
    "pause caught up",
    "stop caught up",
    "previous holder fenced out",
    "seeds with 2 streams",
    "seeds with 3 streams",
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
    let began = Instant::now();
    let (failures, stats, events) = run_seeds(start, count, Variant::FAITHFUL, 5);
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
            "{} seed(s) failed, first: seed {} ({}); replay: SIM_SEED={} cargo test --test simulation -- --nocapture",
            failures.len(),
            failures[0].seed,
            failures[0].message,
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

#[test]
#[ignore = "open src bug (classify): when a pre-image has expired and the ledger knows a row only as not counted (no post_id), the update takes its after-state from updateLookup, a later state that the next event, classified from its own pre-image, counts again; SIM_PRE_IMAGES=1 SIM_SEED=88"]
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
#[ignore = "open src bug: with a configured start_at, partitions and repeated history loss, a counter can stay off after the final gap sweep (seen once: post 2 displayed 2, truth 1); SIM_HISTORY_LOST=1 SIM_LOST_START_TIME=1 SIM_SEED=104"]
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
    let store = Arc::new(MemoryStore::new(1, 60, 2, START_CLOCK));
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
        let reconciler = Reconciler::new(store.clone(), ReconcileSettings::default());
        reconciler.run_post(&newer, START_CLOCK).await.unwrap();
    });
    assert_eq!(
        store.lock().dirty_posts(),
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
    let store = Arc::new(MemoryStore::new(1, 60, 1, START_CLOCK));
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
        let reconciler = Reconciler::new(store.clone(), settings);
        // Reconcile passes as `run_loop` runs them: now, and an hour later, writes long paused.
        for at in [now, now + 3600] {
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

/// Runs one worker alone until it has caught up (a quiescent round).
async fn catch_up(store: &Arc<MemoryStore>, settings: WorkerSettings, epoch: i64) {
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
    let store = Arc::new(MemoryStore::new(1, 10, 3, START_CLOCK));
    store.lock().update_descriptions = descriptions;
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = 10;
    plan.settle = 5;
    let settings = plan.worker_settings(STREAM, None);
    let recount = |store: &Arc<MemoryStore>| {
        Reconciler::new(store.clone(), plan.reconcile_settings(STREAM, None, 100))
    };
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
        // Post 1 is dirty (comment 2): the recount sees comment 1 there too.
        recount(&store).run_dirty(now).await.unwrap();
        store.lock().update(1, bson::doc! {"post_id": 2_i64}, &[]);
        catch_up(&store, settings, 2).await;
        let now = {
            let mut s = store.lock();
            s.clock += 100;
            s.clock
        };
        recount(&store).run_dirty(now).await.unwrap();
    });
    let s = store.lock();
    let truth = s.truth();
    s.counters()
        .into_iter()
        .filter_map(|(post, (base, _, live, _))| {
            let want = truth.get(&post).copied().unwrap_or(0);
            (base + live != want).then(|| format!("post {post}: {} != truth {want}", base + live))
        })
        .collect()
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
