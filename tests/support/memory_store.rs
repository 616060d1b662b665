//! An in-process store behind the same seam as MongoDB ([`Store`] + [`EventSource`]), for the
//! deterministic simulation only.
//!
//! Every method has the semantics of its counterpart in `src/store/mongo.rs`, statement for
//! statement: guarded upserts whose failed guard is a duplicate key ("already applied"),
//! checkpoint updates filtered on the epoch whose failed upsert is `Fenced`, the conditional fold
//! install, `count_live_below` as "not `>=`", a negative `limit` meaning one batch of `|limit|`.
//! Like the fake test server it has no snapshot reads (`count_live_below_at` is `None`), so every
//! recount takes the quiet window; `read_position` is exact, like an `operationTime`.
//!
//! Besides the counterd collections it holds the truth (`comments`, with its live rows per post
//! and creation bucket kept up to date) and an oplog whose change events are shaped like a real
//! MongoDB 6/7 emits them with `fullDocument: updateLookup`: the looked-up document of an update
//! is the row *as it is when the event is read* (null once the row is gone), which is what makes
//! recovery tricky.
//!
//! Simulation hooks, all driven by one seeded RNG so that a seed replays exactly:
//! * every store call may first yield once (so that the actors the simulation polls side by
//!   side interleave at every store call, and between the statements of a multi-statement
//!   write) and may fail by an injected fault: before it runs, after a prefix of its statements
//!   (a partial write), or after it ran (the write landed, the reply was lost).
//! * time is [`SimClock`]: `now` is the simulated clock, and a pause (the worker's idle pause
//!   and backoff, the reconciler's wait for the worker) only yields to the other actors, never
//!   on tokio's timer. So `src` reads simulated times only and the interleaving never depends on
//!   real time.
//! * the change stream, once drained, waits while other actors may still write (like an
//!   awaitData getMore) but now and then (seeded, `drained_answers`) answers "nothing new"
//!   instead, so workers record drained positions mid-round and the reconciler's quiet-window
//!   wait can see them catch up. It stops a worker whose read budget is spent (an injected
//!   `Fatal`) and, once only workers are left, stops them, letting the last one alone take one
//!   idle turn (it is told to shut down right after): every round ends.
//! * `broken`: deliberately wrong variants (the guard removed, the seed's fold formula, the
//!   recount without its consistency condition) that the simulation must catch.
//! * a shadow of every applied counter increment per (post, bucket): once the worker has caught
//!   up it must equal the truth exactly, whatever the reconciler did, or an event was counted
//!   twice (or never).
//! * an operator's hand edits of counters (`inject_base`, `inject_bucket`, `delete_counter`),
//!   recorded per post as the drift they cause (displayed minus truth), beside the drift every
//!   installed fold corrected (`corrected`, `fold_log`): with no history lost, a fold may never
//!   correct more drift of either sign than was injected into its post. A `probe` runs the
//!   simulation's own checks at sampled store-call boundaries.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bson::{doc, Bson, DateTime, Document, Timestamp};
use counterd::batch::{bucket_of, CounterDelta, DirtyMark, LedgerUpdate};
use counterd::clock::Clock;
use counterd::deployment::Deployment;
use counterd::event::{CommentId, PostId, Row, Token};

/// The simulated application uses counterd's default schema.
const POST_FIELD: &str = "post_id";
const CREATED_FIELD: &str = "created_at";
const DELETED_FIELD: &str = "deleted_at";
use counterd::fold::{CounterState, Fold};
use counterd::store::prelude::*;
use counterd::store::{
    ApplyOutcome, Checkpoint, CommentsExtent, CounterDoc, DirtyEntry, DirtyOrder, DirtySummary,
    EventSource, Fence, Gap, Lease, PendingBatch, Position, RawBatch, RunSummary, ServerNow,
    SnapshotProgress, StoreError, StoreResult, StreamOptions, StreamStart, SweepCursor,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The message of every injected fault, so the simulation can tell them from real errors.
pub const INJECTED: &str = "sim: injected";
/// The message of the pause that ends a worker run.
pub const PAUSE: &str = "sim: pause";

/// A deliberately broken variant of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broken {
    /// Faithful to `mongo.rs`.
    None,
    /// Counter writes ignore `applied_through`: every guarded increment applies.
    NoGuard,
    /// The fold is installed with the seed design's formula: `base' = C`,
    /// `live' = live - (base' - base)`, which never changes the displayed value.
    SeedFold,
    /// The recount of the reconciler before it was made consistent with the stream: counter
    /// writes record no touched buckets and the server's position is always "applied", so a
    /// count that saw an event in flight is installed.
    UnconditionedRecount,
}

/// How often store calls fail and yield.
#[derive(Clone, Debug)]
pub struct Faults {
    /// Probability that a call fails by an injected fault.
    pub rate: f64,
    /// Share of injected faults that are transient (the worker retries in-process) rather than
    /// fatal (the worker stops and is restarted).
    pub transient_share: f64,
    /// Probability that a call yields to the other actors first.
    pub yield_rate: f64,
    /// Faults left in this round (a cap, so that every round ends).
    pub budget: u32,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            rate: 0.0,
            transient_share: 0.0,
            yield_rate: 0.0,
            budget: 0,
        }
    }
}

/// Where an injected fault strikes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Strike {
    /// Before the call did anything.
    Before,
    /// A multi-statement write (`ordered: false`) in which only the statements marked `true`
    /// landed before the error: any subset, not only a prefix.
    Partial(Vec<bool>),
    /// After the call did everything (the reply was lost).
    After,
}

/// One change in the oplog.
#[derive(Clone, Debug)]
pub struct OplogEntry {
    pub seq: u64,
    pub token: String,
    pub time: Timestamp,
    pub id: i64,
    pub kind: OpKind,
    /// The row just before the change (for `fullDocumentBeforeChange`).
    pub pre: Option<Document>,
    /// The pre-image expired (comes back null even when requested).
    pub pre_expired: bool,
}

#[derive(Clone, Debug)]
pub enum OpKind {
    Insert(Document),
    Update {
        updated: Document,
        removed: Vec<String>,
    },
    Replace(Document),
    Delete,
}

#[derive(Clone, Debug, Default)]
struct CounterRec {
    base_count: i64,
    base_watermark: i64,
    live_delta: i64,
    buckets: BTreeMap<i64, i64>,
    applied_through: Option<String>,
    applied_time: Option<Timestamp>,
    touched: BTreeMap<i64, String>,
    folds: i64,
    /// The last initial-snapshot chunk added to it.
    snapshot_chunk: Option<u64>,
    /// The readers' field: `base_count + live_delta`, kept in the same writes.
    count: i64,
    epoch: Option<i64>,
    last_drift: Option<i64>,
    reconciled_at: Option<DateTime>,
}

#[derive(Clone, Debug)]
struct LedgerRec {
    exists: bool,
    /// Soft-deleted (an existing row without a post keeps it too).
    deleted: bool,
    post: Option<PostId>,
    created_at: Option<DateTime>,
    /// `None`: rebuilt by the sweep after lost history (any worker write replaces it).
    applied_through: Option<String>,
    epoch: Option<i64>,
    /// The stream's history-gap count when written.
    generation: u64,
}

#[derive(Clone, Debug)]
struct DirtyRec {
    first: DateTime,
    last: DateTime,
    version: i64,
    /// The stream that marked it last.
    stream: String,
    newest_bucket: i64,
    /// The fencing epoch of the worker that marked it last.
    epoch: i64,
}

#[derive(Clone, Debug, Default)]
struct CheckpointRec {
    epoch: Option<i64>,
    deployment: Option<Deployment>,
    token: Option<String>,
    token_time: Option<Timestamp>,
    start_time: Option<Timestamp>,
    caught_up_at: Option<Timestamp>,
    high_water: Option<String>,
    pending: Option<PendingBatch>,
    updated_at: Option<DateTime>,
    gaps: Vec<Gap>,
    sweep_requested: Option<bool>,
    snapshot: Option<SnapshotProgress>,
}

#[derive(Clone, Debug)]
struct LeaseRec {
    owner: String,
    expires_at: DateTime,
    epoch: i64,
}

