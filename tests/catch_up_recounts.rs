//! Issue 41: while `counterd run` catches up a backlog, the reconciler spends (almost) no counts
//! on posts the worker has not reached. Such a count cannot be folded (it is "in flight": the
//! worker has not applied what the count saw), so it is a query on the application's collection,
//! on a server that is busy recovering, for nothing.
//!
//! The backlog an outage leaves is written while counterd is stopped (inserts, then soft
//! deletes, undeletes, moves and hard deletes of earlier rows), then `counterd run` starts with
//! reconcile passes every second (default background sweep and `catch_up_timeout`) while busy
//! threads load every core, so that the catch-up spans many passes. From its `/metrics`:
//! `counterd_recounts_in_flight_total` must stay within 5 % of `counterd_recounts_total`, read
//! once the worker has applied the backlog and again once the reconciler has folded every dirty
//! post (the counts of passes that started during the catch-up end after it).
//!
//! Knobs for measuring by hand: `COUNTERD_TEST_BACKLOG_EVENTS` (default 10 000),
//! `COUNTERD_TEST_HOGS` (busy threads, default twice the cores).

#[path = "support/daemon.rs"]
mod daemon;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::Daemon;
use mongodb::bson::{doc, DateTime, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::TestDb;

/// Posts of the backlog: fewer than a background sweep's window (500), as on a small
/// deployment, so that every pass could recount all of them.
const POSTS: i64 = 300;
/// Events written per round (inserts first, then changes to rows of earlier rounds).
const ROUND: usize = 500;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Busy threads that load every core until dropped.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Hogs {
    fn start(n: usize) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for i in 0..10_000u64 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                        }
                    }
                    x
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Writes `events` changes over [`POSTS`] posts in rounds: 80 % inserts (created now), then soft
/// deletes, undeletes, moves and hard deletes of rows of earlier rounds. Returns the number of
/// change events written.
async fn write_backlog(t: &TestDb, events: usize) -> usize {
    let mut rng = StdRng::seed_from_u64(41);
    let created = DateTime::now();
    let mut live: Vec<i64> = Vec::new();
    let mut deleted: Vec<i64> = Vec::new();
    let mut next_id = 0i64;
    let mut written = 0;
    while written < events {
        let inserts = if live.is_empty() {
            ROUND
        } else {
            ROUND * 4 / 5
        };
        let docs: Vec<Document> = (0..inserts)
            .map(|i| {
                let post = rng.random_range(0..POSTS);
                doc! {"_id": next_id + i as i64, "post_id": format!("post-{post}"), "created_at": created, "body": "b".repeat(200)}
            })
            .collect();
        t.comments.insert_many(docs).await.unwrap();
        let earlier = live.clone();
        live.extend(next_id..next_id + inserts as i64);
        next_id += inserts as i64;
        written += inserts;
        for _ in 0..(ROUND - inserts) {
            written += change_one(t, &mut rng, &earlier, &mut live, &mut deleted).await;
        }
    }
    written
}

/// One change to a row of an earlier round: a soft delete, an undelete, a move or a hard
/// delete. Returns the events written (0 when the row drawn was hard-deleted already).
async fn change_one(
    t: &TestDb,
    rng: &mut StdRng,
    earlier: &[i64],
    live: &mut Vec<i64>,
    deleted: &mut Vec<i64>,
) -> usize {
    let id = earlier[rng.random_range(0..earlier.len())];
    if !live.contains(&id) {
        return 0;
    }
    let filter = doc! {"_id": id};
    match rng.random_range(0..20) {
        0..6 => {
            let now = DateTime::now();
            t.comments
                .update_one(filter, doc! {"$set": {"deleted_at": now}})
                .await
                .unwrap();
            deleted.push(id);
        }
        6..10 if !deleted.is_empty() => {
            let back = deleted.swap_remove(rng.random_range(0..deleted.len()));
            t.comments
                .update_one(doc! {"_id": back}, doc! {"$unset": {"deleted_at": ""}})
                .await
                .unwrap();
        }
        10..15 => {
            let to = format!("post-{}", rng.random_range(0..POSTS));
            t.comments
                .update_one(filter, doc! {"$set": {"post_id": to}})
                .await
                .unwrap();
        }
        _ => {
            t.comments.delete_one(filter).await.unwrap();
            live.retain(|l| *l != id);
            deleted.retain(|d| *d != id);
        }
    }
    1
}

