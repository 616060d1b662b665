//! The worker: stream → classify → coalesce → apply → dirty set → checkpoint.
//!
//! Write order inside a batch, so that a crash anywhere replays to the same result:
//! (0) the intent: the batch's whole plan (counter increments, ledger states, dirty posts) is
//! stored in the checkpoint document and `high_water` raised to the batch's last token;
//! (a) counters, each guarded by `applied_through < end`; (b) ledger entries, guarded per
//! comment; (c) dirty marks; (d) the checkpoint, which clears the intent. (a), (b) and (c) are
//! issued together: once the intent is stored, their order no longer matters (see
//! `write_batch`); (d) waits for all three.
//!
//! While the worker is behind, (a) and (c) may wait: a batch's counter increments and dirty
//! marks are carried to the next batch (see [`crate::core::carry`]), stored under the carry's id just
//! before the batch's intent (which then holds only its ledger states); the carry's counters
//! are written together, before (d), when the worker catches up, stops, pauses for a snapshot
//! chunk, or the carry is old or full. (d) never passes a carried increment.
//!
//! After a crash the stored plan is re-applied as it was planned, before the stream is read
//! again: the guards reject what already landed and the rest lands once. The plan is replayed
//! rather than re-derived because re-reading the events would classify them against a ledger and
//! `updateLookup` documents that may already show later states. Events at or below the high
//! water (an operator's `replay` to an older position) are known to be applied: they only mark
//! their posts dirty, so the reconciler recounts them, and are never counted twice.
//!
//! Here: the worker's settings, its run loop (leases' fence, retries, history-lost policy) and
//! recovery of a batch in flight. `session`: one open stream, read and batched. `apply`: one
//! batch classified, coalesced and written.
//!
//! The pipeline, each stage a function that reads top to bottom:
//! - a session: `resume` (what a previous run left: its batch in flight re-applied, the
//!   deployment checked, the initial snapshot begun), `open`, then turns of `snapshot_chunk`
//!   (where one is due) and `step`;
//! - a step: what is carried is flushed unless it may stay carried; `read` within the memory
//!   budget; then the batch is applied, while behind beside the next read
//!   (`apply_reading_ahead`);
//! - `apply`: `plan` (the ledger view, rows looked up, `plan_batch_covering`, this partition's
//!   share) → `write_planned` ((0) `record_intent`, then (b) with (a) and (c) carried, or
//!   `write_batch`: (a), (b), (c) side by side, then (d)) or, below the high water,
//!   `mark_replayed` → `report_batch`.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bson::{DateTime, Timestamp};

use crate::clock::{Clock, SystemClock};
use crate::config::OnHistoryLost;
use crate::core::batch::PendingBatch;
use crate::core::classify::{Attribution, StreamEnded};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
pub use crate::status::WorkerStatus;
use crate::store::{Checkpoint, Fence, Gap, Store, StoreError};
use crate::telemetry as m;

/// The worker's knobs: built from the configuration by [`crate::daemon`], whose `Default` is
/// the configuration's defaults.
#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// The checkpoint's id: one stream (or partition) per id.
    pub stream: String,
    /// Events per batch while the worker is caught up (low latency).
    pub batch_size: usize,
    /// Events per batch at most while it is behind: batches double up to it while reads come
    /// back full, so more repeats coalesce into one write exactly when the worker needs it, and
    /// halve back once it has caught up.
    pub max_batch_size: usize,
    pub max_batch_wait: Duration,
    /// Pause after a read that returned no events (the fake server ignores `maxAwaitTimeMS`).
    pub idle_interval: Duration,
    pub max_await: Duration,
    pub attribution: Attribution,
    pub bucket_width_secs: i64,
    pub on_history_lost: OnHistoryLost,
    /// Where to start with no checkpoint; `None`: now.
    pub start_at: Option<Timestamp>,
    /// Ask the server for pre-images.
    pub pre_images: bool,
    /// Extra stream stages (partition `$match`).
    pub pipeline: Vec<bson::Document>,
    pub retry_min_delay: Duration,
    pub retry_max_delay: Duration,
    /// A step (read + write of one batch) taking longer is abandoned and retried.
    pub operation_timeout: Duration,
    /// Keep only the posts of this partition (`None`: all posts).
    pub partition: Option<crate::core::partition::Partition>,
    /// The application's field names and soft-delete rule.
    pub schema: crate::core::schema::Schema,
    /// The initial snapshot of rows that exist before the stream's start.
    pub snapshot: crate::snapshot::SnapshotSettings,
    /// The process's memory budget, shared by every stream's worker: events in flight, the
    /// read ahead and snapshot chunks are charged to it (see `crate::budget`).
    pub budget: crate::budget::Budget,
}

