//! `counterd-bench`: measures counterd against the test database, in one run, on one server.
//!
//! 1. the raw tail rate: a bare change-stream reader that only counts events (this server's
//!    limit);
//! 2. the worker's throughput over the same backlog, as a ratio to (1);
//! 3. the seed's hot path (one `$inc` per event, sequential) against counterd's coalesced counter
//!    writes, on a Zipf(1.1) and on a uniform post distribution;
//! 4. event-to-counter lag (median, p99) at a fixed offered rate;
//! 5. reconcile cost against the dirty fraction, compared with a full sweep;
//! 6. peak memory (RSS) of the bench process and of a worker process on its own.
//!
//! Throughput phases replay a pre-written backlog (the stream starts at a cluster time just
//! before the load), so the tail and apply rates are measured apart from the writer. Every phase
//! uses a fresh database. The result is a table on stdout and a JSON file; targets that are
//! missed are reported (MISSED), never turned into a failure: the process exits non-zero only
//! when the benchmark itself breaks.
//!
//! Usage: `cargo run --release -p counterd-bench -- [--quick] [--out bench/latest.json]`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bson::{doc, Bson, DateTime, Document, Timestamp};
use clap::Parser;
use counterd::event::PostId;
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::store::mongo::{Collections, ConnectOptions, MongoStore, OpCounts};
use counterd::store::prelude::*;
use counterd::store::{Fence, StreamOptions, StreamStart};
use counterd::worker::{Worker, WorkerSettings, WorkerStatus};
use counterd_testdb::{ServerKind, TestServer};
use futures::TryStreamExt;
use mongodb::Collection;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// Targets (ratios and bounds, same run), from the benchmark's brief.
const TARGET_WORKER_VS_TAIL: f64 = 0.80;
const TARGET_ZIPF_WRITES: f64 = 0.20;
const TARGET_RECONCILE_1PCT: f64 = 0.03;
const TARGET_LAG_MEDIAN_MS: f64 = 1000.0;
const TARGET_LAG_RATE: f64 = 5000.0;
const TARGET_RSS_MB: f64 = 50.0;
const ZIPF_EXPONENT: f64 = 1.1;
const DIRTY_FRACTIONS: [f64; 3] = [0.001, 0.01, 0.1];

/// Benchmark counterd against the test database (see `counterd_testdb`).
#[derive(Debug, Parser)]
#[command(name = "counterd-bench", about, long_about = None)]
struct Args {
    /// Small sizes (under two minutes): used in CI only to check that the benchmark still works.
    #[arg(long)]
    quick: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench/latest.json")]
    out: PathBuf,
    /// Events per backlog (tail, worker and baseline phases). Default: 5000 quick; full: 100000,
    /// or 20000 on the fake server (sized when its guarded updates scanned whole collections).
    #[arg(long)]
    events: Option<usize>,
    /// Posts seeded for the reconcile phase. Default: 5000 quick; full: 100000, or 10000 on the
    /// fake server (every recount there scans the whole `comments` collection).
    #[arg(long)]
    posts: Option<usize>,
    /// Distinct posts the event load is drawn from (Zipf ranks or uniform). Default: 10000.
    #[arg(long, default_value_t = 10_000)]
    load_posts: usize,
    /// Offered rate of the lag phase, events per second.
    #[arg(long, default_value_t = 5000)]
    lag_rate: u32,
    /// Duration of the lag phase's writer, seconds. Default: 5 quick, 20 full.
    #[arg(long)]
    lag_secs: Option<u64>,
    /// The worker's batch size (counterd's default: 1000).
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Internal: run a bare worker as a child process (for its RSS) and exit.
    #[arg(long, hide = true, num_args = 4, value_names = ["URI", "DATABASE", "START_SECS", "EVENTS"])]
    child_worker: Option<Vec<String>>,
}

/// Sizes of one run.
#[derive(Clone, Debug, Serialize)]
struct Plan {
    mode: &'static str,
    /// Full-mode defaults were reduced because the server is the fake one.
    reduced_for_fake_server: bool,
    events: usize,
    load_posts: usize,
    posts: usize,
    comments_per_post_mean: f64,
    lag_rate: u32,
    lag_secs: u64,
    /// How long the lag phase waits for unseen probes after its writer stops.
    lag_drain_secs: u64,
    batch_size: usize,
    zipf_exponent: f64,
}

