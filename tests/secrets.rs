//! Secrets that never show: `counterd` run as a user would, with a password holding each of
//! `/ @ : % ? # + =` (raw, which the driver refuses, and percent-encoded, which it accepts and
//! the test server then refuses or ignores), and secret query options. No part of a secret
//! may reach standard output or standard error, whatever the command says (a configuration
//! error, a refused login, a report, a log line).

mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use support::{output_text, TestDb};

/// A password with every character that breaks naive redaction.
const PASSWORD: &str = "s3cr/et@pa:ss%25?#+=zz";
/// A secret query option's value.
const KEY_PASSWORD: &str = "k3y/p@ss:wd";
const SESSION_TOKEN: &str = "IQoJb3JpZ2luX2Vj/tok3n+=";

/// `PASSWORD` percent-encoded as a valid URI needs it.
fn encoded(secret: &str) -> String {
    percent_encoding::utf8_percent_encode(secret, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `uri` (`mongodb://host...`) with `user:password@` before its hosts.
fn with_credentials(uri: &str, password: &str) -> String {
    let rest = uri.strip_prefix("mongodb://").expect("a mongodb:// URI");
    format!("mongodb://alice:{password}@{rest}")
}

/// `uri` with one more query option.
fn with_option(uri: &str, option: &str) -> String {
    let sep = if uri.contains('?') { '&' } else { '?' };
    if uri.contains('?') || uri.ends_with('/') {
        format!("{uri}{sep}{option}")
    } else {
        format!("{uri}/{sep}{option}")
    }
}

/// Every stretch of 4 characters or more of `secret`, as written and percent-encoded, except
/// those the URI's visible parts contain anyway (`alice`, the host...) and those made only of
/// digits, colons and blanks: that is how times, durations and counts print (`10:19`,
/// ` 190ms`), and a random password may hold one by chance.
fn distinctive_parts(secret: &str, visible: &str) -> Vec<String> {
    let mut parts = Vec::new();
    for form in [secret.to_string(), encoded(secret)] {
        let chars: Vec<char> = form.chars().collect();
        for len in 4..=chars.len() {
            for w in chars.windows(len) {
                let part: String = w.iter().collect();
                let numeric = w
                    .iter()
                    .all(|c| c.is_ascii_digit() || matches!(c, ':' | ' '));
                if !numeric && !visible.contains(&part) && !parts.contains(&part) {
                    parts.push(part);
                }
            }
        }
    }
    parts
}

/// Fails naming the leaked part and the command, if `said` holds any part of the secrets.
fn assert_no_secret(said: &str, secrets: &[&str], visible: &str, what: &str) {
    for secret in secrets {
        for part in distinctive_parts(secret, visible) {
            assert!(
                !said.contains(&part),
                "{what} shows `{part}` of a secret:\n{said}"
            );
        }
    }
}

fn counterd(uri: &str, database: &str, args: &[&str]) -> Output {
    support::counterd_at(uri, database)
        .args(args)
        .env("COUNTERD_CONNECT_TIMEOUT", "3s")
        .output()
        .expect("run counterd")
}

/// The one-shot commands that print the URI or a failure to use it.
const COMMANDS: [&[&str]; 8] = [
    &["config"],
    &["config", "--check"],
    &["status"],
    &["status", "--json"],
    &["doctor"],
    &["doctor", "--json"],
    &["get", "post-1"],
    &["dirty"],
];

/// The URIs under test, each with the secrets it holds: the password raw (refused as a
/// setting), percent-encoded (accepted, then refused or ignored by the server), and secret
/// options (an encrypted key's password, an AWS session token).
fn uris(server: &str) -> Vec<(String, Vec<&'static str>)> {
    let raw = with_credentials(server, PASSWORD);
    let valid = with_credentials(server, &encoded(PASSWORD));
    vec![
        (raw.clone(), vec![PASSWORD]),
        (valid.clone(), vec![PASSWORD]),
        (
            with_option(
                &valid,
                &format!("tlsCertificateKeyFilePassword={KEY_PASSWORD}"),
            ),
            vec![PASSWORD, KEY_PASSWORD],
        ),
        (
            with_option(
                &with_option(&raw, "authMechanism=MONGODB-AWS"),
                &format!("authMechanismProperties=AWS_SESSION_TOKEN:{SESSION_TOKEN}"),
            ),
            vec![PASSWORD, SESSION_TOKEN],
        ),
    ]
}

#[tokio::test]
async fn no_command_prints_any_part_of_a_password() {
    let t = TestDb::new("secrets").await;
    for (uri, secrets) in uris(&t.uri) {
        for args in COMMANDS {
            let o = counterd(&uri, &t.name, args);
            let said = output_text(&o);
            assert_no_secret(&said, &secrets, &t.uri, &format!("counterd {args:?}"));
            // Whatever happened, it is said in words, not as the driver's debug text.
            for debug in ["labels: {", "Kind(", "ServerSelection {", "Topology: {"] {
                assert!(!said.contains(debug), "counterd {args:?}: {said}");
            }
        }
    }
}

/// `doctor --json` prints its report even when it cannot connect (here: a port nothing
/// listens on), the failure as the `server` finding, and exits 3.
#[test]
fn doctor_json_reports_a_failed_connection_as_a_finding() {
    let port = counterd_testdb::free_port();
    let uri = with_credentials(&format!("mongodb://127.0.0.1:{port}/"), &encoded(PASSWORD));
    let o = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["doctor", "--json"])
        .env("COUNTERD_MONGODB_URI", &uri)
        .env("COUNTERD_CONNECT_TIMEOUT", "1s")
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", output_text(&o));
    assert_no_secret(&output_text(&o), &[PASSWORD], "127.0.0.1", "doctor --json");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", output_text(&o)));
    assert_eq!(report["connected"], false);
    let server = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "server")
        .expect("a server finding");
    assert_eq!(server["level"], "problem");
    let message = server["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("127.0.0.1:{port}: connection refused")),
        "{message}"
    );
    assert!(!message.contains("transient"), "{message}");
}

