//! Every command in README.md and docs/*.md runs as written, or is checked as far as it can
//! be here; every block that shows what a command prints is what the binary prints.
//!
//! The pages are what an operator copies from, so a command that no longer parses, a setting
//! renamed, a script moved or a file path changed must fail a test. Shell blocks (`sh`) are
//! read line by line (continuations joined) and every line must be one of the kinds below;
//! an unknown command fails the test rather than passing unread:
//!
//! - `scripts/demo ...`, `scripts/test`: the script exists and is executable; the demo's flags
//!   parse as `counterd demo`'s (running either takes minutes: `scripts/test` is CI itself);
//! - `export COUNTERD_<NAME>=...`: a setting, and the value loads; later lines of the block
//!   run with it;
//! - `counterd ...`: parses; `config` (with or without `--check`), `--help` and `--version`
//!   run for real; every other one needs a server, so `counterd config --check` runs with the
//!   same global flags and environment (the settings it would start with are valid);
//! - `kubectl ...` / `docker ...`: the counterd command inside parses, and `-f`/`-k` paths exist;
//! - `curl ...`: the path is one counterd serves; `mongosh`, `cargo`: named tools.
//!
//! `console` blocks are transcripts with what each command prints (see `support/docs.rs`):
//! each has an id, and each id is checked against the real binary, here (the reference pages,
//! over a healthy deployment on the test server) or in `tests/operator_sequences.rs` (the
//! worked sequences).
//!
//! Besides: the `createRole` and `createIndex` commands are exactly what `counterd doctor`
//! checks against; the TOML snippets load as settings files; every `counterd <subcommand>` in
//! inline code parses; every alert has its runbook section in docs/runbooks.md.

#[path = "support/daemon.rs"]
mod daemon;
#[path = "support/docs.rs"]
mod docs;
mod support;
#[path = "support/transcripts.rs"]
mod transcripts;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use clap::{CommandFactory, Parser as _};
use counterd::config::Settings;
use counterd::doctor::{create_index_command, create_role_command, Expectations};
use docs::{pages, parse, read, root, slug, words};
use support::post;
use transcripts::{dirty_posts, recount_index, settled, sidecar};

/// The lines of a shell block, continuations joined, comments and blank lines dropped.
fn shell_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(start) = line.strip_suffix('\\') {
            current.push_str(start);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        out.push(std::mem::take(&mut current));
    }
    out
}

fn subcommands() -> Vec<String> {
    counterd::cli::Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect()
}

/// `counterd ...` inside a line (after `--`, `exec`, ...), up to a shell operator.
fn embedded_counterd(words: &[String]) -> Option<Vec<String>> {
    let subs = subcommands();
    let at = words.iter().enumerate().position(|(i, w)| {
        w == "counterd" && words.get(i + 1).is_some_and(|n| subs.contains(n) || n.starts_with("--"))
            // `-c counterd`: a container's name, not the command.
            && !(i > 0 && words[i - 1].starts_with('-') && words[i - 1] != "--")
    })?;
    Some(
        words[at..]
            .iter()
            .take_while(|w| !["|", "&&", ";", ">"].contains(&w.as_str()))
            .cloned()
            .collect(),
    )
}

fn parses(origin: &str, cmd: &[String]) {
    if let Err(e) = counterd::cli::Cli::try_parse_from(cmd) {
        panic!("{origin}: `{}` does not parse:\n{e}", cmd.join(" "));
    }
}

