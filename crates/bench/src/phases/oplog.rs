//! Phase O, counterd's own oplog bytes per application event. Every write counterd makes (a
//! ledger entry per event, counter increments, dirty marks, the checkpoint with each batch's
//! intent, carried batches while it catches up) is an oplog entry too, so it shrinks the window
//! that `CounterdCheckpointAgeHigh` and lost history depend on, most while counterd catches up
//! after an outage. Measured by reading the server's `local.oplog.rs` after each run: the
//! entries of counterd's collections against those of `comments` (the application's own), by
//! collection, in entries and BSON bytes, in two runs:
//!
//! - **catching up**: a backlog written while no worker runs, then applied (batches grow, and
//!   counters and dirty marks are carried across batches);
//! - **keeping up**: the worker running while comments arrive one insert at a time at a modest
//!   rate (small batches, each writing its own counters, marks and checkpoint).
//!
//! Entry sizes are the server's: on the fake server its oplog's documents (an update's entry
//! holds the update's statement); a real MongoDB writes an update as a diff, so the bytes
//! differ somewhat there, the counts of entries do not.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, DateTime, Document, Timestamp};
use futures::TryStreamExt;
use serde::Serialize;

use crate::harness::{
    comments, just_before_now, load, phase_timeout, worker_settings, Bench, Counted, Running,
};
use crate::load::{draw_posts, Dist};
use crate::plan::Plan;
use crate::report::Row;
use crate::{say, Collected};

/// Oplog entries of one collection: how many, and their BSON bytes.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Entries {
    pub entries: u64,
    pub bytes: u64,
}

/// One run: the application's events and the entries written for them.
#[derive(Debug, Serialize)]
pub struct OplogRun {
    pub events: usize,
    /// The application's own entries (`comments`).
    pub application: Entries,
    /// counterd's entries, by collection.
    pub counterd: BTreeMap<String, Entries>,
    pub counterd_total: Entries,
}

impl OplogRun {
    pub fn counterd_bytes_per_event(&self) -> f64 {
        self.counterd_total.bytes as f64 / self.events as f64
    }

    pub fn application_bytes_per_event(&self) -> f64 {
        self.application.bytes as f64 / self.events as f64
    }

