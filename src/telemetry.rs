//! Metric names (part of counterd's interface: dashboards and alert rules use them), the
//! scrape-time collector, and the logging set-up.
//!
//! Names follow Prometheus' conventions and pass `promtool check metrics`: base units in the
//! name (`_seconds`, `_posts`, `_comments`, `_events`), `_total` on counters, no type words.
//! Series about one stream (or partition) carry a `stream` label. Ages are never stored: the
//! worker and the reconciler export timestamps (`…_timestamp_seconds`), and the ages an alert
//! needs are computed when Prometheus scrapes (see [`render_scrape_time`]), so a stalled
//! process shows a growing age instead of the last value it wrote.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use crate::status::WorkerStatus;

// --- the worker (label: stream) -------------------------------------------------------------
pub const EVENTS_APPLIED: &str = "counterd_events_applied_total";
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
// --- the reconciler (label: stream; runs also by kind) ------------------------------------
pub const RECONCILE_RUNS: &str = "counterd_reconcile_runs_total";
pub const RECONCILE_DURATION: &str = "counterd_reconcile_run_duration_seconds";
pub const LAST_RECONCILE_TIMESTAMP: &str = "counterd_last_reconcile_success_timestamp_seconds";
pub const POSTS_RECONCILED: &str = "counterd_posts_reconciled_total";
/// Histogram of |drift| per corrected post, by `sign` (high, low).
pub const DRIFT: &str = "counterd_drift_comments";
pub const RECOUNTS_IN_FLIGHT: &str = "counterd_recounts_in_flight_total";
pub const SWEEP_POSTS: &str = "counterd_sweep_posts_total";
pub const FULL_SWEEP_PROGRESS: &str = "counterd_full_sweep_progress_posts";
pub const BACKGROUND_SWEEP_POSTS_DONE: &str = "counterd_background_sweep_pass_posts";
pub const BACKGROUND_SWEEP_LAST_PASS: &str = "counterd_background_sweep_last_pass_posts";
// --- the dirty set (shared by all streams; scrape-time age) -------------------------------
pub const DIRTY_POSTS: &str = "counterd_dirty_posts";
pub const DIRTY_OLDEST_AGE: &str = "counterd_dirty_oldest_age_seconds";
// --- The initial snapshot ----------------------------------------------------------------
pub const SNAPSHOT_ROWS: &str = "counterd_snapshot_rows_total";
pub const SNAPSHOT_RUNNING: &str = "counterd_snapshot_running";
pub const SNAPSHOT_ROWS_SCANNED: &str = "counterd_snapshot_rows_scanned";
pub const SNAPSHOT_ROWS_ESTIMATED: &str = "counterd_snapshot_rows_estimated";
pub const SNAPSHOT_SECONDS_LEFT: &str = "counterd_snapshot_seconds_left";

// --- MongoDB and the process --------------------------------------------------------------
pub const RETRIES: &str = "counterd_retries_total";
/// Histogram of MongoDB command latency, by `op` (the command name) and `outcome` (ok, error).
pub const MONGODB_OPERATION_DURATION: &str = "counterd_mongodb_operation_duration_seconds";
pub const BUILD_INFO: &str = "counterd_build_info";

/// Every counterd metric name, for documentation, the deploy checks and the scrape test.
pub const ALL: [&str; 44] = [
    EVENTS_APPLIED,
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
    RECONCILE_RUNS,
    RECONCILE_DURATION,
    LAST_RECONCILE_TIMESTAMP,
    POSTS_RECONCILED,
    DRIFT,
    RECOUNTS_IN_FLIGHT,
    SWEEP_POSTS,
    FULL_SWEEP_PROGRESS,
    BACKGROUND_SWEEP_POSTS_DONE,
    BACKGROUND_SWEEP_LAST_PASS,
    DIRTY_POSTS,
    DIRTY_OLDEST_AGE,
    SNAPSHOT_ROWS,
    SNAPSHOT_RUNNING,
    SNAPSHOT_ROWS_SCANNED,
    SNAPSHOT_ROWS_ESTIMATED,
    SNAPSHOT_SECONDS_LEFT,
    RETRIES,
    MONGODB_OPERATION_DURATION,
    BUILD_INFO,
    PROCESS_CPU,
    PROCESS_RSS,
    PROCESS_OPEN_FDS,
    PROCESS_START_TIME,
    PROCESS_VIRTUAL,
    PROCESS_MAX_FDS,
    PROCESS_THREADS,
];

