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

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use bson::{DateTime, Document, Timestamp};
use serde::{Deserialize, Serialize};

use crate::batch::{BucketStart, CounterDelta, DirtyMark, LedgerUpdate};
use crate::deployment::Deployment;
use crate::event::{CommentId, PostId, Row, Token};
use crate::fold::{CounterState, Fold};

/// Why a store operation failed, sorted by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Worth retrying: network trouble, no primary, an interrupted operation.
    #[error("transient database error during {op}: {message}")]
    Transient { op: &'static str, message: String },
    /// The resume token fell off the oplog (codes 286, 280, 260).
    #[error("change stream history lost (code {code}) while resuming after token {token}: the checkpoint is older than the oplog window")]
    HistoryLost { code: i32, token: String },
    /// The checkpoint cannot be resumed here although the server did not refuse it: it belongs
    /// to another deployment (a restored backup), or the stream answered with an event older
    /// than the checkpoint. Handled like [`StoreError::HistoryLost`].
    #[error("change stream history lost while resuming from {position}: {reason}")]
    HistoryMismatch { position: String, reason: String },
    /// Another worker holds a newer fencing epoch for this stream: step down.
    #[error(
        "fenced out of stream `{stream}`: another worker took over with a newer epoch than {epoch}"
    )]
    Fenced { stream: String, epoch: i64 },
    /// A stored document is not what counterd wrote (hand-edited or corrupted).
    #[error("malformed {what} document {id}: {detail}")]
    Malformed {
        what: &'static str,
        id: String,
        detail: String,
    },
    /// Anything else: stop with this message; the checkpoint has not moved.
    #[error("database error during {op}: {message}")]
    Fatal { op: &'static str, message: String },
    /// The driver failed: worth retrying when `transient` (as [`StoreError::Transient`]),
    /// otherwise as [`StoreError::Fatal`]. `detail` is a short, credential-free description
    /// for logs and messages; the driver's own error is kept whole as the source (its code,
    /// labels and chain).
    #[error("{}database error during {op}: {detail}", if *.transient { "transient " } else { "" })]
    Driver {
        op: &'static str,
        transient: bool,
        detail: String,
        #[source]
        source: Box<mongodb::error::Error>,
    },
}

impl StoreError {
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Transient { .. }
                | StoreError::Driver {
                    transient: true,
                    ..
                }
        )
    }

    /// The checkpoint's history is gone: the server refused it, or counterd found it belongs
    /// to another history. Both follow `on_history_lost`.
    pub fn is_history_lost(&self) -> bool {
        matches!(
            self,
            StoreError::HistoryLost { .. } | StoreError::HistoryMismatch { .. }
        )
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The right to write for one stream: every worker write carries this epoch in its filter, so a
/// worker that lost its lease cannot write even once after a successor took over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub stream: String,
    pub epoch: i64,
}

/// A recorded gap in the stream (history lost), for `status` and the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gap {
    /// The checkpoint's event time when history was found lost.
    pub from: Option<DateTime>,
    /// When the worker restarted from "now".
    pub to: DateTime,
}

/// Where a stream stands.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Checkpoint {
    pub stream: String,
    /// Resume after this token. `None`: never checkpointed (start from now or a configured time).
    pub token: Option<Token>,
    /// Cluster time of the event at `token`.
    pub token_time: Option<Timestamp>,
    /// Without a token: start the stream at this cluster time (set by `replay --from-time`).
    pub start_time: Option<Timestamp>,
    /// The last time the worker found the stream drained: every event before it is applied,
    /// even when no event (and so no `token_time`) came for a while. Lets the watermark advance
    /// on a quiet stream.
    pub caught_up_at: Option<Timestamp>,
    /// The newest token any batch was applied or intended through. Events at or below it have
    /// been applied: re-reading them (an operator replay) only marks their posts dirty.
    pub high_water: Option<Token>,
    /// A batch whose intent was recorded but whose writes may not all have landed: re-applied,
    /// exactly as planned, before the stream is read again.
    pub pending: Option<PendingBatch>,
    /// Fencing epoch of the worker that owns the stream.
    pub epoch: i64,
    /// The deployment the position belongs to (`None`: not recorded yet); resuming on another
    /// one is lost history (see [`crate::deployment`]).
    pub deployment: Option<Deployment>,
    pub updated_at: Option<DateTime>,
    /// Gaps recorded after history loss.
    pub gaps: Vec<Gap>,
    /// A full sweep was requested (history lost, unattributable events) and not yet finished.
    pub sweep_requested: bool,
    /// The initial snapshot of the rows that existed before the stream's start (`None`: none
    /// was taken; the stream counts only what it sees change).
    pub snapshot: Option<SnapshotProgress>,
}