/// The sum over every series of `name` in a `/metrics` text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metrics(d: &Daemon) -> String {
    match d.get("/metrics").await {
        Some((200, text)) => text,
        _ => String::new(),
    }
}

/// Polls `/metrics` until `done` holds (or panics after `within`); returns the text.
async fn metrics_when(
    d: &Daemon,
    what: &str,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let text = metrics(d).await;
        if done(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; dirty posts {}, reconcile runs {}, recounts {}",
            metric(&text, "counterd_dirty_posts"),
            metric(&text, "counterd_reconcile_runs_total"),
            metric(&text, "counterd_recounts_total"),
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reconciler's summary lines in the daemon's log (for the failure message).
fn reconcile_lines(log: &std::path::Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("reconcile run finished"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recounts_while_catching_up_a_backlog_under_load_are_rarely_in_flight() {
    let t = TestDb::new("catch_up_recounts").await;
    // Kept for a look after a failure.
    let log = std::env::temp_dir().join(format!("{}.log", t.name));
    let env = [
        ("COUNTERD_BUCKET_WIDTH", "1s"),
        ("COUNTERD_SETTLE_TIME", "1s"),
        ("COUNTERD_LOG_LEVEL", "info"),
        // A count waits at most 2 s for the worker: a catch-up of tens of seconds spans many
        // such waits (with the default 10 s, as the benchmark's 60 000 events do).
        ("COUNTERD_CATCH_UP_TIMEOUT", "2s"),
        // Background sweep steps of 50 posts: counted within a few seconds on a loaded machine,
        // well inside the catch-up, as a deployment's window of 500 is inside a longer one.
        ("COUNTERD_SWEEP_WINDOW", "50"),
    ];
    // counterd ran before the outage: its checkpoint stands before the backlog.
    let before = Daemon::start(&t.uri, &t.name, "before", &env);
    t.insert_comment("first", &support::post(0), support::now_secs())
        .await;
    t.wait_caught_up(Duration::from_secs(60)).await;
    before.terminate();

    let events = write_backlog(&t, knob("COUNTERD_TEST_BACKLOG_EVENTS", 10_000)).await;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs = Hogs::start(knob("COUNTERD_TEST_HOGS", 2 * cores));
    let started = Instant::now();
    // Every run's summary line (a run that is not notable logs it at debug).
    let logged = [&env[..], &[("RUST_LOG", "info,counterd::reconcile=debug")]].concat();
    let d = Daemon::start_logged(&t.uri, &t.name, "after", &logged, Some(&log));
    t.wait_caught_up(Duration::from_secs(600)).await;
    let caught_up = metrics(&d).await;
    let catch_up_secs = started.elapsed().as_secs_f64();
    // Every dirty post folded, as seen by a run that began after the catch-up: the passes
    // that began during it have ended.
    let runs = metric(&caught_up, "counterd_reconcile_runs_total");
    let settled = metrics_when(
        &d,
        "every dirty post folded",
        Duration::from_secs(300),
        |m| {
            metric(m, "counterd_reconcile_runs_total") >= runs + 4.0
                && metric(m, "counterd_dirty_posts") == 0.0
        },
    )
    .await;
    drop(hogs);
    let lines = reconcile_lines(&log);
    eprintln!("the reconciler's runs:\n{lines}");
    for (when, m) in [("caught up", &caught_up), ("settled", &settled)] {
        let counts = metric(m, "counterd_recounts_total");
        let in_flight = metric(m, "counterd_recounts_in_flight_total");
        let deferred = metric(m, "counterd_recounts_deferred_total");
        eprintln!(
            "{when}: {events} events caught up in {catch_up_secs:.1} s; recounts {counts}, in flight {in_flight}, deferred {deferred}"
        );
        assert!(
            in_flight <= 0.05 * counts,
            "{when}: {in_flight} of {counts} recounts were of posts the worker had not reached \
             (at most 5 % allowed); the reconciler's runs:\n{lines}"
        );
    }
    // Each recount says which run made it, so a share in flight can be traced to its run.
    let recount_lines: Vec<&str> = settled
        .lines()
        .filter(|l| l.starts_with("counterd_recounts_total{"))
        .collect();
    assert!(
        !recount_lines.is_empty() && recount_lines.iter().all(|l| l.contains("kind=\"")),
        "every counterd_recounts_total series names its run's kind: {recount_lines:?}"
    );
    eprintln!("recounts by run: {recount_lines:?}");
    d.terminate();
}