/// The histograms among [`ALL`] (exported as `_bucket`, `_sum`, `_count`).
pub const HISTOGRAMS: [&str; 5] = [
    BATCH_APPLY_DURATION,
    BATCH_SIZE,
    RECONCILE_DURATION,
    DRIFT,
    MONGODB_OPERATION_DURATION,
];

/// Series that appear only on their first observation (an error, a correction, a takeover),
/// or only for a stream this process works on.
pub const ON_FIRST_USE: [&str; 9] = [
    RETRIES,
    DRIFT,
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
pub const DRIFT_BUCKETS: [f64; 7] = [1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0];

/// Registers descriptions with the installed recorder (call once after installing it).
pub fn describe() {
    describe_counter!(
        EVENTS_APPLIED,
        "Change events classified and applied by the worker, per stream."
    );
    describe_counter!(BAD_EVENTS, "Malformed events skipped (missing or wrongly typed post_id, unknown operation type); their posts were marked dirty where known.");
    describe_counter!(
        UNATTRIBUTABLE_EVENTS,
        "Events no delta could be attributed to; a sweep or the reconciler repairs them."
    );
    describe_counter!(
        INCREMENTS,
        "Counter increment statements issued, by result (applied, already_applied: a replay the guard rejected)."
    );
    describe_counter!(BATCHES, "Batches applied and checkpointed.");
    describe_histogram!(
        BATCH_APPLY_DURATION,
        Unit::Seconds,
        "Time to write one batch (intent, counters, ledger, dirty marks, checkpoint)."
    );
    describe_histogram!(BATCH_SIZE, "Events per applied batch.");
    describe_gauge!(
        LAST_EVENT_TIMESTAMP,
        Unit::Seconds,
        "Cluster time (Unix seconds) of the newest event the worker applied."
    );
    describe_gauge!(
        CHECKPOINT_TIMESTAMP,
        Unit::Seconds,
        "Cluster time (Unix seconds) of the checkpointed stream position: every event before it is applied and a restart resumes there."
    );
    describe_counter!(
        HISTORY_LOST,
        "Times the checkpoint had fallen off the oplog."
    );
    describe_gauge!(
        WORKER_ACTIVE,
        "1 when this process holds the stream's lease and applies its events, 0 on standby."
    );
    describe_gauge!(
        LEASE_RENEWED_TIMESTAMP,
        Unit::Seconds,
        "Wall-clock time (Unix seconds) this process last acquired or renewed the stream's lease."
    );
    describe_counter!(
        LEASE_TAKEOVERS,
        "Times this process acquired the stream's lease (each raises the fencing epoch)."
    );
    describe_counter!(
        RECONCILE_RUNS,
        "Reconcile runs finished, by kind (dirty, background, sweep, gap_sweep, post)."
    );
    describe_histogram!(
        RECONCILE_DURATION,
        Unit::Seconds,
        "Duration of reconcile runs, by kind."
    );
    describe_gauge!(
        LAST_RECONCILE_TIMESTAMP,
        Unit::Seconds,
        "Wall-clock time (Unix seconds) of the last reconcile run that finished without error."
    );
    describe_counter!(POSTS_RECONCILED, "Posts recounted and folded.");
    describe_histogram!(
        DRIFT,
        "Drift corrected per post, in comments, by sign (high: the counter ran above the true count, low: below)."
    );
    describe_counter!(
        RECOUNTS_IN_FLIGHT,
        "Recounts not installed because a change to the post's settled rows was in flight (or the worker did not catch up in time); the post stays dirty and is retried."
    );
    describe_counter!(SWEEP_POSTS, "Posts visited by full sweeps.");
    describe_gauge!(
        FULL_SWEEP_PROGRESS,
        "Posts recounted so far by the full sweep in progress (after lost history or on request); 0 when none runs."
    );
    describe_gauge!(
        BACKGROUND_SWEEP_POSTS_DONE,
        "Posts the background sweep has covered in its current pass over all posts."
    );
    describe_gauge!(
        BACKGROUND_SWEEP_LAST_PASS,
        "Posts the background sweep covered in its last complete pass (0 before the first)."
    );
    describe_gauge!(
        DIRTY_POSTS,
        "Posts waiting for a recount, as of this process's last reconcile run."
    );
    describe_counter!(
        SNAPSHOT_ROWS,
        "Rows of `comments` read by the initial snapshot (each chunk once; a chunk finished after a restart is not read again)."
    );
    describe_gauge!(
        SNAPSHOT_RUNNING,
        "1 while the initial snapshot is counting the rows that existed before the stream's start (folds wait until it is done), else 0."
    );
    describe_gauge!(
        SNAPSHOT_ROWS_SCANNED,
        "Rows the initial snapshot has scanned so far."
    );
    describe_gauge!(
        SNAPSHOT_ROWS_ESTIMATED,
        "The estimated size of `comments` when the initial snapshot began."
    );
    describe_gauge!(
        SNAPSHOT_SECONDS_LEFT,
        "Estimated seconds until the initial snapshot is done, at its configured rate (0 when none runs)."
    );
    describe_counter!(
        RETRIES,
        "Retries after transient database errors, by operation."
    );
    describe_histogram!(
        MONGODB_OPERATION_DURATION,
        Unit::Seconds,
        "MongoDB command latency, by command (op) and outcome (ok, error)."
    );
}

/// Installs the global Prometheus recorder with counterd's buckets (once per process) and
/// registers the descriptions. Returns the handle `/metrics` renders.
pub fn install_recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets: [(&str, &[f64]); 5] = [
                (DRIFT, &DRIFT_BUCKETS),
                (BATCH_APPLY_DURATION, &DURATION_BUCKETS),
                (MONGODB_OPERATION_DURATION, &DURATION_BUCKETS),
                (RECONCILE_DURATION, &RECONCILE_BUCKETS),
                (BATCH_SIZE, &SIZE_BUCKETS),
            ];
            let mut builder = PrometheusBuilder::new();
            for (name, values) in buckets {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(name.into()), values)
                    .expect("histogram buckets are not empty");
            }
            let handle = builder
                .install_recorder()
                .expect("install the metrics recorder");
            describe();
            handle
        })
        .clone()
}

