//! `counterd run`: the sidecar. Worker, reconciler and HTTP endpoints until SIGTERM or ctrl-c.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::watch;

use crate::config::Settings;
use crate::lease::{default_owner, hold, LeaseSettings};
use crate::reconcile::{run_loop, ReconcileSettings, Reconciler};
use crate::store::mongo::{ConnectOptions, MongoStore};
use crate::worker::{sleep_or_shutdown, Worker, WorkerError, WorkerSettings, WorkerStatus};

#[derive(Debug, clap::Args)]
pub struct Args {}

/// Worker settings from the configuration.
pub fn worker_settings(settings: &Settings, pre_images: bool) -> WorkerSettings {
    WorkerSettings {
        stream: settings.stream_name.clone(),
        batch_size: settings.batch_size,
        max_batch_wait: settings.max_batch_wait,
        idle_interval: settings.idle_interval,
        max_await: settings.max_await,
        attribution: settings.attribution,
        bucket_width_secs: settings.bucket_width_secs(),
        on_history_lost: settings.on_history_lost,
        start_at: settings.start_at_timestamp(),
        pre_images: pre_images && settings.attribution.uses_pre_images(),
        pipeline: Vec::new(),
        retry_min_delay: settings.retry_min_delay,
        retry_max_delay: settings.retry_max_delay,
        operation_timeout: settings.operation_timeout,
    }
}

/// Reconciler settings from the configuration.
pub fn reconcile_settings(settings: &Settings) -> ReconcileSettings {
    ReconcileSettings {
        stream: settings.stream_name.clone(),
        bucket_width_secs: settings.bucket_width_secs(),
        settle_secs: settings.settle_time.as_secs() as i64,
        max_posts: settings.reconcile_max_posts,
        counts_per_second: settings.reconcile_counts_per_second,
        fold_retries: settings.fold_retries,
        sweep_window: settings.sweep_window,
    }
}

/// Turns SIGTERM and ctrl-c into the shutdown signal.
pub fn shutdown_on_signals() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested");
        let _ = tx.send(true);
    });
    rx
}

pub async fn run(settings: Settings, _args: Args) -> anyhow::Result<ExitCode> {
    let metrics = crate::http::install_metrics();
    let shutdown = shutdown_on_signals();
    let status = Arc::new(WorkerStatus::default());
    let listener = tokio::net::TcpListener::bind(&settings.http_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on http_addr {}: {e}", settings.http_addr))?;
    tracing::info!(addr = %settings.http_addr, "HTTP endpoints: /metrics /healthz /readyz");
    let http = tokio::spawn(crate::http::serve(
        listener,
        metrics,
        status.clone(),
        settings.ready_max_lag,
        shutdown.clone(),
    ));
    let result = run_with(settings, status, shutdown).await;
    let _ = http.await;
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            tracing::error!(error = %e, "counterd stopped");
            Err(e.into())
        }
    }
}

/// Connects (retrying while the server is unreachable), then holds the lease and runs.
pub async fn run_with(
    settings: Settings,
    status: Arc<WorkerStatus>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let Some(store) = connect_patiently(&settings, &mut shutdown).await? else {
        return Ok(());
    };
    store.ensure_indexes().await.map_err(WorkerError::Startup)?;
    let abilities = store.abilities().await.map_err(WorkerError::Startup)?;
    tracing::info!(mongodb = %crate::config::redact_uri(&settings.mongodb_uri), version = %abilities.version,
        pre_images = abilities.pre_images, "connected");
    let store = Arc::new(store);
    let owner = if settings.owner_id.is_empty() {
        default_owner()
    } else {
        settings.owner_id.clone()
    };
    let lease = LeaseSettings {
        stream: settings.stream_name.clone(),
        owner,
        ttl: settings.lease_ttl,
        renew: settings.lease_renew,
    };
    let worker_settings = worker_settings(&settings, abilities.pre_images);
    let reconcile_settings = reconcile_settings(&settings);
    let (interval, jitter) = (settings.reconcile_interval, settings.reconcile_jitter);
    let active_status = status.clone();
    let active_store = store.clone();
    hold(store, lease, status, shutdown, move |epoch, stop| {
        let worker = Worker::new(
            active_store.clone(),
            worker_settings.clone(),
            active_status.clone(),
        );
        let reconciler = Reconciler::new(active_store.clone(), reconcile_settings.clone());
        async move {
            let reconcile = tokio::spawn(run_loop(reconciler, interval, jitter, stop.clone()));
            let result = worker.run(epoch, stop.clone()).await;
            reconcile.abort();
            result
        }
    })
    .await
}

/// Connects, retrying with backoff while the server is unreachable (logged each time).
async fn connect_patiently(
    settings: &Settings,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<MongoStore>, WorkerError> {
    let mut backoff = ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(settings.retry_min_delay)
        .with_max_delay(settings.retry_max_delay.max(Duration::from_millis(1)))
        .without_max_times()
        .build();
    loop {
        let attempt = MongoStore::connect(&ConnectOptions {
            uri: settings.mongodb_uri.clone(),
            database: settings.database.clone(),
            comments: settings.comments_collection.clone(),
            connect_timeout: settings.connect_timeout,
        })
        .await;
        match attempt {
            Ok(store) => return Ok(Some(store)),
            Err(e) if e.is_transient() => {
                metrics::counter!(crate::telemetry::RETRIES, "op" => "connect").increment(1);
                let delay = backoff.next().unwrap_or(settings.retry_max_delay);
                tracing::warn!(error = %e, retry_in = ?delay, "MongoDB unreachable");
                if sleep_or_shutdown(delay, shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(WorkerError::Startup(e)),
        }
    }
}
