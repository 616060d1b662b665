//! Phase 5, reconcile cost against the dirty fraction: a full sweep of every post against runs over
//! 0.1 %, 1 % and 10 % of them marked dirty.

use std::time::{Duration, Instant};

use anyhow::bail;
use bson::{doc, DateTime, Document, Timestamp};
use counterd::core::batch::DirtyMark;
use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::store::prelude::*;
use counterd::store::Fence;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::harness::{comments, worker_settings, Bench, Running};
use crate::plan::{Plan, DIRTY_FRACTIONS, TARGET_RECONCILE_1PCT};
use crate::report::{Row, Status};
use crate::{say, Collected};

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

pub async fn reconcile_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let rec = measure(bench, plan).await?;
    out.phase("reconcile", &rec)?;
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

/// Seeds `plan.posts` posts with ~3 past comments each, creates their counters with one
/// sweep, then times a full sweep against dirty runs of 0.1 %, 1 % and 10 %.
async fn measure(bench: &Bench, plan: &Plan) -> anyhow::Result<Reconcile> {
    let store = bench.store("reconcile").await?;
    // The index a deployment has for the recount query (the fake server accepts and ignores
    // non-unique indexes, so there every count scans the collection).
    store
        .inner()
        .database()
        .run_command(doc! {"createIndexes": "comments", "indexes": [
        {"key": {"post_id": 1, "created_at": 1}, "name": "post_created"}]})
        .await?;
    let mut rng = StdRng::seed_from_u64(15);
    let now = chrono::Utc::now().timestamp();
    let mut docs: Vec<Document> = Vec::new();
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
        comments(&store).insert_many(chunk.to_vec()).await?;
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
    let start = Timestamp {
        time: chrono::Utc::now().timestamp() as u32,
        increment: 0,
    };
    let worker = Running::spawn(store.clone(), worker_settings(plan, start));

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
    let before = store.counts();
    let started = Instant::now();
    reconciler
        .sweep(chrono::Utc::now().timestamp(), |_| {}, None)
        .await?;
    let sweep_secs = started.elapsed().as_secs_f64();
    let sweep_counts = store.counts().since(&before).count_queries;
    say!("reconcile: full sweep {sweep_secs:.2} s, {sweep_counts} count queries");

    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    let all: Vec<GroupValue> = (0..plan.posts as i64).map(GroupValue::Int).collect();
    let mut dirty = Vec::new();
    for fraction in DIRTY_FRACTIONS {
        let k = ((plan.posts as f64 * fraction).ceil() as usize).max(1);
        let chosen: Vec<DirtyMark> = all
            .choose_multiple(&mut rng, k)
            .map(|p| DirtyMark::settled(CounterKey::new(CounterIx::DEFAULT, p.clone())))
            .collect();
        store.mark_dirty(&fence, &chosen, DateTime::now()).await?;
        let before = store.counts();
        let started = Instant::now();
        let report = reconciler.run_dirty(chrono::Utc::now().timestamp()).await?;
        let secs = started.elapsed().as_secs_f64();
        let counts = store.counts().since(&before).count_queries;
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
        dirty.push(DirtyRun {
            fraction,
            posts: k,
            secs,
            counts,
            reconciled: report.summary.posts,
        });
    }
    let _ = worker.stop.send(true);
    let _ = worker.handle.await;
    bench.drop_db(&store).await;
    Ok(Reconcile {
        posts: plan.posts,
        comments: n_comments,
        seed_secs,
        initial_sweep_secs,
        sweep_secs,
        sweep_counts,
        dirty,
    })
}
