//! The seam's traits for [`SimStore`]: each call passes through the simulation's hooks
//! (`faults.rs`) to the in-process store, statement by statement for multi-statement writes.
//! The `broken` variants bend what is passed on; stats and the trace record what happened.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use counterd::core::num::Num;

use async_trait::async_trait;
use bson::{DateTime, Timestamp};
use counterd::core::batch::PendingBatch;
use counterd::core::batch::{CounterDelta, CounterWrite, DirtyMark};
use counterd::core::deployment::Deployment;
use counterd::core::event::{CommentId, Row, Token};
use counterd::core::event::{LedgerUpdate, LedgerView};
use counterd::core::fold::Fold;
use counterd::core::key::GroupValue;
use counterd::core::window::LedgerAt;
use counterd::store::prelude::*;
use counterd::store::{
    ApplyOutcome, Checkpoint, CommentsExtent, CounterDoc, DirtyEntry, DirtyOrder, DirtySummary,
    EventSource, Fence, Gap, Lease, Position, RunSummary, ServerNow, SnapshotProgress,
    SnapshotState, StoreError, StoreResult, StreamOptions, SweepCursor,
};

use super::events::SimEvents;
use super::{Broken, SimStore, State};
use counterd::core::key::CounterIx;

/// How a trace line names a counter definition: nothing for the default, `#n/` for another.
fn definition(counter: CounterIx) -> String {
    match counter {
        CounterIx::DEFAULT => String::new(),
        CounterIx(n) => format!("#{n}/"),
    }
}

impl State {
    /// One statement of `write_counters`, as the variant under test applies it.
    fn apply_counter(&mut self, fence: &Fence, w: &CounterWrite) -> bool {
        let mut w = Cow::Borrowed(w);
        if self.broken == Broken::UnconditionedRecount {
            w.to_mut().touched.clear(); // no touched buckets recorded
        }
        if self.broken == Broken::WindowIgnored {
            for touch in &mut w.to_mut().log {
                touch.comments = Some(Vec::new()); // the log names no changed row
            }
        }
        // No guard: the counter's `applied_through` is forgotten for this statement (and put
        // back if the fence refused it anyway).
        let forgotten = match self.broken {
            Broken::NoGuard => self
                .memory
                .tables_mut(w.key.counter)
                .and_then(|t| t.counters.get_mut(&w.key.group))
                .and_then(|c| c.writers.get_mut(&0)?.applied_through.take()),
            _ => None,
        };
        let applied = self.memory.apply_counter(fence, &w);
        let after = self.memory.tables_mut(w.key.counter);
        if let (false, Some(c)) = (
            applied,
            after.and_then(|t| t.counters.get_mut(&w.key.group)),
        ) {
            let own = c.writers.entry(0).or_default();
            own.applied_through = own.applied_through.take().or(forgotten);
        }
        let outcome = if applied { "" } else { ": already applied" };
        let line = format!(
            "  counter {}{} {:+} {:?} at {} (epoch {}){outcome}",
            definition(w.key.counter),
            w.key.group,
            w.delta,
            w.buckets,
            w.through,
            fence.epoch,
        );
        self.note(line);
        if applied {
            self.shadow_add(w.key.counter, &w.key.group, &w.buckets);
        }
        applied
    }
}

