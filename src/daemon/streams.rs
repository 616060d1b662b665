//! The process supervisor: one lease, worker and reconcile loop per stream (one per source,
//! or one per partition of each), all stopped by the first fatal error of any of them.

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

/// Every stream of the configuration with its status: each source's (the comments first, then
/// `[[sources]]`), one per partition, in the order [`run_sources`] runs them.
pub fn statuses_for(settings: &Settings) -> Result<Vec<(String, Arc<WorkerStatus>)>, DaemonError> {
    let mut all = Vec::new();
    for source in settings.sources()? {
        for (name, _) in crate::partition::stream_names(&source.stream_name, source.partitions) {
            all.push((name, Arc::new(WorkerStatus::default())));
        }
    }
    Ok(all)
}

/// What the sources of one process share.
#[derive(Clone)]
struct Shared {
    /// One budget: every stream's buffers, of every source, draw from it.
    budget: crate::budget::Budget,
    /// The streams it is split over.
    streams: usize,
}

/// Runs every source of the configuration (see `config::sources`) with
/// [`statuses_for`]'s statuses, under one memory budget. The first fatal error of any source
/// stops all of them.
pub async fn run_sources(
    settings: Settings,
    statuses: Vec<(String, Arc<WorkerStatus>)>,
    shutdown: Shutdown,
) -> Result<(), DaemonError> {
    // Checked when the settings were loaded; a mistake here is one in the file.
    let sources = settings.sources()?;
    let budget = crate::budget::Budget::exported(settings.memory_budget_bytes());
    let shared = Shared {
        streams: settings.streams_per_process(),
        budget,
    };
    // Set aside for the reconcilers' row-level reads (see `ReconcileSettings::recount_rows`)
    // for as long as the streams run: events in flight never use it.
    let _recounts = shared.budget.take_free(crate::budget::cost::recount_share(
        shared.budget.total(),
        shared.streams,
    ));
    tracing::info!(
        memory_budget = shared.budget.total(),
        configured = settings.memory_budget,
        sources = sources.len(),
        "memory budget"
    );
    let (stop_all, stop, _linked) = shutdown.linked();
    let mut statuses = statuses.into_iter().map(|(_, status)| status);
    let mut running = tokio::task::JoinSet::new();
    for source in sources {
        let own = statuses
            .by_ref()
            .take(source.partitions.max(1) as usize)
            .collect();
        running.spawn(run_streams(source, own, stop.clone(), shared.clone()));
    }
    let mut first_error = None;
    while let Some(joined) = running.join_next().await {
        let result = joined
            .unwrap_or_else(|join| Err(LeaseError::from_join(&settings.stream_name, join).into()));
        if let Err(e) = result {
            stop_all.request();
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Connects and prepares the database (retrying transient errors), then, for each stream of
/// one source, holds its lease and runs its worker and reconciler. The first fatal error stops
/// every stream of the source.
async fn run_streams(
    settings: Settings,
    statuses: Vec<Arc<WorkerStatus>>,
    shutdown: Shutdown,
    shared: Shared,
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
    let tls = crate::doctor::tls::TlsPlan::of(&settings.mongodb_uri).unwrap_or_default();
    tracing::info!(mongodb = %crate::config::redact_uri(&settings.mongodb_uri), version = %abilities.version,
        tls = %crate::doctor::tls::summary(&tls), pre_images = abilities.pre_images, source = %settings.comments_collection, partitions = settings.partitions, "connected");
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
    let (stop_all, stop, _linked) = shutdown.linked();
    for status in &statuses {
        status.connected.store(true, Ordering::Relaxed);
    }
    // Pre-images are asked for only where the server keeps them and the attribution uses them.
    let pre_images = abilities.pre_images && settings.attribution.uses_pre_images();
    let mut streams = tokio::task::JoinSet::new();
    let mut names = HashMap::new();
    let budget = shared.budget;
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
            // The process's budget, of every source, split over its streams.
            recount_rows: crate::budget::cost::recount_rows(budget.total(), shared.streams),
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
                // Taken before the worker starts: an initial snapshot it begins is later.
                let since = bson::DateTime::now();
                async move {
                    let reconcile =
                        tokio::spawn(run_loop(reconcilers, interval, jitter, stop.clone(), since));
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
    first_error.map_or(Ok(()), Err)
}
