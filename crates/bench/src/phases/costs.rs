//! Phase 3, what the worker costs apart from the server's speed, against the seed's hot path (one
//! upserting `$inc` per event, one after another) in the same run: write statements per event,
//! round trips per 1 000 events, CPU per event, counter writes on Zipf(1.1) and uniform loads;
//! and the worker's throughput against the rate at which the same server absorbs the same
//! write statements issued as bare bulk updates.

use std::sync::Arc;
use std::time::Instant;

use bson::{doc, Bson, DateTime, Document};
use counterd::store::counting::{Concern, Counts};
use counterd::store::mongo::Collections;
use serde::Serialize;

use super::throughput::Throughput;
use crate::harness::{
    comments, just_before_now, load, replay_through, replay_without_io, worker_settings, Bench,
    Counted, WorkerRun,
};
use crate::load::windowed_distinct;
use crate::measure::{median, process_cpu};
use crate::plan::{
    Plan, TARGET_CPU_US_PER_EVENT, TARGET_OWN_CPU_US_PER_EVENT, TARGET_WORKER_VS_BULK,
    TARGET_ZIPF_WRITES,
};
use crate::report::{Row, Status};
use crate::{say, Collected};

/// The seed's hot path over one load.
#[derive(Debug, Serialize)]
struct Seed {
    writes: usize,
    secs: f64,
    rate: f64,
    cpu_us_per_event: f64,
}

/// The worker's own writes of one replay of the Zipf backlog (the same statements: filters,
/// updates, documents, intents), made again on their own on a fresh server holding the backlog.
#[derive(Debug, Serialize)]
struct SameWrites {
    /// Statements per concern of the recorded replay (its batches may be cut a little
    /// differently from the measured one's: reads and carries follow the clock).
    statements: Counts,
    /// The recorded store calls.
    calls: usize,
    /// The median of [`SameWrites::replays_secs`].
    secs: f64,
    /// Every replay of the recorded writes, each on a fresh server loaded with the backlog.
    replays_secs: Vec<f64>,
    /// The backlog's events over `secs`: what the worker would reach if the server's time for
    /// its writes were all it cost.
    events_per_sec: f64,
    /// The worker's runs over the same backlog: phase 2's and `--speed-runs` - 1 more, each on
    /// a fresh server (not the recording one: its store keeps a copy of every write).
    worker_secs: Vec<f64>,
    /// The CPU per event of each of those runs (µs, this process's user + system time over
    /// the run): the target is judged on their median, as worker ÷ bulk is.
    worker_cpu_us_per_event: Vec<f64>,
}

impl SameWrites {
    /// The median worker run.
    fn worker_secs(&self) -> f64 {
        median(&self.worker_secs)
    }

    /// The median CPU per event of the worker runs.
    fn worker_cpu_us_per_event(&self) -> f64 {
        median(&self.worker_cpu_us_per_event)
    }
}

/// The worker's write statements of one run, reissued as plain bulk updates by `_id`.
#[derive(Debug, Serialize)]
struct Bulk {
    /// Statements per collection: counters, ledger, dirty set, checkpoints.
    statements: Vec<(String, u64)>,
    commands: u64,
    secs: f64,
    statements_per_sec: f64,
    /// Events per second the worker would reach if the server's time for its writes were all
    /// it cost: the run's events over `secs`.
    events_per_sec: f64,
}

/// `--only no-io`: the worker over the in-process store alone, on the throughput phase's Zipf
/// sequence (no server is loaded): counterd's own CPU per event, quick to repeat while
/// profiling.
pub async fn no_io_phase(plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let posts = crate::load::draw_posts(
        crate::load::Dist::Zipf,
        plan.events,
        plan.load_posts,
        super::throughput::ZIPF_SEED,
    )?;
    let no_io = replay_without_io(plan, &posts).await?;
    say!(
        "no-io: worker over the in-process store: {:.2} s, {:.1} µs CPU/event, of which counterd's own {:.1}; {} counter writes for {} events",
        no_io.secs,
        no_io.cpu_us_per_event(),
        no_io.own_cpu_us_per_event(),
        no_io.counts.of(Concern::Counters).statements,
        no_io.events,
    );
    out.phase("no_io_worker", &no_io)
}

