//! The worker: stream → classify → coalesce → apply → dirty set → checkpoint.
//!
//! Write order inside a batch, so that a crash anywhere replays to the same result:
//! (0) the intent: the batch's whole plan (counter increments, ledger states, dirty posts) is
//! stored in the checkpoint document and `high_water` raised to the batch's last token;
//! (a) counters, each guarded by `applied_through < end`; (b) ledger entries, guarded per
//! comment; (c) dirty marks; (d) the checkpoint, which clears the intent.
//!
//! After a crash the stored plan is re-applied as it was planned, before the stream is read
//! again: the guards reject what already landed and the rest lands once. The plan is replayed
//! rather than re-derived because re-reading the events would classify them against a ledger and
//! `updateLookup` documents that may already show later states. Events at or below the high
//! water (an operator's `replay` to an older position) are known to be applied: they only mark
//! their posts dirty, so the reconciler recounts them, and are never counted twice.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use bson::{DateTime, Timestamp};

use crate::batch::{plan_batch_covering, Coverage};
use crate::classify::{Attribution, StreamEnded};
use crate::clock::{Clock, SystemClock};
use crate::config::OnHistoryLost;
use crate::event::{ChangeEvent, CommentId, Token};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
pub use crate::status::WorkerStatus;
use crate::store::{
    Checkpoint, EventSource, Fence, Gap, PendingBatch, Store, StoreError, StreamOptions,
    StreamStart,
};
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
    pub partition: Option<crate::partition::Partition>,
    /// The application's field names and soft-delete rule.
    pub schema: crate::schema::Schema,
    /// The initial snapshot of rows that exist before the stream's start.
    pub snapshot: crate::snapshot::SnapshotSettings,
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

/// Idle reads between two records of the drained position while nothing is applied (with the
/// default idle interval, about once a second): the reconciler's quiet-window check waits for
/// a drained position after its count.
const IDLE_READS_PER_DRAINED_RECORD: u32 = 10;

/// Session-local state: events read but not yet applied, and the drained-position throttle.
struct Pending {
    events: VecDeque<ChangeEvent>,
    /// The last read returned nothing: the next read is preceded by a position reading, so
    /// that an empty answer proves every event before it applied.
    idle: bool,
    /// A batch was applied since the drained position was last recorded.
    applied_since_drained: bool,
    /// Empty reads since the drained position was last recorded.
    idle_reads: u32,
    /// Resumed after a token whose event had this cluster time: the first event read may not
    /// be older (checked once, then `None`). Catches a server that resumes "after" a token it
    /// never issued, where it reports no deployment identity.
    resumed_after: Option<Timestamp>,
    /// Events the next batch may hold (see [`next_batch_limit`]).
    batch_limit: usize,
}

