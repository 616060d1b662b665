//! Reconcile runs and the sweep cursor ([`RunHistory`]).

use async_trait::async_trait;
use bson::DateTime;
use serde::{Deserialize, Serialize};

use super::error::StoreResult;
use crate::core::key::GroupValue;
use crate::core::num::Num;

/// Reconcile runs and the background sweep's place, kept for `status` and restarts.
#[async_trait]
pub trait RunHistory: Send + Sync {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()>;

    async fn last_run(&self) -> StoreResult<Option<RunSummary>>;

    /// Where the background sweep of `stream` stands: the last post it finished (`None`: at
    /// the start of a pass) and when its current pass began.
    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>>;

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()>;
}

/// A summary of one reconcile run, stored for `status` (written and read with serde; a field
/// missing from a run stored by an older counterd takes its default).
#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSummary {
    /// The counter definition the run reconciled (empty: the default, and every run stored
    /// before definitions existed).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub counter: String,
    pub started_at: Option<DateTime>,
    pub finished_at: Option<DateTime>,
    pub kind: String,
    pub posts: u64,
    pub counts: u64,
    pub corrected: u64,
    /// Drift in the definition's units: rows for a count, the field's units for a sum.
    pub total_abs_drift: Num,
    pub max_abs_drift: Num,
    /// Sum of the drift of the posts that ran high (positive).
    pub drift_high: Num,
    /// Sum of the drift of the posts that ran low (negative).
    pub drift_low: Num,
    /// Posts corrected that ran high, and that ran low.
    pub corrected_high: u64,
    pub corrected_low: u64,
    pub watermark: i64,
    /// Posts left dirty because a change to their settled rows was in flight while they were
    /// counted (or the worker did not catch up in time): retried next run.
    pub in_flight: u64,
    /// Posts folded but left dirty: a change that dirtied them is above the watermark.
    pub waiting: u64,
    /// Posts left for a later run without being counted: the worker could not reach the
    /// server's position within a count's wait for it, so a count would have seen changes it
    /// had not applied and could not have been folded (a catch-up after an outage).
    pub deferred: u64,
    /// Recounts read at a cluster time (snapshot reads) rather than at row level.
    pub snapshot_counts: u64,
    /// Posts not counted because the initial snapshot was still running, or began or took a
    /// chunk while they were counted (they stay dirty).
    pub waiting_for_snapshot: u64,
    /// The longest a dirty entry this run folded had waited, in seconds, from its first mark
    /// (or the last fold that covered it, for a post that stays dirty) to the fold (`None`: no
    /// dirty entry folded). Whether folds keep up (see `counterd_dirty_to_fold_seconds`).
    pub longest_dirty_to_fold_secs: Option<i64>,
}

/// The background sweep's place in its pass over all posts, kept across restarts.
#[serde_with::serde_as]
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
pub struct SweepCursor {
    /// The last post finished (`None`: the pass starts from the first post).
    #[serde_as(as = "Option<serde_with::DisplayFromStr>")]
    pub after: Option<GroupValue>,
    /// When the current pass began.
    pub pass_started: Option<DateTime>,
    /// Posts done in the current pass.
    pub posts_done: u64,
    /// Passes completed.
    pub passes: u64,
    /// Posts seen by the last complete pass (sizes the steps of the next).
    pub last_pass_posts: u64,
}
