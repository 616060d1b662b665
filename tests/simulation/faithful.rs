//! The faithful run (`SIM_SEEDS` seeds, or the one `SIM_SEED` names, of the variant the `SIM_*`
//! environment selects) with its coverage of every crash point, and its determinism.

use std::time::Instant;

use crate::plan::{Plan, Variant};
use crate::runner::{env_u64, run_seed, run_seeds};
use crate::seed::{execute, set_up};

pub const DEFAULT_SEEDS: u64 = 3000;

/// Every crash point of the worker's batch, and every recovery path, was exercised.
pub const COVERAGE: &[&str] = &[
    "fault next_batch before",
    "fault read_ledger before",
    "fault record_intent before",
    "fault record_intent after",
    "fault apply_counters before",
    "fault apply_counters partial",
    "fault apply_counters after",
    "fault write_ledger before",
    "fault write_ledger partial",
    "fault write_ledger after",
    "fault mark_dirty before",
    "fault mark_dirty after",
    "fault save_checkpoint before",
    "fault save_checkpoint after",
    "fault rows_after before",
    "fault save_snapshot before",
    "fault save_snapshot after",
    "fault claim_ledger partial",
    "fault claim_ledger after",
    "fault apply_snapshot_counters partial",
    "fault apply_snapshot_counters after",
    "snapshot chunk planned",
    "snapshot chunk finished after a restart",
    "snapshot chunk read again after a restart",
    "snapshot claim found the stream's entry",
    "snapshot increment already applied",
    "snapshot done",
    "fault install_fold before",
    "fault install_fold after",
    "fault live_ids_below before",
    "recount settled rows changed in its window",
    "fold installed",
    "fold corrected drift",
    "fold installed while others run",
    "fold corrected drift while others run",
    "drained answer while others run",
    "recount in flight",
    "folded but still dirty",
    "dirty run corrected drift",
    "background run corrected drift",
    "sweep run corrected drift",
    "corrections of a failed run (unreported)",
    "operator edit base",
    "operator edit bucket",
    "operator deleted counter",
    "probe checked a caught-up point while others run",
    "round ended caught up",
    "operator replay",
    "fault transient",
    "pause budget",
    "pause caught up",
    "stop caught up",
    "previous holder fenced out",
    "seeds with 2 streams",
    "read cut by the budget",
    "read cut to nothing by the budget",
    "snapshot chunk cut by the budget",
    "worker stopped while a worker waited for budget",
    "seeds with 3 streams",
    "recount by count alone",
    "counters carried across batches",
    "counter written for several batches at once",
    "fault while counters are carried",
    "carried counters re-applied by a restart",
    "carried batches re-read in pages",
];

#[test]
fn simulation() {
    if let Some(seed) = env_u64("SIM_SEED") {
        let variant = Variant::from_env();
        let trace = std::env::var("SIM_TRACE").is_ok_and(|v| v == "1");
        match run_seed(seed, variant, trace) {
            Ok(summary) => {
                eprintln!("seed {seed} passed: {:?}", Plan::new(seed, variant));
                eprintln!("{} events; {:?}", summary.events, summary.stats);
            }
            Err(f) => panic!("{}", f.report()),
        }
        return;
    }
    let start = env_u64("SIM_SEED_START").unwrap_or(0);
    let count = env_u64("SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let variant = Variant::from_env();
    let began = Instant::now();
    let (failures, stats, events) = run_seeds(start, count, variant, 5);
    eprintln!(
        "simulated seeds {start}..{} ({events} events) in {:.1?}",
        start + count,
        began.elapsed()
    );
    if !failures.is_empty() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!(
            "{} seed(s) failed, first: seed {} ({}); replay: {}SIM_SEED={} cargo test --test simulation -- --nocapture",
            failures.len(),
            failures[0].seed,
            failures[0].message,
            variant.env_prefix(),
            failures[0].seed
        );
    }
    eprintln!("coverage: {stats:?}");
    if count >= 500 {
        let missing: Vec<&&str> = COVERAGE
            .iter()
            .filter(|k| !stats.contains_key(**k))
            .collect();
        assert!(
            missing.is_empty(),
            "the simulation no longer reaches {missing:?}; seen: {stats:?}"
        );
    }
}

#[test]
fn a_seed_replays_exactly() {
    // Seeds with faults (transient ones too), interleaving, takeovers and partitions.
    let seeds: Vec<u64> = (0..)
        .filter(|seed| {
            let plan = Plan::new(*seed, Variant::FAITHFUL);
            plan.fault_rate >= 0.1 && plan.yield_rate > 0.0 && plan.takeovers
        })
        .take(12)
        .collect();
    for seed in seeds {
        let run = || {
            let mut sim = set_up(seed, Variant::FAITHFUL, false);
            let result = execute(&mut sim).map(|summary| summary.stats);
            let s = sim.store.lock();
            (result, s.trace.clone(), format!("{:?}", s.counters()))
        };
        assert!(run() == run(), "seed {seed} ran differently twice");
    }
}
