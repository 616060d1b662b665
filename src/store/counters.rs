//! The counters: guarded increments and conditional fold installs ([`Counters`]).

use std::collections::BTreeMap;

use async_trait::async_trait;
use bson::{DateTime, Timestamp};

use super::error::StoreResult;
use super::leases::Fence;
use crate::core::batch::{CounterDelta, CounterWrite};
use crate::core::event::Token;
use crate::core::fold::{CounterState, Fold};
use crate::core::key::PostId;
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

    async fn read_counter(&self, post: &PostId) -> StoreResult<Option<CounterDoc>>;

    /// Installs a fold if `applied_through` is still `expected` (`None`: the counter must not
    /// exist yet). Returns false when the condition failed (re-read and retry).
    async fn install_fold(
        &self,
        post: &PostId,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool>;

    /// Posts greater than `after`, in order, from `comments` and from the counters: the unit
    /// of the windowed full sweep.
    async fn posts_after(&self, after: Option<&PostId>, limit: usize) -> StoreResult<Vec<PostId>>;

    /// Posts chosen at random (for `verify`): up to `n` that have counters and up to `n` that
    /// have comments, so a post with rows but no counter is sampled too.
    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<PostId>>;

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
    pub post: Option<PostId>,
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
            if applied {
                outcome.applied += 1;
            } else {
                outcome.already_applied += 1;
            }
        }
        outcome
    }
}
