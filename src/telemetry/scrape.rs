//! What is computed when Prometheus scrapes: the per-stream ages from the worker's timestamps,
//! the dirty backlog's age, build information and the `process_*` metrics.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use super::*;
use crate::status::WorkerStatus;

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The dirty backlogs as this process's last reconcile runs saw them, per counter definition
/// (its name): the oldest entry's `first_dirty_at` (Unix ms; 0: the backlog was empty). A
/// counter appears once a reconcile run of this process has looked at it.
static DIRTY_OLDEST_MS: Mutex<BTreeMap<String, i64>> = Mutex::new(BTreeMap::new());

/// Records the dirty backlog a reconcile run of the counter definition `counter` saw: the size
/// as a gauge, the oldest entry's time for the scrape-time age; both labelled with the counter.
pub fn record_dirty(size: u64, oldest: Option<bson::DateTime>, counter: &str) {
    metrics::gauge!(DIRTY_POSTS, "counter" => counter.to_string()).set(size as f64);
    let oldest = oldest.map(|t| t.timestamp_millis()).unwrap_or(0);
    let mut seen = DIRTY_OLDEST_MS.lock().unwrap_or_else(|e| e.into_inner());
    seen.insert(counter.to_string(), oldest);
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
    if !status.is_active() {
        return None;
    }
    // Seconds since `ms` (Unix ms; 0: not known yet, so since this process became active).
    let age = |ms: i64| {
        let from_ms = if ms > 0 { ms } else { status.active_since_ms() };
        ((now_ms - from_ms) as f64 / 1000.0).max(0.0)
    };
    Some(StreamAges {
        lag: age(status.applied_until_secs() * 1000).floor(),
        checkpoint_age: age(status.checkpoint_secs() * 1000).floor(),
        stall: age(status.progress_at_ms()),
    })
}

/// A scrape-time family: name, help, and its value from a stream's ages.
type AgeFamily = (&'static str, &'static str, fn(&StreamAges) -> f64);

/// Appends the series computed at scrape time: the per-stream ages (for the streams this
/// process works on), the dirty backlog's age, build information and process metrics.
pub fn render_scrape_time(out: &mut String, streams: &[(String, Arc<WorkerStatus>)]) {
    let now_ms = bson::DateTime::now().timestamp_millis();
    render_stream_ages(out, streams, now_ms);
    render_progress(out, streams);
    render_dirty_age(out, now_ms);
    family(out, BUILD_INFO, "counterd's version; always 1.", "gauge");
    let _ = writeln!(
        out,
        "{BUILD_INFO}{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    render_process(out);
}

/// The per-stream ages: lag, checkpoint age, stall.
fn render_stream_ages(out: &mut String, streams: &[(String, Arc<WorkerStatus>)], now_ms: i64) {
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
        let series = ages.iter().map(|(stream, a)| (*stream, value(a)));
        gauges(out, name, help, "stream", series);
    }
}

/// When each active stream's worker last progressed.
fn render_progress(out: &mut String, streams: &[(String, Arc<WorkerStatus>)]) {
    let progress = streams
        .iter()
        .filter(|(_, s)| s.is_active())
        .map(|(name, s)| (name.as_str(), s.progress_at_ms()))
        .filter(|(_, ms)| *ms > 0)
        .map(|(stream, ms)| (stream, ms as f64 / 1000.0));
    let help = "Wall-clock time (Unix seconds) of the worker's last read the server answered (or batch it applied).";
    gauges(out, PROGRESS_TIMESTAMP, help, "stream", progress);
}

/// The age of each counter's oldest dirty entry.
fn render_dirty_age(out: &mut String, now_ms: i64) {
    let dirty = DIRTY_OLDEST_MS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let ages = dirty.iter().map(|(counter, &oldest)| {
        let age = if oldest > 0 {
            ((now_ms - oldest) as f64 / 1000.0).max(0.0).floor()
        } else {
            0.0
        };
        (counter.as_str(), age)
    });
    let help = "At scrape time: age of the oldest dirty entry seen by this process's last reconcile run of the counter (0: none).";
    gauges(out, DIRTY_OLDEST_AGE, help, "counter", ages);
}

