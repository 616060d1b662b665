//! `counterd status`: where the stream stands, how far behind it is, the dirty backlog and the
//! last reconcile run.

use std::process::ExitCode;

use serde::Serialize;

use crate::cli::{age_secs, connect, print_json, rfc3339};
use crate::config::{redact_uri, Settings};
use crate::partition::stream_names;
use crate::store::{DirtySummary, Lease, RunSummary, Store, SweepCursor};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where one stream (or partition) stands.
#[derive(Serialize)]
struct StreamStatus {
    stream: String,
    role: String,
    lease: Option<Lease>,
    checkpoint_token: Option<String>,
    checkpoint_time: Option<String>,
    /// Seconds between the checkpoint's event time and now (the stream lag when events flow).
    lag_seconds: Option<i64>,
    high_water: Option<String>,
    pending_batch: Option<String>,
    history_gaps: Vec<String>,
    sweep_requested: bool,
    /// The background sweep's pass over every post.
    background_sweep: Option<SweepCursor>,
}

#[derive(Serialize)]
struct Status {
    mongodb: String,
    database: String,
    streams: Vec<StreamStatus>,
    dirty: DirtySummary,
    dirty_oldest_age_seconds: Option<i64>,
    last_reconcile: Option<RunSummary>,
}

async fn stream_status(store: &impl Store, stream: String) -> anyhow::Result<StreamStatus> {
    let checkpoint = store.load_checkpoint(&stream).await?.unwrap_or_default();
    let lease = store.read_lease(&stream).await?;
    let now = bson::DateTime::now();
    let role = match &lease {
        Some(l) if l.expires_at > now => format!("active: {} (epoch {})", l.owner, l.epoch),
        Some(l) => format!(
            "no active worker (lease of {} expired {}s ago)",
            l.owner,
            age_secs(l.expires_at)
        ),
        None => "no worker has run yet".into(),
    };
    let checkpoint_time = checkpoint
        .token_time
        .map(|t| bson::DateTime::from_millis(t.time as i64 * 1000));
    Ok(StreamStatus {
        role,
        lease,
        checkpoint_token: checkpoint.token.as_ref().map(|t| t.to_string()),
        checkpoint_time: checkpoint_time.map(rfc3339),
        lag_seconds: checkpoint_time.map(age_secs),
        high_water: checkpoint.high_water.as_ref().map(|t| t.to_string()),
        pending_batch: checkpoint
            .pending
            .as_ref()
            .map(|p| format!("through {} ({} counter writes)", p.end, p.counters.len())),
        history_gaps: checkpoint
            .gaps
            .iter()
            .map(|g| {
                let from = g.from.map(rfc3339).unwrap_or_else(|| "?".into());
                format!("{from} .. {}", rfc3339(g.to))
            })
            .collect(),
        sweep_requested: checkpoint.sweep_requested,
        background_sweep: store.load_sweep_cursor(&stream).await?,
        stream,
    })
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let store = connect(&settings).await?;
    let mut streams = Vec::new();
    for (stream, _) in stream_names(&settings.stream_name, settings.partitions) {
        streams.push(stream_status(store.as_ref(), stream).await?);
    }
    let dirty = store.dirty_summary().await?;
    let status = Status {
        mongodb: redact_uri(&settings.mongodb_uri),
        database: settings.database.clone(),
        streams,
        dirty_oldest_age_seconds: dirty.oldest.map(age_secs),
        dirty,
        last_reconcile: store.last_run().await?,
    };
    if args.json {
        print_json(&status)?;
        return Ok(ExitCode::SUCCESS);
    }
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
    println!(
        "mongodb           {} (database {})",
        status.mongodb, status.database
    );
    for s in &status.streams {
        println!("stream            {}", s.stream);
        println!("  role            {}", s.role);
        println!("  checkpoint token {}", or_none(&s.checkpoint_token));
        println!("  checkpoint time {}", or_none(&s.checkpoint_time));
        let lag = s.lag_seconds.map(|l| format!("{l}s"));
        println!(
            "  stream lag      {}",
            lag.unwrap_or_else(|| "unknown".into())
        );
        println!("  high water      {}", or_none(&s.high_water));
        println!("  pending batch   {}", or_none(&s.pending_batch));
        if s.history_gaps.is_empty() {
            println!("  history gaps    none");
        } else {
            println!(
                "  HISTORY GAPS    {} (events in them were never seen)",
                s.history_gaps.join(", ")
            );
        }
        let sweep = if s.sweep_requested {
            "YES (runs at the next reconcile)"
        } else {
            "no"
        };
        println!("  sweep requested {sweep}");
        match &s.background_sweep {
            Some(c) => println!(
                "  background sweep {} posts into pass {} (last pass: {} posts){}",
                c.posts_done,
                c.passes + 1,
                c.last_pass_posts,
                c.after
                    .as_ref()
                    .map(|p| format!(", after post {p}"))
                    .unwrap_or_default()
            ),
            None => println!("  background sweep not started"),
        }
    }
    println!(
        "dirty backlog     {} posts, oldest {}",
        status.dirty.size,
        status
            .dirty_oldest_age_seconds
            .map(|s| format!("{s}s ago"))
            .unwrap_or_else(|| "-".into())
    );
    match &status.last_reconcile {
        Some(run) => println!(
            "last reconcile    {} ({}): {} posts, {} corrected, total |drift| {} (max {}, high +{}, low {}), {} in flight (retried later)",
            run.finished_at.map(rfc3339).unwrap_or_default(),
            run.kind,
            run.posts,
            run.corrected,
            run.total_abs_drift,
            run.max_abs_drift,
            run.drift_high,
            run.drift_low,
            run.in_flight
        ),
        None => println!("last reconcile    never"),
    }
    Ok(ExitCode::SUCCESS)
}
