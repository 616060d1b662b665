//! The dirty set: counters waiting for a recount ([`DirtySet`]).

use async_trait::async_trait;
use bson::DateTime;
use serde::Serialize;

use super::error::StoreResult;
use super::leases::Fence;
use crate::core::batch::DirtyMark;
use crate::core::key::GroupValue;
use crate::core::time::BucketStart;

/// Posts waiting for a recount.
#[async_trait]
pub trait DirtySet: Send + Sync {
    /// (c) Dirty marks: upsert with `version + 1`, raising `newest_bucket`.
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()>;

    /// The dirty entries marked by `stream` (all streams: `None`).
    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>>;

    async fn dirty_summary(&self) -> StoreResult<DirtySummary>;

    /// Deletes the dirty entry only if its version is still `version`.
    async fn clear_dirty(&self, post: &GroupValue, version: i64) -> StoreResult<bool>;

    /// A fold covered the entry's changes up to its watermark, but the entry stays: changes
    /// above the watermark, or marked since it was listed. Restarts its age at `now` (never
    /// moving it back), whatever its version, so the backlog's oldest age and the
    /// dirty-to-fold time measure the reconciler, not a post that keeps getting new comments
    /// (a worker's mark never changes the age of an existing entry). False: no entry.
    async fn requeue_dirty(&self, post: &GroupValue, now: DateTime) -> StoreResult<bool>;
}

/// One post waiting for a recount.
#[serde_with::serde_as]
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DirtyEntry {
    #[serde_as(as = "serde_with::DisplayFromStr")]
    pub post: GroupValue,
    pub first_dirty_at: DateTime,
    pub last_dirty_at: DateTime,
    /// Bumped on every mark; the reconciler clears the entry only if it did not move.
    pub version: i64,
    /// The newest creation bucket any marking event changed (`None`: an entry written before
    /// this was recorded; treated as covered by any fold). The entry is cleared only by a fold
    /// whose watermark is above it.
    pub newest_bucket: Option<BucketStart>,
}

/// Size and age of the dirty backlog.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct DirtySummary {
    pub size: u64,
    pub oldest: Option<DateTime>,
}

/// Order of a dirty listing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirtyOrder {
    Oldest,
    ByVersion,
}
