//! Recovery paths through the real binary against the test database: `replay` while a worker
//! runs, after a stop that left a batch in flight, and while a dead worker's lease lingers; a
//! backup restored onto a fresh server; a dropped `comments` collection and the way back.

mod support;

#[path = "support/daemon.rs"]
mod daemon;

use std::process::Output;
use std::time::{Duration, Instant};

use counterd::core::batch::PendingBatch;
use counterd::core::classify::Attribution;
use counterd::core::event::ChangeEvent;
use counterd::core::key::GroupValue;
use counterd::core::schema::Schema;
use counterd::store::mongo::{ConnectOptions, MongoStore};
use counterd::store::prelude::*;
use counterd::store::{Fence, StreamOptions, StreamStart};
use counterd_testdb::{ServerKind, TestServer};
use daemon::Daemon;
use futures::TryStreamExt;
use mongodb::bson::{doc, DateTime, Document};
use support::{eventually, now_secs, output_text, post, rfc3339, TestDb};

fn counterd(uri: &str, database: &str, args: &[&str]) -> Output {
    support::counterd_at(uri, database)
        .args(args)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env("COUNTERD_SETTLE_TIME", "2s")
        .env("COUNTERD_LOG_LEVEL", "warn")
        .output()
        .expect("run counterd")
}