fn family(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The gauge family `name` with its series, each labelled `label` = its first part: nothing at
/// all when it has none.
fn gauges<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    label: &str,
    series: impl IntoIterator<Item = (&'a str, f64)>,
) {
    let mut series = series.into_iter().peekable();
    if series.peek().is_some() {
        family(out, name, help, "gauge");
    }
    for (value, sample) in series {
        let _ = writeln!(out, "{name}{{{label}=\"{}\"}} {sample}", escape(value));
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The standard `process_*` metrics, read from /proc (Linux; nothing elsewhere).
fn render_process(out: &mut String) {
    let Some(values) = super::process::read() else {
        return;
    };
    for ((name, kind, help), (read, value)) in PROCESS_FAMILIES.into_iter().zip(values) {
        debug_assert_eq!(name, read, "the values come in the families' order");
        if value.is_nan() {
            continue;
        }
        family(out, name, help, kind);
        let _ = writeln!(out, "{name} {value}");
    }
}

/// The `process_*` families: name, kind and help (the names every Prometheus client uses).
const PROCESS_FAMILIES: [(&str, &str, &str); 7] = [
    (
        PROCESS_CPU,
        "counter",
        "Total user and system CPU time spent in seconds.",
    ),
    (PROCESS_RSS, "gauge", "Resident memory size in bytes."),
    (PROCESS_VIRTUAL, "gauge", "Virtual memory size in bytes."),
    (
        PROCESS_OPEN_FDS,
        "gauge",
        "Number of open file descriptors.",
    ),
    (
        PROCESS_MAX_FDS,
        "gauge",
        "Maximum number of open file descriptors.",
    ),
    (
        PROCESS_START_TIME,
        "gauge",
        "Start time of the process since unix epoch in seconds.",
    ),
    (
        PROCESS_THREADS,
        "gauge",
        "Number of OS threads in the process.",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_dirty_age_is_rendered_per_counter() {
        let now = bson::DateTime::now();
        let old = bson::DateTime::from_millis(now.timestamp_millis() - 120_000);
        record_dirty(3, Some(old), "scrape_test_likes");
        record_dirty(0, None, "scrape_test_empty");
        let mut out = String::new();
        render_scrape_time(&mut out, &[]);
        let age = |counter: &str| -> f64 {
            let prefix = format!("{DIRTY_OLDEST_AGE}{{counter=\"{counter}\"}} ");
            let line = out.lines().find(|l| l.starts_with(&prefix));
            let value = line.unwrap_or_else(|| panic!("no {prefix} in {out}"));
            value[prefix.len()..].parse().unwrap()
        };
        assert!((120.0..180.0).contains(&age("scrape_test_likes")), "{out}");
        assert_eq!(age("scrape_test_empty"), 0.0);
        assert_eq!(
            out.matches(&format!("# TYPE {DIRTY_OLDEST_AGE}")).count(),
            1
        );
    }

    #[test]
    fn ages_are_computed_at_scrape_time() {
        let s = WorkerStatus::default();
        assert_eq!(stream_ages(&s, 10_000), None, "standby: no ages");
        s.became_active(bson::DateTime::from_millis(4_000));
        let a = stream_ages(&s, 10_000).unwrap();
        assert_eq!((a.lag, a.checkpoint_age, a.stall), (6.0, 6.0, 6.0));
        s.caught_up_to(8);
        s.checkpointed(7);
        s.progressed(bson::DateTime::from_millis(9_500));
        let a = stream_ages(&s, 10_000).unwrap();
        assert_eq!((a.lag, a.checkpoint_age, a.stall), (2.0, 3.0, 0.5));
        // Nothing moves: the ages grow with the clock alone.
        let later = stream_ages(&s, 60_000).unwrap();
        assert_eq!((later.lag, later.checkpoint_age), (52.0, 53.0));
        assert_eq!(later.stall, 50.5);
    }
}