impl Plan {
    fn from(args: &Args, kind: ServerKind) -> Plan {
        let quick = args.quick;
        // The fake server has no secondary indexes, so a sweep is quadratic in the number of
        // posts; and until its launcher's `_id`-index lookup (2026-12-03) it scanned for any
        // filter beyond exactly `_id`, so the worker was quadratic in the backlog. Full-mode
        // defaults sized then to finish within ~10 minutes there; not re-measured since.
        let fake = kind == ServerKind::Fake;
        let (full_events, full_posts) = if fake {
            (20_000, 10_000)
        } else {
            (100_000, 100_000)
        };
        Plan {
            mode: if quick { "quick" } else { "full" },
            reduced_for_fake_server: !quick
                && fake
                && (args.events.is_none() || args.posts.is_none()),
            events: args
                .events
                .unwrap_or(if quick { 5_000 } else { full_events }),
            load_posts: args.load_posts.max(1),
            posts: args.posts.unwrap_or(if quick { 5_000 } else { full_posts }),
            comments_per_post_mean: 3.0,
            lag_rate: args.lag_rate.max(1),
            lag_secs: args.lag_secs.unwrap_or(if quick { 5 } else { 20 }),
            lag_drain_secs: if quick { 15 } else { 60 },
            batch_size: args.batch_size.max(1),
            zipf_exponent: ZIPF_EXPONENT,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Status {
    Met,
    Missed,
    /// Reported for context; no target.
    Info,
    /// The target could not be judged in this run (the note says why).
    NotJudged,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Met => "MET",
            Status::Missed => "MISSED",
            Status::Info => "-",
            Status::NotJudged => "N/A",
        }
    }
    fn of(met: bool) -> Status {
        if met {
            Status::Met
        } else {
            Status::Missed
        }
    }
}

/// One line of the results table.
#[derive(Clone, Debug, Serialize)]
struct Row {
    key: String,
    metric: String,
    value: f64,
    unit: &'static str,
    baseline: Option<f64>,
    baseline_of: Option<String>,
    ratio: Option<f64>,
    target: Option<String>,
    status: Status,
    note: Option<String>,
}

impl Row {
    fn info(key: &str, metric: &str, value: f64, unit: &'static str) -> Row {
        Row {
            key: key.into(),
            metric: metric.into(),
            value,
            unit,
            baseline: None,
            baseline_of: None,
            ratio: None,
            target: None,
            status: Status::Info,
            note: None,
        }
    }
    fn against(mut self, baseline: f64, of: &str) -> Row {
        self.baseline = Some(baseline);
        self.baseline_of = Some(of.into());
        self.ratio = (baseline != 0.0).then(|| self.value / baseline);
        self
    }
    fn target(mut self, text: &str, status: Status) -> Row {
        self.target = Some(text.into());
        self.status = status;
        self
    }
    fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

/// Everything written to the JSON file.
#[derive(Serialize)]
struct Report {
    date: String,
    command: String,
    machine: Machine,
    server: ServerInfo,
    plan: Plan,
    rows: Vec<Row>,
    phases: serde_json::Map<String, serde_json::Value>,
    total_secs: f64,
}

#[derive(Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    memory_gib: f64,
    arch: &'static str,
    kernel: String,
}

#[derive(Serialize)]
struct ServerInfo {
    kind: String,
    description: String,
    version: String,
    wire_version: i32,
    /// The fake only: whether its launcher serves `_id`-equality filters from the `_id` index
    /// (`counterd_testdb::FAKE_ID_INDEX_VAR`).
    fake_id_index: Option<bool>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("counterd-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(child) = &args.child_worker {
        return match runtime.block_on(child_worker(child)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("counterd-bench child worker: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match runtime.block_on(bench(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("counterd-bench: the benchmark broke: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Progress on stderr, so stdout holds only the table.
macro_rules! say {
    ($($t:tt)*) => { eprintln!("[bench {:>7.1}s] {}", START.get().map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0), format!($($t)*)) };
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// What the phases add up: the table's rows and each phase's raw figures for the JSON file.
#[derive(Default)]
struct Collected {
    rows: Vec<Row>,
    phases: serde_json::Map<String, serde_json::Value>,
}

/// The run, phase by phase, in the order that keeps the measurements apart (see the module
/// documentation for why the worker's memory is taken before the reconcile phase).
async fn bench(args: Args) -> anyhow::Result<()> {
    START.get_or_init(Instant::now);
    let (server, plan, bench, server_info) = start(&args).await?;
    let mut out = Collected::default();
    let (zipf, uniform, bench_rss_mb) = throughput_phase(&bench, &plan, &mut out).await?;
    seed_phase(&bench, &plan, &zipf, &uniform, &mut out).await?;
    lag_phase(&bench, &plan, &zipf, &mut out).await?;
    // 6. Memory of a worker process on its own (before the reconcile phase: it tails a stream,
    // and the fake server's change streams slow down as its oplog grows).
    let child = bench.child_rss(&plan).await?;
    out.phases
        .insert("worker_process_rss".into(), serde_json::to_value(&child)?);
    reconcile_phase(&bench, &plan, &mut out).await?;
    memory_rows(&child, bench_rss_mb, &mut out);
    write_report(&args, server_info, plan, out)?;
    drop(server);
    Ok(())
}

/// The test database, the plan for it, and what the server says it is.
async fn start(args: &Args) -> anyhow::Result<(TestServer, Plan, Bench, ServerInfo)> {
    START.get_or_init(Instant::now);
    let server = tokio::task::spawn_blocking(TestServer::start)
        .await?
        .map_err(|e| anyhow!("cannot start the test database: {e}"))?;
    let plan = Plan::from(args, server.kind);
    say!("plan: {plan:?}");
    let bench = Bench {
        uri: server.uri.clone(),
        run_id: format!("b{}", std::process::id() % 100_000),
    };
    let probe = bench.store("probe").await?;
    let abilities = probe.abilities().await?;
    bench.drop_db(&probe).await;
    let server_info = ServerInfo {
        kind: format!("{:?}", server.kind),
        description: describe_server(&server),
        version: abilities.version.clone(),
        wire_version: abilities.wire_version,
        fake_id_index: server.fake_id_index(),
    };
    say!(
        "server: {} (reports MongoDB {}, wire {})",
        server_info.description,
        abilities.version,
        abilities.wire_version
    );

    Ok((server, plan, bench, server_info))
}

/// 1-2. Warm-up, then tail rate, worker throughput and coalescing on Zipf and uniform backlogs;
/// the bench process's memory after them.
async fn throughput_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<(Throughput, Throughput, Option<f64>)> {
    // Warm-up (the fake server is a JVM): a small backlog through both readers, not reported.
    let warm = (plan.events / 10).clamp(500, 5_000);
    let w = bench.throughput("warmup", Dist::Zipf, warm, plan).await?;
    out.phases
        .insert("warmup".into(), serde_json::to_value(&w)?);

    // 1-3. Tail rate, worker throughput and coalescing on Zipf; coalescing on uniform.
    let zipf = bench
        .throughput("zipf", Dist::Zipf, plan.events, plan)
        .await?;
    out.phases
        .insert("zipf".into(), serde_json::to_value(&zipf)?);
    let uniform = bench
        .throughput("uniform", Dist::Uniform, plan.events, plan)
        .await?;
    out.phases
        .insert("uniform".into(), serde_json::to_value(&uniform)?);
    let bench_rss_mb = vm_hwm_kb(None).map(|kb| kb as f64 / 1024.0);

    out.rows.push(
        Row::info(
            "raw_tail_rate",
            "1. raw tail rate (bare change-stream reader, Zipf backlog)",
            zipf.raw_rate,
            "events/s",
        )
        .note(format!(
            "{} events in {:.3} s (median of 3 reads of the backlog)",
            zipf.events, zipf.raw_secs
        )),
    );
    out.rows.push(
        Row::info(
            "worker_rate",
            "2. worker throughput (Zipf backlog)",
            zipf.worker_rate,
            "events/s",
        )
        .against(zipf.raw_rate, "raw tail rate")
        .target(
            &format!(">= {TARGET_WORKER_VS_TAIL:.2} x raw tail"),
            Status::of(zipf.worker_rate >= TARGET_WORKER_VS_TAIL * zipf.raw_rate),
        )
        .note(format!(
            "{} events in {:.2} s",
            zipf.events, zipf.worker_secs
        )),
    );
    out.rows.push(
        Row::info(
            "worker_rate_uniform",
            "2. worker throughput (uniform backlog)",
            uniform.worker_rate,
            "events/s",
        )
        .against(uniform.raw_rate, "raw tail rate (uniform backlog)"),
    );
    out.rows.push(
        Row::info(
            "guard_probe",
            "2. why: 1000 guarded ledger updates (worker's filter shape)",
            zipf.guard_probe.guarded_ms,
            "ms",
        )
        .against(zipf.guard_probe.id_only_ms, "same updates on _id alone")
        .note(format!(
            "on a ledger of {} documents; a ratio far above 1 means the server scans the collection for the worker's guarded filter",
            zipf.guard_probe.ledger_docs
        )),
    );

    Ok((zipf, uniform, bench_rss_mb))
}

/// 3. The seed's hot path against counterd's coalesced writes.
async fn seed_phase(
    bench: &Bench,
    plan: &Plan,
    zipf: &Throughput,
    uniform: &Throughput,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let n = plan.events as f64;
    // 3. The seed's hot path: one sequential `$inc` per event.
    let base_zipf = bench.baseline("seed_zipf", &zipf.posts).await?;
    let base_uniform = bench.baseline("seed_uniform", &uniform.posts).await?;
    out.phases.insert(
        "seed_baseline".into(),
        serde_json::json!({"zipf": base_zipf, "uniform": base_uniform}),
    );
    out.rows.push(
        Row::info(
            "zipf_counter_writes",
            "3. counter writes, Zipf(1.1): counterd coalesced",
            zipf.ops.counter_statements as f64,
            "writes",
        )
        .against(n, "seed: one $inc per event")
        .target(
            &format!("<= {TARGET_ZIPF_WRITES:.2} x seed"),
            Status::of((zipf.ops.counter_statements as f64) <= TARGET_ZIPF_WRITES * n),
        )
        .note(format!(
            "batch_size {}, {} posts; plus {} ledger writes (one per event, ledger attribution)",
            plan.batch_size, plan.load_posts, zipf.ops.ledger_statements
        )),
    );
    // What per-batch coalescing would give with larger batches, computed from the same Zipf
    // sequence (the first line should match the worker's measured count).
    let model: Vec<(usize, usize)> = [1, 5, 10]
        .iter()
        .map(|m| plan.batch_size * m)
        .filter(|window| *window <= plan.events.max(plan.batch_size))
        .map(|window| (window, windowed_distinct(&zipf.posts, window)))
        .collect();
    out.phases.insert(
        "zipf_coalescing_by_batch_size".into(),
        serde_json::json!(model
            .iter()
            .map(|(w, d)| serde_json::json!({"batch_size": w, "writes": d, "ratio": *d as f64 / n}))
            .collect::<Vec<_>>()),
    );
    if let Some((window, writes)) = model.last().filter(|_| model.len() > 1) {
        out.rows.push(
            Row::info(
                "zipf_writes_larger_batches",
                &format!("3. Zipf writes if batches held {window} events (computed)"),
                *writes as f64,
                "writes",
            )
            .against(n, "seed: one $inc per event")
            .note(format!(
                "distinct posts per {window}-event window of the same sequence; at {} events per window: {} (measured: {})",
                plan.batch_size, model[0].1, zipf.ops.counter_statements
            )),
        );
    }
    out.rows.push(
        Row::info(
            "uniform_counter_writes",
            "3. counter writes, uniform: counterd coalesced",
            uniform.ops.counter_statements as f64,
            "writes",
        )
        .against(n, "seed: one $inc per event")
        .note(format!(
            "plus {} ledger writes",
            uniform.ops.ledger_statements
        )),
    );
    out.rows.push(
        Row::info(
            "seed_time_zipf",
            "3. seed hot path time (N sequential $inc, Zipf)",
            base_zipf.secs,
            "s",
        )
        .note(format!("{:.0} writes/s", base_zipf.rate)),
    );
    out.rows.push(
        Row::info(
            "worker_time_zipf",
            "3. counterd worker time (same N, Zipf, tail included)",
            zipf.worker_secs,
            "s",
        )
        .against(base_zipf.secs, "seed hot path time"),
    );
    out.rows.push(
        Row::info(
            "seed_time_uniform",
            "3. seed hot path time (N sequential $inc, uniform)",
            base_uniform.secs,
            "s",
        )
        .note(format!("{:.0} writes/s", base_uniform.rate)),
    );
    out.rows.push(
        Row::info(
            "worker_time_uniform",
            "3. counterd worker time (same N, uniform, tail included)",
            uniform.worker_secs,
            "s",
        )
        .against(base_uniform.secs, "seed hot path time"),
    );

    Ok(())
}

/// 4. Event-to-counter lag.
async fn lag_phase(
    bench: &Bench,
    plan: &Plan,
    zipf: &Throughput,
    out: &mut Collected,
) -> anyhow::Result<()> {
    // 4. Lag at a fixed offered rate; and, where the worker cannot sustain that rate on this
    // server, also at half its measured throughput (the lag floor when it keeps up).
    let lag = bench.lag("lag", plan, plan.lag_rate).await?;
    out.phases.insert("lag".into(), serde_json::to_value(&lag)?);
    let at_target_rate = lag.achieved_rate >= 0.95 * TARGET_LAG_RATE;
    let lag_note = format!(
        "offered {}/s, achieved {:.0}/s for {:.1} s; {} probes, {} not seen within {} s after the writer stopped (counted at that cut-off, which makes the figures lower bounds when any are); worker applied {} of {} events by then",
        plan.lag_rate, lag.achieved_rate, lag.writer_secs, lag.probes, lag.missing, plan.lag_drain_secs, lag.worker_applied, lag.events
    );
    let lag_status = if at_target_rate {
        Status::of(lag.median_ms < TARGET_LAG_MEDIAN_MS)
    } else {
        Status::NotJudged
    };
    out.rows.push(
        Row::info(
            "lag_median",
            &format!("4. event-to-counter lag, median, at {}/s", plan.lag_rate),
            lag.median_ms,
            "ms",
        )
        .target(
            &format!("< {TARGET_LAG_MEDIAN_MS:.0} ms at {TARGET_LAG_RATE:.0}/s"),
            lag_status,
        )
        .note(if at_target_rate {
            lag_note
        } else {
            format!("{lag_note}; the writer did not reach {TARGET_LAG_RATE:.0}/s, so the target is not judged")
        }),
    );
    out.rows.push(Row::info(
        "lag_p99",
        &format!("4. event-to-counter lag, p99, at {}/s", plan.lag_rate),
        lag.p99_ms,
        "ms",
    ));
    let sustainable = ((zipf.worker_rate * 0.5 / 100.0).floor() * 100.0).max(100.0) as u32;
    if sustainable < plan.lag_rate {
        let low = bench.lag("lag_sustainable", plan, sustainable).await?;
        out.phases
            .insert("lag_sustainable".into(), serde_json::to_value(&low)?);
        out.rows.push(
            Row::info(
                "lag_median_sustainable",
                &format!("4. lag, median, at {sustainable}/s (half the worker's rate)"),
                low.median_ms,
                "ms",
            )
            .note(format!(
                "achieved {:.0}/s for {:.1} s; {} probes, {} not seen",
                low.achieved_rate, low.writer_secs, low.probes, low.missing
            )),
        );
        out.rows.push(Row::info(
            "lag_p99_sustainable",
            &format!("4. lag, p99, at {sustainable}/s"),
            low.p99_ms,
            "ms",
        ));
    }

    Ok(())
}

/// 5. Reconcile cost against the dirty fraction.
async fn reconcile_phase(bench: &Bench, plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let rec = bench.reconcile(plan).await?;
    out.phases
        .insert("reconcile".into(), serde_json::to_value(&rec)?);
    out.rows.push(
        Row::info(
            "full_sweep_time",
            "5. full sweep (all posts recounted)",
            rec.sweep_secs,
            "s",
        )
        .note(format!(
            "{} posts, {} count queries",
            plan.posts, rec.sweep_counts
        )),
    );
    for d in &rec.dirty {
        let pct = d.fraction * 100.0;
        let key = format!("reconcile_dirty_{pct}pct");
        let metric = format!("5. reconcile run, {pct}% dirty ({} posts)", d.posts);
        let mut row = Row::info(&key, &metric, d.secs, "s")
            .against(rec.sweep_secs, "full sweep time")
            .note(format!(
                "{} count queries ({:.4} x the sweep's {})",
                d.counts,
                d.counts as f64 / rec.sweep_counts.max(1) as f64,
                rec.sweep_counts
            ));
        if (d.fraction - 0.01).abs() < 1e-9 {
            row = row.target(
                &format!("<= {TARGET_RECONCILE_1PCT:.2} x sweep"),
                Status::of(d.secs <= TARGET_RECONCILE_1PCT * rec.sweep_secs),
            );
        }
        out.rows.push(row);
    }

    Ok(())
}

/// 6. Memory rows: the worker process on its own, and this process.
fn memory_rows(child: &ChildRss, bench_rss_mb: Option<f64>, out: &mut Collected) {
    out.rows.push(match child.peak_rss_mb {
        Some(mb) => Row::info("worker_rss", "6. worker process peak RSS (VmHWM)", mb, "MB")
            .target(
                &format!("< {TARGET_RSS_MB:.0} MB"),
                Status::of(mb < TARGET_RSS_MB),
            )
            .note(child.what.clone()),
        None => Row::info(
            "worker_rss",
            "6. worker process peak RSS (VmHWM)",
            f64::NAN,
            "MB",
        )
        .target(&format!("< {TARGET_RSS_MB:.0} MB"), Status::NotJudged)
        .note(format!("not measured: {}", child.what)),
    });
    out.rows.push(
        Row::info(
            "bench_rss",
            "6. bench process peak RSS (worker + load generator)",
            bench_rss_mb.unwrap_or(f64::NAN),
            "MB",
        )
        .note("VmHWM of this process after the throughput phases; holds the load data too"),
    );
}

/// The table on stdout and the JSON file.
fn write_report(
    args: &Args,
    server_info: ServerInfo,
    plan: Plan,
    out: Collected,
) -> anyhow::Result<()> {
    let report = Report {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        server: server_info,
        plan,
        rows: out.rows,
        phases: out.phases,
        total_secs: START
            .get()
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0),
    };
    print_table(&report);
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("write {}", args.out.display()))?;
    say!("results written to {}", args.out.display());
    Ok(())
}

/// How posts of an event load are drawn.
#[derive(Clone, Copy, Debug)]
enum Dist {
    Zipf,
    Uniform,
}

fn draw_posts(dist: Dist, n: usize, posts: usize, seed: u64) -> anyhow::Result<Vec<i64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    Ok(match dist {
        Dist::Zipf => {
            let zipf = Zipf::new(posts as f64, ZIPF_EXPONENT).map_err(|e| anyhow!("zipf: {e}"))?;
            (0..n).map(|_| zipf.sample(&mut rng) as i64).collect()
        }
        Dist::Uniform => (0..n).map(|_| rng.random_range(1..=posts as i64)).collect(),
    })
}

/// The server and a name for this run's databases.
struct Bench {
    uri: String,
    run_id: String,
}

#[derive(Debug, Serialize)]
struct Throughput {
    events: usize,
    distinct_posts: usize,
    load_secs: f64,
    raw_secs: f64,
    /// Every bare read of the backlog (the median is `raw_secs`).
    raw_reads_secs: Vec<f64>,
    raw_rate: f64,
    worker_secs: f64,
    worker_rate: f64,
    ops: Ops,
    /// How this server executes the worker's guarded statements.
    guard_probe: GuardProbe,
    #[serde(skip)]
    posts: Vec<i64>,
}

/// One `update` command of the worker's guarded statement shape (`_id` + `applied_through` +
/// `epoch`) against the same statements filtered on `_id` alone, on the filled ledger.
#[derive(Debug, Serialize)]
struct GuardProbe {
    statements: usize,
    ledger_docs: u64,
    guarded_ms: f64,
    id_only_ms: f64,
}

#[derive(Debug, Default, Serialize)]
struct Ops {
    counter_statements: u64,
    ledger_statements: u64,
    count_queries: u64,
}

impl Ops {
    fn between(before: OpCounts, after: OpCounts) -> Ops {
        Ops {
            counter_statements: after.counter_statements - before.counter_statements,
            ledger_statements: after.ledger_statements - before.ledger_statements,
            count_queries: after.count_queries - before.count_queries,
        }
    }
}

#[derive(Debug, Serialize)]
struct Baseline {
    writes: usize,
    secs: f64,
    rate: f64,
}

#[derive(Debug, Serialize)]
struct Lag {
    offered_rate: u32,
    achieved_rate: f64,
    writer_secs: f64,
    events: usize,
    probes: usize,
    missing: usize,
    median_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    worker_applied: i64,
}

#[derive(Debug, Serialize)]
struct ChildRss {
    what: String,
    peak_rss_mb: Option<f64>,
    events: usize,
    secs: f64,
}

#[derive(Debug, Serialize)]
struct Reconcile {
    posts: usize,
    comments: usize,
    seed_secs: f64,
    initial_sweep_secs: f64,
    sweep_secs: f64,
    sweep_counts: u64,
    dirty: Vec<DirtyRun>,
}

#[derive(Debug, Serialize)]
struct DirtyRun {
    fraction: f64,
    posts: usize,
    secs: f64,
    counts: u64,
    reconciled: u64,
}

/// A cluster time a moment before now: a stream started there replays what follows.
fn just_before_now() -> Timestamp {
    Timestamp {
        time: (chrono::Utc::now().timestamp() - 1) as u32,
        increment: 0,
    }
}

/// The worker's settings: counterd's defaults, starting at `start`.
/// The worker measured: it applies the stream from `start` (the events written for the
/// benchmark); no initial snapshot, whose scan would be measured instead.
fn worker_settings(plan: &Plan, start: Timestamp) -> WorkerSettings {
    WorkerSettings {
        batch_size: plan.batch_size,
        start_at: Some(start),
        snapshot: no_snapshot(),
        ..WorkerSettings::default()
    }
}

fn no_snapshot() -> counterd::snapshot::SnapshotSettings {
    counterd::snapshot::SnapshotSettings {
        initial: counterd::snapshot::InitialSnapshot::Never,
        ..Default::default()
    }
}

/// A worker running in this process.
struct Running {
    stop: watch::Sender<bool>,
    handle: tokio::task::JoinHandle<Result<(), String>>,
    status: Arc<WorkerStatus>,
}

impl Running {
    fn spawn(store: Arc<MongoStore>, settings: WorkerSettings) -> Running {
        let (stop, rx) = watch::channel(false);
        let status = Arc::new(WorkerStatus::default());
        let worker = Worker::new(store, settings, status.clone());
        let handle =
            tokio::spawn(async move { worker.run(0, rx).await.map_err(|e| e.to_string()) });
        Running {
            stop,
            handle,
            status,
        }
    }

