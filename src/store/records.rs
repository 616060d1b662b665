//! What the seam's traits read and write: checkpoints and their snapshot progress, counter
//! documents, dirty entries, leases, run summaries, stream options and positions.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::{DateTime, Document, Timestamp};
use serde::{Deserialize, Serialize};

use super::{Store, StoreResult};
use crate::batch::{BucketStart, CounterDelta, DirtyMark, LedgerUpdate};
pub use crate::budget::cost::ReadLimit;
use crate::deployment::Deployment;
use crate::event::{CommentId, PostId, Token};
use crate::fold::CounterState;
use crate::num::Num;

/// The right to write for one stream: every worker write carries this epoch in its filter, so a
/// worker that lost its lease cannot write even once after a successor took over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub stream: String,
    pub epoch: i64,
}

impl Fence {
    /// The partition this fence writes for, read from its stream's name (`None`: an
    /// unpartitioned stream).
    pub fn partition(&self) -> Option<crate::partition::Partition> {
        crate::partition::Partition::of_stream(&self.stream)
    }

    /// Where this fence's writes to a counter of a definition keep their guard: `shared` when
    /// the definition groups by another field than the partitions' (see [`Writer`]).
    pub fn writer(&self, shared: bool) -> Writer {
        match self.partition().filter(|_| shared) {
            Some(p) => Writer {
                shared: true,
                slot: p.index,
            },
            None => Writer::default(),
        }
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

    /// Nothing was ever applied, claimed or found missing on this stream: a worker that starts
    /// now takes the initial snapshot (unless `initial_snapshot = "never"`).
    pub fn untouched(&self) -> bool {
        self.token.is_none()
            && self.high_water.is_none()
            && self.snapshot.is_none()
            && self.gaps.is_empty()
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
    /// The carry the batch belongs to (see [`crate::carry`]): the end of its first batch, under
    /// which the carry's batches store their counters and marks, this one's too if it may be
    /// carried (its intent then holds neither). `None`: nothing is carried, nothing stored.
    pub carry: Option<Token>,
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
    /// [`crate::recount::LOG_ENTRIES`]): a row-level recount takes the stream's version of
    /// exactly these rows (see [`crate::recount::window`]).
    pub recent: Vec<crate::recount::Touch>,
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
    /// The counter definition the run reconciled (empty: the default, and every run stored
    /// before definitions existed).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub counter: String,
    pub started_at: Option<DateTime>,
    pub finished_at: Option<DateTime>,
    pub kind: String,
    pub posts: u64,
    pub counts: u64,
    pub corrected: u64,
    /// Drift in the definition's units: rows for a count, the field's units for a sum.
    pub total_abs_drift: Num,
    pub max_abs_drift: Num,
    /// Sum of the drift of the posts that ran high (positive).
    pub drift_high: Num,
    /// Sum of the drift of the posts that ran low (negative).
    pub drift_low: Num,
    /// Posts corrected that ran high, and that ran low.
    pub corrected_high: u64,
    pub corrected_low: u64,
    pub watermark: i64,
    /// Posts left dirty because a change to their settled rows was in flight while they were
    /// counted (or the worker did not catch up in time): retried next run.
    pub in_flight: u64,
    /// Posts folded but left dirty: a change that dirtied them is above the watermark.
    pub waiting: u64,
    /// Posts left for a later run without being counted: the worker was further behind the
    /// server than a count's wait for it covers, so a count would have seen changes it had
    /// not applied and could not have been folded (a catch-up after an outage).
    pub deferred: u64,
    /// Recounts read at a cluster time (snapshot reads) rather than at row level.
    pub snapshot_counts: u64,
    /// Posts not counted because the initial snapshot was still running, or began or took a
    /// chunk while they were counted (they stay dirty).
    pub waiting_for_snapshot: u64,
    /// The longest a dirty entry this run folded had waited, in seconds, from its first mark
    /// (or the last fold that covered it, for a post that stays dirty) to the fold (`None`: no
    /// dirty entry folded). Whether folds keep up (see `counterd_dirty_to_fold_seconds`).
    pub longest_dirty_to_fold_secs: Option<i64>,
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
    /// What each event is charged against the memory budget
    /// ([`crate::budget::cost::event_cost`] of its encoded size), in the order of `events`.
    pub costs: Vec<usize>,
    /// The post-batch resume token, where the server sends one (checkpoint it on idle streams).
    pub post_batch_token: Option<Token>,
}

impl RawBatch {
    /// The sum of the events' charges.
    pub fn bytes(&self) -> usize {
        self.costs.iter().sum()
    }
}

/// An open change stream.
#[async_trait]
pub trait EventSource: Send {
    /// Reads events that are ready, within `limit` (by count and by their charge against the
    /// memory budget), returning early when none are ready (an empty batch) or once
    /// `max_wait` has passed with some events in hand. An event that does not fit is the
    /// first of the next read.
    async fn read(&mut self, limit: ReadLimit, max_wait: Duration) -> StoreResult<RawBatch>;

    /// Reads up to `max` events, limited by count only (tools and tests).
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch> {
        self.read(ReadLimit::events(max), max_wait).await
    }
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
) -> StoreResult<(Num, Num)> {
    let displayed = store
        .read_counter(post)
        .await?
        .map(|c| c.shown())
        .unwrap_or_default();
    Ok((displayed, store.count_live(post).await?))
}
