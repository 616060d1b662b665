//! [`Checkpoints`]: each stream's position, pending batch, gaps, epoch and snapshot progress.

use bson::{DateTime, Timestamp};

use super::{fence_ok, seam, upsert, CarriedCopy, Memory, MemoryStore};
use crate::core::batch::PendingBatch;
use crate::core::deployment::Deployment;
use crate::core::event::Token;
use crate::core::time::cluster_second;
use crate::store::{Checkpoint, Fence, Gap, Position, SnapshotProgress, StoreError, StoreResult};

/// A stored checkpoint (the stream is its key): the seam's record, with its epoch as stored
/// (`None`: written by an operator, which no fence's `{epoch: n}` filter matches).
#[derive(Clone, Debug, Default)]
pub struct CheckpointRec {
    pub epoch: Option<i64>,
    pub doc: Checkpoint,
}

impl CheckpointRec {
    /// The checkpoint as the seam returns it.
    pub fn view(&self, stream: &str) -> Checkpoint {
        Checkpoint {
            stream: stream.to_string(),
            epoch: self.epoch.unwrap_or(0),
            ..self.doc.clone()
        }
    }
}

impl Memory {
    pub fn checkpoint_view(&self, stream: &str) -> Option<Checkpoint> {
        self.checkpoints.get(stream).map(|c| c.view(stream))
    }

    /// `update_one({_id: stream, <matches>}, update, upsert)`: a failed upsert on an existing
    /// document (another epoch) is a duplicate key, reported as `Fenced`.
    fn checkpoint_update(
        &mut self,
        fence: &Fence,
        matches: impl FnOnce(&CheckpointRec) -> bool,
        update: impl FnOnce(&mut CheckpointRec, DateTime),
    ) -> StoreResult<()> {
        let now = self.now();
        let new = || CheckpointRec {
            epoch: Some(fence.epoch),
            ..CheckpointRec::default()
        };
        let c = upsert(&mut self.checkpoints, fence.stream.clone(), matches, new);
        update(c.ok_or_else(|| StoreError::fenced(fence))?, now);
        Ok(())
    }

    /// A checkpoint write by the worker that owns the stream's current epoch.
    fn owned_update(
        &mut self,
        fence: &Fence,
        update: impl FnOnce(&mut Checkpoint, DateTime),
    ) -> StoreResult<()> {
        let owned = |c: &CheckpointRec| c.epoch == Some(fence.epoch);
        self.checkpoint_update(fence, owned, |c, now| update(&mut c.doc, now))
    }

    /// [`Memory::owned_update`] that sets `updated_at` too, like every worker write but
    /// `record_caught_up`.
    fn stamped_update(
        &mut self,
        fence: &Fence,
        update: impl FnOnce(&mut Checkpoint),
    ) -> StoreResult<()> {
        self.owned_update(fence, |c, now| {
            update(c);
            c.updated_at = Some(now);
        })
    }