#[async_trait]
impl ChangeStreams for SimStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let cursor = self
            .single("open_stream", false, |s| s.memory.open_cursor(&options))
            .await?;
        let line = format!(
            "  open stream at {:?} (index {})",
            options.start, cursor.next
        );
        self.lock().note(line);
        Ok(Box::new(SimEvents {
            store: self.clone(),
            cursor,
            idled: false,
            snapshot_waits: 0,
            fresh: true,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        self.single("read_position", false, |s| {
            Ok(if s.broken == Broken::UnconditionedRecount {
                // Always "applied": the recount never waits for the stream.
                let zero = Timestamp {
                    time: 0,
                    increment: 0,
                };
                ServerNow {
                    lower: zero,
                    upper: zero,
                }
            } else {
                s.memory.read_position()
            })
        })
        .await
    }

    async fn look_up(
        &self,
        comments: &[CommentId],
    ) -> StoreResult<HashMap<String, bson::Document>> {
        let rows = self
            .single("look_up", false, |s| Ok(s.memory.look_up(comments)))
            .await?;
        let line = format!("  look up {} rows ({} found)", comments.len(), rows.len());
        self.lock().note(line);
        Ok(rows)
    }
}

#[async_trait]
impl Checkpoints for SimStore {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        self.single("load_checkpoint", false, |s| {
            s.memory.load_checkpoint(stream)
        })
        .await
    }

    async fn record_intent(
        &self,
        fence: &Fence,
        batch: &PendingBatch,
        carried: Option<&PendingBatch>,
    ) -> StoreResult<()> {
        self.single("record_intent", true, |s| {
            let (end, counters) = (&batch.end, batch.counters.len());
            match carried {
                Some(carried) => {
                    s.note(format!(
                        "  intent {end} (its {} counters stored under carry {}; epoch {})",
                        carried.counters.len(),
                        batch.carry.as_ref().map_or("?", |c| c.as_str()),
                        fence.epoch
                    ));
                }
                None => s.note(format!(
                    "  intent {end} ({counters} counters; epoch {})",
                    fence.epoch
                )),
            }
            if batch.carry.as_ref().is_some_and(|c| c != end) {
                // It joins a carry that an earlier batch opened.
                s.stat("counters carried across batches");
            }
            s.check_batch_end(end);
            s.memory.record_intent(fence, batch, carried)
        })
        .await
    }

    async fn load_carried(
        &self,
        stream: &str,
        carry: &Token,
        after: Option<&Token>,
        through: &Token,
        limit: usize,
    ) -> StoreResult<Vec<PendingBatch>> {
        self.single("load_carried", false, |s| {
            let carried = s
                .memory
                .load_carried(stream, carry, after, through, limit)?;
            s.note(format!(
                "  load carried {carry} through {through}: {} batches",
                carried.len()
            ));
            if !carried.is_empty() {
                s.stat("carried counters re-applied by a restart");
            }
            if after.is_some() && !carried.is_empty() {
                s.stat("carried batches re-read in pages");
            }
            Ok(carried)
        })
        .await
    }

    async fn clear_carried(&self, fence: &Fence, through: &Token) -> StoreResult<()> {
        self.single("clear_carried", true, |s| {
            s.note(format!("  clear carried {through} (epoch {})", fence.epoch));
            s.memory.clear_carried(fence, through)
        })
        .await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        self.single("save_checkpoint", true, |s| {
            s.note(format!("  checkpoint {token}"));
            s.check_batch_end(token);
            s.memory.save_checkpoint(fence, token, token_time)
        })
        .await
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        self.single("move_checkpoint", true, |s| {
            s.memory.move_checkpoint(stream, to)
        })
        .await
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.single("record_start", true, |s| {
            s.note(format!("  start pinned at {at:?}"));
            s.memory.record_start(fence, at)
        })
        .await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.single("record_caught_up", true, |s| {
            s.note(format!("  drained at {at:?}"));
            s.memory.record_caught_up(fence, at)?;
            // A worker's claim (the harness records its own where it knows nothing is in
            // flight, `record_drained`): every event before `at` is applied.
            let unapplied = s.first_unapplied(&fence.stream).filter(|e| e.time < at);
            if let Some(e) = unapplied.filter(|_| s.workers_running > 0) {
                let failure = format!(
                    "{} recorded its stream drained before {at:?}, but event {} (at {:?}) is not applied",
                    fence.stream, e.seq, e.time
                );
                s.probe_failures.push(failure);
            }
            Ok(())
        })
        .await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        self.single("record_gap", true, |s| {
            s.note(format!("  gap recorded from {:?}", gap.from));
            s.gaps_in_a_row += 1;
            if s.gaps_in_a_row > 10 {
                return Err(StoreError::Fatal {
                    op: "record the history gap",
                    message: "the worker recorded 10 history gaps in a row without reading anything: it restarts at a position that is itself lost, in a hot loop".into(),
                });
            }
            s.memory.record_gap(fence, gap)
        })
        .await
    }

    /// Like the fake test server without `serverStatus`: nothing identifies the deployment
    /// (and no store call is made, so the simulation's interleavings are unchanged).
    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        self.single("record_deployment", true, |s| {
            s.memory.record_deployment(fence, deployment)
        })
        .await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.single("set_sweep_requested", true, |s| {
            s.memory.set_sweep_requested(stream, requested)
        })
        .await
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        self.single("adopt_checkpoint", true, |s| {
            s.note(format!("  adopt epoch {}", fence.epoch));
            s.memory.adopt_checkpoint(fence)
        })
        .await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        self.single("save_snapshot", true, |s| {
            s.note(format!(
                "  snapshot {:?}: {} chunks, pending {:?}",
                progress.state,
                progress.chunks_done,
                progress.pending.as_ref().map(|c| c.number)
            ));
            let old = s.memory.checkpoints.get(&fence.stream);
            let old = old.and_then(|c| c.doc.snapshot.clone());
            let was = |f: fn(&SnapshotProgress) -> u64| old.as_ref().map_or(0, f);
            if progress.pending.is_some() && old.as_ref().is_none_or(|o| o.pending.is_none()) {
                s.stat("snapshot chunk planned");
            }
            if progress.chunks_resumed > was(|p| p.chunks_resumed) {
                s.stat("snapshot chunk finished after a restart");
            }
            if progress.chunks_reread > was(|p| p.chunks_reread) {
                s.stat("snapshot chunk read again after a restart");
            }
            if progress.state == SnapshotState::Done {
                s.stat("snapshot done");
            }
            s.memory.save_snapshot(fence, progress)
        })
        .await
    }
}

