//! The simulation's change stream: the in-process store's oplog read through a cursor, with the
//! waits, "nothing new" answers and pauses that let every round of actors end.

use std::time::Duration;

use async_trait::async_trait;
use counterd::store::memory::{drained_token, Cursor};
use counterd::store::{EventSource, RawBatch, StoreError, StoreResult};
use rand::Rng;

use super::faults::{drained_answer, PAUSE};
use super::{SimStore, State, YieldOnce};

/// At most this many "nothing new" answers while a snapshot runs, per opened stream.
const SNAPSHOT_WAITS: u32 = 200;

/// An open change stream of the simulation.
pub(super) struct SimEvents {
    pub(super) store: SimStore,
    pub(super) cursor: Cursor,
    /// This stream has answered "nothing new" once while its worker ran alone.
    pub(super) idled: bool,
    /// "Nothing new" answers given instead of stopping because some stream's initial snapshot
    /// runs (bounded: the snapshot may be another partition's, whose worker is not running).
    pub(super) snapshot_waits: u32,
}

/// The error that ends a worker's run.
fn pause(s: &mut State, why: &str) -> StoreError {
    s.stat(why);
    StoreError::Fatal {
        op: "next_batch",
        message: PAUSE.into(),
    }
}

/// The drained answer, noted in the trace.
fn drained(s: &mut State, why: &str) -> RawBatch {
    let last = s.memory.oplog.last().map_or(0, |e| e.seq);
    s.note(format!(
        "  read: none{why}, post-batch {}",
        drained_token(last)
    ));
    s.memory.drained_batch()
}

#[async_trait]
impl EventSource for SimEvents {
    async fn next_batch(&mut self, max: usize, _max_wait: Duration) -> StoreResult<RawBatch> {
        let strike = self.store.enter("next_batch", None, false).await;
        {
            let mut s = self.store.lock();
            if s.read_budget == Some(0) {
                return Err(pause(&mut s, "pause budget"));
            }
            if let Some((_, e)) = strike {
                return Err(e);
            }
            if let Some(lost) = self.cursor.history_lost() {
                s.stat("history lost");
                return Err(lost);
            }
        }
        // Like an awaitData getMore: while writers may still write, wait for events, or now and
        // then answer "nothing new" (the worker then records its drained position).
        loop {
            let wait = {
                let mut s = self.store.lock();
                if s.memory.available(&self.cursor) > 0 || s.alone() {
                    false
                } else if s.others_running == 0
                    && s.memory.snapshot_running()
                    && self.snapshot_waits < SNAPSHOT_WAITS
                {
                    self.snapshot_waits += 1;
                    s.note("  read: none (a snapshot runs)".into());
                    return Ok(RawBatch::default());
                } else if s.others_running == 0 {
                    // Only workers are left, all caught up: this one stops, so that the last
                    // can take its idle turn alone.
                    return Err(pause(&mut s, "pause caught up"));
                } else if drained_answer(&mut s) {
                    s.gaps_in_a_row = 0;
                    s.stat("drained answer while others run");
                    return Ok(drained(&mut s, " (others run)"));
                } else {
                    true
                }
            };
            if !wait {
                break;
            }
            YieldOnce(false).await;
        }
        let mut s = self.store.lock();
        s.gaps_in_a_row = 0;
        let available = s.memory.available(&self.cursor);
        if available == 0 && s.memory.snapshot_running() && self.snapshot_waits < SNAPSHOT_WAITS {
            self.snapshot_waits += 1;
            // Not caught up until the initial snapshot is done: the worker takes a chunk
            // between reads.
            s.note("  read: none (a snapshot runs)".into());
            return Ok(RawBatch::default());
        }
        if available == 0 {
            if self.idled {
                return Err(pause(&mut s, "pause caught up"));
            }
            // Caught up and alone: answer "nothing new" with the post-batch token, and tell the
            // worker to stop after it has checkpointed it.
            self.idled = true;
            let batch = drained(&mut s, "");
            s.stat("stop caught up");
            for tx in &s.shutdown {
                tx.send_replace(true);
            }
            return Ok(batch);
        }
        let limit = max.min(available).min(s.read_max).max(1);
        let n = s.rng.random_range(1..=limit);
        let next = self.cursor.next;
        let what: Vec<String> = s.memory.oplog[next..next + n]
            .iter()
            .map(|e| {
                // `~`: the pre-image expired (when pre-images are asked for).
                let expired = if self.cursor.pre_images && e.pre_expired {
                    "~"
                } else {
                    ""
                };
                let tail = &e.token[e.token.len() - 2..];
                format!("{tail} {} {}{expired}", e.kind.name(), e.id)
            })
            .collect();
        s.note(format!("  read: {}", what.join(", ")));
        let batch = s.memory.read_events(&mut self.cursor, n);
        if let Some(budget) = s.read_budget.as_mut() {
            *budget = budget.saturating_sub(1);
        }
        Ok(batch)
    }
}