/// Polls `log` until `done` holds for its text or `within` passes; the text either way.
fn wait_for(log: &Path, within: Duration, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + within;
    loop {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(log) {
            let _ = f.read_to_string(&mut text);
        }
        if done(&text) || Instant::now() >= deadline {
            return text;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `counterd run` with each URI: its log lines (human and JSON) name no secret, whether it
/// stops at the setting, at the login, or runs (the test server has no authentication).
#[tokio::test]
async fn run_logs_no_part_of_a_password() {
    let t = TestDb::new("secretsrun").await;
    let dir = tempfile::tempdir().unwrap();
    for (i, (uri, secrets)) in uris(&t.uri).into_iter().enumerate() {
        for json in [false, true] {
            let log = dir.path().join(format!("run{i}{json}.log"));
            let file = std::fs::File::create(&log).unwrap();
            let mut child = Command::new(env!("CARGO_BIN_EXE_counterd"))
                .args(["run", "--http-addr"])
                .arg(format!("127.0.0.1:{}", counterd_testdb::free_port()))
                .args(if json { &["--log-json"][..] } else { &[] })
                .env("COUNTERD_MONGODB_URI", &uri)
                .env("COUNTERD_DATABASE", &t.name)
                .env("COUNTERD_CONNECT_TIMEOUT", "3s")
                .env("COUNTERD_LOG_LEVEL", "debug")
                .env("COUNTERD_OWNER_ID", format!("secrets-{i}"))
                .env_remove("COUNTERD_CONFIG")
                .stdout(Stdio::from(file.try_clone().unwrap()))
                .stderr(Stdio::from(file))
                .spawn()
                .unwrap();
            // The line that shows the URI (connected), or the one that says why it stopped.
            wait_for(&log, Duration::from_secs(60), |text| {
                text.contains("mongodb")
                    && (text.contains("version") || STOPPED.iter().any(|m| text.contains(m)))
            });
            let _ = child.kill();
            let _ = child.wait();
            // Read once it stopped: every line whole.
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                said.contains("mongodb"),
                "run {i} said nothing about its URI: {said}"
            );
            assert_no_secret(&said, &secrets, &t.uri, &format!("run {uri:?}"));
            // Redacted JSON log lines are still JSON.
            for line in said.lines().filter(|l| json && l.starts_with('{')) {
                assert!(
                    serde_json::from_str::<serde_json::Value>(line).is_ok(),
                    "not JSON: {line}"
                );
            }
        }
    }
}

/// Characters that break naive redaction, and a few plain ones.
const HARD: &str = "/@:%?#+=abcXYZ019";

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random passwords of those characters, raw and percent-encoded, through the commands
    /// that print the URI or a failure to use it, against the test server (which refuses any
    /// login: the refusal is one of the paths).
    #[test]
    fn random_passwords_never_show(
        chars in proptest::collection::vec(proptest::sample::select(HARD.chars().collect::<Vec<_>>()), 6..20),
        encode in any::<bool>(),
    ) {
        // Every printing path: the configuration error, `config`, `status`, `get`, `dirty`,
        // `doctor` (text and JSON), and `run`'s log lines.
        let password: String = chars.into_iter().collect();
        let visible = baseline();
        let written = if encode { encoded(&password) } else { password.clone() };
        let uri = with_credentials(&support::server().uri, &written);
        for args in COMMANDS {
            let said = output_text(&counterd(&uri, "secretsprop", args));
            for part in distinctive_parts(&password, visible) {
                prop_assert!(!said.contains(&part), "counterd {:?} with {:?} shows `{}`:\n{}", args, uri, part, said);
            }
        }
        // `run` stops at the setting (raw) or at the refused login (encoded): its log lines.
        let (said, addr) = run_until_it_stops(&uri);
        for part in distinctive_parts(&password, &format!("{visible}{addr}")) {
            prop_assert!(!said.contains(&part), "run with {:?} shows `{}`:\n{}", uri, part, said);
        }
    }
}

/// `counterd run` with `uri` until it exits or says why it stopped (or 60 s, then killed):
/// what it said, both streams, and the HTTP address it was given.
fn run_until_it_stops(uri: &str) -> (String, String) {
    let addr = format!("127.0.0.1:{}", counterd_testdb::free_port());
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["run", "--http-addr", &addr])
        .env("COUNTERD_MONGODB_URI", uri)
        .env("COUNTERD_DATABASE", "secretsprop")
        .env("COUNTERD_CONNECT_TIMEOUT", "3s")
        .env("COUNTERD_LOG_LEVEL", "debug")
        .env_remove("COUNTERD_CONFIG")
        .stdout(Stdio::from(file.try_clone().unwrap()))
        .stderr(Stdio::from(file))
        .spawn()
        .unwrap();
    // It exits at a bad setting; at a refused login it exits, or parks (`on_fatal = "park"`)
    // and stays up: then the line that says so is the one to read.
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        if STOPPED.iter().any(|m| said.contains(m)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    (
        without_timestamps(&std::fs::read_to_string(&log).unwrap()),
        addr,
    )
}

/// Log lines without their leading timestamp (`2026-12-07T04:10:19.190190Z`): its digits and
/// its `Z` may match a stretch of a random password by chance.
fn without_timestamps(log: &str) -> String {
    log.lines()
        .map(|line| match line.split_once(' ') {
            Some((first, rest)) if first.ends_with('Z') && first.contains('T') => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `run` says when it stops or parks for good.
const STOPPED: [&str; 4] = [
    "counterd stopped",
    "configuration error",
    "authentication refused",
    "parked",
];

/// What the commands print anyway, whatever the password (the server's address, defaults such
/// as `127.0.0.1:9187`, the hint of a refused URI): a stretch of a random password found in
/// it is no leak. The commands' output with no credentials and with a neutral password.
fn baseline() -> &'static str {
    static SAID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SAID.get_or_init(|| {
        let server = &support::server().uri;
        let mut said = server.clone();
        for uri in [server.clone(), with_credentials(server, "zz/zz")] {
            for args in COMMANDS {
                said.push_str(&output_text(&counterd(&uri, "secretsprop", args)));
            }
        }
        said
    })
}