#[async_trait]
impl Counters for SimStore {
    async fn write_counters(
        &self,
        fence: &Fence,
        writes: &[CounterWrite],
    ) -> StoreResult<ApplyOutcome> {
        let mut applied = Vec::new();
        self.statements("apply_counters", writes, |s, w| {
            if w.log.len() > 1 {
                s.stat("counter written for several batches at once");
            }
            applied.push(s.apply_counter(fence, w));
        })
        .await?;
        Ok(ApplyOutcome::count(applied))
    }

    async fn read_counter(&self, post: &GroupValue) -> StoreResult<Option<CounterDoc>> {
        let counter = self.counter;
        self.single("read_counter", false, |s| {
            Ok(s.memory.read_counter(counter, post))
        })
        .await
    }

    async fn install_fold(
        &self,
        post: &GroupValue,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        let counter = self.counter;
        self.single("install_fold", true, |s| {
            let mut installing = Cow::Borrowed(fold);
            if let (Broken::SeedFold, Some(expected)) = (s.broken, expected) {
                // The seed's formula: base' = C, live' = live - (base' - base).
                let was = &expected.state;
                installing.to_mut().live_delta =
                    was.live_delta - (fold.base_count - was.base_count);
            }
            let installed = s
                .memory
                .install_fold(counter, post, expected, &installing, now);
            // Drift bookkeeping (injections, corrections) is the default definition's; the
            // others are checked against the truth directly, and nothing is injected into
            // their counters: a fold there that corrects drift invented it.
            if installed && counter == CounterIx::DEFAULT {
                s.installed(post, fold);
            } else if installed && fold.wrong.differs(fold.right) {
                s.stat("fold of another definition corrected drift");
                if s.drift_bounds && !s.memory.has_gaps() {
                    let e = format!(
                        "definition #{}: a fold corrected {post} by {:+}, but no drift was injected there (the reconciler invented drift, or an event was counted twice or never)",
                        counter.0, fold.drift
                    );
                    s.note(format!("  !! {e}"));
                    s.probe_failures.push(e);
                }
            } else if installed {
                s.stat("fold of another definition installed");
            }
            let post = format!("{}{post}", definition(counter));
            if installed {
                let (was, new) = (fold.wrong, fold.right);
                let how = if expected.is_some() {
                    format!("{was} -> {new}")
                } else {
                    format!("(new) {new}")
                };
                s.note(format!("  fold {post}: {how} at W={}", fold.watermark));
            } else {
                s.note(format!("  fold {post}: raced"));
            }
            Ok(installed)
        })
        .await
    }

