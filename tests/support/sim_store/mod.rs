//! The deterministic simulation's store: counterd's in-process store
//! (`counterd::store::memory`, MongoDB's semantics statement for statement) wrapped in the
//! simulation's hooks, all driven by one seeded RNG so that a seed replays exactly:
//! * every store call may first yield once (so that the actors the simulation polls side by
//!   side interleave at every store call, and between the statements of a multi-statement
//!   write) and may fail by an injected fault: before it runs, after some of its statements
//!   (a partial write: the wrapper applies the in-process store's statements one by one), or
//!   after it ran (the write landed, the reply was lost) — see `faults.rs`;
//! * time is [`SimClock`]: `now` is the store's clock, and a pause (the worker's idle pause
//!   and backoff, the reconciler's wait for the worker) only yields to the other actors, never
//!   on tokio's timer. So `src` reads simulated times only and the interleaving never depends on
//!   real time;
//! * the change stream (`events.rs`), once drained, waits while other actors may still write
//!   (like an awaitData getMore) but now and then (seeded, `drained_answers`) answers "nothing
//!   new" instead, so workers record drained positions mid-round and the reconciler's
//!   quiet-window wait can see them catch up. It stops a worker whose read budget is spent and,
//!   once only workers are left, stops them, letting the last one alone take one idle turn:
//!   every round ends, each worker by its [`Shutdown`] (its run returns `Ok`);
//! * `broken`: deliberately wrong variants of the store (the guard removed, the seed's fold
//!   formula, the recount without its consistency condition) that the simulation must catch,
//!   made by bending the calls the wrapper passes on (`seam.rs`);
//! * the application's random writes (`writers.rs`), and the bookkeeping the simulation's
//!   checks read: live rows per (post, bucket), a shadow of every applied counter increment per
//!   (post, bucket) (once the worker has caught up it must equal the truth exactly, whatever the
//!   reconciler did, or an event was counted twice or never), an operator's hand edits of
//!   counters recorded as the drift they cause beside the drift every installed fold corrected
//!   (with no history lost, a fold may never correct more drift of either sign than was
//!   injected into its post), and a `probe` that runs the simulation's own checks at sampled
//!   store-call boundaries.

mod events;
mod faults;
mod seam;
mod writers;

use std::collections::BTreeMap;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;
use counterd::clock::Clock;
use counterd::core::key::CounterIx;
use counterd::core::key::GroupValue;
use counterd::shutdown::{Shutdown, ShutdownTrigger};
use counterd::store::memory::{Memory, OplogEntry};
use counterd::store::CounterViews;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub use self::faults::{Faults, INJECTED};

/// A deliberately broken variant of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// Faithful to MongoDB.
    None,
    /// Counter writes ignore `applied_through`: every guarded increment applies.
    NoGuard,
    /// The fold is installed with the seed design's formula: `base' = C`,
    /// `live' = live - (base' - base)`, which never changes the displayed value.
    SeedFold,
    /// Reads of the change stream end wherever their limit falls, also between two events of
    /// one transaction, so batches (and the checkpoint) end inside transactions. With the
    /// row-level recount this cannot miscount (see `State::check_batch_end`); the simulation
    /// catches it by the invariant itself.
    CutTransactions,
    /// The recount of the reconciler before it was made consistent with the stream: counter
    /// writes record no touched buckets and the server's position is always "applied", so a
    /// count that saw an event in flight is installed.
    UnconditionedRecount,
    /// The row-level recount ignores the rows changed inside its window: counter writes log
    /// no rows, so the recount takes every row as read, also those whose events the counter
    /// had not applied yet (or had applied after the read).
    WindowIgnored,
}