impl Checkpoint {
    /// The stream's ledger generation: the number of history gaps it has recorded. Ledger
    /// entries of an older generation describe rows as they were before events were lost (a
    /// row moved in the gap still shows its old post), so they are not used as before-states.
    pub fn ledger_generation(&self) -> u64 {
        self.gaps.len() as u64
    }

    /// The ledger holds every row the counters count: the initial snapshot has claimed (or is
    /// claiming, chunk by chunk) the rows that existed before the stream's start, and no
    /// history was lost since. A comment without an entry is then known not to count, and the
    /// ledger's state wins over a pre-image (see [`crate::classify::Before::Complete`]).
    pub fn ledger_complete(&self) -> bool {
        self.gaps.is_empty()
            && self
                .snapshot
                .as_ref()
                .is_some_and(|s| s.state != SnapshotState::Abandoned)
    }

    /// The initial snapshot is still claiming rows: folds would count rows the snapshot has yet
    /// to claim, so the reconciler leaves the stream's posts dirty until it is done.
    pub fn snapshot_running(&self) -> bool {
        self.gaps.is_empty()
            && self
                .snapshot
                .as_ref()
                .is_some_and(|s| s.state == SnapshotState::Running)
    }
}

/// Where the initial snapshot stands (stored in the checkpoint document).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SnapshotProgress {
    pub state: SnapshotState,
    pub started_at: DateTime,
    pub finished_at: Option<DateTime>,
    /// The largest `_id` in `comments` just after the stream's start was pinned: every row that
    /// existed before the start is at or below it (`None`: the collection was empty).
    #[serde(skip)]
    pub last_id: Option<CommentId>,
    /// The last `_id` of the last finished chunk (`None`: none finished yet).
    #[serde(skip)]
    pub cursor: Option<CommentId>,
    pub chunks_done: u64,
    pub rows_scanned: u64,
    /// Rows the snapshot added to counters (the others were already known from the stream, or
    /// do not count).
    pub rows_counted: u64,
    /// `comments`' estimated size when the snapshot began.
    pub estimated_rows: u64,
    /// A chunk whose intent was recorded but whose writes may not all have landed: finished,
    /// exactly as planned, before anything else.
    #[serde(skip)]
    pub pending: Option<SnapshotChunk>,
    /// Chunks finished after a restart found them in flight (each was read once, and its
    /// writes issued at most twice).
    pub chunks_resumed: u64,
    /// The chunk being read (recorded before the read): a restart that finds it without a
    /// recorded plan reads it again.
    pub reading: Option<u64>,
    /// Chunks read a second time because a restart came between their read and their plan.
    pub chunks_reread: u64,
}

/// The snapshot's lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotState {
    Running,
    Done,
    /// History was lost while it ran: the sweep after the gap recounts every post and rebuilds
    /// the ledger instead.
    Abandoned,
}

impl SnapshotState {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotState::Running => "running",
            SnapshotState::Done => "done",
            SnapshotState::Abandoned => "abandoned",
        }
    }

    pub fn parse(text: &str) -> Option<SnapshotState> {
        match text {
            "running" => Some(SnapshotState::Running),
            "done" => Some(SnapshotState::Done),
            "abandoned" => Some(SnapshotState::Abandoned),
            _ => None,
        }
    }
}

/// One chunk of the snapshot, planned: the ledger claims (comments the ledger did not know,
/// with their state as read) and the counter increments they add.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SnapshotChunk {
    /// Chunk numbers start at 1 and guard the counter increments (`snapshot_chunk < number`).
    pub number: u64,
    /// The chunk's last `_id`: the cursor once it is done.
    pub last: Option<CommentId>,
    pub rows: u64,
    pub claims: Vec<LedgerUpdate>,
    pub counters: Vec<CounterDelta>,
}

/// The extent of `comments` as the snapshot begins.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CommentsExtent {
    pub last_id: Option<CommentId>,
    pub estimated_rows: u64,
}

/// The writes of one batch, recorded as its intent before any of them is issued. Replaying the
/// stored plan (not re-reading and re-classifying the events) makes recovery exact even though
/// `updateLookup` would now show later row states.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PendingBatch {
    /// The batch's last event: the guard token of every write and the next checkpoint.
    pub end: Token,
    pub end_time: Option<Timestamp>,
    pub counters: Vec<CounterDelta>,
    pub ledger: Vec<LedgerUpdate>,
    pub dirty: Vec<DirtyMark>,
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
    /// Folds installed so far: a recount made against one fold is void after another.
    pub folds: i64,
    /// The readers' field, `base_count + live_delta`, maintained in the same single-document
    /// writes (`None`: a counter written before it existed, until `run` fills it in).
    pub count: Option<i64>,
    pub last_drift: Option<i64>,
    pub reconciled_at: Option<DateTime>,
}

