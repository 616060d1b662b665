//! Phases 1-2, the raw tail rate of a bare change-stream reader and the worker's throughput over the
//! same backlog (Zipf and uniform), with the probe that shows how the server executes the
//! worker's guarded statements.

use std::time::{Duration, Instant};

use anyhow::bail;
use bson::{doc, DateTime, Document, Timestamp};
use counterd::store::mongo::{Collections, MongoStore};
use counterd::store::prelude::*;
use counterd::store::{StreamOptions, StreamStart};
use counterd::worker::WorkerSettings;
use serde::Serialize;

use crate::harness::{
    comments, just_before_now, load, phase_timeout, replay_through, worker_settings, Bench,
    WorkerRun,
};
use crate::load::{distinct, draw_posts, Dist};
use crate::measure::{median, vm_hwm_kb};
use crate::plan::Plan;
use crate::report::Row;
use crate::{say, Collected};

/// One backlog, read bare and replayed by the worker.
#[derive(Debug, Serialize)]
pub struct Throughput {
    pub events: usize,
    pub distinct_posts: usize,
    pub load_secs: f64,
    pub raw_secs: f64,
    /// Every bare read of the backlog (the median is `raw_secs`).
    pub raw_reads_secs: Vec<f64>,
    pub raw_rate: f64,
    pub worker: WorkerRun,
    /// How this server executes the worker's guarded statements.
    pub guard_probe: GuardProbe,
    #[serde(skip)]
    pub posts: Vec<i64>,
}

/// One `update` command of the worker's guarded statement shape (`_id` + `applied_through` +
/// `epoch`) against the same statements filtered on `_id` alone, on the filled ledger.
#[derive(Debug, Serialize)]
pub struct GuardProbe {
    pub statements: usize,
    pub ledger_docs: u64,
    pub guarded_ms: f64,
    pub id_only_ms: f64,
}

/// Warm-up, then the Zipf and uniform backlogs; the bench process's memory after them.
pub async fn throughput_phase(
    bench: &Bench,
    plan: &Plan,
    out: &mut Collected,
) -> anyhow::Result<(Throughput, Throughput, Option<f64>)> {
    // Warm-up (the fake server is a JVM): a small backlog through both readers, not reported.
    let warm = (plan.events / 10).clamp(500, 5_000);
    let w = throughput(bench, "warmup", Dist::Zipf, warm, plan).await?;
    out.phase("warmup", &w)?;
    let zipf = throughput(bench, "zipf", Dist::Zipf, plan.events, plan).await?;
    out.phase("zipf", &zipf)?;
    let uniform = throughput(bench, "uniform", Dist::Uniform, plan.events, plan).await?;
    out.phase("uniform", &uniform)?;
    let bench_rss_mb = vm_hwm_kb(None).map(|kb| kb as f64 / 1024.0);

    out.rows.push(
        Row::info(
            "raw_tail_rate",
            "1. raw tail rate (bare change-stream reader, Zipf backlog)",
            zipf.raw_rate,
            "events/s",
        )
        .note(format!(
            "{} events in {:.3} s (median of 3 reads of the backlog)",
            zipf.events, zipf.raw_secs
        )),
    );
    out.rows.push(
        Row::info(
            "worker_rate",
            "2. worker throughput (Zipf backlog)",
            zipf.worker.rate(),
            "events/s",
        )
        .against(zipf.raw_rate, "raw tail rate")
        .note(format!(
            "{} events in {:.2} s",
            zipf.events, zipf.worker.secs
        )),
    );
    out.rows.push(
        Row::info(
            "worker_rate_uniform",
            "2. worker throughput (uniform backlog)",
            uniform.worker.rate(),
            "events/s",
        )
        .against(uniform.raw_rate, "raw tail rate (uniform backlog)"),
    );
    out.rows.push(
        Row::info(
            "guard_probe",
            "2. 1000 guarded ledger updates (worker's filter shape)",
            zipf.guard_probe.guarded_ms,
            "ms",
        )
        .against(zipf.guard_probe.id_only_ms, "same updates on _id alone")
        .note(format!(
            "medians of three commands of each shape, on a ledger of {} documents; a ratio far above 1 means the server scans the collection for the worker's guarded filter",
            zipf.guard_probe.ledger_docs
        )),
    );
    Ok((zipf, uniform, bench_rss_mb))
}

/// Writes a backlog of `n` events, then replays it through the bare reader and through the
/// worker (both from a cluster time just before the load).
/// The seed of the Zipf sequence the throughput and cost phases replay.
pub const ZIPF_SEED: u64 = 11;

