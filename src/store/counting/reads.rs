//! [`CountingStore`]'s delegation of the other concerns: truth counts, leases, run history.

use super::*;
use crate::core::num::Num;

#[async_trait]
impl<S: Truth> Truth for CountingStore<S> {
    async fn count_live_below(&self, post: &GroupValue, watermark: i64) -> StoreResult<Num> {
        self.count_query();
        self.timed(
            Concern::Truth,
            0,
            self.inner.count_live_below(post, watermark),
        )
        .await
    }

    async fn live_ids_below(
        &self,
        post: &GroupValue,
        watermark: i64,
        at_most: usize,
    ) -> StoreResult<Option<Vec<CommentId>>> {
        self.count_query();
        self.timed(
            Concern::Truth,
            0,
            self.inner.live_ids_below(post, watermark, at_most),
        )
        .await
    }

    async fn live_ids_below_each(
        &self,
        wanted: &[(GroupValue, i64)],
        at_most: usize,
    ) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
        self.count_query_of(wanted.len());
        self.timed(
            Concern::Truth,
            0,
            self.inner.live_ids_below_each(wanted, at_most),
        )
        .await
    }

    async fn count_live_below_at(
        &self,
        post: &GroupValue,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<Num>> {
        let call = self.inner.count_live_below_at(post, watermark, at);
        let counted = self.timed(Concern::Truth, 0, call).await;
        // `None`: the store has no snapshot reads here and issued no count.
        if matches!(counted, Ok(Some(_))) {
            self.count_query();
        }
        counted
    }

    async fn latest_created(&self, post: &GroupValue) -> StoreResult<Option<i64>> {
        self.count_query();
        self.timed(Concern::Truth, 0, self.inner.latest_created(post))
            .await
    }

    async fn count_live(&self, post: &GroupValue) -> StoreResult<Num> {
        self.timed(Concern::Truth, 0, self.inner.count_live(post))
            .await
    }

    async fn rows_of_post(&self, post: &GroupValue) -> StoreResult<Vec<(CommentId, Row)>> {
        self.timed(Concern::Truth, 0, self.inner.rows_of_post(post))
            .await
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        self.timed(Concern::Truth, 0, self.inner.comments_extent())
            .await
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        self.timed(Concern::Truth, 0, self.inner.rows_after(after, last, limit))
            .await
    }
}

#[async_trait]
impl<S: Leases> Leases for CountingStore<S> {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        self.timed(Concern::Leases, 0, self.inner.read_lease(stream))
            .await
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        self.timed(
            Concern::Leases,
            1,
            self.inner.acquire_lease(stream, owner, ttl, now),
        )
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
        self.timed(
            Concern::Leases,
            1,
            self.inner.renew_lease(stream, owner, epoch, ttl, now),
        )
        .await
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        self.timed(
            Concern::Leases,
            1,
            self.inner.seize_lease(stream, owner, ttl, now),
        )
        .await
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.timed(
            Concern::Leases,
            1,
            self.inner.release_lease(stream, owner, epoch),
        )
        .await
    }
}

#[async_trait]
impl<S: RunHistory> RunHistory for CountingStore<S> {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        self.timed(Concern::Runs, 1, self.inner.record_run(run))
            .await
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        self.timed(Concern::Runs, 0, self.inner.last_run()).await
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        self.timed(Concern::Runs, 0, self.inner.load_sweep_cursor(stream))
            .await
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        self.timed(
            Concern::Runs,
            1,
            self.inner.save_sweep_cursor(stream, cursor),
        )
        .await
    }
}