/// Returns the events per second at which the server absorbs the worker's writes (the bulk
/// baseline).
pub async fn costs_phase(
    bench: &Bench,
    plan: &Plan,
    zipf: &Throughput,
    uniform: &Throughput,
    out: &mut Collected,
) -> anyhow::Result<f64> {
    let n = plan.events as f64;
    let seed_zipf = seed(bench, "seed_zipf", &zipf.posts).await?;
    let seed_uniform = seed(bench, "seed_uniform", &uniform.posts).await?;
    out.phase(
        "seed_baseline",
        &serde_json::json!({"zipf": seed_zipf, "uniform": seed_uniform}),
    )?;
    let bulk = bulk(bench, "bulk", &zipf.worker.counts, &zipf.posts).await?;
    out.phase("bulk_baseline", &bulk)?;
    let same = same_writes(bench, plan, &zipf.posts, &zipf.worker).await?;
    out.phase("same_writes_baseline", &same)?;
    // What per-batch coalescing gives at fixed batch sizes on the same Zipf sequence (the
    // worker's batches adapt between them).
    let model: Vec<serde_json::Value> = [1_000, 5_000, 10_000]
        .iter()
        .map(|&w| {
            let d = windowed_distinct(&zipf.posts, w);
            serde_json::json!({"batch_size": w, "writes": d, "ratio": d as f64 / n})
        })
        .collect();
    out.phase("zipf_coalescing_by_batch_size", &model)?;

    let no_io = replay_without_io(plan, &zipf.posts).await?;
    say!(
        "costs: worker over the in-process store (no I/O): {:.2} s, {:.1} µs CPU/event, of which counterd's own {:.1}",
        no_io.secs,
        no_io.cpu_us_per_event(),
        no_io.own_cpu_us_per_event()
    );
    out.phase("no_io_worker", &no_io)?;

    let worker = &zipf.worker;
    let worker_rate = n / same.worker_secs();
    let ratio_to_bulk = worker_rate / same.events_per_sec;
    out.rows.push(
        Row::info(
            "worker_vs_bulk",
            "2. worker throughput vs the same writes as bare bulk updates (Zipf)",
            worker_rate,
            "events/s",
        )
        .against(same.events_per_sec, "events/s if only its writes cost")
        .target(
            &format!(">= {TARGET_WORKER_VS_BULK:.2} x bulk"),
            Status::of(ratio_to_bulk >= TARGET_WORKER_VS_BULK),
        )
        .note(format!(
            "medians of {}: the worker's own writes of a replay of the same backlog ({} calls, {} statements: {}), made again one after another on a fresh server loaded with the backlog each time, took {:.2} s ({:.2?}); the worker took {:.2} s ({:.2?}), runs alternating with the replays",
            same.replays_secs.len(),
            same.calls,
            same.statements.statements(),
            breakdown(&same.statements, "per event", n, |t| t.statements),
            same.secs,
            same.replays_secs,
            same.worker_secs(),
            same.worker_secs,
        )),
    );
    out.rows.push(
        Row::info(
            "worker_vs_plain_bulk",
            "2. worker throughput vs as many plain upserts by _id (Zipf)",
            worker.rate(),
            "events/s",
        )
        .against(bulk.events_per_sec, "events/s if only plain upserts cost")
        .note(format!(
            "the baseline of the runs before 2026-12-05 (cheaper statements than the worker's): the worker's {} write statements ({}) reissued as {} plain `update` commands of `$inc` upserts by _id took {:.2} s ({:.0} statements/s)",
            bulk.statements.iter().map(|(_, k)| k).sum::<u64>(),
            bulk.statements.iter().map(|(c, k)| format!("{c} {k}")).collect::<Vec<_>>().join(", "),
            bulk.commands,
            bulk.secs,
            bulk.statements_per_sec,
        )),
    );
    out.rows.push(
        Row::info(
            "statements_per_event",
            "3. write statements per event (Zipf)",
            worker.counts.statements() as f64 / n,
            "statements/event",
        )
        .against(1.0, "seed: one $inc per event")
        .note(breakdown(&worker.counts, "statements", n, |t| t.statements)),
    );
    out.rows.push(
        Row::info(
            "round_trips_per_1000",
            "3. round trips (store calls) per 1000 events (Zipf)",
            worker.calls_per_1000(),
            "calls",
        )
        .against(1000.0, "seed: one per event")
        .note(format!(
            "store calls, each at least one round trip (bulk writes over 1000 statements are split into commands of 1000, and cursors fetch more); {}",
            breakdown(&worker.counts, "calls", n / 1000.0, |t| t.calls)
        )),
    );
    let cpu = same.worker_cpu_us_per_event();
    out.rows.push(
        Row::info(
            "cpu_per_event",
            "3. counterd CPU per event (user+sys, worker phase, Zipf)",
            cpu,
            "µs/event",
        )
        .against(seed_zipf.cpu_us_per_event, "the seed's loop")
        .target(
            &format!("<= {TARGET_CPU_US_PER_EVENT:.0} µs/event"),
            Status::of(cpu <= TARGET_CPU_US_PER_EVENT),
        )
        .note(format!(
            "with the MongoDB store, the median of the {} worker runs of phase 2 ({:.1?}): includes the driver's encoding and decoding; uniform (one run): {:.1} µs/event",
            same.worker_cpu_us_per_event.len(),
            same.worker_cpu_us_per_event,
            uniform.worker.cpu_us_per_event()
        )),
    );
    out.rows.push(
        Row::info(
            "own_cpu_per_event",
            "3. counterd's own CPU per event (no I/O, Zipf)",
            no_io.own_cpu_us_per_event(),
            "µs/event",
        )
        .against(no_io.cpu_us_per_event(), "with the in-process store's calls")
        .target(
            &format!("<= {TARGET_OWN_CPU_US_PER_EVENT:.0} µs/event"),
            Status::of(no_io.own_cpu_us_per_event() <= TARGET_OWN_CPU_US_PER_EVENT),
        )
        .note(format!(
            "the same worker over the in-process store (no I/O): {:.1} µs/event in all, {:.1} µs of it inside that store's calls (rendering events, keeping its tables), the rest counterd's own work",
            no_io.cpu_us_per_event(),
            no_io.store_secs() * 1e6 / no_io.events as f64,
        )),
    );
    let store_secs = worker.store_secs();
    out.rows.push(
        Row::info(
            "store_time",
            "3. time inside store calls (Zipf)",
            store_secs,
            "s",
        )
        .against(worker.secs, "worker time")
        .note(format!(
            "the worker's time waiting on the store (the server and the driver); {}",
            breakdown(&worker.counts, "seconds", 1e6, |t| t.micros)
        )),
    );
    let zipf_writes = worker.counts.of(Concern::Counters).statements as f64;
    out.rows.push(
        Row::info(
            "zipf_counter_writes",
            "3. counter writes, Zipf(1.1), worker behind",
            zipf_writes,
            "writes",
        )
        .against(n, "seed: one $inc per event")
        .target(
            &format!("<= {TARGET_ZIPF_WRITES:.2} x seed"),
            Status::of(zipf_writes <= TARGET_ZIPF_WRITES * n),
        )
        .note(format!(
            "batch_size {} growing to max_batch_size {} while behind, {} posts; fixed batches of 1000 / 5000 / 10000 would give {}",
            plan.batch_size,
            counterd::worker::WorkerSettings::default().max_batch_size,
            plan.load_posts,
            [1_000, 5_000, 10_000].map(|w| windowed_distinct(&zipf.posts, w).to_string()).join(" / ")
        )),
    );
    out.rows.push(
        Row::info(
            "uniform_counter_writes",
            "3. counter writes, uniform",
            uniform.worker.counts.of(Concern::Counters).statements as f64,
            "writes",
        )
        .against(n, "seed: one $inc per event"),
    );
    for (key, dist, seed, run) in [
        ("zipf", "Zipf", &seed_zipf, &zipf.worker),
        ("uniform", "uniform", &seed_uniform, &uniform.worker),
    ] {
        out.rows.push(
            Row::info(
                &format!("worker_time_{key}"),
                &format!("3. counterd worker time vs seed hot path ({dist}, N events)"),
                run.secs,
                "s",
            )
            .against(seed.secs, "seed: N sequential $inc")
            .note(format!("seed: {:.0} writes/s", seed.rate)),
        );
    }
    Ok(same.events_per_sec)
}