async fn throughput(
    bench: &Bench,
    phase: &str,
    dist: Dist,
    n: usize,
    plan: &Plan,
) -> anyhow::Result<Throughput> {
    let seed = match dist {
        Dist::Zipf => ZIPF_SEED,
        Dist::Uniform => 12,
    };
    let posts = draw_posts(dist, n, plan.load_posts, seed)?;
    let distinct_posts = distinct(&posts).len();
    let store = bench.store(phase).await?;
    let start = just_before_now();
    say!("{phase}: loading {n} events ({distinct_posts} distinct posts) ...");
    let load_secs = load(&comments(&store), &posts, DateTime::now()).await?;
    say!("{phase}: loaded in {load_secs:.2} s; bare reader ...");

    // The bare reader: open the stream at `start` and count events until all are seen.
    // Three reads of the same backlog (it only reads), the median kept.
    let timeout = phase_timeout(n);
    let mut reads = Vec::new();
    for _ in 0..3 {
        reads.push(bare_read(store.inner(), start, n, plan.batch_size, timeout).await?);
    }
    reads.sort_by(f64::total_cmp);
    let raw_secs = reads[1];
    say!(
        "{phase}: bare reader {raw_secs:.3} s ({:.0} events/s; reads {reads:.3?}); worker ...",
        n as f64 / raw_secs
    );

    let worker = replay_through(store.clone(), worker_settings(plan, start), n).await?;
    let guard_probe = guard_probe(store.inner(), n).await?;
    say!(
        "{phase}: worker {:.2} s ({:.0} events/s, {:.1} µs CPU/event), {} write statements, {} store calls",
        worker.secs,
        worker.rate(),
        worker.cpu_us_per_event(),
        worker.counts.statements(),
        worker.counts.calls()
    );
    bench.drop_db(&store).await;
    Ok(Throughput {
        events: n,
        distinct_posts,
        load_secs,
        raw_secs,
        raw_reads_secs: reads,
        raw_rate: n as f64 / raw_secs,
        worker,
        guard_probe,
        posts,
    })
}

/// Opens the stream at `start` and counts events until `n` are seen; returns the seconds taken.
async fn bare_read(
    store: &MongoStore,
    start: Timestamp,
    n: usize,
    batch: usize,
    timeout: Duration,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut source = store
        .open_stream(StreamOptions {
            start: StreamStart::AtTime(start),
            pre_images: false,
            pipeline: Vec::new(),
            max_await: WorkerSettings::default().max_await,
        })
        .await?;
    let mut seen = 0;
    while seen < n {
        let got = source
            .next_batch(batch, WorkerSettings::default().max_batch_wait)
            .await?;
        seen += got.events.len();
        if started.elapsed() > timeout {
            bail!("the bare reader saw {seen} of {n} events within {timeout:?}");
        }
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Times 1000 ledger updates with the worker's guarded filter against the same updates on `_id`
/// alone (medians of three). A server that uses the `_id` index for both shows a ratio near 1; one that scans the
/// collection for the guarded shape (the stock mongo-java-server does: it only uses an index
/// when the query has exactly the index's keys; testdb/FakeMongo.java's `_id`-index lookup,
/// off with `COUNTERD_TESTDB_ID_INDEX=0`, changes that) shows its collection size in the ratio.
async fn guard_probe(store: &MongoStore, n: usize) -> anyhow::Result<GuardProbe> {
    let db = store.database();
    let ledger = Collections::default().ledger;
    let ledger_docs = db
        .collection::<Document>(&ledger)
        .estimated_document_count()
        .await?;
    let k = n.min(1000);
    let statements = |guarded: bool, mark: i32| -> Vec<Document> {
        (0..k as i64)
            .map(|id| {
                let q = if guarded {
                    doc! {"_id": id, "applied_through": {"$not": {"$gte": "~"}}, "epoch": {"$not": {"$gt": 0_i64}}}
                } else {
                    doc! {"_id": id}
                };
                doc! {"q": q, "u": {"$set": {"bench_probe": mark}}}
            })
            .collect()
    };
    // Three rounds of the two shapes, alternating, the median of each kept: one command is
    // short enough for a pause of the server's collector to triple it (single commands gave
    // 18-258 ms for the same build on 2026-12-05), where a scan would take seconds.
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..3 {
        for (slot, guarded) in [(0, true), (1, false)] {
            let updates = statements(guarded, (round * 2 + slot) as i32 + 1);
            let started = Instant::now();
            db.run_command(doc! {"update": &ledger, "updates": updates, "ordered": false})
                .await?;
            times[slot].push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(GuardProbe {
        statements: k,
        ledger_docs,
        guarded_ms: median(&times[0]),
        id_only_ms: median(&times[1]),
    })
}
