//! Every subcommand driven through the real binary against the test database, text and JSON.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use counterd::store::prelude::*;
use mongodb::bson::doc;
use support::{now_secs, post, TestDb};

fn counterd(t: &TestDb, args: &[&str]) -> Output {
    t.counterd()
        .args(args)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env("COUNTERD_SETTLE_TIME", "5s")
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

/// Three posts with settled rows applied by a worker; returns the test database.
async fn populated(name: &str) -> TestDb {
    let t = TestDb::new(name).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    for i in 0..9 {
        t.insert_comment(format!("c{i}"), &post(i % 3), now_secs() - 3600)
            .await;
    }
    t.wait_exact(&[post(0), post(1), post(2)], Duration::from_secs(20))
        .await;
    t.wait_drained(Duration::from_secs(20)).await;
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
        .update_one(
            doc! {"_id": "post-2"},
            doc! {"$inc": {"live_delta": 5, "count": 5}},
        )
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

/// Before any `counterd run`, the first run's initial snapshot counts every post: a recount by
/// hand would be counted again by its claims, so `reconcile` refuses (exit 5: not yet) and
/// says why, and writes no counter.
#[tokio::test]
async fn reconcile_before_the_first_run_refuses_and_counts_nothing() {
    let t = TestDb::new("clifresh").await;
    t.insert_comment("c0", &post(0), now_secs() - 3600).await;
    for args in [
        &["reconcile", "--post", "post-0"][..],
        &["reconcile", "--once"],
        &["reconcile", "--sweep"],
    ] {
        let o = counterd(&t, args);
        assert_eq!(o.status.code(), Some(5), "{args:?}: {}", stdout(&o));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains("has not started on stream 'comments' yet"),
            "{args:?}: {stderr}"
        );
    }
    assert_eq!(t.store.read_counter(&post(0)).await.unwrap(), None);
    // With the snapshot off, the same recount is the only way the post gets counted.
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["reconcile", "--post", "post-0"])
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env("COUNTERD_INITIAL_SNAPSHOT", "never")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(t.displayed(&post(0)).await, 1);
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
    // An older token of this stream: its first event's.
    let mut source = t
        .store
        .open_stream(counterd::store::StreamOptions {
            start: counterd::store::StreamStart::AtTime(mongodb::bson::Timestamp {
                time: 1,
                increment: 0,
            }),
            pre_images: false,
            pipeline: vec![],
            max_await: Duration::from_millis(100),
        })
        .await
        .unwrap();
    let first = source
        .next_batch(1, Duration::from_millis(100))
        .await
        .unwrap()
        .events
        .remove(0);
    let older = first.unwrap().token.0;
    assert!(older < before.token.clone().unwrap().0);
    let forced = counterd(&t, &["replay", "--from-token", &older, "--force"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    assert!(stdout(&forced).contains("fenced out worker someone-else"));
    let moved = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(moved.token.unwrap().0, older);
    assert_eq!(moved.high_water, before.high_water, "the high water stays");
    let lease = t.store.read_lease("comments").await.unwrap().unwrap();
    assert!(
        lease.expires_at <= mongodb::bson::DateTime::now(),
        "replay gave the lease back: {lease:?}"
    );
    // A token's shape is checked (usage error, exit 2): hex, whole bytes, this stream's format.
    let other_format = if older.len() == 16 {
        "82695B6F99000000012B042C0100296E5A1004"
    } else {
        "6b11572600000001"
    };
    for bad in ["not-hex", "00", other_format] {
        let o = counterd(&t, &["replay", "--from-token", bad, "--force"]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--from-token"));
    }
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

/// A memory budget too small to hold one event beside each stream's server reply would leave a
/// worker waiting for room that never frees: `run` refuses it at start, naming the setting.
#[test]
fn a_memory_budget_too_small_for_one_event_is_refused_at_start_with_exit_2() {
    let least = counterd::core::cost::min_budget(1);
    for (budget, partitions) in [(100_000, 1), (least - 1, 1), (least, 4)] {
        let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
            .arg("run")
            .env("COUNTERD_MEMORY_BUDGET", budget.to_string())
            .env("COUNTERD_PARTITIONS", partitions.to_string())
            .env_remove("COUNTERD_CONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{budget} for {partitions}: {err}");
        assert!(err.contains("memory_budget"), "{err}");
    }
    // The least budget for one stream is accepted.
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["config", "--check"])
        .env("COUNTERD_MEMORY_BUDGET", least.to_string())
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_wrong_schema_setting_is_refused_at_start_with_exit_2() {
    for (setting, value, says) in [
        ("COUNTERD_GROUP_FIELD", "", "group_field"),
        ("COUNTERD_CREATED_FIELD", "$createdAt", "created_field"),
        (
            "COUNTERD_SOFT_DELETE_FIELD",
            "meta..deleted",
            "soft_delete_field",
        ),
        ("COUNTERD_SOFT_DELETE", "sometimes", "soft_delete"),
        ("COUNTERD_SOFT_DELETE", "one_of", "soft_delete_values"),
        (
            "COUNTERD_COUNTERS_COLLECTION",
            "comments",
            "counters_collection",
        ),
        ("COUNTERD_COLLECTION_PREFIX", "a$b", "collection_prefix"),
    ] {
        // `run` refuses before it connects or listens.
        let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
            .arg("run")
            .env(setting, value)
            .env_remove("COUNTERD_CONFIG")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{setting}={value}: {err}");
        assert!(err.contains(says), "{setting}={value} names {says}: {err}");
    }
    // A correct non-default schema loads.
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["config", "--check"])
        .env("COUNTERD_GROUP_FIELD", "meta.postId")
        .env("COUNTERD_SOFT_DELETE", "one_of")
        .env("COUNTERD_SOFT_DELETE_FIELD", "status")
        .env("COUNTERD_SOFT_DELETE_VALUES", "removed, spam")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn a_second_source_is_listed_by_config_and_a_bad_one_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let good = write(
        "good.toml",
        "[[sources]]\nname = \"likes\"\ncollection = \"likes\"\ngroup_field = \"post_id\"\ncounters_collection = \"like_counters\"\n\n[[sources.counters]]\nname = \"old_likes\"\ngroup_field = \"post_id\"\ncondition = { created_at = { \"$lt\" = 2024-01-01T00:00:00Z } }\ncollection = \"old_like_counters\"\n",
    );
    let run = |args: &[&str], config: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_counterd"))
            .args(args)
            .env("COUNTERD_CONFIG", config)
            .output()
            .unwrap()
    };
    let o = run(&["config"], &good);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    assert!(
        text.contains("source `likes` (collection `likes`)")
            && text.contains("old_likes: per `post_id`"),
        "{text}"
    );
    // The text form is itself a settings file: it loads again to the same definitions.
    let again = write("again.toml", &text);
    let o = run(&["config", "--json"], &again);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed = json(&o)["definitions"].clone();
    let names: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().to_string(),
                d["source"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("default", "comments"),
            ("likes", "likes"),
            ("old_likes", "likes")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // The condition's date stayed a date through both loads (a string would print quoted).
    let printed = stdout(&run(&["config"], &again));
    assert!(
        printed.contains(r#"{ "$lt" = 2024-01-01T00:00:00Z }"#),
        "{printed}"
    );
    // An unknown source for a command is a usage error listing the ones there are.
    let o = run(&["status", "--source", "shares"], &good);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("comments, likes"));
    // A mistake names the entry and the setting.
    for (text, says) in [
        ("[[sources]]\nname = \"likes\"\ncollection = \"comments\"\ngroup_field = \"post_id\"\ncounters_collection = \"lc\"\n", "sources[0].collection"),
        ("[[sources]]\nname = \"likes\"\ncollection = \"likes\"\ngroup_field = \"$post\"\ncounters_collection = \"lc\"\n", "sources[0].group_field"),
        ("[[sources]]\nname = \"likes\"\ncollection = \"likes\"\ncounters_collection = \"lc\"\n", "group_field"),
    ] {
        let bad = write("bad.toml", text);
        let o = run(&["config", "--check"], &bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{text}: {err}");
        assert!(err.contains(says), "{text}: names {says}: {err}");
    }
}

#[test]
fn every_subcommand_explains_itself() {
    for sub in [
        "run",
        "status",
        "dirty",
        "reconcile",
        "replay",
        "snapshot",
        "get",
        "verify",
        "config",
        "doctor",
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
        // Flags only where they mean something: only `run` serves HTTP.
        assert_eq!(
            text.contains("--http-addr"),
            sub == "run",
            "{sub} --help and --http-addr: {text}"
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

/// Every `--json` document: parsed as JSON, times as RFC 3339 strings, no extended JSON, no
/// debug text.
fn clean_json(o: &Output) -> serde_json::Value {
    let v = json(o);
    let problems = counterd::cli::output::json_problems(&v);
    assert!(problems.is_empty(), "{problems:?} in\n{v:#}");
    v
}

#[tokio::test]
async fn every_json_output_parses_with_rfc3339_times() {
    let t = populated("clijson").await;
    // A correction, so the reconcile runs and `get` have drift and times to show.
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(doc! {"_id": "post-0"}, doc! {"$inc": {"live_delta": 2}})
        .await
        .unwrap();
    let r = clean_json(&counterd(&t, &["reconcile", "--json"]));
    assert!(r["summary"]["finished_at"].is_string(), "{r}");
    let s = clean_json(&counterd(&t, &["status", "--json"]));
    let stream = &s["streams"][0];
    assert!(stream["checkpoint_time"].is_string() && stream["checkpoint_token"].is_string());
    assert!(s["recent_reconciles"][0]["finished_at"].is_string(), "{s}");
    assert_eq!(
        s["last_correction"]["corrected"], 1,
        "the run that corrected is kept"
    );
    let d = clean_json(&counterd(&t, &["dirty", "--json"]));
    assert!(d["oldest"].is_string() || d["oldest"].is_null());
    let g = clean_json(&counterd(&t, &["get", "post-0", "--json"]));
    assert!(
        g["reconciled_at"].is_string() && g["base_watermark_time"].is_string(),
        "{g}"
    );
    clean_json(&counterd(&t, &["verify", "--json"]));
    // Settings are durations and strings as in the settings file (`settle_time = "5s"`).
    let c = json(&counterd(&t, &["config", "--json"]));
    assert_eq!(c["settings"]["settle_time"], "5s");
    assert_eq!(
        c["origins"]["settle_time"],
        "environment variable COUNTERD_SETTLE_TIME"
    );
    assert_eq!(
        json(&counterd(&t, &["config", "--check", "--json"]))["valid"],
        true
    );
    for args in [
        &["reconcile", "--post", "post-1", "--json"][..],
        &["reconcile", "--sweep", "--json"],
        &[
            "replay",
            "--from-time",
            "2000-01-01T00:00:00Z",
            "--dry-run",
            "--json",
        ],
    ] {
        clean_json(&counterd(&t, args));
    }
    let moved = clean_json(&counterd(
        &t,
        &["replay", "--from-time", "2001-02-03T04:05:06Z", "--json"],
    ));
    assert_eq!(moved["to"], "at 2001-02-03T04:05:06Z");
    // Human output has no debug text either.
    let text = stdout(&counterd(&t, &["status"]));
    for debug in ["Timestamp {", "Token(", "Some(", "$date"] {
        assert!(!text.contains(debug), "{debug} in\n{text}");
    }
}

#[tokio::test]
async fn a_broken_pipe_ends_quietly_with_the_commands_own_code() {
    let t = populated("clipipe").await;
    let script = format!(
        "set -o pipefail; '{}' status --json | head -c 1 >/dev/null",
        env!("CARGO_BIN_EXE_counterd")
    );
    let o = Command::new("bash")
        .args(["-c", &script])
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
}

/// The documented exit codes (README, "Exit codes"); 4 is in tests/faults.rs (a dropped
/// collection stops `counterd run`), 5 in tests/snapshot.rs (verify while the initial
/// snapshot runs), and every code's mapping in src/cli/exit.rs.
#[tokio::test]
async fn exit_codes_say_what_went_wrong() {
    let t = populated("cliexit").await;
    assert_eq!(counterd(&t, &["status"]).status.code(), Some(0), "0: ok");
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(
            doc! {"_id": "post-1"},
            doc! {"$inc": {"live_delta": 1, "count": 1}},
        )
        .await
        .unwrap();
    assert_eq!(
        counterd(&t, &["verify"]).status.code(),
        Some(1),
        "1: mismatch"
    );
    // 6: `run` cannot listen on http_addr (a port this test holds).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let busy = counterd(&t, &["run", "--http-addr", &addr]);
    let err = String::from_utf8_lossy(&busy.stderr);
    assert_eq!(busy.status.code(), Some(6), "6: cannot listen: {err}");
    assert!(
        err.contains(&format!("cannot listen on http_addr {addr}")),
        "{err}"
    );
    let usage = counterd(&t, &["replay", "--from-token", "not-hex", "--force"]);
    assert_eq!(usage.status.code(), Some(2), "2: a bad flag value");
    assert_eq!(counterd(&t, &["no-such-command"]).status.code(), Some(2));
    let port = counterd_testdb::free_port();
    let unreachable = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["status"])
        .env(
            "COUNTERD_MONGODB_URI",
            format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        )
        .env("COUNTERD_CONNECT_TIMEOUT", "1s")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(
        unreachable.status.code(),
        Some(3),
        "3: cannot reach MongoDB: {err}"
    );
    assert!(err.contains("cannot reach MongoDB"), "{err}");
    // A malformed URI is a configuration error, named, without the driver's raw text.
    let malformed = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["status"])
        .env(
            "COUNTERD_MONGODB_URI",
            "mongodb://alice:hunter2@db:notaport/",
        )
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&malformed.stderr);
    assert_eq!(malformed.status.code(), Some(2), "{err}");
    assert!(
        err.contains("mongodb_uri") && !err.contains("hunter2"),
        "{err}"
    );
}

#[test]
fn config_prints_the_effective_settings_and_where_they_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "batch_size = 7\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args([
            "--config",
            file.to_str().unwrap(),
            "--set",
            "settle_time=9s",
            "config",
        ])
        .env("COUNTERD_MONGODB_URI", "mongodb://alice:hunter2@db:27017/")
        .env("COUNTERD_PORT", "tcp://10.0.0.1:9187")
        .env("COUNTERD_SERVICE_HOST", "10.0.0.1")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let text = stdout(&o);
    assert!(
        o.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(text.contains("batch_size = 7  # file "), "{text}");
    assert!(
        text.contains("settle_time = \"9s\"  # flag --set"),
        "{text}"
    );
    assert!(
        text.contains("mongodb_uri = \"mongodb://alice:***@db:27017/\"  # environment variable COUNTERD_MONGODB_URI"),
        "{text}"
    );
    assert!(text.contains("lease_ttl = \"10s\"  # default") && !text.contains("hunter2"));
    assert!(
        text.contains("ignored COUNTERD_PORT"),
        "service links are ignored: {text}"
    );
    // The text form is itself a settings file.
    let again = dir.path().join("again.toml");
    let body: String = text
        .lines()
        .map(|l| l.split("  #").next().unwrap().to_string() + "\n")
        .collect();
    std::fs::write(&again, body.replace("***", "x")).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["--config", again.to_str().unwrap(), "config", "--check"])
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(
        stdout(&check).starts_with("configuration OK"),
        "{}",
        stdout(&check)
    );
    // --check names a bad value and exits 2, contacting nothing.
    let bad = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["--set", "batch_size=0", "config", "--check"])
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("batch_size") && err.contains("(from flag --set)"),
        "{err}"
    );
}