/// The store's tables and the simulation's own state, behind one lock that is never held
/// across an `.await`. It dereferences to the tables ([`Memory`]): the simulation reads them
/// (and moves the clock) through it.
pub struct State {
    pub memory: Memory,
    /// The one RNG of the simulation: writers, faults, yields, batch sizes.
    pub rng: StdRng,
    /// The clock when the simulation began: rows back-dated "long ago" are created before it.
    pub start_clock: i64,
    pub bucket_width: i64,
    /// Live rows per (post, creation bucket), kept by the writers.
    live: BTreeMap<(GroupValue, i64), i64>,
    next_id: i64,
    /// Comment ids hard-deleted so far (for re-inserts of a known `_id`).
    gone_ids: Vec<i64>,
    pub posts: i64,
    /// Hot posts: most inserts go to post 0, and most old-row changes pick one of its rows
    /// (the busiest counters, which the quiet window never let fold under load).
    pub hot: bool,
    /// Writers sometimes remove a row's `post_id` (it leaves counting) and set it again later.
    pub unset_post_ids: bool,
    /// Share of pre-images that have expired by the time they are read (they come back null).
    pub pre_image_expiry: f64,
    /// Share of the application's writes that are multi-document transactions of 2 to 4
    /// comment changes (see `State::write_transaction`); 0 unless the variant asks for them.
    pub transactions: f64,
    /// The last `txnNumber` written (each transaction takes the next).
    next_txn: i64,
    pub faults: Faults,
    pub broken: Broken,
    /// Applied counter increments per (post, bucket).
    pub shadow: BTreeMap<(GroupValue, i64), i64>,
    /// Counts of what happened, for coverage: injected faults by call and strike, pauses, folds.
    pub stats: BTreeMap<String, u64>,
    /// Non-worker actors (writers, reconciler) still running this round.
    pub others_running: usize,
    /// Workers still running this round.
    pub workers_running: usize,
    /// Shutdown triggers of this round's workers: a worker that is caught up and alone is told
    /// to stop right after its idle read, so that it never sleeps on tokio's (real) clock while
    /// another actor runs.
    pub shutdown: Vec<ShutdownTrigger>,
    /// The seed's memory budget (for the coverage statistics).
    pub budget: Option<counterd::budget::Budget>,
    /// Rows per snapshot chunk as configured (a chunk asked for fewer was cut by the budget).
    pub snapshot_chunk_rows: usize,
    /// Reads that return events the worker(s) may still do this round; `None`: unlimited.
    pub read_budget: Option<u32>,
    /// Probability that a drained stream answers "nothing new" while other actors run, rather
    /// than waiting for a write.
    pub drained_answers: f64,
    /// Most events one read returns.
    pub read_max: usize,
    /// A short log of store calls (the tail is printed when a seed fails).
    pub trace: Vec<String>,
    pub trace_all: bool,
    /// Gaps recorded since the stream last returned anything: a worker that keeps finding its
    /// history lost without ever reading is looping.
    gaps_in_a_row: u32,
    /// Drift injected by hand per post: displayed minus truth caused by each edit.
    pub injected: BTreeMap<GroupValue, Drift>,
    /// Injected amounts that sit in a counter's buckets, per (post, bucket): a bucket at or
    /// above its counter's watermark holds exactly its live rows plus this. A deleted counter
    /// leaves each bucket short of everything applied to it before.
    pub injected_buckets: BTreeMap<(GroupValue, i64), i64>,
    /// Drift corrected by every fold installed, per post (whether or not its run reported it).
    pub corrected: BTreeMap<GroupValue, Drift>,
    /// Every installed fold that corrected drift: (post, drift), in order.
    pub fold_log: Vec<(GroupValue, i64)>,
    /// Check, at every installed fold, that no post was corrected of more drift of either sign
    /// than was injected into it (while no history was lost).
    pub drift_bounds: bool,
    /// Checks run at sampled store-call boundaries.
    pub probe: Option<Probe>,
    /// Bumped by every change to the store (a write call, a writer's row, a hand edit): the
    /// probe skips a boundary at which nothing changed since it last looked.
    generation: u64,
    probed_generation: u64,
    /// What the probe and the drift bounds found wrong.
    pub probe_failures: Vec<String>,
}

impl Deref for State {
    type Target = Memory;
    fn deref(&self) -> &Memory {
        &self.memory
    }
}

impl DerefMut for State {
    fn deref_mut(&mut self) -> &mut Memory {
        &mut self.memory
    }
}

/// Signed drift of one post: the net amount and its positive and negative parts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Drift {
    pub net: i64,
    /// Sum of the positive amounts (the counter made to run high).
    pub high: i64,
    /// Sum of the negative amounts (the counter made to run low).
    pub low: i64,
}

