//! One stream session: open the stream at the checkpoint, then read, batch and apply until
//! shutdown or error; while behind, the next batch is read (and its ledger entries fetched)
//! while the current one is written.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use bson::{DateTime, Timestamp};

use super::apply::Prefetched;
use super::{SessionError, Worker};
use crate::event::{ChangeEvent, Token};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::{Checkpoint, EventSource, Fence, Store, StoreError, StreamOptions, StreamStart};
use crate::telemetry as m;

/// Idle reads between two records of the drained position while nothing is applied (with the
/// default idle interval, about once a second): the reconciler's row-level recount waits for
/// a drained position after its read.
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
    /// The last read came back full: the worker is behind, and reads ahead while it writes.
    behind: bool,
    /// The ledger entries of the events read ahead, fetched while the batch before them was
    /// written (see [`Prefetched`]).
    prefetched: Option<Prefetched>,
}

/// How many `max_batch_wait`s a read ahead (made while the worker is behind, during a batch's
/// writes) may gather events for.
const READ_AHEAD_WAITS: u32 = 5;

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
    /// One stream session: open from the checkpoint and apply batches until shutdown or error.
    pub(super) async fn session(
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
            behind: false,
            prefetched: None,
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
                    biased;
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
            // `biased`: the branches are polled in this order, never in a random one, so a
            // stop requested while a step runs ends it at the same point every time (the
            // simulation replays a seed exactly).
            let idle = tokio::select! {
                biased;
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
            let got = raw.events.len();
            let events = parse_events(&fence.stream, raw.events);
            self.take_in(checkpoint, pending, asked, got, events)?;
            if pending.events.is_empty() {
                self.status.lag_secs.store(0, Ordering::Relaxed);
                let idle_before = std::mem::replace(&mut pending.idle, true);
                let drained_at = before_read.filter(|_| idle_before && got == 0);
                self.checkpoint_idle(fence, checkpoint, raw.post_batch_token, drained_at, pending)
                    .await?;
                return Ok(true);
            }
        }
        pending.idle = false;
        let batch = take_batch(&mut pending.events, checkpoint.high_water.as_ref());
        let prefetched = pending.prefetched.take();
        if pending.behind {
            // Behind: the next batch is read, and its ledger entries fetched, while this one is
            // written. (Caught up, the next read waits for new events instead, and is preceded
            // by a position reading.)
            let asked = pending.batch_limit - pending.events.len();
            // Only when the read ahead is the whole next batch, and no snapshot chunk can
            // claim entries between the two batches.
            let prefetch = pending.events.is_empty()
                && self.settings.attribution.uses_ledger()
                && !checkpoint.snapshot_running();
            let generation = checkpoint.ledger_generation();
            let read_ahead = async {
                // The read runs while the batch is written, so it may take about as long: a
                // backlog is then read in full batches (coalescing needs them) rather than cut
                // at `max_batch_wait`, which bounds the latency of a caught-up worker's reads.
                let raw = source
                    .next_batch(asked, self.settings.max_batch_wait * READ_AHEAD_WAITS)
                    .await?;
                let got = raw.events.len();
                let events = parse_events(&fence.stream, raw.events);
                let ledger = if prefetch && !events.is_empty() {
                    Some(
                        self.prefetch_ledger(&fence.stream, generation, &events)
                            .await?,
                    )
                } else {
                    None
                };
                Ok::<_, StoreError>((got, events, ledger))
            };
            let (applied, read) =
                tokio::join!(self.apply(fence, checkpoint, batch, prefetched), read_ahead);
            let written = applied?;
            let (got, events, ledger) = read?;
            self.take_in(checkpoint, pending, asked, got, events)?;
            pending.prefetched = ledger.map(|mut ledger| {
                ledger.overlay(written);
                ledger
            });
        } else {
            self.apply(fence, checkpoint, batch, prefetched).await?;
        }
        pending.applied_since_drained = true;
        Ok(false)
    }

    /// Takes a read of `asked` events that returned `got` documents (`events`, those that
    /// parsed) in, and sizes the next read by how full this one came back.
    fn take_in(
        &self,
        checkpoint: &Checkpoint,
        pending: &mut Pending,
        asked: usize,
        got: usize,
        events: Vec<ChangeEvent>,
    ) -> Result<(), SessionError> {
        self.status.progressed();
        pending.behind = got >= asked;
        pending.batch_limit = next_batch_limit(
            pending.batch_limit,
            asked,
            got,
            self.settings.batch_size,
            self.settings.max_batch_size,
        );
        pending.events.extend(events);
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
        Ok(())
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
        // stream and its row-level recount sees the worker pass the position it waits for.
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
}

/// Parses a read's documents: an unreadable event is counted and logged, never fatal.
fn parse_events(stream: &str, docs: Vec<bson::Document>) -> Vec<ChangeEvent> {
    docs.into_iter()
        .filter_map(|doc| {
            ChangeEvent::from_document(doc)
                .inspect_err(|e| {
                    metrics::counter!(m::BAD_EVENTS, "stream" => stream.to_string()).increment(1);
                    tracing::warn!(%stream, error = %e, "skipping an unreadable change event");
                })
                .ok()
        })
        .collect()
}

/// The checkpoint's position, for messages.
pub(super) fn position_of(checkpoint: &Checkpoint) -> String {
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
