//! The simulation's change stream: the in-process store's oplog read through a cursor, with the
//! waits, "nothing new" answers and stops that let every round of actors end.

use std::time::Duration;

use async_trait::async_trait;
use counterd::core::cost::ReadLimit;
use counterd::store::memory::{drained_token, Cursor};
use counterd::store::{EventSource, RawBatch, StoreResult};
use rand::Rng;

use super::faults::drained_answer;
use super::{Broken, SimStore, State, YieldOnce};

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
    /// Not read yet: its first read may answer "nothing new" while events wait, as the fake
    /// test server's did, loaded, after a reopen (with no post-batch token).
    pub(super) fresh: bool,
}

/// Probability that a stream's first read answers nothing while events wait.
const EMPTY_FIRST_READS: f64 = 0.1;

/// The drained answer, noted in the trace.
fn drained(s: &mut State, why: &str) -> RawBatch {
    let last = s.memory.oplog.last().map_or(0, |e| e.seq);
    s.note(format!(
        "  read: none{why}, post-batch {}",
        drained_token(last)
    ));
    s.memory.drained_batch()
}

impl SimEvents {
    /// Ends this stream's worker: requests its shutdown and never answers, so its session ends
    /// (`Ok`) on the shutdown it awaits beside the read. Not an answer of "nothing new": with
    /// events waiting, that would be a drained position the worker trusts and records.
    async fn stop(&self, why: &str) -> StoreResult<RawBatch> {
        {
            let mut s = self.store.lock();
            s.stat(why);
            s.note_budget_waiters();
        }
        let worker = self.store.worker.as_ref();
        worker
            .expect("only workers read the simulation's change stream")
            .request();
        std::future::pending().await
    }

    /// One read: events, "nothing new", a fault, or the end of the worker's run.
    async fn answer(&mut self, limit: ReadLimit) -> Read {
        let strike = self.store.enter("next_batch", None, false).await;
        {
            let mut s = self.store.lock();
            if s.read_budget == Some(0) {
                return Read::Stop("pause budget");
            }
            if let Some((_, e)) = strike {
                return Read::Answer(Err(e));
            }
            if let Some(lost) = self.cursor.history_lost() {
                s.stat("history lost");
                return Read::Answer(Err(lost));
            }
        }
        if std::mem::take(&mut self.fresh) {
            let mut s = self.store.lock();
            if s.memory.available(&self.cursor) > 0 && s.rng.random_bool(EMPTY_FIRST_READS) {
                s.stat("empty first read while events wait");
                s.note("  read: none (first read of the stream, events waiting)".into());
                return Read::Answer(Ok(RawBatch::default()));
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
                    return Read::Answer(Ok(RawBatch::default()));
                } else if s.others_running == 0 {
                    // Only workers are left, all caught up: this one stops, so that the last
                    // can take its idle turn alone.
                    return Read::Stop("pause caught up");
                } else if drained_answer(&mut s) {
                    s.gaps_in_a_row = 0;
                    s.stat("drained answer while others run");
                    return Read::Answer(Ok(drained(&mut s, " (others run)")));
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
            return Read::Answer(Ok(RawBatch::default()));
        }
        if available == 0 {
            if self.idled {
                return Read::Stop("pause caught up");
            }
            // Caught up and alone: answer "nothing new" with the post-batch token, and tell the
            // worker to stop after it has checkpointed it.
            self.idled = true;
            let batch = drained(&mut s, "");
            s.stat("stop caught up");
            s.note_budget_waiters();
            for trigger in &s.shutdown {
                trigger.request();
            }
            return Read::Answer(Ok(batch));
        }
        let most = limit.events.min(available).min(s.read_max).max(1);
        let asked = s.rng.random_range(1..=most);
        let next = self.cursor.next;
        let whole_transactions = s.broken != Broken::CutTransactions;
        let batch = s.memory.read_events_cut(
            &mut self.cursor,
            ReadLimit {
                events: asked,
                ..limit
            },
            whole_transactions,
        );
        let n = batch.events.len();
        if n == 0 {
            // The memory budget: the first event did not fit what the reader holds.
            s.stat("read cut to nothing by the budget");
            s.note("  read: none (over the budget)".into());
            return Read::Answer(Ok(batch));
        }
        if n < asked {
            s.stat("read cut by the budget");
        }
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
        if let Some(budget) = s.read_budget.as_mut() {
            *budget = budget.saturating_sub(1);
        }
        Read::Answer(Ok(batch))
    }
}

/// What a read comes to.
enum Read {
    Answer(StoreResult<RawBatch>),
    /// The worker's run ends here (why, for the coverage statistics).
    Stop(&'static str),
}

#[async_trait]
impl EventSource for SimEvents {
    async fn read(&mut self, limit: ReadLimit, _max_wait: Duration) -> StoreResult<RawBatch> {
        if limit.events == 0 {
            return Ok(RawBatch::default());
        }
        match self.answer(limit).await {
            Read::Answer(answer) => answer,
            Read::Stop(why) => self.stop(why).await,
        }
    }
}