/// Runs the real binary with only `env` of the COUNTERD_* variables set.
fn run_counterd(args: &[String], env: &[(String, String)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_counterd"));
    for (k, _) in std::env::vars() {
        if k.starts_with("COUNTERD_") {
            command.env_remove(k);
        }
    }
    command
        .args(args)
        .envs(env.iter().cloned())
        .current_dir(root())
        .output()
        .expect("run counterd")
}

/// Global flags (and their values) of a counterd command line, for `config --check`.
fn global_flags(cmd: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 1;
    while i < cmd.len() {
        let w = &cmd[i];
        if ["--config", "--mongodb-uri", "--database", "--set"].contains(&w.as_str()) {
            out.push(w.clone());
            out.extend(cmd.get(i + 1).cloned());
            i += 2;
            continue;
        }
        if w == "--log-json" || w.starts_with("--config=") || w.starts_with("--set=") {
            out.push(w.clone());
        }
        i += 1;
    }
    out
}

fn check_counterd(origin: &str, cmd: &[String], env: &[(String, String)]) -> &'static str {
    parses(origin, cmd);
    let sub = cmd.iter().skip(1).find(|w| subcommands().contains(w));
    let runs = matches!(sub.map(String::as_str), Some("config"))
        || cmd.iter().any(|w| w == "--help" || w == "--version");
    let (args, what) = if runs {
        (cmd[1..].to_vec(), "ran")
    } else {
        let mut args = global_flags(cmd);
        args.extend(["config".to_string(), "--check".to_string()]);
        (args, "parsed; its settings checked")
    };
    let out = run_counterd(&args, env);
    assert!(
        out.status.success(),
        "{origin}: `counterd {}` failed ({:?}):\n{}{}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    what
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Checks one line of a shell block; says what was checked.
fn check_shell_line(origin: &str, w: &[String], env: &mut Vec<(String, String)>) -> &'static str {
    match w[0].as_str() {
        "scripts/demo" | "scripts/test" => {
            assert!(
                is_executable(&root().join(&w[0])),
                "{origin}: no such script"
            );
            if w[0] == "scripts/demo" {
                let cmd: Vec<String> = ["counterd".to_string(), "demo".to_string()]
                    .into_iter()
                    .chain(w[1..].iter().cloned())
                    .collect();
                parses(origin, &cmd);
            }
            "script exists; flags parse"
        }
        "export" => {
            let (name, value) = w[1].split_once('=').expect("export NAME=VALUE");
            assert!(name.starts_with("COUNTERD_"), "{origin}");
            env.push((name.to_string(), value.to_string()));
            Settings::load(None, env.clone(), &[]).unwrap_or_else(|e| panic!("{origin}: {e}"));
            "a setting that loads"
        }
        "counterd" => check_counterd(origin, w, env),
        "kubectl" | "docker" => {
            if let Some(cmd) = embedded_counterd(w) {
                parses(origin, &cmd);
            }
            for (i, word) in w.iter().enumerate() {
                if word == "-f" || word == "-k" {
                    let file = &w[i + 1];
                    // `-f -` reads standard input (a manifest made by the line before).
                    if file != "-" && !file.contains("://") {
                        assert!(root().join(file).exists(), "{origin}: no file {file}");
                    }
                }
            }
            "counterd command parses; files exist"
        }
        "curl" => {
            let url = w.iter().find(|x| x.contains(":9187/")).expect("a URL");
            let path = &url[url.find(":9187").unwrap() + 5..];
            assert!(
                counterd::http::ROUTES.contains(&path),
                "{origin}: {path} is not served"
            );
            "path is served"
        }
        "mongosh" | "cargo" | "promtool" | "sed" => "a named tool",
        other => panic!("{origin}: `{other}` is a command this test does not know: add a rule"),
    }
}

#[test]
fn every_shell_command_in_the_pages_runs_or_is_checked() {
    let mut seen = Vec::new();
    let mut readme_first = Vec::new();
    for page in pages() {
        for block in parse(&read(&page)).blocks.iter().filter(|b| b.lang == "sh") {
            let mut env: Vec<(String, String)> = Vec::new();
            for line in shell_lines(&block.text) {
                let w = words(&line);
                let origin = format!("{page} `{line}`");
                let what = check_shell_line(&origin, &w, &mut env);
                seen.push(format!("{what}: {line}"));
                if page == "README.md" {
                    readme_first.push(line.clone());
                }
            }
        }
    }
    eprintln!("{}", seen.join("\n"));
    for required in [
        "scripts/demo --duration 60s",
        "scripts/test",
        "counterd doctor",
    ] {
        assert!(
            seen.iter().any(|s| s.ends_with(required)),
            "no `{required}` shell line"
        );
    }
    // The two set-up commands come first in the README.
    assert_eq!(
        readme_first[..2],
        ["scripts/demo --duration 60s", "scripts/test"],
        "{readme_first:?}"
    );
}

/// Every command of every transcript parses, every transcript has an id, and every id is
/// checked by a test against the real binary (here, or in tests/operator_sequences.rs).
#[test]
fn every_transcript_is_named_parsed_and_checked() {
    let mut ids = BTreeSet::new();
    for (page, block) in docs::console_blocks() {
        let id = block
            .id()
            .unwrap_or_else(|| panic!("{page}: a console block without an id:\n{}", block.text))
            .to_string();
        assert!(ids.insert(id.clone()), "{page}: id={id} twice");
        let steps = docs::steps(&block.text);
        assert!(!steps.is_empty(), "{page} id={id}: no `$ ` command");
        for step in steps {
            let w = words(&step.command);
            match w[0].as_str() {
                // A transcript of a usage error shows clap's refusal: it runs, but must not parse.
                "counterd" if step.printed.starts_with("error:") => {
                    assert!(
                        counterd::cli::Cli::try_parse_from(&w).is_err(),
                        "{page} id={id}: `{}` parses, but the page shows a usage error",
                        step.command
                    );
                }
                "counterd" => parses(&format!("{page} id={id}"), &w),
                "echo" | "export" => {}
                other => panic!("{page} id={id}: `{other}` cannot run in a transcript"),
            }
        }
    }
    let checked: BTreeSet<String> = REFERENCE_BLOCKS
        .iter()
        .chain(docs::SEQUENCE_BLOCKS)
        .map(|s| s.to_string())
        .collect();
    let unchecked: Vec<&String> = ids.difference(&checked).collect();
    assert!(
        unchecked.is_empty(),
        "transcripts no test runs: {unchecked:?}"
    );
    let missing: Vec<&String> = checked.difference(&ids).collect();
    assert!(
        missing.is_empty(),
        "transcripts the tests look for: {missing:?}"
    );
}

#[test]
fn the_role_and_the_index_are_what_the_doctor_checks() {
    let mut js = Vec::new();
    for page in pages() {
        js.extend(
            parse(&read(&page))
                .blocks
                .into_iter()
                .filter(|b| b.lang == "js")
                .map(|b| b.text),
        );
    }
    let expect = Expectations::from(&Settings::default());
    let role = create_role_command(&expect);
    assert!(
        js.iter().any(|b| b.contains(&role)),
        "the pages' createRole differs from what `counterd doctor` checks; it should read:\n{role}"
    );
    let index = create_index_command(&expect);
    assert!(
        js.iter().any(|b| b.contains(&index)),
        "the pages' createIndex differs from the doctor's fix; it should read:\n{index}"
    );
}

#[test]
fn toml_snippets_load_and_inline_commands_parse() {
    let dir = tempfile::tempdir().unwrap();
    let mut snippets = 0;
    let mut commands = 0;
    for page in pages() {
        let parsed = parse(&read(&page));
        for block in parsed.blocks.iter().filter(|b| b.lang == "toml") {
            let file = dir.path().join("snippet.toml");
            std::fs::write(&file, &block.text).unwrap();
            Settings::load(Some(&file), Vec::new(), &[])
                .unwrap_or_else(|e| panic!("{page} TOML snippet:\n{}\n{e}", block.text));
            snippets += 1;
        }
        for span in &parsed.spans {
            let w = words(&without_placeholders(span));
            if w.first().map(String::as_str) == Some("counterd")
                && w.get(1).is_some_and(|s| subcommands().contains(s))
            {
                let cmd: Vec<String> = w
                    .into_iter()
                    .take_while(|x| !["|", "&&", ";", ">"].contains(&x.as_str()))
                    .collect();
                parses(&format!("{page} `{span}`"), &cmd);
                commands += 1;
            }
        }
    }
    assert!(snippets >= 3, "the schema snippets");
    assert!(
        commands >= 20,
        "only {commands} inline commands: is the scan blind?"
    );
}

/// `<the second after the event>`: a placeholder stands for one value.
fn without_placeholders(span: &str) -> String {
    let mut text = String::new();
    let mut in_placeholder = false;
    for c in span.chars() {
        match c {
            '<' => {
                in_placeholder = true;
                text.push('x');
            }
            '>' if in_placeholder => in_placeholder = false,
            _ if in_placeholder => {}
            c => text.push(c),
        }
    }
    text
}

/// The runbook base an operator replaces (README says how), and the page the alerts link.
const RUNBOOK_BASE: &str = "https://github.com/counterd/counterd/blob/main/";

#[test]
fn every_alert_has_its_runbook_section() {
    let runbooks = parse(&read("docs/runbooks.md"));
    let anchors: BTreeSet<String> = runbooks.headings.iter().map(|h| slug(h)).collect();
    let rules: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(root().join("deploy/prometheus/alerts.yaml")).unwrap(),
    )
    .unwrap();
    let mut alerts = 0;
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let Some(alert) = rule["alert"].as_str() else {
                continue;
            };
            alerts += 1;
            assert!(
                anchors.contains(&slug(alert)),
                "docs/runbooks.md has no `### {alert}`"
            );
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
            let (file, anchor) = url.split_once('#').expect("page#anchor");
            let file = file.strip_prefix(RUNBOOK_BASE).unwrap_or(file);
            assert!(
                root().join(file).is_file(),
                "{alert}: its runbook_url names {file}, which does not exist"
            );
            let heads = parse(&read(file)).headings;
            assert!(
                heads.iter().any(|h| slug(h) == anchor),
                "{alert}: {file} has no heading #{anchor}"
            );
            assert_eq!(anchor, slug(alert), "{alert}: its own section");
        }
    }
    assert!(alerts >= 10);
    // The checklist shows what `promtool check rules` prints for them.
    let rules_count: usize = rules["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|g| g["rules"].as_sequence().unwrap().len())
        .sum();
    let said = format!("SUCCESS: {rules_count} rules found");
    assert!(read("README.md").contains(&said), "README.md: `{said}`");
    // The shared spec's alert, whichever branch ships its rule first.
    assert!(
        anchors.contains("counterdparked"),
        "docs/runbooks.md: ### CounterdParked"
    );
}