impl CounterDoc {
    /// What readers see: the maintained `count`, or `base_count + live_delta` for a counter
    /// written before `count` existed.
    pub fn shown(&self) -> i64 {
        self.count.unwrap_or_else(|| self.state.displayed())
    }
}

/// One post waiting for a recount.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirtyEntry {
    #[serde(serialize_with = "serialize_display")]
    pub post: PostId,
    pub first_dirty_at: DateTime,
    pub last_dirty_at: DateTime,
    /// Bumped on every mark; the reconciler clears the entry only if it did not move.
    pub version: i64,
    /// The newest creation bucket any marking event changed (`None`: an entry written before
    /// this was recorded; treated as covered by any fold). The entry is cleared only by a fold
    /// whose watermark is above it.
    pub newest_bucket: Option<BucketStart>,
}

fn serialize_display<S: serde::Serializer, T: std::fmt::Display>(
    value: &T,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

/// Size and age of the dirty backlog.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct DirtySummary {
    pub size: u64,
    pub oldest: Option<DateTime>,
}

/// Order of a dirty listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyOrder {
    Oldest,
    ByVersion,
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

/// A summary of one reconcile run, stored for `status` (written and read with serde; a field
/// missing from a run stored by an older counterd takes its default).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSummary {
    pub started_at: Option<DateTime>,
    pub finished_at: Option<DateTime>,
    pub kind: String,
    pub posts: u64,
    pub counts: u64,
    pub corrected: u64,
    pub total_abs_drift: i64,
    pub max_abs_drift: i64,
    /// Sum of the drift of the posts that ran high (positive).
    pub drift_high: i64,
    /// Sum of the drift of the posts that ran low (negative).
    pub drift_low: i64,
    /// Posts corrected that ran high, and that ran low.
    pub corrected_high: u64,
    pub corrected_low: u64,
    pub watermark: i64,
    /// Posts left dirty because a change to their settled rows was in flight while they were
    /// counted (or the worker did not catch up in time): retried next run.
    pub in_flight: u64,
    /// Posts folded but left dirty: a change that dirtied them is above the watermark.
    pub waiting: u64,
    /// Recounts read at a cluster time (snapshot reads) rather than by the quiet window.
    pub snapshot_counts: u64,
    /// Posts not counted because the initial snapshot was still running (they stay dirty).
    pub waiting_for_snapshot: u64,
}

/// Where the server stands, as two cluster times: `upper` is after every write acknowledged
/// before the reading (a count taken before it can have seen nothing later), and every write
/// before `lower` was acknowledged before the reading (a change stream read issued after it
/// and found empty has delivered all of them). With the server's `operationTime` both are
/// exact; from a clock they are a second apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerNow {
    pub lower: Timestamp,
    pub upper: Timestamp,
}

/// The background sweep's place in its pass over all posts, kept across restarts.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct SweepCursor {
    /// The last post finished (`None`: the pass starts from the first post).
    #[serde(serialize_with = "serialize_opt_display")]
    pub after: Option<PostId>,
    /// When the current pass began.
    pub pass_started: Option<DateTime>,
    /// Posts done in the current pass.
    pub posts_done: u64,
    /// Passes completed.
    pub passes: u64,
    /// Posts seen by the last complete pass (sizes the steps of the next).
    pub last_pass_posts: u64,
}

fn serialize_opt_display<S: serde::Serializer, T: std::fmt::Display>(
    value: &Option<T>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

/// Where an operator moves a stream's checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Position {
    /// Resume after this token.
    Token(Token),
    /// Start at this cluster time.
    Time(Timestamp),
    /// No position: the worker's configured start (`start_at`, else now).
    Unset,
}

/// Who holds a stream: one active worker per stream, the others on standby.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lease {
    pub stream: String,
    pub owner: String,
    pub expires_at: DateTime,
    /// Increases on every takeover; every worker write carries it in its filter.
    pub epoch: i64,
}

/// How to position a new change stream.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamStart {
    After(Token),
    AtTime(Timestamp),
    Now,
}

/// Options for opening the change stream.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    pub start: StreamStart,
    /// Ask for `fullDocumentBeforeChange` (servers with pre-images only).
    pub pre_images: bool,
    /// Extra `$match` stages (partitioning).
    pub pipeline: Vec<Document>,
    /// How long the server may hold an empty getMore.
    pub max_await: Duration,
}

