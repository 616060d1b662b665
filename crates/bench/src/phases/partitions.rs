//! Phase P, ledger writes per event with the stream split into partitions. Every partition
//! reads every event, but writes the ledger entries of its own posts' comments only (see
//! `counterd::core::partition`): an insert or a soft delete is written once, by the owner of its
//! post; a move between two partitions' posts twice, once by each side. The target is about
//! one write per event whatever the number of partitions.

use std::time::Instant;

use bson::{doc, DateTime};
use counterd::core::partition::stream_names;
use counterd::snapshot::SnapshotSettings;
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
    inserts: usize,
    soft_deletes: usize,
    moves: usize,
    secs: f64,
    ledger_statements: u64,
    counter_statements: u64,
    statements: u64,
}

/// Every `UPDATE_EVERY`-th comment is also changed once: alternately soft-deleted and moved to
/// the next post (by the hash of its id, in another partition three times in four with 4).
const UPDATE_EVERY: usize = 10;

/// `plan.partitions` workers, one per partition, over one Zipf backlog of
/// `plan.partition_events` inserts followed by soft deletes and moves of some of them, until
/// each has read it all.
pub async fn partitions_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let inserts = plan.partition_events;
    let store = bench.store("partitions").await?;
    // The ledger is divided between partitions only where it is complete: the workers start on
    // the empty collection with the initial snapshot on (it finds nothing to count), and the
    // load follows once every stream is open.
    let mut workers: Vec<Running> = stream_names("comments", plan.partitions)
        .into_iter()
        .map(|(stream, partition)| {
            let settings = WorkerSettings {
                stream,
                partition,
                start_at: None,
                snapshot: SnapshotSettings::default(),
                ..worker_settings(plan, just_before_now())
            };
            Running::spawn(store.clone(), settings)
        })
        .collect();
    for worker in &mut workers {
        worker.wait_open(phase_timeout(0)).await?;
    }
    let before = store.counts();
    let started = Instant::now();
    let posts = draw_posts(Dist::Zipf, inserts, plan.load_posts, 16)?;
    let comments = comments(&store);
    load(&comments, &posts, DateTime::now()).await?;
    let changed: Vec<i64> = (0..inserts)
        .step_by(UPDATE_EVERY)
        .map(|i| i as i64)
        .collect();
    let (soft_deleted, moved): (Vec<i64>, Vec<i64>) = changed
        .iter()
        .partition(|id| (*id / UPDATE_EVERY as i64) % 2 == 0);
    comments
        .update_many(
            doc! {"_id": {"$in": &soft_deleted}},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await?;
    comments
        .update_many(doc! {"_id": {"$in": &moved}}, doc! {"$inc": {"post_id": 1}})
        .await?;
    let n = inserts + soft_deleted.len() + moved.len();
    say!(
        "partitions: {} workers replay {n} events ({inserts} inserts, {} soft deletes, {} moves) ...",
        plan.partitions,
        soft_deleted.len(),
        moved.len()
    );
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
        inserts,
        soft_deletes: soft_deleted.len(),
        moves: moved.len(),
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
            "{inserts} inserts, {} soft deletes, {} moves to the next post; each partition writes the entries of its own posts' comments (a move between partitions: both sides); {} counter writes, {} write statements in all, {secs:.2} s",
            result.soft_deletes, result.moves, result.counter_statements, result.statements
        )),
    );
    out.phase("partitions", &result)?;
    Ok(())
}
