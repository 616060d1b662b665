//! The worked sequences of docs/operations.md, each run end to end against the test server with
//! the real binary: what an operator does, in the order the page says, and what each command
//! prints (the page's transcripts, compared after normalising; see `support/docs.rs`).
//!
//! - replay after an outage: the counters restored from an older backup; find a time the oplog
//!   still has, `verify` sees the damage, `replay --dry-run`, `replay --force` beside the running
//!   sidecar, the worker re-reads and the reconciler recounts, `verify` is clean;
//! - inspect the backlog: `dirty --limit`, `--by-version`, `--json`, then one round by hand;
//! - adopt an existing database and cut over: `doctor`, the initial snapshot, `verify`, `get`.
//!
//! Also the small command-line rules the pages state: conflicting `reconcile` flags, a plain
//! post id with one existing reading, `config --collections --json`, the demo's log file.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/docs.rs"]
mod docs;
mod support;
#[path = "support/transcripts.rs"]
mod transcripts;

use std::process::Command;
use std::time::Duration;

use counterd::core::key::GroupValue;
use counterd::store::prelude::*;
use mongodb::bson::{doc, Document};
use support::{eventually, now_secs, post, rfc3339, TestDb};
use transcripts::{dirty_posts, recount_index, settled, sidecar, OWNER};