/// Why the worker stopped.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    StreamEnded(#[from] StreamEnded),
    #[error("{source}. on_history_lost = \"fail\": nothing was counted from this position. To continue, either set on_history_lost = \"resweep\" and start again (counterd records the gap, restarts the stream from now and recounts every post), or run `counterd replay --from-time <RFC 3339 time this deployment's oplog still holds>`, start `counterd run` again and run `counterd reconcile --sweep` once beside it")]
    HistoryLost { source: StoreError },
    #[error("cannot start: {0}")]
    Startup(StoreError),
    #[error("worker stopped: {0} (the checkpoint did not move; nothing is lost)")]
    Store(StoreError),
}

/// Tails the stream and applies it until shutdown is requested or a non-transient error.
pub struct Worker<S: Store + ?Sized> {
    store: Arc<S>,
    settings: WorkerSettings,
    status: Arc<WorkerStatus>,
    clock: Arc<dyn Clock>,
}

mod apply;
mod session;

use session::position_of;

impl<S: Store + ?Sized> Worker<S> {
    pub fn new(store: Arc<S>, settings: WorkerSettings, status: Arc<WorkerStatus>) -> Self {
        Worker {
            store,
            settings,
            status,
            clock: Arc::new(SystemClock),
        }
    }

    /// The same worker reading time from (and pausing on) `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The initial snapshot's driver for this stream.
    fn snapshotter<'a>(&'a self, fence: &'a Fence) -> crate::snapshot::Snapshotter<'a, S> {
        crate::snapshot::Snapshotter {
            store: self.store.as_ref(),
            fence,
            settings: &self.settings.snapshot,
            partition: self.settings.partition,
            bucket_width_secs: self.settings.bucket_width_secs,
            clock: self.clock.as_ref(),
        }
    }

    /// Exports the checkpointed position's time (cluster seconds), where there is one, for the
    /// scrape-time age.
    fn report_checkpoint(&self, stream: &str, at: Option<Timestamp>) {
        if let Some(secs) = at.map(|t| t.time as i64) {
            self.status.checkpointed(secs);
            metrics::gauge!(m::CHECKPOINT_TIMESTAMP, "stream" => stream.to_string())
                .set(secs as f64);
        }
    }

    /// Runs until shutdown (Ok) or a non-transient error. Transient errors reopen the stream
    /// from the checkpoint after an exponential, jittered backoff.
    pub async fn run(&self, epoch: i64, shutdown: impl Into<Shutdown>) -> Result<(), WorkerError> {
        let shutdown = shutdown.into();
        let fence = Fence::new(&self.settings.stream, epoch);
        self.check_checkpoint(&fence).await?;
        let mut backoff = self.backoff();
        loop {
            if shutdown.requested() {
                return Ok(());
            }
            let session = self.session(&fence, &shutdown, &mut backoff);
            match session.await {
                Ok(()) => return Ok(()),
                Err(SessionError::Ended(end)) => return Err(end.into()),
                Err(SessionError::Store(e)) if e.is_transient() => {
                    self.status.stream_closed();
                    let delay = backoff.next().unwrap_or(self.settings.retry_max_delay);
                    metrics::counter!(m::RETRIES, "op" => "worker").increment(1);
                    tracing::warn!(stream = %fence.stream, error = %e, retry_in = %humantime::format_duration(delay), "transient error; reopening the stream from the checkpoint");
                    if sleep_or_shutdown(self.clock.as_ref(), delay, &shutdown).await {
                        return Ok(());
                    }
                }
                Err(SessionError::Store(error)) if error.is_history_lost() => {
                    self.history_lost(&fence, error).await?;
                }
                Err(SessionError::Store(e)) => {
                    self.status.stream_closed();
                    return Err(WorkerError::Store(e));
                }
            }
        }
    }

