//! `counterd-bench`: measures counterd against the test database, in one run, on one server.
//!
//! 1. the raw tail rate: a bare change-stream reader that only counts events;
//! 2. the worker's throughput over the same backlog, against the tail rate and against the rate
//!    at which the server absorbs the worker's own write statements issued as bare bulk updates;
//! 3. server-independent costs against the seed's hot path (one `$inc` per event, sequential):
//!    write statements per event, round trips per 1 000 events, CPU per event, and counter
//!    writes on a Zipf(1.1) and on a uniform post distribution;
//! 4. event-to-counter lag (median, p99) at half the worker's throughput and at 5 000/s;
//! 5. reconcile cost against the dirty fraction, compared with a full sweep;
//! 6. peak memory (RSS) of a worker process on its own and of the bench process;
//!
//! P. ledger writes per event with the stream split into 4 partitions;
//! X. the outage backlog (80 % inserts, the rest soft deletes, undeletes, moves and hard deletes
//!    of older rows, 2 KB bodies) caught up by `counterd run`, against an inserts-only backlog of
//!    the same size in the same run and a bare reader with and without `updateLookup`;
//! D. (`--only definitions`) the cost per event of an extra definition, a count and a sum,
//!    against the default definition alone;
//! M. peak memory of `counterd run` at default settings against the backlog's size and the
//!    comments' size, beside the catch-up rate (a flat line: memory is bounded by a budget);
//! O. counterd's own oplog bytes per application event, by collection, catching up and
//!    keeping up, read from the server's `local.oplog.rs`.
//!
//! Every store call goes through `counterd::store::counting::CountingStore`, which counts calls
//! and write statements per concern. Throughput phases replay a pre-written backlog (the stream
//! starts at a cluster time just before the load), so the tail and apply rates are measured
//! apart from the writer. Every phase uses a fresh database, on the fake server a fresh server
//! too (its oplog never shrinks; see `harness::Bench`). The result is a table on stdout
//! and a JSON file; targets that are missed are reported (MISSED), never turned into a
//! failure: the process exits non-zero only when the benchmark itself breaks.
//!
//! Usage: `cargo run --release -p counterd-bench -- [--quick] [--out bench/latest.json]
//! [--only speed|cpu|lag|partitions|rss|reconcile|memory|mixed|no-io|oplog|definitions]`.
//!
//! `--soak DURATION [--seed N]` runs the chaos soak instead (see `soak`): the real
//! `counterd run` under load and random faults, exact at every caught-up moment.
//!
//! It allocates as `counterd` does (jemalloc, with the same options: see `src/main.rs`), so
//! that the in-process worker's CPU and memory are measured as `counterd` runs.

mod harness;
mod load;
mod measure;
mod phases;
mod plan;
mod report;
mod soak;

use std::process::ExitCode;
use std::time::Instant;

use anyhow::anyhow;
use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `counterd`'s jemalloc options (`src/main.rs`).
#[export_name = "_rjem_malloc_conf"]
pub static MALLOC_CONF: &[u8] = b"narenas:2\0";
use counterd_testdb::TestServer;
use serde::Serialize;

