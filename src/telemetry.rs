//! Metric names (part of counterd's interface: dashboards and alert rules use them) and the
//! logging set-up.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

pub const EVENTS_APPLIED: &str = "counterd_events_applied_total";
pub const BAD_EVENTS: &str = "counterd_bad_events_total";
pub const UNATTRIBUTABLE_EVENTS: &str = "counterd_unattributable_events_total";
pub const COUNTER_WRITES: &str = "counterd_counter_writes_total";
pub const BATCHES: &str = "counterd_batches_total";
pub const STREAM_LAG: &str = "counterd_stream_lag_seconds";
pub const CHECKPOINT_AGE: &str = "counterd_checkpoint_age_seconds";
pub const DIRTY_BACKLOG_SIZE: &str = "counterd_dirty_backlog_size";
pub const DIRTY_BACKLOG_OLDEST_AGE: &str = "counterd_dirty_backlog_oldest_age_seconds";
pub const RECONCILE_RUNS: &str = "counterd_reconcile_runs_total";
pub const POSTS_RECONCILED: &str = "counterd_posts_reconciled_total";
pub const COUNTER_DRIFT: &str = "counterd_counter_drift";
pub const RETRIES: &str = "counterd_retries_total";
pub const HISTORY_LOST: &str = "counterd_history_lost_total";
pub const WORKER_ACTIVE: &str = "counterd_worker_active";
pub const SWEEP_PROGRESS: &str = "counterd_sweep_posts_total";
pub const RECOUNTS_IN_FLIGHT: &str = "counterd_recounts_in_flight_total";
pub const BACKGROUND_SWEEP_POSTS_DONE: &str = "counterd_background_sweep_pass_posts";

/// Every metric name, for documentation and the test that scrapes `/metrics`.
pub const ALL: [&str; 18] = [
    EVENTS_APPLIED,
    BAD_EVENTS,
    UNATTRIBUTABLE_EVENTS,
    COUNTER_WRITES,
    BATCHES,
    STREAM_LAG,
    CHECKPOINT_AGE,
    DIRTY_BACKLOG_SIZE,
    DIRTY_BACKLOG_OLDEST_AGE,
    RECONCILE_RUNS,
    POSTS_RECONCILED,
    COUNTER_DRIFT,
    RETRIES,
    HISTORY_LOST,
    WORKER_ACTIVE,
    SWEEP_PROGRESS,
    RECOUNTS_IN_FLIGHT,
    BACKGROUND_SWEEP_POSTS_DONE,
];

/// Registers descriptions with the installed recorder (call once after installing it).
pub fn describe() {
    describe_counter!(
        EVENTS_APPLIED,
        "Change events classified and applied by the worker."
    );
    describe_counter!(BAD_EVENTS, "Malformed events skipped (missing or wrongly typed post_id, unknown operation type); their posts were marked dirty where known.");
    describe_counter!(
        UNATTRIBUTABLE_EVENTS,
        "Events no delta could be attributed to; a sweep or the reconciler repairs them."
    );
    describe_counter!(
        COUNTER_WRITES,
        "Counter write statements issued, by result (applied, already_applied)."
    );
    describe_counter!(BATCHES, "Batches applied and checkpointed.");
    describe_gauge!(
        STREAM_LAG,
        Unit::Seconds,
        "Age of the newest applied event (0 when caught up)."
    );
    describe_gauge!(
        CHECKPOINT_AGE,
        Unit::Seconds,
        "Age of the checkpointed stream position; keep it well inside the oplog window."
    );
    describe_gauge!(DIRTY_BACKLOG_SIZE, "Posts waiting for a recount.");
    describe_gauge!(
        DIRTY_BACKLOG_OLDEST_AGE,
        Unit::Seconds,
        "Age of the oldest dirty entry."
    );
    describe_counter!(
        RECONCILE_RUNS,
        "Reconcile runs, by kind (dirty, sweep, post)."
    );
    describe_counter!(POSTS_RECONCILED, "Posts recounted and folded.");
    describe_histogram!(COUNTER_DRIFT, "Absolute drift corrected per post, labelled by sign (high: counter ran high, low: ran low).");
    describe_counter!(
        RETRIES,
        "Retries after transient database errors, by operation."
    );
    describe_counter!(
        HISTORY_LOST,
        "Times the checkpoint had fallen off the oplog."
    );
    describe_gauge!(
        WORKER_ACTIVE,
        "1 when this process holds the stream lease and applies events, 0 on standby."
    );
    describe_counter!(SWEEP_PROGRESS, "Posts recounted by full sweeps.");
    describe_counter!(
        RECOUNTS_IN_FLIGHT,
        "Recounts not installed because a change to the post's settled rows was in flight (or the worker did not catch up in time); the post stays dirty and is retried."
    );
    describe_gauge!(
        BACKGROUND_SWEEP_POSTS_DONE,
        "Posts the background sweep has covered in its current pass over all posts."
    );
    // Export every series from the start, so alerts see 0 rather than no data, and a first
    // increment shows up in increase().
    for counter in [
        EVENTS_APPLIED,
        BAD_EVENTS,
        UNATTRIBUTABLE_EVENTS,
        BATCHES,
        POSTS_RECONCILED,
        HISTORY_LOST,
        SWEEP_PROGRESS,
        RECOUNTS_IN_FLIGHT,
    ] {
        metrics::counter!(counter).absolute(0);
    }
    for gauge in [
        WORKER_ACTIVE,
        STREAM_LAG,
        DIRTY_BACKLOG_SIZE,
        DIRTY_BACKLOG_OLDEST_AGE,
        BACKGROUND_SWEEP_POSTS_DONE,
    ] {
        metrics::gauge!(gauge).set(0.0);
    }
}

/// Installs the `tracing` subscriber: human-readable by default, JSON lines with `json`.
pub fn init_logging(json: bool, level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
