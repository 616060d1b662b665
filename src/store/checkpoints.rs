//! Each stream's position and what it records beside it (pending batch, gaps, deployment,
//! snapshot progress): what [`Checkpoints`] reads and writes.

use async_trait::async_trait;
use bson::{DateTime, Timestamp};
use serde::Serialize;

use super::error::StoreResult;
use super::leases::Fence;
use crate::core::batch::{CounterDelta, PendingBatch};
use crate::core::deployment::Deployment;
use crate::core::event::{CommentId, LedgerUpdate, Token};

/// Where each stream stands: resume position, pending batch, gaps, deployment, fencing epoch
/// and snapshot progress.
#[async_trait]
pub trait Checkpoints: Send + Sync {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>>;

    /// Records a batch's intent: raises `high_water` to its end and stores its plan as pending.
    /// `carried`: the batch's own counters and dirty marks when it may be carried (not written
    /// with it; see [`crate::core::carry`]), then not in `batch`: stored first, under the carry's id
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

    /// What identifies the deployment this store talks to now (unknown parts left out; by
    /// default nothing, like the fake test server without `serverStatus`).
    async fn deployment(&self) -> StoreResult<Deployment> {
        Ok(Deployment::default())
    }

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
    /// one is lost history (see [`crate::core::deployment`]).
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
    /// ledger's state wins over a pre-image (see [`crate::core::classify::Before::Complete`]).
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

/// A recorded gap in the stream (history lost), for `status` and the sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Gap {
    /// The checkpoint's event time when history was found lost.
    pub from: Option<DateTime>,
    /// When the worker restarted from "now".
    pub to: DateTime,
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, strum::AsRefStr, strum::EnumString)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum SnapshotState {
    Running,
    Done,
    /// History was lost while it ran: the sweep after the gap recounts every post and rebuilds
    /// the ledger instead.
    Abandoned,
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