impl Drift {
    pub fn add(&mut self, amount: i64) {
        self.net += amount;
        if amount > 0 {
            self.high += amount;
        } else {
            self.low += amount;
        }
    }
}

/// The simulation's checks, run at sampled store-call boundaries (a share `rate` of them, drawn
/// from its own RNG so that sampling never changes a seed's run). `check` returns whether it
/// applied (its checks hold only at some points: where every worker has caught up).
pub struct Probe {
    pub rate: f64,
    pub rng: StdRng,
    pub check: ProbeCheck,
}

/// The probe's checks: whether they applied at this point, or what they found wrong.
pub type ProbeCheck = Box<dyn Fn(&State) -> Result<bool, String> + Send>;

impl State {
    /// Only one worker is left and nothing else runs: sleeping on a real timer is harmless now.
    pub fn alone(&self) -> bool {
        self.others_running == 0 && self.workers_running <= 1
    }

    /// The first oplog event `stream`'s checkpoint has not applied (`None`: all are, or the
    /// stream has not applied one yet).
    pub fn first_unapplied(&self, stream: &str) -> Option<&OplogEntry> {
        let token = self.memory.checkpoints.get(stream)?.doc.token.as_ref()?;
        self.memory
            .oplog
            .get(self.memory.index_after(token.as_str()))
    }

    pub fn stat(&mut self, key: impl Into<String>) {
        *self.stats.entry(key.into()).or_default() += 1;
    }

    /// Before workers are stopped: notes when one of them is waiting for room in the memory
    /// budget (its wait is then cut short by the stop).
    pub fn note_budget_waiters(&mut self) {
        if self.budget.as_ref().is_some_and(|b| b.waiting() > 0) {
            self.stat("worker stopped while a worker waited for budget");
        }
    }

    pub fn note(&mut self, line: String) {
        if self.trace_all {
            eprintln!("{line}");
        }
        self.trace.push(line);
        if self.trace.len() > 4000 {
            self.trace.drain(..2000);
        }
    }

    /// Runs the probe, if this store-call boundary is sampled.
    fn probe_point(&mut self) {
        if self.generation == self.probed_generation {
            return;
        }
        let Some(mut probe) = self.probe.take() else {
            return;
        };
        if probe.rng.random_bool(probe.rate) {
            self.probed_generation = self.generation;
            match (probe.check)(self) {
                Ok(true) => {
                    self.stat("probe checked a caught-up point");
                    if self.others_running > 0 {
                        self.stat("probe checked a caught-up point while others run");
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    self.note(format!("  !! probe: {e}"));
                    self.probe_failures.push(e);
                }
            }
        }
        self.probe = Some(probe);
    }
}

impl State {
    /// The transaction invariant, checked at every batch end the worker records (an intent's
    /// end, a checkpoint's token): no batch ends between two events of one transaction.
    ///
    /// Why the invariant is checked itself rather than through a wrong count: a batch cut
    /// inside a transaction miscounts only where a recount is taken *at a cluster time* (a
    /// snapshot read at the counter's position sees the whole transaction, the counter half of
    /// it: see `counterd::core::txn`). This store has no snapshot reads (like the fake test server),
    /// so every recount here is the row-level one, and that one is exact to the event whatever
    /// the batch boundaries: each row changed after the counter's first read takes the ledger
    /// state its own event wrote, each event has its own token, and the wait for the worker
    /// compares cluster times (`applied_before`: every event *before* the checkpoint event's
    /// time, so a half-applied transaction at time `T` never counts as applied through `T`).
    /// The broken variant `CutTransactions` therefore ends with exact counters, and is caught
    /// here.
    pub(super) fn check_batch_end(&mut self, end: &counterd::core::event::Token) {
        let after = self.memory.index_after(end.as_str());
        let Some(last) = after.checked_sub(1).map(|i| &self.memory.oplog[i]) else {
            return;
        };
        if last.token != end.as_str() {
            return; // a drained position, after the newest event: not inside anything
        }
        let Some(txn) = last.txn else {
            return;
        };
        self.stat("batch ended at a transaction's end");
        let next = self.memory.oplog.get(after).and_then(|e| e.txn);
        if next == Some(txn) {
            let e = format!(
                "a batch ended at {end}, inside transaction {}/{} (its next event is {})",
                txn.session, txn.number, self.memory.oplog[after].token
            );
            self.note(format!("  !! {e}"));
            self.probe_failures.push(e);
        }
    }
}

/// Yields to the other actors once.
pub async fn yield_now() {
    YieldOnce(false).await
}

struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// The simulation's store. Clones share the same state.
#[derive(Clone)]
pub struct SimStore {
    state: Arc<Mutex<State>>,
    /// The worker this handle serves (`None`: the writers', the reconciler's, the checks'): its
    /// change streams end its run by requesting its shutdown.
    worker: Option<ShutdownTrigger>,
    /// The counter definition this handle serves (see `counterd::store::CounterViews`).
    counter: CounterIx,
}

impl CounterViews for SimStore {
    fn for_counter(&self, counter: CounterIx) -> SimStore {
        SimStore {
            counter,
            ..self.clone()
        }
    }

