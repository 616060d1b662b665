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
pub use register::{export_parked, install_recorder, register_definition, register_stream};
pub use scrape::{record_dirty, render_scrape_time, stream_ages, unix_now, unix_now_ms};

/// Defines each metric name as a constant and lists them all in [`ALL`], in order, so that no
/// name is written twice.
macro_rules! metric_names {
    ($($(#[$doc:meta])* $name:ident = $value:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = $value;)*
        /// Every counterd metric name, for documentation, the deploy checks and the scrape test.
        pub const ALL: [&str; [$($name),*].len()] = [$($name),*];
    };
}

metric_names! {
    // --- the worker (label: stream) -------------------------------------------------------------
    EVENTS_APPLIED = "counterd_events_applied_total";
    /// Rows of updated comments the worker read itself, in one batched read per batch, because it
    /// could not derive their state from the ledger and the update (see `crate::core::lookup`).
    UPDATE_ROWS_READ = "counterd_update_rows_read_total";
    BAD_EVENTS = "counterd_bad_events_total";
    UNATTRIBUTABLE_EVENTS = "counterd_unattributable_events_total";
    /// Counter increment statements, by `result` (applied, already_applied).
    INCREMENTS = "counterd_increments_total";
    BATCHES = "counterd_batches_total";
    BATCH_APPLY_DURATION = "counterd_batch_apply_duration_seconds";
    BATCH_SIZE = "counterd_batch_size_events";
    LAST_EVENT_TIMESTAMP = "counterd_last_event_applied_timestamp_seconds";
    CHECKPOINT_TIMESTAMP = "counterd_checkpoint_timestamp_seconds";
    PROGRESS_TIMESTAMP = "counterd_stream_progress_timestamp_seconds";
    HISTORY_LOST = "counterd_history_lost_total";
    // --- scrape-time ages (label: stream; only for streams this process works on) -------------
    STREAM_LAG = "counterd_stream_lag_seconds";
    CHECKPOINT_AGE = "counterd_checkpoint_age_seconds";
    STREAM_STALL = "counterd_stream_stall_seconds";
    // --- leases (label: stream) ---------------------------------------------------------------
    WORKER_ACTIVE = "counterd_worker_active";
    LEASE_RENEWED_TIMESTAMP = "counterd_lease_renewed_timestamp_seconds";
    LEASE_TAKEOVERS = "counterd_lease_takeovers_total";
    /// 1 while a stream is parked for `reason` (see [`crate::status::ParkReason`]), 0 otherwise.
    PARKED = "counterd_parked";
    // --- the reconciler (label: stream; runs also by kind) ------------------------------------
    RECONCILE_RUNS = "counterd_reconcile_runs_total";
    RECONCILE_DURATION = "counterd_reconcile_run_duration_seconds";
    LAST_RECONCILE_TIMESTAMP = "counterd_last_reconcile_success_timestamp_seconds";
    POSTS_RECONCILED = "counterd_posts_reconciled_total";
    /// Histogram of |drift| per corrected post, by `sign` (high, low) and `counter` (the counter
    /// definition's name, `default` for today's settings).
    DRIFT = "counterd_drift_comments";
    RECOUNTS_IN_FLIGHT = "counterd_recounts_in_flight_total";
    /// Counts the reconciler made (the share in flight: `RECOUNTS_IN_FLIGHT` over this).
    RECOUNTS = "counterd_recounts_total";
    /// Dirty posts left uncounted for a later run while the worker was catching up.
    RECOUNTS_DEFERRED = "counterd_recounts_deferred_total";
    SWEEP_POSTS = "counterd_sweep_posts_total";
    FULL_SWEEP_PROGRESS = "counterd_full_sweep_progress_posts";
    BACKGROUND_SWEEP_POSTS_DONE = "counterd_background_sweep_pass_posts";
    BACKGROUND_SWEEP_LAST_PASS = "counterd_background_sweep_last_pass_posts";
    // --- the dirty set (shared by all streams; scrape-time age) -------------------------------
    DIRTY_POSTS = "counterd_dirty_posts";
    DIRTY_OLDEST_AGE = "counterd_dirty_oldest_age_seconds";
    DIRTY_TO_FOLD = "counterd_dirty_to_fold_seconds";
    // --- The initial snapshot ----------------------------------------------------------------
    SNAPSHOT_ROWS = "counterd_snapshot_rows_total";
    SNAPSHOT_RUNNING = "counterd_snapshot_running";
    SNAPSHOT_ROWS_SCANNED = "counterd_snapshot_rows_scanned";
    SNAPSHOT_ROWS_ESTIMATED = "counterd_snapshot_rows_estimated";
    SNAPSHOT_SECONDS_LEFT = "counterd_snapshot_seconds_left";

    // --- MongoDB and the process --------------------------------------------------------------
    RETRIES = "counterd_retries_total";
    /// Histogram of MongoDB call latency, by `op` (counterd's operation, e.g. "read the
    /// ledger") and `outcome` (ok, error); see `store::mongo::observe`.
    MONGODB_OPERATION_DURATION = "counterd_mongodb_operation_duration_seconds";
    BUILD_INFO = "counterd_build_info";
    // --- the memory budget (one per process; see `crate::budget`) -----------------------------
    MEMORY_BUDGET = "counterd_memory_budget_bytes";
    MEMORY_IN_USE = "counterd_memory_in_use_bytes";
    // --- the configuration (label: counter) ----------------------------------------------------
    /// 1 per counter definition of the configuration, labelled with what its numbers are: `kind`
    /// (`count`, `sum`, or `rows`: a sum's row count), `field` (a sum's summed field, else empty)
    /// and `collection`. Dashboards and alerts join on `counter` to tell a sum's drift (in its
    /// field's units) from a count's (in rows).
    DEFINITION_INFO = "counterd_definition_info";
    // The standard process metrics (the names every Prometheus client library uses).
    PROCESS_CPU = "process_cpu_seconds_total";
    PROCESS_RSS = "process_resident_memory_bytes";
    PROCESS_VIRTUAL = "process_virtual_memory_bytes";
    PROCESS_OPEN_FDS = "process_open_fds";
    PROCESS_MAX_FDS = "process_max_fds";
    PROCESS_START_TIME = "process_start_time_seconds";
    PROCESS_THREADS = "process_threads";
}

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
/// |drift| per corrected counter: rows for a count; a sum's are in its field's units, hence the
/// fraction below and the large values above a count's usual range.
pub const DRIFT_BUCKETS: [f64; 10] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0, 10000.0, 100000.0,
];

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
