//! The seam between counterd's logic and its database: counters, the comment ledger, the dirty
//! set, checkpoints, leases, counts of the truth, and the change stream itself.
//!
//! One trait per concern, so each can be read (and implemented) on its own:
//! - [`ChangeStreams`]: open the change stream, read the server's cluster time;
//! - [`Checkpoints`]: each stream's position, pending batch, gaps, epoch and snapshot progress;
//! - [`Counters`]: the per-post counters (guarded increments, conditional fold installs);
//! - [`Ledger`]: the last known state of each comment;
//! - [`DirtySet`]: posts waiting for a recount;
//! - [`Truth`]: counts and reads of the application's `comments` collection;
//! - [`Leases`]: who may write for a stream;
//! - [`RunHistory`]: reconcile runs and the sweep cursor.
//!
//! [`Store`] is all of them at once. `worker` and `reconcile` speak only to these traits.
//! [`mongo`] is the one implementation that knows MongoDB's command shapes; `memory` (with the
//! `test-utils` feature) is its in-process twin, for the deterministic simulation and the
//! store contract that runs the same cases against both. `counting` (feature `test-utils`)
//! wraps any store to count its calls and write statements, for the benchmark and the tests.

#[cfg(feature = "test-utils")]
pub mod counting;
#[cfg(feature = "test-utils")]
pub mod memory;
pub mod mongo;

mod error;
mod records;

pub use error::{StoreError, StoreResult};
pub use records::*;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::{DateTime, Document, Timestamp};

use crate::batch::{CounterDelta, CounterWrite, DirtyMark, LedgerUpdate};
use crate::definition::CounterIx;
use crate::deployment::Deployment;
use crate::event::{CommentId, PostId, Row, Token};
use crate::fold::Fold;
use crate::num::Num;
use crate::recount::LedgerAt;

/// A write or read for a counter definition the store does not know (its place is beyond the
/// schema's definitions): refused rather than written into another definition's collection,
/// where it would land under the same key and corrupt that counter.
pub fn unknown_counter(op: &'static str, counter: CounterIx) -> StoreError {
    StoreError::Fatal {
        op,
        message: format!(
            "counter definition #{} is not one of this store's definitions",
            counter.0
        ),
    }
}

/// One store, seen per counter definition. Every definition keeps its own counters collection
/// ([`crate::definition::Definition::collection`]) and its own dirty set, and counts its own
/// rows (its group field and condition): a *view* is the store as one definition sees it, so
/// the reconciler, `get`, `verify` and `dirty` run unchanged over any definition. The worker's
/// batch writes ([`Counters::apply_counters`], [`Counters::apply_snapshot_counters`],
/// [`DirtySet::mark_dirty`]) are routed per item by its `counter` whatever the view, since one
/// batch carries every definition's deltas; every other counter, dirty-set and truth call
/// reads the view's definition. Views share everything else (connection, tables, leases,
/// checkpoints, the ledger).
pub trait CounterViews {
    /// This store as definition `counter` sees it (a cheap handle on the same store).
    fn for_counter(&self, counter: CounterIx) -> Self
    where
        Self: Sized;

    /// The definition this handle serves ([`CounterIx::DEFAULT`] unless made by
    /// [`CounterViews::for_counter`]).
    fn viewed_counter(&self) -> CounterIx;

    /// Whether the viewed definition groups rows by another field than the post, the field
    /// partitions divide by: under partitions its counters have several writers, each with
    /// its own guard ([`Writer`]), and its recounts wait for every partition.
    fn viewed_shared(&self) -> bool;
}

/// [`Truth::live_ids_below_each`] as one read per post, the room left shrinking with each
/// (`None` once the ids together are more than `at_most`): the default, and a store's fallback
/// where one read cannot serve the group.
pub async fn live_ids_below_one_by_one<T: Truth + ?Sized>(
    store: &T,
    wanted: &[(PostId, i64)],
    at_most: usize,
) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
    let mut reads = Vec::with_capacity(wanted.len());
    let mut room = at_most;
    for (post, watermark) in wanted {
        let Some(read) = store.live_ids_below(post, *watermark, room).await? else {
            return Ok(None);
        };
        room -= read.len();
        reads.push(read);
    }
    Ok(Some(reads))
}

/// Everything the worker writes and the reconciler reads and folds: every concern's trait at
/// once. Implemented for any type that implements them all, so `S: Store` bounds need nothing
/// more; callers holding a concrete store import [`prelude`] to call the methods.
pub trait Store:
    ChangeStreams
    + Checkpoints
    + Counters
    + Ledger
    + DirtySet
    + Truth
    + Leases
    + RunHistory
    + CounterViews
{
}

impl<T> Store for T where
    T: ChangeStreams
        + Checkpoints
        + Counters
        + Ledger
        + DirtySet
        + Truth
        + Leases
        + RunHistory
        + CounterViews
{
}

/// The store's traits, for callers that hold a concrete store (not an `S: Store` bound).
pub mod prelude {
    pub use super::{
        ChangeStreams, Checkpoints, CounterViews, Counters, DirtySet, Leases, Ledger, RunHistory,
        Store, Truth,
    };
}

