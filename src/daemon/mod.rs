//! The sidecar assembled from [`Settings`]: HTTP endpoints, then, per stream (of each source),
//! a lease, a worker and a reconcile loop, until shutdown or the first fatal error. A condition
//! no retry mends parks its stream instead (`on_fatal = "park"`, the default: see `park`).
//! `counterd run` and `counterd demo` start it; the other commands borrow its settings mapping.
//!
//! - `settings`: each component's settings (and defaults) from the configuration;
//! - `startup`: start-up steps that ride through transient errors (an unreachable server, a
//!   lost reply while creating indexes) and stop only on errors no retry mends;
//! - `streams`: the supervisor of the streams (sources and partitions) of the process;
//! - `park`: which errors park a stream, the ERROR line that says what to do, and the re-checks
//!   that resume it.

mod park;
mod settings;
mod startup;
mod streams;

use crate::config::Settings;
use crate::lease::{ActiveError, LeaseError};
use crate::shutdown::Shutdown;
use crate::store::StoreError;
use crate::worker::WorkerError;

pub use startup::{connect_patiently, patiently, step};
pub use streams::{run_sources, statuses_for};

/// Why the daemon stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The database could not be reached or prepared for good.
    #[error("cannot start: {0}")]
    Startup(StoreError),
    /// The HTTP endpoints cannot listen on `http_addr`.
    #[error("cannot listen on http_addr {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The settings do not hold together (the `[[counters]]` definitions).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The source collection is gone although counters were counted from it (checked by the
    /// stream's lease holder before it reads; a condition that parks the stream).
    #[error("the source collection `{collection}` of stream `{stream}` does not exist, although counters were counted from it")]
    SourceMissing { stream: String, collection: String },
}

impl ActiveError for DaemonError {
    fn is_fenced(&self) -> bool {
        matches!(
            self,
            DaemonError::Worker(WorkerError::Store(StoreError::Fenced { .. }))
        )
    }
}

/// Serves the HTTP endpoints and runs every stream of the configuration until `shutdown` or
/// the first fatal error that does not park its stream (which stops the endpoints too: the exit
/// code says why).
pub async fn run(settings: Settings, shutdown: Shutdown) -> Result<(), DaemonError> {
    let metrics = crate::telemetry::install_recorder();
    let statuses = statuses_for(&settings)?;
    // A certificate file the driver cannot use fails every connection: say which, at once.
    crate::doctor::tls::check_files(&settings.mongodb_uri)
        .map_err(|e| DaemonError::Config(e.into()))?;
    let listener = tokio::net::TcpListener::bind(&settings.http_addr)
        .await
        .map_err(|source| DaemonError::Listen {
            addr: settings.http_addr.clone(),
            source,
        })?;
    tracing::info!(addr = %settings.http_addr, "HTTP endpoints: /metrics /healthz /readyz");
    for (name, _) in &statuses {
        crate::telemetry::register_stream(name);
    }
    for source in settings.sources()? {
        for (_, definition) in source.definitions()?.iter() {
            crate::telemetry::register_definition(definition);
        }
    }
    let http = tokio::spawn(crate::http::serve(
        listener,
        metrics,
        statuses.clone(),
        (&settings).into(),
        shutdown.clone(),
    ));
    let result = run_sources(settings, statuses, shutdown).await;
    if result.is_err() {
        http.abort();
    }
    let _ = http.await;
    result
}

/// A shutdown requested by SIGTERM or ctrl-c (the trigger stays with the signal handler).
pub fn shutdown_on_signals() -> Shutdown {
    let (trigger, shutdown) = Shutdown::new();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("install the SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutdown requested");
        trigger.request();
    });
    shutdown
}