/// The batch limit after a read that asked for `asked` events and got `got`: a full read means
/// the worker is behind, so the next batch may be twice as large (up to `max`); a read that
/// came back less than half full means it has caught up, so it halves (down to `min`).
pub fn next_batch_limit(current: usize, asked: usize, got: usize, min: usize, max: usize) -> usize {
    let max = max.max(min);
    let next = if asked > 0 && got >= asked {
        current.saturating_mul(2)
    } else if got < asked / 2 {
        current / 2
    } else {
        current
    };
    next.clamp(min, max)
}

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

    /// The clock's now as a cluster-time-like timestamp (whole seconds).
    fn now_timestamp(&self) -> Timestamp {
        Timestamp {
            time: crate::time::secs(self.clock.now()).clamp(0, u32::MAX as i64) as u32,
            increment: 0,
        }
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

    /// Exports the checkpointed position's time (cluster seconds) for the scrape-time age.
    fn report_checkpoint(&self, stream: &str, secs: i64) {
        self.status.checkpoint_secs.store(secs, Ordering::Relaxed);
        metrics::gauge!(m::CHECKPOINT_TIMESTAMP, "stream" => stream.to_string()).set(secs as f64);
    }

    /// Runs until shutdown (Ok) or a non-transient error. Transient errors reopen the stream
    /// from the checkpoint after an exponential, jittered backoff.
    pub async fn run(&self, epoch: i64, shutdown: impl Into<Shutdown>) -> Result<(), WorkerError> {
        let shutdown = shutdown.into();
        let fence = Fence {
            stream: self.settings.stream.clone(),
            epoch,
        };
        // A malformed checkpoint is a startup error, never silently replaced.
        self.store
            .load_checkpoint(&fence.stream)
            .await
            .map_err(WorkerError::Startup)?;
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
                    self.status.stream_open.store(false, Ordering::Relaxed);
                    let delay = backoff.next().unwrap_or(self.settings.retry_max_delay);
                    metrics::counter!(m::RETRIES, "op" => "worker").increment(1);
                    tracing::warn!(stream = %fence.stream, error = %e, retry_in = %humantime::format_duration(delay), "transient error; reopening the stream from the checkpoint");
                    if sleep_or_shutdown(self.clock.as_ref(), delay, &shutdown).await {
                        return Ok(());
                    }
                }
                Err(SessionError::Store(error)) if error.is_history_lost() => {
                    self.status.stream_open.store(false, Ordering::Relaxed);
                    metrics::counter!(m::HISTORY_LOST, "stream" => fence.stream.clone())
                        .increment(1);
                    match self.settings.on_history_lost {
                        OnHistoryLost::Fail => {
                            tracing::error!(stream = %fence.stream, %error, "history lost; on_history_lost = fail");
                            return Err(WorkerError::HistoryLost { source: error });
                        }
                        OnHistoryLost::Resweep => self.resweep(&fence, error).await?,
                    }
                }
                Err(SessionError::Store(e)) => {
                    self.status.stream_open.store(false, Ordering::Relaxed);
                    return Err(WorkerError::Store(e));
                }
            }
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
    async fn resweep(&self, fence: &Fence, error: StoreError) -> Result<(), WorkerError> {
        let checkpoint = self
            .store
            .load_checkpoint(&fence.stream)
            .await
            .map_err(WorkerError::Store)?;
        let mut to = self.clock.now();
        if matches!(error, StoreError::HistoryMismatch { .. }) {
            // Another history (a restored backup): restart after every write the server has
            // acknowledged so far, so the restore's own inserts, which the restored counters
            // already hold, are not read again; the first whole second after them.
            let upper = self
                .store
                .read_position()
                .await
                .map_err(WorkerError::Store)?
                .upper;
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
        self.store
            .record_gap(fence, &gap)
            .await
            .map_err(WorkerError::Store)?;
        // The new start ("now") belongs to this deployment. Recorded after the gap: a crash in
        // between finds the old deployment again and records a second gap, never resumes the
        // old position here.
        let here = self.store.deployment().await.map_err(WorkerError::Store)?;
        if !here.is_unknown() {
            self.store
                .record_deployment(fence, &here)
                .await
                .map_err(WorkerError::Store)?;
        }
        Ok(())
    }

    /// Re-applies the batch a stopped worker left in flight, exactly as planned (what a session
    /// does before it reads the stream), so that an operator's move of the checkpoint is not
    /// undone by it later. Returns the batch, if there was one.
    pub async fn resolve_pending(&self, fence: &Fence) -> Result<Option<PendingBatch>, StoreError> {
        let Some(mut checkpoint) = self.store.load_checkpoint(&fence.stream).await? else {
            return Ok(None);
        };
        let Some(batch) = checkpoint.pending.clone() else {
            return Ok(None);
        };
        self.write_batch(fence, &mut checkpoint, &batch).await?;
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

    /// One stream session: open from the checkpoint and apply batches until shutdown or error.
    async fn session(
        &self,
        fence: &Fence,
        shutdown: &Shutdown,
        backoff: &mut backon::ExponentialBackoff,
    ) -> Result<(), SessionError> {
        let mut checkpoint = self
            .store
            .load_checkpoint(&fence.stream)
            .await?
            .unwrap_or_else(|| Checkpoint {
                stream: fence.stream.clone(),
                epoch: fence.epoch,
                ..Checkpoint::default()
            });
        if let Some(batch) = checkpoint.pending.clone() {
            tracing::info!(stream = %fence.stream, end = %batch.end, posts = batch.counters.len(), "re-applying the batch a previous run left in flight");
            self.write_batch(fence, &mut checkpoint, &batch).await?;
        }
        self.check_deployment(fence, &mut checkpoint).await?;
        // A configured start applies once: after a history gap it is lost too, so "now" then.
        let configured_start = if checkpoint.gaps.is_empty() {
            self.settings.start_at
        } else {
            None
        };
        // A stream that never applied anything first snapshots the rows that exist; a chunk a
        // previous run left in flight is finished before the stream is read.
        let snapshotter = self.snapshotter(fence);
        snapshotter
            .begin_if_new(&mut checkpoint, configured_start)
            .await?;
        if checkpoint
            .snapshot
            .as_ref()
            .is_some_and(|s| s.pending.is_some())
        {
            snapshotter.step(&mut checkpoint).await?;
        }
        if checkpoint.token.is_none()
            && checkpoint.start_time.is_none()
            && configured_start.is_none()
        {
            // "Now", pinned: whoever resumes this stream later starts here, not at its own now.
            let now = self.now_timestamp();
            self.store.record_start(fence, now).await?;
            checkpoint.start_time = Some(now);
        }
        let start = match (
            &checkpoint.token,
            checkpoint.start_time.or(configured_start),
        ) {
            (Some(token), _) => StreamStart::After(token.clone()),
            (None, Some(at)) => StreamStart::AtTime(at),
            (None, None) => StreamStart::Now,
        };
        let mut source = self
            .store
            .open_stream(StreamOptions {
                start,
                pre_images: self.settings.pre_images,
                pipeline: self.settings.pipeline.clone(),
                max_await: self.settings.max_await,
            })
            .await?;
        self.status.stream_open.store(true, Ordering::Relaxed);
        self.status.progressed();
        // The position a restart would resume from, known from the start (not only after the
        // first checkpoint written by this process).
        let resumes_from = crate::recount::applied_before(&checkpoint)
            .or(checkpoint.start_time)
            .or(configured_start);
        if let Some(t) = resumes_from {
            self.report_checkpoint(&fence.stream, t.time as i64);
            self.status
                .applied_until_secs
                .fetch_max(t.time as i64, Ordering::Relaxed);
        }
        let or_none = |t: &Option<Token>| {
            t.as_ref()
                .map(|t| t.to_string())
                .unwrap_or_else(|| "none".into())
        };
        tracing::info!(stream = %fence.stream, token = %or_none(&checkpoint.token), high_water = %or_none(&checkpoint.high_water), "change stream open");
        let mut pending = Pending {
            events: VecDeque::new(),
            idle: true,
            applied_since_drained: true,
            idle_reads: 0,
            resumed_after: checkpoint.token.as_ref().and(checkpoint.token_time),
            batch_limit: self.settings.batch_size,
        };
        let mut next_chunk_at = self.clock.now();
        loop {
            if shutdown.requested() {
                return Ok(());
            }
            if checkpoint.snapshot_running() && self.clock.now() >= next_chunk_at {
                // One chunk between two batches, at the configured rate.
                let chunk = tokio::time::timeout(
                    self.settings.operation_timeout,
                    snapshotter.step(&mut checkpoint),
                );
                let step = tokio::select! {
                    result = chunk => result.map_err(|_| StoreError::Transient {
                        op: "read and apply a snapshot chunk",
                        message: format!("no answer within {:?} (operation_timeout)", self.settings.operation_timeout),
                    })??,
                    _ = shutdown.wait() => return Ok(()),
                };
                if let crate::snapshot::Step::Chunk { rows } = step {
                    let pause = self.settings.snapshot.pause_after(rows);
                    next_chunk_at = DateTime::from_millis(
                        self.clock.now().timestamp_millis() + pause.as_millis() as i64,
                    );
                }
            }
            let step = tokio::time::timeout(
                self.settings.operation_timeout,
                self.step(fence, &mut checkpoint, source.as_mut(), &mut pending),
            );
            let idle = tokio::select! {
                result = step => result.map_err(|_| StoreError::Transient {
                    op: "read and apply a batch",
                    message: format!("no answer within {:?} (operation_timeout); is the server paused or unreachable?", self.settings.operation_timeout),
                })??,
                // Abandoning a batch mid-way is safe: the checkpoint has not moved, and a
                // recorded intent is re-applied exactly, as planned, by the next session.
                _ = shutdown.wait() => return Ok(()),
            };
            *backoff = self.backoff();
            if idle
                && sleep_or_shutdown(self.clock.as_ref(), self.settings.idle_interval, shutdown)
                    .await
            {
                return Ok(());
            }
        }
    }

    /// Reads and applies one batch. Returns true when the stream was idle.
    async fn step(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        source: &mut dyn EventSource,
        pending: &mut Pending,
    ) -> Result<bool, SessionError> {
        if pending.events.len() < pending.batch_limit {
            // On an idle stream, note where the server stands before reading: an empty answer
            // then proves that every event before that position is applied.
            let before_read = if pending.events.is_empty() && pending.idle {
                Some(self.store.read_position().await?.lower)
            } else {
                None
            };
            let asked = pending.batch_limit - pending.events.len();
            let raw = source
                .next_batch(asked, self.settings.max_batch_wait)
                .await?;
            self.status.progressed();
            pending.batch_limit = next_batch_limit(
                pending.batch_limit,
                asked,
                raw.events.len(),
                self.settings.batch_size,
                self.settings.max_batch_size,
            );
            for doc in &raw.events {
                match ChangeEvent::parse(doc) {
                    Ok(event) => pending.events.push_back(event),
                    Err(e) => {
                        metrics::counter!(m::BAD_EVENTS, "stream" => fence.stream.clone())
                            .increment(1);
                        tracing::warn!(stream = %fence.stream, error = %e, "skipping an unreadable change event");
                    }
                }
            }
            if let Some(first) = pending
                .events
                .front()
                .filter(|_| pending.resumed_after.is_some())
            {
                let since = pending.resumed_after.take().expect("checked");
                if let Some(at) = first.cluster_time.filter(|at| *at < since) {
                    return Err(StoreError::HistoryMismatch {
                        position: position_of(checkpoint),
                        reason: format!("the first event after it ({} at {}) is older than the checkpoint's own event (at {}): this stream is not the history the checkpoint came from", first.token, rfc3339(at), rfc3339(since)),
                    }
                    .into());
                }
            }
            if pending.events.is_empty() {
                self.status.lag_secs.store(0, Ordering::Relaxed);
                let idle_before = std::mem::replace(&mut pending.idle, true);
                let drained_at = before_read.filter(|_| idle_before && raw.events.is_empty());
                self.checkpoint_idle(fence, checkpoint, raw.post_batch_token, drained_at, pending)
                    .await?;
                return Ok(true);
            }
        }
        pending.idle = false;
        let batch = take_batch(&mut pending.events, checkpoint.high_water.as_ref());
        self.apply(fence, checkpoint, &batch).await?;
        pending.applied_since_drained = true;
        Ok(false)
    }

    /// An idle stream still advances to the post-batch token, so a quiet collection's position
    /// never ages off the oplog.
    async fn checkpoint_idle(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        post_batch: Option<Token>,
        drained_at: Option<Timestamp>,
        pending: &mut Pending,
    ) -> Result<(), SessionError> {
        if let Some(token) = post_batch {
            if checkpoint.token.as_ref().is_none_or(|t| *t < token) {
                self.store.save_checkpoint(fence, &token, None).await?;
                checkpoint.token = Some(token.clone());
                if checkpoint.high_water.as_ref().is_none_or(|h| *h < token) {
                    checkpoint.high_water = Some(token);
                }
            }
        }
        // Drained: every event before `at` is applied. Recorded after every applied batch and
        // about once a second while idle, so the reconciler's watermark advances on a quiet
        // stream and its quiet-window check sees the worker pass the position it waits for.
        if let Some(at) = drained_at {
            // Every event before `at` is applied: the lag is measured from here.
            self.status
                .applied_until_secs
                .fetch_max(at.time as i64, Ordering::Relaxed);
            pending.idle_reads += 1;
            if pending.applied_since_drained || pending.idle_reads >= IDLE_READS_PER_DRAINED_RECORD
            {
                self.store.record_caught_up(fence, at).await?;
                if checkpoint.caught_up_at.is_none_or(|c| c < at) {
                    checkpoint.caught_up_at = Some(at);
                }
                pending.applied_since_drained = false;
                pending.idle_reads = 0;
            }
        }
        if let Some(t) = crate::recount::applied_before(checkpoint) {
            self.report_checkpoint(&fence.stream, t.time as i64);
        }
        Ok(())
    }

    /// Classifies one batch and applies it (or, below the high water, only marks it dirty).
    async fn apply(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        events: &[ChangeEvent],
    ) -> Result<(), SessionError> {
        let ledger = if self.settings.attribution.uses_ledger() {
            let ids: Vec<CommentId> = events.iter().filter_map(|e| e.comment.clone()).collect();
            self.store
                .read_ledger(&fence.stream, &ids, checkpoint.ledger_generation())
                .await?
        } else {
            Default::default()
        };
        let coverage = if checkpoint.ledger_complete() {
            Coverage::Complete
        } else {
            Coverage::Partial
        };
        let (mut plan, ended) = plan_batch_covering(
            events,
            &ledger,
            coverage,
            self.settings.attribution,
            &self.settings.schema,
            self.settings.bucket_width_secs,
        );
        if !self.settings.attribution.uses_ledger() {
            plan.ledger.clear();
        }
        if let Some(partition) = self.settings.partition {
            // Every partition classifies every event against its own ledger, and keeps its posts.
            plan.counters.retain(|c| partition.owns(&c.post));
            plan.dirty.retain(|d| partition.owns(&d.post));
            if partition.index != 0 {
                plan.skipped.clear(); // reported once, by partition 0
            }
        }
        let (bad, unattributable) = (plan.bad_events(), plan.unattributable_events());
        // The batch's guard token: its last event before any stream end.
        if let Some(last) = plan.events.checked_sub(1).map(|i| &events[i]) {
            let batch = PendingBatch {
                end: last.token.clone(),
                end_time: last.cluster_time,
                counters: plan.counters,
                ledger: plan.ledger,
                dirty: plan.dirty,
            };
            let seen = checkpoint
                .high_water
                .as_ref()
                .is_some_and(|h| batch.end <= *h);
            let started = std::time::Instant::now();
            if seen {
                // Already applied before (an operator replay): recount, never count again.
                self.store
                    .mark_dirty(fence, &batch.dirty, self.clock.now())
                    .await?;
                self.store
                    .save_checkpoint(fence, &batch.end, batch.end_time)
                    .await?;
                checkpoint.token = Some(batch.end.clone());
                checkpoint.token_time = batch.end_time;
            } else {
                self.store.record_intent(fence, &batch).await?; // (0)
                checkpoint.high_water = Some(batch.end.clone());
                self.write_batch(fence, checkpoint, &batch).await?;
                metrics::counter!(m::UNATTRIBUTABLE_EVENTS, "stream" => fence.stream.clone())
                    .increment(unattributable as u64);
            }
            let stream = fence.stream.clone();
            metrics::histogram!(m::BATCH_APPLY_DURATION, "stream" => stream.clone())
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!(m::BATCH_SIZE, "stream" => stream.clone())
                .record(plan.events as f64);
            metrics::counter!(m::EVENTS_APPLIED, "stream" => stream.clone())
                .increment(plan.events as u64);
            metrics::counter!(m::BAD_EVENTS, "stream" => stream.clone()).increment(bad as u64);
            for skipped in &plan.skipped {
                log_skipped(&fence.stream, &self.settings.schema, skipped, events);
            }
            self.status
                .events_applied
                .fetch_add(plan.events as i64, Ordering::Relaxed);
            let now = crate::time::secs(self.clock.now());
            let lag = last
                .cluster_time
                .map(|t| (now - t.time as i64).max(0))
                .unwrap_or(0);
            self.status.lag_secs.store(lag, Ordering::Relaxed);
            self.status.progressed();
            if let Some(t) = last.cluster_time {
                self.status
                    .applied_until_secs
                    .fetch_max(t.time as i64, Ordering::Relaxed);
                metrics::gauge!(m::LAST_EVENT_TIMESTAMP, "stream" => stream).set(t.time as f64);
            }
            if let Some(t) = crate::recount::applied_before(checkpoint) {
                self.report_checkpoint(&fence.stream, t.time as i64);
            }
        }
        match ended {
            Some(end) => Err(SessionError::Ended(end)),
            None => Ok(()),
        }
    }

    /// Writes a planned batch: (a) counters, (b) ledger, (c) dirty, (d) checkpoint.
    async fn write_batch(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: &PendingBatch,
    ) -> Result<(), StoreError> {
        let outcome = self
            .store
            .apply_counters(fence, &batch.counters, &batch.end, batch.end_time)
            .await?; // (a)
        if !batch.ledger.is_empty() {
            // A batch left in flight is re-applied before the stream is read again, so before
            // a history gap can be recorded: its states are of this generation.
            self.store
                .write_ledger(
                    fence,
                    &batch.ledger,
                    &batch.end,
                    checkpoint.ledger_generation(),
                )
                .await?; // (b)
        }
        self.store
            .mark_dirty(fence, &batch.dirty, self.clock.now())
            .await?; // (c)
        self.store
            .save_checkpoint(fence, &batch.end, batch.end_time)
            .await?; // (d)
        checkpoint.token = Some(batch.end.clone());
        checkpoint.token_time = batch.end_time;
        checkpoint.pending = None;
        let stream = fence.stream.clone();
        metrics::counter!(m::BATCHES, "stream" => stream.clone()).increment(1);
        metrics::counter!(m::INCREMENTS, "stream" => stream.clone(), "result" => "applied")
            .increment(outcome.applied);
        metrics::counter!(m::INCREMENTS, "stream" => stream, "result" => "already_applied")
            .increment(outcome.already_applied);
        tracing::debug!(stream = %fence.stream, end = %batch.end, writes = batch.counters.len(), already = outcome.already_applied, "batch applied");
        Ok(())
    }
}

/// The checkpoint's position, for messages.
fn position_of(checkpoint: &Checkpoint) -> String {
    match (&checkpoint.token, checkpoint.start_time) {
        (Some(token), _) => format!("token {token}"),
        (None, Some(at)) => format!("time {}", rfc3339(at)),
        (None, None) => "the start".into(),
    }
}

/// A cluster time as RFC 3339 (whole seconds).
fn rfc3339(at: Timestamp) -> String {
    DateTime::from_millis(at.time as i64 * 1000)
        .try_to_rfc3339_string()
        .unwrap_or_else(|_| at.time.to_string())
}

/// Takes the next batch from the buffer: everything read so far, cut at the high water so that
/// no batch holds events both at or below it and above it.
fn take_batch(pending: &mut VecDeque<ChangeEvent>, high_water: Option<&Token>) -> Vec<ChangeEvent> {
    let Some(high) = high_water else {
        return pending.drain(..).collect();
    };
    let below = pending.iter().take_while(|e| e.token <= *high).count();
    if below == 0 {
        pending.drain(..).collect()
    } else {
        pending.drain(..below).collect()
    }
}

/// Logs an event that was not counted, naming its comment and post where the event has them.
fn log_skipped(
    stream: &str,
    schema: &crate::schema::Schema,
    skipped: &crate::batch::Skipped,
    events: &[ChangeEvent],
) {
    let event = events.iter().find(|e| e.token == skipped.token);
    let comment = event
        .and_then(|e| e.comment.as_ref())
        .map(|c| c.key.clone())
        .unwrap_or_else(|| "unknown".into());
    let post = event
        .and_then(|e| {
            [
                e.full_document.as_ref(),
                e.pre_image.as_ref(),
                Some(&e.document_key),
            ]
            .into_iter()
            .flatten()
            .find_map(|d| schema.post_in(d))
        })
        .map(|p| p.to_string())
        .unwrap_or_else(|| "unknown".into());
    let kind = match &skipped.problem {
        crate::classify::Problem::Bad(_) => "bad",
        crate::classify::Problem::Unattributable(_) => "unattributable",
    };
    let problem = &skipped.problem;
    tracing::warn!(%stream, %comment, %post, token = %skipped.token, kind, %problem,
        "event not counted; its known posts are marked dirty and recounted");
}

enum SessionError {
    Ended(StreamEnded),
    Store(StoreError),
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        SessionError::Store(e)
    }
}

#[cfg(test)]
mod tests {
    use super::next_batch_limit;

    #[test]
    fn batches_grow_while_behind_and_shrink_once_caught_up() {
        // Full reads double the limit, up to the maximum.
        assert_eq!(next_batch_limit(1000, 1000, 1000, 1000, 10_000), 2000);
        assert_eq!(next_batch_limit(8000, 8000, 8000, 1000, 10_000), 10_000);
        assert_eq!(
            next_batch_limit(10_000, 10_000, 10_000, 1000, 10_000),
            10_000
        );
        // A half-full read keeps it; a sparse one halves it, down to the minimum.
        assert_eq!(next_batch_limit(4000, 4000, 2500, 1000, 10_000), 4000);
        assert_eq!(next_batch_limit(4000, 4000, 10, 1000, 10_000), 2000);
        assert_eq!(next_batch_limit(1000, 1000, 0, 1000, 10_000), 1000);
        // A maximum below the minimum never shrinks the minimum.
        assert_eq!(next_batch_limit(1000, 1000, 1000, 1000, 10), 1000);
    }
}
