//! `counterd doctor` through the real binary against the test database, one test per check.
//! Checks whose subject the fake test server cannot show (an authenticated user's privileges,
//! pre-images, snapshot reads) assert what it does show and print why the rest is skipped;
//! those are unit-tested on real-shaped replies in tests/doctor_replies.rs.

mod support;

use std::process::{Command, Output};

use mongodb::bson::{doc, DateTime};
use support::{skip, TestDb};

fn doctor(t: &TestDb, extra: &[&str]) -> (Output, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["doctor", "--json"])
        .args(extra)
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .expect("run counterd doctor");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

/// The findings of one check: (level, message, fix).
fn of(json: &serde_json::Value, check: &str) -> Vec<(String, String, String)> {
    json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["level"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
                f["fix"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

async fn with_rows(name: &str, rows: Vec<mongodb::bson::Document>) -> TestDb {
    let t = TestDb::new(name).await;
    if !rows.is_empty() {
        t.comments.insert_many(rows).await.unwrap();
    }
    t
}

fn good_rows() -> Vec<mongodb::bson::Document> {
    (0..5)
        .map(|i| doc! {"_id": format!("c{i}"), "post_id": "p1", "created_at": DateTime::now()})
        .collect()
}

#[tokio::test]
async fn server_version_and_topology() {
    let t = with_rows("doctorserver", good_rows()).await;
    let (_, json) = doctor(&t, &[]);
    let server = &of(&json, "server")[0];
    assert_eq!(server.0, "ok", "{server:?}");
    assert!(
        server
            .1
            .contains(&format!("MongoDB {}", t.abilities.version)),
        "{server:?}"
    );
    // Change streams open on the test server (the fake reports no replica set name, mongod
    // runs as one): either way not a problem.
    let topology = &of(&json, "topology")[0];
    assert_eq!(topology.0, "ok", "{topology:?}");
}

#[tokio::test]
async fn recount_index_missing_then_present() {
    let t = with_rows("doctorindex", good_rows()).await;
    let (out, json) = doctor(&t, &[]);
    let index = &of(&json, "recount_index")[0];
    assert_eq!(index.0, "warning", "{index:?}");
    assert!(
        index
            .2
            .contains("createIndex({\"post_id\": 1, \"created_at\": 1})"),
        "{index:?}"
    );
    // A warning alone does not fail the doctor.
    assert_eq!(json["problems"], 0, "{json:#}");
    assert!(out.status.success());
    t.db.run_command(doc! {"createIndexes": "comments", "indexes": [
        {"key": {"post_id": 1, "created_at": 1}, "name": "recount"}
    ]})
    .await
    .unwrap();
    let (_, json) = doctor(&t, &[]);
    let index = &of(&json, "recount_index")[0];
    assert_eq!(index.0, "ok", "{index:?}");
    assert!(index.1.contains("recount"), "{index:?}");
}

#[tokio::test]
async fn a_misspelled_group_field_is_a_problem_with_exit_code_1() {
    let t = with_rows("doctorfields", good_rows()).await;
    let (out, json) = doctor(&t, &["--set", "group_field=postId"]);
    assert_eq!(out.status.code(), Some(1), "{json:#}");
    let fields = of(&json, "fields");
    let group = fields.iter().find(|f| f.0 == "problem").expect("a problem");
    assert!(
        group.1.contains("\"postId\"") && group.1.contains("post_id"),
        "{group:?}"
    );
    // Spelled right, the fields are fine.
    let (out, json) = doctor(&t, &[]);
    assert!(out.status.success(), "{json:#}");
    assert!(of(&json, "fields").iter().all(|f| f.0 == "ok"), "{json:#}");
    // The human report: one line per finding, the problem with its fix.
    let text = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["doctor", "--set", "group_field=postId"])
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(
        text.lines()
            .any(|l| l.starts_with("PROBLEM") && l.contains("-- fix: set group_field")),
        "{text}"
    );
}

#[tokio::test]
async fn empty_collection_skips_the_field_check_with_a_reason() {
    let t = with_rows("doctorempty", vec![]).await;
    let (_, json) = doctor(&t, &[]);
    let fields = &of(&json, "fields")[0];
    assert_eq!(fields.0, "skipped");
    assert!(fields.1.contains("no rows"), "{fields:?}");
}

#[tokio::test]
async fn privileges() {
    let t = with_rows("doctorprivileges", good_rows()).await;
    let (_, json) = doctor(&t, &[]);
    let found = &of(&json, "privileges")[0];
    if found.0 == "skipped" {
        // The fake server and a test mongod run without access control.
        skip(
            "privileges",
            &format!("the test server authenticates no user ({}); checked on real replies in tests/doctor_replies.rs", found.1),
        );
        return;
    }
    assert_eq!(found.0, "ok", "{found:?}");
}

#[tokio::test]
async fn pre_images_and_snapshot_reads() {
    let t = with_rows("doctorabilities", good_rows()).await;
    let (_, json) = doctor(&t, &[]);
    let pre = &of(&json, "pre_images")[0];
    let snapshot = &of(&json, "snapshot_reads")[0];
    assert_eq!(pre.0 == "ok", t.abilities.pre_images, "{pre:?}");
    assert_eq!(
        snapshot.0 == "ok",
        t.abilities.snapshot_reads,
        "{snapshot:?}"
    );
    if !t.abilities.pre_images {
        assert!(pre.1.contains("ledger"), "the cost is named: {pre:?}");
        skip(
            "pre_images",
            "the test server has no pre-images: the 'on' path is checked on real replies",
        );
    }
    if !t.abilities.snapshot_reads {
        assert!(
            snapshot.1.contains("quiet window"),
            "the cost is named: {snapshot:?}"
        );
        skip("snapshot_reads", "the test server has no snapshot reads: the 'available' path is checked on real replies");
    }
}

#[tokio::test]
async fn clock_skew_against_the_server() {
    let t = with_rows("doctorclock", good_rows()).await;
    let (_, json) = doctor(&t, &[]);
    let clock = &of(&json, "clock")[0];
    if clock.0 == "skipped" {
        skip("clock", &clock.1);
        return;
    }
    // The test server runs on this machine: the same clock.
    assert_eq!(clock.0, "ok", "{clock:?}");
}

#[tokio::test]
async fn unreachable_server_exits_3() {
    let out = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["doctor"])
        .env(
            "COUNTERD_MONGODB_URI",
            "mongodb://127.0.0.1:1/?directConnection=true",
        )
        .env("COUNTERD_CONNECT_TIMEOUT", "1s")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach MongoDB"));
}

/// `counterd run` makes the same checks at start and logs them: a missing recount index is a
/// warning with its fix, never silent.
#[tokio::test]
async fn run_logs_the_checks_at_start() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let t = with_rows("doctorrun", good_rows()).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["--log-json", "run", "--http-addr", "127.0.0.1:0"])
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env_remove("COUNTERD_CONFIG")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    // Read log lines until the recount-index finding (the process logs it right after
    // connecting); the reader ends if the process exits.
    let found = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("recount_index") {
                return (Some(line), seen);
            }
            seen.push(line);
            if seen.len() > 200 {
                break;
            }
        }
        (None, seen)
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !found.is_finished() && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        std::thread::park_timeout(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (line, seen) = found.join().unwrap();
    let line =
        line.unwrap_or_else(|| panic!("no recount_index finding logged:\n{}", seen.join("\n")));
    let json: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(json["level"], "WARN", "{line}");
    assert!(
        json["fix"]
            .as_str()
            .is_some_and(|f| f.contains("createIndex")),
        "{line}"
    );
}

