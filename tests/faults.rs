//! Process-level faults against the test database: `kill -9` in a loop while writers run, the
//! server paused and resumed, corrupt checkpoints, history lost; plus the HTTP endpoints.

mod support;

#[path = "support/daemon.rs"]
mod daemon;

use std::sync::Arc;
use std::time::Duration;

use counterd::core::key::GroupValue;
use counterd::store::prelude::*;
use counterd_testdb::{ServerKind, TestServer};
use daemon::Daemon;
use mongodb::bson::{doc, DateTime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{now_secs, post, TestDb};

/// Random inserts, soft deletes, undeletes and deletes until `stop`.
async fn write_until(
    t: Arc<TestDb>,
    posts: usize,
    stop: tokio::sync::watch::Receiver<bool>,
    seed: u64,
) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !*stop.borrow() {
        let id = format!("s{seed}-{}", rng.random_range(0..(n + 1).max(1)));
        let p = post(rng.random_range(0..posts));
        let _ = match rng.random_range(0..10) {
            0..=4 => t
                .comments
                .insert_one(doc! {"_id": format!("s{seed}-{n}"), "post_id": p.to_bson(), "created_at": DateTime::from_millis((now_secs() - rng.random_range(0..300)) * 1000)})
                .await
                .map(|_| ()),
            5..=6 => t.comments.update_one(doc! {"_id": &id}, doc! {"$set": {"deleted_at": DateTime::now()}}).await.map(|_| ()),
            7 => t.comments.update_one(doc! {"_id": &id}, doc! {"$unset": {"deleted_at": ""}}).await.map(|_| ()),
            8 => t.comments.update_one(doc! {"_id": &id}, doc! {"$set": {"post_id": p.to_bson()}}).await.map(|_| ()),
            _ => t.comments.delete_one(doc! {"_id": &id}).await.map(|_| ()),
        };
        n += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_dash_nine_in_a_loop_leaves_every_counter_exact() {
    let t = Arc::new(TestDb::new("kill9").await);
    let iterations: usize = std::env::var("COUNTERD_KILL_ITERATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let posts: Vec<GroupValue> = (0..8).map(post).collect();
    // No reconcile during the test: the worker alone must be exact (ledger attribution).
    let quiet: &[(&str, &str)] = &[("COUNTERD_RECONCILE_INTERVAL", "1h")];
    let first = Daemon::start(&t.uri, &t.name, "killed", quiet);
    assert!(
        first.wait_role("active", Duration::from_secs(20)).await,
        "counterd became active"
    );
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let writers: Vec<_> = (0..2)
        .map(|w| tokio::spawn(write_until(t.clone(), posts.len(), stop_rx.clone(), w)))
        .collect();
    let mut rng = StdRng::seed_from_u64(99);
    let mut daemon = first;
    for _ in 0..iterations {
        tokio::time::sleep(Duration::from_millis(rng.random_range(100..900))).await;
        daemon.kill9();
        daemon = Daemon::start(&t.uri, &t.name, "killed", quiet);
    }
    let _ = stop.send(true);
    let mut events = 0;
    for w in writers {
        events += w.await.unwrap();
    }
    eprintln!("{iterations} kill -9 restarts during {events} writes");
    assert!(daemon.wait_role("active", Duration::from_secs(20)).await);
    t.wait_exact(&posts, Duration::from_secs(60)).await;
    assert_eq!(daemon.terminate(), Some(0), "SIGTERM exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_makes_readyz_unready_and_the_worker_recovers_by_itself() {
    // Its own server: pausing the shared one would stall the other tests of this binary.
    if std::env::var("COUNTERD_TEST_MONGODB_URI").is_ok() {
        support::skip(
            "paused server",
            "an external server cannot be paused from here",
        );
        return;
    }
    let server = TestServer::start_fake().expect("own fake server");
    assert_eq!(server.kind, ServerKind::Fake);
    let name = "paused";
    // A long operation timeout and lease: what turns /readyz unready here is the stall bound
    // alone (no answered read for ready_max_stall), seen at scrape time.
    let stall_bound = 3;
    let d = Daemon::start(
        &server.uri,
        name,
        "pausable",
        &[
            ("COUNTERD_READY_MAX_STALL", "3s"),
            ("COUNTERD_OPERATION_TIMEOUT", "60s"),
            ("COUNTERD_LEASE_TTL", "60s"),
            ("COUNTERD_LEASE_RENEW", "1s"),
        ],
    );
    assert!(d.wait_role("active", Duration::from_secs(20)).await);
    let client = mongodb::Client::with_uri_str(&server.uri).await.unwrap();
    let comments = client
        .database(name)
        .collection::<mongodb::bson::Document>("comments");
    for i in 0..20 {
        comments
            .insert_one(doc! {"_id": i, "post_id": "p", "created_at": DateTime::now()})
            .await
            .unwrap();
    }
    // /metrics carries the documented names with plausible values.
    // A reconcile run has happened too (interval 1s): every documented series is there, except
    // those that appear on their first observation (a correction, a retry, a full sweep).
    let metrics = {
        let _ = wait_metric(&d, "counterd_reconcile_runs_total", 1.0).await;
        wait_metric(&d, "counterd_events_applied_total", 20.0).await
    };
    for name in counterd::telemetry::ALL {
        if counterd::telemetry::ON_FIRST_USE.contains(&name) {
            continue;
        }
        assert!(
            metrics.lines().any(|l| l.starts_with(name)),
            "{name} missing from /metrics:\n{metrics}"
        );
    }
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(value("counterd_worker_active"), 1.0);
    assert!(value("counterd_batches_total") >= 1.0);
    assert!(value("counterd_increments_total") >= 1.0);
    assert!(value("counterd_stream_lag_seconds") < 60.0, "plausible lag");
    assert!(value("counterd_stream_stall_seconds") < stall_bound as f64);
    assert!(value("counterd_last_event_applied_timestamp_seconds") > 1.0e9);
    assert!(value("counterd_build_info") == 1.0 && value("process_resident_memory_bytes") > 0.0);
    assert_eq!(d.get("/healthz").await.map(|r| r.0), Some(200));

    let pid = server.pid().expect("we started it");
    let signal = |s: &str| {
        std::process::Command::new("kill")
            .args([s, &pid.to_string()])
            .status()
            .unwrap()
    };
    signal("-STOP");
    let paused = std::time::Instant::now();
    let mut unready = None;
    while paused.elapsed() < Duration::from_secs(20) {
        if let Some((503, body)) = d.get("/readyz").await {
            unready = Some((paused.elapsed(), body));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Nothing is written while the server is paused: the ages grow at scrape time.
    let stalled = d.get("/metrics").await.map(|r| r.1).unwrap_or_default();
    signal("-CONT");
    let (after, body) = unready.expect("/readyz went unready while the server was paused");
    eprintln!("/readyz unready {after:?} after the pause: {body}");
    assert!(
        body.contains("no progress for"),
        "unready because of the stall: {body}"
    );
    assert!(
        after < Duration::from_secs(stall_bound + 3),
        "unready within the bound ({stall_bound}s) plus a scrape: {after:?}"
    );
    let stalled_value = |name: &str| -> f64 {
        stalled
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        stalled_value("counterd_stream_stall_seconds") > stall_bound as f64,
        "the stall shows in /metrics:\n{stalled}"
    );
    assert!(
        stalled_value("counterd_stream_lag_seconds") >= stall_bound as f64
            && stalled_value("counterd_checkpoint_age_seconds") >= stall_bound as f64,
        "lag and checkpoint age grow while nothing is written:\n{stalled}"
    );
    // Back: the worker recovers without help and applies what comes next.
    comments
        .insert_one(doc! {"_id": 100, "post_id": "p", "created_at": DateTime::now()})
        .await
        .unwrap();
    assert!(
        d.wait_role("active", Duration::from_secs(30)).await,
        "ready again"
    );
    let counters = client
        .database(name)
        .collection::<mongodb::bson::Document>("comment_counters");
    let mut shown = 0;
    for _ in 0..100 {
        let c = counters
            .find_one(doc! {"_id": "p"})
            .await
            .unwrap()
            .unwrap_or_default();
        shown = c.get_i64("base_count").unwrap_or(0) + c.get_i64("live_delta").unwrap_or(0);
        if shown == 21 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(shown, 21);
    // Progress again: the stall is back under the bound.
    let metrics = wait_metric(&d, "counterd_events_applied_total", 21.0).await;
    assert!(
        metrics
            .lines()
            .filter(|l| l.starts_with("counterd_stream_stall_seconds"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .all(|v| v < stall_bound as f64),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_scrape_passes_promtool_check_metrics() {
    let Ok(promtool) = which_promtool() else {
        // .ci/run installs promtool: in CI a missing one is a failure, not a skip.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but promtool is not on PATH (.ci/run installs Debian's `prometheus`)"
        );
        support::skip(
            "a_live_scrape_passes_promtool_check_metrics",
            "promtool is not installed (Debian package `prometheus`; .ci/run installs it)",
        );
        return;
    };
    let t = TestDb::new("promtool").await;
    let d = Daemon::start(&t.uri, &t.name, "scraped", &[]);
    assert!(d.wait_role("active", Duration::from_secs(20)).await);
    for i in 0..10 {
        t.insert_comment(format!("p{i}"), &post(i % 3), now_secs() - 120)
            .await;
    }
    // A reconcile run and a correction, so the histograms and every labelled family show up.
    let _ = wait_metric(&d, "counterd_events_applied_total", 10.0).await;
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(doc! {"_id": "post-0"}, doc! {"$inc": {"base_count": 2_i64}})
        .await
        .unwrap();
    t.comments
        .update_one(
            doc! {"_id": "p0"},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await
        .unwrap();
    let scrape = wait_metric(&d, "counterd_reconcile_runs_total", 3.0).await;
    let mut child = std::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run promtool");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(scrape.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n--- scrape ---\n{scrape}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for family in [
        "counterd_stream_lag_seconds{stream=\"comments\"}",
        "counterd_build_info{",
        "process_cpu_seconds_total",
        "counterd_mongodb_operation_duration_seconds_bucket{",
        "counterd_definition_info{",
    ] {
        assert!(scrape.contains(family), "{family} in the scrape:\n{scrape}");
    }
    // What each counter's numbers are, for the dashboard's sums: the default is a count.
    let info = scrape
        .lines()
        .find(|l| l.starts_with("counterd_definition_info{"))
        .unwrap();
    assert!(
        info.contains("counter=\"default\"")
            && info.contains("kind=\"count\"")
            && info.ends_with(" 1"),
        "{info}"
    );
}

fn which_promtool() -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|p| p.join("promtool"))
                .find(|p| p.is_file())
        })
        .ok_or(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_comments_collection_stops_run_with_exit_code_4_under_on_fatal_exit() {
    let t = TestDb::new("dropped").await;
    // on_fatal = "exit" keeps the exit codes for a supervisor that wants them (the default
    // parks the stream instead: tests/parked.rs).
    let mut d = Daemon::start(&t.uri, &t.name, "dropped", &[("COUNTERD_ON_FATAL", "exit")]);
    assert!(d.wait_role("active", Duration::from_secs(20)).await);
    t.insert_comment("d0", &post(0), now_secs()).await;
    t.comments.drop().await.unwrap();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "counterd run did not stop after the collection was dropped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status.code(), Some(4), "the stream ended: exit code 4");
}

async fn wait_metric(d: &Daemon, name: &str, at_least: f64) -> String {
    for _ in 0..100 {
        if let Some((200, body)) = d.get("/metrics").await {
            let value = body
                .lines()
                .filter(|l| l.starts_with(name))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>();
            if value >= at_least {
                return body;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never reached {at_least}");
}

#[tokio::test]
async fn a_corrupt_checkpoint_is_a_clear_startup_error() {
    let t = TestDb::new("corrupt").await;
    let checkpoints =
        t.db.collection::<mongodb::bson::Document>("counterd_checkpoints");
    checkpoints
        .insert_one(doc! {"_id": "comments", "token": 42, "epoch": 0_i64})
        .await
        .unwrap();
    let worker = t.spawn_worker(t.worker_settings()).await;
    let result = tokio::time::timeout(Duration::from_secs(10), worker.handle)
        .await
        .unwrap()
        .unwrap();
    let err = result.unwrap_err();
    assert!(
        err.contains("malformed checkpoint") && err.contains("`token`") && err.contains("replay"),
        "{err}"
    );
    // Deleted instead: the worker starts from now (documented), and counts what follows.
    checkpoints
        .delete_one(doc! {"_id": "comments"})
        .await
        .unwrap();
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.insert_comment("x", &post(0), now_secs()).await;
    t.wait_exact(&[post(0)], Duration::from_secs(20)).await;
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn history_lost_follows_the_policy() {
    let t = TestDb::new("historylost").await;
    if !t.abilities.hello {
        support::skip(
            "history_lost_follows_the_policy",
            "the fake server's oplog never shrinks and accepts any token, so it cannot report ChangeStreamHistoryLost (286); the policy is covered by the simulation against the in-process store",
        );
        return;
    }
    // A real server: a token from far before the oplog window.
    let checkpoints =
        t.db.collection::<mongodb::bson::Document>("counterd_checkpoints");
    checkpoints
        .insert_one(doc! {"_id": "comments", "token": "8200000001000000012B022C0100296E5A1004", "epoch": 0_i64})
        .await
        .unwrap();
    let mut settings = t.worker_settings();
    settings.on_history_lost = counterd::config::OnHistoryLost::Fail;
    let worker = t.spawn_worker(settings).await;
    let err = tokio::time::timeout(Duration::from_secs(20), worker.handle)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(
        err.contains("history lost") || err.contains("resume"),
        "{err}"
    );
    let worker = t.spawn_worker(t.worker_settings()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let c = t.store.load_checkpoint("comments").await.unwrap();
        if c.as_ref()
            .is_some_and(|c| c.sweep_requested && !c.gaps.is_empty())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "resweep records the gap: {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn unreachable_server_keeps_readyz_unready_and_run_keeps_retrying() {
    let port = counterd_testdb::free_port();
    let d = Daemon::start(
        &format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        "x",
        "lonely",
        &[],
    );
    let mut seen = None;
    for _ in 0..50 {
        if let Some(reply) = d.get("/readyz").await {
            seen = Some(reply);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (code, body) = seen.expect("the HTTP endpoint answers while MongoDB is down");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("not connected"), "{body}");
    assert_eq!(
        d.get("/healthz").await.map(|r| r.0),
        Some(200),
        "alive all the same"
    );
    assert_eq!(d.terminate(), Some(0), "SIGTERM while retrying exits 0");
}