    /// A malformed checkpoint is a startup error, never silently replaced. A transient error
    /// is not: the session loads the checkpoint again, and retries like any other step.
    async fn check_checkpoint(&self, fence: &Fence) -> Result<(), WorkerError> {
        match self.store.load_checkpoint(&fence.stream).await {
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "worker").increment(1);
                tracing::warn!(stream = %fence.stream, error = %e, "cannot read the checkpoint yet; the session reads it again");
                Ok(())
            }
            Err(e) => Err(WorkerError::Startup(e)),
            Ok(_) => Ok(()),
        }
    }

    /// History lost: stop (`fail`), or record the gap and start again from now (`resweep`).
    async fn history_lost(&self, fence: &Fence, error: StoreError) -> Result<(), WorkerError> {
        self.status.stream_closed();
        metrics::counter!(m::HISTORY_LOST, "stream" => fence.stream.clone()).increment(1);
        match self.settings.on_history_lost {
            OnHistoryLost::Fail => {
                // Said once, by whoever handles the error: the supervisor parks
                // the stream (its ERROR line says what to do) or `run` stops.
                tracing::warn!(stream = %fence.stream, %error, "history lost; on_history_lost = fail");
                Err(WorkerError::HistoryLost { source: error })
            }
            OnHistoryLost::Resweep => self.resweep(fence, error).await.map_err(WorkerError::Store),
        }
    }

    fn backoff(&self) -> backon::ExponentialBackoff {
        ExponentialBuilder::default()
            .with_jitter()
            .with_min_delay(self.settings.retry_min_delay)
            .with_max_delay(self.settings.retry_max_delay)
            .without_max_times()
            .build()
    }

    /// History lost, policy resweep: record the gap, request a full sweep, start from now.
    async fn resweep(&self, fence: &Fence, error: StoreError) -> Result<(), StoreError> {
        let checkpoint = self.store.load_checkpoint(&fence.stream).await?;
        let mut to = self.clock.now();
        if matches!(error, StoreError::HistoryMismatch { .. }) {
            // Another history (a restored backup): restart after every write the server has
            // acknowledged so far, so the restore's own inserts, which the restored counters
            // already hold, are not read again; the first whole second after them.
            let upper = self.store.read_position().await?.upper;
            let secs = upper.time as i64 + i64::from(upper.increment > 0);
            to = to.max(DateTime::from_millis(secs * 1000));
        }
        let gap = Gap {
            from: checkpoint
                .as_ref()
                .and_then(|c| c.token_time)
                .map(|t| DateTime::from_millis(t.time as i64 * 1000)),
            to,
        };
        let rfc3339 = |t: DateTime| t.try_to_rfc3339_string().unwrap_or_default();
        let gap_from = gap.from.map(rfc3339).unwrap_or_else(|| "unknown".into());
        tracing::error!(stream = %fence.stream, %error, %gap_from, gap_to = %rfc3339(gap.to),
            "HISTORY LOST: events in this gap were never seen; restarting the stream from now and scheduling a full recount sweep");
        self.store.record_gap(fence, &gap).await?;
        // The new start ("now") belongs to this deployment. Recorded after the gap: a crash in
        // between finds the old deployment again and records a second gap, never resumes the
        // old position here.
        let here = self.store.deployment().await?;
        if !here.is_unknown() {
            self.store.record_deployment(fence, &here).await?;
        }
        Ok(())
    }

    /// Re-applies the batch a stopped worker left in flight, with the counters it carried,
    /// exactly as planned (what a session does before it reads the stream), so that an
    /// operator's move of the checkpoint is not undone by it later. Returns the batch, if
    /// there was one.
    pub async fn resolve_pending(&self, fence: &Fence) -> Result<Option<PendingBatch>, StoreError> {
        let Some(mut checkpoint) = self.store.load_checkpoint(&fence.stream).await? else {
            return Ok(None);
        };
        let Some(batch) = checkpoint.pending.clone() else {
            return Ok(None);
        };
        self.reapply(fence, &mut checkpoint, &batch).await?;
        Ok(Some(batch))
    }

    /// A position belongs to the deployment it was recorded on: resuming it on another one (a
    /// backup restored there) is lost history, whatever the server says. Records the
    /// deployment where the checkpoint has none yet or the server now reports more of it.
    async fn check_deployment(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
    ) -> Result<(), SessionError> {
        let here = self.store.deployment().await?;
        if here.is_unknown() {
            return Ok(());
        }
        if let Some(recorded) = &checkpoint.deployment {
            let positioned = checkpoint.token.is_some() || checkpoint.start_time.is_some();
            if positioned && !recorded.same_as(&here) {
                return Err(StoreError::HistoryMismatch {
                    position: position_of(checkpoint),
                    reason: format!("the checkpoint was recorded on {recorded}, but this server is {here}. A backup restored onto another deployment? Its position means nothing here, and resuming from it would count restored rows again"),
                }
                .into());
            }
            if !here.adds_to(recorded) {
                return Ok(());
            }
        }
        tracing::info!(stream = %fence.stream, deployment = %here, "checkpoint belongs to this deployment");
        self.store.record_deployment(fence, &here).await?;
        checkpoint.deployment = Some(here);
        Ok(())
    }
}

/// Why a session ended: the stream's end, or a store error (`run` retries a transient one).
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Ended(StreamEnded),
    #[error(transparent)]
    Store(#[from] StoreError),
}