#[test]
fn config_counts_settings_that_differ_from_their_default_and_spells_values_as_the_example() {
    // A file that spells out a default gives a setting, but does not change it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "lease_ttl = \"10s\"\nbatch_size = 7\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["--config", file.to_str().unwrap(), "config", "--check"])
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let text = stdout(&o);
    assert!(
        text.contains(", 2 given, 1 not at their default;"),
        "{text}"
    );
    // `counterd config` with nothing given prints every value as counterd.example.toml
    // spells it (a duration written one way there and printed another confuses).
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .arg("config")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let printed: Vec<String> = stdout(&o)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split("  #").next().unwrap().to_string())
        .collect();
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("counterd.example.toml"),
    )
    .unwrap();
    let example: Vec<&str> = example
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    for line in &printed {
        assert!(
            example.contains(&line.as_str()),
            "`counterd config` prints `{line}`, which counterd.example.toml does not spell so"
        );
    }
    assert!(printed.len() >= 40, "{printed:?}");
}

#[test]
fn the_demo_says_clearly_when_no_test_server_can_be_started() {
    // As from a container image: no checkout (COUNTERD_TESTDB_DIR), no mongod, no URI.
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["demo", "--duration", "1s"])
        .env_remove("COUNTERD_TESTDB_DIR")
        .env_remove("COUNTERD_TEST_MONGODB_URI")
        .env_remove("COUNTERD_CONFIG")
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        err.contains("no throwaway MongoDB can be started here")
            && err.contains("COUNTERD_TEST_MONGODB_URI")
            && err.contains("scripts/demo"),
        "{err}"
    );
}

