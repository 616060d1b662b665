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
use tokio::sync::watch;

use crate::store::{Fence, Store, StoreError};
use crate::telemetry as m;
use crate::worker::{sleep_or_shutdown, WorkerError, WorkerStatus};

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
pub async fn hold<S, F, Fut>(
    store: Arc<S>,
    settings: LeaseSettings,
    status: Arc<WorkerStatus>,
    mut shutdown: watch::Receiver<bool>,
    active: F,
) -> Result<(), WorkerError>
where
    S: Store + ?Sized,
    F: Fn(i64, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = Result<(), WorkerError>> + Send + 'static,
{
    loop {
        // --- standby: look for an expired (or our own) lease, with jitter against flapping.
        let (epoch, _slot) = loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            if let Ok(slot) = settings.slots.clone().try_acquire_owned() {
                let now = DateTime::now();
                match store
                    .acquire_lease(&settings.stream, &settings.owner, settings.ttl, now)
                    .await
                {
                    Ok(Some(epoch)) => break (epoch, slot),
                    Ok(None) => status.reached(),
                    Err(e) => {
                        tracing::warn!(stream = %settings.stream, error = %e, "cannot reach the lease; staying on standby")
                    }
                }
            }
            let jitter = rand::rng().random_range(0.5..1.0);
            if sleep_or_shutdown(
                &crate::clock::SystemClock,
                settings.renew.mul_f64(jitter),
                &mut shutdown,
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
            Err(e) if e.is_transient() => continue,
            Err(e) => return Err(WorkerError::Store(e)),
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
        metrics::counter!(m::LEASE_TAKEOVERS, "stream" => label.clone()).increment(1);
        metrics::gauge!(m::LEASE_RENEWED_TIMESTAMP, "stream" => label.clone())
            .set(now_ms as f64 / 1000.0);

        // --- active: run the work, renew the lease, step down when it is lost.
        let (stop, stop_rx) = watch::channel(false);
        let mut work = tokio::spawn(active(epoch, stop_rx));
        let mut last_renewed = tokio::time::Instant::now();
        let outcome = loop {
            tokio::select! {
                result = &mut work => break Some(result),
                _ = tokio::time::sleep(settings.renew) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
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
        let _ = stop.send(true);
        let result = match outcome {
            Some(result) => result,
            None => work.await,
        };
        status.active.store(false, Ordering::Relaxed);
        status.stream_open.store(false, Ordering::Relaxed);
        metrics::gauge!(m::WORKER_ACTIVE, "stream" => label).set(0.0);
        // Released on shutdown, and when the work failed for good (the process stops): a
        // standby, or an operator's `replay`, need not wait for it to lapse.
        let stops = !matches!(
            result,
            Ok(Ok(())) | Ok(Err(WorkerError::Store(StoreError::Fenced { .. })))
        );
        if *shutdown.borrow() || stops {
            let _ = store
                .release_lease(&settings.stream, &settings.owner, epoch)
                .await;
            tracing::info!(stream = %settings.stream, "lease released");
        }
        match result {
            Ok(Ok(())) => {}
            Ok(Err(WorkerError::Store(StoreError::Fenced { .. }))) => {
                tracing::warn!(stream = %settings.stream, epoch, "fenced out by a newer epoch: standing by");
            }
            Ok(Err(e)) => return Err(e),
            Err(join) => {
                return Err(WorkerError::Store(StoreError::Fatal {
                    op: "run the worker",
                    message: join.to_string(),
                }))
            }
        }
        if *shutdown.borrow() {
            return Ok(());
        }
    }
}
