//! One active worker per stream. Replicas compete for a lease document in `counterd_leases`;
//! the holder renews it and runs the worker and reconciler, the others stand by and take over
//! within about `ttl` of the holder going silent. Each takeover raises the fencing epoch, which
//! every worker write carries in its filter, so a paused former holder cannot write even once.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use rand::Rng;

use crate::shutdown::{sleep_or_shutdown, Shutdown};
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
        match error.try_into_panic() {
            Ok(payload) => LeaseError::Panicked {
                stream,
                message: panic_message(payload.as_ref()),
            },
            Err(_) => LeaseError::Cancelled { stream },
        }
    }
}

/// A panic's message (`panic!` hands over a `&str` or a `String`).
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
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
    loop {
        // --- standby: look for an expired (or our own) lease, with jitter against flapping.
        let (epoch, _slot) = loop {
            if shutdown.requested() {
                return Ok(());
            }
            if let Ok(slot) = settings.slots.clone().try_acquire_owned() {
                let now = DateTime::now();
                match store
                    .acquire_lease(&settings.stream, &settings.owner, settings.ttl, now)
                    .await
                {
                    Ok(Some(epoch)) => break (epoch, slot),
                    Ok(None) => {
                        // Another worker holds the stream: this one is a healthy standby.
                        status.reached();
                        status.resumed();
                    }
                    Err(e) if e.is_transient() => {
                        // Retried at the next look (every `renew`, jittered), at start-up as
                        // later.
                        metrics::counter!(m::RETRIES, "op" => "lease").increment(1);
                        tracing::warn!(stream = %settings.stream, error = %e, "cannot reach the lease; staying on standby")
                    }
                    Err(source) => {
                        return Err(LeaseError::Acquire {
                            stream: settings.stream.clone(),
                            source,
                        }
                        .into())
                    }
                }
            }
            let jitter = rand::rng().random_range(0.5..1.0);
            if sleep_or_shutdown(
                &crate::clock::SystemClock,
                settings.renew.mul_f64(jitter),
                &shutdown,
            )
            .await
            {
                return Ok(());
            }
        };
        let fence = Fence {
            stream: settings.stream.clone(),
            epoch,
        };
        match store.adopt_checkpoint(&fence).await {
            Ok(()) => {}
            Err(StoreError::Fenced { .. }) => continue,
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "lease").increment(1);
                tracing::warn!(stream = %settings.stream, error = %e, "cannot fence the checkpoint at the new epoch; trying again");
                continue;
            }
            Err(source) => {
                return Err(LeaseError::TakeOver {
                    stream: settings.stream.clone(),
                    source,
                }
                .into())
            }
        }
        tracing::info!(stream = %settings.stream, owner = %settings.owner, epoch, "lease acquired: active");
        let label = settings.stream.clone();
        let now_ms = m::unix_now_ms();
        status.active_since_ms.store(now_ms, Ordering::Relaxed);
        status.progress_at_ms.store(0, Ordering::Relaxed);
        status.applied_until_secs.store(0, Ordering::Relaxed);
        status.checkpoint_secs.store(0, Ordering::Relaxed);
        status.reached();
        status.active.store(true, Ordering::Relaxed);
        metrics::gauge!(m::WORKER_ACTIVE, "stream" => label.clone()).set(1.0);
        // A parked stream trying again takes back the lease it released: not a takeover (its
        // retries would read as a flapping lease).
        if status.parked().is_none() {
            metrics::counter!(m::LEASE_TAKEOVERS, "stream" => label.clone()).increment(1);
        }
        metrics::gauge!(m::LEASE_RENEWED_TIMESTAMP, "stream" => label.clone())
            .set(now_ms as f64 / 1000.0);

        // --- active: run the work, renew the lease, step down when it is lost.
        let (stop, stop_rx) = Shutdown::new();
        let mut work = tokio::spawn(active(epoch, stop_rx));
        let mut last_renewed = tokio::time::Instant::now();
        let outcome = loop {
            tokio::select! {
                result = &mut work => break Some(result),
                _ = tokio::time::sleep(settings.renew) => {}
                _ = shutdown.wait() => {}
            }
            if shutdown.requested() {
                break None;
            }
            match store
                .renew_lease(
                    &settings.stream,
                    &settings.owner,
                    epoch,
                    settings.ttl,
                    DateTime::now(),
                )
                .await
            {
                Ok(true) => {
                    last_renewed = tokio::time::Instant::now();
                    status.reached();
                    metrics::gauge!(m::LEASE_RENEWED_TIMESTAMP, "stream" => label.clone())
                        .set(m::unix_now());
                }
                Ok(false) => {
                    tracing::warn!(stream = %settings.stream, epoch, "lease lost to another worker: stepping down");
                    break None;
                }
                Err(e) => {
                    tracing::warn!(stream = %settings.stream, error = %e, "cannot renew the lease");
                    if last_renewed.elapsed() >= settings.ttl {
                        tracing::warn!(stream = %settings.stream, "lease expired while unreachable: stepping down");
                        break None;
                    }
                }
            }
        };
        stop.request();
        let result = match outcome {
            Some(result) => result,
            None => work.await,
        }
        .unwrap_or_else(|join| Err(LeaseError::from_join(&settings.stream, join).into()));
        status.active.store(false, Ordering::Relaxed);
        status.stream_open.store(false, Ordering::Relaxed);
        metrics::gauge!(m::WORKER_ACTIVE, "stream" => label).set(0.0);
        // Released on shutdown, and when the work failed for good (the process stops, or the
        // stream parks: see `daemon::park`): a standby, or an operator's `replay`, need not
        // wait for it to lapse.
        let fenced = result.as_ref().is_err_and(E::is_fenced);
        if shutdown.requested() || (result.is_err() && !fenced) {
            let _ = store
                .release_lease(&settings.stream, &settings.owner, epoch)
                .await;
            tracing::info!(stream = %settings.stream, "lease released");
        }
        match result {
            Ok(()) => {}
            Err(_) if fenced => {
                tracing::warn!(stream = %settings.stream, epoch, "fenced out by a newer epoch: standing by");
            }
            Err(e) => return Err(e),
        }
        if shutdown.requested() {
            return Ok(());
        }
    }
}