    fn applied(&self) -> i64 {
        self.status.events_applied.load(Ordering::Relaxed)
    }

    /// Waits until `n` events are applied; fails if the worker stops or `within` passes.
    async fn wait_applied(&mut self, n: i64, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while self.applied() < n {
            if self.handle.is_finished() {
                let result = (&mut self.handle).await?;
                bail!(
                    "the worker stopped after {} of {n} events: {result:?}",
                    self.applied()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the worker applied only {} of {n} events within {within:?}",
                    self.applied()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }

    async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.handle
            .await?
            .map_err(|e| anyhow!("the worker failed: {e}"))
    }
}

/// Generous bound for a phase that processes `n` events.
fn phase_timeout(n: usize) -> Duration {
    Duration::from_secs(300 + n as u64 / 50)
}

impl Bench {
    async fn store(&self, phase: &str) -> anyhow::Result<Arc<MongoStore>> {
        let store = MongoStore::connect(&ConnectOptions {
            uri: self.uri.clone(),
            database: self.db_name(phase),
            comments: "comments".into(),
            connect_timeout: Duration::from_secs(10),
            collections: Collections::default(),
            schema: counterd::schema::Schema::default(),
        })
        .await?;
        store.ensure_indexes().await?;
        Ok(Arc::new(store))
    }

    fn db_name(&self, phase: &str) -> String {
        format!("bench_{}_{phase}", self.run_id)
    }

    /// Drops a phase's database (the benchmark leaves nothing behind on a shared server).
    async fn drop_db(&self, store: &MongoStore) {
        let _ = store.database().drop().await;
    }

    /// Inserts comments for `posts` (one event each) in chunks; returns the time taken.
    async fn load(
        &self,
        comments: &Collection<Document>,
        posts: &[i64],
        created: DateTime,
    ) -> anyhow::Result<f64> {
        let started = Instant::now();
        for (c, chunk) in posts.chunks(1000).enumerate() {
            let docs: Vec<Document> = chunk
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    doc! {"_id": (c * 1000 + i) as i64, "post_id": *p, "created_at": created, "body": "benchmark comment"}
                })
                .collect();
            comments.insert_many(docs).await?;
        }
        Ok(started.elapsed().as_secs_f64())
    }

