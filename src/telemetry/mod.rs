//! Metric names (part of counterd's interface: dashboards and alert rules use them), the
//! scrape-time collector, and the logging set-up.
//!
//! Names follow Prometheus' conventions and pass `promtool check metrics`: base units in the
//! name (`_seconds`, `_posts`, `_comments`, `_events`), `_total` on counters, no type words.
//! Series about one stream (or partition) carry a `stream` label. Ages are never stored: the
//! worker and the reconciler export timestamps (`…_timestamp_seconds`), and the ages an alert
//! needs are computed when Prometheus scrapes (see [`render_scrape_time`]), so a stalled
//! process shows a growing age instead of the last value it wrote.
//!
//! Where it lives: `mod.rs` the names and histogram buckets; `register.rs` the recorder, the
//! descriptions and a stream's series exported from the start; `scrape.rs` what is computed
//! when Prometheus scrapes (ages, the dirty backlog, `process_*`); `process.rs` reading
//! /proc; `logging.rs` the `tracing` set-up.

mod logging;
mod process;
mod register;
mod scrape;

pub use logging::{init_logging, init_logging_to_file};
pub use process::ProcessStats;
pub use register::{describe, export_parked, install_recorder, register_stream};
pub use scrape::{
    dirty_view, record_dirty, render_scrape_time, stream_ages, unix_now, unix_now_ms, DirtyView,
    StreamAges,
};

// --- the worker (label: stream) -------------------------------------------------------------
pub const EVENTS_APPLIED: &str = "counterd_events_applied_total";
/// Rows of updated comments the worker read itself, in one batched read per batch, because it
/// could not derive their state from the ledger and the update (see `crate::core::lookup`).
pub const UPDATE_ROWS_READ: &str = "counterd_update_rows_read_total";
pub const BAD_EVENTS: &str = "counterd_bad_events_total";
pub const UNATTRIBUTABLE_EVENTS: &str = "counterd_unattributable_events_total";
/// Counter increment statements, by `result` (applied, already_applied).
pub const INCREMENTS: &str = "counterd_increments_total";
pub const BATCHES: &str = "counterd_batches_total";
pub const BATCH_APPLY_DURATION: &str = "counterd_batch_apply_duration_seconds";
pub const BATCH_SIZE: &str = "counterd_batch_size_events";
pub const LAST_EVENT_TIMESTAMP: &str = "counterd_last_event_applied_timestamp_seconds";
pub const CHECKPOINT_TIMESTAMP: &str = "counterd_checkpoint_timestamp_seconds";
pub const PROGRESS_TIMESTAMP: &str = "counterd_stream_progress_timestamp_seconds";
pub const HISTORY_LOST: &str = "counterd_history_lost_total";
// --- scrape-time ages (label: stream; only for streams this process works on) -------------
pub const STREAM_LAG: &str = "counterd_stream_lag_seconds";
pub const CHECKPOINT_AGE: &str = "counterd_checkpoint_age_seconds";
pub const STREAM_STALL: &str = "counterd_stream_stall_seconds";
// --- leases (label: stream) ---------------------------------------------------------------
pub const WORKER_ACTIVE: &str = "counterd_worker_active";
pub const LEASE_RENEWED_TIMESTAMP: &str = "counterd_lease_renewed_timestamp_seconds";
pub const LEASE_TAKEOVERS: &str = "counterd_lease_takeovers_total";
/// 1 while a stream is parked for `reason` (see [`crate::status::ParkReason`]), 0 otherwise.
pub const PARKED: &str = "counterd_parked";
// --- the reconciler (label: stream; runs also by kind) ------------------------------------
pub const RECONCILE_RUNS: &str = "counterd_reconcile_runs_total";
pub const RECONCILE_DURATION: &str = "counterd_reconcile_run_duration_seconds";
pub const LAST_RECONCILE_TIMESTAMP: &str = "counterd_last_reconcile_success_timestamp_seconds";
pub const POSTS_RECONCILED: &str = "counterd_posts_reconciled_total";
/// Histogram of |drift| per corrected post, by `sign` (high, low) and `counter` (the counter
/// definition's name, `default` for today's settings).
pub const DRIFT: &str = "counterd_drift_comments";
pub const RECOUNTS_IN_FLIGHT: &str = "counterd_recounts_in_flight_total";
/// Counts the reconciler made (the share in flight: `RECOUNTS_IN_FLIGHT` over this).
pub const RECOUNTS: &str = "counterd_recounts_total";
/// Dirty posts left uncounted for a later run while the worker was catching up.
pub const RECOUNTS_DEFERRED: &str = "counterd_recounts_deferred_total";
pub const SWEEP_POSTS: &str = "counterd_sweep_posts_total";
pub const FULL_SWEEP_PROGRESS: &str = "counterd_full_sweep_progress_posts";
pub const BACKGROUND_SWEEP_POSTS_DONE: &str = "counterd_background_sweep_pass_posts";
pub const BACKGROUND_SWEEP_LAST_PASS: &str = "counterd_background_sweep_last_pass_posts";
// --- the dirty set (shared by all streams; scrape-time age) -------------------------------
pub const DIRTY_POSTS: &str = "counterd_dirty_posts";
pub const DIRTY_OLDEST_AGE: &str = "counterd_dirty_oldest_age_seconds";
pub const DIRTY_TO_FOLD: &str = "counterd_dirty_to_fold_seconds";
// --- The initial snapshot ----------------------------------------------------------------
pub const SNAPSHOT_ROWS: &str = "counterd_snapshot_rows_total";
pub const SNAPSHOT_RUNNING: &str = "counterd_snapshot_running";
pub const SNAPSHOT_ROWS_SCANNED: &str = "counterd_snapshot_rows_scanned";
pub const SNAPSHOT_ROWS_ESTIMATED: &str = "counterd_snapshot_rows_estimated";
pub const SNAPSHOT_SECONDS_LEFT: &str = "counterd_snapshot_seconds_left";