/// The `tls` check against the test server (no TLS): off. A certificate file named in the URI
/// that cannot be used stops every command before anything is contacted, with exit 2 naming
/// the setting, the file and why; `doctor --json` reports it as a finding.
#[tokio::test]
async fn tls_is_reported_and_an_unusable_certificate_file_is_named() {
    let t = TestDb::new("doctortls").await;
    let (_, json) = doctor(&t, &[]);
    let tls = &of(&json, "tls")[0];
    assert_eq!(tls.0, "info", "{tls:?}");
    assert!(tls.1.starts_with("TLS off"), "{tls:?}");
    assert_eq!(json["connected"], true, "{json:#}");

    let fixtures = format!("{}/fixtures/tls", env!("CARGO_MANIFEST_DIR"));
    for (file, why) in [
        ("missing.pem", "no such file"),
        ("empty.pem", "the file is empty"),
        ("garbage.pem", "no PEM certificate"),
    ] {
        let uri = format!(
            "mongodb://127.0.0.1:1/?tls=true&tlsCAFile={fixtures}/{file}&directConnection=true"
        );
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_counterd"))
                .args(args)
                .env("COUNTERD_MONGODB_URI", &uri)
                .env("COUNTERD_CONNECT_TIMEOUT", "1s")
                .env_remove("COUNTERD_CONFIG")
                .output()
                .unwrap()
        };
        let status = run(&["status"]);
        let err = String::from_utf8_lossy(&status.stderr);
        assert_eq!(status.status.code(), Some(2), "{file}: {err}");
        assert!(
            err.contains(&format!("tlsCAFile {fixtures}/{file}: {why}")),
            "{file}: {err}"
        );
        let doctor = run(&["doctor", "--json"]);
        assert_eq!(doctor.status.code(), Some(2), "{file}");
        let json: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
        let tls = &of(&json, "tls")[0];
        assert_eq!(tls.0, "problem", "{file}: {tls:?}");
        assert!(tls.1.contains(why), "{file}: {tls:?}");
        assert_eq!(of(&json, "server")[0].0, "skipped", "{json:#}");
    }
}
