//! Waiting for the worker: until it has applied every event before a position, or, with no
//! worker holding the stream's lease, proof from the stream itself that nothing is pending.

use bson::{DateTime, Timestamp};

use super::Recounter;
use crate::store::{Checkpoint, Store, StoreResult, StreamOptions, StreamStart};

impl<S: Store + ?Sized> Recounter<S> {
    /// Waits until the stream's worker has applied every event before `position`; false when it
    /// did not within the timeout. When no worker holds the stream's lease (a one-shot
    /// `counterd reconcile`, `get` or `verify` while `counterd run` is stopped), nothing will
    /// apply anything: the stream itself is read after the checkpoint instead, and an empty
    /// answer read after `position` proves that nothing before it is pending.
    ///
    /// A counter several partitions write waits for every partition's worker
    /// ([`Recounter::writers`]).
    pub async fn wait_until_applied(&self, position: Timestamp) -> StoreResult<bool> {
        for stream in self.writers() {
            if !self.wait_for_stream(&stream, position).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// [`Recounter::wait_until_applied`] for one stream.
    async fn wait_for_stream(&self, stream: &str, position: Timestamp) -> StoreResult<bool> {
        let polls = (self.catch_up.timeout.as_millis() / self.catch_up.poll.as_millis().max(1))
            .max(1) as u64;
        // Bounded by the clock as well as by the number of looks: on a loaded machine each look
        // (a checkpoint read and a pause) takes longer than `poll`, and counting looks alone
        // stretched a 10 s timeout to half a minute, holding the reconciler's pass meanwhile.
        let deadline =
            self.clock.now().timestamp_millis() + self.catch_up.timeout.as_millis() as i64;
        let mut last_probe: Option<DateTime> = None;
        for look in 0..=polls {
            let checkpoint = self.store.load_checkpoint(stream).await?;
            if checkpoint.as_ref().and_then(applied_before) >= Some(position) {
                return Ok(true);
            }
            if look > 0 && self.clock.now().timestamp_millis() >= deadline {
                break;
            }
            // At most once a second, and only while no worker holds the lease: an empty read
            // ends the wait early; events found pending only mean waiting on (a worker may be
            // starting).
            let now = self.clock.now();
            let probe_due =
                last_probe.is_none_or(|t| now.timestamp_millis() - t.timestamp_millis() >= 1000);
            if self.catch_up.probe_without_worker && probe_due && !self.worker_alive(stream).await?
            {
                last_probe = Some(now);
                if self
                    .nothing_pending_before(checkpoint.as_ref(), position)
                    .await?
                {
                    return Ok(true);
                }
            }
            self.clock.sleep(self.catch_up.poll).await;
        }
        tracing::debug!(%stream, ?position, "the worker did not catch up in time; the counted posts stay dirty");
        Ok(false)
    }

    /// Whether the stream's worker could not apply what a count now would see within a count's
    /// wait for it (`catch_up.timeout`): such a count could not be folded (it would be in
    /// flight), so the reconciler leaves its posts for a later run instead of counting them.
    ///
    /// Measured, not predicted: the worker must reach the server's present position (less
    /// [`RECORD_SLACK_SECS`]) within the timeout. How far behind it is in cluster time says
    /// nothing about how long it needs: a backlog written in 8 s took a loaded worker 30 s,
    /// and a rule "behind by more than the timeout" let the first passes of that catch-up
    /// count. A worker that keeps up is there at once (or within one of its drained records).
    /// False while no worker holds the lease (the count's wait then reads the stream itself),
    /// before the stream has a checkpoint, and while the initial snapshot runs (the recount
    /// reports that on its own).
    ///
    /// A counter several partitions write: any of their workers ([`Recounter::writers`]).
    ///
    /// A stream found behind is added to `found_behind`, and one already there is behind
    /// without another wait: one reconcile pass shares it across its definitions (see
    /// [`FoundBehind`]).
    pub async fn worker_behind(&self, found_behind: &mut FoundBehind) -> StoreResult<bool> {
        for stream in self.writers() {
            if found_behind.contains(&stream) || self.stream_behind(&stream).await? {
                found_behind.insert(stream);
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// [`Recounter::worker_behind`] for one stream.
    async fn stream_behind(&self, stream: &str) -> StoreResult<bool> {
        let Some(checkpoint) = self.store.load_checkpoint(stream).await? else {
            return Ok(false);
        };
        if checkpoint.snapshot_running() || !self.worker_alive(stream).await? {
            return Ok(false);
        }
        let now = self.store.read_position().await?.lower;
        let target = Timestamp {
            time: now.time.saturating_sub(RECORD_SLACK_SECS),
            increment: 0,
        };
        if applied_before(&checkpoint) >= Some(target) {
            return Ok(false);
        }
        let reached = self.wait_for_stream(stream, target).await?;
        if !reached {
            tracing::debug!(%stream, ?target, "the worker is catching up: recounts wait for a later run");
        }
        Ok(!reached)
    }

    /// Whether some process holds the stream's lease (and so applies its events).
    async fn worker_alive(&self, stream: &str) -> StoreResult<bool> {
        let lease = self.store.read_lease(stream).await?;
        Ok(lease.is_some_and(|l| l.expires_at > self.clock.now()))
    }

    /// With no worker holding the lease: reads the stream after the checkpoint once. True: no
    /// event is pending before `position`; false: events are waiting for a worker (or a batch
    /// was left in flight), or the server's position is not yet past `position`.
    async fn nothing_pending_before(
        &self,
        checkpoint: Option<&Checkpoint>,
        position: Timestamp,
    ) -> StoreResult<bool> {
        let Some(checkpoint) = checkpoint else {
            // Never started: no worker will ever apply what is already written as events (a
            // first worker starts at the server's position then), so the rows are as settled
            // as they will be. With `initial_snapshot = "auto"` its snapshot will claim them:
            // `counterd reconcile` refuses such a stream before it gets here.
            return Ok(self.store.read_position().await?.lower >= position);
        };
        if checkpoint.pending.is_some() {
            return Ok(false);
        }
        let start = match (&checkpoint.token, checkpoint.start_time) {
            (Some(token), _) => StreamStart::After(token.clone()),
            (None, Some(at)) => StreamStart::AtTime(at),
            (None, None) => return Ok(false),
        };
        let before_read = self.store.read_position().await?.lower;
        if before_read < position {
            return Ok(false);
        }
        let mut stream = self
            .store
            .open_stream(StreamOptions {
                start,
                pre_images: false,
                pipeline: Vec::new(),
                max_await: self.catch_up.poll,
            })
            .await?;
        let batch = stream.next_batch(1, self.catch_up.poll).await?;
        Ok(batch.events.is_empty())
    }
}

/// The streams whose workers one reconcile pass found behind ([`Recounter::worker_behind`]).
/// A stream found behind stays behind for the rest of the pass: each answer "behind" cost a
/// whole `catch_up.timeout` of waiting, so a pass over N definitions of a catching-up stream
/// waited N times that before they all deferred, and the pass interval stretched with it.
/// A stream found caught up is not kept: it is asked again, as a worker can fall behind
/// during a pass.
pub type FoundBehind = std::collections::BTreeSet<String>;

/// How far (seconds of cluster time) the worker's applied position may trail the server's
/// before [`Recounter::worker_behind`] waits for it: the server's position on a server without
/// `operationTime` has whole seconds, and a worker records its drained position after each
/// batch, so a worker that keeps up is always within this.
pub const RECORD_SLACK_SECS: u32 = 1;

/// Every event before this cluster time is applied: the checkpoint's event time (its event is
/// applied, so everything before it), or the last drained position.
///
/// Transactions: every event of one transaction has the same cluster time, so "before" must
/// stay strict: a checkpoint inside a transaction at `T` would not have applied all of `T`.
/// Checkpoints never are inside one (a batch ends only at a transaction's end, see
/// [`crate::core::txn`]); the strict rule keeps this safe even for a checkpoint an operator's
/// `replay` put there.
pub fn applied_before(checkpoint: &Checkpoint) -> Option<Timestamp> {
    checkpoint.token_time.max(checkpoint.caught_up_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_before_is_the_later_of_the_event_time_and_the_drained_position() {
        let t = |time| Some(Timestamp { time, increment: 0 });
        let c = |token_time, caught_up_at| Checkpoint {
            token_time: t(token_time),
            caught_up_at: t(caught_up_at),
            ..Checkpoint::default()
        };
        assert_eq!(applied_before(&c(10, 12)), t(12));
        assert_eq!(applied_before(&c(15, 12)), t(15));
        assert_eq!(applied_before(&Checkpoint::default()), None);
    }
}