/// Events read in one go, plus where the stream now stands.
#[derive(Clone, Debug, Default)]
pub struct RawBatch {
    pub events: Vec<Document>,
    /// The post-batch resume token, where the server sends one (checkpoint it on idle streams).
    pub post_batch_token: Option<Token>,
}

/// An open change stream.
#[async_trait]
pub trait EventSource: Send {
    /// Reads events that are ready, up to `max`, returning early when none are ready (an empty
    /// batch) or once `max_wait` has passed with some events in hand.
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch>;
}

/// What the server can do (detected once).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerAbilities {
    pub version: String,
    pub wire_version: i32,
    pub hello: bool,
    pub sessions: bool,
    pub pre_images: bool,
    pub update_description: bool,
    pub snapshot_reads: bool,
    pub post_batch_token: bool,
}

/// A post's displayed value (`base_count + live_delta`, 0 without a counter) beside its true
/// count of live rows: what `get`, `verify` and the demo compare.
pub async fn displayed_and_truth<S: Store + ?Sized>(
    store: &S,
    post: &PostId,
) -> StoreResult<(i64, i64)> {
    let displayed = store
        .read_counter(post)
        .await?
        .map(|c| c.shown())
        .unwrap_or(0);
    Ok((displayed, store.count_live(post).await?))
}

/// Everything the worker writes and the reconciler reads and folds: every concern's trait at
/// once. Implemented for any type that implements them all, so `S: Store` bounds need nothing
/// more; callers holding a concrete store import [`prelude`] to call the methods.
pub trait Store:
    ChangeStreams + Checkpoints + Counters + Ledger + DirtySet + Truth + Leases + RunHistory
{
}

impl<T> Store for T where
    T: ChangeStreams + Checkpoints + Counters + Ledger + DirtySet + Truth + Leases + RunHistory
{
}

/// The store's traits, for callers that hold a concrete store (not an `S: Store` bound).
pub mod prelude {
    pub use super::{
        ChangeStreams, Checkpoints, Counters, DirtySet, Leases, Ledger, RunHistory, Store, Truth,
    };
}

/// The change stream and where the server stands.
#[async_trait]
pub trait ChangeStreams: Send + Sync {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>>;

    /// Where the server stands now, in cluster time (see [`ServerNow`]).
    async fn read_position(&self) -> StoreResult<ServerNow>;
}

/// Where each stream stands: resume position, pending batch, gaps, deployment, fencing epoch
/// and snapshot progress.
#[async_trait]
pub trait Checkpoints: Send + Sync {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>>;

    /// Records a batch's intent: raises `high_water` to its end and stores its plan as pending.
    async fn record_intent(&self, fence: &Fence, batch: &PendingBatch) -> StoreResult<()>;

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
    /// (a) Counter increments, each guarded by `applied_through < through`.
    /// Each statement also records `through` (and its cluster time) under every bucket the
    /// write touched.
    async fn apply_counters(
        &self,
        fence: &Fence,
        writes: &[CounterDelta],
        through: &Token,
        through_time: Option<Timestamp>,
    ) -> StoreResult<ApplyOutcome>;

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

    /// A fold covered the entry's settled changes but not its newest ones (above the
    /// watermark): if its version is still `version`, restart its age at `now`, so the backlog's
    /// oldest age measures the reconciler, not a post that keeps getting new comments.
    async fn requeue_dirty(&self, post: &PostId, version: i64, now: DateTime) -> StoreResult<bool>;
}

/// Reads of the application's own `comments` collection: the truth the counters are checked
/// against.
#[async_trait]
pub trait Truth: Send + Sync {
    /// Live rows of `post` whose `created_at` is not `>= watermark` (seconds).
    async fn count_live_below(&self, post: &PostId, watermark: i64) -> StoreResult<i64>;

    /// The same count as of cluster time `at` (a snapshot read), on servers whose snapshot
    /// reads were detected for real. `None`: no snapshot reads here, or `at` is older than the
    /// server's snapshot window; the caller falls back to the quiet-window check.
    async fn count_live_below_at(
        &self,
        post: &PostId,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<i64>>;

    /// Seconds of the latest `created_at` among all rows of `post`, live or not (`None`: no
    /// dated row). Used by the sweep after lost history to fold above every known row.
    async fn latest_created(&self, post: &PostId) -> StoreResult<Option<i64>>;

    /// All live rows of `post` (for `get` and `verify`).
    async fn count_live(&self, post: &PostId) -> StoreResult<i64>;

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
