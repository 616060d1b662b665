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
        max_batch_size: settings.max_batch_size,
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
        partition: None,
        schema: settings.schema(),
        snapshot: crate::snapshot::SnapshotSettings {
            initial: settings.initial_snapshot,
            chunk_rows: settings.snapshot_chunk_rows,
            rows_per_second: settings.snapshot_rows_per_second,
        },
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
        partition: None,
        group_size: 500,
        catch_up: crate::recount::CatchUp {
            timeout: settings.catch_up_timeout,
            poll: settings
                .idle_interval
                .clamp(Duration::from_millis(10), Duration::from_secs(1)),
            probe_without_worker: true,
        },
        background_pass: (!settings.background_sweep_pass.is_zero())
            .then_some(settings.background_sweep_pass),
        interval: settings.reconcile_interval,
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
    let statuses = statuses_for(&settings);
    let listener = tokio::net::TcpListener::bind(&settings.http_addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on http_addr {}: {e}", settings.http_addr))?;
    tracing::info!(addr = %settings.http_addr, "HTTP endpoints: /metrics /healthz /readyz");
    let names = crate::partition::stream_names(&settings.stream_name, settings.partitions);
    for (name, _) in &names {
        crate::telemetry::register_stream(name);
    }
    let named = names
        .into_iter()
        .map(|(name, _)| name)
        .zip(statuses.iter().cloned())
        .collect();
    let http = tokio::spawn(crate::http::serve(
        listener,
        metrics,
        named,
        crate::http::ReadyBounds {
            max_lag: settings.ready_max_lag,
            max_stall: settings.ready_max_stall,
        },
        shutdown.clone(),
    ));
    let result = run_with(settings, statuses, shutdown).await;
    if result.is_err() {
        // A fatal error stops the process (its exit code says why), HTTP endpoints included.
        http.abort();
    }
    let _ = http.await;
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            tracing::error!(error = %e, "counterd stopped");
            Err(e.into())
        }
    }
}

/// One status per stream (partition) of the configuration.
pub fn statuses_for(settings: &Settings) -> Vec<Arc<WorkerStatus>> {
    (0..settings.partitions.max(1))
        .map(|_| Arc::new(WorkerStatus::default()))
        .collect()
}

/// Connects (retrying while the server is unreachable), then, for each stream (one, or one per
/// partition), holds its lease and runs its worker and reconciler. The first fatal error stops
/// every stream of the process.
pub async fn run_with(
    settings: Settings,
    statuses: Vec<Arc<WorkerStatus>>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let Some(store) = connect_patiently(&settings, &mut shutdown).await? else {
        return Ok(());
    };
    store
        .ensure_indexes_with(settings.count_index)
        .await
        .map_err(WorkerError::Startup)?;
    let abilities = store.abilities().await.map_err(WorkerError::Startup)?;
    tracing::info!(mongodb = %crate::config::redact_uri(&settings.mongodb_uri), version = %abilities.version,
        pre_images = abilities.pre_images, partitions = settings.partitions, "connected");
    let store = Arc::new(store);
    let owner = if settings.owner_id.is_empty() {
        default_owner()
    } else {
        settings.owner_id.clone()
    };
    let slots = match settings.max_partitions_per_process {
        0 => tokio::sync::Semaphore::MAX_PERMITS,
        n => n as usize,
    };
    let slots = Arc::new(tokio::sync::Semaphore::new(slots));
    // Our own stop signal: the outside shutdown, or a fatal error in any stream.
    let (stop_all, stop_rx) = watch::channel(false);
    let forward = {
        let stop_all = stop_all.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let _ = shutdown.wait_for(|s| *s).await;
            let _ = stop_all.send(true);
        })
    };
    let mut streams = tokio::task::JoinSet::new();
    for status in &statuses {
        status
            .connected
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let names = crate::partition::stream_names(&settings.stream_name, settings.partitions);
    for ((stream, partition), status) in names.into_iter().zip(statuses) {
        let lease = LeaseSettings {
            stream: stream.clone(),
            owner: owner.clone(),
            ttl: settings.lease_ttl,
            renew: settings.lease_renew,
            slots: slots.clone(),
        };
        let worker_settings = WorkerSettings {
            stream: stream.clone(),
            partition,
            ..worker_settings(&settings, abilities.pre_images)
        };
        let reconcile_settings = ReconcileSettings {
            stream,
            partition,
            ..reconcile_settings(&settings)
        };
        let (interval, jitter) = (settings.reconcile_interval, settings.reconcile_jitter);
        let (store, stop_rx) = (store.clone(), stop_rx.clone());
        streams.spawn(async move {
            let active_store = store.clone();
            let active_status = status.clone();
            hold(store, lease, status, stop_rx, move |epoch, stop| {
                let worker = Worker::new(
                    active_store.clone(),
                    worker_settings.clone(),
                    active_status.clone(),
                );
                let reconciler = Reconciler::new(active_store.clone(), reconcile_settings.clone());
                async move {
                    let reconcile =
                        tokio::spawn(run_loop(reconciler, interval, jitter, stop.clone()));
                    let result = worker.run(epoch, stop.clone()).await;
                    reconcile.abort();
                    result
                }
            })
            .await
        });
    }
    let mut first_error = None;
    while let Some(joined) = streams.join_next().await {
        let result = joined.unwrap_or_else(|e| {
            Err(WorkerError::Store(crate::store::StoreError::Fatal {
                op: "run a stream",
                message: e.to_string(),
            }))
        });
        if let Err(e) = result {
            let _ = stop_all.send(true);
            first_error.get_or_insert(e);
        }
    }
    forward.abort();
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
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
            collections: settings.collections(),
            schema: settings.schema(),
        })
        .await;
        match attempt {
            Ok(store) => return Ok(Some(store)),
            Err(e) if e.is_transient() => {
                metrics::counter!(crate::telemetry::RETRIES, "op" => "connect").increment(1);
                let delay = backoff.next().unwrap_or(settings.retry_max_delay);
                tracing::warn!(error = %e, retry_in = %humantime::format_duration(delay), "MongoDB unreachable");
                if sleep_or_shutdown(&crate::clock::SystemClock, delay, shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(WorkerError::Startup(e)),
        }
    }
}