/// The daemon's exit code, once it exits within `within` (None: still running).
async fn exit_within(d: &mut Daemon, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = d.child.try_wait().unwrap() {
            return status.code();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Posts with a dirty entry.
async fn dirty_posts(db: &mongodb::Database) -> Vec<String> {
    let mut posts: Vec<String> = db
        .collection::<Document>("counterd_dirty")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect::<Vec<_>>()
        .await
        .unwrap()
        .iter()
        .filter_map(|d| d.get_str("_id").ok().map(String::from))
        .collect();
    posts.sort();
    posts
}

async fn clear_dirty(db: &mongodb::Database) {
    db.collection::<Document>("counterd_dirty")
        .delete_many(doc! {})
        .await
        .unwrap();
}

/// The sum of a metric's series on the daemon's `/metrics`.
async fn metric(d: &Daemon, name: &str) -> f64 {
    let (_, body) = d.get("/metrics").await.expect("/metrics answers");
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A daemon on `t`, with the reconciler slowed down so dirty marks stay visible.
fn quiet_daemon(t: &TestDb, owner: &str) -> Daemon {
    Daemon::start(
        &t.uri,
        &t.name,
        owner,
        &[("COUNTERD_RECONCILE_INTERVAL", "1h")],
    )
}

/// Nine settled rows over three posts, applied and drained by `d`; returns the time before them.
async fn nine_rows(t: &TestDb, d: &Daemon) -> i64 {
    assert!(d.wait_role("active", Duration::from_secs(20)).await);
    let before = now_secs() - 1;
    for i in 0..9 {
        t.insert_comment(format!("c{i}"), &post(i % 3), now_secs() - 3600)
            .await;
    }
    t.wait_exact(&[post(0), post(1), post(2)], Duration::from_secs(20))
        .await;
    t.wait_drained(Duration::from_secs(20)).await;
    before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_force_fences_the_running_worker_and_takes_effect() {
    let t = TestDb::new("replayforce").await;
    let d = quiet_daemon(&t, "replayforce");
    let before = nine_rows(&t, &d).await;
    let from = rfc3339(before);

    // Without --force: refused, saying who holds the stream and what to do.
    let refused = counterd(&t.uri, &t.name, &["replay", "--from-time", &from]);
    assert_eq!(refused.status.code(), Some(1), "{}", output_text(&refused));
    for said in ["holds stream `comments`", "expires in", "--force", "--wait"] {
        assert!(
            output_text(&refused).contains(said),
            "{said}: {}",
            output_text(&refused)
        );
    }
    // --wait against a running worker: it renews its lease, so still refused.
    let waited = counterd(&t.uri, &t.name, &["replay", "--from-time", &from, "--wait"]);
    assert_eq!(waited.status.code(), Some(1), "{}", output_text(&waited));
    assert!(
        output_text(&waited).contains("renewed its lease"),
        "{}",
        output_text(&waited)
    );

    // --force: the worker is fenced out, steps down, and resumes from the moved position.
    clear_dirty(&t.db).await;
    let forced = counterd(
        &t.uri,
        &t.name,
        &["replay", "--from-time", &from, "--force"],
    );
    assert!(forced.status.success(), "{}", output_text(&forced));
    assert!(
        output_text(&forced).contains("fenced out worker replayforce"),
        "{}",
        output_text(&forced)
    );
    // The re-read events mark their posts dirty: the move took effect.
    eventually(
        "the re-read events mark every post dirty",
        Duration::from_secs(20),
        || async { dirty_posts(&t.db).await == ["post-0", "post-1", "post-2"] },
    )
    .await;
    assert!(d.wait_role("active", Duration::from_secs(10)).await);
    t.wait_drained(Duration::from_secs(20)).await;
    // Nothing was counted twice, and what follows is counted once.
    assert!(t.mismatches(&[post(0), post(1), post(2)]).await.is_empty());
    t.insert_comment("after", &post(1), now_secs() - 3600).await;
    t.wait_exact(&[post(0), post(1), post(2)], Duration::from_secs(20))
        .await;
    assert_eq!(t.displayed(&post(1)).await, 4);
    let c = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert!(
        c.gaps.is_empty(),
        "no history lost on the same server: {c:?}"
    );
    assert!(c.deployment.is_some(), "the deployment is recorded: {c:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_waits_for_a_killed_workers_lease() {
    let t = TestDb::new("replaywait").await;
    let d = quiet_daemon(&t, "replaywait");
    let before = nine_rows(&t, &d).await;
    d.kill9();
    let from = rfc3339(before);
    let refused = counterd(&t.uri, &t.name, &["replay", "--from-time", &from]);
    assert_eq!(refused.status.code(), Some(1), "{}", output_text(&refused));
    assert!(
        output_text(&refused).contains("expires in") && output_text(&refused).contains("--wait"),
        "{}",
        output_text(&refused)
    );
    let started = Instant::now();
    let waited = counterd(&t.uri, &t.name, &["replay", "--from-time", &from, "--wait"]);
    assert!(waited.status.success(), "{}", output_text(&waited));
    assert!(
        output_text(&waited).contains("waiting") && output_text(&waited).contains("moved comments"),
        "{}",
        output_text(&waited)
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let c = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(c.start_time.map(|s| s.time as i64), Some(before));
    assert!(c.token.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_after_a_stop_with_a_batch_in_flight_resolves_it_first() {
    let t = TestDb::new("replayinflight").await;
    let d = quiet_daemon(&t, "inflight1");
    let before = nine_rows(&t, &d).await;
    assert_eq!(d.terminate(), Some(0));

    // A stop that left a batch in flight: a new comment's batch planned and its intent
    // recorded, none of its writes made (exactly what the worker records before writing).
    t.insert_comment("new", &post(2), now_secs() - 3600).await;
    let checkpoint = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    let mut source = t
        .store
        .open_stream(StreamOptions {
            start: StreamStart::After(checkpoint.token.clone().unwrap()),
            pre_images: false,
            pipeline: vec![],
            max_await: Duration::from_millis(100),
        })
        .await
        .unwrap();
    let event = loop {
        let batch = source
            .next_batch(100, Duration::from_millis(100))
            .await
            .unwrap();
        if let Some(e) = batch
            .events
            .iter()
            .filter_map(|d| ChangeEvent::parse(d).ok())
            .find(|e| {
                e.comment
                    .as_ref()
                    .is_some_and(|c| c.value.as_str() == Some("new"))
            })
        {
            break e;
        }
    };
    let (plan, _) = counterd::core::batch::plan_batch(
        std::slice::from_ref(&event),
        &counterd::core::event::LedgerView::default(),
        Attribution::Auto,
        &Schema::default(),
        60,
    );
    let batch = PendingBatch {
        end: event.token.clone(),
        end_time: event.cluster_time,
        counters: plan.counters,
        ledger: plan.ledger,
        dirty: plan.dirty,
        carry: None,
    };
    let fence = Fence {
        stream: "comments".into(),
        epoch: checkpoint.epoch,
    };
    t.store.record_intent(&fence, &batch, None).await.unwrap();
    assert_eq!(t.displayed(&post(2)).await, 3, "not applied yet");

    let from = rfc3339(before);
    let replay = counterd(&t.uri, &t.name, &["replay", "--from-time", &from]);
    assert!(replay.status.success(), "{}", output_text(&replay));
    assert!(
        output_text(&replay).contains("re-applied the batch left in flight"),
        "{}",
        output_text(&replay)
    );
    let c = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert!(c.pending.is_none(), "resolved: {c:?}");
    assert_eq!(c.start_time.map(|s| s.time as i64), Some(before), "{c:?}");
    assert!(c.token.is_none(), "{c:?}");
    assert_eq!(t.displayed(&post(2)).await, 4, "applied exactly once");

    // The restart resumes from the moved position, not at the batch's end: every earlier
    // event is re-read and marks its post dirty; none is counted again.
    clear_dirty(&t.db).await;
    let d = quiet_daemon(&t, "inflight2");
    eventually(
        "the restart re-reads from the moved position",
        Duration::from_secs(20),
        || async { dirty_posts(&t.db).await == ["post-0", "post-1", "post-2"] },
    )
    .await;
    t.wait_drained(Duration::from_secs(20)).await;
    assert!(t.mismatches(&[post(0), post(1), post(2)]).await.is_empty());
    t.insert_comment("later", &post(0), now_secs() - 3600).await;
    t.wait_exact(&[post(0), post(1), post(2)], Duration::from_secs(20))
        .await;
    assert_eq!(t.displayed(&post(0)).await, 4);
    drop(d);
}

/// A fresh server of the harness's kind, or `None` (with the reason printed) where the tests
/// cannot start one.
fn fresh_server(test: &str) -> Option<TestServer> {
    match support::server().kind {
        ServerKind::Fake => Some(TestServer::start_fake().expect("a fresh fake server")),
        ServerKind::Mongod => Some(TestServer::start().expect("a fresh mongod")),
        ServerKind::External => {
            support::skip(
                test,
                "COUNTERD_TEST_MONGODB_URI names one server; a fresh one to restore into cannot be started",
            );
            None
        }
    }
}

/// Copies every collection of `from` into `to` (a restore of a full backup).
async fn restore(from: &mongodb::Database, to: &mongodb::Database) {
    for name in from.list_collection_names().await.unwrap() {
        let docs: Vec<Document> = from
            .collection::<Document>(&name)
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        if !docs.is_empty() {
            to.collection::<Document>(&name)
                .insert_many(docs)
                .await
                .unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_on_a_fresh_server_is_lost_history() {
    let name = "a_backup_restored_on_a_fresh_server_is_lost_history";
    let t = TestDb::new("restored").await;
    let posts: Vec<GroupValue> = (0..5).map(post).collect();
    let d = Daemon::start(&t.uri, &t.name, "restored0", &[]);
    assert!(d.wait_role("active", Duration::from_secs(20)).await);
    for i in 0..30 {
        t.insert_comment(format!("r{i}"), &posts[i % 5], now_secs() - 3600)
            .await;
    }
    t.comments
        .update_one(
            doc! {"_id": "r0"},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await
        .unwrap();
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    t.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(d.terminate(), Some(0));

    let Some(fresh) = fresh_server(name) else {
        return;
    };
    let store = MongoStore::connect(&ConnectOptions {
        uri: fresh.uri.clone(),
        database: t.name.clone(),
        comments: "comments".into(),
        connect_timeout: Duration::from_secs(10),
        collections: counterd::store::mongo::Collections::default(),
        schema: Schema::default(),
    })
    .await
    .unwrap();
    restore(&t.db, store.database()).await;
    let exact = || async {
        for p in &posts {
            let (shown, truth) = counterd::store::displayed_and_truth(&store, p)
                .await
                .unwrap();
            if shown != truth {
                return false;
            }
        }
        true
    };
    assert!(exact().await, "the backup holds exact counters");

    // on_history_lost = fail: exits non-zero with advice; nothing was counted.
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut failing = Daemon::start_logged(
        &fresh.uri,
        &t.name,
        "restored-fail",
        // on_fatal = "exit": the old behaviour (the default parks: tests/parked.rs).
        &[
            ("COUNTERD_ON_HISTORY_LOST", "fail"),
            ("COUNTERD_ON_FATAL", "exit"),
        ],
        Some(log.path()),
    );
    assert_eq!(
        exit_within(&mut failing, Duration::from_secs(20)).await,
        Some(4),
        "{}",
        std::fs::read_to_string(log.path()).unwrap()
    );
    let said = std::fs::read_to_string(log.path()).unwrap();
    for advice in [
        "history lost",
        "on_history_lost = \"resweep\"",
        "counterd replay",
    ] {
        assert!(said.contains(advice), "{advice}: {said}");
    }
    assert!(exact().await, "nothing was counted from the old position");

    // on_history_lost = resweep: the gap is recorded, nothing restored is counted again, and
    // the sweep leaves every counter exact with the ledger rebuilt.
    let d = Daemon::start(
        &fresh.uri,
        &t.name,
        "restored-sweep",
        &[("COUNTERD_BUCKET_WIDTH", "1s")],
    );
    eventually("the gap is recorded", Duration::from_secs(20), || async {
        store
            .load_checkpoint("comments")
            .await
            .unwrap()
            .is_some_and(|c| !c.gaps.is_empty())
    })
    .await;
    assert!(metric(&d, "counterd_history_lost_total").await >= 1.0);
    eventually(
        "the sweep after the gap finishes",
        Duration::from_secs(30),
        || async {
            store
                .load_checkpoint("comments")
                .await
                .unwrap()
                .is_some_and(|c| !c.sweep_requested)
        },
    )
    .await;
    assert!(exact().await, "exact after the sweep");
    assert_eq!(
        metric(&d, "counterd_events_applied_total").await,
        0.0,
        "no restored row was counted as a new event"
    );
    let stale = store
        .database()
        .collection::<Document>("counterd_comment_state")
        .count_documents(doc! {"exists": true, "generation": {"$lt": 1_i64}})
        .await
        .unwrap();
    assert_eq!(stale, 0, "the sweep rebuilt the ledger");
    // Later changes of restored rows are counted exactly (a hard delete needs the ledger).
    let comments = store.database().collection::<Document>("comments");
    comments.delete_one(doc! {"_id": "r1"}).await.unwrap();
    comments
        .update_one(doc! {"_id": "r0"}, doc! {"$unset": {"deleted_at": ""}})
        .await
        .unwrap();
    eventually("later changes are counted", Duration::from_secs(20), exact).await;
    drop(d);
}

/// The `--from-time` the drop message tells the operator to replay from.
fn replay_time_in(log: &str) -> String {
    let at = log
        .find("counterd replay --from-time ")
        .unwrap_or_else(|| panic!("no replay advice in: {log}"));
    log[at + "counterd replay --from-time ".len()..]
        .split(|c: char| c.is_whitespace() || c == '`')
        .next()
        .unwrap()
        .to_string()
}

/// `run` stops on a condition no retry mends, with its exit code, instead of parking it.
const EXIT: (&str, &str) = ("COUNTERD_ON_FATAL", "exit");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_collection_stops_run_and_the_advice_recovers() {
    let t = TestDb::new("droprecover").await;
    let posts = [post(0), post(1), post(2)];
    let log = tempfile::NamedTempFile::new().unwrap();
    // on_fatal = "exit" (the default parks the stream instead: tests/parked.rs).
    let mut d = Daemon::start_logged(&t.uri, &t.name, "dropped", &[EXIT], Some(log.path()));
    nine_rows(&t, &d).await;
    assert_eq!(d.get("/readyz").await.map(|r| r.0), Some(200));

    t.comments.drop().await.unwrap();
    // Stops within seconds; /readyz never answers ready after the drop was read.
    let started = Instant::now();
    let code = loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            break status.code();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "run did not stop after the drop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(code, Some(4), "exit code 4: the stream ended");
    let said = std::fs::read_to_string(log.path()).unwrap();
    assert!(said.contains("`drop` event"), "{said}");
    let from = replay_time_in(&said);

    // A restart reads the drop again and stops again.
    let mut again = Daemon::start(&t.uri, &t.name, "dropped-again", &[EXIT]);
    assert_eq!(
        exit_within(&mut again, Duration::from_secs(20)).await,
        Some(4)
    );

    // The advice: restore the collection, replay from the time given, run, sweep once.
    t.insert_comment("back0", &post(0), now_secs() - 3600).await;
    t.insert_comment("back1", &post(0), now_secs() - 3600).await;
    t.insert_comment("back2", &post(1), now_secs() - 3600).await;
    // The fake server records the stream's closing `invalidate` as an event of its own, with no
    // time and up to seconds after the `drop` (MongoDB gives both the drop's time), so a run
    // replayed from just after the drop may stop once more, on it, even after it became ready:
    // the operator follows the same advice again, from just after now. MongoDB needs one round.
    let mut rounds = 1;
    let mut d = replay_until_ready(&t, &from, &mut rounds).await;
    t.insert_comment("new", &post(1), now_secs() - 3600).await;
    // A post whose recount found a change in flight (a loaded machine: the worker did not
    // catch up within catch_up_timeout) is left as it was by a one-shot sweep, which says so:
    // the operator runs it again.
    // On a loaded machine (the fake server slows down with everything else) that can take
    // several attempts; the property tested is that the advice recovers, not how fast.
    let sweeping = Instant::now();
    for attempt in 1.. {
        if let Some(status) = d.run.child.try_wait().unwrap() {
            d.assert_stopped_on_invalidate(status.code(), rounds);
            support::next_second().await;
            let now = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
            d = replay_until_ready(&t, &now, &mut rounds).await;
        }
        let sweep = counterd(&t.uri, &t.name, &["reconcile", "--sweep"]);
        assert!(sweep.status.success(), "{}", output_text(&sweep));
        if t.mismatches(&posts).await.is_empty() || sweeping.elapsed() > Duration::from_secs(90) {
            break;
        }
        eprintln!(
            "sweep attempt {attempt} left posts in flight: {}",
            output_text(&sweep)
        );
    }
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    assert_eq!(
        t.displayed(&post(2)).await,
        0,
        "its rows went away with the drop"
    );
    let verify = counterd(&t.uri, &t.name, &["verify"]);
    assert!(verify.status.success(), "{}", output_text(&verify));
    assert!(
        d.run.child.try_wait().unwrap().is_none(),
        "run keeps running"
    );
}

/// A `counterd run` with the file its standard error goes to.
struct LoggedRun {
    run: Daemon,
    log: tempfile::NamedTempFile,
}

impl LoggedRun {
    /// Asserts that a run stopped on the fake server's late `invalidate` (exit 4, said so), and
    /// that the operator has not had to follow the advice more than a few times.
    fn assert_stopped_on_invalidate(&self, code: Option<i32>, rounds: u32) {
        let said = std::fs::read_to_string(self.log.path()).unwrap();
        assert!(
            code == Some(4) && said.contains("`invalidate` event") && rounds < 4,
            "round {rounds}: run stopped with {code:?}: {said}"
        );
    }
}

/// The recovery advice after a drop: `replay --from-time FROM`, then `counterd run`, until a run
/// is ready (read the stream up to now). A run that stops on the fake's late `invalidate` first
/// is followed by the same advice from just after now; `rounds` counts the replays.
async fn replay_until_ready(t: &TestDb, from: &str, rounds: &mut u32) -> LoggedRun {
    let mut from = from.to_string();
    loop {
        let replay = counterd(&t.uri, &t.name, &["replay", "--from-time", &from]);
        assert!(replay.status.success(), "{}", output_text(&replay));
        let log = tempfile::NamedTempFile::new().unwrap();
        let run = Daemon::start_logged(&t.uri, &t.name, "dropped-back", &[EXIT], Some(log.path()));
        let mut d = LoggedRun { run, log };
        // Ready, not merely active: a run holds the lease before its stream reaches the
        // fake's late `invalidate`, and stops on it afterwards.
        let deadline = Instant::now() + Duration::from_secs(60);
        let stopped = loop {
            if let Some(status) = d.run.child.try_wait().unwrap() {
                break status.code();
            }
            if d.run.get("/readyz").await.map(|r| r.0) == Some(200) {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "run neither became ready nor stopped"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        d.assert_stopped_on_invalidate(stopped, *rounds);
        *rounds += 1;
        support::next_second().await;
        from = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
    }
}