#[tokio::test]
async fn verify_finds_posts_with_comments_but_no_counter() {
    let t = TestDb::new("cliverifynew").await;
    // Comments that predate counterd: no worker ever ran, so no counter exists.
    for i in 0..4 {
        t.insert_comment(format!("old{i}"), &post(9), now_secs() - 3600)
            .await;
    }
    let o = counterd(&t, &["verify", "--json"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let mismatches = v["mismatches"].as_array().unwrap();
    assert_eq!(mismatches.len(), 1, "{v}");
    assert_eq!(mismatches[0]["post"], "post-9");
    assert_eq!(
        (
            mismatches[0]["displayed"].as_i64(),
            mismatches[0]["true_count"].as_i64()
        ),
        (Some(0), Some(4))
    );
}

/// A batch's counters, ledger entries and dirty marks are written side by side: between its
/// counter write and its dirty marks, a post shows the batch's change but is not in the dirty
/// set yet. `get`, `dirty` and `status` read the batch's recorded intent and call the post
/// dirty all the same, never clean.
#[tokio::test]
async fn a_dirty_mark_still_in_flight_is_reported_not_hidden() {
    let t = populated("marking").await;
    // populated() leaves post-0..2 dirty; post-7 has no entry. Record a batch that marks it,
    // as a worker does before its writes, and stop there (as if its writes were on the wire).
    let fence = counterd::store::Fence {
        stream: "comments".into(),
        epoch: t
            .store
            .load_checkpoint("comments")
            .await
            .unwrap()
            .unwrap()
            .epoch,
    };
    let batch = counterd::core::batch::PendingBatch {
        end: counterd::core::event::Token("ffffffffffffffff".into()),
        end_time: None,
        counters: vec![],
        ledger: vec![],
        dirty: vec![counterd::core::batch::DirtyMark::settled(
            counterd::core::key::CounterKey::new(counterd::core::key::CounterIx::DEFAULT, post(7)),
        )],
        carry: None,
    };
    t.store.record_intent(&fence, &batch, None).await.unwrap();
    // (No worker runs to finish the batch: each truth comparison waits out the catch-up
    // timeout and says "in flight"; keep that short.)
    let counterd = |t: &TestDb, args: &[&str]| {
        let mut with = vec!["--set", "catch_up_timeout=1s"];
        with.extend_from_slice(args);
        counterd(t, &with)
    };

    let g = json(&counterd(&t, &["get", "post-7", "--json"]));
    assert_eq!(
        (g["dirty"].as_bool(), g["dirty_mark_in_flight"].as_bool()),
        (Some(true), Some(true)),
        "{g}"
    );
    let text = stdout(&counterd(&t, &["get", "post-7"]));
    assert!(
        text.contains("dirty           yes (its mark is being written"),
        "{text}"
    );
    // A post already in the dirty set is plainly dirty.
    let g = json(&counterd(&t, &["get", "post-1", "--json"]));
    assert_eq!(
        (g["dirty"].as_bool(), g["dirty_mark_in_flight"].as_bool()),
        (Some(true), Some(false)),
        "{g}"
    );

    let d = json(&counterd(&t, &["dirty", "--json"]));
    assert_eq!(
        (d["size"].as_i64(), d["marks_in_flight"].clone()),
        (Some(3), serde_json::json!(["post-7"])),
        "{d}"
    );
    let text = stdout(&counterd(&t, &["dirty"]));
    assert!(
        text.contains("3 dirty posts")
            && text.contains("1 more being marked by the batch in flight"),
        "{text}"
    );

    let s = json(&counterd(&t, &["status", "--json"]));
    assert_eq!(s["dirty_marks_in_flight"].as_i64(), Some(1), "{s}");
    let text = stdout(&counterd(&t, &["status"]));
    assert!(
        text.contains("and 1 more being marked by the batch in flight"),
        "{text}"
    );
}