use crate::harness::Bench;
use crate::phases::{
    costs, cpu, definitions, lag, memory, mixed, oplog, partitions, reconcile, rss, throughput,
};
use crate::plan::{Args, Plan};
use crate::report::{describe_server, Row, ServerInfo};

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
        return match runtime.block_on(harness::child_worker(child)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("counterd-bench child worker: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(duration) = args.soak {
        START.get_or_init(Instant::now);
        let seed = args
            .seed
            .unwrap_or_else(|| chrono::Utc::now().timestamp() as u64 % 100_000);
        let out = if args.out == std::path::Path::new("bench/latest.json") {
            std::path::PathBuf::from("target/soak.json")
        } else {
            args.out.clone()
        };
        return match runtime.block_on(soak::soak(duration, seed, args.soak_keep_process, &out)) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => {
                eprintln!("counterd-bench: the soak found failures (listed above)");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("counterd-bench: the soak broke: {e:#}");
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
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => { eprintln!("[bench {:>7.1}s] {}", $crate::START.get().map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0), format!($($t)*)) };
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// What the phases add up: the table's rows and each phase's raw figures for the JSON file.
#[derive(Default)]
pub struct Collected {
    rows: Vec<Row>,
    phases: serde_json::Map<String, serde_json::Value>,
}

impl Collected {
    /// Keeps a phase's raw figures for the JSON file.
    fn phase(&mut self, name: &str, figures: &impl Serialize) -> anyhow::Result<()> {
        self.phases
            .insert(name.into(), serde_json::to_value(figures)?);
        Ok(())
    }
}

/// The worker's Zipf throughput `--only lag` takes for the full run's (whose half is one of the
/// lag runs' rates).
const LAG_ONLY_WORKER_RATE: f64 = 9_600.0;

/// The run, phase by phase, in the order that keeps the measurements apart.
async fn bench(args: Args) -> anyhow::Result<()> {
    START.get_or_init(Instant::now);
    let (plan, bench, server_info) = start(&args).await?;
    let mut out = Collected::default();
    let runs = |phase: &str| args.only.is_empty() || args.only.iter().any(|p| p == phase);
    let mut bench_rss_mb = None;
    if runs("speed") {
        let (zipf, uniform, rss_mb) = throughput::throughput_phase(&bench, &plan, &mut out).await?;
        bench_rss_mb = rss_mb;
        let server_rate = costs::costs_phase(&bench, &plan, &zipf, &uniform, &mut out).await?;
        if args.only.is_empty() {
            lag::lag_phase(&bench, &plan, zipf.worker.rate(), server_rate, &mut out).await?;
        }
    }
    if args.only.iter().any(|p| p == "lag") {
        // The lag runs alone (comparing builds): at 5 000/s and at half of a Zipf throughput
        // this machine's full runs measure (9 600 events/s), as a full run would judge them.
        lag::lag_phase(&bench, &plan, LAG_ONLY_WORKER_RATE, f64::INFINITY, &mut out).await?;
    }
    if args.only.iter().any(|p| p == "cpu") {
        cpu::cpu_phase(&bench, &plan, &mut out).await?;
    }
    if args.only.iter().any(|p| p == "no-io") {
        costs::no_io_phase(&plan, &mut out).await?;
    }
    if runs("partitions") {
        partitions::partitions_phase(&bench, &plan, &mut out).await?;
    }
    if args.only.iter().any(|p| p == "definitions") {
        definitions::definitions_phase(&bench, &plan, &mut out).await?;
    }
    // Memory of a worker process on its own, before the reconcile phase.
    let child = if runs("rss") {
        Some(rss::child_rss(&bench, &plan).await?)
    } else {
        None
    };
    if let Some(child) = &child {
        out.phase("worker_process_rss", child)?;
    }
    if runs("reconcile") {
        reconcile::reconcile_phase(&bench, &plan, &mut out).await?;
    }
    if runs("oplog") {
        oplog::oplog_phase(&bench, &plan, &mut out).await?;
    }
    // Five catch-ups of the real binary: in full runs and when asked for, not in the quick
    // smoke check (debug builds, where its figures would mean nothing).
    let memory = args.only.iter().any(|p| p == "memory") || (args.only.is_empty() && !args.quick);
    if memory {
        memory::memory_phase(&bench, &plan, &mut out).await?;
    }
    if runs("mixed") {
        mixed::mixed_phase(&bench, &plan, &mut out).await?;
    }
    if let Some(child) = &child {
        rss::memory_rows(child, bench_rss_mb, &mut out);
    }
    report::write_report(&args, server_info, plan, out)?;
    drop(bench); // stops the server
    Ok(())
}

/// The test database, the plan for it, and what the server says it is.
async fn start(args: &Args) -> anyhow::Result<(Plan, Bench, ServerInfo)> {
    let server = tokio::task::spawn_blocking(TestServer::start)
        .await?
        .map_err(|e| anyhow!("cannot start the test database: {e}"))?;
    let plan = Plan::from(args, server.kind);
    say!("plan: {plan:?}");
    let description = describe_server(&server);
    let (kind, fake_id_index) = (server.kind, server.fake_id_index());
    let bench = Bench::new(server, format!("b{}", std::process::id() % 100_000));
    let probe = bench.store("probe").await?;
    let abilities = probe.inner().abilities().await?;
    bench.drop_db(&probe).await;
    let server_info = ServerInfo {
        kind: format!("{kind:?}"),
        description,
        version: abilities.version.clone(),
        wire_version: abilities.wire_version,
        fake_id_index,
    };
    say!(
        "server: {} (reports MongoDB {}, wire {})",
        server_info.description,
        abilities.version,
        abilities.wire_version
    );
    Ok((plan, bench, server_info))
}