/// Everything the store holds, behind one lock that is never held across an `.await`.
pub struct State {
    /// The one RNG of the simulation: writers, faults, yields, batch sizes.
    pub rng: StdRng,
    /// Simulated seconds.
    pub clock: i64,
    /// The clock when the simulation began: rows back-dated "long ago" are created before it.
    pub start_clock: i64,
    pub bucket_width: i64,
    /// The truth: comment rows by `_id` (change them only through `set_row`).
    pub comments: BTreeMap<i64, Document>,
    /// Live rows per (post, creation bucket), kept by `set_row`.
    live: BTreeMap<(PostId, i64), i64>,
    pub oplog: Vec<OplogEntry>,
    /// Entries below this index have been truncated away (the oplog window).
    pub oplog_floor: usize,
    next_id: i64,
    last_time: Timestamp,
    /// Comment ids hard-deleted so far (for re-inserts of a known `_id`).
    gone_ids: Vec<i64>,
    pub posts: i64,
    /// `changeStreamPreAndPostImages` enabled on the collection.
    pub pre_images_enabled: bool,
    /// Update events carry `updateDescription` (a real server); without it (some compatible
    /// servers) only the looked-up document tells what changed.
    pub update_descriptions: bool,
    /// Reads carry a post-batch resume token (a real server); some servers send none.
    pub post_batch_tokens: bool,
    /// Writers sometimes remove a row's `post_id` (it leaves counting) and set it again later.
    pub unset_post_ids: bool,
    /// Share of pre-images that have expired by the time they are read (they come back null).
    pub pre_image_expiry: f64,
    counters: BTreeMap<PostId, CounterRec>,
    /// Ledger entries by (collection, comment key): each partition keeps its own collection.
    ledger: BTreeMap<(String, String), (Bson, LedgerRec)>,
    dirty: BTreeMap<PostId, DirtyRec>,
    checkpoints: BTreeMap<String, CheckpointRec>,
    leases: BTreeMap<String, LeaseRec>,
    runs: Vec<RunSummary>,
    sweeps: BTreeMap<String, SweepCursor>,
    pub faults: Faults,
    pub broken: Broken,
    /// Applied counter increments per (post, bucket).
    pub shadow: BTreeMap<(PostId, i64), i64>,
    /// Counts of what happened, for coverage: injected faults by call and strike, pauses, folds.
    pub stats: BTreeMap<String, u64>,
    /// Non-worker actors (writers, reconciler) still running this round.
    pub others_running: usize,
    /// Workers still running this round.
    pub workers_running: usize,
    /// Shutdown switches of this round's workers: a worker that is caught up and alone is told
    /// to stop right after its idle read, so that it never sleeps on tokio's (real) clock while
    /// another actor runs.
    pub shutdown: Vec<tokio::sync::watch::Sender<bool>>,
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
    pub injected: BTreeMap<PostId, Drift>,
    /// Injected amounts that sit in a counter's buckets, per (post, bucket): a bucket at or
    /// above its counter's watermark holds exactly its live rows plus this. A deleted counter
    /// leaves each bucket short of everything applied to it before.
    pub injected_buckets: BTreeMap<(PostId, i64), i64>,
    /// Drift corrected by every fold installed, per post (whether or not its run reported it).
    pub corrected: BTreeMap<PostId, Drift>,
    /// Every installed fold that corrected drift: (post, drift), in order.
    pub fold_log: Vec<(PostId, i64)>,
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
    /// Some stream's initial snapshot is still running (its worker is not caught up).
    pub fn snapshot_running(&self) -> bool {
        self.checkpoints
            .iter()
            .any(|(stream, c)| to_checkpoint(stream, c).snapshot_running())
    }

    pub fn alone(&self) -> bool {
        self.others_running == 0 && self.workers_running <= 1
    }

