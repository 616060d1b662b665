//! What one run measures: its sizes (from the command line and the server) and the targets the
//! results are judged against.

use std::path::PathBuf;

use clap::Parser;
use counterd_testdb::ServerKind;
use serde::Serialize;

/// Targets (ratios and bounds, same run, same server), from issue #16.
pub const TARGET_WORKER_VS_BULK: f64 = 0.80;
/// CPU per event of the worker with the MongoDB store (the driver's work included).
pub const TARGET_CPU_US_PER_EVENT: f64 = 20.0;
/// CPU per event of counterd's own work: the worker over the in-process store, the time inside
/// that store's calls taken out.
pub const TARGET_OWN_CPU_US_PER_EVENT: f64 = 10.0;
pub const TARGET_ZIPF_WRITES: f64 = 0.20;
pub const TARGET_RECONCILE_1PCT: f64 = 0.03;
pub const TARGET_LAG_MEDIAN_MS: f64 = 1000.0;
pub const TARGET_LAG_RATE: u32 = 5000;
pub const TARGET_PARTITION_LEDGER_PER_EVENT: f64 = 1.1;
pub const TARGET_RSS_MB: f64 = 50.0;
/// Issue #23: `counterd run` at default settings catching up 100 000 and 300 000 events with
/// 2 KB bodies peaks at most here (MiB as MB: the table's unit), within 10 % of each other.
pub const TARGET_FLAT_RSS_MB: f64 = 64.0;
pub const TARGET_RSS_SPREAD: f64 = 0.10;

pub const ZIPF_EXPONENT: f64 = 1.1;
pub const DIRTY_FRACTIONS: [f64; 3] = [0.001, 0.01, 0.1];
/// Partitions of the partition phase (the target's setting).
pub const PARTITIONS: u32 = 4;

/// Benchmark counterd against the test database (see `counterd_testdb`).
#[derive(Debug, Parser)]
#[command(name = "counterd-bench", about, long_about = None)]
pub struct Args {
    /// Small sizes: used in CI only to check that the benchmark still works.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench/latest.json")]
    pub out: PathBuf,
    /// Events per backlog (tail, worker, baseline and partition phases). Default: 5000 quick,
    /// 100000 full.
    #[arg(long)]
    pub events: Option<usize>,
    /// Posts seeded for the reconcile phase. Default: 5000 quick; full: 100000, or 10000 on
    /// the fake server, where every recount scans the whole `comments` collection (it keeps no
    /// secondary index), so a sweep is quadratic: 100000 posts would take hours.
    #[arg(long)]
    pub posts: Option<usize>,
    /// Distinct posts the event load is drawn from (Zipf ranks or uniform). Default: 10000
    /// quick, 100000 full.
    #[arg(long)]
    pub load_posts: Option<usize>,
    /// Duration of each lag run's writer, seconds. Default: 5 quick, 20 full.
    #[arg(long)]
    pub lag_secs: Option<u64>,
    /// The worker's batch size while caught up (counterd's default: 1000; batches grow to
    /// `max_batch_size`, default 10000, while it is behind).
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Run only these phases (repeatable): `speed` (phases 1-3 without the lag runs: tail rate,
    /// worker, bulk baseline, CPU), `cpu` (the worker's CPU per event with the MongoDB store
    /// alone: `--speed-runs` runs over the Zipf backlog, for comparing builds), `lag` (phase 4 alone, at fixed rates), `partitions`, `rss`,
    /// `reconcile`, `memory`, `mixed` (the outage backlog of changes to older rows against
    /// inserts-only, both caught up by `counterd run`), `no-io` or `oplog` (counterd's own oplog
    /// bytes per event), the
    /// phases that need no other phase's figures. For working on one figure; a report of the whole run is
    /// what the README quotes. `definitions` (the cost of an extra count or sum per event) runs
    /// only when asked for.
    #[arg(long, value_parser = ["speed", "cpu", "lag", "partitions", "rss", "reconcile", "memory", "mixed", "no-io", "oplog", "definitions"])]
    pub only: Vec<String>,
    /// Runs of each side of worker ÷ bulk (phase 2), alternating: the median of each is kept.
    #[arg(long, default_value_t = 3)]
    pub speed_runs: usize,
    /// Pairs of catch-ups (inserts-only, then the outage backlog) of phase X, alternating: the
    /// pair of the median ratio is reported.
    #[arg(long, default_value_t = 1)]
    pub mixed_runs: usize,
    /// Instead of the benchmark, a chaos soak of this long (`90s`, `2m`, `30m`, `1h`): load,
    /// random faults, an exactness check at every caught-up moment (see `soak`). Writes its
    /// summary to `--out` (default then `target/soak.json`).
    #[arg(long, value_name = "DURATION", value_parser = crate::soak::parse_duration)]
    pub soak: Option<std::time::Duration>,
    /// The soak without `kill -9` and restarts of counterd: one process lives through it, so
    /// its memory over time shows.
    #[arg(long)]
    pub soak_keep_process: bool,
    /// The soak's random seed (default: from the clock; printed, to repeat a run).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Internal: run a bare worker as a child process (for its RSS) and exit.
    #[arg(long, hide = true, num_args = 4, value_names = ["URI", "DATABASE", "START_SECS", "EVENTS"])]
    pub child_worker: Option<Vec<String>>,
}

/// Sizes of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub mode: &'static str,
    pub server_kind: String,
    pub events: usize,
    pub load_posts: usize,
    pub posts: usize,
    pub comments_per_post_mean: f64,
    pub lag_secs: u64,
    /// How long a lag run waits for unseen probes after its writer stops.
    pub lag_drain_secs: u64,
    pub batch_size: usize,
    pub zipf_exponent: f64,
    pub partitions: u32,
    /// Events of the partition phase: a fifth of `events` (at least 1 000). Its figure, ledger
    /// writes per event, does not depend on the size, and every partition reads every event.
    pub partition_events: usize,
    /// Worker runs and bulk replays of phase 2, alternating (`--speed-runs`).
    pub speed_runs: usize,
    /// Pairs of catch-ups of phase X (`--mixed-runs`).
    pub mixed_runs: usize,
}

impl Plan {
    pub fn from(args: &Args, kind: ServerKind) -> Plan {
        let quick = args.quick;
        let events = args.events.unwrap_or(if quick { 5_000 } else { 100_000 });
        Plan {
            mode: if quick { "quick" } else { "full" },
            server_kind: format!("{kind:?}"),
            events,
            load_posts: args
                .load_posts
                .unwrap_or(if quick { 10_000 } else { 100_000 })
                .max(1),
            posts: args.posts.unwrap_or(match (quick, kind) {
                (true, _) => 5_000,
                (false, ServerKind::Fake) => 10_000,
                (false, _) => 100_000,
            }),
            comments_per_post_mean: 3.0,
            lag_secs: args.lag_secs.unwrap_or(if quick { 5 } else { 20 }),
            lag_drain_secs: if quick { 15 } else { 60 },
            batch_size: args.batch_size.max(1),
            zipf_exponent: ZIPF_EXPONENT,
            partitions: PARTITIONS,
            partition_events: (events / 5).max(1_000),
            speed_runs: args.speed_runs.max(1),
            mixed_runs: args.mixed_runs.max(1),
        }
    }
}