/// The time of the oplog's first entry (what `rs.printReplicationInfo()` calls "oplog first
/// event time"), when the server keeps `local.oplog.rs`.
async fn oplog_first_entry(t: &TestDb) -> Option<i64> {
    let oplog =
        t.db.client()
            .database("local")
            .collection::<Document>("oplog.rs");
    let first = oplog
        .find_one(doc! {})
        .sort(doc! {"$natural": 1})
        .await
        .ok()??;
    first.get_timestamp("ts").ok().map(|ts| i64::from(ts.time))
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_after_an_outage() {
    let t = TestDb::new("seqreplay").await;
    recount_index(&t).await;
    support::next_second().await;
    // The sidecar: counterd run beside the app, recounting dirty posts every second. Its
    // background sweep (which would find the restored counters by itself within a pass, a day
    // by default, and here could fix one before `verify` looks) is off.
    let sidecar = sidecar(
        &t,
        &[
            ("COUNTERD_INITIAL_SNAPSHOT", "never"),
            ("COUNTERD_BACKGROUND_SWEEP_PASS", "0s"),
        ],
    )
    .await;
    let hour_ago = now_secs() - 3600;
    let posts = [post(1), post(2), post(3)];
    for i in 0..6 {
        t.insert_comment(format!("a{i}"), &posts[i % 3], hour_ago)
            .await;
    }
    settled(&t, &posts).await;
    eventually("the first recounts", Duration::from_secs(60), || async {
        dirty_posts(&t).await == 0
    })
    .await;
    // The backup of comment_counters is taken now; comments keep coming.
    support::next_second().await;
    let backup_at = now_secs();
    support::next_second().await;
    let counters = t.db.collection::<Document>("comment_counters");
    let saved: Vec<Document> = {
        use futures::TryStreamExt;
        counters
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    for i in 0..5 {
        t.insert_comment(format!("b{i}"), &posts[i % 2], hour_ago)
            .await;
    }
    settled(&t, &posts).await;
    eventually("the second recounts", Duration::from_secs(60), || async {
        dirty_posts(&t).await == 0
    })
    .await;
    // The outage: comment_counters restored from the backup (every counter as it was then).
    for doc in saved {
        counters
            .replace_one(doc! {"_id": doc.get("_id").unwrap().clone()}, doc)
            .await
            .unwrap();
    }
    assert!(
        !t.mismatches(&posts).await.is_empty(),
        "the restore put counters back"
    );

    // 1. Find the time: the backup's, minus a margin; after the oplog's first entry.
    let from = backup_at - 1;
    match oplog_first_entry(&t).await {
        Some(first) => assert!(
            first < from,
            "the oplog still holds {from} (first entry {first})"
        ),
        None => support::skip(
            "oplog_first_entry",
            "the server keeps no local.oplog.rs to read",
        ),
    }
    let mut session = docs::Session::new(&t.uri, &t.name);
    session
        .vars
        .push(("2026-12-06T05:55:00Z".into(), rfc3339(from)));
    // 2. verify sees the damage; 3. the dry run; 4. the replay, forced past the running sidecar.
    session.check_block("replay-verify-damage");
    session.check_block("replay-dry-run");
    session.check_block("replay-force");
    // 5. The sidecar's worker steps down, takes the stream again from the moved checkpoint and
    // marks what it re-reads dirty; its reconciler recounts.
    t.wait_exact(&posts, Duration::from_secs(60)).await;
    eventually(
        "the replayed posts recounted",
        Duration::from_secs(60),
        || async { dirty_posts(&t).await == 0 },
    )
    .await;
    t.wait_drained(Duration::from_secs(30)).await;
    assert!(
        sidecar.wait_role("active", Duration::from_secs(30)).await,
        "the sidecar's counterd is active again, without a restart"
    );
    // 6. verify.
    session.check_block("replay-verify-clean");
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_the_backlog() {
    let t = TestDb::new("seqbacklog").await;
    recount_index(&t).await;
    support::next_second().await;
    // No recount by itself for an hour: the backlog stays as the worker leaves it.
    let _d = sidecar(
        &t,
        &[
            ("COUNTERD_INITIAL_SNAPSHOT", "never"),
            ("COUNTERD_RECONCILE_INTERVAL", "1h"),
        ],
    )
    .await;
    let hour_ago = now_secs() - 3600;
    let posts = [post(1), post(2), post(3)];
    // One comment per batch: post-2 is touched three times, post-1 twice, post-3 once.
    for (n, p) in [1, 2, 2, 3, 2, 1].into_iter().enumerate() {
        t.insert_comment(format!("c{n}"), &post(p), hour_ago).await;
        settled(&t, &posts).await;
    }
    assert_eq!(dirty_posts(&t).await, 3);
    let mut session = docs::Session::new(&t.uri, &t.name);
    session.check_block("backlog-oldest");
    session.check_block("backlog-by-version");
    session.check_block("backlog-json");
    session.check_block("backlog-drain");
    assert_eq!(
        dirty_posts(&t).await,
        0,
        "one round folded the settled posts"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn adopt_an_existing_database_and_cut_over() {
    let t = TestDb::new("seqadopt").await;
    // The application's data before counterd: comments, and its own counters. Their creation
    // times fall in one minute an hour ago (one bucket of `get`'s output whatever the time).
    let hour_ago = now_secs() / 60 * 60 - 3600 + 30;
    let rows: Vec<Document> = (0..30)
        .map(|i| {
            doc! {"_id": format!("old{i}"), "post_id": format!("post-{}", i % 4),
            "created_at": mongodb::bson::DateTime::from_millis((hour_ago - i) * 1000), "body": "hi"}
        })
        .collect();
    t.comments.insert_many(rows).await.unwrap();
    let app_counters = t.db.collection::<Document>("post_stats");
    for p in 0..4 {
        let n = (0..30).filter(|i| i % 4 == p).count() as i64;
        app_counters
            .insert_one(doc! {"_id": format!("post-{p}"), "comments": n})
            .await
            .unwrap();
    }
    recount_index(&t).await;
    let mut session = docs::Session::new(&t.uri, &t.name);
    session.check_block("adopt-doctor");
    support::next_second().await;
    let _d = sidecar(
        &t,
        &[
            ("COUNTERD_RECONCILE_INTERVAL", "1h"),
            ("COUNTERD_SNAPSHOT_CHUNK_ROWS", "10"),
        ],
    )
    .await;
    // The initial snapshot counts the 30 rows, in chunks between the worker's batches.
    eventually("the initial snapshot", Duration::from_secs(60), || async {
        t.store
            .load_checkpoint("comments")
            .await
            .unwrap()
            .is_some_and(|c| c.snapshot.is_some() && !c.snapshot_running())
    })
    .await;
    // The application goes on writing: one new comment, counted by the stream.
    t.insert_comment("new1", &post(0), hour_ago).await;
    let all: Vec<GroupValue> = (0..4).map(post).collect();
    settled(&t, &all).await;
    session.check_block("adopt-snapshot-done");
    session.check_block("adopt-verify");
    session.check_block("adopt-compare");
    // The app's own counter for post-2 agrees with counterd's.
    let app = app_counters
        .find_one(doc! {"_id": "post-2"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        app.get_i64("comments").unwrap(),
        t.displayed(&post(2)).await
    );
}

/// The parked state, as the runbook's recovery goes: the checkpoint belongs to another
/// deployment (a backup restored elsewhere) and `on_history_lost = "fail"`: the stream parks,
/// the process stays up, `status` says why; `replay` (no `--force`) moves the checkpoint and the
/// stream resumes without a restart.
#[tokio::test(flavor = "multi_thread")]
async fn a_parked_stream_and_its_recovery() {
    let t = TestDb::new("seqparked").await;
    recount_index(&t).await;
    support::next_second().await;
    let env = [
        ("COUNTERD_INITIAL_SNAPSHOT", "never"),
        ("COUNTERD_RECONCILE_INTERVAL", "1h"),
    ];
    let d = sidecar(&t, &env).await;
    let hour_ago = now_secs() - 3600;
    let posts = [post(1), post(2)];
    for i in 0..4 {
        t.insert_comment(format!("a{i}"), &posts[i % 2], hour_ago)
            .await;
    }
    settled(&t, &posts).await;
    assert_eq!(d.terminate(), Some(0));
    // The checkpoint now belongs to another deployment: its position means nothing here.
    let checkpoints = t.db.collection::<Document>("counterd_checkpoints");
    checkpoints
        .update_one(
            doc! {"_id": "comments"},
            doc! {"$set": {"deployment.id": "0000feedface", "deployment.process.pid": -1_i64}},
        )
        .await
        .unwrap();
    let mut fail = env.to_vec();
    fail.push(("COUNTERD_ON_HISTORY_LOST", "fail"));
    let d = daemon::Daemon::start(&t.uri, &t.name, OWNER, &fail);
    eventually("the stream parks", Duration::from_secs(60), || async {
        matches!(d.get("/readyz").await, Some((503, body)) if body.starts_with("parked: comments (history_lost)"))
    })
    .await;
    assert_eq!(d.get("/healthz").await.map(|(code, _)| code), Some(200));
    let mut session = docs::Session::new(&t.uri, &t.name);
    session.check_block("parked-status");
    // Comments written meanwhile are counted once the stream resumes from the replayed time.
    support::next_second().await;
    let from = now_secs();
    t.insert_comment("b0", &posts[0], hour_ago).await;
    session
        .vars
        .push(("2026-12-06T07:30:00Z".into(), rfc3339(from)));
    session.check_block("parked-replay");
    eventually("the stream resumes", Duration::from_secs(60), || async {
        matches!(d.get("/readyz").await, Some((200, _)))
    })
    .await;
    t.wait_exact(&posts, Duration::from_secs(60)).await;
    t.wait_drained(Duration::from_secs(30)).await;
    session.check_block("parked-resumed");
}

fn counterd(t: &TestDb, args: &[&str]) -> std::process::Output {
    t.counterd()
        .args(args)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .output()
        .expect("run counterd")
}

#[test]
fn conflicting_reconcile_flags_are_refused() {
    for args in [
        &["reconcile", "--once", "--sweep"][..],
        &["reconcile", "--once", "--post", "p"],
        &["reconcile", "--post", "p", "--sweep"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
            .args(args)
            .env("COUNTERD_MONGODB_URI", "mongodb://127.0.0.1:1/")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("cannot be used with"),
            "{args:?}"
        );
    }
}

/// `get 123` where the rows hold the string "123" reads that post (not an empty integer one).
#[tokio::test]
async fn a_plain_id_is_the_post_that_exists() {
    let t = TestDb::new("seqplainid").await;
    t.insert_comment("c1", &GroupValue::Str("123".into()), now_secs() - 3600)
        .await;
    // No counter yet (no worker ran): `get` says it differs from the truth (exit 1).
    let o = counterd(&t, &["get", "123", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["true_count"], 1, "{v}");
    let o = counterd(&t, &["get", "int:123", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["true_count"], 0, "{v}");
}

#[test]
fn config_collections_names_every_source_and_definition() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        r#"
database = "app"
[[counters]]
name = "approved"
group_field = "post_id"
condition = { approved = true }
collection = "approved_comment_counters"

[[sources]]
name = "likes"
collection = "likes"
group_field = "post_id"
counters_collection = "like_counters"
"#,
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args([
            "--config",
            file.to_str().unwrap(),
            "config",
            "--collections",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = v["collections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for wanted in [
        "comment_counters",
        "approved_comment_counters",
        "counterd_dirty_approved",
        "counterd_comment_state",
        "like_counters",
        "counterd_likes_comment_state",
        "counterd_likes_checkpoints",
    ] {
        assert!(names.contains(&wanted), "{wanted} in {names:?}");
    }
}

/// The demo's live view owns the screen: counterd's log lines go to the file it names.
#[test]
fn the_demo_logs_to_the_file_it_names() {
    let server = support::server();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("demo.log");
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args([
            "demo",
            "--duration",
            "3s",
            "--posts",
            "10",
            "--seed-comments",
            "40",
            "--rate",
            "40",
            "--drift-every",
            "1s",
            "--log-file",
            log.to_str().unwrap(),
        ])
        .env("COUNTERD_TEST_MONGODB_URI", &server.uri)
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(
        out.contains(&format!("counterd's log: {}", log.display())),
        "the demo names its log file: {out}"
    );
    // Issue 42: the average rating beside the counts, two numbers of one document, converged.
    assert!(
        out.contains("average `rating` = sum / `rating_rows`"),
        "the demo shows the average rating: {out}"
    );
    let averages = out
        .lines()
        .filter(|l| l.trim_start().starts_with("post-") && l.contains(" / ") && l.contains(" = "))
        .count();
    assert!(
        averages > 0,
        "an average per post (sum / rows = avg): {out}"
    );
    assert!(
        out.contains("definitions (default, approved, rating, rating_rows) equal the truth"),
        "every definition converged, the sum and its rows included: {out}"
    );
    for text in [&out, &err] {
        assert!(
            !text.contains(" INFO ") && !text.contains(" WARN "),
            "log lines on the screen: {text}"
        );
    }
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(
        written.contains("INFO"),
        "the log went to the file: {written}"
    );
}