    fn viewed_counter(&self) -> CounterIx {
        self.counter
    }

    fn viewed_shared(&self) -> bool {
        self.lock().memory.shared(self.counter)
    }
}

impl SimStore {
    pub fn new(seed: u64, bucket_width: i64, posts: i64, clock: i64) -> SimStore {
        SimStore {
            state: Arc::new(Mutex::new(State {
                memory: Memory::new(clock),
                rng: StdRng::seed_from_u64(seed),
                start_clock: clock,
                bucket_width,
                live: BTreeMap::new(),
                next_id: 0,
                gone_ids: Vec::new(),
                posts,
                hot: false,
                unset_post_ids: true,
                pre_image_expiry: 0.1,
                transactions: 0.0,
                next_txn: 0,
                faults: Faults::none(),
                broken: Broken::None,
                shadow: BTreeMap::new(),
                stats: BTreeMap::new(),
                others_running: 0,
                workers_running: 0,
                shutdown: Vec::new(),
                budget: None,
                snapshot_chunk_rows: usize::MAX,
                read_budget: None,
                drained_answers: 0.0,
                read_max: 10,
                trace: Vec::new(),
                trace_all: false,
                gaps_in_a_row: 0,
                injected: BTreeMap::new(),
                injected_buckets: BTreeMap::new(),
                corrected: BTreeMap::new(),
                fold_log: Vec::new(),
                drift_bounds: false,
                probe: None,
                generation: 1,
                probed_generation: 0,
                probe_failures: Vec::new(),
            })),
            worker: None,
            counter: CounterIx::DEFAULT,
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The simulated clock, for `Worker::with_clock` and `Reconciler::with_clock`.
    pub fn clock(&self) -> Arc<dyn Clock> {
        Arc::new(SimClock(self.clone()))
    }

    /// Maybe yields to the other actors: the interleaving point before every store call.
    /// A handle for one worker of this round, and the shutdown that worker runs with: the
    /// handle's change streams stop the worker through it (and a round's last, idle worker
    /// stops every worker of the round).
    pub fn for_worker(&self) -> (SimStore, Shutdown) {
        let (trigger, shutdown) = Shutdown::new();
        self.lock().shutdown.push(trigger.clone());
        let handle = SimStore {
            state: self.state.clone(),
            worker: Some(trigger),
            counter: CounterIx::DEFAULT,
        };
        (handle, shutdown)
    }

    pub async fn maybe_yield(&self) {
        let yield_now = {
            let mut s = self.lock();
            let rate = s.faults.yield_rate;
            rate > 0.0 && !s.alone() && s.rng.random_bool(rate)
        };
        if yield_now {
            YieldOnce(false).await;
        }
    }
}

/// Simulated time: `now` is the store's clock, and a pause only yields to the other actors (one
/// to three times, seeded), whatever its length: it never sleeps on tokio's timer, and it never
/// moves the clock (writers and the rounds do).
pub struct SimClock(SimStore);

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> DateTime {
        self.0.lock().memory.now()
    }

    async fn sleep(&self, _delay: Duration) {
        let turns = {
            let mut s = self.0.lock();
            if s.alone() {
                1
            } else {
                s.rng.random_range(1..=3)
            }
        };
        for _ in 0..turns {
            YieldOnce(false).await;
        }
    }
}
