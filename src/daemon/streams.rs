//! The process supervisor: one lease, worker and reconcile loop per stream (one, or one per
//! partition), all stopped by the first fatal error of any of them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::{connect_patiently, patiently, step, DaemonError};
use crate::config::Settings;
use crate::lease::{default_owner, hold, LeaseError, LeaseSettings};
use crate::reconcile::{run_loop, ReconcileSettings, Reconciler};
use crate::shutdown::Shutdown;
use crate::status::WorkerStatus;
use crate::worker::{Worker, WorkerSettings};

/// One status per stream (partition) of the configuration.
pub fn statuses_for(settings: &Settings) -> Vec<Arc<WorkerStatus>> {
    (0..settings.partitions.max(1))
        .map(|_| Arc::new(WorkerStatus::default()))
        .collect()
}

/// Connects and prepares the database (retrying transient errors), then, for each stream,
/// holds its lease and runs its worker and reconciler. The first fatal error stops every
/// stream of the process.
pub async fn run_streams(
    settings: Settings,
    statuses: Vec<Arc<WorkerStatus>>,
    shutdown: Shutdown,
) -> Result<(), DaemonError> {
    // Each start-up step rides through transient errors (`/readyz` stays unready meanwhile);
    // `None`: shutdown was requested before it succeeded.
    let Some(store) = connect_patiently(&settings, &shutdown)
        .await
        .map_err(DaemonError::Startup)?
    else {
        return Ok(());
    };
    let indexes = patiently(step::CREATE_INDEXES, &settings, &shutdown, || {
        store.ensure_indexes_with(settings.count_index)
    });
    if indexes.await.map_err(DaemonError::Startup)?.is_none() {
        return Ok(());
    }
    let abilities = patiently(step::SERVER_ABILITIES, &settings, &shutdown, || {
        store.abilities()
    });
    let Some(abilities) = abilities.await.map_err(DaemonError::Startup)? else {
        return Ok(());
    };
    tracing::info!(mongodb = %crate::config::redact_uri(&settings.mongodb_uri), version = %abilities.version,
        pre_images = abilities.pre_images, partitions = settings.partitions, "connected");
    // The doctor's checks, logged: a missing recount index or a misspelled field is a warning
    // at start, never silent (none of them stops the process: `counterd doctor` exits on them).
    // Bounded like every start-up step: a server that stops answering here must not hold the
    // start (the worker's own steps retry; the preflight only informs).
    let bound = settings.operation_timeout.max(settings.connect_timeout);
    match tokio::time::timeout(bound, store.preflight(100)).await {
        Ok(replies) => crate::doctor::log(&crate::doctor::check_all(
            &replies,
            &crate::doctor::Expectations::from(&settings),
        )),
        Err(_) => tracing::warn!(
            "preflight: the server did not answer the checks within {bound:?}; starting anyway (run `counterd doctor` to see them)"
        ),
    }
    let store = Arc::new(store);
    let owner = match settings.owner_id.as_str() {
        "" => default_owner(),
        id => id.to_string(),
    };
    let slots = Arc::new(Semaphore::new(match settings.max_partitions_per_process {
        0 => Semaphore::MAX_PERMITS,
        n => n as usize,
    }));
    // Our own stop: the outside shutdown, or a fatal error in any stream.
    let (stop_all, stop) = Shutdown::new();
    let forward = tokio::spawn({
        let stop_all = stop_all.clone();
        async move {
            shutdown.wait().await;
            stop_all.request();
        }
    });
    for status in &statuses {
        status.connected.store(true, Ordering::Relaxed);
    }
    // Pre-images are asked for only where the server keeps them and the attribution uses them.
    let pre_images = abilities.pre_images && settings.attribution.uses_pre_images();
    let mut streams = tokio::task::JoinSet::new();
    let mut names = HashMap::new();
    // One budget for the whole process: every stream's buffers draw from it.
    let budget = crate::budget::Budget::exported(settings.memory_budget_bytes());
    // Set aside for the reconcilers' row-level reads (see `ReconcileSettings::recount_rows`)
    // for as long as the streams run: events in flight never use it.
    let _recounts = budget.take_free(crate::budget::cost::recount_share(
        budget.total(),
        settings.streams_per_process(),
    ));
    tracing::info!(
        memory_budget = budget.total(),
        configured = settings.memory_budget,
        "memory budget"
    );
    // Checked when the settings were loaded; a mistake here is one in the file.
    let definitions = settings.definitions()?;
    let partitions = crate::partition::stream_names(&settings.stream_name, settings.partitions);
    for ((stream, partition), status) in partitions.into_iter().zip(statuses) {
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
            pre_images,
            budget: budget.clone(),
            ..WorkerSettings::from(&settings)
        };
        let reconcile_settings = ReconcileSettings {
            stream: stream.clone(),
            partition,
            ..ReconcileSettings::from(&settings)
        };
        let (interval, jitter) = (settings.reconcile_interval, settings.reconcile_jitter);
        let definitions = definitions.clone();
        let (store, stop) = (store.clone(), stop.clone());
        let task = streams.spawn(async move {
            let active_store = store.clone();
            let active_status = status.clone();
            hold(store, lease, status, stop, move |epoch, stop: Shutdown| {
                let worker = Worker::new(
                    active_store.clone(),
                    worker_settings.clone(),
                    active_status.clone(),
                );
                // One reconciler per counter definition, each over its own view of the store.
                let reconcilers = definitions
                    .iter()
                    .map(|(ix, d)| {
                        let settings = reconcile_settings.clone().for_counter(ix, &d.name);
                        Reconciler::new(active_store.clone(), settings)
                    })
                    .collect();
                async move {
                    let reconcile =
                        tokio::spawn(run_loop(reconcilers, interval, jitter, stop.clone()));
                    let result = worker.run(epoch, stop).await;
                    reconcile.abort();
                    result.map_err(DaemonError::from)
                }
            })
            .await
        });
        names.insert(task.id(), stream);
    }
    let mut first_error = None;
    while let Some(joined) = streams.join_next_with_id().await {
        let result = joined.map(|(_, result)| result).unwrap_or_else(|join| {
            let stream = names.get(&join.id()).map_or("?", String::as_str);
            Err(LeaseError::from_join(stream, join).into())
        });
        if let Err(e) = result {
            stop_all.request();
            first_error.get_or_insert(e);
        }
    }
    forward.abort();
    first_error.map_or(Ok(()), Err)
}