    /// Writes a backlog of `n` events, then replays it through the bare reader and through the
    /// worker (both from a cluster time just before the load).
    async fn throughput(
        &self,
        phase: &str,
        dist: Dist,
        n: usize,
        plan: &Plan,
    ) -> anyhow::Result<Throughput> {
        let seed = match dist {
            Dist::Zipf => 11,
            Dist::Uniform => 12,
        };
        let posts = draw_posts(dist, n, plan.load_posts, seed)?;
        let distinct = {
            let mut p = posts.clone();
            p.sort_unstable();
            p.dedup();
            p.len()
        };
        let store = self.store(phase).await?;
        let comments = store.database().collection::<Document>("comments");
        let start = just_before_now();
        say!("{phase}: loading {n} events ({distinct} distinct posts) ...");
        let load_secs = self.load(&comments, &posts, DateTime::now()).await?;
        say!("{phase}: loaded in {load_secs:.2} s; bare reader ...");

        // The bare reader: open the stream at `start` and count events until all are seen.
        // Three reads of the same backlog (it only reads), the median kept.
        let timeout = phase_timeout(n);
        let mut reads = Vec::new();
        for _ in 0..3 {
            reads.push(bare_read(&store, start, n, plan.batch_size, timeout).await?);
        }
        reads.sort_by(f64::total_cmp);
        let raw_secs = reads[1];
        say!(
            "{phase}: bare reader {raw_secs:.3} s ({:.0} events/s; reads {reads:.3?}); worker ...",
            n as f64 / raw_secs
        );

        // The worker over the same backlog.
        let before = store.op_counts();
        let started = Instant::now();
        let mut worker = Running::spawn(store.clone(), worker_settings(plan, start));
        worker.wait_applied(n as i64, timeout).await?;
        let worker_secs = started.elapsed().as_secs_f64();
        let ops = Ops::between(before, store.op_counts());
        worker.shutdown().await?;
        let guard_probe = guard_probe(&store, n).await?;
        say!(
            "{phase}: worker {worker_secs:.2} s ({:.0} events/s), {} counter writes, {} ledger writes",
            n as f64 / worker_secs,
            ops.counter_statements,
            ops.ledger_statements
        );
        self.drop_db(&store).await;
        Ok(Throughput {
            events: n,
            distinct_posts: distinct,
            load_secs,
            raw_secs,
            raw_reads_secs: reads,
            raw_rate: n as f64 / raw_secs,
            worker_secs,
            worker_rate: n as f64 / worker_secs,
            ops,
            guard_probe,
            posts,
        })
    }