/// The change stream and where the server stands.
#[async_trait]
pub trait ChangeStreams: Send + Sync {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>>;

    /// Where the server stands now, in cluster time (see [`ServerNow`]).
    async fn read_position(&self) -> StoreResult<ServerNow>;

    /// The rows of `comments` as they are now, read with the schema's row projection, by
    /// comment key (a comment that is gone is absent): what `updateLookup` would have sent with
    /// their update events, read in one batched read (see [`crate::lookup`]).
    async fn look_up(&self, comments: &[CommentId]) -> StoreResult<HashMap<String, Document>>;
}

/// Where each stream stands: resume position, pending batch, gaps, deployment, fencing epoch
/// and snapshot progress.
#[async_trait]
pub trait Checkpoints: Send + Sync {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>>;

    /// Records a batch's intent: raises `high_water` to its end and stores its plan as pending.
    /// `carried`: the batch's own counters and dirty marks when it may be carried (not written
    /// with it; see [`crate::carry`]), then not in `batch`: stored first, under the carry's id
    /// (`batch.carry`), where [`Checkpoints::load_carried`] finds them.
    async fn record_intent(
        &self,
        fence: &Fence,
        batch: &PendingBatch,
        carried: Option<&PendingBatch>,
    ) -> StoreResult<()>;

    /// The batches of the carry `carry` (the pending batch's [`PendingBatch::carry`]) that a
    /// stopped worker stored (see [`Checkpoints::record_intent`]) and that end after `after`
    /// (`None`: from the first) and at or before `through` (the pending batch, whose own
    /// counters may be among them; a batch stored after it never got its intent and is read
    /// again from the stream), oldest first, at most `limit` of them: a carry is read a few
    /// batches at a time, so that recovery holds it merged, as it was held while carried.
    async fn load_carried(
        &self,
        stream: &str,
        carry: &Token,
        after: Option<&Token>,
        through: &Token,
        limit: usize,
    ) -> StoreResult<Vec<PendingBatch>>;

    /// Deletes the batches stored for the carry `carry`, once its counters and dirty marks are
    /// written and before the checkpoint moves past them (a restart in between re-applies
    /// what is left, which the guards reject). Fenced: a copy stored by a newer epoch stays.
    async fn clear_carried(&self, fence: &Fence, carry: &Token) -> StoreResult<()>;

    /// Advances the resume position (and clears any pending batch) after every write of a batch
    /// was acknowledged.
    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()>;

    /// Operator moves: set the resume position (the high water is kept, so events already
    /// applied are only re-marked dirty).
    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()>;

    /// Pins where a stream without a position starts (its first open), so a successor that takes
    /// over before the first checkpoint resumes there instead of at its own, later "now".
    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()>;

    /// Records that the stream was drained at `at`: every event with a cluster time before
    /// `at` is applied. `at` is the `lower` bound of a [`ChangeStreams::read_position`] taken before
    /// the read that came back empty.
    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()>;

    /// Records a history-lost gap, requests a full sweep, and sets the stream to start again
    /// exactly where the gap ends.
    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()>;

    /// What identifies the deployment this store talks to now (unknown parts left out).
    async fn deployment(&self) -> StoreResult<Deployment>;

    /// Records that the stream's position belongs to `deployment`.
    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()>;

    /// Sets or clears the "full sweep requested" flag.
    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()>;

    /// Stamps the checkpoint with a newer epoch at takeover; fails `Fenced` if a newer one is
    /// already there.
    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()>;

    /// Stores the snapshot's progress in the stream's checkpoint (fenced; creates the checkpoint
    /// if there is none).
    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()>;
}

/// The per-post counter documents: guarded increments and the reconciler's conditional
/// installs.
#[async_trait]
pub trait Counters: Send + Sync {
    /// (a) Counter writes, each guarded by `applied_through < w.through`. Each statement adds
    /// the increments, sets `applied_through` (and its cluster time), records each touched
    /// bucket's batch and appends the write's log entries (the newest
    /// [`crate::recount::LOG_ENTRIES`] are kept).
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

/// The comment ledger: the last known state of each comment, per stream.
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Reads the ledger entries (of `stream`: each partition keeps its own) of these comments:
    /// key → state (`None`: gone; a row without a post exists but does not count). Absent:
    /// unknown. `generation` is the number of history gaps the stream has recorded: an entry
    /// written under an older generation describes the row as it was before events were lost,
    /// so it is left out (unknown) until the worker or the sweep after the gap rewrites it.
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, Option<Row>>>;

    /// [`Ledger::read_ledger`] with the token of the batch that wrote each entry (`None`:
    /// written by the snapshot or a rebuild): a row-level recount needs the entry as of the
    /// counter's position, not a later one (see [`crate::recount::window`]).
    async fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, LedgerAt>>;

    /// (b) Ledger states, each guarded per comment by `applied_through < through`, stamped
    /// with the stream's `generation` (see [`Ledger::read_ledger`]).
    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()>;

