//! `counterd status`: where the stream stands, how far behind it is, the dirty backlog, the last
//! few reconcile runs and the last one that corrected a counter.
//!
//! Without `--source` it shows every source's streams and counters (the comments' first, then
//! each `[[sources]]` entry's), as `counterd run` keeps them all; the dirty backlog line, the
//! batch in flight and the reconcile runs are the comments' (each counter's own backlog is on
//! its line). With `--source NAME`, that source alone.

use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use crate::cli::{age_secs, connect, print_json, rfc3339};
use crate::config::Settings;
use crate::outln;
use crate::redact::redact_uri;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{
    Checkpoint, DirtySummary, Lease, RunSummary, SnapshotProgress, SnapshotState, SweepCursor,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Where one stream (or partition) stands.
#[derive(Serialize)]
struct StreamStatus {
    /// The source it reads: `stream_name` for the comments, else a `[[sources]]` entry's name.
    source: String,
    stream: String,
    role: String,
    lease: Option<Lease>,
    /// Why the stream is parked (`counterd run` with `on_fatal = "park"`), as its lease notes it.
    parked: Option<String>,
    checkpoint_token: Option<String>,
    checkpoint_time: Option<String>,
    /// Seconds between the checkpoint's event time and now (the stream lag when events flow).
    lag_seconds: Option<i64>,
    high_water: Option<String>,
    pending_batch: Option<String>,
    /// The deployment the checkpoint's position belongs to (resuming on another is lost history).
    deployment: Option<String>,
    history_gaps: Vec<String>,
    sweep_requested: bool,
    /// The background sweep's pass over every post.
    background_sweep: Option<SweepCursor>,
    /// The initial snapshot of the rows that existed before the stream's start.
    initial_snapshot: Option<SnapshotProgress>,
    /// One line on it for people.
    initial_snapshot_summary: String,
}

#[derive(Serialize)]
struct Status {
    mongodb: String,
    database: String,
    streams: Vec<StreamStatus>,
    dirty: DirtySummary,
    /// Posts a batch in flight is marking dirty (not in `dirty` yet; see `marks_in_flight`).
    dirty_marks_in_flight: usize,
    dirty_oldest_age_seconds: Option<i64>,
    /// The newest reconcile runs (of any process), newest first.
    recent_reconciles: Vec<RunSummary>,
    /// The newest run that corrected at least one counter (it may be older than the above).
    last_correction: Option<RunSummary>,
    /// The memory budget `counterd run` takes with these settings here (`memory_budget`, or
    /// derived from this container's limit); what is in use is the running process's gauge
    /// `counterd_memory_in_use_bytes`.
    memory_budget_bytes: usize,
    /// Where the budget comes from.
    memory_budget_source: String,
    /// Every counter definition, the default first.
    counters: Vec<CounterStatus>,
}

/// One counter definition, as `status` lists it.
#[derive(serde::Serialize)]
struct CounterStatus {
    name: String,
    /// The source whose rows it counts (see [`StreamStatus::source`]).
    source: String,
    group_field: String,
    collection: String,
    /// What it keeps: `count`, `sum` (of [`CounterStatus::sum_of`], in that field's units) or
    /// `rows` (a sum's row count, kept under `rows.` of the sum's documents).
    kind: &'static str,
    /// A sum's summed field.
    #[serde(skip_serializing_if = "Option::is_none")]
    sum_of: Option<String>,
    /// A row count's sum (whose documents hold it under `rows.`).
    #[serde(skip_serializing_if = "Option::is_none")]
    rows_of: Option<String>,
    /// Whether `counterd run` keeps it (every configured definition: one stream and one
    /// ledger serve them all).
    kept: bool,
    /// Its dirty set's size (groups waiting for a recount).
    dirty_backlog: u64,
}

/// How many recent runs `status` shows.
const RECENT_RUNS: usize = 5;

/// One line on the initial snapshot.
fn describe_snapshot(checkpoint: &Checkpoint, rows_per_second: u32) -> String {
    let Some(p) = &checkpoint.snapshot else {
        return "none (the stream counts only what it saw change)".into();
    };
    if !checkpoint.gaps.is_empty() && p.state == SnapshotState::Running {
        return format!(
            "abandoned after {} rows: history was lost, and the sweep after the gap recounts every post instead",
            p.rows_scanned
        );
    }
    match p.state {
        SnapshotState::Running => format!(
            "RUNNING: {} of about {} rows scanned in {} chunks, {} counted; about {} left (folds wait until it is done)",
            p.rows_scanned,
            p.estimated_rows,
            p.chunks_done,
            p.rows_counted,
            crate::snapshot::seconds_left(p, rows_per_second)
                .map(|s| humantime::format_duration(std::time::Duration::from_secs(s)).to_string())
                .unwrap_or_else(|| "unknown".into())
        ),
        SnapshotState::Done => format!(
            "done {}: {} rows scanned, {} counted; after restarts {} chunk(s) finished from their plan, {} read again",
            p.finished_at.map(rfc3339).unwrap_or_default(),
            p.rows_scanned,
            p.rows_counted,
            p.chunks_resumed,
            p.chunks_reread
        ),
        SnapshotState::Abandoned => "abandoned".into(),
    }
}

/// Where `stream`, one of the streams of `source` (settings of one source), stands.
async fn stream_status(
    store: &MongoStore,
    source: &Settings,
    stream: String,
) -> anyhow::Result<StreamStatus> {
    let checkpoint = store.load_checkpoint(&stream).await?.unwrap_or_default();
    let lease = store.read_lease(&stream).await?;
    let now = bson::DateTime::now();
    let role = match &lease {
        Some(l) if l.expires_at > now => format!("active: {} (epoch {})", l.owner, l.epoch),
        // A lease given back (a stopped or parked worker, a replay) expires at the epoch's
        // start: its age would read as 56 years.
        Some(l) if l.expires_at.timestamp_millis() == 0 => {
            format!("no active worker (lease released by {})", l.owner)
        }
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
    let parked = store
        .parked_note(&stream)
        .await?
        .map(|(reason, owner, since)| {
            format!(
                "{reason} since {} (by {owner}; the ERROR line of its log says what to do)",
                rfc3339(since)
            )
        });
    Ok(StreamStatus {
        parked,
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
        deployment: checkpoint.deployment.as_ref().map(|d| d.to_string()),
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
        initial_snapshot_summary: describe_snapshot(&checkpoint, source.snapshot_rows_per_second),
        initial_snapshot: checkpoint.snapshot.clone(),
        source: source.stream_name.clone(),
        stream,
    })
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    // Every source `run` keeps: the comments first (this `settings`'s own), then the others.
    // The first one's store also answers for the dirty backlog and the reconcile runs below.
    let sources = settings.sources()?;
    let mut first_store = None;
    let mut streams = Vec::new();
    let mut counters = Vec::new();
    for source in &sources {
        let source_store = connect(source).await?;
        for (stream, _) in source.streams() {
            streams.push(stream_status(&source_store, source, stream).await?);
        }
        for (ix, d) in source.definitions()?.iter() {
            let backlog = source_store.for_counter(ix).dirty_summary().await?;
            counters.push(CounterStatus {
                name: d.name.clone(),
                source: source.stream_name.clone(),
                group_field: d.group.clone(),
                collection: d.collection.clone(),
                kind: (&d.kind).into(),
                sum_of: d.kind.field().map(String::from),
                rows_of: match &d.kind {
                    crate::core::definition::Kind::Rows { of } => Some(of.clone()),
                    _ => None,
                },
                kept: true,
                dirty_backlog: backlog.size,
            });
        }
        first_store.get_or_insert(source_store);
    }
    let store = first_store.context("no source to show (the settings list none)")?;
    let dirty = store.dirty_summary().await?;
    let status = Status {
        mongodb: redact_uri(&settings.mongodb_uri),
        database: settings.database.clone(),
        streams,
        dirty_oldest_age_seconds: dirty.oldest.map(age_secs),
        dirty_marks_in_flight: crate::cli::marks_in_flight(&settings, &store).await?.len(),
        dirty,
        recent_reconciles: store.recent_runs(RECENT_RUNS).await?,
        last_correction: store.last_correcting_run().await?,
        memory_budget_bytes: settings.memory_budget_bytes(),
        memory_budget_source: match (
            settings.memory_budget,
            crate::budget::cgroup::memory_limit(),
        ) {
            (0, Some(limit)) => {
                format!("derived from the container's memory limit ({limit} bytes)")
            }
            (0, None) => "the default (no container memory limit)".into(),
            _ => "memory_budget".into(),
        },
        counters,
    };
    if args.json {
        return print_json(&status).map(|_| ExitCode::SUCCESS);
    }
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "none".into());
    // Which source a line is about, where there is more than one.
    let of_source = |source: &str| {
        if sources.len() > 1 {
            format!(" (source {source})")
        } else {
            String::new()
        }
    };
    outln!(
        "mongodb           {} (database {})",
        status.mongodb,
        status.database
    );
    outln!(
        "memory budget     {} MiB ({}; in use: counterd_memory_in_use_bytes on /metrics)",
        status.memory_budget_bytes >> 20,
        status.memory_budget_source
    );
    for c in &status.counters {
        outln!(
            "counter           {}: {}per `{}`, in `{}`, {} dirty{}",
            c.name,
            match (&c.sum_of, &c.rows_of) {
                (Some(field), _) => format!("sum of `{field}` "),
                (_, Some(sum)) => format!("the rows `{sum}` adds up (rows.count), "),
                _ => String::new(),
            },
            c.group_field,
            c.collection,
            c.dirty_backlog,
            of_source(&c.source)
        );
    }
    for s in &status.streams {
        outln!("stream            {}{}", s.stream, of_source(&s.source));
        outln!("  role            {}", s.role);
        if let Some(parked) = &s.parked {
            outln!("  PARKED          {parked}");
        }
        outln!("  checkpoint token {}", or_none(&s.checkpoint_token));
        outln!("  checkpoint time {}", or_none(&s.checkpoint_time));
        let lag = s.lag_seconds.map_or("unknown".into(), |l| format!("{l}s"));
        outln!("  stream lag      {lag}");
        outln!("  high water      {}", or_none(&s.high_water));
        outln!("  pending batch   {}", or_none(&s.pending_batch));
        outln!("  initial snapshot {}", s.initial_snapshot_summary);
        outln!("  deployment      {}", or_none(&s.deployment));
        if s.history_gaps.is_empty() {
            outln!("  history gaps    none");
        } else {
            outln!(
                "  HISTORY GAPS    {} (events in them were never seen)",
                s.history_gaps.join(", ")
            );
        }
        let sweep = if s.sweep_requested {
            "YES (runs at the next reconcile)"
        } else {
            "no"
        };
        outln!("  sweep requested {sweep}");
        match &s.background_sweep {
            Some(c) => outln!(
                "  background sweep {} posts into pass {} (last pass: {} posts){}",
                c.posts_done,
                c.passes + 1,
                c.last_pass_posts,
                c.after
                    .as_ref()
                    .map(|p| format!(", after post {p}"))
                    .unwrap_or_default()
            ),
            None => outln!("  background sweep not started"),
        }
    }
    let oldest = status.dirty_oldest_age_seconds;
    let oldest = oldest.map_or("-".into(), |s| format!("{s}s ago"));
    // The marks a batch in flight is still writing.
    let marking = match status.dirty_marks_in_flight {
        0 => String::new(),
        marks => format!(", and {marks} more being marked by the batch in flight"),
    };
    outln!(
        "dirty backlog     {} posts, oldest {oldest}{marking}",
        status.dirty.size
    );
    if status.recent_reconciles.is_empty() {
        outln!("last reconcile    never");
    }
    for (i, run) in status.recent_reconciles.iter().enumerate() {
        let label = if i == 0 { "last reconcile" } else { "" };
        outln!("{label:17} {}", describe_run(run));
    }
    match &status.last_correction {
        Some(run) => outln!("last correction   {}", describe_run(run)),
        None => outln!("last correction   none recorded (runs are kept 30 days)"),
    }
    Ok(ExitCode::SUCCESS)
}

/// One reconcile run on one line; a run of another definition than the default names it (a
/// sum's drift is in its field's units).
fn describe_run(run: &RunSummary) -> String {
    let counter =
        if run.counter.is_empty() || run.counter == crate::core::definition::DEFAULT_COUNTER {
            String::new()
        } else {
            format!(", counter {}", run.counter)
        };
    format!(
        "{} ({}{counter}): {} posts, {} corrected, total |drift| {} (max {}, high +{}, low {}), {} in flight (retried later){}",
        run.finished_at.map(rfc3339).unwrap_or_else(|| "?".into()),
        run.kind,
        run.posts,
        run.corrected,
        run.total_abs_drift,
        run.max_abs_drift,
        run.drift_high,
        run.drift_low,
        run.in_flight,
        run.longest_dirty_to_fold_secs
            .map(|s| format!(", longest dirty-to-fold {s}s"))
            .unwrap_or_default()
    )
}