    /// The seed's hot path: one upserting `$inc` per event, one after another.
    async fn baseline(&self, phase: &str, posts: &[i64]) -> anyhow::Result<Baseline> {
        let store = self.store(phase).await?;
        let counters = store.database().collection::<Document>("seed_counters");
        say!("{phase}: {} sequential $inc writes ...", posts.len());
        let started = Instant::now();
        for p in posts {
            counters
                .update_one(doc! {"_id": *p}, doc! {"$inc": {"count": 1_i64}})
                .upsert(true)
                .await?;
        }
        let secs = started.elapsed().as_secs_f64();
        say!(
            "{phase}: {secs:.2} s ({:.0} writes/s)",
            posts.len() as f64 / secs
        );
        self.drop_db(&store).await;
        Ok(Baseline {
            writes: posts.len(),
            secs,
            rate: posts.len() as f64 / secs,
        })
    }

    /// A writer at a fixed offered rate against a live worker; every k-th insert goes to a
    /// fresh probe post, whose counter is polled until it shows the comment.
    async fn lag(&self, phase: &str, plan: &Plan, offered: u32) -> anyhow::Result<Lag> {
        let store = self.store(phase).await?;
        let db = store.database().clone();
        db.create_collection("comments").await?;
        let comments = db.collection::<Document>("comments");
        let counters = db.collection::<Document>(&Collections::default().counters);
        let mut worker = Running::spawn(store.clone(), worker_settings(plan, just_before_now()));
        let open_by = Instant::now() + Duration::from_secs(30);
        while !worker.status.stream_open.load(Ordering::Relaxed) {
            if worker.handle.is_finished() || Instant::now() > open_by {
                let _ = worker.stop.send(true);
                let result = (&mut worker.handle).await?;
                bail!("{phase}: the worker did not open its stream: {result:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let rate = offered as f64;
        let total = (rate * plan.lag_secs as f64) as usize;
        let every = (offered as usize / 20).max(1); // ~20 probes per second
        let background = draw_posts(Dist::Zipf, total, plan.load_posts, 13)?;
        let outstanding: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let lags: Arc<Mutex<Vec<f64>>> = Arc::default();
        let (done_tx, done_rx) = watch::channel(false);

        // The sampler: one `$in` query over the outstanding probes every 25 ms.
        let sampler = {
            let (outstanding, lags, counters) =
                (outstanding.clone(), lags.clone(), counters.clone());
            tokio::spawn(async move {
                loop {
                    let ids: Vec<Bson> = outstanding
                        .lock()
                        .expect("probe map")
                        .keys()
                        .map(|k| Bson::String(k.clone()))
                        .collect();
                    if ids.is_empty() && *done_rx.borrow() {
                        return Ok::<(), anyhow::Error>(());
                    }
                    if !ids.is_empty() {
                        let found: Vec<Document> = counters
                            .find(doc! {"_id": {"$in": ids}})
                            .projection(doc! {"base_count": 1, "live_delta": 1})
                            .await?
                            .try_collect()
                            .await?;
                        let now = Instant::now();
                        let mut map = outstanding.lock().expect("probe map");
                        for d in found {
                            let shown = int(&d, "base_count") + int(&d, "live_delta");
                            if shown < 1 {
                                continue;
                            }
                            if let Some(sent) = d.get_str("_id").ok().and_then(|id| map.remove(id))
                            {
                                lags.lock()
                                    .expect("lags")
                                    .push((now - sent).as_secs_f64() * 1000.0);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            })
        };

        say!(
            "{phase}: writer at {offered} events/s for {} s ...",
            plan.lag_secs
        );
        let created = DateTime::now();
        let started = Instant::now();
        let mut sent = 0;
        let mut probes = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while sent < total {
            tick.tick().await;
            let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(total);
            let upto = due.min(sent + 2000);
            if upto <= sent {
                continue;
            }
            let now = Instant::now();
            let docs: Vec<Document> = (sent..upto)
                .map(|i| {
                    let post = if i % every == 0 {
                        let id = format!("probe-{i}");
                        outstanding.lock().expect("probe map").insert(id.clone(), now);
                        probes += 1;
                        Bson::String(id)
                    } else {
                        Bson::Int64(background[i])
                    };
                    doc! {"_id": i as i64, "post_id": post, "created_at": created, "t_ms": DateTime::now(), "body": "lag probe"}
                })
                .collect();
            comments.insert_many(docs).await?;
            sent = upto;
        }
        let writer_secs = started.elapsed().as_secs_f64();
        say!(
            "{phase}: writer done, {sent} events in {writer_secs:.1} s ({:.0}/s); waiting for the probes ...",
            sent as f64 / writer_secs
        );
        // Let the worker catch up (bounded), then stop the sampler.
        let cutoff = Instant::now() + Duration::from_secs(plan.lag_drain_secs);
        while !outstanding.lock().expect("probe map").is_empty() && Instant::now() < cutoff {
            if worker.handle.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let missing: Vec<Instant> = outstanding
            .lock()
            .expect("probe map")
            .drain()
            .map(|(_, t)| t)
            .collect();
        let _ = done_tx.send(true);
        sampler.await??;
        let applied = worker.applied();
        worker.shutdown().await?;
        let mut lags = std::mem::take(&mut *lags.lock().expect("lags"));
        let end = Instant::now();
        lags.extend(missing.iter().map(|t| (end - *t).as_secs_f64() * 1000.0));
        lags.sort_by(f64::total_cmp);
        let lag = Lag {
            offered_rate: offered,
            achieved_rate: sent as f64 / writer_secs,
            writer_secs,
            events: sent,
            probes,
            missing: missing.len(),
            median_ms: percentile(&lags, 0.5),
            p99_ms: percentile(&lags, 0.99),
            max_ms: lags.last().copied().unwrap_or(f64::NAN),
            worker_applied: applied,
        };
        say!(
            "{phase}: median {:.0} ms, p99 {:.0} ms over {} probes",
            lag.median_ms,
            lag.p99_ms,
            lag.probes
        );
        self.drop_db(&store).await;
        Ok(lag)
    }

    /// Peak RSS of a worker process replaying a backlog of `plan.events` events: the real
    /// `counterd run` when it sits next to this binary, else this binary as a bare worker.
    async fn child_rss(&self, plan: &Plan) -> anyhow::Result<ChildRss> {
        let n = plan.events;
        let store = self.store("rss").await?;
        let comments = store.database().collection::<Document>("comments");
        let start = just_before_now();
        let posts = draw_posts(Dist::Zipf, n, plan.load_posts, 14)?;
        self.load(&comments, &posts, DateTime::now()).await?;
        drop(posts);
        let exe = std::env::current_exe()?;
        let real = exe.with_file_name("counterd");
        let started = Instant::now();
        let result = if real.is_file() {
            say!("rss: `{} run` replays {n} events ...", real.display());
            self.rss_of_counterd(&real, start, n).await
        } else {
            say!(
                "rss: {} not built; a bare worker child replays {n} events ...",
                real.display()
            );
            self.rss_of_bare_worker(&exe, start, n).await
        };
        let secs = started.elapsed().as_secs_f64();
        self.drop_db(&store).await;
        let (what, peak_rss_mb) = result?;
        say!("rss: {what}: {peak_rss_mb:?} MB in {secs:.1} s");
        Ok(ChildRss {
            what,
            peak_rss_mb,
            events: n,
            secs,
        })
    }

    async fn rss_of_counterd(
        &self,
        binary: &Path,
        start: Timestamp,
        n: usize,
    ) -> anyhow::Result<(String, Option<f64>)> {
        let port = counterd_testdb::free_port();
        let addr = format!("127.0.0.1:{port}");
        let start_at = chrono::DateTime::from_timestamp(start.time as i64, 0)
            .ok_or_else(|| anyhow!("bad start time"))?
            .to_rfc3339();
        let mut child = tokio::process::Command::new(binary)
            .arg("run")
            .env("COUNTERD_MONGODB_URI", &self.uri)
            .env("COUNTERD_DATABASE", self.db_name("rss"))
            .env("COUNTERD_HTTP_ADDR", &addr)
            .env("COUNTERD_START_AT", start_at)
            .env("COUNTERD_LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("counterd exited at once"))?;
        let deadline = Instant::now() + phase_timeout(n);
        let mut peak = None;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("`counterd run` exited early ({status})");
            }
            peak = vm_hwm_kb(Some(pid)).or(peak);
            if scrape_applied(&addr).await.unwrap_or(0.0) >= n as f64 {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill().await;
                bail!("`counterd run` did not apply {n} events in time");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        peak = vm_hwm_kb(Some(pid)).or(peak);
        // SIGTERM: the graceful path (std's kill is SIGKILL).
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status();
        match tokio::time::timeout(Duration::from_secs(15), child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    say!("rss: `counterd run` exited with {status} after SIGTERM");
                }
            }
            Err(_) => {
                let _ = child.kill().await;
                say!("rss: `counterd run` ignored SIGTERM for 15 s; killed");
            }
        }
        let modified = std::fs::metadata(binary)
            .and_then(|m| m.modified())
            .ok()
            .map(|t| {
                chrono::DateTime::<chrono::Utc>::from(t)
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .unwrap_or_default();
        Ok((
            format!(
                "`counterd run` (worker + reconciler + HTTP), {} built {modified}",
                binary.display()
            ),
            peak.map(|kb| kb as f64 / 1024.0),
        ))
    }

    async fn rss_of_bare_worker(
        &self,
        exe: &Path,
        start: Timestamp,
        n: usize,
    ) -> anyhow::Result<(String, Option<f64>)> {
        let output = tokio::time::timeout(
            phase_timeout(n),
            tokio::process::Command::new(exe)
                .arg("--child-worker")
                .arg(&self.uri)
                .arg(self.db_name("rss"))
                .arg(start.time.to_string())
                .arg(n.to_string())
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| anyhow!("the bare worker child did not finish in time"))??;
        if !output.status.success() {
            bail!("the bare worker child failed ({})", output.status);
        }
        let text = String::from_utf8_lossy(&output.stdout);
        let kb = text
            .lines()
            .find_map(|l| l.strip_prefix("VMHWM_KB "))
            .and_then(|v| v.trim().parse::<u64>().ok());
        Ok((
            "bare worker (this binary, --child-worker; `counterd` was not built next to it)".into(),
            kb.map(|kb| kb as f64 / 1024.0),
        ))
    }

    /// Seeds `plan.posts` posts with ~3 past comments each, creates their counters with one
    /// sweep, then times a full sweep against dirty runs of 0.1 %, 1 % and 10 %.
    async fn reconcile(&self, plan: &Plan) -> anyhow::Result<Reconcile> {
        let store = self.store("reconcile").await?;
        let db = store.database().clone();
        let comments = db.collection::<Document>("comments");
        // The index a deployment has for the recount query (the fake server accepts and ignores
        // non-unique indexes, so there every count scans the collection).
        db.run_command(doc! {"createIndexes": "comments", "indexes": [
        {"key": {"post_id": 1, "created_at": 1}, "name": "post_created"}]})
            .await?;
        let mut rng = StdRng::seed_from_u64(15);
        let now = chrono::Utc::now().timestamp();
        let mut docs = Vec::new();
        for post in 0..plan.posts as i64 {
            for _ in 0..rng.random_range(1..=5) {
                let created = now - rng.random_range(3_600..30 * 86_400);
                docs.push(doc! {"_id": docs.len() as i64, "post_id": post,
                "created_at": DateTime::from_millis(created * 1000), "body": "seeded comment"});
            }
        }
        let n_comments = docs.len();
        say!(
            "reconcile: seeding {} posts, {n_comments} comments ...",
            plan.posts
        );
        let started = Instant::now();
        for chunk in docs.chunks(1000) {
            comments.insert_many(chunk.to_vec()).await?;
        }
        drop(docs);
        let seed_secs = started.elapsed().as_secs_f64();
        let settings = ReconcileSettings {
            max_posts: plan.posts.max(1),
            counts_per_second: 0,
            ..ReconcileSettings::default()
        };
        let reconciler = Reconciler::new(store.clone(), settings);
        // Recounts wait for the worker (the quiet window), so one runs beside them, as in
        // production; it starts after the seeded rows (the fake server also delivers the events
        // of the current second).
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let worker = Running::spawn(
            store.clone(),
            worker_settings(
                plan,
                Timestamp {
                    time: chrono::Utc::now().timestamp() as u32,
                    increment: 0,
                },
            ),
        );

        say!("reconcile: seeded in {seed_secs:.1} s; initial sweep (creates the counters) ...");
        let started = Instant::now();
        let first = reconciler
            .sweep(chrono::Utc::now().timestamp(), |_| {}, None)
            .await?;
        let initial_sweep_secs = started.elapsed().as_secs_f64();
        if first.summary.posts != plan.posts as u64 {
            bail!(
                "the initial sweep saw {} posts, {} seeded",
                first.summary.posts,
                plan.posts
            );
        }
        say!("reconcile: initial sweep {initial_sweep_secs:.1} s; full sweep ...");
        let before = store.op_counts();
        let started = Instant::now();
        reconciler
            .sweep(chrono::Utc::now().timestamp(), |_| {}, None)
            .await?;
        let sweep_secs = started.elapsed().as_secs_f64();
        let sweep_counts = store.op_counts().count_queries - before.count_queries;
        say!("reconcile: full sweep {sweep_secs:.2} s, {sweep_counts} count queries");

        let fence = Fence {
            stream: "comments".into(),
            epoch: 0,
        };
        let all: Vec<PostId> = (0..plan.posts as i64).map(PostId::Int).collect();
        let mut dirty_runs = Vec::new();
        for fraction in DIRTY_FRACTIONS {
            let k = ((plan.posts as f64 * fraction).ceil() as usize).max(1);
            let chosen: Vec<counterd::batch::DirtyMark> = all
                .choose_multiple(&mut rng, k)
                .cloned()
                .map(counterd::batch::DirtyMark::settled)
                .collect();
            store.mark_dirty(&fence, &chosen, DateTime::now()).await?;
            let before = store.op_counts();
            let started = Instant::now();
            let report = reconciler.run_dirty(chrono::Utc::now().timestamp()).await?;
            let secs = started.elapsed().as_secs_f64();
            let counts = store.op_counts().count_queries - before.count_queries;
            say!(
                "reconcile: {:.1}% dirty ({k} posts): {secs:.3} s, {counts} count queries",
                fraction * 100.0
            );
            if report.summary.posts != k as u64 {
                bail!(
                    "the dirty run reconciled {} posts, {k} were dirty",
                    report.summary.posts
                );
            }
            dirty_runs.push(DirtyRun {
                fraction,
                posts: k,
                secs,
                counts,
                reconciled: report.summary.posts,
            });
        }
        let _ = worker.stop.send(true);
        let _ = worker.handle.await;
        self.drop_db(&store).await;
        Ok(Reconcile {
            posts: plan.posts,
            comments: n_comments,
            seed_secs,
            initial_sweep_secs,
            sweep_secs,
            sweep_counts,
            dirty: dirty_runs,
        })
    }
}

/// Counter writes per-batch coalescing issues for `posts` cut into windows of `window` events:
/// the sum of distinct posts per window.
fn windowed_distinct(posts: &[i64], window: usize) -> usize {
    posts
        .chunks(window.max(1))
        .map(|chunk| {
            let mut c = chunk.to_vec();
            c.sort_unstable();
            c.dedup();
            c.len()
        })
        .sum()
}

/// Opens the stream at `start` and counts events until `n` are seen; returns the seconds taken.
async fn bare_read(
    store: &MongoStore,
    start: Timestamp,
    n: usize,
    batch: usize,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut source = store
        .open_stream(StreamOptions {
            start: StreamStart::AtTime(start),
            pre_images: false,
            pipeline: Vec::new(),
            max_await: WorkerSettings::default().max_await,
        })
        .await?;
    let mut seen = 0;
    while seen < n {
        let got = source
            .next_batch(batch, WorkerSettings::default().max_batch_wait)
            .await?;
        seen += got.events.len();
        if started.elapsed() > timeout {
            bail!("the bare reader saw {seen} of {n} events within {timeout:?}");
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Times 1000 ledger updates with the worker's guarded filter against the same updates on `_id`
/// alone. A server that uses the `_id` index for both shows a ratio near 1; one that scans the
/// collection for the guarded shape (the stock mongo-java-server does: it only uses an index
/// when the query has exactly the index's keys; testdb/FakeMongo.java's `_id`-index lookup,
/// off with `COUNTERD_TESTDB_ID_INDEX=0`, changes that) shows its collection size in the ratio.
async fn guard_probe(store: &MongoStore, n: usize) -> anyhow::Result<GuardProbe> {
    let db = store.database();
    let ledger_docs = db
        .collection::<Document>(&Collections::default().ledger)
        .estimated_document_count()
        .await?;
    let k = n.min(1000);
    let statements = |guarded: bool, mark: i32| -> Vec<Document> {
        (0..k as i64)
            .map(|id| {
                let q = if guarded {
                    doc! {"_id": id, "applied_through": {"$not": {"$gte": "~"}}, "epoch": {"$not": {"$gt": 0_i64}}}
                } else {
                    doc! {"_id": id}
                };
                doc! {"q": q, "u": {"$set": {"bench_probe": mark}}}
            })
            .collect()
    };
    let mut times = [0.0; 2];
    for (slot, guarded) in [(0, true), (1, false)] {
        let updates = statements(guarded, slot as i32 + 1);
        let started = Instant::now();
        db.run_command(
            doc! {"update": Collections::default().ledger, "updates": updates, "ordered": false},
        )
        .await?;
        times[slot] = started.elapsed().as_secs_f64() * 1000.0;
    }
    Ok(GuardProbe {
        statements: k,
        ledger_docs,
        guarded_ms: times[0],
        id_only_ms: times[1],
    })
}

/// `--child-worker URI DATABASE START_SECS EVENTS`: a bare worker that replays `EVENTS` events
/// from `START_SECS`, prints its peak RSS and exits.
async fn child_worker(args: &[String]) -> anyhow::Result<()> {
    let [uri, database, start, events] = args else {
        bail!("--child-worker needs URI DATABASE START_SECS EVENTS");
    };
    let store = Arc::new(
        MongoStore::connect(&ConnectOptions {
            uri: uri.clone(),
            database: database.clone(),
            comments: "comments".into(),
            connect_timeout: Duration::from_secs(10),
            collections: Collections::default(),
            schema: counterd::schema::Schema::default(),
        })
        .await?,
    );
    let settings = WorkerSettings {
        start_at: Some(Timestamp {
            time: start.parse()?,
            increment: 0,
        }),
        snapshot: no_snapshot(),
        ..WorkerSettings::default()
    };
    let n: i64 = events.parse()?;
    let mut worker = Running::spawn(store, settings);
    worker.wait_applied(n, phase_timeout(n as usize)).await?;
    worker.shutdown().await?;
    println!("VMHWM_KB {}", vm_hwm_kb(None).unwrap_or(0));
    Ok(())
}

/// Peak resident set size (VmHWM) of a process, in kB.
fn vm_hwm_kb(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// `counterd_events_applied_total` from a running `counterd`'s /metrics.
async fn scrape_applied(addr: &str) -> Option<f64> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    body.lines()
        .find(|l| l.starts_with("counterd_events_applied_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

fn int(d: &Document, field: &str) -> i64 {
    match d.get(field) {
        Some(Bson::Int32(i)) => *i as i64,
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(f)) => *f as i64,
        _ => 0,
    }
}

/// The `q` quantile of sorted values (nearest rank).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn describe_server(server: &TestServer) -> String {
    match server.kind {
        ServerKind::External => "COUNTERD_TEST_MONGODB_URI (external server)".into(),
        ServerKind::Mongod => "throwaway mongod single-node replica set".into(),
        ServerKind::Fake => {
            let dir = std::env::var_os("COUNTERD_TESTDB_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdb"));
            let version = std::fs::read_to_string(dir.join("pom.xml"))
                .ok()
                .and_then(|pom| {
                    let at = pom.find("mongo-java-server-memory-backend")?;
                    let rest = &pom[at..];
                    let from = rest.find("<version>")? + "<version>".len();
                    let to = rest[from..].find("</version>")?;
                    Some(rest[from..from + to].trim().to_string())
                })
                .unwrap_or_else(|| "unknown version".into());
            let planner = if server.fake_id_index() == Some(false) {
                "stock planner"
            } else {
                "_id index for _id-equality filters"
            };
            format!("fake mongo-java-server {version} (in-memory, oplog on, {planner})")
        }
    }
}

fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_default();
    let memory_kb: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        memory_gib: (memory_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        arch: std::env::consts::ARCH,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
    }
}

fn fmt_num(v: f64, unit: &str) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    let digits = match unit {
        "s" if v < 1.0 => 3,
        "s" | "MB" => 2,
        "ms" => 0,
        _ => 0,
    };
    format!("{v:.digits$} {unit}")
}

fn print_table(report: &Report) {
    let plan = &report.plan;
    println!();
    println!(
        "counterd-bench ({} mode) on {}: {} events per backlog over {} posts, {} reconcile posts, lag writer {}/s for {} s",
        plan.mode, report.server.description, plan.events, plan.load_posts, plan.posts, plan.lag_rate, plan.lag_secs
    );
    match report.server.fake_id_index {
        Some(true) => println!(
            "note: since 2026-12-03 (issue #16) the fake server's launcher (testdb/FakeMongo.java) serves every filter that pins _id by equality from its _id index, as MongoDB does, so guarded updates no longer scan their collection; runs before that (bench/RESULTS.md of 2026-12-02) measured the scans"
        ),
        Some(false) => println!(
            "note: COUNTERD_TESTDB_ID_INDEX=0: the fake server's stock planner, as in runs before 2026-12-03, so every guarded update scans its collection"
        ),
        None => {}
    }
    if plan.reduced_for_fake_server {
        println!(
            "note: full-mode sizes reduced for the fake server (100000 events / 100000 posts on a real MongoDB): its recount queries scan whole collections (and its guarded updates did before the launcher's _id-index lookup; the sizes were set then and not re-measured since), so larger sizes take far beyond 10 minutes; pass --events/--posts to override"
        );
    }
    let header = ["metric", "value", "baseline", "ratio", "target", "status"];
    let lines: Vec<[String; 6]> = report
        .rows
        .iter()
        .map(|r| {
            [
                r.metric.clone(),
                fmt_num(r.value, r.unit),
                r.baseline
                    .map(|b| fmt_num(b, r.unit))
                    .unwrap_or_else(|| "-".into()),
                r.ratio
                    .map(|x| format!("{x:.3}"))
                    .unwrap_or_else(|| "-".into()),
                r.target.clone().unwrap_or_else(|| "-".into()),
                r.status.label().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let print = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            if i == 0 || i >= 4 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
            out.push_str("  ");
        }
        println!("{}", out.trim_end());
    };
    print(&header.map(String::from));
    print(&widths.map(|w| "-".repeat(w)));
    for line in &lines {
        print(line);
    }
    println!();
    for r in report.rows.iter().filter(|r| r.note.is_some()) {
        println!("  {}: {}", r.key, r.note.as_deref().unwrap_or_default());
    }
    let missed: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| r.status == Status::Missed)
        .map(|r| r.key.as_str())
        .collect();
    println!();
    if missed.is_empty() {
        println!("targets: all judged targets MET");
    } else {
        println!("targets MISSED: {}", missed.join(", "));
    }
    println!("total time {:.1} s", report.total_secs);
}
