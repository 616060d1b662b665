//! Every command in README.md runs as written, or is checked as far as it can be here.
//!
//! The README is what an operator copies from, so a command that no longer parses, a setting
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
//! - `kubectl ...` / `docker ...`: the counterd command inside parses, and `-f` files exist;
//! - `curl ...`: the path is one counterd serves.
//!
//! Besides: the `createRole` and `createIndex` commands are exactly what `counterd doctor`
//! checks against; the TOML snippets load as settings files; every `counterd <subcommand>` in
//! inline code parses; every alert's `runbook_url` points at its own runbook section under the
//! one base (tests/deploy_consistency.rs checks that the section exists).

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{CommandFactory, Parser as _};
use counterd::config::Settings;
use counterd::doctor::{create_index_command, create_role_command, Expectations};
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("README.md")
}

struct Block {
    lang: String,
    text: String,
}

/// The fenced code blocks, inline code spans and heading texts of a Markdown text.
fn parse(md: &str) -> (Vec<Block>, Vec<String>, Vec<String>) {
    let (mut blocks, mut spans, mut headings) = (Vec::new(), Vec::new(), Vec::new());
    let mut block: Option<Block> = None;
    let mut heading: Option<String> = None;
    for event in Parser::new(md) {
        match event {
            Event::Start(Tag::CodeBlock(kind)) => {
                let lang = match kind {
                    CodeBlockKind::Fenced(l) => l.to_string(),
                    CodeBlockKind::Indented => String::new(),
                };
                block = Some(Block {
                    lang,
                    text: String::new(),
                });
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(block.take()),
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => headings.extend(heading.take()),
            Event::Text(t) => {
                if let Some(b) = block.as_mut() {
                    b.text.push_str(&t);
                } else if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Code(c) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&c);
                }
                spans.push(c.to_string());
            }
            _ => {}
        }
    }
    (blocks, spans, headings)
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Shell words, with "double" and 'single' quotes (enough for the README's commands).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => current.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !current.is_empty() {
                    out.push(std::mem::take(&mut current));
                }
                any = false;
            }
            (None, c) => current.push(c),
        }
    }
    if any || !current.is_empty() {
        out.push(current);
    }
    out
}

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

#[test]
fn every_shell_command_in_the_readme_runs_or_is_checked() {
    let (blocks, _, _) = parse(&readme());
    let mut seen = Vec::new();
    for block in blocks.iter().filter(|b| b.lang == "sh") {
        let mut env: Vec<(String, String)> = Vec::new();
        for line in shell_lines(&block.text) {
            let w = words(&line);
            let origin = format!("README.md `{line}`");
            let what = match w[0].as_str() {
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
                        parses(&origin, &cmd);
                    }
                    "script exists; flags parse"
                }
                "export" => {
                    let (name, value) = w[1].split_once('=').expect("export NAME=VALUE");
                    assert!(name.starts_with("COUNTERD_"), "{origin}");
                    env.push((name.to_string(), value.to_string()));
                    Settings::load(None, env.clone(), &[])
                        .unwrap_or_else(|e| panic!("{origin}: {e}"));
                    "a setting that loads"
                }
                "counterd" => check_counterd(&origin, &w, &env),
                "kubectl" | "docker" => {
                    if let Some(cmd) = embedded_counterd(&w) {
                        parses(&origin, &cmd);
                    }
                    for (i, word) in w.iter().enumerate() {
                        if word == "-f" {
                            let file = &w[i + 1];
                            assert!(root().join(file).is_file(), "{origin}: no file {file}");
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
                other => {
                    panic!("{origin}: `{other}` is a command this test does not know: add a rule")
                }
            };
            seen.push(format!("{what}: {line}"));
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
            "README.md has no `{required}` shell line"
        );
    }
    // The two set-up commands come first.
    let first: Vec<&String> = seen.iter().take(2).collect();
    assert!(
        first[0].ends_with("scripts/demo --duration 60s") && first[1].ends_with("scripts/test"),
        "{first:?}"
    );
}

#[test]
fn the_role_and_the_index_are_what_the_doctor_checks() {
    let (blocks, _, _) = parse(&readme());
    let js: Vec<&str> = blocks
        .iter()
        .filter(|b| b.lang == "js")
        .map(|b| b.text.as_str())
        .collect();
    let expect = Expectations::from(&Settings::default());
    let role = create_role_command(&expect);
    assert!(
        js.iter().any(|b| b.contains(&role)),
        "README.md's createRole differs from what `counterd doctor` checks; it should read:\n{role}"
    );
    let index = create_index_command(&expect);
    assert!(
        js.iter().any(|b| b.contains(&index)),
        "README.md's createIndex differs from the doctor's fix; it should read:\n{index}"
    );
}

#[test]
fn toml_snippets_load_and_inline_commands_parse() {
    let (blocks, spans, _) = parse(&readme());
    let dir = tempfile::tempdir().unwrap();
    let mut snippets = 0;
    for block in blocks.iter().filter(|b| b.lang == "toml") {
        let file = dir.path().join("snippet.toml");
        std::fs::write(&file, &block.text).unwrap();
        Settings::load(Some(&file), Vec::new(), &[])
            .unwrap_or_else(|e| panic!("README.md TOML snippet:\n{}\n{e}", block.text));
        snippets += 1;
    }
    assert!(snippets >= 1, "the schema snippet");
    let mut commands = 0;
    for span in &spans {
        // `<the second after the event>`: a placeholder stands for one value.
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
        let w = words(&text);
        if w.first().map(String::as_str) == Some("counterd")
            && w.get(1).is_some_and(|s| subcommands().contains(s))
        {
            // `<post>` placeholders stand for a value.
            let cmd: Vec<String> = w
                .into_iter()
                .take_while(|x| !["|", "&&", ";", ">"].contains(&x.as_str()))
                .collect();
            parses(&format!("README.md `{span}`"), &cmd);
            commands += 1;
        }
    }
    assert!(
        commands >= 20,
        "only {commands} inline commands: is the scan blind?"
    );
}

#[test]
fn every_alert_links_its_runbook_section() {
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
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
            // Absolute, from the one base; that the section exists (in docs/runbooks.md, or
            // README.md before it) is checked by tests/deploy_consistency.rs.
            let anchor = url
                .strip_prefix("https://github.com/counterd/counterd/blob/main/docs/runbooks.md#")
                .unwrap_or_else(|| panic!("{alert}: {url} is not under the runbooks' base"));
            assert_eq!(anchor, slug(alert), "{alert}: its own section");
        }
    }
    assert!(alerts >= 10);
    assert_eq!(slug("Health and alerts"), "health-and-alerts");
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
}
