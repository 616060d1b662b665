//! [`CountingStore`]'s delegation of the other concerns: truth counts, leases, run history.

use super::*;
use crate::core::num::Num;

counted! {
    impl Truth as Truth {
        count_live_below(post: &GroupValue, watermark: i64) -> Num, 0, queries 1;
        live_ids_below(post: &GroupValue, watermark: i64, at_most: usize)
            -> Option<Vec<CommentId>>, 0, queries 1;
        live_ids_below_each(wanted: &[(GroupValue, i64)], at_most: usize)
            -> Option<Vec<Vec<CommentId>>>, 0, queries wanted.len();
        latest_created(post: &GroupValue) -> Option<i64>, 0, queries 1;
        count_live(post: &GroupValue) -> Num, 0;
        rows_of_post(post: &GroupValue) -> Vec<(CommentId, Row)>, 0;
        comments_extent() -> CommentsExtent, 0;
        rows_after(after: Option<&CommentId>, last: &CommentId, limit: usize)
            -> Vec<(CommentId, Row)>, 0;
    }

    async fn count_live_below_at(
        &self,
        post: &GroupValue,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<Num>> {
        let call = self.inner.count_live_below_at(post, watermark, at);
        let counted = self.tallies.timed(Concern::Truth, 0, call).await;
        // `None`: the store has no snapshot reads here and issued no count.
        if matches!(counted, Ok(Some(_))) {
            self.count_query_of(1);
        }
        counted
    }
}

counted! {
    impl Leases as Leases {
        read_lease(stream: &str) -> Option<Lease>, 0;
        acquire_lease(stream: &str, owner: &str, ttl: Duration, now: DateTime) -> Option<i64>, 1;
        renew_lease(stream: &str, owner: &str, epoch: i64, ttl: Duration, now: DateTime) -> bool, 1;
        seize_lease(stream: &str, owner: &str, ttl: Duration, now: DateTime) -> i64, 1;
        release_lease(stream: &str, owner: &str, epoch: i64) -> (), 1;
    }
}

counted! {
    impl RunHistory as Runs {
        record_run(run: &RunSummary) -> (), 1;
        last_run() -> Option<RunSummary>, 0;
        load_sweep_cursor(stream: &str) -> Option<SweepCursor>, 0;
        save_sweep_cursor(stream: &str, cursor: &SweepCursor) -> (), 1;
    }
}
