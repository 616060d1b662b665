//! Running seeds: one seed to its summary or its failure (with the command that replays it), a
//! range of seeds on every core, and the expectations of the variant tests (every seed clean, or
//! a broken variant caught).

use std::collections::BTreeMap;

use crate::plan::{Plan, Variant};
use crate::seed::{execute, set_up};

/// What a seed did, for coverage.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub stats: BTreeMap<String, u64>,
    pub events: usize,
}

/// A failed seed.
pub struct Failure {
    pub seed: u64,
    pub plan: Plan,
    pub message: String,
    pub trace_tail: Vec<String>,
}

impl Failure {
    pub fn report(&self) -> String {
        let mut out = format!(
            "simulation seed {} FAILED: {}\nplan: {:?}\nlast steps:\n",
            self.seed, self.message, self.plan
        );
        for line in &self.trace_tail {
            out.push_str("  ");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str(&format!(
            "replay: {}SIM_SEED={} cargo test --test simulation -- --nocapture   (add SIM_TRACE=1 for every step)\n",
            self.plan.variant.env_prefix(),
            self.seed
        ));
        out
    }
}

/// Runs one seed to the end.
pub fn run_seed(seed: u64, variant: Variant, trace: bool) -> Result<Summary, Box<Failure>> {
    let mut sim = set_up(seed, variant, trace);
    let message = match execute(&mut sim) {
        Ok(summary) => return Ok(summary),
        Err(message) => message,
    };
    let s = sim.store.lock();
    let tail = s.trace.len().saturating_sub(40);
    Err(Box::new(Failure {
        seed,
        plan: sim.plan.clone(),
        message,
        trace_tail: s.trace[tail..].to_vec(),
    }))
}

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Runs seeds `start..start + count` on all cores (each seed is single-threaded and
/// deterministic). Stops early after `stop_after` failures.
pub fn run_seeds(
    start: u64,
    count: u64,
    variant: Variant,
    stop_after: usize,
) -> (Vec<Failure>, BTreeMap<String, u64>, usize) {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    let failures = std::sync::Mutex::new(Vec::new());
    let stats = std::sync::Mutex::new(BTreeMap::new());
    let events = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..threads {
            let (failures, stats, events) = (&failures, &stats, &events);
            scope.spawn(move || {
                let mut seed = start + t;
                while seed < start + count {
                    if failures.lock().unwrap().len() >= stop_after {
                        return;
                    }
                    match run_seed(seed, variant, false) {
                        Ok(summary) => {
                            events.fetch_add(summary.events, std::sync::atomic::Ordering::Relaxed);
                            let mut all = stats.lock().unwrap();
                            for (k, v) in summary.stats {
                                *all.entry(k).or_insert(0) += v;
                            }
                        }
                        Err(f) => failures.lock().unwrap().push(*f),
                    }
                    seed += threads;
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.seed);
    (failures, stats.into_inner().unwrap(), events.into_inner())
}

/// Runs the first seeds of a broken variant and expects the simulation to catch it.
pub fn expect_caught(variant: Variant, seeds: u64) {
    let (failures, _, _) = run_seeds(0, seeds, variant, 1);
    let first = failures.first().unwrap_or_else(|| {
        panic!("the simulation did not catch the broken variant {variant:?} in {seeds} seeds")
    });
    eprintln!(
        "caught {variant:?} at seed {}: {}\nreplay: {}SIM_SEED={} cargo test --test simulation -- --nocapture",
        first.seed,
        first.message,
        variant.env_prefix(),
        first.seed
    );
}

/// Runs the first seeds of a variant and expects every one to pass.
pub fn expect_clean(variant: Variant, seeds: u64) {
    let stop = env_u64("SIM_STOP_AFTER").unwrap_or(3) as usize;
    let (failures, _, _) = run_seeds(0, seeds, variant, stop);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{variant:?}: seed {} failed: {}", first.seed, first.message);
    }
}