    pub fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        let c = self.checkpoints.get(stream);
        if let Some(t) = c.and_then(|c| c.doc.token.as_ref()).map(Token::as_str) {
            if t.is_empty() || !t.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(StoreError::Malformed {
                    what: "checkpoint",
                    id: stream.to_string(),
                    detail: format!("`token` is {t:?}"),
                });
            }
        }
        Ok(c.map(|c| c.view(stream)))
    }

    pub fn record_intent(
        &mut self,
        fence: &Fence,
        batch: &PendingBatch,
        carried: Option<&PendingBatch>,
    ) -> StoreResult<()> {
        if let Some(carried) = carried {
            let key = (fence.stream.clone(), carried.end.to_string());
            if self
                .carried
                .get(&key)
                .is_some_and(|c| c.epoch > fence.epoch)
            {
                // A successor's copy of the same batch (see the MongoDB store).
                return Err(StoreError::fenced(fence));
            }
            let copy = CarriedCopy {
                carry: batch.carry.as_ref().unwrap_or(&carried.end).to_string(),
                epoch: fence.epoch,
                batch: carried.clone(),
            };
            self.carried.insert(key, copy);
        }
        self.stamped_update(fence, |c| {
            c.high_water = c.high_water.take().max(Some(batch.end.clone()));
            c.pending = Some(batch.clone());
        })
    }

    pub fn load_carried(
        &self,
        stream: &str,
        carry: &Token,
        after: Option<&Token>,
        through: &Token,
        limit: usize,
    ) -> StoreResult<Vec<PendingBatch>> {
        Ok(self
            .carried
            .iter()
            .filter(|((s, _), c)| {
                s == stream
                    && c.carry == carry.as_str()
                    && after.is_none_or(|a| c.batch.end > *a)
                    && c.batch.end <= *through
            })
            .take(limit.max(1))
            .map(|(_, c)| c.batch.clone())
            .collect())
    }

    pub fn clear_carried(&mut self, fence: &Fence, carry: &Token) -> StoreResult<()> {
        self.carried.retain(|(s, _), c| {
            !(*s == fence.stream && c.carry == carry.as_str() && c.epoch <= fence.epoch)
        });
        Ok(())
    }

    pub fn save_checkpoint(
        &mut self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        self.stamped_update(fence, |c| {
            c.token = Some(token.clone());
            c.token_time = token_time.or(c.token_time);
            c.high_water = c.high_water.take().max(Some(token.clone()));
            c.pending = None;
        })
    }

    pub fn move_checkpoint(&mut self, stream: &str, to: &Position) -> StoreResult<()> {
        let now = self.now();
        let c = &mut self.checkpoints.entry(stream.to_string()).or_default().doc;
        c.updated_at = Some(now);
        (c.token, c.token_time, c.start_time) = match to {
            Position::Token(t) => (Some(t.clone()), None, None),
            Position::Time(t) => (None, None, Some(*t)),
            Position::Unset => (None, None, None),
        };
        Ok(())
    }

    pub fn record_start(&mut self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.stamped_update(fence, |c| c.start_time = Some(at))
    }

    pub fn record_caught_up(&mut self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        // `$max`: a missing field is below any value.
        self.owned_update(fence, |c, _| c.caught_up_at = c.caught_up_at.max(Some(at)))
    }

    pub fn record_gap(&mut self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        self.stamped_update(fence, |c| {
            c.gaps.push(gap.clone());
            c.sweep_requested = true;
            c.token = None;
            c.token_time = None;
            // The new stream starts exactly where the gap ends.
            c.start_time = Some(cluster_second(gap.to));
        })
    }

    pub fn record_deployment(&mut self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        self.stamped_update(fence, |c| c.deployment = Some(deployment.clone()))
    }

    pub fn set_sweep_requested(&mut self, stream: &str, requested: bool) -> StoreResult<()> {
        let c = self.checkpoints.entry(stream.to_string()).or_default();
        c.doc.sweep_requested = requested;
        Ok(())
    }

    pub fn save_snapshot(&mut self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        self.stamped_update(fence, |c| c.snapshot = Some(progress.clone()))
    }

    pub fn adopt_checkpoint(&mut self, fence: &Fence) -> StoreResult<()> {
        self.checkpoint_update(
            fence,
            |c| fence_ok(c.epoch, fence),
            |c, now| {
                c.epoch = Some(fence.epoch);
                c.doc.updated_at = Some(now);
            },
        )
    }

    /// Whether some stream's initial snapshot is still running.
    pub fn snapshot_running(&self) -> bool {
        self.checkpoints.values().any(|c| c.doc.snapshot_running())
    }

    /// Whether a history gap was recorded on any stream.
    pub fn has_gaps(&self) -> bool {
        self.checkpoints.values().any(|c| !c.doc.gaps.is_empty())
    }
}

seam!(Checkpoints {
    try fn load_checkpoint(stream: &str) -> Option<Checkpoint>;
    try fn record_intent(fence: &Fence, batch: &PendingBatch, carried: Option<&PendingBatch>) -> ();
    try fn load_carried(stream: &str, carry: &Token, after: Option<&Token>, through: &Token, limit: usize) -> Vec<PendingBatch>;
    try fn clear_carried(fence: &Fence, carry: &Token) -> ();
    try fn save_checkpoint(fence: &Fence, token: &Token, token_time: Option<Timestamp>) -> ();
    try fn move_checkpoint(stream: &str, to: &Position) -> ();
    try fn record_start(fence: &Fence, at: Timestamp) -> ();
    try fn record_caught_up(fence: &Fence, at: Timestamp) -> ();
    try fn record_gap(fence: &Fence, gap: &Gap) -> ();
    try fn record_deployment(fence: &Fence, deployment: &Deployment) -> ();
    try fn set_sweep_requested(stream: &str, requested: bool) -> ();
    try fn adopt_checkpoint(fence: &Fence) -> ();
    try fn save_snapshot(fence: &Fence, progress: &SnapshotProgress) -> ();
});