    /// `ledger 1.00 × 310 B, ...`: entries per event and bytes per entry, by collection.
    fn by_collection(&self) -> String {
        let n = self.events as f64;
        self.counterd
            .iter()
            .map(|(name, e)| {
                format!(
                    "{name} {:.3} entries/event, {:.0} B/event",
                    e.entries as f64 / n,
                    e.bytes as f64 / n
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[derive(Debug, Serialize)]
struct OplogPhase {
    source: &'static str,
    catching_up: OplogRun,
    keeping_up: OplogRun,
}

/// Both runs, each on a fresh database (and, on the fake, a fresh server and oplog).
pub async fn oplog_phase(bench: &Bench, plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let events = (plan.events / 5).max(1000);
    let catching_up = catching_up(bench, plan, events).await?;
    let keeping_up = keeping_up(bench, plan, (events / 10).max(500)).await?;
    for (key, run, how) in [
        (
            "oplog_bytes_per_event_catch_up",
            &catching_up,
            "catching up",
        ),
        ("oplog_bytes_per_event_live", &keeping_up, "keeping up"),
    ] {
        let mut row = Row::info(
            key,
            &format!("O. counterd's oplog bytes per application event, {how}"),
            run.counterd_bytes_per_event(),
            "B/event",
        );
        row.note = Some(format!(
            "{} events; the application's own: {:.0} B/event ({:.2}x); by collection: {}",
            run.events,
            run.application_bytes_per_event(),
            run.counterd_bytes_per_event() / run.application_bytes_per_event(),
            run.by_collection()
        ));
        out.rows.push(row);
    }
    out.phase(
        "oplog",
        &OplogPhase {
            source: "local.oplog.rs of the test server, read after each run",
            catching_up,
            keeping_up,
        },
    )
}

/// A backlog of `events` inserts, then the worker applies it.
async fn catching_up(bench: &Bench, plan: &Plan, events: usize) -> anyhow::Result<OplogRun> {
    let store = bench.store("oplog_catch_up").await?;
    let start = just_before_now();
    let posts = draw_posts(Dist::Zipf, events, plan.load_posts, 41)?;
    load(&comments(&store), &posts, DateTime::now()).await?;
    let mut worker = Running::spawn(store.clone(), worker_settings(plan, start));
    worker
        .wait_applied(events as i64, phase_timeout(events))
        .await?;
    drained(&store).await?;
    worker.shutdown().await?;
    let run = read_oplog(&store, start, events).await?;
    say!(
        "oplog, catching up: {:.0} B/event of counterd's",
        run.counterd_bytes_per_event()
    );
    bench.drop_db(&store).await;
    Ok(run)
}

/// The worker running while `events` comments arrive one at a time, about 200 a second.
async fn keeping_up(bench: &Bench, plan: &Plan, events: usize) -> anyhow::Result<OplogRun> {
    let store = bench.store("oplog_live").await?;
    let start = just_before_now();
    let mut worker = Running::spawn(store.clone(), worker_settings(plan, start));
    worker.wait_open(phase_timeout(0)).await?;
    let posts = draw_posts(Dist::Zipf, events, plan.load_posts, 42)?;
    let rows = comments(&store);
    let started = Instant::now();
    for (i, post) in posts.iter().enumerate() {
        rows.insert_one(doc! {"_id": i as i64, "post_id": post, "created_at": DateTime::now(), "body": "benchmark comment"})
            .await?;
        // About 200 a second: the worker keeps up, batch by batch.
        let due = Duration::from_millis(5 * i as u64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
    worker
        .wait_applied(events as i64, phase_timeout(events))
        .await?;
    drained(&store).await?;
    worker.shutdown().await?;
    let run = read_oplog(&store, start, events).await?;
    say!(
        "oplog, keeping up: {:.0} B/event of counterd's",
        run.counterd_bytes_per_event()
    );
    bench.drop_db(&store).await;
    Ok(run)
}

/// Waits until the checkpoint holds no batch in flight (every write of the last batch made).
async fn drained(store: &Counted) -> anyhow::Result<()> {
    let checkpoints = store
        .inner()
        .database()
        .collection::<Document>("counterd_checkpoints");
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpoints
        .count_documents(doc! {"pending": {"$exists": true, "$ne": null}})
        .await?
        > 0
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "a batch stayed in flight for 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The oplog entries of this database since `start`, the application's apart from counterd's.
async fn read_oplog(store: &Counted, start: Timestamp, events: usize) -> anyhow::Result<OplogRun> {
    let db = store.inner().database();
    let prefix = format!("{}.", db.name());
    let oplog = db
        .client()
        .database("local")
        .collection::<Document>("oplog.rs");
    let mut cursor = oplog.find(doc! {"ts": {"$gte": start}}).await?;
    let mut by_ns: BTreeMap<String, Entries> = BTreeMap::new();
    while let Some(entry) = cursor.try_next().await? {
        // Writes only (inserts, updates, deletes): not the commands that created the
        // collections and indexes before the run.
        if !matches!(entry.get_str("op"), Ok("i" | "u" | "d")) {
            continue;
        }
        let Some(collection) = entry
            .get_str("ns")
            .ok()
            .and_then(|ns| ns.strip_prefix(&prefix))
        else {
            continue;
        };
        let e = by_ns.entry(collection.to_string()).or_default();
        e.entries += 1;
        e.bytes += bson::to_vec(&entry)?.len() as u64;
    }
    let application = by_ns.remove("comments").unwrap_or_default();
    anyhow::ensure!(
        application.entries >= events as u64,
        "the oplog holds {} of the application's {events} entries: is local.oplog.rs kept?",
        application.entries
    );
    let counterd_total = by_ns.values().fold(Entries::default(), |t, e| Entries {
        entries: t.entries + e.entries,
        bytes: t.bytes + e.bytes,
    });
    Ok(OplogRun {
        events,
        application,
        counterd: by_ns,
        counterd_total,
    })
}
