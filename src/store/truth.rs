//! Counts and reads of the application's source collection ([`Truth`]).

use async_trait::async_trait;
use bson::Timestamp;

use super::counters::Counters;
use super::error::StoreResult;
use crate::core::event::{CommentId, Row};
use crate::core::key::GroupValue;
use crate::core::num::Num;

/// Reads of the application's own `comments` collection: the truth the counters are checked
/// against.
#[async_trait]
pub trait Truth: Send + Sync {
    /// Live rows of `post` whose `created_at` is not `>= watermark` (seconds): their number,
    /// or for a sum definition their field's `$sum`.
    async fn count_live_below(&self, post: &GroupValue, watermark: i64) -> StoreResult<Num>;

    /// The ids of the rows [`Truth::count_live_below`] counts (the same filter): a row-level
    /// recount settles the ones that changed while it read (see [`crate::core::window`]).
    /// `None` when there are more than `at_most` (the recount's share of the memory budget):
    /// the read stops there rather than hold ids in proportion to a post's rows. Always `None`
    /// for a sum definition: its recount is the server's `$sum` alone (settled as a snapshot
    /// count is: it holds while nothing below the watermark changed meanwhile).
    async fn live_ids_below(
        &self,
        post: &GroupValue,
        watermark: i64,
        at_most: usize,
    ) -> StoreResult<Option<Vec<CommentId>>>;

    /// [`Truth::live_ids_below`] for several posts, each with its own watermark, in one read
    /// where the store can: the ids of each post's rows, in the order asked, or `None` when
    /// they are more than `at_most` together. (Here: one read per post.)
    async fn live_ids_below_each(
        &self,
        wanted: &[(GroupValue, i64)],
        at_most: usize,
    ) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
        live_ids_below_one_by_one(self, wanted, at_most).await
    }

    /// The same count as of cluster time `at` (a snapshot read), on servers whose snapshot
    /// reads were detected for real. `None`: no snapshot reads here (the default: the in-process
    /// store has none, like the fake test server), or `at` is older than the server's snapshot
    /// window; the caller falls back to the row-level recount.
    async fn count_live_below_at(
        &self,
        _post: &GroupValue,
        _watermark: i64,
        _at: Timestamp,
    ) -> StoreResult<Option<Num>> {
        Ok(None)
    }

    /// Seconds of the latest `created_at` among all rows of `post`, live or not (`None`: no
    /// dated row). Used by the sweep after lost history to fold above every known row.
    async fn latest_created(&self, post: &GroupValue) -> StoreResult<Option<i64>>;

    /// All live rows of `post` (for `get` and `verify`): their number, or a sum's `$sum`.
    async fn count_live(&self, post: &GroupValue) -> StoreResult<Num>;

    /// Every row of `post` as it is now, live or not, with its comment id: the sweep after
    /// lost history rebuilds their ledger entries.
    async fn rows_of_post(&self, post: &GroupValue) -> StoreResult<Vec<(CommentId, Row)>>;

    /// The largest `_id` of `comments` and its estimated size.
    async fn comments_extent(&self) -> StoreResult<CommentsExtent>;

    /// Up to `limit` rows with `_id` after `after` and at most `last`, in `_id` order (rows of
    /// another BSON type than `last`'s are outside the range: see `crate::snapshot`).
    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>>;
}

/// [`Truth::live_ids_below_each`] as one read per post, the room left shrinking with each
/// (`None` once the ids together are more than `at_most`): the default, and a store's fallback
/// where one read cannot serve the group.
pub async fn live_ids_below_one_by_one<T: Truth + ?Sized>(
    store: &T,
    wanted: &[(GroupValue, i64)],
    at_most: usize,
) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
    let mut reads = Vec::with_capacity(wanted.len());
    let mut room = at_most;
    for (post, watermark) in wanted {
        let Some(read) = store.live_ids_below(post, *watermark, room).await? else {
            return Ok(None);
        };
        room -= read.len();
        reads.push(read);
    }
    Ok(Some(reads))
}

/// The extent of `comments` as the snapshot begins.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct CommentsExtent {
    pub last_id: Option<CommentId>,
    pub estimated_rows: u64,
}

/// A post's displayed value (`base_count + live_delta`, 0 without a counter) beside its true
/// count of live rows: what `get`, `verify` and the demo compare.
pub async fn displayed_and_truth<S: Counters + Truth + ?Sized>(
    store: &S,
    post: &GroupValue,
) -> StoreResult<(Num, Num)> {
    let displayed = store
        .read_counter(post)
        .await?
        .map(|c| c.shown())
        .unwrap_or_default();
    Ok((displayed, store.count_live(post).await?))
}