/// Exports a stream's series from the start (counters at 0, gauges at 0), so alerts see 0
/// rather than no data and a first increment shows up in `increase()`.
pub fn register_stream(stream: &str) {
    let stream = stream.to_string();
    for counter in [
        EVENTS_APPLIED,
        BAD_EVENTS,
        UNATTRIBUTABLE_EVENTS,
        BATCHES,
        POSTS_RECONCILED,
        HISTORY_LOST,
        SWEEP_POSTS,
        RECOUNTS_IN_FLIGHT,
    ] {
        metrics::counter!(counter, "stream" => stream.clone()).absolute(0);
    }
    for result in ["applied", "already_applied"] {
        metrics::counter!(INCREMENTS, "stream" => stream.clone(), "result" => result).absolute(0);
    }
    for gauge in [
        WORKER_ACTIVE,
        BACKGROUND_SWEEP_POSTS_DONE,
        BACKGROUND_SWEEP_LAST_PASS,
    ] {
        metrics::gauge!(gauge, "stream" => stream.clone()).set(0.0);
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_now_ms() -> i64 {
    (unix_now() * 1000.0) as i64
}

/// The dirty backlog as this process's last reconcile run saw it (shared by all streams).
#[derive(Debug, Default)]
pub struct DirtyView {
    /// Set once a reconcile run of this process has looked.
    pub seen: std::sync::atomic::AtomicBool,
    pub size: AtomicU64,
    /// `first_dirty_at` of the oldest entry (Unix ms), 0: the backlog was empty.
    pub oldest_ms: AtomicI64,
}

/// The dirty backlog seen by this process (one per process).
pub fn dirty_view() -> &'static DirtyView {
    static VIEW: std::sync::OnceLock<DirtyView> = std::sync::OnceLock::new();
    VIEW.get_or_init(DirtyView::default)
}

/// Records the dirty backlog a reconcile run saw: the size as a gauge, the oldest entry's time
/// for the scrape-time age.
pub fn record_dirty(size: u64, oldest: Option<bson::DateTime>) {
    let view = dirty_view();
    view.size.store(size, Ordering::Relaxed);
    view.oldest_ms.store(
        oldest.map(|t| t.timestamp_millis()).unwrap_or(0),
        Ordering::Relaxed,
    );
    view.seen.store(true, Ordering::Relaxed);
    metrics::gauge!(DIRTY_POSTS).set(size as f64);
}

/// One stream's scrape-time view: its age gauges, computed from the worker's timestamps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamAges {
    pub lag: f64,
    pub checkpoint_age: f64,
    pub stall: f64,
}

