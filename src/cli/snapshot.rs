//! `counterd snapshot`: take (or resume) the initial snapshot by hand, in the foreground.
//!
//! `counterd run` takes it by itself on a stream that has never applied anything
//! (`initial_snapshot = "auto"`). This command is for `initial_snapshot = "never"`
//! deployments that decide to count existing rows before their first `run`, and for finishing
//! an interrupted snapshot while no worker runs. It holds the stream's lease while it works, so
//! no worker applies a batch between its chunks (see [`crate::snapshot`]); a worker that holds
//! the lease takes the snapshot itself, and the command says so. A stream that already counts
//! (it has applied events without a snapshot) is refused: its counters already include what
//! its reconciles folded, so claiming rows now would count them twice; `reconcile --sweep`
//! recounts every post and rebuilds the ledger instead.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;

use crate::cli::exit::CheckFailed;
use crate::cli::{connect, print_json};
use crate::clock::{Clock, SystemClock};
use crate::config::{InitialSnapshot, Settings};
use crate::outln;
use crate::snapshot::{SnapshotSettings, Snapshotter, Step};
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{Checkpoint, Fence, SnapshotProgress, SnapshotState};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What became of one stream.
#[derive(serde::Serialize)]
struct Outcome {
    stream: String,
    result: &'static str,
    snapshot: Option<SnapshotProgress>,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let store = connect(&settings).await?;
    let owner = format!("counterd-snapshot@{}", crate::lease::default_owner());
    let mut outcomes = Vec::new();
    for (stream, partition) in settings.streams() {
        let result = snapshot_stream(&store, &settings, &owner, &stream, partition).await;
        let checkpoint = store.load_checkpoint(&stream).await?;
        let snapshot = checkpoint.and_then(|c| c.snapshot);
        outcomes.push(Outcome {
            stream,
            result: result?,
            snapshot,
        });
    }
    if args.json {
        print_json(&outcomes)?;
    } else {
        for o in &outcomes {
            let rows = o.snapshot.as_ref().map_or(0, |s| s.rows_scanned);
            let counted = o.snapshot.as_ref().map_or(0, |s| s.rows_counted);
            outln!(
                "stream {}: {} ({rows} rows scanned, {counted} counted)",
                o.stream,
                o.result
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Takes or resumes one stream's snapshot; returns what happened.
async fn snapshot_stream(
    store: &Arc<MongoStore>,
    settings: &Settings,
    owner: &str,
    stream: &str,
    partition: Option<crate::core::partition::Partition>,
) -> anyhow::Result<&'static str> {
    let checkpoint = store.load_checkpoint(stream).await?.unwrap_or_default();
    if let Some(p) = &checkpoint.snapshot {
        if p.state != SnapshotState::Running || !checkpoint.gaps.is_empty() {
            return Ok("the snapshot is already done (see `counterd status`)");
        }
    } else if checkpoint.token.is_some() || checkpoint.high_water.is_some() {
        anyhow::bail!(CheckFailed(format!(
            "stream `{stream}` already counts (it has applied events without a snapshot), so a snapshot now would count rows its reconciles already folded: run `counterd reconcile --sweep` instead, which recounts every post and rebuilds the comment ledger"
        )));
    }
    let ttl = settings.lease_ttl;
    let Some(epoch) = store
        .acquire_lease(stream, owner, ttl, DateTime::now())
        .await?
    else {
        let holder = store.read_lease(stream).await?;
        anyhow::bail!(CheckFailed(format!(
            "worker {} holds stream `{stream}` and takes the snapshot itself (`initial_snapshot = \"auto\"`), or is about to: follow it with `counterd status`",
            holder.map(|l| l.owner).unwrap_or_else(|| "?".into())
        )));
    };
    let fence = Fence::new(stream, epoch);
    let result = take(store, settings, &fence, owner, partition).await;
    if let Err(e) = store.release_lease(stream, owner, epoch).await {
        tracing::warn!(%stream, error = %e, "could not release the lease; it lapses by itself");
    }
    result
}

/// Runs the chunks to the end under the lease, renewing it and keeping the configured pace.
async fn take(
    store: &Arc<MongoStore>,
    settings: &Settings,
    fence: &Fence,
    owner: &str,
    partition: Option<crate::core::partition::Partition>,
) -> anyhow::Result<&'static str> {
    store.adopt_checkpoint(fence).await?;
    let mut checkpoint = store
        .load_checkpoint(&fence.stream)
        .await?
        .unwrap_or_else(|| Checkpoint {
            stream: fence.stream.clone(),
            epoch: fence.epoch,
            ..Checkpoint::default()
        });
    let snapshot_settings = SnapshotSettings {
        // Asked for by hand: taken whatever `initial_snapshot` says.
        initial: InitialSnapshot::Auto,
        ..SnapshotSettings::from(settings)
    };
    let clock = SystemClock;
    let snapshotter = Snapshotter {
        store: store.as_ref(),
        fence,
        settings: &snapshot_settings,
        partition,
        bucket_width_secs: settings.bucket_width_secs(),
        clock: &clock,
    };
    let began = snapshotter
        .begin_if_new(&mut checkpoint, settings.start_at_timestamp())
        .await?;
    loop {
        let step = snapshotter.step(&mut checkpoint).await?;
        if !crate::cli::still_ours(store, settings, fence, owner).await? {
            anyhow::bail!(CheckFailed(format!(
                "lost the lease of stream `{}` to another worker; it resumes the snapshot from its last chunk",
                fence.stream
            )));
        }
        match step {
            Step::Chunk { rows } => {
                let pause = snapshot_settings.pause_after(rows);
                clock.sleep(pause.min(Duration::from_secs(5))).await
            }
            Step::Done | Step::Idle => break,
        }
    }
    Ok(if began {
        "snapshot taken"
    } else {
        "snapshot resumed and finished"
    })
}