// --- MongoDB and the process --------------------------------------------------------------
pub const RETRIES: &str = "counterd_retries_total";
/// Histogram of MongoDB call latency, by `op` (counterd's operation, e.g. "read the ledger") and
/// `outcome` (ok, error); see `store::mongo::observe`.
pub const MONGODB_OPERATION_DURATION: &str = "counterd_mongodb_operation_duration_seconds";
pub const BUILD_INFO: &str = "counterd_build_info";
// --- the memory budget (one per process; see `crate::budget`) -----------------------------
pub const MEMORY_BUDGET: &str = "counterd_memory_budget_bytes";
pub const MEMORY_IN_USE: &str = "counterd_memory_in_use_bytes";

/// Every counterd metric name, for documentation, the deploy checks and the scrape test.
pub const ALL: [&str; 51] = [
    EVENTS_APPLIED,
    UPDATE_ROWS_READ,
    BAD_EVENTS,
    UNATTRIBUTABLE_EVENTS,
    INCREMENTS,
    BATCHES,
    BATCH_APPLY_DURATION,
    BATCH_SIZE,
    LAST_EVENT_TIMESTAMP,
    CHECKPOINT_TIMESTAMP,
    PROGRESS_TIMESTAMP,
    HISTORY_LOST,
    STREAM_LAG,
    CHECKPOINT_AGE,
    STREAM_STALL,
    WORKER_ACTIVE,
    LEASE_RENEWED_TIMESTAMP,
    LEASE_TAKEOVERS,
    PARKED,
    RECONCILE_RUNS,
    RECONCILE_DURATION,
    LAST_RECONCILE_TIMESTAMP,
    POSTS_RECONCILED,
    DRIFT,
    RECOUNTS_IN_FLIGHT,
    RECOUNTS,
    RECOUNTS_DEFERRED,
    SWEEP_POSTS,
    FULL_SWEEP_PROGRESS,
    BACKGROUND_SWEEP_POSTS_DONE,
    BACKGROUND_SWEEP_LAST_PASS,
    DIRTY_POSTS,
    DIRTY_OLDEST_AGE,
    DIRTY_TO_FOLD,
    SNAPSHOT_ROWS,
    SNAPSHOT_RUNNING,
    SNAPSHOT_ROWS_SCANNED,
    SNAPSHOT_ROWS_ESTIMATED,
    SNAPSHOT_SECONDS_LEFT,
    RETRIES,
    MONGODB_OPERATION_DURATION,
    BUILD_INFO,
    MEMORY_BUDGET,
    MEMORY_IN_USE,
    PROCESS_CPU,
    PROCESS_RSS,
    PROCESS_OPEN_FDS,
    PROCESS_START_TIME,
    PROCESS_VIRTUAL,
    PROCESS_MAX_FDS,
    PROCESS_THREADS,
];

/// The histograms among [`ALL`] (exported as `_bucket`, `_sum`, `_count`).
pub const HISTOGRAMS: [&str; 6] = [
    BATCH_APPLY_DURATION,
    BATCH_SIZE,
    RECONCILE_DURATION,
    DRIFT,
    MONGODB_OPERATION_DURATION,
    DIRTY_TO_FOLD,
];

/// Series that appear only on their first observation (an error, a correction, a takeover),
/// or only for a stream this process works on.
pub const ON_FIRST_USE: [&str; 10] = [
    RETRIES,
    DRIFT,
    DIRTY_TO_FOLD,
    FULL_SWEEP_PROGRESS,
    LEASE_TAKEOVERS,
    SNAPSHOT_ROWS,
    SNAPSHOT_RUNNING,
    SNAPSHOT_ROWS_SCANNED,
    SNAPSHOT_ROWS_ESTIMATED,
    SNAPSHOT_SECONDS_LEFT,
];

// The standard process metrics (the names every Prometheus client library uses).
pub const PROCESS_CPU: &str = "process_cpu_seconds_total";
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
pub const PROCESS_VIRTUAL: &str = "process_virtual_memory_bytes";
pub const PROCESS_OPEN_FDS: &str = "process_open_fds";
pub const PROCESS_MAX_FDS: &str = "process_max_fds";
pub const PROCESS_START_TIME: &str = "process_start_time_seconds";
pub const PROCESS_THREADS: &str = "process_threads";

/// Histogram buckets: seconds for durations, counts for sizes and drift.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
pub const RECONCILE_BUCKETS: [f64; 10] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0];
pub const SIZE_BUCKETS: [f64; 8] = [1.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0];
/// Seconds from a post's dirty mark to the fold that covered it: settle time plus a bucket
/// plus a few reconcile intervals is normal (minutes), hours is a reconciler that fell behind.
pub const FOLD_WAIT_BUCKETS: [f64; 11] = [
    5.0, 15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0, 1200.0, 3600.0, 14400.0,
];
pub const DRIFT_BUCKETS: [f64; 7] = [1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions() {
        for name in ALL {
            assert!(name.starts_with("counterd_") || name.starts_with("process_"));
            for word in ["_counter_", "_gauge", "_histogram", "_summary"] {
                assert!(
                    !name.contains(word) && !name.ends_with(word.trim_end_matches('_')),
                    "{name}"
                );
            }
            assert!(!name.contains("_ms") && !name.contains("millis"), "{name}");
        }
        let unique: std::collections::BTreeSet<_> = ALL.iter().collect();
        assert_eq!(unique.len(), ALL.len(), "no name twice");
    }
}
