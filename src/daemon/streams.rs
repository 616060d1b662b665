//! The process supervisor: one lease, worker and reconcile loop per stream (one per source,
//! or one per partition of each). A condition no retry mends parks its stream (see
//! `daemon::park`); any other fatal error, or any under `on_fatal = "exit"`, stops them all.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::startup::backoff_up_to;
use super::{connect_patiently, park, patiently, step, DaemonError};
use crate::clock::SystemClock;
use crate::config::{OnFatal, Settings};
use crate::lease::{default_owner, hold, LeaseError, LeaseSettings};
use crate::reconcile::{run_loop, ReconcileSettings, Reconciler};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::status::WorkerStatus;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{ServerAbilities, StoreError};
use crate::worker::{Worker, WorkerSettings};

/// Every stream of the configuration with its status: each source's (the comments first, then
/// `[[sources]]`), one per partition, in the order [`run_sources`] runs them.
pub fn statuses_for(settings: &Settings) -> Result<Vec<(String, Arc<WorkerStatus>)>, DaemonError> {
    let sources = settings.sources()?;
    let names = sources.iter().flat_map(Settings::stream_names);
    let status = || Arc::new(WorkerStatus::exporting(crate::telemetry::export_parked));
    Ok(names.map(|name| (name, status())).collect())
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
    let shared = Shared {
        budget: crate::budget::Budget::exported(settings.memory_budget_bytes()),
        streams: settings.streams_per_process(),
    };
    // Set aside for the reconcilers' row-level reads (see `ReconcileSettings::recount_rows`)
    // for as long as the streams run: events in flight never use it.
    let _recounts = shared.budget.take_free(crate::core::cost::recount_share(
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

/// Connects and prepares the database (retrying transient errors; parking the source's streams
/// while their credentials are refused), then, for each stream of one source, holds its lease
/// and runs its worker and reconciler (see [`StreamJob::supervise`]). The first error that
/// does not park a stream stops every stream of the source.
async fn run_streams(
    settings: Settings,
    statuses: Vec<Arc<WorkerStatus>>,
    shutdown: Shutdown,
    shared: Shared,
) -> Result<(), DaemonError> {
    // Each start-up step rides through transient errors (`/readyz` stays unready meanwhile);
    // `None`: shutdown was requested before it succeeded.
    let Some((settings, store, abilities)) =
        prepare_or_park(settings, &statuses, &shutdown).await?
    else {
        return Ok(());
    };
    log_connected(&settings, &store, &abilities).await;
    let store = Arc::new(store);
    // Our own stop: the outside shutdown, or a fatal error in any stream.
    let (stop_all, stop, _linked) = shutdown.linked();
    for status in &statuses {
        status.connected();
    }
    let jobs = Jobs::of(settings, &abilities, shared);
    let mut streams = tokio::task::JoinSet::new();
    let mut names = HashMap::new();
    for ((stream, partition), status) in jobs.source.streams().into_iter().zip(statuses) {
        let job = jobs.job(stream.clone(), partition, status);
        let task = streams.spawn(job.supervise(store.clone(), stop.clone()));
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

/// Says where the source is connected, and logs the doctor's checks.
async fn log_connected(settings: &Settings, store: &MongoStore, abilities: &ServerAbilities) {
    let tls = crate::doctor::tls::TlsPlan::of(&settings.mongodb_uri).unwrap_or_default();
    tracing::info!(mongodb = %crate::redact::redact_uri(&settings.mongodb_uri), version = %abilities.version,
        tls = %crate::doctor::tls::summary(&tls), pre_images = abilities.pre_images, source = %settings.comments_collection, partitions = settings.partitions, "connected");
    // The doctor's checks, logged: a missing recount index or a misspelled field is a warning
    // at start, never silent (none of them stops the process: `counterd doctor` exits on them).
    // Bounded like every start-up step: a server that stops answering here must not hold the
    // start (the worker's own steps retry; the preflight only informs).
    let bound = settings.operation_timeout.max(settings.connect_timeout);
    match tokio::time::timeout(bound, store.preflight(100)).await {
        Ok(replies) => crate::doctor::log(&crate::doctor::check_all(
            &replies,
            &crate::doctor::Expectations::from(settings),
        )),
        Err(_) => tracing::warn!(
            "preflight: the server did not answer the checks within {bound:?}; starting anyway (run `counterd doctor` to see them)"
        ),
    }
}

/// What every stream of one source is run with.
struct Jobs {
    source: Arc<Settings>,
    owner: String,
    /// The process's lease slots (`max_partitions_per_process`).
    slots: Arc<Semaphore>,
    pre_images: bool,
    shared: Shared,
}

impl Jobs {
    fn of(settings: Settings, abilities: &ServerAbilities, shared: Shared) -> Jobs {
        let owner = match settings.owner_id.as_str() {
            "" => default_owner(),
            id => id.to_string(),
        };
        let slots = Arc::new(Semaphore::new(match settings.max_partitions_per_process {
            0 => Semaphore::MAX_PERMITS,
            n => n as usize,
        }));
        // Pre-images are asked for only where the server keeps them and the attribution uses them.
        let pre_images = abilities.pre_images && settings.attribution.uses_pre_images();
        Jobs {
            source: Arc::new(settings),
            owner,
            slots,
            pre_images,
            shared,
        }
    }

    /// The job of `stream` (of `partition`), reporting to `status`.
    fn job(
        &self,
        stream: String,
        partition: Option<crate::core::partition::Partition>,
        status: Arc<WorkerStatus>,
    ) -> StreamJob {
        let (pre_images, budget) = (self.pre_images, &self.shared.budget);
        let settings = self.source.as_ref();
        StreamJob {
            lease: LeaseSettings {
                stream: stream.clone(),
                owner: self.owner.clone(),
                ttl: settings.lease_ttl,
                renew: settings.lease_renew,
                slots: self.slots.clone(),
            },
            worker: WorkerSettings {
                stream: stream.clone(),
                partition,
                pre_images,
                budget: budget.clone(),
                ..WorkerSettings::from(settings)
            },
            reconcile: ReconcileSettings {
                stream: stream.clone(),
                partition,
                // The process's budget, of every source, split over its streams.
                recount_rows: crate::core::cost::recount_rows(budget.total(), self.shared.streams),
                ..ReconcileSettings::from(settings)
            },
            stream: stream.clone(),
            settings: self.source.clone(),
            status,
        }
    }
}

/// Connects and prepares the database (connect, indexes, server abilities), each step riding
/// through transient errors. Refused credentials park every stream of the source (under
/// `on_fatal = "park"`): the start is tried again with backoff, reading `mongodb_uri_file`
/// again each time. The settings it was reached with (the URI as last read), the store and what
/// the server can do; `None`: shutdown was requested first.
async fn prepare_or_park(
    mut settings: Settings,
    statuses: &[Arc<WorkerStatus>],
    shutdown: &Shutdown,
) -> Result<Option<(Settings, MongoStore, ServerAbilities)>, DaemonError> {
    let mut backoff = backoff_up_to(&settings, settings.park_recheck_interval);
    loop {
        let error = match prepare(&settings, shutdown).await {
            Ok(Some((store, abilities))) => return Ok(Some((settings, store, abilities))),
            Ok(None) => return Ok(None),
            Err(e) => DaemonError::Startup(e),
        };
        let Some(reason) = park::reason_for(&error).filter(|_| settings.on_fatal == OnFatal::Park)
        else {
            return Err(error);
        };
        let names = settings.stream_names();
        let mut newly = false;
        for (name, status) in names.iter().zip(statuses) {
            newly |= status.parked(name, reason);
        }
        if newly {
            let streams = names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>();
            let advice = park::advice(reason, &error, &settings, &streams.join(", "));
            tracing::error!(streams = %names.join(","), reason = reason.label(), "{advice}");
        } else {
            tracing::info!(reason = reason.label(), error = %error, "still parked: the start was refused again");
        }
        let delay = backoff.next().unwrap_or(settings.park_recheck_interval);
        if sleep_or_shutdown(&SystemClock, delay, shutdown).await {
            return Ok(None);
        }
        settings.mongodb_uri = park::current_uri(&settings);
    }
}

/// Connect, indexes, server abilities, each retried while its error is transient.
async fn prepare(
    settings: &Settings,
    shutdown: &Shutdown,
) -> Result<Option<(MongoStore, ServerAbilities)>, StoreError> {
    let Some(store) = connect_patiently(settings, shutdown).await? else {
        return Ok(None);
    };
    let indexes = patiently(step::CREATE_INDEXES, settings, shutdown, || {
        store.ensure_indexes_with(settings.count_index)
    });
    if indexes.await?.is_none() {
        return Ok(None);
    }
    let abilities = patiently(step::SERVER_ABILITIES, settings, shutdown, || {
        store.abilities()
    });
    Ok(abilities.await?.map(|abilities| (store, abilities)))
}

/// One stream (a source, or a partition of one): its lease, worker and reconcilers, parked on
/// a condition no retry mends (under `on_fatal = "park"`).
#[derive(Clone)]
struct StreamJob {
    stream: String,
    /// The source's settings.
    settings: Arc<Settings>,
    lease: LeaseSettings,
    worker: WorkerSettings,
    reconcile: ReconcileSettings,
    status: Arc<WorkerStatus>,
}

impl StreamJob {
    /// Holds the lease and runs the work until shutdown; a condition that parks the stream
    /// releases the lease (see [`hold`]), waits until it is worth trying again (see
    /// [`park::until_worth_trying`]) and tries again. Any other error ends it.
    async fn supervise(self, store: Arc<MongoStore>, stop: Shutdown) -> Result<(), DaemonError> {
        let mut store = store;
        let mut backoff = backoff_up_to(&self.settings, self.settings.park_recheck_interval);
        loop {
            let (job, active_store) = (self.clone(), store.clone());
            let held = hold(
                store.clone(),
                self.lease.clone(),
                self.status.clone(),
                stop.clone(),
                move |epoch, stop: Shutdown| job.work(active_store.clone(), epoch, stop),
            );
            let Err(error) = held.await else {
                return Ok(());
            };
            let Some(reason) =
                park::reason_for(&error).filter(|_| self.settings.on_fatal == OnFatal::Park)
            else {
                return Err(error);
            };
            if self.park(&store, reason, &error).await {
                backoff = backoff_up_to(&self.settings, self.settings.park_recheck_interval);
            }
            let wait = park::Wait {
                reason,
                stream: &self.stream,
                settings: &self.settings,
                store: &store,
            };
            match park::until_worth_trying(wait, &mut backoff, &stop).await {
                Some(again) => store = again,
                None => return Ok(()),
            }
        }
    }

    /// Parks the stream for `reason` (said once, with advice, when it enters the park) and
    /// notes it on the released lease. Returns whether the stream entered the park now.
    async fn park(
        &self,
        store: &MongoStore,
        reason: crate::status::ParkReason,
        error: &DaemonError,
    ) -> bool {
        let entered = self.status.parked(&self.stream, reason);
        if entered {
            let advice = park::advice(reason, error, &self.settings, &format!("`{}`", self.stream));
            tracing::error!(stream = %self.stream, reason = reason.label(), "{advice}");
        } else {
            tracing::info!(stream = %self.stream, reason = reason.label(), error = %error, "still parked");
        }
        // For `counterd status`: the lease (released) says why nobody holds it.
        if let Err(e) = store
            .note_parked(&self.stream, &self.lease.owner, reason.label())
            .await
        {
            tracing::debug!(stream = %self.stream, error = %e, "cannot note the parked stream on its lease");
        }
        entered
    }

    /// The active work under the lease at `epoch`: the source collection checked (parking
    /// mode), then the worker and one reconciler per counter definition until `stop`.
    fn work(
        &self,
        store: Arc<MongoStore>,
        epoch: i64,
        stop: Shutdown,
    ) -> impl std::future::Future<Output = Result<(), DaemonError>> + Send + 'static {
        let worker = Worker::new(store.clone(), self.worker.clone(), self.status.clone());
        // One reconciler per counter definition, each over its own view of the store.
        let reconcilers = self
            .worker
            .schema
            .definitions
            .iter()
            .map(|(ix, d)| {
                let settings = self.reconcile.clone().for_counter(ix, &d.name);
                Reconciler::new(store.clone(), settings)
            })
            .collect();
        let (interval, jitter) = (
            self.settings.reconcile_interval,
            self.settings.reconcile_jitter,
        );
        let check = (self.settings.on_fatal == OnFatal::Park).then(|| self.stream.clone());
        let collection = self.settings.comments_collection.clone();
        // Taken before the worker starts: an initial snapshot it begins is later.
        let since = bson::DateTime::now();
        async move {
            if let Some(stream) = check {
                source_present(&store, stream, collection).await?;
            }
            let reconcile =
                tokio::spawn(run_loop(reconcilers, interval, jitter, stop.clone(), since));
            let result = worker.run(epoch, stop).await;
            reconcile.abort();
            result.map_err(DaemonError::from)
        }
    }
}

/// Refuses to run a stream whose source collection is gone although counters were counted
/// from it (a stream on a missing collection would wait for events that never come, and say
/// nothing). A collection that never existed is not refused: a new application creates it
/// with its first row. Where it cannot tell (the user may not list collections), it runs.
async fn source_present(
    store: &MongoStore,
    stream: String,
    collection: String,
) -> Result<(), DaemonError> {
    match store.comments_exist().await {
        Ok(true) => return Ok(()),
        Ok(false) => {}
        Err(e) => {
            tracing::debug!(%stream, error = %e, "cannot list the source collection; not checked");
            return Ok(());
        }
    }
    match store.posts_after(None, 1).await {
        Ok(counted) if !counted.is_empty() => {
            Err(DaemonError::SourceMissing { stream, collection })
        }
        _ => Ok(()),
    }
}