    /// Writes ledger entries (of `stream`) rebuilt from rows read once every event before the
    /// read was applied: each only where the comment has no entry or one older than
    /// `generation`. An entry the worker wrote since the gap (it applied an event of the row)
    /// is never replaced, and the worker's later writes always replace a rebuilt one.
    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()>;

    /// Writes each claim only where the ledger has no entry for its comment yet: a state the
    /// stream wrote is newer than anything the snapshot read.
    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()>;
}

/// Posts waiting for a recount.
#[async_trait]
pub trait DirtySet: Send + Sync {
    /// (c) Dirty marks: upsert with `version + 1`, raising `newest_bucket`.
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()>;

    /// The dirty entries marked by `stream` (all streams: `None`).
    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>>;

    async fn dirty_summary(&self) -> StoreResult<DirtySummary>;

    /// Deletes the dirty entry only if its version is still `version`.
    async fn clear_dirty(&self, post: &PostId, version: i64) -> StoreResult<bool>;

    /// A fold covered the entry's changes up to its watermark, but the entry stays: changes
    /// above the watermark, or marked since it was listed. Restarts its age at `now` (never
    /// moving it back), whatever its version, so the backlog's oldest age and the
    /// dirty-to-fold time measure the reconciler, not a post that keeps getting new comments
    /// (a worker's mark never changes the age of an existing entry). False: no entry.
    async fn requeue_dirty(&self, post: &PostId, now: DateTime) -> StoreResult<bool>;
}

/// Reads of the application's own `comments` collection: the truth the counters are checked
/// against.
#[async_trait]
pub trait Truth: Send + Sync {
    /// Live rows of `post` whose `created_at` is not `>= watermark` (seconds): their number,
    /// or for a sum definition their field's `$sum`.
    async fn count_live_below(&self, post: &PostId, watermark: i64) -> StoreResult<Num>;

    /// The ids of the rows [`Truth::count_live_below`] counts (the same filter): a row-level
    /// recount settles the ones that changed while it read (see [`crate::recount::window`]).
    /// `None` when there are more than `at_most` (the recount's share of the memory budget):
    /// the read stops there rather than hold ids in proportion to a post's rows. Always `None`
    /// for a sum definition: its recount is the server's `$sum` alone (settled as a snapshot
    /// count is: it holds while nothing below the watermark changed meanwhile).
    async fn live_ids_below(
        &self,
        post: &PostId,
        watermark: i64,
        at_most: usize,
    ) -> StoreResult<Option<Vec<CommentId>>>;

    /// [`Truth::live_ids_below`] for several posts, each with its own watermark, in one read
    /// where the store can: the ids of each post's rows, in the order asked, or `None` when
    /// they are more than `at_most` together. (Here: one read per post.)
    async fn live_ids_below_each(
        &self,
        wanted: &[(PostId, i64)],
        at_most: usize,
    ) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
        live_ids_below_one_by_one(self, wanted, at_most).await
    }

    /// The same count as of cluster time `at` (a snapshot read), on servers whose snapshot
    /// reads were detected for real. `None`: no snapshot reads here, or `at` is older than the
    /// server's snapshot window; the caller falls back to the row-level recount.
    async fn count_live_below_at(
        &self,
        post: &PostId,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<Num>>;

    /// Seconds of the latest `created_at` among all rows of `post`, live or not (`None`: no
    /// dated row). Used by the sweep after lost history to fold above every known row.
    async fn latest_created(&self, post: &PostId) -> StoreResult<Option<i64>>;

    /// All live rows of `post` (for `get` and `verify`): their number, or a sum's `$sum`.
    async fn count_live(&self, post: &PostId) -> StoreResult<Num>;

    /// Every row of `post` as it is now, live or not, with its comment id: the sweep after
    /// lost history rebuilds their ledger entries.
    async fn rows_of_post(&self, post: &PostId) -> StoreResult<Vec<(CommentId, Row)>>;

    /// The largest `_id` of `comments` and its estimated size.
    async fn comments_extent(&self) -> StoreResult<CommentsExtent>;

    /// Up to `limit` rows with `_id` after `after` and at most `last`, in `_id` order (rows of
    /// another BSON type than `last`'s are outside the range: see `crate::snapshot`).
    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>>;
}

/// Who may write for a stream.
#[async_trait]
pub trait Leases: Send + Sync {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>>;

    /// Takes the lease if it is free, expired, or already ours; returns the new epoch (always
    /// higher than any before), or `None` when another owner holds it.
    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>>;

    /// Extends our lease; false when it is no longer ours (a successor took over).
    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool>;

    /// Takes the lease whoever holds it, unexpired or not (an operator's `replay --force`):
    /// returns the new epoch, higher than any before, so the holder is fenced out.
    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64>;

    /// Gives the lease up at once (graceful shutdown), so a standby need not wait for expiry.
    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()>;
}

/// Reconcile runs and the background sweep's place, kept for `status` and restarts.
#[async_trait]
pub trait RunHistory: Send + Sync {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()>;

    async fn last_run(&self) -> StoreResult<Option<RunSummary>>;

    /// Where the background sweep of `stream` stands: the last post it finished (`None`: at
    /// the start of a pass) and when its current pass began.
    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>>;

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()>;
}
