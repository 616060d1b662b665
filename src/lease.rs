//! One active worker per stream. Replicas compete for a lease document in `counterd_leases`;
//! the holder renews it and runs the worker and reconciler, the others stand by and take over
//! within about `ttl` of the holder going silent. Each takeover raises the fencing epoch, which
//! every worker write carries in its filter, so a paused former holder cannot write even once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::sync::OwnedSemaphorePermit;

use crate::clock::{Clock, SystemClock};
use crate::shutdown::{sleep_or_shutdown, Shutdown, ShutdownTrigger};
use crate::status::WorkerStatus;
use crate::store::{Fence, Store, StoreError};
use crate::telemetry as m;

/// Lease knobs (from [`crate::config::Settings`]).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub stream: String,
    pub owner: String,
    pub ttl: Duration,
    pub renew: Duration,
    /// Shared by the partitions of one process: a lease is only sought with a free slot, so
    /// replicas share the partitions (`max_partitions_per_process`).
    pub slots: Arc<tokio::sync::Semaphore>,
}

/// Why holding a stream's lease stopped for good (besides the active work's own failure).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The lease was won but the stream's checkpoint could not be fenced at its epoch.
    #[error("cannot take over stream `{stream}` (the checkpoint did not move; nothing is lost)")]
    TakeOver {
        stream: String,
        #[source]
        source: StoreError,
    },
    /// The lease cannot be looked at for good (a refused command, a malformed lease document):
    /// standing by would never end, and a standby that can never take over is not ready.
    #[error("cannot look at the lease of stream `{stream}`")]
    Acquire {
        stream: String,
        #[source]
        source: StoreError,
    },
    /// The active work panicked: a bug, not a database problem.
    #[error("the work on stream `{stream}` panicked: {message}")]
    Panicked { stream: String, message: String },
    /// The active work was cancelled before it returned (the runtime is shutting down).
    #[error("the work on stream `{stream}` was cancelled")]
    Cancelled { stream: String },
}

impl LeaseError {
    /// The failure of a task that ended without returning.
    pub fn from_join(stream: &str, error: tokio::task::JoinError) -> LeaseError {
        let stream = stream.to_string();
        let Ok(payload) = error.try_into_panic() else {
            return LeaseError::Cancelled { stream };
        };
        // `panic!` hands over a `&str` or a `String`.
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        LeaseError::Panicked { stream, message }
    }
}

/// The active work's error, as the lease needs to see it.
pub trait ActiveError: From<LeaseError> + Send + 'static {
    /// A newer epoch fenced the work out: stand by for the lease again instead of stopping.
    fn is_fenced(&self) -> bool;
}

/// This process's default identity: hostname and pid.
pub fn default_owner() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".into());
    format!("{host}-{}", std::process::id())
}

/// Stands by until the lease is ours, then runs `active(epoch, stop)` while renewing it; steps
/// down when the lease is lost or the active work ends with `Fenced`. Returns on shutdown (after
/// releasing the lease) or when the active work fails otherwise.
pub async fn hold<S, F, Fut, E>(
    store: Arc<S>,
    settings: LeaseSettings,
    status: Arc<WorkerStatus>,
    shutdown: Shutdown,
    active: F,
) -> Result<(), E>
where
    S: Store + ?Sized,
    F: Fn(i64, Shutdown) -> Fut,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: ActiveError,
{
    let lease = Lease {
        store: store.as_ref(),
        settings: &settings,
        status: status.as_ref(),
        shutdown: &shutdown,
    };
    loop {
        let Some((epoch, _slot)) = lease.stand_by().await? else {
            return Ok(());
        };
        if !lease.take_over(epoch).await? {
            continue;
        }
        lease.became_active(epoch);
        let (stop, stop_rx) = Shutdown::new();
        let work = tokio::spawn(active(epoch, stop_rx));
        let result = lease.run_active(epoch, work, stop).await;
        lease.step_down(epoch, &result).await;
        match result {
            Ok(()) => {}
            Err(e) if e.is_fenced() => {
                tracing::warn!(stream = %settings.stream, epoch, "fenced out by a newer epoch: standing by");
            }
            Err(e) => return Err(e),
        }
        if shutdown.requested() {
            return Ok(());
        }
    }
}

/// One stream's lease as [`hold`] works it: the store, the knobs, the stream's status and the
/// process's shutdown (its times are read from the [`SystemClock`]).
struct Lease<'a, S: ?Sized> {
    store: &'a S,
    settings: &'a LeaseSettings,
    status: &'a WorkerStatus,
    shutdown: &'a Shutdown,
}

