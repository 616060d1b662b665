//! HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (process alive, parked streams
//! included: a restart would meet the same wall), `/readyz` (no stream is parked; the process
//! reaches MongoDB; an active stream is open, made progress recently and is not too far
//! behind; a standby is ready to take over, so it answers ready too).
//!
//! Everything about time is computed when the endpoint is asked, from the timestamps the
//! worker records: a worker stuck on a paused server shows a growing lag and stall at once.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::shutdown::Shutdown;
use crate::status::WorkerStatus;
use crate::telemetry::stream_ages;

/// The paths counterd serves.
pub const ROUTES: [&str; 3] = ["/metrics", "/healthz", "/readyz"];

/// When `/readyz` turns unready.
#[derive(Clone, Copy, Debug)]
pub struct ReadyBounds {
    /// An active stream further behind than this (`ready_max_lag`).
    pub max_lag: Duration,
    /// An active stream whose reads have not been answered for this long, or a standby that has
    /// not reached MongoDB for this long (`ready_max_stall`).
    pub max_stall: Duration,
}

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    /// One per stream (partition) this process may run, with its name.
    streams: Vec<(String, Arc<WorkerStatus>)>,
    bounds: ReadyBounds,
}

/// Serves the endpoints on `listener` until shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    streams: Vec<(String, Arc<WorkerStatus>)>,
    bounds: ReadyBounds,
    shutdown: Shutdown,
) -> std::io::Result<()> {
    let upkeep = tokio::spawn(upkeep(metrics.clone(), shutdown.clone()));
    let app = Router::new()
        .route(ROUTES[0], get(metrics_text))
        .route(ROUTES[1], get(|| async { "ok\n" }))
        .route(ROUTES[2], get(ready))
        .with_state(AppState {
            metrics,
            streams,
            bounds,
        });
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.wait().await })
        .await;
    upkeep.abort();
    served
}

/// How often the recorder's histograms are drained when nothing scrapes.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Drains the recorder's histograms every [`UPKEEP_INTERVAL`] until shutdown.
///
/// The Prometheus recorder keeps every histogram sample raw until an upkeep folds it into the
/// buckets; an installed recorder (unlike the exporter's own listener) runs no upkeep by
/// itself. Left to scrapes alone, a process nobody scrapes, or one scraped every minute while
/// it catches up a backlog, holds a sample per batch, per database operation and per fold:
/// memory that grows with the work done, outside the memory budget.
pub async fn upkeep(metrics: PrometheusHandle, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => metrics.run_upkeep(),
            _ = shutdown.wait() => return,
        }
    }
}

async fn metrics_text(State(state): State<AppState>) -> impl axum::response::IntoResponse {
    state.metrics.run_upkeep();
    let mut text = state.metrics.render();
    crate::telemetry::render_scrape_time(&mut text, &state.streams);
    let content_type = "text/plain; version=0.0.4; charset=utf-8";
    ([(axum::http::header::CONTENT_TYPE, content_type)], text)
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    let statuses: Vec<&Arc<WorkerStatus>> = state.streams.iter().map(|(_, s)| s).collect();
    let now_ms = bson::DateTime::now().timestamp_millis();
    readiness(&statuses, state.bounds, now_ms)
}

/// The `/readyz` answer for these streams at `now_ms`.
pub fn readiness(
    statuses: &[&Arc<WorkerStatus>],
    bounds: ReadyBounds,
    now_ms: i64,
) -> (StatusCode, String) {
    let unready = StatusCode::SERVICE_UNAVAILABLE;
    if let Some(body) = parked_body(statuses) {
        return (unready, body);
    }
    if statuses.iter().any(|s| !s.is_connected()) {
        return (
            unready,
            "not connected to MongoDB yet, or still preparing it (start-up retries show in counterd_retries_total)\n".into(),
        );
    }
    let active: Vec<&&Arc<WorkerStatus>> = statuses.iter().filter(|s| s.is_active()).collect();
    if active.is_empty() {
        return standby_readiness(statuses, bounds, now_ms);
    }
    active_readiness(&active, statuses.len(), bounds, now_ms)
}

/// `/readyz` while no stream is active here: a standby must reach MongoDB to take over when
/// the active worker goes silent.
fn standby_readiness(
    statuses: &[&Arc<WorkerStatus>],
    bounds: ReadyBounds,
    now_ms: i64,
) -> (StatusCode, String) {
    let max_stall = bounds.max_stall.as_secs_f64();
    let reached = statuses
        .iter()
        .map(|s| s.reached_at_ms())
        .max()
        .unwrap_or(0);
    let silent = (now_ms - reached) as f64 / 1000.0;
    if reached > 0 && silent > max_stall {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "standby: cannot reach MongoDB for {silent:.0}s (over ready_max_stall {max_stall:.0}s)\n"
            ),
        );
    }
    (StatusCode::OK, "standby\n".into())
}

