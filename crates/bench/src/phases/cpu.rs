//! `--only cpu`: the worker's CPU per event with the MongoDB store, and nothing else: a
//! warm-up, then `--speed-runs` worker runs over phase 2's Zipf backlog, each on a fresh server
//! loaded with it (as phase 2's repeated runs are), the median kept. Quick to repeat when
//! comparing builds in turn (A B B A) on a shared machine; the figure the target is judged on
//! is `--only speed`'s, which also times the bulk baseline between the runs.

use crate::harness::Bench;
use crate::load::{draw_posts, Dist};
use crate::measure::median;
use crate::phases::costs::worker_over_backlog;
use crate::phases::throughput::ZIPF_SEED;
use crate::plan::Plan;
use crate::report::Row;
use crate::{say, Collected};

pub async fn cpu_phase(bench: &Bench, plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let posts = draw_posts(Dist::Zipf, plan.events, plan.load_posts, ZIPF_SEED)?;
    // Warm-up (the fake server is a JVM), not reported.
    let warm = (plan.events / 10).clamp(500, 5_000).min(posts.len());
    let store = bench.store("cpu_warmup").await?;
    worker_over_backlog(bench, &store, plan, &posts[..warm]).await?;
    let mut cpu = Vec::new();
    let mut secs = Vec::new();
    for _ in 0..plan.speed_runs.max(1) {
        let store = bench.store("cpu").await?;
        let run = worker_over_backlog(bench, &store, plan, &posts).await?;
        say!(
            "cpu: worker {:.2} s ({:.0} events/s), {:.2} µs CPU/event",
            run.secs,
            run.rate(),
            run.cpu_us_per_event()
        );
        cpu.push(run.cpu_us_per_event());
        secs.push(run.secs);
    }
    let cpu_median = median(&cpu);
    say!("cpu: runs {cpu:.2?} µs CPU/event, median {cpu_median:.2}");
    out.rows.push(
        Row::info(
            "cpu_only_us_per_event",
            "CPU per event, MongoDB store (worker runs alone)",
            cpu_median,
            "µs",
        )
        .note(format!(
            "median of {} runs over {} Zipf events: {cpu:.2?} µs, {secs:.2?} s",
            cpu.len(),
            posts.len()
        )),
    );
    out.phase(
        "cpu_only",
        &serde_json::json!({"events": posts.len(), "cpu_us_per_event": cpu, "secs": secs, "median": cpu_median}),
    )
}
