//! The counters: guarded increments and conditional fold installs ([`Counters`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use bson::{DateTime, Timestamp};

use super::error::StoreResult;
use super::leases::Fence;
use crate::core::batch::{CounterDelta, CounterWrite};
use crate::core::event::Token;
use crate::core::fold::{CounterState, Fold};
use crate::core::key::GroupValue;
use crate::core::num::Num;
use crate::core::time::BucketStart;

/// The per-post counter documents: guarded increments and the reconciler's conditional
/// installs.
#[async_trait]
pub trait Counters: Send + Sync {
    /// (a) Counter writes, each guarded by `applied_through < w.through`. Each statement adds
    /// the increments, sets `applied_through` (and its cluster time), records each touched
    /// bucket's batch and appends the write's log entries (the newest
    /// [`crate::core::window::LOG_ENTRIES`] are kept).
    async fn write_counters(
        &self,
        fence: &Fence,
        writes: &[CounterWrite],
    ) -> StoreResult<ApplyOutcome>;

    /// (a) for one batch ending at `through`: its increments, each guarded by
    /// `applied_through < through`.
    async fn apply_counters(
        &self,
        fence: &Fence,
        writes: &[CounterDelta],
        through: &Token,
        through_time: Option<Timestamp>,
    ) -> StoreResult<ApplyOutcome> {
        let writes: Vec<CounterWrite> = writes
            .iter()
            .map(|d| CounterWrite::of_batch(d, through, through_time))
            .collect();
        self.write_counters(fence, &writes).await
    }

    async fn read_counter(&self, post: &GroupValue) -> StoreResult<Option<CounterDoc>>;

    /// Installs a fold if `applied_through` is still `expected` (`None`: the counter must not
    /// exist yet). Returns false when the condition failed (re-read and retry).
    async fn install_fold(
        &self,
        post: &GroupValue,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool>;

    /// Posts greater than `after`, in order, from `comments` and from the counters: the unit
    /// of the windowed full sweep.
    async fn posts_after(
        &self,
        after: Option<&GroupValue>,
        limit: usize,
    ) -> StoreResult<Vec<GroupValue>>;

    /// Posts chosen at random (for `verify`): up to `n` that have counters and up to `n` that
    /// have comments, so a post with rows but no counter is sampled too.
    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<GroupValue>>;

    /// Adds a chunk's increments, each guarded by the counter's `snapshot_chunk < chunk`.
    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome>;
}

/// A counter document as readers and the reconciler see it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CounterDoc {
    pub post: Option<GroupValue>,
    pub state: CounterState,
    /// `_data` of the newest event folded in; `None` when no worker has written it yet.
    pub applied_through: Option<String>,
    /// Cluster time of the event at `applied_through` (servers that send one): the counter
    /// reflects exactly the events up to the later of this and its stream's checkpoint, which
    /// is where a snapshot recount reads.
    pub applied_time: Option<Timestamp>,
    /// Creation bucket → the batch end token that last changed a row of that bucket for this
    /// post (net-zero changes included). A recount whose bucket range was touched after the
    /// counter was first read may have seen an event in flight: it is not installed.
    pub touched: BTreeMap<BucketStart, String>,
    /// The rows each of the last batches changed for this post, oldest first (at most
    /// [`crate::core::window::LOG_ENTRIES`]): a row-level recount takes the stream's version of
    /// exactly these rows (see [`crate::core::window`]).
    pub recent: Vec<crate::core::window::Touch>,
    /// Folds installed so far: a recount made against one fold is void after another.
    pub folds: i64,
    /// The positions of partitions `n > 0` in a counter several partitions write (partition
    /// 0's are the fields above; see [`Writer`]).
    pub writers: BTreeMap<u32, WriterPosition>,
    /// Writes of every partition to a counter several partitions write (see [`Writer`]).
    pub shared_writes: i64,
    /// The readers' field, `base_count + live_delta`, maintained in the same single-document
    /// writes (`None`: a counter written before it existed, until `run` fills it in).
    pub count: Option<Num>,
    pub last_drift: Option<Num>,
    pub reconciled_at: Option<DateTime>,
}

impl CounterDoc {
    /// What readers see: the maintained `count`, or `base_count + live_delta` for a counter
    /// written before `count` existed.
    pub fn shown(&self) -> Num {
        self.count.unwrap_or_else(|| self.state.displayed())
    }
}

/// What a counter apply did: statements applied, and those the guard rejected as already
/// applied (a replay).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub applied: u64,
    pub already_applied: u64,
}

impl ApplyOutcome {
    /// The outcome of statements that each applied (`true`) or were already applied.
    pub fn count(statements: impl IntoIterator<Item = bool>) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        for applied in statements {
            outcome.applied += u64::from(applied);
            outcome.already_applied += u64::from(!applied);
        }
        outcome
    }
}

/// Where one writer keeps its guard in a counter document.
///
/// A counter of a definition grouped by the post is written by one stream only (the post's
/// partition): its guard is the document's own `applied_through` (with `applied_time`,
/// `touched`, `epoch`, `snapshot_chunk`). A counter grouped by another field (per author,
/// while partitions divide by post) is written by several partitions, whose stream positions
/// are not comparable with each other's as "already applied": each writes under its own
/// *slot*, partition 0 in the document's own fields (so documents written before partitions
/// read unchanged), partition `n > 0` under `writers.p<n>.`. Such writes also count
/// themselves in `shared_writes`, which the reconciler's install pins (one field for every
/// writer, known or not), and keep no `recent` log (their recounts are counts alone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Writer {
    /// The counter has several writers (see above).
    pub shared: bool,
    /// The writer's partition index (0 for the document's own fields).
    pub slot: u32,
}

impl Writer {
    /// The path (after a counter's own prefix) under which this writer keeps its guard
    /// fields: empty for slot 0, `writers.p<n>.` else.
    pub fn path(&self) -> String {
        match self.slot {
            0 => String::new(),
            n => format!("{WRITERS_FIELD}.p{n}."),
        }
    }
}

/// The field of a counter document that holds the guards of partitions `n > 0` (see
/// [`Writer`]).
pub const WRITERS_FIELD: &str = "writers";

/// The field of a counter document that counts the writes of every partition to a shared
/// counter (see [`Writer`]).
pub const SHARED_WRITES_FIELD: &str = "shared_writes";

/// A writer's position in a shared counter (partition `n > 0`, see [`Writer`]).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct WriterPosition {
    pub applied_through: Option<String>,
    pub applied_time: Option<Timestamp>,
    pub touched: BTreeMap<BucketStart, String>,
}