/// The bulk baseline: the worker replays the Zipf backlog through a store that keeps its
/// writes; they are then made again, one after another and nothing else, on a fresh server
/// loaded with the same backlog (the worker's server held it: its comments and their oplog
/// entries). The same statements as the worker's (guarded filters, ledger states, intents), so
/// the ratio is the worker's overhead over the writes it must make.
///
/// Both sides vary from run to run on a shared machine (a replay took 7.3-8.3 s, the worker
/// 9.3-10.6 s, in consecutive runs of the same build), so each is the median of three
/// (`--speed-runs`, default 3), taken
/// alternately (replay, worker, replay, worker, replay) so that a machine that slows down or
/// speeds up meanwhile does so for both: `worker_secs` (phase 2's run) and two more. The
/// recording run is not one of them: its store copies every write, which its time includes.
async fn same_writes(
    bench: &Bench,
    plan: &Plan,
    posts: &[i64],
    first: &WorkerRun,
) -> anyhow::Result<SameWrites> {
    let n = posts.len();
    let recorded = bench.recording_store("record").await?;
    say!("same writes: recording the worker's writes over {n} events ...");
    let run = worker_over_backlog(bench, &recorded, plan, posts).await?;
    let writes = recorded.take_recorded();
    say!(
        "same writes: recorded in {:.2} s; {} statements in {} calls",
        run.secs,
        run.counts.statements(),
        writes.len()
    );
    let mut worker_secs = vec![first.secs];
    let mut worker_cpu = vec![first.cpu_us_per_event()];
    let mut replays_secs = Vec::new();
    let rounds = plan.speed_runs.max(1);
    for round in 0..rounds {
        let target = bench.store("same_writes").await?;
        // The server the worker wrote to held the backlog; the replay's holds it too, so that
        // both write to a server of one size.
        load(&comments(&target), posts, DateTime::now()).await?;
        let started = Instant::now();
        for write in &writes {
            write.replay(target.inner()).await?;
        }
        let secs = started.elapsed().as_secs_f64();
        say!(
            "same writes: made again in {secs:.2} s ({:.0} events/s)",
            n as f64 / secs
        );
        bench.drop_db(&target).await;
        replays_secs.push(secs);
        if round + 1 < rounds {
            let again = bench.store("worker_again").await?;
            let worker = worker_over_backlog(bench, &again, plan, posts).await?;
            say!(
                "same writes: the worker once more: {:.2} s, {:.1} µs CPU/event",
                worker.secs,
                worker.cpu_us_per_event()
            );
            worker_secs.push(worker.secs);
            worker_cpu.push(worker.cpu_us_per_event());
        }
    }
    say!("same writes: worker runs {worker_secs:.2?} s ({worker_cpu:.1?} µs CPU/event), replays {replays_secs:.2?} s");
    let secs = median(&replays_secs);
    Ok(SameWrites {
        statements: run.counts,
        calls: writes.len(),
        secs,
        replays_secs,
        events_per_sec: n as f64 / secs,
        worker_secs,
        worker_cpu_us_per_event: worker_cpu,
    })
}

