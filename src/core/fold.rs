//! Pure reconcile arithmetic: fold a true count below a watermark into a counter.
//!
//! The seed design installed `base' = count(created_at <= W)` and `live' = live - (base' - base)`,
//! which keeps `base + live` unchanged: drift sitting in `live_delta` was never corrected and
//! `base' - base` measured rows absorbed, not drift. Here every delta is also filed under its
//! row's creation bucket, so the part of `live_delta` that belongs to the settled prefix is
//! known: it is replaced by the recount, and the rest (buckets at or above `W`) is kept.

use std::collections::BTreeMap;

use crate::core::num::Num;
use crate::core::time::BucketStart;

/// The counter fields that reconciling reads. Counts hold integers; a sum holds its field's
/// units by MongoDB's numeric rules ([`Num`]): the same arithmetic folds both.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CounterState {
    pub base_count: Num,
    /// Seconds since the epoch; rows created before it are in `base_count`.
    pub base_watermark: i64,
    pub live_delta: Num,
    pub buckets: BTreeMap<BucketStart, Num>,
}

impl CounterState {
    /// What readers display: `base_count + live_delta`.
    pub fn displayed(&self) -> Num {
        self.base_count + self.live_delta
    }
}

/// The result of folding a recount into a counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fold {
    /// The watermark actually used (never below the counter's previous one).
    pub watermark: i64,
    pub base_count: Num,
    pub live_delta: Num,
    /// Buckets at or above the watermark, kept.
    pub kept: BTreeMap<BucketStart, Num>,
    /// Buckets below the watermark, now folded into `base_count`: remove them.
    pub dropped: Vec<BucketStart>,
    /// Displayed value before the fold.
    pub wrong: Num,
    /// Displayed value after the fold.
    pub right: Num,
    /// `wrong - right`: positive means the counter ran high, negative low (in the counted
    /// field's units for a sum).
    pub drift: Num,
}

/// Folds `count_below` (live rows with `created_at` not `>= watermark`) into `state`.
///
/// The watermark never moves backwards: rows between an older and a newer watermark were counted
/// into the old base and their buckets are gone, so folding at a lower one would double count.
/// The caller counts below the watermark this returns; use [`effective_watermark`] first.
pub fn fold(state: &CounterState, watermark: i64, count_below: Num) -> Fold {
    let watermark = effective_watermark(state, watermark);
    let (below, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = state
        .buckets
        .iter()
        .map(|(k, v)| (*k, *v))
        .partition(|(bucket, _)| *bucket < watermark);
    let live_delta: Num = kept.values().sum();
    let wrong = state.displayed();
    let right = count_below + live_delta;
    Fold {
        watermark,
        base_count: count_below,
        live_delta,
        kept,
        dropped: below.into_keys().collect(),
        wrong,
        right,
        drift: wrong - right,
    }
}

/// The watermark a fold of `state` will use when asked for `proposed`.
pub fn effective_watermark(state: &CounterState, proposed: i64) -> i64 {
    proposed.max(state.base_watermark)
}

/// The watermark for a run at `now` (seconds): a bucket boundary older than the settle time and
/// than the newest event the worker has applied (`applied_until`, seconds), so rows below it
/// have had time to become visible and their events to be applied.
pub fn watermark_for(
    now: i64,
    applied_until: Option<i64>,
    settle_secs: i64,
    width_secs: i64,
) -> i64 {
    let horizon = applied_until.map_or(now, |t| t.min(now)) - settle_secs;
    crate::core::time::bucket_start(horizon, width_secs)
}

/// What a reconcile run went over: its stored record's `kind` and its metrics' `kind` label,
/// which deployments and dashboards read, so the names never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum RunKind {
    /// The dirty groups, oldest first (every pass).
    Dirty,
    /// A step of the slow background sweep over every group (every pass).
    Background,
    /// A full sweep: asked for, requested, or adopting a new definition.
    Sweep,
    /// The full sweep after lost history (a full recount of each group).
    GapSweep,
    /// One group, asked for by hand (`counterd reconcile --post`).
    Post,
}

impl RunKind {
    /// The kinds every pass runs on its own: their series are exported from the start, and a
    /// run of theirs is logged at info only when it found something.
    pub const EVERY_PASS: [RunKind; 2] = [RunKind::Dirty, RunKind::Background];

    /// Its name: the record's `kind`, the metrics' `kind` label.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
mod tests {
    use super::RunKind::*;

    #[test]
    fn run_kinds_keep_the_names_records_and_dashboards_read() {
        let names = [Dirty, Background, Sweep, GapSweep, Post].map(|k| k.label());
        assert_eq!(names, ["dirty", "background", "sweep", "gap_sweep", "post"]);
    }
}