/// Every link to a page of the repository (`[x](docs/y.md#z)`) names a file that exists, and
/// an anchor that is one of its headings.
#[test]
fn links_between_pages_resolve() {
    for page in pages() {
        let md = read(&page);
        let dir = Path::new(&page).parent().unwrap_or(Path::new(""));
        for (event, _) in pulldown_cmark::Parser::new(&md).into_offset_iter() {
            let pulldown_cmark::Event::Start(pulldown_cmark::Tag::Link { dest_url, .. }) = event
            else {
                continue;
            };
            if dest_url.contains("://") || dest_url.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match dest_url.split_once('#') {
                Some((f, a)) => (f.to_string(), Some(a.to_string())),
                None => (dest_url.to_string(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                normalise_path(&dir.join(&file))
            };
            assert!(
                root().join(&target).exists(),
                "{page}: link to {dest_url}: no {target}"
            );
            if let (Some(anchor), true) = (anchor, target.ends_with(".md")) {
                let heads = parse(&read(&target)).headings;
                assert!(
                    heads.iter().any(|h| slug(h) == anchor),
                    "{page}: link to {dest_url}: {target} has no heading #{anchor}"
                );
            }
        }
    }
}

/// `docs/../deploy/x` -> `deploy/x`.
fn normalise_path(path: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
        }
    }
    parts.join("/")
}

