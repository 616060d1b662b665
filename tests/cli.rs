//! Every subcommand driven through the real binary against the test database, text and JSON.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use counterd::event::PostId;
use counterd::store::Store;
use mongodb::bson::doc;
use support::{now_secs, TestDb};

fn counterd(t: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(args)
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env("COUNTERD_SETTLE_TIME", "5s")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .expect("run counterd")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "failed: {}\n{}",
        stdout(o),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(o)))
}

fn post(i: usize) -> PostId {
    PostId::Str(format!("post-{i}"))
}

/// Three posts with settled rows applied by a worker; returns the test database.
async fn populated(name: &str) -> TestDb {
    let t = TestDb::new(name).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..9 {
        t.insert_comment(format!("c{i}"), &post(i % 3), now_secs() - 3600)
            .await;
    }
    t.wait_exact(&[post(0), post(1), post(2)], Duration::from_secs(20))
        .await;
    worker.shutdown().await.unwrap();
    t
}

#[tokio::test]
async fn status_dirty_get_and_verify() {
    let t = populated("cliread").await;
    let status = counterd(&t, &["status"]);
    let text = stdout(&status);
    assert!(status.status.success(), "{text}");
    assert!(
        text.contains("checkpoint token") && text.contains("dirty backlog     3 posts"),
        "{text}"
    );
    let s = json(&counterd(&t, &["status", "--json"]));
    assert_eq!(s["dirty"]["size"], 3);
    assert!(s["streams"][0]["checkpoint_token"]
        .as_str()
        .is_some_and(|t| !t.is_empty()));

    let d = json(&counterd(&t, &["dirty", "--json", "--limit", "2"]));
    assert_eq!(d["size"], 3);
    assert_eq!(d["entries"].as_array().unwrap().len(), 2);
    let text = stdout(&counterd(&t, &["dirty", "--by-version"]));
    assert!(
        text.contains("3 dirty posts") && text.contains("post-"),
        "{text}"
    );

    let g = json(&counterd(&t, &["get", "post-1", "--json"]));
    assert_eq!(
        (g["displayed"].as_i64(), g["true_count"].as_i64()),
        (Some(3), Some(3))
    );
    let text = stdout(&counterd(&t, &["get", "post-1"]));
    assert!(
        text.contains("displayed       3") && text.contains("true count      3"),
        "{text}"
    );

    let ok = counterd(&t, &["verify", "--json"]);
    assert_eq!(json(&ok)["mismatches"].as_array().unwrap().len(), 0);
    // Knock one counter off: verify must notice and exit non-zero.
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(doc! {"_id": "post-2"}, doc! {"$inc": {"live_delta": 5}})
        .await
        .unwrap();
    let bad = counterd(&t, &["verify"]);
    assert_eq!(bad.status.code(), Some(1), "{}", stdout(&bad));
    assert!(
        stdout(&bad).contains("post-2: displayed 8, true 3"),
        "{}",
        stdout(&bad)
    );
}

#[tokio::test]
async fn reconcile_once_post_and_sweep() {
    let t = populated("clirec").await;
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    counters
        .update_one(doc! {"_id": "post-0"}, doc! {"$inc": {"live_delta": 2}})
        .await
        .unwrap();
    let r = json(&counterd(&t, &["reconcile", "--once", "--json"]));
    assert_eq!(r["summary"]["corrected"], 1);
    assert_eq!(r["corrections"][0]["post"], "post-0");
    assert_eq!(
        (
            r["corrections"][0]["wrong"].as_i64(),
            r["corrections"][0]["right"].as_i64()
        ),
        (Some(5), Some(3))
    );
    assert_eq!(r["corrections"][0]["drift"], 2);

    counters
        .update_one(doc! {"_id": "post-1"}, doc! {"$inc": {"base_count": -1}})
        .await
        .unwrap();
    let text = stdout(&counterd(
        &t,
        &["reconcile", "--post", "post-1", "--verbose"],
    ));
    assert!(text.contains("post-1: was 2, now 3 (drift -1)"), "{text}");

    // Not dirty, but drifted: only a sweep finds it.
    counters
        .update_one(doc! {"_id": "post-2"}, doc! {"$inc": {"live_delta": 1}})
        .await
        .unwrap();
    let once = json(&counterd(&t, &["reconcile", "--json"]));
    assert_eq!(once["summary"]["posts"], 0, "nothing is dirty");
    let sweep = json(&counterd(&t, &["reconcile", "--sweep", "--json"]));
    assert_eq!(sweep["summary"]["kind"], "sweep");
    assert_eq!(sweep["summary"]["posts"], 3);
    assert_eq!(sweep["summary"]["corrected"], 1);
    assert_eq!(t.displayed(&post(2)).await, 3);
}

#[tokio::test]
async fn replay_dry_run_refusal_and_move() {
    let t = populated("clireplay").await;
    let before = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    let dry = json(&counterd(
        &t,
        &[
            "replay",
            "--from-time",
            "2000-01-01T00:00:00Z",
            "--dry-run",
            "--json",
        ],
    ));
    assert!(
        dry["events_already_applied"].as_u64().unwrap() >= 9,
        "{dry}"
    );
    assert_eq!(dry["events_not_yet_applied"], 0);
    let after = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(before.token, after.token, "a dry run changes nothing");

    // While a worker holds the lease, replay refuses unless forced.
    t.store
        .acquire_lease(
            "comments",
            "someone-else",
            Duration::from_secs(60),
            mongodb::bson::DateTime::now(),
        )
        .await
        .unwrap()
        .expect("lease");
    let refused = counterd(&t, &["replay", "--from-time", "2000-01-01T00:00:00Z"]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("holds stream `comments`"));
    let forced = counterd(&t, &["replay", "--from-token", "00", "--force"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    let moved = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(moved.token.unwrap().0, "00");
    assert_eq!(moved.high_water, before.high_water, "the high water stays");
    let bad = counterd(&t, &["replay", "--from-token", "not-hex", "--force"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--from-token"));
}

#[tokio::test]
async fn bad_config_file_and_env_exit_2_with_a_clear_error() {
    let t = TestDb::new("cliconfig").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "batch_size = \"many\"\n").unwrap();
    let o = counterd(&t, &["--config", path.to_str().unwrap(), "status"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("batch_size") && err.contains("bad.toml"),
        "{err}"
    );

    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .arg("status")
        .env("COUNTERD_RECONCILE_JITTER", "3")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("reconcile_jitter") && err.contains("0.0 to 1.0"),
        "{err}"
    );

    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["--set", "no_such_setting=1", "status"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown setting `no_such_setting`"));
}

#[test]
fn every_subcommand_explains_itself() {
    for sub in [
        "run",
        "status",
        "dirty",
        "reconcile",
        "replay",
        "get",
        "verify",
        "demo",
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
            .args([sub, "--help"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{sub} --help");
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            text.lines().count() >= 5 && text.contains("Usage: counterd"),
            "{sub}: {text}"
        );
    }
}

#[tokio::test]
async fn status_never_shows_the_password() {
    let t = TestDb::new("clisecret").await;
    let uri = t.uri.replace("mongodb://", "mongodb://alice:hunter2@");
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["status", "--json"])
        .env("COUNTERD_MONGODB_URI", &uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env("COUNTERD_CONNECT_TIMEOUT", "3s")
        .output()
        .unwrap();
    let all = format!("{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(!all.contains("hunter2"), "{all}");
}