/// The worker over the Zipf backlog `posts`, loaded into `store` (a fresh server's) first;
/// the database is dropped afterwards.
pub async fn worker_over_backlog(
    bench: &Bench,
    store: &Arc<Counted>,
    plan: &Plan,
    posts: &[i64],
) -> anyhow::Result<WorkerRun> {
    let start = just_before_now();
    load(&comments(store), posts, DateTime::now()).await?;
    let run = replay_through(store.clone(), worker_settings(plan, start), posts.len()).await?;
    bench.drop_db(store).await;
    Ok(run)
}

/// Per-concern figures of `counts`, divided by `per`.
fn breakdown(
    counts: &Counts,
    what: &str,
    per: f64,
    field: impl Fn(&counterd::store::counting::Tally) -> u64,
) -> String {
    let parts: Vec<String> = Concern::ALL
        .iter()
        .filter(|&&c| field(&counts.of(c)) > 0)
        .map(|&c| format!("{c:?} {:.3}", field(&counts.of(c)) as f64 / per))
        .collect();
    format!("{what} by concern: {}", parts.join(", "))
}

/// The seed's hot path: one upserting `$inc` per event, one after another.
async fn seed(bench: &Bench, phase: &str, posts: &[i64]) -> anyhow::Result<Seed> {
    let store = bench.store(phase).await?;
    let counters = store
        .inner()
        .database()
        .collection::<Document>("seed_counters");
    say!("{phase}: {} sequential $inc writes ...", posts.len());
    let cpu_before = process_cpu();
    let started = Instant::now();
    for p in posts {
        counters
            .update_one(doc! {"_id": *p}, doc! {"$inc": {"count": 1_i64}})
            .upsert(true)
            .await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = (process_cpu() - cpu_before).as_secs_f64();
    say!(
        "{phase}: {secs:.2} s ({:.0} writes/s)",
        posts.len() as f64 / secs
    );
    bench.drop_db(&store).await;
    Ok(Seed {
        writes: posts.len(),
        secs,
        rate: posts.len() as f64 / secs,
        cpu_us_per_event: cpu * 1e6 / posts.len().max(1) as f64,
    })
}

/// The worker's write statements, as many per collection as it wrote, reissued as plain
/// upserting `$inc` statements by `_id` in `update` commands of 1 000 (`ordered: false`), one
/// command after another: counters and dirty marks over the load's posts in order, ledger
/// entries one per comment, checkpoint writes on one document.
async fn bulk(bench: &Bench, phase: &str, worker: &Counts, posts: &[i64]) -> anyhow::Result<Bulk> {
    let store = bench.store(phase).await?;
    let db = store.inner().database().clone();
    let names = Collections::default();
    let plan = [
        (&names.counters, Concern::Counters, Ids::Posts),
        (&names.ledger, Concern::Ledger, Ids::Comments),
        (&names.dirty, Concern::Dirty, Ids::Posts),
        (&names.checkpoints, Concern::Checkpoints, Ids::OneStream),
    ];
    let total: u64 = plan.iter().map(|(_, c, _)| worker.of(*c).statements).sum();
    say!("{phase}: {total} statements as bare bulk updates ...");
    let mut commands = 0;
    let started = Instant::now();
    for (collection, concern, ids) in &plan {
        let k = worker.of(*concern).statements as usize;
        for from in (0..k).step_by(1000) {
            let updates: Vec<Document> = (from..(from + 1000).min(k))
                .map(|i| doc! {"q": {"_id": ids.of(i, posts)}, "u": {"$inc": {"n": 1_i64}}, "upsert": true})
                .collect();
            db.run_command(
                doc! {"update": collection.as_str(), "updates": updates, "ordered": false},
            )
            .await?;
            commands += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    say!(
        "{phase}: {secs:.2} s ({:.0} statements/s)",
        total as f64 / secs
    );
    bench.drop_db(&store).await;
    Ok(Bulk {
        statements: plan
            .iter()
            .map(|(c, concern, _)| (c.to_string(), worker.of(*concern).statements))
            .collect(),
        commands,
        secs,
        statements_per_sec: total as f64 / secs,
        events_per_sec: posts.len() as f64 / secs,
    })
}

/// The `_id`s the bulk baseline writes, like the worker's: a counter or dirty mark per post (the
/// load's posts in order), a ledger entry per comment, the one checkpoint of the stream.
enum Ids {
    Posts,
    Comments,
    OneStream,
}

impl Ids {
    fn of(&self, i: usize, posts: &[i64]) -> Bson {
        match self {
            Ids::Posts => Bson::Int64(posts[i % posts.len().max(1)]),
            Ids::Comments => Bson::Int64(i as i64),
            Ids::OneStream => Bson::String("comments".into()),
        }
    }
}
