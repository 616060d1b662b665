//! [`CountingStore`]'s delegation of the concerns the worker writes: checkpoints, counters,
//! ledger and dirty set. Each call counts the statements it carries.

use super::*;

#[async_trait]
impl<S: Checkpoints> Checkpoints for CountingStore<S> {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        self.timed(Concern::Checkpoints, 0, self.inner.load_checkpoint(stream))
            .await
    }

    async fn record_intent(
        &self,
        fence: &Fence,
        batch: &PendingBatch,
        carried: Option<&PendingBatch>,
    ) -> StoreResult<()> {
        self.record(|| Write::Intent {
            fence: fence.clone(),
            batch: Box::new(batch.clone()),
            carried: carried.cloned().map(Box::new),
        });
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.record_intent(fence, batch, carried),
        )
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
        self.timed(
            Concern::Checkpoints,
            0,
            self.inner
                .load_carried(stream, carry, after, through, limit),
        )
        .await
    }

    async fn clear_carried(&self, fence: &Fence, carry: &Token) -> StoreResult<()> {
        self.record(|| Write::ClearCarried {
            fence: fence.clone(),
            carry: carry.clone(),
        });
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.clear_carried(fence, carry),
        )
        .await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        self.record(|| Write::Checkpoint {
            fence: fence.clone(),
            token: token.clone(),
            time: token_time,
        });
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.save_checkpoint(fence, token, token_time),
        )
        .await
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.move_checkpoint(stream, to),
        )
        .await
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.record(|| Write::Start {
            fence: fence.clone(),
            at,
        });
        self.timed(Concern::Checkpoints, 1, self.inner.record_start(fence, at))
            .await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.record(|| Write::CaughtUp {
            fence: fence.clone(),
            at,
        });
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.record_caught_up(fence, at),
        )
        .await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        self.timed(Concern::Checkpoints, 1, self.inner.record_gap(fence, gap))
            .await
    }

    async fn deployment(&self) -> StoreResult<Deployment> {
        self.timed(Concern::Checkpoints, 0, self.inner.deployment())
            .await
    }

    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.record_deployment(fence, deployment),
        )
        .await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.set_sweep_requested(stream, requested),
        )
        .await
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        self.record(|| Write::Adopt {
            fence: fence.clone(),
        });
        self.timed(Concern::Checkpoints, 1, self.inner.adopt_checkpoint(fence))
            .await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        self.timed(
            Concern::Checkpoints,
            1,
            self.inner.save_snapshot(fence, progress),
        )
        .await
    }
}

#[async_trait]
impl<S: Counters> Counters for CountingStore<S> {
    async fn write_counters(
        &self,
        fence: &Fence,
        writes: &[CounterWrite],
    ) -> StoreResult<ApplyOutcome> {
        self.record(|| Write::Counters {
            fence: fence.clone(),
            writes: writes.to_vec(),
        });
        self.timed(
            Concern::Counters,
            writes.len(),
            self.inner.write_counters(fence, writes),
        )
        .await
    }

    async fn read_counter(&self, post: &GroupValue) -> StoreResult<Option<CounterDoc>> {
        self.timed(Concern::Counters, 0, self.inner.read_counter(post))
            .await
    }

    async fn install_fold(
        &self,
        post: &GroupValue,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.timed(
            Concern::Counters,
            1,
            self.inner.install_fold(post, expected, fold, now),
        )
        .await
    }

    async fn posts_after(
        &self,
        after: Option<&GroupValue>,
        limit: usize,
    ) -> StoreResult<Vec<GroupValue>> {
        self.timed(Concern::Counters, 0, self.inner.posts_after(after, limit))
            .await
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<GroupValue>> {
        self.timed(Concern::Counters, 0, self.inner.sample_posts(n))
            .await
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        self.timed(
            Concern::Counters,
            writes.len(),
            self.inner.apply_snapshot_counters(fence, chunk, writes),
        )
        .await
    }
}

#[async_trait]
impl<S: Ledger> Ledger for CountingStore<S> {
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<LedgerView> {
        self.timed(
            Concern::Ledger,
            0,
            self.inner.read_ledger(stream, comments, generation),
        )
        .await
    }

    async fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, LedgerAt>> {
        self.timed(
            Concern::Ledger,
            0,
            self.inner.read_ledger_at(stream, comments, generation),
        )
        .await
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        self.record(|| Write::Ledger {
            fence: fence.clone(),
            updates: updates.to_vec(),
            through: through.clone(),
            generation,
        });
        self.timed(
            Concern::Ledger,
            updates.len(),
            self.inner.write_ledger(fence, updates, through, generation),
        )
        .await
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        self.timed(
            Concern::Ledger,
            rows.len(),
            self.inner.rebuild_ledger(stream, generation, rows),
        )
        .await
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        self.timed(
            Concern::Ledger,
            claims.len(),
            self.inner.claim_ledger(fence, claims, generation),
        )
        .await
    }
}

#[async_trait]
impl<S: DirtySet> DirtySet for CountingStore<S> {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        self.record(|| Write::Dirty {
            fence: fence.clone(),
            marks: marks.to_vec(),
            now,
        });
        self.timed(
            Concern::Dirty,
            marks.len(),
            self.inner.mark_dirty(fence, marks, now),
        )
        .await
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        self.timed(
            Concern::Dirty,
            0,
            self.inner.dirty_list(stream, order, limit),
        )
        .await
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        self.timed(Concern::Dirty, 0, self.inner.dirty_summary())
            .await
    }

    async fn clear_dirty(&self, post: &GroupValue, version: i64) -> StoreResult<bool> {
        self.timed(Concern::Dirty, 1, self.inner.clear_dirty(post, version))
            .await
    }

    async fn requeue_dirty(&self, post: &GroupValue, now: DateTime) -> StoreResult<bool> {
        self.timed(Concern::Dirty, 1, self.inner.requeue_dirty(post, now))
            .await
    }
}
