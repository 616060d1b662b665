//! Phase D (`--only definitions`), the cost of an extra counter definition per event: the
//! same backlog (inserts with an author and a rating, then rating changes and soft deletes of
//! some of them) replayed by one worker keeping the default per-post count alone, then the
//! default and a count per author, then the default and a sum of the ratings per author. One
//! event becomes deltas for every definition it touches from one classification and one
//! ledger entry, so an extra definition should cost its counter writes, not another pass.

use std::time::Instant;

use bson::{doc, DateTime, Document};
use counterd::core::definition::{Definition, Kind};
use counterd::store::counting::Concern;
use counterd::worker::WorkerSettings;
use serde::Serialize;

use crate::harness::{comments, just_before_now, phase_timeout, worker_settings, Bench, Running};
use crate::load::{draw_posts, Dist};
use crate::plan::Plan;
use crate::report::Row;
use crate::{say, Collected};

/// Authors the backlog's comments are spread over.
const AUTHORS: i64 = 200;

/// Every `CHANGE_EVERY`-th comment is changed once more: its rating, or (every other one) a
/// soft delete.
const CHANGE_EVERY: usize = 5;

#[derive(Debug, Serialize)]
struct DefinitionRun {
    kept: &'static str,
    events: usize,
    secs: f64,
    events_per_sec: f64,
    counter_statements: u64,
    ledger_statements: u64,
    statements: u64,
}

/// The definitions beyond the default of each run.
fn extras() -> [(&'static str, Vec<Definition>); 3] {
    let per_author = |name: &str, kind: Kind| Definition {
        name: name.into(),
        group: "author_id".into(),
        condition: Default::default(),
        collection: format!("{name}_counters"),
        kind,
    };
    [
        ("the default alone", Vec::new()),
        (
            "+ a count per author",
            vec![per_author("per_author", Kind::Count)],
        ),
        (
            "+ a sum of ratings per author",
            vec![per_author(
                "rating",
                Kind::Sum {
                    field: "rating".into(),
                },
            )],
        ),
    ]
}

/// Inserts one rated comment per entry of `posts`, then changes every `CHANGE_EVERY`-th;
/// returns the number of events written.
async fn load_rated(
    comments: &mongodb::Collection<Document>,
    posts: &[i64],
) -> anyhow::Result<usize> {
    let created = DateTime::now();
    for (c, chunk) in posts.chunks(1000).enumerate() {
        let docs: Vec<Document> = chunk
            .iter()
            .enumerate()
            .map(|(i, post)| {
                let id = (c * 1000 + i) as i64;
                doc! {"_id": id, "post_id": post, "author_id": id % AUTHORS, "rating": id % 5 + 1, "created_at": created, "body": "benchmark comment"}
            })
            .collect();
        comments.insert_many(docs).await?;
    }
    let changed: Vec<i64> = (0..posts.len())
        .step_by(CHANGE_EVERY)
        .map(|i| i as i64)
        .collect();
    let (rerated, deleted): (Vec<i64>, Vec<i64>) = changed
        .iter()
        .partition(|id| (*id / CHANGE_EVERY as i64) % 2 == 0);
    comments
        .update_many(
            doc! {"_id": {"$in": &rerated}},
            doc! {"$inc": {"rating": 1}},
        )
        .await?;
    comments
        .update_many(
            doc! {"_id": {"$in": &deleted}},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await?;
    Ok(posts.len() + changed.len())
}

/// One worker over the backlog with `extra` beside the default definition.
async fn run(
    bench: &Bench,
    plan: &Plan,
    kept: &'static str,
    extra: Vec<Definition>,
) -> anyhow::Result<DefinitionRun> {
    let schema = counterd::core::schema::Schema::default().with_more(extra);
    let store = bench
        .store_with_schema("definitions", schema.clone())
        .await?;
    let posts = draw_posts(Dist::Zipf, plan.partition_events, plan.load_posts, 23)?;
    let start = just_before_now();
    let n = load_rated(&comments(&store), &posts).await?;
    let before = store.counts();
    let started = Instant::now();
    let settings = WorkerSettings {
        schema,
        ..worker_settings(plan, start)
    };
    let mut worker = Running::spawn(store.clone(), settings);
    worker.wait_applied(n as i64, phase_timeout(n)).await?;
    let secs = started.elapsed().as_secs_f64();
    let counts = store.counts().since(&before);
    worker.shutdown().await?;
    bench.drop_db(&store).await;
    say!("definitions: {kept}: {n} events in {secs:.2} s");
    Ok(DefinitionRun {
        kept,
        events: n,
        secs,
        events_per_sec: n as f64 / secs,
        counter_statements: counts.of(Concern::Counters).statements,
        ledger_statements: counts.of(Concern::Ledger).statements,
        statements: counts.statements(),
    })
}

/// The three runs, and per extra definition its cost per event against the default alone.
pub async fn definitions_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for (kept, extra) in extras() {
        runs.push(run(bench, plan, kept, extra).await?);
    }
    let alone = &runs[0];
    let per_event_us = |r: &DefinitionRun| r.secs * 1e6 / r.events as f64;
    out.rows.push(
        Row::info(
            "definitions_alone_rate",
            "D. worker throughput, the default definition alone",
            alone.events_per_sec,
            "events/s",
        )
        .note(format!(
            "{} events (rated inserts, rating changes, soft deletes); {} counter writes, {} ledger writes",
            alone.events, alone.counter_statements, alone.ledger_statements
        )),
    );
    for (key, r) in ["definitions_extra_count", "definitions_extra_sum"]
        .iter()
        .zip(&runs[1..])
    {
        let extra_us = per_event_us(r) - per_event_us(alone);
        out.rows.push(
            Row::info(
                key,
                &format!("D. extra cost per event, {}", r.kept),
                extra_us,
                "µs/event",
            )
            .against(per_event_us(alone), "the default alone")
            .note(format!(
                "{:.0} events/s against {:.0}; counter writes per event {:.2} against {:.2}; ledger writes per event {:.2} against {:.2}",
                r.events_per_sec,
                alone.events_per_sec,
                r.counter_statements as f64 / r.events as f64,
                alone.counter_statements as f64 / alone.events as f64,
                r.ledger_statements as f64 / r.events as f64,
                alone.ledger_statements as f64 / alone.events as f64,
            )),
        );
    }
    out.phase("definitions", &runs)?;
    Ok(())
}
