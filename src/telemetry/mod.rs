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
pub use register::{export_parked, install_recorder, register_definition, register_stream};
pub use scrape::{record_dirty, render_scrape_time, stream_ages, unix_now};

/// Defines each metric name as a constant, documented by its Prometheus help text; lists them
/// all in [`ALL`]; and registers each help text, with the metric's kind and unit, in
/// [`describe`]. A name and its description are written once, side by side. The names without
/// a kind and help are described where they are rendered, at scrape time (`scrape.rs`).
macro_rules! metric_names {
    ($($(#[$doc:meta])* $name:ident = $value:literal
        $(, $kind:ident $(($unit:ident))? $help:literal)?;)*) => {
        $($(#[$doc])* $(#[doc = $help])? pub const $name: &str = $value;)*
        /// Every counterd metric name, for documentation, the deploy checks and the scrape test.
        pub const ALL: [&str; [$($name),*].len()] = [$($name),*];
        /// Registers the help texts with the installed recorder (call once after installing it).
        pub fn describe() {
            $($(describe_one!($kind $name, $(metrics::Unit::$unit,)? $help);)?)*
        }
    };
}

/// One help text registered by the `metrics` macro of the metric's kind.
macro_rules! describe_one {
    (counter $($args:tt)*) => { metrics::describe_counter!($($args)*) };
    (gauge $($args:tt)*) => { metrics::describe_gauge!($($args)*) };
    (histogram $($args:tt)*) => { metrics::describe_histogram!($($args)*) };
}

metric_names! {
    // --- the worker (label: stream) -------------------------------------------------------------
    EVENTS_APPLIED = "counterd_events_applied_total", counter
        "Change events classified and applied by the worker, per stream.";
    UPDATE_ROWS_READ = "counterd_update_rows_read_total", counter
        "Rows of updated comments the worker read in its batched reads, per stream: the updates whose state it could not derive from its ledger and the update's description (what updateLookup used to send with every update event).";
    BAD_EVENTS = "counterd_bad_events_total", counter
        "Malformed events skipped (missing or wrongly typed post_id, unknown operation type); their posts were marked dirty where known.";
    UNATTRIBUTABLE_EVENTS = "counterd_unattributable_events_total", counter
        "Events no delta could be attributed to; a sweep or the reconciler repairs them.";
    INCREMENTS = "counterd_increments_total", counter
        "Counter increment statements issued, by result (applied, already_applied: a replay the guard rejected).";
    BATCHES = "counterd_batches_total", counter "Batches applied and checkpointed.";
    BATCH_APPLY_DURATION = "counterd_batch_apply_duration_seconds", histogram(Seconds)
        "Time to write one batch (intent, counters, ledger, dirty marks, checkpoint).";
    BATCH_SIZE = "counterd_batch_size_events", histogram "Events per applied batch.";
    LAST_EVENT_TIMESTAMP = "counterd_last_event_applied_timestamp_seconds", gauge(Seconds)
        "Cluster time (Unix seconds) of the newest event the worker applied.";
    CHECKPOINT_TIMESTAMP = "counterd_checkpoint_timestamp_seconds", gauge(Seconds)
        "Cluster time (Unix seconds) of the checkpointed stream position: every event before it is applied and a restart resumes there.";
    PROGRESS_TIMESTAMP = "counterd_stream_progress_timestamp_seconds";
    HISTORY_LOST = "counterd_history_lost_total", counter
        "Times the checkpoint had fallen off the oplog.";
    // --- scrape-time ages (label: stream; only for streams this process works on) -------------
    STREAM_LAG = "counterd_stream_lag_seconds";
    CHECKPOINT_AGE = "counterd_checkpoint_age_seconds";
    STREAM_STALL = "counterd_stream_stall_seconds";
    // --- leases (label: stream) ---------------------------------------------------------------
    WORKER_ACTIVE = "counterd_worker_active", gauge
        "1 when this process holds the stream's lease and applies its events, 0 on standby.";
    LEASE_RENEWED_TIMESTAMP = "counterd_lease_renewed_timestamp_seconds", gauge(Seconds)
        "Wall-clock time (Unix seconds) this process last acquired or renewed the stream's lease.";
    LEASE_TAKEOVERS = "counterd_lease_takeovers_total", counter
        "Times this process acquired the stream's lease (each raises the fencing epoch).";
    PARKED = "counterd_parked", gauge
        "1 while the stream is parked for `reason` (credentials, stream_ended, history_lost, source_missing): a condition no retry mends stopped it; the process stays up, re-checks by itself and resumes. 0 otherwise.";
    // --- the reconciler (label: stream; runs also by kind) ------------------------------------
    RECONCILE_RUNS = "counterd_reconcile_runs_total", counter
        "Reconcile runs finished, by kind (dirty, background, sweep, gap_sweep, post).";
    RECONCILE_DURATION = "counterd_reconcile_run_duration_seconds", histogram(Seconds)
        "Duration of reconcile runs, by kind.";
    LAST_RECONCILE_TIMESTAMP = "counterd_last_reconcile_success_timestamp_seconds", gauge(Seconds)
        "Wall-clock time (Unix seconds) of the last reconcile run that finished without error.";
    POSTS_RECONCILED = "counterd_posts_reconciled_total", counter "Posts recounted and folded.";
    DRIFT = "counterd_drift_comments", histogram
        "Drift corrected per post (group), by sign (high: the counter ran above the truth, low: below) and counter: in rows for a count, in the summed field's units for a sum (see counterd_definition_info).";
    RECOUNTS_IN_FLIGHT = "counterd_recounts_in_flight_total", counter
        "Recounts not installed because a row changed while counted could not be settled against the stream (or the worker did not catch up in time); the post stays dirty and is retried.";
    RECOUNTS = "counterd_recounts_total", counter
        "Counts the reconciler made of dirty, swept or requested posts, per stream and run kind; counterd_recounts_in_flight_total over it is the share of counts that could not be folded.";
    RECOUNTS_DEFERRED = "counterd_recounts_deferred_total", counter
        "Dirty posts left uncounted for a later run because the worker could not reach the server's position within catch_up_timeout (catching up a backlog): a count would have seen changes it had not applied.";
    SWEEP_POSTS = "counterd_sweep_posts_total", counter "Posts visited by full sweeps.";
    FULL_SWEEP_PROGRESS = "counterd_full_sweep_progress_posts", gauge
        "Posts recounted so far by the full sweep in progress (after lost history or on request); 0 when none runs.";
    BACKGROUND_SWEEP_POSTS_DONE = "counterd_background_sweep_pass_posts", gauge
        "Posts the background sweep has covered in its current pass over all posts.";
    BACKGROUND_SWEEP_LAST_PASS = "counterd_background_sweep_last_pass_posts", gauge
        "Posts the background sweep covered in its last complete pass (0 before the first).";
    // --- the dirty set (shared by all streams; scrape-time age) -------------------------------
    DIRTY_POSTS = "counterd_dirty_posts", gauge
        "Groups waiting for a recount, per counter definition, as of this process's last reconcile run.";
    DIRTY_OLDEST_AGE = "counterd_dirty_oldest_age_seconds";
    DIRTY_TO_FOLD = "counterd_dirty_to_fold_seconds", histogram(Seconds)
        "Seconds from a post's dirty mark (or the last fold that covered it, for a post that stays dirty) to the next fold that covered its settled changes, per stream.";
    // --- The initial snapshot ----------------------------------------------------------------
    SNAPSHOT_ROWS = "counterd_snapshot_rows_total", counter
        "Rows of `comments` read by the initial snapshot (each chunk once; a chunk finished after a restart is not read again).";
    SNAPSHOT_RUNNING = "counterd_snapshot_running", gauge
        "1 while the initial snapshot is counting the rows that existed before the stream's start (folds wait until it is done), else 0.";
    SNAPSHOT_ROWS_SCANNED = "counterd_snapshot_rows_scanned", gauge
        "Rows the initial snapshot has scanned so far.";
    SNAPSHOT_ROWS_ESTIMATED = "counterd_snapshot_rows_estimated", gauge
        "The estimated size of `comments` when the initial snapshot began.";
    SNAPSHOT_SECONDS_LEFT = "counterd_snapshot_seconds_left", gauge
        "Estimated seconds until the initial snapshot is done, at its configured rate (0 when none runs).";

    // --- MongoDB and the process --------------------------------------------------------------
    RETRIES = "counterd_retries_total", counter
        "Retries after transient database errors, by operation.";
    MONGODB_OPERATION_DURATION = "counterd_mongodb_operation_duration_seconds", histogram(Seconds)
        "MongoDB call latency, by counterd's operation (op) and outcome (ok, error).";
    BUILD_INFO = "counterd_build_info";
    // --- the memory budget (one per process; see `crate::budget`) -----------------------------
    MEMORY_BUDGET = "counterd_memory_budget_bytes", gauge(Bytes)
        "The memory budget every buffer draws from (memory_budget, or derived from the container's limit).";
    MEMORY_IN_USE = "counterd_memory_in_use_bytes", gauge(Bytes)
        "Bytes of the memory budget held now (events in flight, read ahead, snapshot chunks, recounts, server replies); reading waits when it reaches the budget.";
    // --- the configuration (label: counter) ----------------------------------------------------
    DEFINITION_INFO = "counterd_definition_info", gauge
        "Always 1, per counter definition: kind (count, sum, rows: a sum's row count), field (a sum's summed field) and collection. Join on counter to read a sum's drift in its field's units.";
    // The standard process metrics (the names every Prometheus client library uses).
    PROCESS_CPU = "process_cpu_seconds_total";
    PROCESS_RSS = "process_resident_memory_bytes";
    PROCESS_VIRTUAL = "process_virtual_memory_bytes";
    PROCESS_OPEN_FDS = "process_open_fds";
    PROCESS_MAX_FDS = "process_max_fds";
    PROCESS_START_TIME = "process_start_time_seconds";
    PROCESS_THREADS = "process_threads";
}

/// The histograms among [`ALL`] (exported as `_bucket`, `_sum`, `_count`), with their buckets.
pub const HISTOGRAMS: [(&str, &[f64]); 6] = [
    (DRIFT, &DRIFT_BUCKETS),
    (DIRTY_TO_FOLD, &FOLD_WAIT_BUCKETS),
    (BATCH_APPLY_DURATION, &DURATION_BUCKETS),
    (MONGODB_OPERATION_DURATION, &DURATION_BUCKETS),
    (RECONCILE_DURATION, &RECONCILE_BUCKETS),
    (BATCH_SIZE, &SIZE_BUCKETS),
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
