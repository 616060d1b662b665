//! Phase P, ledger writes per event with the stream split into partitions: today every partition
//! reads every event and writes its own ledger entry for every comment (issue #16), so the
//! figure is about the number of partitions; the target is about one.

use std::time::Instant;

use bson::DateTime;
use counterd::partition::stream_names;
use counterd::store::counting::Concern;
use counterd::worker::WorkerSettings;
use serde::Serialize;

use crate::harness::{
    comments, just_before_now, load, phase_timeout, worker_settings, Bench, Running,
};
use crate::load::{draw_posts, Dist};
use crate::plan::{Plan, TARGET_PARTITION_LEDGER_PER_EVENT};
use crate::report::{Row, Status};
use crate::{say, Collected};

#[derive(Debug, Serialize)]
struct Partitioned {
    partitions: u32,
    events: usize,
    secs: f64,
    ledger_statements: u64,
    counter_statements: u64,
    statements: u64,
}

/// `plan.partitions` workers, one per partition, over one Zipf backlog of
/// `plan.partition_events`, until each has read it all.
pub async fn partitions_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let n = plan.partition_events;
    let store = bench.store("partitions").await?;
    let start = just_before_now();
    let posts = draw_posts(Dist::Zipf, n, plan.load_posts, 16)?;
    load(&comments(&store), &posts, DateTime::now()).await?;
    say!(
        "partitions: {} workers replay {n} events ...",
        plan.partitions
    );
    let before = store.counts();
    let started = Instant::now();
    let mut workers: Vec<Running> = stream_names("comments", plan.partitions)
        .into_iter()
        .map(|(stream, partition)| {
            let settings = WorkerSettings {
                stream,
                partition,
                ..worker_settings(plan, start)
            };
            Running::spawn(store.clone(), settings)
        })
        .collect();
    for worker in &mut workers {
        worker.wait_applied(n as i64, phase_timeout(n)).await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let counts = store.counts().since(&before);
    for worker in workers {
        worker.shutdown().await?;
    }
    bench.drop_db(&store).await;
    let result = Partitioned {
        partitions: plan.partitions,
        events: n,
        secs,
        ledger_statements: counts.of(Concern::Ledger).statements,
        counter_statements: counts.of(Concern::Counters).statements,
        statements: counts.statements(),
    };
    say!(
        "partitions: {secs:.2} s, {} ledger writes for {n} events",
        result.ledger_statements
    );
    let per_event = result.ledger_statements as f64 / n as f64;
    out.rows.push(
        Row::info(
            "partition_ledger_per_event",
            &format!("P. ledger writes per event, {} partitions", plan.partitions),
            per_event,
            "writes/event",
        )
        .against(TARGET_PARTITION_LEDGER_PER_EVENT, "target")
        .target(
            &format!("<= {TARGET_PARTITION_LEDGER_PER_EVENT:.1} writes/event"),
            Status::of(per_event <= TARGET_PARTITION_LEDGER_PER_EVENT),
        )
        .note(format!(
            "every partition reads every event and writes its own ledger entry per comment (the partition-owned ledger is not built); {} counter writes, {} write statements in all, {secs:.2} s",
            result.counter_statements, result.statements
        )),
    );
    out.phase("partitions", &result)?;
    Ok(())
}