    pub fn stat(&mut self, key: impl Into<String>) {
        *self.stats.entry(key.into()).or_default() += 1;
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

    /// The simulated clock as a date.
    pub fn now(&self) -> DateTime {
        DateTime::from_millis(self.clock * 1000)
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

    /// Decides whether this call fails, and where.
    fn strike(
        &mut self,
        op: &'static str,
        statements: Option<usize>,
        writes: bool,
    ) -> Option<(Strike, StoreError)> {
        if self.faults.budget == 0
            || self.faults.rate <= 0.0
            || !self.rng.random_bool(self.faults.rate.min(1.0))
        {
            return None;
        }
        self.faults.budget -= 1;
        let strike = match (writes, statements) {
            (false, _) => Strike::Before,
            (true, Some(n)) if n > 1 => match self.rng.random_range(0..3) {
                0 => Strike::Before,
                1 => {
                    // Some statements landed, at least one did not.
                    let missed = self.rng.random_range(0..n);
                    let landed = (0..n)
                        .map(|i| i != missed && self.rng.random_bool(0.5))
                        .collect();
                    Strike::Partial(landed)
                }
                _ => Strike::After,
            },
            (true, _) => {
                if self.rng.random_bool(0.5) {
                    Strike::Before
                } else {
                    Strike::After
                }
            }
        };
        // A transient fault makes the worker back off on the simulated clock (it only yields).
        let transient = self.rng.random_bool(self.faults.transient_share);
        let kind = if transient { "transient" } else { "fatal" };
        let at = match strike {
            Strike::Before => "before",
            Strike::Partial(_) => "partial",
            Strike::After => "after",
        };
        self.stat(format!("fault {op} {at}"));
        self.stat(format!("fault {kind}"));
        self.note(format!("  !! {kind} fault in {op} ({at})"));
        let message = format!("{INJECTED} {kind} fault ({at})");
        let error = if transient {
            StoreError::Transient { op, message }
        } else {
            StoreError::Fatal { op, message }
        };
        Some((strike, error))
    }

    // --- the writers -----------------------------------------------------------------------

    fn next_time(&mut self) -> Timestamp {
        let time = self.clock as u32;
        self.last_time = if time > self.last_time.time {
            Timestamp { time, increment: 1 }
        } else {
            Timestamp {
                time: self.last_time.time,
                increment: self.last_time.increment + 1,
            }
        };
        self.last_time
    }

    fn append(&mut self, id: i64, kind: OpKind, pre: Option<Document>) {
        let seq = self.oplog.len() as u64 + 1;
        let time = self.next_time();
        let pre_expired = self.rng.random_bool(self.pre_image_expiry);
        self.oplog.push(OplogEntry {
            seq,
            token: event_token(seq),
            time,
            id,
            kind,
            pre,
            pre_expired,
        });
    }

    fn random_post(&mut self) -> i64 {
        self.rng.random_range(0..self.posts)
    }

    /// A row to change: often one of the oldest third (ids grow with time), whose events
    /// change settled buckets, the ones a recount below the watermark counts.
    fn random_row(&mut self) -> Option<i64> {
        let n = self.comments.len();
        if n == 0 {
            return None;
        }
        let i = if self.rng.random_bool(0.4) {
            self.rng.random_range(0..n.div_ceil(3))
        } else {
            self.rng.random_range(0..n)
        };
        self.comments.keys().nth(i).copied()
    }

    /// Replaces (or removes) a row of the truth, keeping the live rows per bucket.
    fn set_row(&mut self, id: i64, row: Option<Document>) -> Option<Document> {
        self.generation += 1;
        let old = match row {
            Some(row) => {
                self.count_row(&row, 1);
                self.comments.insert(id, row)
            }
            None => self.comments.remove(&id),
        };
        if let Some(old) = &old {
            self.count_row(old, -1);
        }
        old
    }

    fn count_row(&mut self, row: &Document, sign: i64) {
        if let Some((post, created, true)) = row_facts(row) {
            let key = (post, bucket_of(created, self.bucket_width));
            let n = self.live.entry(key.clone()).or_default();
            *n += sign;
            if *n == 0 {
                self.live.remove(&key);
            }
        }
    }

    fn new_row(&mut self, id: i64) -> Document {
        let post = self.random_post();
        let mut row = doc! {"_id": id, POST_FIELD: post};
        let created = match self.rng.random_range(0..20) {
            0 => None,                                                 // no created_at
            1..=4 => Some(self.clock - self.rng.random_range(1..400)), // back-dated
            5 => Some(self.long_ago()),                                // an import of old rows
            6 => Some(self.clock + self.rng.random_range(1..30)),      // clock skew
            _ => Some(self.clock),
        };
        if let Some(secs) = created {
            row.insert(CREATED_FIELD, DateTime::from_millis(secs * 1000));
        }
        if self.rng.random_bool(0.08) {
            row.insert(DELETED_FIELD, DateTime::from_millis(self.clock * 1000));
        }
        row.insert("body", format!("b{}", self.rng.random_range(0..1000)));
        row
    }

    /// A creation time before the simulation began: below every watermark.
    fn long_ago(&mut self) -> i64 {
        self.start_clock - self.rng.random_range(0..3600)
    }

    /// `updateOne({_id}, {$set, $unset})`: no event when nothing changed, as on a real server.
    pub fn update(&mut self, id: i64, set: Document, unset: &[&str]) -> bool {
        let Some(old) = self.comments.get(&id).cloned() else {
            return false;
        };
        let mut new = old.clone();
        let mut updated = Document::new();
        for (k, v) in set {
            if old.get(&k) != Some(&v) {
                updated.insert(k.clone(), v.clone());
            }
            new.insert(k, v);
        }
        let mut removed = Vec::new();
        for k in unset {
            if new.remove(*k).is_some() {
                removed.push(k.to_string());
            }
        }
        if updated.is_empty() && removed.is_empty() {
            return false;
        }
        self.set_row(id, Some(new));
        self.append(id, OpKind::Update { updated, removed }, Some(old));
        true
    }

    /// Inserts a row (and its insert event) at the simulated clock.
    pub fn insert_row(&mut self, row: Document) {
        let id = row.get_i64("_id").expect("an integer _id");
        self.set_row(id, Some(row.clone()));
        self.append(id, OpKind::Insert(row), None);
    }

    /// `deleteOne({_id})` (and its delete event) at the simulated clock.
    pub fn delete_row(&mut self, id: i64) -> bool {
        let Some(old) = self.set_row(id, None) else {
            return false;
        };
        self.append(id, OpKind::Delete, Some(old));
        self.gone_ids.push(id);
        true
    }

    /// One random write by an application, at the simulated clock. Returns what it did.
    pub fn write_random(&mut self) -> String {
        self.clock += self.rng.random_range(0..=2);
        let now_date = Bson::DateTime(DateTime::from_millis(self.clock * 1000));
        let roll = self.rng.random_range(0..100);
        let Some(id) = self.random_row().filter(|_| roll >= 25) else {
            // insert (a fresh id, or now and then a hard-deleted id again)
            let id = if !self.gone_ids.is_empty() && self.rng.random_bool(0.1) {
                let i = self.rng.random_range(0..self.gone_ids.len());
                self.gone_ids.swap_remove(i)
            } else {
                self.next_id += 1;
                self.next_id
            };
            let row = self.new_row(id);
            self.insert_row(row.clone());
            return format!("insert {row}");
        };
        let what = match roll {
            25..=41 => {
                self.update(id, doc! {DELETED_FIELD: now_date}, &[]);
                "soft delete"
            }
            42..=53 => {
                if self.rng.random_bool(0.5) {
                    self.update(id, doc! {}, &[DELETED_FIELD]);
                } else {
                    self.update(id, doc! {DELETED_FIELD: Bson::Null}, &[]);
                }
                "undelete"
            }
            54..=65 => {
                let post = self.random_post();
                match self.rng.random_range(0..8) {
                    0 | 1 => {
                        let deleted = if self.rng.random_bool(0.5) {
                            now_date
                        } else {
                            Bson::Null
                        };
                        self.update(id, doc! {POST_FIELD: post, DELETED_FIELD: deleted}, &[]);
                        "move and (un)delete"
                    }
                    // The row leaves counting altogether (and a later move brings it back).
                    2 if self.unset_post_ids => {
                        self.update(id, doc! {}, &[POST_FIELD]);
                        "remove post_id of"
                    }
                    _ => {
                        self.update(id, doc! {POST_FIELD: post}, &[]);
                        "move"
                    }
                }
            }
            66..=74 => {
                self.delete_row(id);
                "hard delete"
            }
            75..=88 => {
                let body = format!("b{}", self.rng.random_range(0..1000));
                self.update(id, doc! {"body": body}, &[]);
                "edit"
            }
            89..=95 => {
                let old = self.comments.get(&id).cloned();
                let mut row = self.new_row(id);
                if self.rng.random_bool(0.7) {
                    // Usually a replace keeps the creation time.
                    match old.as_ref().and_then(|o| o.get(CREATED_FIELD)) {
                        Some(c) => row.insert(CREATED_FIELD, c.clone()),
                        None => row.remove(CREATED_FIELD),
                    };
                }
                if old.as_ref() != Some(&row) {
                    self.set_row(id, Some(row.clone()));
                    self.append(id, OpKind::Replace(row), old);
                }
                "replace"
            }
            _ => {
                let secs = if self.rng.random_bool(0.3) {
                    self.long_ago()
                } else {
                    self.clock - self.rng.random_range(0..300)
                };
                self.update(
                    id,
                    doc! {CREATED_FIELD: DateTime::from_millis(secs * 1000)},
                    &[],
                );
                "restamp created_at"
            }
        };
        format!("{what} {id}")
    }

    // --- the truth -------------------------------------------------------------------------

    /// Live rows per (post, creation bucket).
    pub fn truth_by_bucket(&self) -> &BTreeMap<(PostId, i64), i64> {
        &self.live
    }

    /// The live rows per bucket counted from the rows themselves: equal to `truth_by_bucket`,
    /// or a write changed `comments` without `set_row`.
    pub fn recount_truth(&self) -> BTreeMap<(PostId, i64), i64> {
        let mut out = BTreeMap::new();
        for row in self.comments.values() {
            if let Some((post, created, true)) = row_facts(row) {
                *out.entry((post, bucket_of(created, self.bucket_width)))
                    .or_default() += 1;
            }
        }
        out
    }

    pub fn truth(&self) -> BTreeMap<PostId, i64> {
        let mut out = BTreeMap::new();
        for ((post, _), n) in &self.live {
            *out.entry(post.clone()).or_default() += n;
        }
        out
    }

    /// What every counter displays: `base_count + live_delta`.
    pub fn displayed(&self) -> BTreeMap<PostId, i64> {
        self.counters
            .iter()
            .map(|(p, c)| (p.clone(), c.base_count + c.live_delta))
            .collect()
    }

    /// Whether a history gap was recorded on any stream.
    pub fn has_gaps(&self) -> bool {
        self.checkpoints.values().any(|c| !c.gaps.is_empty())
    }

    /// Every one of `streams` has nothing in flight and, resumed now, would count no event
    /// anew: the events after its resume position (a token, else a start time, else the
    /// worker's configured `start_at`) are all at or below its high water. Events truncated
    /// away count too: a worker whose resume position fell off the oplog has not caught up
    /// (it has yet to find its history lost).
    pub fn caught_up(&self, streams: &[String], start_at: Option<Timestamp>) -> bool {
        streams.iter().all(|stream| {
            let Some(c) = self.checkpoints.get(stream) else {
                return self.oplog.is_empty();
            };
            let from = match (&c.token, c.start_time.or(start_at)) {
                (Some(token), _) => self.index_after(token),
                (None, Some(at)) => self.oplog.partition_point(|e| e.time < at),
                (None, None) => self.oplog.len(),
            };
            let from = from.min(self.oplog.len());
            let snapshotting = to_checkpoint(stream, c).snapshot_running();
            // A stream that has applied nothing yet, beside existing rows, is about to snapshot
            // them (with `initial_snapshot = never` the simulation writes none before it).
            let to_snapshot = c.gaps.is_empty()
                && c.snapshot.is_none()
                && c.token.is_none()
                && c.high_water.is_none()
                && !self.comments.is_empty();
            // Tokens grow along the oplog: the last event after `from` is the newest.
            !snapshotting
                && !to_snapshot
                && c.pending.is_none()
                && (from == self.oplog.len()
                    || c.high_water
                        .as_deref()
                        .is_some_and(|h| self.oplog.last().is_some_and(|e| e.token.as_str() <= h)))
        })
    }

    // --- the operator's hand edits ------------------------------------------------------------

    /// The buckets of a post's counter (`None`: no counter).
    pub fn counter_buckets(&self, post: &PostId) -> Option<Vec<i64>> {
        self.counters
            .get(post)
            .map(|c| c.buckets.keys().copied().collect())
    }

    fn inject(&mut self, post: &PostId, amount: i64) {
        self.generation += 1;
        self.injected.entry(post.clone()).or_default().add(amount);
    }

    /// `$inc: {base_count: k}` on an existing counter.
    /// Every counter's `count` beside its `base_count + live_delta`.
    pub fn counts(&self) -> Vec<(PostId, i64, i64)> {
        self.counters
            .iter()
            .map(|(p, c)| (p.clone(), c.count, c.base_count + c.live_delta))
            .collect()
    }

    pub fn inject_base(&mut self, post: &PostId, k: i64) -> bool {
        let Some(c) = self.counters.get_mut(post) else {
            return false;
        };
        c.base_count += k;
        c.count += k;
        self.inject(post, k);
        self.note(format!("operator: {post} base_count {k:+}"));
        self.stat("operator edit base");
        true
    }

    /// `$inc: {live_delta: k, "live_by_bucket.<bucket>": k}` on an existing counter.
    pub fn inject_bucket(&mut self, post: &PostId, bucket: i64, k: i64) -> bool {
        let Some(c) = self.counters.get_mut(post) else {
            return false;
        };
        c.live_delta += k;
        c.count += k;
        *c.buckets.entry(bucket).or_default() += k;
        self.inject(post, k);
        *self
            .injected_buckets
            .entry((post.clone(), bucket))
            .or_default() += k;
        self.note(format!(
            "operator: {post} live_delta and bucket {bucket} {k:+}"
        ));
        self.stat("operator edit bucket");
        true
    }

    /// Deletes a counter document; returns what it displayed. Only while no batch of any
    /// stream is in flight for the post (a pending intent re-applied to the new, empty
    /// document would count its increments again: drift, but not the drift recorded here).
    pub fn delete_counter(&mut self, post: &PostId) -> Option<i64> {
        let in_flight = self.checkpoints.values().any(|c| {
            let chunk = c.snapshot.as_ref().and_then(|s| s.pending.as_ref());
            c.pending
                .as_ref()
                .is_some_and(|p| p.counters.iter().any(|w| w.post == *post))
                || chunk.is_some_and(|p| p.counters.iter().any(|w| w.post == *post))
        });
        if in_flight {
            return None;
        }
        let c = self.counters.remove(post)?;
        let displayed = c.base_count + c.live_delta;
        self.inject(post, -displayed);
        // Every bucket of a counter created anew lacks all that was applied to it before.
        self.injected_buckets.retain(|(p, _), _| p != post);
        let before: Vec<((PostId, i64), i64)> = self
            .shadow
            .range((post.clone(), i64::MIN)..=(post.clone(), i64::MAX))
            .map(|(k, v)| (k.clone(), -v))
            .collect();
        self.injected_buckets.extend(before);
        self.note(format!(
            "operator: deleted counter {post} (displayed {displayed})"
        ));
        self.stat("operator deleted counter");
        Some(displayed)
    }

    /// A fold was installed.
    fn installed(&mut self, post: &PostId, fold: &Fold) {
        self.stat("fold installed");
        let racing = self.others_running > 0;
        if racing {
            self.stat("fold installed while others run");
        }
        if fold.drift != 0 {
            self.stat("fold corrected drift");
            if racing {
                self.stat("fold corrected drift while others run");
            }
        }
        self.record_correction(post, fold.drift);
    }

    /// An installed fold corrected `drift` on `post`.
    fn record_correction(&mut self, post: &PostId, drift: i64) {
        if drift == 0 {
            return;
        }
        self.fold_log.push((post.clone(), drift));
        let corrected = {
            let c = self.corrected.entry(post.clone()).or_default();
            c.add(drift);
            *c
        };
        if self.drift_bounds && !self.has_gaps() {
            let injected = self.injected.get(post).copied().unwrap_or_default();
            if corrected.high > injected.high || corrected.low < injected.low {
                let e = format!(
                    "a fold corrected post {post} by {drift:+}: corrections so far {corrected:?} exceed the drift injected {injected:?} (the reconciler invented drift)"
                );
                self.note(format!("  !! {e}"));
                self.probe_failures.push(e);
            }
        }
    }

    /// (base_count, base_watermark, live_delta, buckets) of every counter.
    pub fn counters(&self) -> BTreeMap<PostId, (i64, i64, i64, BTreeMap<i64, i64>)> {
        self.counters
            .iter()
            .map(|(p, c)| {
                (
                    p.clone(),
                    (
                        c.base_count,
                        c.base_watermark,
                        c.live_delta,
                        c.buckets.clone(),
                    ),
                )
            })
            .collect()
    }

    pub fn dirty_posts(&self) -> Vec<PostId> {
        self.dirty.keys().cloned().collect()
    }

    pub fn last_token(&self) -> Option<String> {
        self.oplog.last().map(|e| e.token.clone())
    }

    pub fn checkpoint_view(&self, stream: &str) -> Option<Checkpoint> {
        self.checkpoints
            .get(stream)
            .map(|c| to_checkpoint(stream, c))
    }

    // --- the change stream -----------------------------------------------------------------

    /// The event document as a real server returns it when it is read now.
    fn render(&self, e: &OplogEntry, pre_images: bool) -> Document {
        let mut d = doc! {
            "_id": {"_data": &e.token},
            "operationType": match e.kind {
                OpKind::Insert(_) => "insert",
                OpKind::Update { .. } => "update",
                OpKind::Replace(_) => "replace",
                OpKind::Delete => "delete",
            },
            "clusterTime": e.time,
            "wallTime": DateTime::from_millis(e.time.time as i64 * 1000),
            "ns": {"db": "app", "coll": "comments"},
            "documentKey": {"_id": e.id},
        };
        match &e.kind {
            OpKind::Insert(row) | OpKind::Replace(row) => {
                d.insert("fullDocument", row.clone());
            }
            OpKind::Update { updated, removed } => {
                if self.update_descriptions {
                    d.insert(
                        "updateDescription",
                        doc! {"updatedFields": updated.clone(), "removedFields": removed.clone(), "truncatedArrays": []},
                    );
                } else {
                    // Like the fake test server: the update spec rides in `documentKey`.
                    let mut unset = Document::new();
                    for field in removed.iter() {
                        unset.insert(field.as_str(), "");
                    }
                    d.insert(
                        "documentKey",
                        doc! {"_id": e.id, "$set": updated.clone(), "$unset": unset},
                    );
                }
                // updateLookup: the row as it is now, null when it is gone.
                d.insert(
                    "fullDocument",
                    self.comments
                        .get(&e.id)
                        .cloned()
                        .map(Bson::Document)
                        .unwrap_or(Bson::Null),
                );
            }
            OpKind::Delete => {}
        }
        if pre_images && self.pre_images_enabled && !matches!(e.kind, OpKind::Insert(_)) {
            let pre = match (&e.pre, e.pre_expired) {
                (Some(pre), false) => Bson::Document(pre.clone()),
                _ => Bson::Null,
            };
            d.insert("fullDocumentBeforeChange", pre);
        }
        d
    }

    /// Index of the first oplog entry after `token`.
    fn index_after(&self, token: &str) -> usize {
        self.oplog.partition_point(|e| e.token.as_str() <= token)
    }
}

/// The resume token `_data` of event `seq` (uppercase hex, like a real one; sorts in order).
pub fn event_token(seq: u64) -> String {
    format!("82{seq:016X}")
}

/// A post-batch token of an idle stream after event `seq`: after it, before the next event.
fn high_water_token(seq: u64) -> String {
    format!("82{seq:016X}FF")
}

/// (post, created_at, live) of a row document, when it counts at all.
pub fn row_facts(row: &Document) -> Option<(PostId, Option<DateTime>, bool)> {
    let post = row.get(POST_FIELD).and_then(PostId::from_bson)?;
    let created = match row.get(CREATED_FIELD) {
        Some(Bson::DateTime(d)) => Some(*d),
        _ => None,
    };
    let live = matches!(row.get(DELETED_FIELD), None | Some(Bson::Null));
    Some((post, created, live))
}

fn to_checkpoint(stream: &str, c: &CheckpointRec) -> Checkpoint {
    Checkpoint {
        stream: stream.to_string(),
        token: c.token.clone().map(Token),
        token_time: c.token_time,
        start_time: c.start_time,
        caught_up_at: c.caught_up_at,
        high_water: c.high_water.clone().map(Token),
        pending: c.pending.clone(),
        epoch: c.epoch.unwrap_or(0),
        deployment: c.deployment.clone(),
        updated_at: c.updated_at,
        gaps: c.gaps.clone(),
        sweep_requested: c.sweep_requested.unwrap_or(false),
        snapshot: c.snapshot.clone(),
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

/// The in-process store. Clones share the same state.
#[derive(Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
}

impl MemoryStore {
    pub fn new(seed: u64, bucket_width: i64, posts: i64, clock: i64) -> MemoryStore {
        MemoryStore {
            state: Arc::new(Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                clock,
                start_clock: clock,
                bucket_width,
                comments: BTreeMap::new(),
                live: BTreeMap::new(),
                oplog: Vec::new(),
                oplog_floor: 0,
                next_id: 0,
                last_time: Timestamp {
                    time: 0,
                    increment: 0,
                },
                gone_ids: Vec::new(),
                posts,
                pre_images_enabled: false,
                update_descriptions: true,
                post_batch_tokens: true,
                unset_post_ids: true,
                pre_image_expiry: 0.1,
                counters: BTreeMap::new(),
                ledger: BTreeMap::new(),
                dirty: BTreeMap::new(),
                checkpoints: BTreeMap::new(),
                leases: BTreeMap::new(),
                runs: Vec::new(),
                sweeps: BTreeMap::new(),
                faults: Faults::none(),
                broken: Broken::None,
                shadow: BTreeMap::new(),
                stats: BTreeMap::new(),
                others_running: 0,
                workers_running: 0,
                shutdown: Vec::new(),
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

    /// The entry of a store call: maybe yield, then maybe strike.
    async fn enter(
        &self,
        op: &'static str,
        statements: Option<usize>,
        writes: bool,
    ) -> Option<(Strike, StoreError)> {
        self.maybe_yield().await;
        let mut s = self.lock();
        s.probe_point();
        if writes {
            s.generation += 1;
        }
        s.stat(format!("call {op}"));
        s.strike(op, statements, writes)
    }

    /// A read or single-document call: fails before or after `body`.
    async fn single<T>(
        &self,
        op: &'static str,
        writes: bool,
        body: impl FnOnce(&mut State) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let strike = self.enter(op, None, writes).await;
        if let Some((Strike::Before, e)) = strike {
            return Err(e);
        }
        let mut s = self.lock();
        let result = body(&mut s)?;
        match strike {
            Some((_, e)) => Err(e),
            None => Ok(result),
        }
    }

    /// A multi-statement write (`ordered: false`): statements apply one by one, the other actors
    /// may run between them, and a fault may leave any subset of them applied.
    async fn statements<T>(
        &self,
        op: &'static str,
        items: &[T],
        mut body: impl FnMut(&mut State, &T),
    ) -> StoreResult<()> {
        let strike = self.enter(op, Some(items.len()), true).await;
        let lands = |i: usize| match &strike {
            Some((Strike::Before, _)) => false,
            Some((Strike::Partial(landed), _)) => landed[i],
            _ => true,
        };
        for (i, item) in items.iter().enumerate().filter(|(i, _)| lands(*i)) {
            if i > 0 {
                self.maybe_yield().await;
            }
            body(&mut self.lock(), item);
        }
        match strike {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

/// Whether a drained stream answers "nothing new" now, while other actors run.
fn drained_answer(s: &mut State) -> bool {
    let rate = s.drained_answers;
    s.rng.random_bool(rate)
}

/// Simulated time: `now` is the simulated clock, and a pause only yields to the other actors (one
/// to three times, seeded), whatever its length: it never sleeps on tokio's timer, and it never
/// moves the clock (writers and the rounds do).
pub struct SimClock(MemoryStore);

#[async_trait]
impl Clock for SimClock {
    fn now(&self) -> DateTime {
        self.0.lock().now()
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

/// The ledger collection of a stream, as `mongo.rs` names it: partitions keep their own.
fn ledger_collection(stream: &str) -> String {
    match stream.split_once('/') {
        Some((_, partition)) => format!("counterd_comment_state_{partition}"),
        None => "counterd_comment_state".to_string(),
    }
}

/// `field` is not `>= value`, for an optional string field.
fn not_gte(field: Option<&str>, value: &str) -> bool {
    field.is_none_or(|f| f < value)
}

/// `epoch` is not newer than the fence's.
fn fence_ok(epoch: Option<i64>, fence: &Fence) -> bool {
    epoch.is_none_or(|e| e <= fence.epoch)
}

/// `update_one({_id: stream, epoch: fence.epoch}, update, upsert)`: a failed upsert on an
/// existing document (another epoch) is a duplicate key, reported as `Fenced`.
fn checkpoint_update(
    s: &mut State,
    fence: &Fence,
    matches: impl Fn(&CheckpointRec) -> bool,
    update: impl FnOnce(&mut CheckpointRec, DateTime),
    insert_epoch: bool,
) -> StoreResult<()> {
    let now = s.now();
    match s.checkpoints.get_mut(&fence.stream) {
        Some(c) if matches(c) => {
            update(c, now);
            Ok(())
        }
        Some(_) => Err(StoreError::Fenced {
            stream: fence.stream.clone(),
            epoch: fence.epoch,
        }),
        None => {
            let mut c = CheckpointRec {
                epoch: insert_epoch.then_some(fence.epoch),
                ..CheckpointRec::default()
            };
            update(&mut c, now);
            s.checkpoints.insert(fence.stream.clone(), c);
            Ok(())
        }
    }
}

/// Adds one counter write's increments (`live_delta`, `count`, each bucket) under the writer's
/// epoch, and to the shadow of everything applied; returns the counter for the write's own
/// fields (the stream's guard token, or the snapshot's chunk).
fn add_increment<'a>(s: &'a mut State, w: &CounterDelta, fence: &Fence) -> &'a mut CounterRec {
    for (bucket, amount) in &w.buckets {
        *s.shadow.entry((w.post.clone(), *bucket)).or_default() += amount;
    }
    let c = s.counters.entry(w.post.clone()).or_default();
    c.live_delta += w.delta;
    c.count += w.delta;
    for (bucket, amount) in &w.buckets {
        *c.buckets.entry(*bucket).or_default() += amount;
    }
    c.epoch = Some(fence.epoch);
    c
}

/// A checkpoint write by the worker that owns the stream's current epoch (`mongo`'s
/// `owned_checkpoint_update`).
fn owned_checkpoint_update(
    s: &mut State,
    fence: &Fence,
    update: impl FnOnce(&mut CheckpointRec, DateTime),
) -> StoreResult<()> {
    checkpoint_update(s, fence, |c| c.epoch == Some(fence.epoch), update, true)
}

fn max_string(field: &mut Option<String>, value: &str) {
    if field.as_deref().is_none_or(|f| f < value) {
        *field = Some(value.to_string());
    }
}

/// Mongo's `limit(n)`: 0 is no limit, a negative limit is one batch of `|n|`.
fn mongo_limit(limit: usize) -> usize {
    // `mongo.rs` sends `limit.min(i64::MAX as usize) as i64`.
    match limit.min(i64::MAX as usize) as i64 {
        0 => usize::MAX,
        n => n.unsigned_abs() as usize,
    }
}

/// The open change stream over the simulated oplog.
struct MemoryEvents {
    store: MemoryStore,
    /// Index of the next entry to return.
    next: usize,
    pre_images: bool,
    /// Resumed after a token (or at a time) that is no longer in the oplog: the first read
    /// fails with code 286, like a real server.
    lost: Option<String>,
    /// This stream has answered "nothing new" once while its worker ran alone.
    idled: bool,
    /// "Nothing new" answers given instead of stopping because some stream's initial snapshot
    /// runs (bounded: the snapshot may be another partition's, whose worker is not running).
    snapshot_waits: u32,
}

/// At most this many "nothing new" answers while a snapshot runs, per opened stream.
const SNAPSHOT_WAITS: u32 = 200;

#[async_trait]
impl EventSource for MemoryEvents {
    async fn next_batch(&mut self, max: usize, _max_wait: Duration) -> StoreResult<RawBatch> {
        let strike = self.store.enter("next_batch", None, false).await;
        {
            let mut s = self.store.lock();
            if s.read_budget == Some(0) {
                s.stat("pause budget");
                return Err(StoreError::Fatal {
                    op: "next_batch",
                    message: PAUSE.into(),
                });
            }
            if let Some((_, e)) = strike {
                return Err(e);
            }
            if let Some(token) = self.lost.take() {
                s.stat("history lost");
                return Err(StoreError::HistoryLost { code: 286, token });
            }
        }
        // Like an awaitData getMore: while writers may still write, wait for events, or now and
        // then answer "nothing new" (the worker then records its drained position).
        loop {
            let wait = {
                let mut s = self.store.lock();
                if s.oplog.len() > self.next || s.alone() {
                    false
                } else if s.others_running == 0
                    && s.snapshot_running()
                    && self.snapshot_waits < SNAPSHOT_WAITS
                {
                    self.snapshot_waits += 1;
                    s.note("  read: none (a snapshot runs)".into());
                    return Ok(RawBatch::default());
                } else if s.others_running == 0 {
                    // Only workers are left, all caught up: this one stops, so that the last
                    // can take its idle turn alone.
                    s.stat("pause caught up");
                    return Err(StoreError::Fatal {
                        op: "next_batch",
                        message: PAUSE.into(),
                    });
                } else if drained_answer(&mut s) {
                    s.gaps_in_a_row = 0;
                    let last = s.oplog.last().map_or(0, |e| e.seq);
                    let token = high_water_token(last);
                    s.note(format!("  read: none (others run), post-batch {token}"));
                    s.stat("drained answer while others run");
                    return Ok(RawBatch {
                        events: Vec::new(),
                        post_batch_token: s.post_batch_tokens.then_some(Token(token)),
                    });
                } else {
                    true
                }
            };
            if !wait {
                break;
            }
            YieldOnce(false).await;
        }
        let mut s = self.store.lock();
        s.gaps_in_a_row = 0;
        let available = s.oplog.len() - self.next;
        if available == 0 && s.snapshot_running() && self.snapshot_waits < SNAPSHOT_WAITS {
            self.snapshot_waits += 1;
            // Not caught up until the initial snapshot is done: the worker takes a chunk
            // between reads.
            s.note("  read: none (a snapshot runs)".into());
            return Ok(RawBatch::default());
        }
        if available == 0 {
            if self.idled {
                s.stat("pause caught up");
                return Err(StoreError::Fatal {
                    op: "next_batch",
                    message: PAUSE.into(),
                });
            }
            // Caught up and alone: answer "nothing new" with the post-batch token, and tell the
            // worker to stop after it has checkpointed it.
            self.idled = true;
            let last = s.oplog.last().map_or(0, |e| e.seq);
            let token = high_water_token(last);
            s.note(format!("  read: none, post-batch {token}"));
            s.stat("stop caught up");
            for tx in &s.shutdown {
                tx.send_replace(true);
            }
            return Ok(RawBatch {
                events: Vec::new(),
                post_batch_token: s.post_batch_tokens.then_some(Token(token)),
            });
        }
        let limit = max.min(available).min(s.read_max).max(1);
        let n = s.rng.random_range(1..=limit);
        let events: Vec<Document> = (self.next..self.next + n)
            .map(|i| s.render(&s.oplog[i], self.pre_images))
            .collect();
        let last = s.oplog[self.next + n - 1].token.clone();
        let what: Vec<String> = s.oplog[self.next..self.next + n]
            .iter()
            .map(|e| {
                let op = match e.kind {
                    OpKind::Insert(_) => "insert",
                    OpKind::Update { .. } => "update",
                    OpKind::Replace(_) => "replace",
                    OpKind::Delete => "delete",
                };
                // `~`: the pre-image expired (when pre-images are asked for).
                let expired = if self.pre_images && e.pre_expired {
                    "~"
                } else {
                    ""
                };
                format!("{} {op} {}{expired}", &e.token[e.token.len() - 2..], e.id)
            })
            .collect();
        let line = format!("  read: {}", what.join(", "));
        s.note(line);
        self.next += n;
        if let Some(budget) = s.read_budget.as_mut() {
            *budget = budget.saturating_sub(1);
        }
        Ok(RawBatch {
            events,
            post_batch_token: s.post_batch_tokens.then_some(Token(last)),
        })
    }
}

#[async_trait]
impl ChangeStreams for MemoryStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        if !options.pipeline.is_empty() {
            return Err(StoreError::Fatal {
                op: "open the change stream",
                message: "the simulation does not evaluate stream pipelines".into(),
            });
        }
        let (next, lost) = self
            .single("open_stream", false, |s| {
                let truncated = s.oplog_floor.checked_sub(1).map(|i| s.oplog[i].clone());
                Ok(match &options.start {
                    StreamStart::After(token) => {
                        let lost = truncated
                            .filter(|t| t.token.as_str() > token.as_str())
                            .map(|_| token.to_string());
                        (s.index_after(token.as_str()), lost)
                    }
                    StreamStart::AtTime(at) => {
                        let lost = truncated.filter(|t| t.time >= *at).map(|_| String::new());
                        (s.oplog.partition_point(|e| e.time < *at), lost)
                    }
                    StreamStart::Now => (s.oplog.len(), None),
                })
            })
            .await?;
        let mut s = self.lock();
        let next = next.max(s.oplog_floor);
        s.note(format!(
            "  open stream at {:?} (index {next})",
            options.start
        ));
        Ok(Box::new(MemoryEvents {
            store: self.clone(),
            next,
            pre_images: options.pre_images,
            lost,
            idled: false,
            snapshot_waits: 0,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        self.single("read_position", false, |s| {
            if s.broken == Broken::UnconditionedRecount {
                let zero = Timestamp {
                    time: 0,
                    increment: 0,
                };
                return Ok(ServerNow {
                    lower: zero,
                    upper: zero,
                });
            }
            // Exact, like an `operationTime`: just after the newest event, or the clock.
            let after_last = Timestamp {
                time: s.last_time.time,
                increment: s.last_time.increment + 1,
            };
            let now = after_last.max(Timestamp {
                time: s.clock as u32,
                increment: 0,
            });
            Ok(ServerNow {
                lower: now,
                upper: now,
            })
        })
        .await
    }
}

#[async_trait]
impl Checkpoints for MemoryStore {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        self.single("load_checkpoint", false, |s| {
            let c = s.checkpoints.get(stream);
            if let Some(t) = c.and_then(|c| c.token.as_ref()) {
                if t.is_empty() || !t.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(StoreError::Malformed {
                        what: "checkpoint",
                        id: stream.to_string(),
                        detail: format!("`token` is {t:?}"),
                    });
                }
            }
            Ok(c.map(|c| to_checkpoint(stream, c)))
        })
        .await
    }

    async fn record_intent(&self, fence: &Fence, batch: &PendingBatch) -> StoreResult<()> {
        self.single("record_intent", true, |s| {
            s.note(format!(
                "  intent {} ({} counters)",
                batch.end,
                batch.counters.len()
            ));
            owned_checkpoint_update(s, fence, |c, now| {
                max_string(&mut c.high_water, batch.end.as_str());
                c.pending = Some(batch.clone());
                c.updated_at = Some(now);
            })
        })
        .await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        self.single("save_checkpoint", true, |s| {
            s.note(format!("  checkpoint {token}"));
            owned_checkpoint_update(s, fence, |c, now| {
                c.token = Some(token.to_string());
                c.updated_at = Some(now);
                if let Some(t) = token_time {
                    c.token_time = Some(t);
                }
                max_string(&mut c.high_water, token.as_str());
                c.pending = None;
            })
        })
        .await
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        self.single("move_checkpoint", true, |s| {
            let now = s.now();
            let c = s.checkpoints.entry(stream.to_string()).or_default();
            c.updated_at = Some(now);
            match to {
                Position::Token(t) => {
                    c.token = Some(t.to_string());
                    c.token_time = None;
                    c.start_time = None;
                }
                Position::Time(t) => {
                    c.start_time = Some(*t);
                    c.token = None;
                    c.token_time = None;
                }
                Position::Unset => {
                    c.token = None;
                    c.token_time = None;
                    c.start_time = None;
                }
            }
            Ok(())
        })
        .await
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.single("record_start", true, |s| {
            s.note(format!("  start pinned at {at:?}"));
            owned_checkpoint_update(s, fence, |c, now| {
                c.start_time = Some(at);
                c.updated_at = Some(now);
            })
        })
        .await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.single("record_caught_up", true, |s| {
            s.note(format!("  drained at {at:?}"));
            checkpoint_update(
                s,
                fence,
                |c| c.epoch == Some(fence.epoch),
                |c, _now| {
                    if c.caught_up_at.is_none_or(|t| t < at) {
                        c.caught_up_at = Some(at);
                    }
                },
                true,
            )
        })
        .await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        self.single("record_gap", true, |s| {
            s.note(format!("  gap recorded from {:?}", gap.from));
            s.gaps_in_a_row += 1;
            if s.gaps_in_a_row > 10 {
                return Err(StoreError::Fatal {
                    op: "record the history gap",
                    message: "the worker recorded 10 history gaps in a row without reading anything: it restarts at a position that is itself lost, in a hot loop".into(),
                });
            }
            owned_checkpoint_update(s, fence, |c, now| {
                    c.gaps.push(gap.clone());
                    c.sweep_requested = Some(true);
                    c.updated_at = Some(now);
                    c.token = None;
                    c.token_time = None;
                    // The new stream starts exactly where the gap ends.
                    c.start_time = Some(Timestamp {
                        time: gap.to.timestamp_millis().div_euclid(1000) as u32,
                        increment: 0,
                    });
                })
        })
        .await
    }

    /// Like the fake test server without `serverStatus`: nothing identifies the deployment
    /// (and no store call is made, so the simulation's interleavings are unchanged).
    async fn deployment(&self) -> StoreResult<Deployment> {
        Ok(Deployment::default())
    }

    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        self.single("record_deployment", true, |s| {
            owned_checkpoint_update(s, fence, |c, now| {
                c.deployment = Some(deployment.clone());
                c.updated_at = Some(now);
            })
        })
        .await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.single("set_sweep_requested", true, |s| {
            s.checkpoints
                .entry(stream.to_string())
                .or_default()
                .sweep_requested = Some(requested);
            Ok(())
        })
        .await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        self.single("save_snapshot", true, |s| {
            s.note(format!(
                "  snapshot {:?}: {} chunks, pending {:?}",
                progress.state,
                progress.chunks_done,
                progress.pending.as_ref().map(|c| c.number)
            ));
            let old = s
                .checkpoints
                .get(&fence.stream)
                .and_then(|c| c.snapshot.clone());
            let was = |f: fn(&SnapshotProgress) -> u64| old.as_ref().map_or(0, f);
            if progress.pending.is_some() && old.as_ref().is_none_or(|o| o.pending.is_none()) {
                s.stat("snapshot chunk planned");
            }
            if progress.chunks_resumed > was(|p| p.chunks_resumed) {
                s.stat("snapshot chunk finished after a restart");
            }
            if progress.chunks_reread > was(|p| p.chunks_reread) {
                s.stat("snapshot chunk read again after a restart");
            }
            if progress.state == counterd::store::SnapshotState::Done {
                s.stat("snapshot done");
            }
            owned_checkpoint_update(s, fence, |c, now| {
                c.snapshot = Some(progress.clone());
                c.updated_at = Some(now);
            })
        })
        .await
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        self.single("adopt_checkpoint", true, |s| {
            s.note(format!("  adopt epoch {}", fence.epoch));
            checkpoint_update(
                s,
                fence,
                |c| fence_ok(c.epoch, fence),
                |c, now| {
                    c.epoch = Some(fence.epoch);
                    c.updated_at = Some(now);
                },
                true,
            )
        })
        .await
    }
}

#[async_trait]
impl Counters for MemoryStore {
    async fn apply_counters(
        &self,
        fence: &Fence,
        writes: &[CounterDelta],
        through: &Token,
        through_time: Option<Timestamp>,
    ) -> StoreResult<ApplyOutcome> {
        let mut outcome = ApplyOutcome::default();
        self.statements("apply_counters", writes, |s, w| {
            let broken = s.broken;
            let guard = s.broken != Broken::NoGuard;
            let applies = match s.counters.get(&w.post) {
                Some(c) => {
                    (!guard || not_gte(c.applied_through.as_deref(), through.as_str()))
                        && fence_ok(c.epoch, fence)
                }
                None => true,
            };
            if !applies {
                // The upsert's insert hits the existing `_id`: duplicate key, already applied.
                outcome.already_applied += 1;
                s.note(format!(
                    "  counter {} {:+} {:?} at {through}: already applied",
                    w.post, w.delta, w.buckets
                ));
                return;
            }
            outcome.applied += 1;
            s.note(format!(
                "  counter {} {:+} {:?} at {through}",
                w.post, w.delta, w.buckets
            ));
            let c = add_increment(s, w, fence);
            c.applied_through = Some(through.to_string());
            c.applied_time = through_time;
            if broken != Broken::UnconditionedRecount {
                for bucket in &w.touched {
                    c.touched.insert(*bucket, through.to_string());
                }
            }
        })
        .await?;
        Ok(outcome)
    }

    async fn read_counter(&self, post: &PostId) -> StoreResult<Option<CounterDoc>> {
        self.single("read_counter", false, |s| {
            Ok(s.counters.get(post).map(|c| CounterDoc {
                post: Some(post.clone()),
                state: CounterState {
                    base_count: c.base_count,
                    base_watermark: c.base_watermark,
                    live_delta: c.live_delta,
                    buckets: c.buckets.clone(),
                },
                applied_through: c.applied_through.clone(),
                applied_time: c.applied_time,
                touched: c.touched.clone(),
                folds: c.folds,
                // Kept in the same single-document writes as its parts (hand edits too).
                count: Some(c.count),
                last_drift: c.last_drift,
                reconciled_at: c.reconciled_at,
            }))
        })
        .await
    }

    async fn install_fold(
        &self,
        post: &PostId,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.single("install_fold", true, |s| {
            let broken = s.broken;
            let Some(expected) = expected else {
                if s.counters.contains_key(post) {
                    return Ok(false);
                }
                s.counters.insert(
                    post.clone(),
                    CounterRec {
                        base_count: fold.base_count,
                        base_watermark: fold.watermark,
                        live_delta: fold.live_delta,
                        buckets: fold.kept.clone(),
                        applied_through: Some(String::new()),
                        applied_time: None,
                        touched: BTreeMap::new(),
                        folds: 1,
                        snapshot_chunk: None,
                        count: fold.base_count + fold.live_delta,
                        epoch: None,
                        last_drift: Some(fold.drift),
                        reconciled_at: Some(now),
                    },
                );
                s.installed(post, fold);
                s.note(format!(
                    "  fold {post} (new): {} at W={}",
                    fold.right, fold.watermark
                ));
                return Ok(true);
            };
            let Some(c) = s.counters.get_mut(post) else {
                return Ok(false);
            };
            if c.applied_through != expected.applied_through
                || c.live_delta != expected.state.live_delta
                || c.base_count != expected.state.base_count
                || c.folds != expected.folds
            {
                s.note(format!("  fold {post}: raced"));
                return Ok(false);
            }
            if broken == Broken::SeedFold {
                // The seed's formula: base' = C, live' = live - (base' - base).
                c.live_delta -= fold.base_count - c.base_count;
            } else {
                c.live_delta = fold.live_delta;
            }
            c.base_count = fold.base_count;
            c.count = c.base_count + c.live_delta;
            c.base_watermark = fold.watermark;
            c.last_drift = Some(fold.drift);
            c.reconciled_at = Some(now);
            for bucket in &fold.dropped {
                c.buckets.remove(bucket);
            }
            for bucket in expected.touched.keys().filter(|b| **b < fold.watermark) {
                c.touched.remove(bucket);
            }
            c.folds += 1;
            s.installed(post, fold);
            s.note(format!(
                "  fold {post}: {} -> {} at W={}",
                fold.wrong, fold.right, fold.watermark
            ));
            Ok(true)
        })
        .await
    }

    async fn posts_after(&self, after: Option<&PostId>, limit: usize) -> StoreResult<Vec<PostId>> {
        self.single("posts_after", false, |s| {
            let limit = mongo_limit(limit);
            let after_ok = |p: &PostId| after.is_none_or(|a| p > a);
            let from_comments: BTreeSet<PostId> = s
                .comments
                .values()
                .filter_map(|r| r.get(POST_FIELD).and_then(PostId::from_bson))
                .filter(after_ok)
                .collect();
            let from_counters = s.counters.keys().filter(|p| after_ok(p)).take(limit);
            let mut posts: Vec<PostId> = from_comments
                .into_iter()
                .take(limit)
                .chain(from_counters.cloned())
                .collect();
            posts.sort();
            posts.dedup();
            posts.truncate(limit);
            Ok(posts)
        })
        .await
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<PostId>> {
        self.single("sample_posts", false, |s| {
            let all: Vec<PostId> = s.counters.keys().cloned().collect();
            let mut posts: Vec<PostId> = (0..n.min(all.len()))
                .map(|_| all[s.rng.random_range(0..all.len())].clone())
                .collect();
            let with_rows: Vec<PostId> = s.truth().into_keys().collect();
            posts.extend(
                (0..n.min(with_rows.len()))
                    .map(|_| with_rows[s.rng.random_range(0..with_rows.len())].clone()),
            );
            posts.sort();
            posts.dedup();
            Ok(posts)
        })
        .await
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        let mut outcome = ApplyOutcome::default();
        self.statements("apply_snapshot_counters", writes, |s, w| {
            let applies = match s.counters.get(&w.post) {
                Some(c) => c.snapshot_chunk.is_none_or(|n| n < chunk) && fence_ok(c.epoch, fence),
                None => true,
            };
            if !applies {
                s.stat("snapshot increment already applied");
                outcome.already_applied += 1;
                return;
            }
            outcome.applied += 1;
            s.note(format!(
                "  counter {} {:+} from snapshot chunk {chunk}",
                w.post, w.delta
            ));
            add_increment(s, w, fence).snapshot_chunk = Some(chunk);
        })
        .await?;
        Ok(outcome)
    }
}

#[async_trait]
impl Ledger for MemoryStore {
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, Option<Row>>> {
        self.single("read_ledger", false, |s| {
            let collection = ledger_collection(stream);
            let mut out = HashMap::new();
            for c in comments {
                let key = (collection.clone(), c.key.clone());
                let current = s
                    .ledger
                    .get(&key)
                    .filter(|(_, e)| e.generation >= generation);
                if let Some((_, entry)) = current {
                    let row = entry.exists.then(|| Row {
                        post: entry.post.clone(),
                        created_at: entry.created_at,
                        deleted: entry.deleted,
                    });
                    out.insert(c.key.clone(), row);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        let collection = ledger_collection(&fence.stream);
        self.statements("write_ledger", updates, |s, u| {
            let key = (collection.clone(), u.comment.key.clone());
            let applies = match s.ledger.get(&key) {
                Some((_, e)) => {
                    not_gte(e.applied_through.as_deref(), through.as_str())
                        && fence_ok(e.epoch, fence)
                }
                None => true,
            };
            if !applies {
                return;
            }
            let entry = match &u.state {
                Some(row) => LedgerRec {
                    exists: true,
                    deleted: row.deleted,
                    post: row.post.clone(),
                    created_at: row.created_at,
                    applied_through: Some(through.to_string()),
                    epoch: Some(fence.epoch),
                    generation,
                },
                None => LedgerRec {
                    exists: false,
                    deleted: false,
                    post: None,
                    created_at: None,
                    applied_through: Some(through.to_string()),
                    epoch: Some(fence.epoch),
                    generation,
                },
            };
            s.ledger.insert(key, (u.comment.value.clone(), entry));
        })
        .await
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        let collection = ledger_collection(stream);
        self.statements("rebuild_ledger", rows, |s, (comment, row)| {
            let key = (collection.clone(), comment.key.clone());
            let old = s.ledger.get(&key).map(|(_, e)| e.clone());
            if old.as_ref().is_some_and(|e| e.generation >= generation) {
                return; // the upsert's insert: duplicate key
            }
            s.stat("ledger entry rebuilt");
            s.note(format!("  ledger {} rebuilt: {row:?}", comment.key));
            let entry = LedgerRec {
                exists: true,
                deleted: row.deleted,
                post: row.post.clone(),
                created_at: row.created_at,
                applied_through: None,
                epoch: old.and_then(|e| e.epoch),
                generation,
            };
            s.ledger.insert(key, (comment.value.clone(), entry));
        })
        .await
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        let collection = ledger_collection(&fence.stream);
        self.statements("claim_ledger", claims, |s, c| {
            let Some(row) = &c.state else { return };
            let key = (collection.clone(), c.comment.key.clone());
            if s.ledger.contains_key(&key) {
                s.stat("snapshot claim found the stream's entry");
                return; // `$setOnInsert`: the stream's entry stays
            }
            s.note(format!("  ledger {} claimed: {row:?}", c.comment.key));
            let entry = LedgerRec {
                exists: true,
                deleted: row.deleted,
                post: row.post.clone(),
                created_at: row.created_at,
                applied_through: None,
                epoch: Some(fence.epoch),
                generation,
            };
            s.ledger.insert(key, (c.comment.value.clone(), entry));
        })
        .await
    }
}

#[async_trait]
impl DirtySet for MemoryStore {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        self.statements("mark_dirty", marks, |s, m| {
            // Fenced like mongo.rs: an entry this stream marked under a newer epoch refuses it.
            if s.dirty
                .get(&m.post)
                .is_some_and(|d| d.stream == fence.stream && d.epoch > fence.epoch)
            {
                return;
            }
            let entry = s.dirty.entry(m.post.clone()).or_insert(DirtyRec {
                first: now,
                last: now,
                version: 0,
                stream: fence.stream.clone(),
                newest_bucket: m.newest_bucket,
                epoch: fence.epoch,
            });
            entry.newest_bucket = entry.newest_bucket.max(m.newest_bucket);
            entry.version += 1;
            entry.last = now;
            entry.stream = fence.stream.clone();
            entry.epoch = fence.epoch;
        })
        .await
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        self.single("dirty_list", false, |s| {
            let mut list: Vec<DirtyEntry> = s
                .dirty
                .iter()
                .filter(|(_, d)| stream.is_none_or(|st| d.stream == st))
                .map(|(p, d)| DirtyEntry {
                    post: p.clone(),
                    first_dirty_at: d.first,
                    last_dirty_at: d.last,
                    version: d.version,
                    newest_bucket: Some(d.newest_bucket),
                })
                .collect();
            match order {
                DirtyOrder::Oldest => list
                    .sort_by(|a, b| (a.first_dirty_at, &a.post).cmp(&(b.first_dirty_at, &b.post))),
                DirtyOrder::ByVersion => {
                    list.sort_by(|a, b| (-a.version, &a.post).cmp(&(-b.version, &b.post)))
                }
            }
            list.truncate(mongo_limit(limit));
            Ok(list)
        })
        .await
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        self.single("dirty_summary", false, |s| {
            Ok(DirtySummary {
                size: s.dirty.len() as u64,
                oldest: s.dirty.values().map(|d| d.first).min(),
            })
        })
        .await
    }

    async fn clear_dirty(&self, post: &PostId, version: i64) -> StoreResult<bool> {
        self.single("clear_dirty", true, |s| {
            if s.dirty.get(post).is_some_and(|d| d.version == version) {
                s.dirty.remove(post);
                Ok(true)
            } else {
                Ok(false)
            }
        })
        .await
    }

    async fn requeue_dirty(&self, post: &PostId, version: i64, now: DateTime) -> StoreResult<bool> {
        self.single("requeue_dirty", true, |s| match s.dirty.get_mut(post) {
            Some(d) if d.version == version => {
                d.first = now;
                Ok(true)
            }
            _ => Ok(false),
        })
        .await
    }
}

#[async_trait]
impl Truth for MemoryStore {
    async fn count_live_below(&self, post: &PostId, watermark: i64) -> StoreResult<i64> {
        self.single("count_live_below", false, |s| {
            let below = watermark.saturating_mul(1000);
            Ok(s.comments
                .values()
                .filter_map(row_facts)
                .filter(|(p, created, live)| {
                    p == post && *live && !created.is_some_and(|c| c.timestamp_millis() >= below)
                })
                .count() as i64)
        })
        .await
    }

    async fn count_live_below_at(
        &self,
        _post: &PostId,
        _watermark: i64,
        _at: Timestamp,
    ) -> StoreResult<Option<i64>> {
        // Like the fake server: no snapshot reads, so every recount takes the quiet window.
        Ok(None)
    }

    async fn latest_created(&self, post: &PostId) -> StoreResult<Option<i64>> {
        self.single("latest_created", false, |s| {
            Ok(s.comments
                .values()
                .filter_map(row_facts)
                .filter(|(p, _, _)| p == post)
                .filter_map(|(_, created, _)| created)
                .map(|t| t.timestamp_millis().div_euclid(1000))
                .max())
        })
        .await
    }

    async fn count_live(&self, post: &PostId) -> StoreResult<i64> {
        self.single("count_live", false, |s| {
            Ok(s.comments
                .values()
                .filter_map(row_facts)
                .filter(|(p, _, live)| p == post && *live)
                .count() as i64)
        })
        .await
    }

    async fn rows_of_post(&self, post: &PostId) -> StoreResult<Vec<(CommentId, Row)>> {
        self.single("rows_of_post", false, |s| {
            Ok(s.comments
                .iter()
                .filter_map(|(id, row)| {
                    let (p, created_at, live) = row_facts(row)?;
                    (p == *post).then(|| {
                        let row = Row {
                            post: Some(p),
                            created_at,
                            deleted: !live,
                        };
                        (CommentId::new(Bson::Int64(*id)), row)
                    })
                })
                .collect())
        })
        .await
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        self.single("comments_extent", false, |s| {
            Ok(CommentsExtent {
                last_id: s
                    .comments
                    .keys()
                    .next_back()
                    .map(|id| CommentId::new(Bson::Int64(*id))),
                estimated_rows: s.comments.len() as u64,
            })
        })
        .await
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        let int = |c: &CommentId| c.value.as_i64().expect("the simulation's ids are longs");
        let (after, last) = (after.map(int), int(last));
        self.single("rows_after", false, |s| {
            let from = after.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
            Ok(s.comments
                .range((from, std::ops::Bound::Included(last)))
                .take(limit)
                .map(|(id, row)| {
                    // The row as it is, counted or not (`read_existing_row`).
                    let row = Row {
                        post: row.get(POST_FIELD).and_then(PostId::from_bson),
                        created_at: match row.get(CREATED_FIELD) {
                            Some(Bson::DateTime(d)) => Some(*d),
                            _ => None,
                        },
                        deleted: !matches!(row.get(DELETED_FIELD), None | Some(Bson::Null)),
                    };
                    (CommentId::new(Bson::Int64(*id)), row)
                })
                .collect())
        })
        .await
    }
}

#[async_trait]
impl Leases for MemoryStore {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        self.single("read_lease", false, |s| {
            Ok(s.leases.get(stream).map(|l| Lease {
                stream: stream.to_string(),
                owner: l.owner.clone(),
                expires_at: l.expires_at,
                epoch: l.epoch,
            }))
        })
        .await
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        self.single("acquire_lease", true, |s| {
            let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
            match s.leases.get_mut(stream) {
                Some(l) if l.expires_at < now || l.owner == owner => {
                    l.owner = owner.to_string();
                    l.expires_at = expires;
                    l.epoch += 1;
                    Ok(Some(l.epoch))
                }
                Some(_) => Ok(None), // the upsert's insert: duplicate key
                None => {
                    s.leases.insert(
                        stream.to_string(),
                        LeaseRec {
                            owner: owner.to_string(),
                            expires_at: expires,
                            epoch: 1,
                        },
                    );
                    Ok(Some(1))
                }
            }
        })
        .await
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.single("renew_lease", true, |s| match s.leases.get_mut(stream) {
            Some(l) if l.owner == owner && l.epoch == epoch => {
                l.expires_at =
                    DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
                Ok(true)
            }
            _ => Ok(false),
        })
        .await
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        self.single("seize_lease", true, |s| {
            let expires_at = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
            let lease = s.leases.entry(stream.to_string()).or_insert(LeaseRec {
                owner: String::new(),
                expires_at,
                epoch: 0,
            });
            lease.owner = owner.to_string();
            lease.expires_at = expires_at;
            lease.epoch += 1;
            Ok(lease.epoch)
        })
        .await
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.single("release_lease", true, |s| {
            if let Some(l) = s.leases.get_mut(stream) {
                if l.owner == owner && l.epoch == epoch {
                    l.expires_at = DateTime::from_millis(0);
                }
            }
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl RunHistory for MemoryStore {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        self.single("record_run", true, |s| {
            s.runs.push(run.clone());
            Ok(())
        })
        .await
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        self.single("last_run", false, |s| {
            Ok(s.runs.iter().rev().max_by_key(|r| r.finished_at).cloned())
        })
        .await
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        self.single("load_sweep_cursor", false, |s| {
            Ok(s.sweeps.get(stream).cloned())
        })
        .await
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        self.single("save_sweep_cursor", true, |s| {
            s.sweeps.insert(stream.to_string(), cursor.clone());
            Ok(())
        })
        .await
    }
}