impl<S: Store + ?Sized> Lease<'_, S> {
    // --- standby

    /// Looks for an expired (or our own) lease while a slot is free, every `renew` with jitter
    /// against flapping, until it is ours: its epoch and the slot it holds. `None` on shutdown.
    async fn stand_by(&self) -> Result<Option<(i64, OwnedSemaphorePermit)>, LeaseError> {
        loop {
            if self.shutdown.requested() {
                return Ok(None);
            }
            if let Ok(slot) = self.settings.slots.clone().try_acquire_owned() {
                if let Some(epoch) = self.look().await? {
                    return Ok(Some((epoch, slot)));
                }
            }
            let jitter = rand::rng().random_range(0.5..1.0);
            let pause = self.settings.renew.mul_f64(jitter);
            if sleep_or_shutdown(&SystemClock, pause, self.shutdown).await {
                return Ok(None);
            }
        }
    }

    /// One try at the lease: its epoch when won; `None` when another worker holds it (a
    /// healthy standby) or it cannot be reached this time (retried at the next look).
    async fn look(&self) -> Result<Option<i64>, LeaseError> {
        let s = self.settings;
        match self
            .store
            .acquire_lease(&s.stream, &s.owner, s.ttl, SystemClock.now())
            .await
        {
            Ok(Some(epoch)) => Ok(Some(epoch)),
            Ok(None) => {
                self.status.saw_holder(SystemClock.now());
                Ok(None)
            }
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "lease").increment(1);
                tracing::warn!(stream = %s.stream, error = %e, "cannot reach the lease; staying on standby");
                Ok(None)
            }
            Err(source) => Err(LeaseError::Acquire {
                stream: s.stream.clone(),
                source,
            }),
        }
    }

    /// Fences the stream's checkpoint at the won `epoch`. False when that should be tried
    /// again from standby (a newer epoch already, or the store unreachable for now).
    async fn take_over(&self, epoch: i64) -> Result<bool, LeaseError> {
        let stream = &self.settings.stream;
        let fence = Fence::new(stream, epoch);
        match self.store.adopt_checkpoint(&fence).await {
            Ok(()) => Ok(true),
            Err(StoreError::Fenced { .. }) => Ok(false),
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "lease").increment(1);
                tracing::warn!(stream = %stream, error = %e, "cannot fence the checkpoint at the new epoch; trying again");
                Ok(false)
            }
            Err(source) => Err(LeaseError::TakeOver {
                stream: stream.clone(),
                source,
            }),
        }
    }

    /// Says so, in the log, the status and the metrics.
    fn became_active(&self, epoch: i64) {
        let s = self.settings;
        tracing::info!(stream = %s.stream, owner = %s.owner, epoch, "lease acquired: active");
        let now = SystemClock.now();
        self.status.became_active(now);
        metrics::gauge!(m::WORKER_ACTIVE, "stream" => s.stream.clone()).set(1.0);
        // A parked stream trying again takes back the lease it released: not a takeover (its
        // retries would read as a flapping lease).
        if self.status.why_parked().is_none() {
            metrics::counter!(m::LEASE_TAKEOVERS, "stream" => s.stream.clone()).increment(1);
        }
        metrics::gauge!(m::LEASE_RENEWED_TIMESTAMP, "stream" => s.stream.clone())
            .set(now.timestamp_millis() as f64 / 1000.0);
    }

    // --- active

    /// Renews the lease every `renew` while `work` runs; once the lease is lost, lapsed while
    /// unreachable, or shutdown is asked, stops the work and waits for it. The work's result.
    async fn run_active<E: ActiveError>(
        &self,
        epoch: i64,
        mut work: tokio::task::JoinHandle<Result<(), E>>,
        stop: ShutdownTrigger,
    ) -> Result<(), E> {
        let mut last_renewed = tokio::time::Instant::now();
        // The work's join result when it ended by itself; `None` when it must be stopped.
        let ended = loop {
            tokio::select! {
                joined = &mut work => break Some(joined),
                _ = tokio::time::sleep(self.settings.renew) => {}
                _ = self.shutdown.wait() => {}
            }
            if self.shutdown.requested() || !self.renew(epoch, &mut last_renewed).await {
                break None;
            }
        };
        stop.request();
        let joined = match ended {
            Some(joined) => joined,
            None => work.await,
        };
        joined.unwrap_or_else(|join| Err(LeaseError::from_join(&self.settings.stream, join).into()))
    }

    /// One renewal: whether the lease is still ours (a failed renewal keeps it until `ttl`
    /// has passed since the last one that worked).
    async fn renew(&self, epoch: i64, last_renewed: &mut tokio::time::Instant) -> bool {
        let s = self.settings;
        match self
            .store
            .renew_lease(&s.stream, &s.owner, epoch, s.ttl, SystemClock.now())
            .await
        {
            Ok(true) => {
                *last_renewed = tokio::time::Instant::now();
                let renewed = SystemClock.now();
                self.status.reached(renewed);
                metrics::gauge!(m::LEASE_RENEWED_TIMESTAMP, "stream" => s.stream.clone())
                    .set(renewed.timestamp_millis() as f64 / 1000.0);
                true
            }
            Ok(false) => {
                tracing::warn!(stream = %s.stream, epoch, "lease lost to another worker: stepping down");
                false
            }
            Err(e) => {
                tracing::warn!(stream = %s.stream, error = %e, "cannot renew the lease");
                let lapsed = last_renewed.elapsed() >= s.ttl;
                if lapsed {
                    tracing::warn!(stream = %s.stream, "lease expired while unreachable: stepping down");
                }
                !lapsed
            }
        }
    }

    /// Back to standby after the work ended with `result`. The lease is released on shutdown,
    /// and when the work failed for good (the process stops, or the stream parks: see
    /// `daemon::park`): a standby, or an operator's `replay`, need not wait for it to lapse.
    async fn step_down<E: ActiveError>(&self, epoch: i64, result: &Result<(), E>) {
        let s = self.settings;
        self.status.became_standby();
        metrics::gauge!(m::WORKER_ACTIVE, "stream" => s.stream.clone()).set(0.0);
        let failed = result.as_ref().is_err_and(|e| !e.is_fenced());
        if self.shutdown.requested() || failed {
            let _ = self.store.release_lease(&s.stream, &s.owner, epoch).await;
            tracing::info!(stream = %s.stream, "lease released");
        }
    }
}