/// `/readyz` for the `active` streams (of `streams`): open, progressing, and within the lag.
fn active_readiness(
    active: &[&&Arc<WorkerStatus>],
    streams: usize,
    bounds: ReadyBounds,
    now_ms: i64,
) -> (StatusCode, String) {
    let unready = StatusCode::SERVICE_UNAVAILABLE;
    let max_stall = bounds.max_stall.as_secs_f64();
    let of = format!("{} of {} streams", active.len(), streams);
    if active.iter().any(|s| !s.is_stream_open()) {
        return (unready, format!("active ({of}): change stream not open\n"));
    }
    let ages: Vec<_> = active
        .iter()
        .filter_map(|s| stream_ages(s, now_ms))
        .collect();
    let stall = ages.iter().map(|a| a.stall).fold(0.0, f64::max);
    if stall > max_stall {
        return (
            unready,
            format!(
                "active ({of}): no progress for {stall:.0}s (over ready_max_stall {max_stall:.0}s); is MongoDB reachable?\n"
            ),
        );
    }
    let lag = ages.iter().map(|a| a.lag).fold(0.0, f64::max);
    let max_lag = bounds.max_lag.as_secs_f64();
    if lag > max_lag {
        return (
            unready,
            format!("active ({of}): lag {lag:.0}s over {max_lag:.0}s\n"),
        );
    }
    (StatusCode::OK, format!("active ({of}): lag {lag:.0}s\n"))
}

/// `/readyz`'s body when a stream is parked: each parked stream and why, and where to look.
fn parked_body(statuses: &[&Arc<WorkerStatus>]) -> Option<String> {
    let parked: Vec<String> = statuses
        .iter()
        .filter_map(|s| s.why_parked())
        .map(|p| format!("{} ({})", p.stream, p.reason.label()))
        .collect();
    (!parked.is_empty()).then(|| {
        format!(
            "parked: {}; the process stays up and re-checks by itself (the ERROR log line says what to do; counterd_parked)\n",
            parked.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::DateTime;

    /// A wall-clock instant for the tests (Unix ms).
    const NOW: i64 = 1_700_000_000_000;

    fn at(ms: i64) -> DateTime {
        DateTime::from_millis(ms)
    }

    /// A connected stream's status, active since `NOW` (stream opened: progress) or standing by.
    fn status(active: bool) -> Arc<WorkerStatus> {
        let s = Arc::new(WorkerStatus::default());
        s.connected();
        if active {
            s.became_active(at(NOW));
            s.stream_opened(at(NOW));
        }
        s
    }

    const BOUNDS: ReadyBounds = ReadyBounds {
        max_lag: Duration::from_secs(60),
        max_stall: Duration::from_secs(10),
    };

    #[test]
    fn an_active_stream_without_progress_turns_unready_by_the_clock_alone() {
        let s = status(true);
        s.caught_up_to(NOW / 1000);
        let (code, body) = readiness(&[&s], BOUNDS, NOW + 2_000);
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(
            body.starts_with("active (1 of 1 streams): lag 2s"),
            "{body}"
        );
        // Nothing written since: only time passes.
        let (code, body) = readiness(&[&s], BOUNDS, NOW + 11_000);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("no progress for 11s"), "{body}");
    }

    #[test]
    fn a_parked_stream_is_unready_and_named_with_its_reason() {
        let parked = status(false);
        let healthy = status(true);
        healthy.caught_up_to(NOW / 1000);
        let reason = crate::status::ParkReason::SourceMissing;
        assert!(parked.parked("likes", reason));
        assert!(!parked.parked("likes", reason));
        let (code, body) = readiness(&[&healthy, &parked], BOUNDS, NOW);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.starts_with("parked: likes (source_missing)"), "{body}");
        assert!(parked.resumed());
        assert_eq!(
            readiness(&[&healthy, &parked], BOUNDS, NOW).0,
            StatusCode::OK
        );
    }

    #[test]
    fn lag_over_the_bound_is_unready() {
        let s = status(true);
        s.caught_up_to(NOW / 1000 - 100);
        let (code, body) = readiness(&[&s], BOUNDS, NOW);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("over 60s"), "{body}");
    }

    #[test]
    fn a_standby_is_ready_while_it_reaches_mongodb() {
        let s = status(false);
        s.reached(at(NOW));
        assert_eq!(readiness(&[&s], BOUNDS, NOW + 1_000).0, StatusCode::OK);
        let (code, body) = readiness(&[&s], BOUNDS, NOW + 30_000);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.starts_with("standby: cannot reach MongoDB"), "{body}");
        // Active, but start-up has not reached MongoDB yet.
        let fresh = Arc::new(WorkerStatus::default());
        fresh.became_active(at(NOW));
        fresh.stream_opened(at(NOW));
        assert!(readiness(&[&fresh], BOUNDS, NOW)
            .1
            .contains("not connected"));
    }
}