#[test]
fn the_readme_is_a_path() {
    let md = read("README.md");
    let lines = md.lines().count();
    assert!(
        lines < 300,
        "README.md has {lines} lines: reference material goes to docs/"
    );
    let headings = parse(&md).headings;
    for wanted in ["Contents", "Try it on this machine", "Production checklist"] {
        assert!(
            headings.iter().any(|h| h == wanted),
            "README.md: ## {wanted}"
        );
    }
}

#[test]
fn the_scanners_read_what_they_should() {
    assert_eq!(
        words(r#"export X="a b" 'c'"#),
        ["export", "X=a b", "c"].map(String::from)
    );
    assert_eq!(shell_lines("a \\\n  b\n# c\n\nd"), ["a  b", "d"]);
    let w = words("kubectl exec deploy/app -c counterd -- counterd status --json | head");
    assert_eq!(
        embedded_counterd(&w).unwrap(),
        ["counterd", "status", "--json"].map(String::from)
    );
    assert_eq!(
        global_flags(&words("counterd --set a=1 run --http-addr x --database d")),
        ["--set", "a=1", "--database", "d"].map(String::from)
    );
    docs::self_check();
}

/// The transcripts of the reference pages checked here.
const REFERENCE_BLOCKS: &[&str] = &[
    "config-check",
    "config-collections",
    "commands-status",
    "commands-doctor",
    "commands-dirty",
    "commands-get",
    "commands-verify",
    "commands-replay-dry-run",
    "get-ambiguous",
    "readme-doctor",
    "readme-verify",
    "reconcile-conflict",
];

/// A healthy deployment on the test server: `counterd run` has applied comments on a few posts
/// and recounted them; the reference transcripts run beside it.
#[tokio::test(flavor = "multi_thread")]
async fn reference_transcripts_print_what_the_pages_show() {
    use counterd::core::key::GroupValue;
    let t = support::TestDb::new("docsref").await;
    let posts: Vec<GroupValue> = (1..=3).map(post).collect();
    // Rows from an hour ago: settled, so a recount folds them at once.
    let hour_ago = support::now_secs() - 3600;
    recount_index(&t).await;
    // Reconcile runs by hand only (below), so that a backlog stays for `dirty` to show; the
    // stream starts after the test database's own set-up writes.
    support::next_second().await;
    let _d = sidecar(
        &t,
        &[
            ("COUNTERD_INITIAL_SNAPSHOT", "never"),
            ("COUNTERD_RECONCILE_INTERVAL", "1h"),
        ],
    )
    .await;
    let mut n = 0;
    for (i, p) in posts.iter().enumerate() {
        for _ in 0..(i + 2) {
            t.insert_comment(format!("c{n}"), p, hour_ago).await;
            n += 1;
        }
    }
    settled(&t, &posts).await;
    let mut session = docs::Session::new(&t.uri, &t.name);
    // The dry run's time: a minute before this test's database was made (every event of it).
    let minute_ago = support::rfc3339(support::now_secs() - 60);
    session
        .vars
        .push(("2026-12-06T06:00:00Z".into(), minute_ago));
    // The settled rows fold at once: the dirty set drains.
    session.run("counterd reconcile");
    assert_eq!(
        dirty_posts(&t).await,
        0,
        "a recount of settled rows folds them"
    );
    session.check_block("config-check");
    session.check_block("config-collections");
    session.check_block("reconcile-conflict");
    session.check_block("commands-status");
    session.check_block("commands-doctor");
    session.check_block("readme-doctor");
    session.check_block("readme-verify");
    session.check_block("commands-get");
    session.check_block("commands-verify");
    session.check_block("commands-replay-dry-run");
    // One more comment: a healthy backlog of one post waiting for its recount.
    t.insert_comment("later", &posts[0], support::now_secs())
        .await;
    settled(&t, &posts).await;
    assert_eq!(dirty_posts(&t).await, 1);
    session.check_block("commands-dirty");
    // An id with two readings: the integer 123 and the string "123" both have comments.
    t.insert_comment("i123", &GroupValue::Int(123), hour_ago)
        .await;
    t.insert_comment("s123", &GroupValue::Str("123".into()), hour_ago)
        .await;
    session.check_block("get-ambiguous");
}

/// Metrics the shared spec names before they reach `telemetry::ALL` on this branch.
const PENDING_METRICS: &[&str] = &[
    "counterd_parked",
    "counterd_recounts_total",
    "counterd_recounts_deferred_total",
    "counterd_update_rows_read_total",
];

/// docs/metrics.md lists every metric counterd exports, and no other.
#[test]
fn the_metrics_page_lists_every_metric() {
    let page = read("docs/metrics.md");
    let table: BTreeSet<String> = page
        .lines()
        .filter(|l| l.starts_with("| `counterd_"))
        .filter_map(|l| {
            let name = l.trim_start_matches("| `");
            let end = name.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            Some(name[..end].to_string())
        })
        .collect();
    for name in counterd::telemetry::ALL {
        if name.starts_with("counterd_") {
            assert!(
                table.contains(name),
                "docs/metrics.md has no row for {name}"
            );
        }
    }
    for name in &table {
        assert!(
            counterd::telemetry::ALL.contains(&name.as_str())
                || PENDING_METRICS.contains(&name.as_str()),
            "docs/metrics.md lists {name}, which counterd does not export"
        );
    }
    for name in PENDING_METRICS {
        assert!(table.contains(*name), "docs/metrics.md: {name}");
    }
}