    async fn posts_after(
        &self,
        after: Option<&GroupValue>,
        limit: usize,
    ) -> StoreResult<Vec<GroupValue>> {
        let counter = self.counter;
        self.single("posts_after", false, |s| {
            Ok(s.memory.posts_after(counter, after, limit))
        })
        .await
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<GroupValue>> {
        let counter = self.counter;
        self.single("sample_posts", false, |s| {
            Ok(s.memory.sample_posts(counter, n))
        })
        .await
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        let mut applied = Vec::new();
        self.statements("apply_snapshot_counters", writes, |s, w| {
            let landed = s.memory.apply_snapshot_counter(fence, chunk, w);
            if landed {
                s.shadow_add(w.key.counter, &w.key.group, &w.buckets);
                let line = format!(
                    "  counter {}{} {:+} from snapshot chunk {chunk}",
                    definition(w.key.counter),
                    w.key.group,
                    w.delta
                );
                s.note(line);
            } else {
                s.stat("snapshot increment already applied");
            }
            applied.push(landed);
        })
        .await?;
        Ok(ApplyOutcome::count(applied))
    }
}

#[async_trait]
impl Ledger for SimStore {
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<LedgerView> {
        self.single("read_ledger", false, |s| {
            Ok(s.memory.read_ledger(stream, comments, generation))
        })
        .await
    }

    async fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, LedgerAt>> {
        self.single("read_ledger_at", false, |s| {
            s.stat("recount settled rows changed in its window");
            Ok(s.memory.read_ledger_at(stream, comments, generation))
        })
        .await
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        let (mut written, mut refused) = (Vec::new(), Vec::new());
        let result = self
            .statements("write_ledger", updates, |s, u| {
                let landed = s.memory.write_ledger_entry(fence, u, through, generation);
                let key = u.comment.key.clone();
                if landed {
                    written.push(key);
                } else {
                    refused.push(key);
                }
            })
            .await;
        if !(written.is_empty() && refused.is_empty()) {
            self.lock().note(format!(
                "  ledger through {through} (epoch {}): written [{}], refused [{}]",
                fence.epoch,
                written.join(" "),
                refused.join(" ")
            ));
        }
        result
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        self.statements("rebuild_ledger", rows, |s, (comment, row)| {
            if s.memory
                .rebuild_ledger_entry(stream, generation, comment, row)
            {
                s.stat("ledger entry rebuilt");
                s.note(format!("  ledger {} rebuilt: {row:?}", comment.key));
            }
        })
        .await
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        self.statements("claim_ledger", claims, |s, c| {
            let Some(row) = &c.state else { return };
            if s.memory.claim_ledger_entry(fence, c, generation) {
                s.note(format!("  ledger {} claimed: {row:?}", c.comment.key));
            } else {
                s.stat("snapshot claim found the stream's entry");
            }
        })
        .await
    }
}

#[async_trait]
impl DirtySet for SimStore {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        self.statements("mark_dirty", marks, |s, m| {
            s.memory.mark_dirty_one(fence, m, now)
        })
        .await
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        let counter = self.counter;
        self.single("dirty_list", false, |s| {
            Ok(s.memory.dirty_list(counter, stream, order, limit))
        })
        .await
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        let counter = self.counter;
        self.single("dirty_summary", false, |s| {
            Ok(s.memory.dirty_summary(counter))
        })
        .await
    }