/// The ages of a stream that this process works on, at `now_ms`; `None` on standby.
/// Before anything is known (the stream not opened yet) ages count from when this process
/// became active: a lower bound of the true age, never an invented "caught up".
pub fn stream_ages(status: &WorkerStatus, now_ms: i64) -> Option<StreamAges> {
    if !status.active.load(Ordering::Relaxed) {
        return None;
    }
    let since = status.active_since_ms.load(Ordering::Relaxed);
    let age_of_secs = |secs: i64| -> f64 {
        let from_ms = if secs > 0 { secs * 1000 } else { since };
        ((now_ms - from_ms) as f64 / 1000.0).max(0.0)
    };
    let progress = status.progress_at_ms.load(Ordering::Relaxed);
    let progress = if progress > 0 { progress } else { since };
    Some(StreamAges {
        lag: age_of_secs(status.applied_until_secs.load(Ordering::Relaxed)).floor(),
        checkpoint_age: age_of_secs(status.checkpoint_secs.load(Ordering::Relaxed)).floor(),
        stall: ((now_ms - progress) as f64 / 1000.0).max(0.0),
    })
}

/// A scrape-time family: name, help, and its value from a stream's ages.
type AgeFamily = (&'static str, &'static str, fn(&StreamAges) -> f64);

/// Appends the series computed at scrape time: the per-stream ages (for the streams this
/// process works on), the dirty backlog's age, build information and process metrics.
pub fn render_scrape_time(out: &mut String, streams: &[(String, Arc<WorkerStatus>)]) {
    let now_ms = unix_now_ms();
    let ages: Vec<(&str, StreamAges)> = streams
        .iter()
        .filter_map(|(name, s)| stream_ages(s, now_ms).map(|a| (name.as_str(), a)))
        .collect();
    let families: [AgeFamily; 3] = [
        (STREAM_LAG, "At scrape time: seconds since the newest stream position known applied (the newest applied event, or where the stream was last found drained). About a second on an idle, healthy stream; grows while the worker is stuck.", |a| a.lag),
        (CHECKPOINT_AGE, "At scrape time: age of the checkpointed stream position; keep it well inside the oplog window.", |a| a.checkpoint_age),
        (STREAM_STALL, "At scrape time: seconds since the worker's last answered read; /readyz is unready above ready_max_stall.", |a| a.stall),
    ];
    for (name, help, value) in families {
        if ages.is_empty() {
            continue;
        }
        family(out, name, help, "gauge");
        for (stream, a) in &ages {
            let _ = writeln!(out, "{name}{{stream=\"{}\"}} {}", escape(stream), value(a));
        }
    }
    let progress: Vec<(&str, i64)> = streams
        .iter()
        .filter(|(_, s)| s.active.load(Ordering::Relaxed))
        .map(|(name, s)| (name.as_str(), s.progress_at_ms.load(Ordering::Relaxed)))
        .filter(|(_, ms)| *ms > 0)
        .collect();
    if !progress.is_empty() {
        family(out, PROGRESS_TIMESTAMP, "Wall-clock time (Unix seconds) of the worker's last read the server answered (or batch it applied).", "gauge");
        for (stream, ms) in progress {
            let _ = writeln!(
                out,
                "{PROGRESS_TIMESTAMP}{{stream=\"{}\"}} {}",
                escape(stream),
                ms as f64 / 1000.0
            );
        }
    }
    let dirty = dirty_view();
    if dirty.seen.load(Ordering::Relaxed) {
        let oldest = dirty.oldest_ms.load(Ordering::Relaxed);
        let age = if oldest > 0 {
            ((now_ms - oldest) as f64 / 1000.0).max(0.0).floor()
        } else {
            0.0
        };
        family(
            out,
            DIRTY_OLDEST_AGE,
            "At scrape time: age of the oldest dirty entry seen by this process's last reconcile run (0: none).",
            "gauge",
        );
        let _ = writeln!(out, "{DIRTY_OLDEST_AGE} {age}");
    }
    family(out, BUILD_INFO, "counterd's version; always 1.", "gauge");
    let _ = writeln!(
        out,
        "{BUILD_INFO}{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    render_process(out);
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The standard `process_*` metrics, read from /proc (Linux; nothing elsewhere).
fn render_process(out: &mut String) {
    let Some(p) = ProcessStats::read() else {
        return;
    };
    let lines: [(&str, &str, &str, f64); 7] = [
        (
            PROCESS_CPU,
            "Total user and system CPU time spent in seconds.",
            "counter",
            p.cpu_seconds,
        ),
        (
            PROCESS_RSS,
            "Resident memory size in bytes.",
            "gauge",
            p.resident_bytes,
        ),
        (
            PROCESS_VIRTUAL,
            "Virtual memory size in bytes.",
            "gauge",
            p.virtual_bytes,
        ),
        (
            PROCESS_OPEN_FDS,
            "Number of open file descriptors.",
            "gauge",
            p.open_fds,
        ),
        (
            PROCESS_MAX_FDS,
            "Maximum number of open file descriptors.",
            "gauge",
            p.max_fds,
        ),
        (
            PROCESS_START_TIME,
            "Start time of the process since unix epoch in seconds.",
            "gauge",
            p.start_time_seconds,
        ),
        (
            PROCESS_THREADS,
            "Number of OS threads in the process.",
            "gauge",
            p.threads,
        ),
    ];
    for (name, help, kind, value) in lines {
        if value.is_nan() {
            continue;
        }
        family(out, name, help, kind);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// What /proc says about this process.
#[derive(Clone, Copy, Debug)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub open_fds: f64,
    pub max_fds: f64,
    pub start_time_seconds: f64,
    pub threads: f64,
}

impl ProcessStats {
    /// Reads /proc/self; `None` where there is no /proc.
    pub fn read() -> Option<ProcessStats> {
        // Kernel clock ticks as seen by user space (USER_HZ) are 100 on every Linux ABI.
        const TICKS: f64 = 100.0;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> f64 {
            // `n` is the field number of proc(5) (1-based); `rest` starts at field 3.
            fields
                .get(n - 3)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let cpu_seconds = (field(14) + field(15)) / TICKS;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
            })
            .unwrap_or(f64::NAN);
        let start_time_seconds = boot_time + field(22) / TICKS;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let status_kb = |key: &str| -> f64 {
            status
                .lines()
                .find_map(|l| {
                    let v = l.strip_prefix(key)?.trim_start_matches(':').trim();
                    v.split_whitespace().next()?.parse::<f64>().ok()
                })
                .unwrap_or(f64::NAN)
        };
        let resident_bytes = status_kb("VmRSS") * 1024.0;
        let virtual_bytes = status_kb("VmSize") * 1024.0;
        let threads = status_kb("Threads");
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.count() as f64)
            .unwrap_or(f64::NAN);
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    l.strip_prefix("Max open files")?
                        .split_whitespace()
                        .next()?
                        .parse::<f64>()
                        .ok()
                })
            })
            .unwrap_or(f64::NAN);
        Some(ProcessStats {
            cpu_seconds,
            resident_bytes,
            virtual_bytes,
            open_fds,
            max_fds,
            start_time_seconds,
            threads,
        })
    }
}

