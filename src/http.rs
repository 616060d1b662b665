//! HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (process alive), `/readyz` (stream
//! open and lag under the bound; a standby is ready to take over, so it answers ready too).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;

use crate::worker::WorkerStatus;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    /// One per stream (partition) this process may run.
    statuses: Vec<Arc<WorkerStatus>>,
    max_lag: Duration,
}

/// Installs the global Prometheus recorder (once per process) and returns its handle.
pub fn install_metrics() -> PrometheusHandle {
    static HANDLE: std::sync::OnceLock<PrometheusHandle> = std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(
                        crate::telemetry::COUNTER_DRIFT.into(),
                    ),
                    &[1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 1000.0],
                )
                .and_then(|b| b.install_recorder())
                .expect("install the metrics recorder");
            crate::telemetry::describe();
            handle
        })
        .clone()
}

/// Serves the endpoints on `listener` until shutdown.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: PrometheusHandle,
    statuses: Vec<Arc<WorkerStatus>>,
    max_lag: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState {
            metrics,
            statuses,
            max_lag,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await
}

async fn metrics_text(State(state): State<AppState>) -> String {
    state.metrics.run_upkeep();
    state.metrics.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    if state
        .statuses
        .iter()
        .any(|s| !s.connected.load(Ordering::Relaxed))
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not connected to MongoDB yet\n".into(),
        );
    }
    let active: Vec<&Arc<WorkerStatus>> = state
        .statuses
        .iter()
        .filter(|s| s.active.load(Ordering::Relaxed))
        .collect();
    if active.is_empty() {
        return (StatusCode::OK, "standby\n".into());
    }
    let of = format!("{} of {} streams", active.len(), state.statuses.len());
    if active
        .iter()
        .any(|s| !s.stream_open.load(Ordering::Relaxed))
    {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("active ({of}): change stream not open\n"),
        );
    }
    let lag = active
        .iter()
        .map(|s| s.lag_secs.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    if lag as u64 > state.max_lag.as_secs() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "active ({of}): lag {lag}s over {}s\n",
                state.max_lag.as_secs()
            ),
        );
    }
    (StatusCode::OK, format!("active ({of}): lag {lag}s\n"))
}