    async fn clear_dirty(&self, post: &GroupValue, version: i64) -> StoreResult<bool> {
        let counter = self.counter;
        self.single("clear_dirty", true, |s| {
            Ok(s.memory.clear_dirty(counter, post, version))
        })
        .await
    }

    async fn requeue_dirty(&self, post: &GroupValue, now: DateTime) -> StoreResult<bool> {
        let counter = self.counter;
        self.single("requeue_dirty", true, |s| {
            Ok(s.memory.requeue_dirty(counter, post, now))
        })
        .await
    }
}

#[async_trait]
impl Truth for SimStore {
    async fn count_live_below(&self, post: &GroupValue, watermark: i64) -> StoreResult<Num> {
        let counter = self.counter;
        self.single("count_live_below", false, |s| {
            Ok(s.memory.count_live_below(counter, post, watermark))
        })
        .await
    }

    async fn live_ids_below(
        &self,
        post: &GroupValue,
        watermark: i64,
        at_most: usize,
    ) -> StoreResult<Option<Vec<CommentId>>> {
        let counter = self.counter;
        self.single("live_ids_below", false, |s| {
            let ids = s.memory.live_ids_below(counter, post, watermark, at_most);
            if ids.is_none() {
                s.stat("recount by count alone");
            }
            Ok(ids)
        })
        .await
    }

    async fn latest_created(&self, post: &GroupValue) -> StoreResult<Option<i64>> {
        let counter = self.counter;
        self.single("latest_created", false, |s| {
            Ok(s.memory.latest_created(counter, post))
        })
        .await
    }

    async fn count_live(&self, post: &GroupValue) -> StoreResult<Num> {
        let counter = self.counter;
        self.single("count_live", false, |s| {
            Ok(s.memory.count_live(counter, post))
        })
        .await
    }

    async fn rows_of_post(&self, post: &GroupValue) -> StoreResult<Vec<(CommentId, Row)>> {
        let counter = self.counter;
        self.single("rows_of_post", false, |s| {
            Ok(s.memory.rows_of_post(counter, post))
        })
        .await
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        self.single("comments_extent", false, |s| Ok(s.memory.comments_extent()))
            .await
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        self.single("rows_after", false, |s| {
            if limit < s.snapshot_chunk_rows {
                s.stat("snapshot chunk cut by the budget");
            }
            Ok(s.memory.rows_after(after, last, limit))
        })
        .await
    }
}

#[async_trait]
impl Leases for SimStore {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        self.single("read_lease", false, |s| Ok(s.memory.read_lease(stream)))
            .await
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        self.single("acquire_lease", true, |s| {
            Ok(s.memory.acquire_lease(stream, owner, ttl, now))
        })
        .await
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.single("renew_lease", true, |s| {
            Ok(s.memory.renew_lease(stream, owner, epoch, ttl, now))
        })
        .await
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        self.single("seize_lease", true, |s| {
            Ok(s.memory.seize_lease(stream, owner, ttl, now))
        })
        .await
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.single("release_lease", true, |s| {
            s.memory.release_lease(stream, owner, epoch);
            Ok(())
        })
        .await
    }
}

#[async_trait]
impl RunHistory for SimStore {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        self.single("record_run", true, |s| {
            s.memory.record_run(run);
            Ok(())
        })
        .await
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        self.single("last_run", false, |s| Ok(s.memory.last_run()))
            .await
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        self.single("load_sweep_cursor", false, |s| {
            Ok(s.memory.load_sweep_cursor(stream))
        })
        .await
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        self.single("save_sweep_cursor", true, |s| {
            s.memory.save_sweep_cursor(stream, cursor);
            Ok(())
        })
        .await
    }
}
