//! Taking the streams' leases for a move (free, lapsed with `--wait`, seized with `--force`)
//! and giving them back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::DateTime;

use crate::cli::exit::CheckFailed;
use crate::config::Settings;
use crate::outln;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{Fence, Lease};

use super::Args;

/// Takes `stream`'s lease for the move: at once when free, after it lapses with `--wait`, by
/// seizing it with `--force`; else refused with who holds it, for how long, and what to do.
/// Returns the fence and the lease that was fenced out, if any.
pub(super) async fn take_lease(
    store: &Arc<MongoStore>,
    stream: &str,
    owner: &str,
    settings: &Settings,
    args: &Args,
) -> anyhow::Result<(Fence, Option<Lease>)> {
    let ttl = settings.lease_ttl;
    let fence = |epoch| Fence::new(stream, epoch);
    let held = |lease: Option<Lease>| lease.filter(|l| l.expires_at > DateTime::now());
    if let Some(l) = &held(store.read_lease(stream).await?) {
        if args.force {
            let epoch = store
                .seize_lease(stream, owner, ttl, DateTime::now())
                .await?;
            return Ok((fence(epoch), Some(l.clone())));
        }
        if !args.wait {
            anyhow::bail!(CheckFailed(format!(
                "worker {} (epoch {}) holds stream `{stream}`; its lease expires in {} unless renewed. A running worker keeps renewing it: stop it first, or pass --force to fence it out (it steps down, and it or a standby resumes from the moved position). A worker that was killed stops renewing: pass --wait to wait for the lease to lapse (or --force)",
                l.owner,
                l.epoch,
                remaining(l)
            )));
        }
        // --wait: until the observed expiry; a renewal meanwhile means the worker runs.
        let observed = l.expires_at;
        let until = Instant::now()
            + Duration::from_millis(
                (observed.timestamp_millis() - DateTime::now().timestamp_millis()).max(0) as u64,
            );
        if !args.json {
            outln!(
                "waiting {} for the lease of worker {} on `{stream}` to lapse",
                remaining(l),
                l.owner
            );
        }
        tokio::time::sleep_until((until + Duration::from_millis(100)).into()).await;
        if let Some(now) = &held(store.read_lease(stream).await?) {
            let renewed = now.owner == l.owner && now.epoch == l.epoch;
            anyhow::bail!(CheckFailed(if renewed {
                format!(
                    "worker {} renewed its lease on `{stream}` while replay waited: it is running. Stop it first, or pass --force to fence it out",
                    now.owner
                )
            } else {
                format!(
                    "worker {} (epoch {}) took stream `{stream}` when the lease lapsed (a standby): stop it first, or pass --force to fence it out",
                    now.owner, now.epoch
                )
            }));
        }
    }
    match store.acquire_lease(stream, owner, ttl, DateTime::now()).await? {
        Some(epoch) => Ok((fence(epoch), None)),
        None => anyhow::bail!(CheckFailed(format!(
            "a worker took stream `{stream}` just now: run replay again (with --force to fence it out)"
        ))),
    }
}

/// Gives back every lease replay took, so a standby (or the fenced worker) takes over at once.
pub(super) async fn release_all(
    store: &Arc<MongoStore>,
    owner: &str,
    taken: &[(Fence, Option<Lease>)],
) {
    for (fence, _) in taken {
        if let Err(e) = store.release_lease(&fence.stream, owner, fence.epoch).await {
            tracing::warn!(stream = %fence.stream, error = %e, "could not release the lease; it lapses by itself");
        }
    }
}

/// How long a lease has left, for people.
pub(super) fn remaining(lease: &Lease) -> String {
    let ms = (lease.expires_at.timestamp_millis() - DateTime::now().timestamp_millis()).max(0);
    humantime::format_duration(Duration::from_secs((ms as u64).div_ceil(1000))).to_string()
}