/// Installs the `tracing` subscriber: human-readable by default, JSON lines with `json` (one
/// object per line, the event's fields at the top level beside `timestamp`, `level`, `target`
/// and `message`).
pub fn init_logging(json: bool, level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}

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

    #[test]
    fn ages_are_computed_at_scrape_time() {
        let s = WorkerStatus::default();
        assert_eq!(stream_ages(&s, 10_000), None, "standby: no ages");
        s.active.store(true, Ordering::Relaxed);
        s.active_since_ms.store(4_000, Ordering::Relaxed);
        let a = stream_ages(&s, 10_000).unwrap();
        assert_eq!((a.lag, a.checkpoint_age, a.stall), (6.0, 6.0, 6.0));
        s.applied_until_secs.store(8, Ordering::Relaxed);
        s.checkpoint_secs.store(7, Ordering::Relaxed);
        s.progress_at_ms.store(9_500, Ordering::Relaxed);
        let a = stream_ages(&s, 10_000).unwrap();
        assert_eq!((a.lag, a.checkpoint_age, a.stall), (2.0, 3.0, 0.5));
        // Nothing moves: the ages grow with the clock alone.
        let later = stream_ages(&s, 60_000).unwrap();
        assert_eq!((later.lag, later.checkpoint_age), (52.0, 53.0));
        assert_eq!(later.stall, 50.5);
    }

    #[test]
    fn process_stats_are_read_from_proc() {
        let p = ProcessStats::read().expect("/proc on Linux");
        assert!(p.resident_bytes > 0.0 && p.open_fds > 0.0 && p.threads >= 1.0);
        assert!(p.start_time_seconds > 1.0e9 && p.cpu_seconds >= 0.0);
    }
}
