//! deploy/ (Dockerfile, compose file, Kubernetes example, Prometheus rules) cannot be run on the
//! build machines, which have no container engine. This test keeps it consistent with the binary
//! instead, by reading every file under deploy/ as text:
//!
//! - every `COUNTERD_*` environment variable is a setting (or `COUNTERD_CONFIG`), and every value
//!   given to one there is accepted by `Settings::load`, together with the Kubernetes ConfigMap's
//!   `counterd.toml`;
//! - every counterd command line (Dockerfile `CMD`, compose `command:`, Kubernetes `args:`, and
//!   commands written as `counterd <subcommand> ...` in code spans, indented comment lines, `$ `
//!   lines and fenced blocks) names a real subcommand and real flags, and `--set` real settings;
//! - every metric in the Prometheus rules is one of `counterd::telemetry::ALL` (histograms with
//!   `_bucket`/`_sum`/`_count`), and every alert says which `counterd` command to run;
//! - every HTTP path (probes, scrape annotation, compose health check) is one that src/http.rs
//!   routes, the containers listen beyond loopback and expose/publish `http_addr`'s port;
//! - the Dockerfile builds `--bin counterd` with a Rust at least Cargo.toml's rust-version and
//!   runs it as the numeric non-root user that the Kubernetes securityContext names;
//! - counterd.example.toml lists exactly the settings, with their defaults, and loads.
//!
//! No database is needed. Failures name the file, the line and the offending name.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use counterd::config::Settings;

/// The files the deploy/ directory is expected to hold.
const EXPECTED_FILES: [&str; 5] = [
    "Dockerfile",
    "compose.yaml",
    "kubernetes/deployment.yaml",
    "prometheus/alerts.yaml",
    "README.md",
];

/// Alert rules the runbooks refer to.
const EXPECTED_ALERTS: [&str; 7] = [
    "CounterdDriftHigh",
    "CounterdStreamLagHigh",
    "CounterdCheckpointAgeHigh",
    "CounterdDirtyBacklogGrowing",
    "CounterdHistoryLost",
    "CounterdNoActiveWorker",
    "CounterdBadEvents",
];

/// Suffixes Prometheus adds to a histogram's name.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One file under deploy/: its path relative to the crate and its text.
struct DeployFile {
    name: String,
    text: String,
}

impl DeployFile {
    fn is_yaml(&self) -> bool {
        self.name.ends_with(".yaml") || self.name.ends_with(".yml")
    }

    fn is_markdown(&self) -> bool {
        self.name.ends_with(".md")
    }

    fn is_dockerfile(&self) -> bool {
        Path::new(&self.name)
            .file_name()
            .is_some_and(|n| n.to_string_lossy() == "Dockerfile")
    }

    fn lines(&self) -> impl Iterator<Item = (usize, &str)> {
        self.text.lines().enumerate().map(|(i, l)| (i + 1, l))
    }
}

fn deploy_files() -> Vec<DeployFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries =
            std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let root = root();
    let mut paths = Vec::new();
    walk(&root.join("deploy"), &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| DeployFile {
            name: path
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/"),
            text: std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display())),
        })
        .collect()
}

fn file<'a>(files: &'a [DeployFile], name: &str) -> &'a DeployFile {
    files
        .iter()
        .find(|f| f.name == format!("deploy/{name}"))
        .unwrap_or_else(|| panic!("deploy/{name} is missing"))
}

/// The settings' names: the keys of the default settings as a TOML table.
fn setting_names() -> BTreeSet<String> {
    match toml::Value::try_from(Settings::default()) {
        Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
        other => panic!("settings do not serialize to a table: {other:?}"),
    }
}

fn report(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---------------------------------------------------------------------------------------------
// Scanning helpers (no regex crate: simple hand scans).

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Words in `line` that start with `prefix` (not preceded by an identifier character), extended
/// while `more` accepts the following bytes.
fn words_with_prefix(line: &str, prefix: &str, more: fn(u8) -> bool) -> Vec<(usize, String)> {
    let bytes = line.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = line[from..].find(prefix) {
        let start = from + pos;
        let mut end = start + prefix.len();
        if start > 0 && is_ident_byte(bytes[start - 1]) {
            from = end;
            continue;
        }
        while end < bytes.len() && more(bytes[end]) {
            end += 1;
        }
        out.push((start, line[start..end].to_string()));
        from = end;
    }
    out
}

/// `COUNTERD_*` names in a line, with their byte offsets. `COUNTERD_<NAME>`-style placeholders
/// (nothing after the underscore) are skipped.
fn env_names(line: &str) -> Vec<(usize, String)> {
    words_with_prefix(line, "COUNTERD_", |b| {
        b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'
    })
    .into_iter()
    .map(|(at, w)| (at, w.trim_end_matches('_').to_string()))
    .filter(|(_, w)| w.len() > "COUNTERD_".len())
    .collect()
}

/// Strips quotes and trailing YAML/JSON punctuation from a scalar.
fn unquote(raw: &str) -> String {
    let t = raw.trim().trim_end_matches(',').trim();
    let t = t
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .or_else(|| t.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))
        .unwrap_or(t);
    t.to_string()
}

/// A YAML scalar's value without a trailing comment.
fn yaml_scalar(raw: &str) -> String {
    let raw = raw.trim();
    if raw.starts_with('"') || raw.starts_with('\'') {
        return unquote(raw);
    }
    let raw = match raw.find(" #") {
        Some(i) => &raw[..i],
        None => raw,
    };
    raw.trim().to_string()
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_blank_or_comment(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// Values given to `COUNTERD_*` variables in a file: `NAME=value` (Dockerfile `ENV`, shell,
/// compose list form), `NAME: value` (compose map form) and Kubernetes `- name: NAME` followed
/// by `value: ...`. Values taken from elsewhere (`valueFrom`, `${...}`, `$(...)`) are skipped.
fn env_assignments(f: &DeployFile) -> Vec<(usize, String, String)> {
    let lines: Vec<&str> = f.text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        for (at, name) in env_names(line) {
            let after = &line[at + name.len()..];
            let before = line[..at].trim_end();
            let value = if let Some(v) = after.strip_prefix('=') {
                let v = v.trim_start();
                let v = if v.starts_with('"') || v.starts_with('\'') {
                    let q = v.as_bytes()[0] as char;
                    v[1..].split(q).next().unwrap_or("").to_string()
                } else {
                    v.split(|c: char| c.is_whitespace() || c == '`' || c == ')')
                        .next()
                        .unwrap_or("")
                        .to_string()
                };
                Some(v)
            } else if let Some(v) = after.strip_prefix(':') {
                (f.is_yaml() && !before.ends_with("name:") && !v.trim().is_empty())
                    .then(|| yaml_scalar(v))
            } else if f.is_yaml() && before.ends_with("name:") && after.trim().is_empty() {
                // Kubernetes: the sibling `value:` of this `- name:` entry.
                let col = key_col(line);
                lines[i + 1..]
                    .iter()
                    .take_while(|l| is_blank_or_comment(l) || indent(l) >= col)
                    .filter(|l| indent(l) == col)
                    .find_map(|l| l.trim().strip_prefix("value:").map(yaml_scalar))
            } else {
                None
            };
            if let Some(v) = value {
                if !v.contains("${") && !v.contains("$(") {
                    out.push((i + 1, name, v));
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The command line, from clap.

/// counterd's flags: long name → whether it takes a value.
type Flags = BTreeMap<String, bool>;

struct CliSpec {
    global: Flags,
    global_short: BTreeSet<char>,
    subcommands: BTreeMap<String, (Flags, BTreeSet<char>)>,
}

impl CliSpec {
    fn load() -> CliSpec {
        fn flags(cmd: &clap::Command) -> (Flags, BTreeSet<char>) {
            let mut long = Flags::new();
            let mut short = BTreeSet::new();
            for arg in cmd.get_arguments() {
                let takes = arg.get_action().takes_values();
                if let Some(l) = arg.get_long() {
                    long.insert(l.to_string(), takes);
                }
                for alias in arg.get_visible_aliases().unwrap_or_default() {
                    long.insert(alias.to_string(), takes);
                }
                if let Some(s) = arg.get_short() {
                    short.insert(s);
                }
            }
            (long, short)
        }
        let mut cmd = counterd::cli::Cli::command();
        cmd.build();
        let (global, global_short) = flags(&cmd);
        let mut subcommands = BTreeMap::new();
        for sub in cmd.get_subcommands() {
            let spec = flags(sub);
            for name in std::iter::once(sub.get_name()).chain(sub.get_visible_aliases()) {
                subcommands.insert(name.to_string(), spec.clone());
            }
        }
        CliSpec {
            global,
            global_short,
            subcommands,
        }
    }

    /// Checks one counterd command line (the words after `counterd`). Returns the problems.
    fn check(&self, args: &[String], settings: &BTreeSet<String>) -> Vec<String> {
        let mut problems = Vec::new();
        let mut sub: Option<(&str, &(Flags, BTreeSet<char>))> = None;
        let mut i = 0;
        while i < args.len() {
            let word = args[i].as_str();
            i += 1;
            if word == "--" {
                break;
            }
            if let Some(flag) = word.strip_prefix("--") {
                let (name, inline) = match flag.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (flag, None),
                };
                let takes = sub
                    .and_then(|(_, (long, _))| long.get(name))
                    .or_else(|| self.global.get(name));
                let Some(&takes) = takes else {
                    let scope =
                        sub.map_or("counterd".to_string(), |(s, _)| format!("counterd {s}"));
                    problems.push(format!("unknown flag --{name} for `{scope}`"));
                    continue;
                };
                let value = match (takes, inline) {
                    (false, Some(_)) => {
                        problems.push(format!("flag --{name} takes no value"));
                        None
                    }
                    (true, Some(v)) => Some(v),
                    (true, None) => {
                        i += 1;
                        args.get(i - 1).cloned()
                    }
                    (false, None) => None,
                };
                if name == "set" {
                    problems.extend(check_set(value.as_deref(), settings));
                }
            } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
                for c in shorts.chars() {
                    let known = self.global_short.contains(&c)
                        || sub.is_some_and(|(_, (_, short))| short.contains(&c));
                    if !known {
                        problems.push(format!("unknown flag -{c}"));
                    }
                }
            } else if sub.is_none() {
                match self.subcommands.get_key_value(word) {
                    Some((name, spec)) => sub = Some((name.as_str(), spec)),
                    None => {
                        problems.push(format!("unknown subcommand `{word}`"));
                        break;
                    }
                }
            }
            // Other words are the subcommand's positional arguments (e.g. `get <post>`).
        }
        problems
    }
}

/// `--set name=value`: the name is a setting and the value is accepted for it.
fn check_set(value: Option<&str>, settings: &BTreeSet<String>) -> Vec<String> {
    let Some(pair) = value else {
        return vec!["--set without name=value".into()];
    };
    let Some((name, value)) = pair.split_once('=') else {
        return vec![format!("--set {pair}: expected name=value")];
    };
    if !settings.contains(name) {
        return vec![format!("--set {pair}: `{name}` is not a setting")];
    }
    if value.starts_with('<') {
        return Vec::new();
    }
    match Settings::load(None, Vec::new(), &[(name.to_string(), value.to_string())]) {
        Ok(_) => Vec::new(),
        Err(e) => vec![format!("--set {pair}: {e}")],
    }
}

/// Splits a shell-ish text into words, dropping quotes and YAML list punctuation.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| c == '"' || c == '\'' || c == ',' || c == '`')
                .to_string()
        })
        .filter(|w| !w.is_empty() && w != "\\")
        .collect()
}

/// A word that runs the binary: `counterd` or a path ending in `/counterd`.
fn is_counterd(word: &str) -> bool {
    word == "counterd" || word.ends_with("/counterd")
}

/// The counterd command in a piece of shell text: the words after its last `counterd` word that
/// is not another option's value (`cargo build --bin counterd`, `kubectl ... -c counterd`), or
/// after a counterd image in `docker run`; up to the end of that command (`|`, `;`, `&&`, ` #`).
fn command_in(text: &str) -> Option<Vec<String>> {
    text.split(['|', ';', '&']).find_map(|segment| {
        let segment = segment.split(" #").next().unwrap_or("");
        let w = words(segment);
        let program = (0..w.len()).rev().find(|&i| {
            is_counterd(&w[i]) && (i == 0 || w[i - 1] == "--" || !w[i - 1].starts_with('-'))
        });
        let docker_run = || {
            let run = w
                .windows(2)
                .position(|p| p[0] == "docker" && p[1] == "run")?;
            (run + 2..w.len()).find(|&i| {
                let name = w[i].rsplit('/').next().unwrap_or("");
                !w[i - 1].starts_with('-') && name.split([':', '@']).next() == Some("counterd")
            })
        };
        let pos = program.or_else(docker_run)?;
        Some(w[pos + 1..].to_vec())
    })
}

/// Inline code spans (`...`) of a line.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// The column where a YAML line's key starts (after a list item's `- `).
fn key_col(line: &str) -> usize {
    indent(line)
        + if line.trim_start().starts_with("- ") {
            2
        } else {
            0
        }
}

/// A YAML line without its indentation and list-item dash.
fn key_text(line: &str) -> &str {
    let t = line.trim_start();
    t.strip_prefix("- ").unwrap_or(t)
}

/// YAML list items of the key on line `at` (`key: [a, b]`, `key: a b`, or a block list below).
fn yaml_list(lines: &[&str], at: usize, rest: &str) -> Vec<String> {
    let rest = rest.trim();
    if let Some(inner) = rest.strip_prefix('[') {
        let inner = inner.split(']').next().unwrap_or("");
        return inner
            .split(',')
            .map(unquote)
            .filter(|w| !w.is_empty())
            .collect();
    }
    if !rest.is_empty() && !rest.starts_with(['#', '|', '>']) {
        return words(&yaml_scalar(rest));
    }
    let col = key_col(lines[at]);
    lines[at + 1..]
        .iter()
        .take_while(|l| {
            is_blank_or_comment(l)
                || indent(l) > col
                || (indent(l) == col && l.trim_start().starts_with("- "))
        })
        .filter_map(|l| l.trim().strip_prefix("- ").map(unquote))
        .collect()
}

/// Whether the YAML mapping holding line `at` describes counterd: a sibling `image:` names
/// counterd, or the mapping is the value of a `counterd:` key (a compose service).
fn yaml_mapping_is_counterd(lines: &[&str], at: usize) -> bool {
    let col = key_col(lines[at]);
    // The mapping's lines: up to its list-item opener (`- name: x`) or its parent key, and down
    // while lines are as deep as its keys.
    let mut first = at;
    let mut opener = lines[at].trim_start().starts_with("- ");
    while !opener && first > 0 {
        let l = lines[first - 1];
        if is_blank_or_comment(l) || indent(l) >= col {
            first -= 1;
        } else if l.trim_start().starts_with("- ") && key_col(l) == col {
            first -= 1;
            opener = true;
        } else {
            break;
        }
    }
    let mut last = at;
    while last + 1 < lines.len()
        && (is_blank_or_comment(lines[last + 1]) || indent(lines[last + 1]) >= col)
    {
        last += 1;
    }
    if !opener {
        let parent = lines[..first]
            .iter()
            .rev()
            .find(|l| !is_blank_or_comment(l));
        if parent.is_some_and(|p| p.trim() == "counterd:") {
            return true;
        }
    }
    lines[first..=last]
        .iter()
        .filter(|l| !is_blank_or_comment(l) && key_col(l) == col)
        .filter_map(|l| key_text(l).strip_prefix("image:"))
        .any(|image| {
            let image = yaml_scalar(image);
            let name = image.rsplit('/').next().unwrap_or("");
            name == "counterd" || name.starts_with("counterd:") || name.starts_with("counterd@")
        })
}

/// Every counterd command line in a file, as (line, words after `counterd`).
fn commands(f: &DeployFile) -> Vec<(usize, Vec<String>)> {
    let lines: Vec<&str> = f.text.lines().collect();
    let mut out = Vec::new();
    let mut in_fence = false;
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let trimmed = line.trim();
        if f.is_markdown() && trimmed.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        // Shell lines: inside fenced blocks, `$ ` prompts, and indented comment lines (`#   cmd`).
        let shell = if in_fence {
            Some(trimmed)
        } else if let Some(cmd) = trimmed.strip_prefix("$ ") {
            Some(cmd)
        } else if !f.is_markdown() && trimmed.starts_with("#  ") {
            Some(
                trimmed
                    .trim_start_matches('#')
                    .trim_start()
                    .trim_start_matches("$ "),
            )
        } else {
            None
        };
        if let Some(cmd) = shell {
            out.extend(command_in(cmd).map(|c| (n, c)));
        } else {
            for span in code_spans(line) {
                out.extend(command_in(span).map(|c| (n, c)));
            }
        }
        if f.is_dockerfile() {
            let parse = |rest: &str| -> Vec<String> {
                match serde_json::from_str::<Vec<String>>(rest.trim()) {
                    Ok(v) => v,
                    Err(_) => words(rest),
                }
            };
            if let Some(rest) = trimmed.strip_prefix("CMD ") {
                out.push((n, parse(rest)));
            }
            if let Some(rest) = trimmed.strip_prefix("ENTRYPOINT ") {
                // Whether it is counterd at all: the_container_runs_counterd_run.
                let entry = parse(rest);
                if entry.first().is_some_and(|w| is_counterd(w)) {
                    out.push((n, entry[1..].to_vec()));
                }
            }
        }
        if f.is_yaml() && !trimmed.starts_with('#') {
            let key = key_text(line);
            let key_rest = key
                .strip_prefix("command:")
                .or_else(|| key.strip_prefix("args:"));
            if let Some(rest) = key_rest {
                if yaml_mapping_is_counterd(&lines, i) {
                    let mut list = yaml_list(&lines, i, rest);
                    if list.first().is_some_and(|w| is_counterd(w)) {
                        list.remove(0);
                    }
                    out.push((n, list));
                }
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn deploy_holds_the_expected_files() {
    let files = deploy_files();
    for name in EXPECTED_FILES {
        file(&files, name);
    }
}

/// Environment variables clap reads itself (`COUNTERD_CONFIG` for `--config`).
fn clap_env_names() -> BTreeSet<String> {
    let mut cmd = counterd::cli::Cli::command();
    cmd.build();
    let mut names = BTreeSet::new();
    for c in std::iter::once(&cmd).chain(cmd.get_subcommands()) {
        for arg in c.get_arguments() {
            if let Some(env) = arg.get_env() {
                names.insert(env.to_string_lossy().into_owned());
            }
        }
    }
    names
}

#[test]
fn every_env_name_is_a_setting() {
    let settings = setting_names();
    let clap_env = clap_env_names();
    assert!(
        clap_env.contains("COUNTERD_CONFIG"),
        "--config no longer reads COUNTERD_CONFIG (clap reads {clap_env:?})"
    );
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for f in deploy_files() {
        for (n, line) in f.lines() {
            for (_, name) in env_names(line) {
                let setting = name["COUNTERD_".len()..].to_ascii_lowercase();
                if !clap_env.contains(&name) && !settings.contains(&setting) {
                    problems.push(format!(
                        "{}:{n}: {name} is not a counterd setting (no `{setting}` in Settings)",
                        f.name
                    ));
                }
                seen.insert(name);
            }
        }
    }
    report("environment variables that counterd ignores", &problems);
    for needed in [
        "COUNTERD_MONGODB_URI",
        "COUNTERD_HTTP_ADDR",
        "COUNTERD_CONFIG",
    ] {
        assert!(seen.contains(needed), "no deploy file uses {needed}");
    }
}

#[test]
fn every_env_value_is_accepted() {
    let mut problems = Vec::new();
    let mut count = 0;
    for f in deploy_files() {
        for (n, name, value) in env_assignments(&f) {
            count += 1;
            if name == "COUNTERD_CONFIG" {
                continue;
            }
            if let Err(e) = Settings::load(None, vec![(name.clone(), value.clone())], &[]) {
                problems.push(format!("{}:{n}: {name}={value:?}: {e}", f.name));
            }
        }
    }
    report("environment values counterd rejects", &problems);
    assert!(
        count >= 5,
        "found only {count} COUNTERD_* values in deploy/"
    );
}

/// Ports a file exposes or publishes: `EXPOSE`, `containerPort:`, `prometheus.io/port:` and
/// compose `ports:` items (`"host:container"`).
fn published_ports(f: &DeployFile) -> BTreeMap<String, Vec<u16>> {
    let mut out: BTreeMap<String, Vec<u16>> = BTreeMap::new();
    let mut in_ports = None;
    for line in f.text.lines().filter(|l| !is_blank_or_comment(l)) {
        let t = key_text(line);
        let numbers = |s: &str| -> Vec<u16> {
            s.split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect()
        };
        if let Some(rest) = t.strip_prefix("EXPOSE ") {
            out.entry("EXPOSE".into())
                .or_default()
                .extend(numbers(rest));
        }
        for key in ["containerPort:", "prometheus.io/port:"] {
            if let Some(rest) = t.strip_prefix(key) {
                out.entry(key.into()).or_default().extend(numbers(rest));
            }
        }
        let item = line.trim_start().starts_with("- ");
        if in_ports.is_some_and(|col| indent(line) < col || (indent(line) == col && !item)) {
            in_ports = None;
        }
        if in_ports.is_some() && item {
            let mapping = unquote(t);
            let container = mapping.rsplit(':').next().unwrap_or("");
            out.entry("ports:".into())
                .or_default()
                .extend(numbers(container.split('/').next().unwrap_or("")));
        }
        if t == "ports:" && f.name.ends_with("compose.yaml") {
            in_ports = Some(indent(line));
        }
    }
    out
}

#[test]
fn container_settings_load_together() {
    let files = deploy_files();
    let dir = tempfile::tempdir().unwrap();
    // The image's ENV applies in every container started from it; a file's own values win.
    let image_env: Vec<(String, String)> = env_assignments(file(&files, "Dockerfile"))
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .collect();
    for name in ["Dockerfile", "compose.yaml", "kubernetes/deployment.yaml"] {
        let f = file(&files, name);
        let own: Vec<(String, String)> = env_assignments(f)
            .into_iter()
            .map(|(_, k, v)| (k, v))
            .collect();
        let env: BTreeMap<String, String> = image_env.iter().chain(&own).cloned().collect();
        let config = configmap_toml(f).map(|(at, text)| {
            let path = dir.path().join("counterd.toml");
            std::fs::write(&path, text).unwrap();
            let target = env.get("COUNTERD_CONFIG").unwrap_or_else(|| {
                panic!(
                    "{}:{at}: a counterd.toml ConfigMap but no COUNTERD_CONFIG",
                    f.name
                )
            });
            let mount = target.rsplit_once('/').map_or("", |(d, _)| d);
            assert!(
                target.ends_with("/counterd.toml")
                    && f.text
                        .lines()
                        .any(|l| key_text(l) == format!("mountPath: {mount}")),
                "{}: COUNTERD_CONFIG={target} is not the mounted ConfigMap's counterd.toml",
                f.name
            );
            path
        });
        let loaded = Settings::load(config.as_deref(), env.clone(), &[]).unwrap_or_else(|e| {
            panic!(
                "{}: the settings it gives counterd do not load: {e}",
                f.name
            )
        });
        // Inside a container the endpoints must be reachable from outside it.
        let addr: std::net::SocketAddr = loaded.http_addr.parse().unwrap();
        assert!(
            !addr.ip().is_loopback(),
            "{}: http_addr {addr} is loopback: probes and scrapes cannot reach it",
            f.name
        );
        let ports = published_ports(f);
        assert!(
            !ports.is_empty(),
            "{}: exposes or publishes no port (http_addr is {addr})",
            f.name
        );
        for (key, list) in &ports {
            if key == "EXPOSE" || key == "prometheus.io/port:" || key == "ports:" {
                assert!(
                    list.iter().all(|p| *p == addr.port()),
                    "{}: {key} {list:?} is not http_addr's port {}",
                    f.name,
                    addr.port()
                );
            } else {
                assert!(
                    list.contains(&addr.port()),
                    "{}: no {key} {} (http_addr is {addr})",
                    f.name,
                    addr.port()
                );
            }
        }
    }
}

/// The `counterd.toml: |` block of a Kubernetes ConfigMap, dedented, with its line number.
fn configmap_toml(f: &DeployFile) -> Option<(usize, String)> {
    let lines: Vec<&str> = f.text.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.trim().starts_with("counterd.toml:"))?;
    let key_indent = indent(lines[at]);
    let body: Vec<&str> = lines[at + 1..]
        .iter()
        .take_while(|l| l.trim().is_empty() || indent(l) > key_indent)
        .copied()
        .collect();
    let cut = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0);
    let text = body
        .iter()
        .map(|l| l.get(cut..).unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    Some((at + 1, text + "\n"))
}

#[test]
fn every_counterd_command_line_is_valid() {
    let cli = CliSpec::load();
    let settings = setting_names();
    let mut problems = Vec::new();
    let mut count = 0;
    let mut subcommands_used = BTreeSet::new();
    for f in deploy_files() {
        if f.is_yaml() || f.is_markdown() {
            for (n, line) in f.lines() {
                if !line.trim_start().starts_with("```") && line.matches('`').count() % 2 == 1 {
                    problems.push(format!(
                        "{}:{n}: a code span broken across lines (keep `counterd ...` on one line)",
                        f.name
                    ));
                }
            }
        }
        for (n, args) in commands(&f) {
            count += 1;
            if let Some(sub) = args.iter().find(|a| !a.starts_with('-')) {
                subcommands_used.insert(sub.clone());
            }
            for p in cli.check(&args, &settings) {
                problems.push(format!(
                    "{}:{n}: `counterd {}`: {p}",
                    f.name,
                    args.join(" ")
                ));
            }
        }
    }
    report("counterd command lines the binary would reject", &problems);
    assert!(
        count >= 10,
        "found only {count} counterd command lines in deploy/"
    );
    for needed in ["run", "status", "dirty", "reconcile"] {
        assert!(
            subcommands_used.contains(needed),
            "no deploy file shows `counterd {needed}` (found {subcommands_used:?})"
        );
    }
}

#[test]
fn the_container_runs_counterd_run() {
    let files = deploy_files();
    let cmds = |name: &str| -> Vec<Vec<String>> {
        let f = file(&files, name);
        commands(f)
            .into_iter()
            .filter(|(n, _)| {
                let line = f.text.lines().nth(n - 1).unwrap_or("").trim_start();
                let line = line.trim_start_matches("- ");
                line.starts_with("CMD ")
                    || line.starts_with("command:")
                    || line.starts_with("args:")
            })
            .map(|(_, c)| c)
            .collect()
    };
    let dockerfile = file(&files, "Dockerfile");
    let entrypoint: Vec<&str> = dockerfile
        .text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ENTRYPOINT "))
        .collect();
    assert!(
        entrypoint.len() == 1
            && serde_json::from_str::<Vec<String>>(entrypoint[0])
                .is_ok_and(|e| e.len() == 1 && is_counterd(&e[0])),
        "{}: ENTRYPOINT should be exactly [\"counterd\"] (exec form), found {entrypoint:?}",
        dockerfile.name
    );
    for name in ["Dockerfile", "compose.yaml", "kubernetes/deployment.yaml"] {
        let found = cmds(name);
        assert!(
            found
                .iter()
                .any(|c| c.first().map(String::as_str) == Some("run")),
            "deploy/{name}: counterd's container does not run `counterd run` (found {found:?})"
        );
    }
}

/// A version like `1.88` or `1.88.0` as numbers.
fn version(text: &str) -> Vec<u32> {
    text.split('.').map(|n| n.parse().unwrap_or(0)).collect()
}

#[test]
fn dockerfile_builds_the_binary_as_non_root() {
    let files = deploy_files();
    let f = file(&files, "Dockerfile");
    let manifest: toml::Table = std::fs::read_to_string(root().join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let bins: Vec<&str> = manifest["bin"]
        .as_array()
        .map(|b| b.iter().filter_map(|b| b["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        bins.contains(&"counterd"),
        "Cargo.toml has no [[bin]] counterd"
    );
    assert!(
        f.text
            .contains("cargo build --release --locked --bin counterd"),
        "{}: does not run `cargo build --release --locked --bin counterd`",
        f.name
    );
    // The builder's Rust is at least the crate's rust-version.
    let arg = |name: &str| -> Option<String> {
        f.text
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("ARG {name}=")))
            .map(unquote)
    };
    let tag = f
        .text
        .lines()
        .find_map(|l| l.trim().strip_prefix("FROM rust:"))
        .unwrap_or_else(|| panic!("{}: no `FROM rust:` builder stage", f.name));
    let tag = tag.split_whitespace().next().unwrap_or("");
    let tag = match arg("RUST_VERSION") {
        Some(v) => tag.replace("${RUST_VERSION}", &v),
        None => tag.to_string(),
    };
    let builder = version(tag.split('-').next().unwrap_or(""));
    let needed = manifest["package"]["rust-version"].as_str().unwrap_or("0");
    assert!(
        builder >= version(needed),
        "{}: builder rust:{tag} is older than Cargo.toml's rust-version {needed}",
        f.name
    );
    assert!(
        f.text
            .lines()
            .any(|l| l.trim() == "FROM debian:bookworm-slim"),
        "{}: the runtime stage is not debian:bookworm-slim",
        f.name
    );
    let user = f
        .text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .unwrap_or_else(|| panic!("{}: no USER: the image would run as root", f.name));
    let uid = user.split(':').next().unwrap_or("");
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "{}: USER {user} should be a numeric non-root uid (for runAsNonRoot)",
        f.name
    );
    let k8s = file(&files, "kubernetes/deployment.yaml");
    assert!(
        k8s.text
            .lines()
            .any(|l| key_text(l) == format!("runAsUser: {uid}")),
        "{}: runAsUser is not the image's USER {uid}",
        k8s.name
    );
    for needed in ["runAsNonRoot: true", "readOnlyRootFilesystem: true"] {
        assert!(
            k8s.text.lines().any(|l| key_text(l) == needed),
            "{}: no `{needed}`",
            k8s.name
        );
    }
}

#[test]
fn http_paths_are_counterd_routes() {
    let http = std::fs::read_to_string(root().join("src/http.rs")).unwrap();
    let routes: BTreeSet<String> = http
        .split(".route(\"")
        .skip(1)
        .filter_map(|r| r.split('"').next())
        .map(str::to_string)
        .collect();
    for needed in ["/metrics", "/healthz", "/readyz"] {
        assert!(routes.contains(needed), "src/http.rs has no {needed} route");
    }
    let files = deploy_files();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for f in &files {
        if !(f.is_yaml() || f.is_dockerfile()) {
            continue;
        }
        for (n, line) in f.lines() {
            let t = line.trim();
            let path = t
                .strip_prefix("path:")
                .or_else(|| t.strip_prefix("prometheus.io/path:"))
                .map(yaml_scalar)
                .or_else(|| {
                    t.split("GET ")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .map(str::to_string)
                });
            if let Some(p) = path.filter(|p| p.starts_with('/')) {
                if !routes.contains(&p) {
                    problems.push(format!("{}:{n}: {p} is not served by counterd", f.name));
                }
                used.insert((f.name.clone(), p));
            }
        }
    }
    report("HTTP paths counterd does not serve", &problems);
    let k8s = "deploy/kubernetes/deployment.yaml".to_string();
    for p in ["/healthz", "/readyz"] {
        assert!(
            used.contains(&(k8s.clone(), p.to_string())),
            "{k8s}: no probe on {p}"
        );
    }
    let text = &file(&files, "kubernetes/deployment.yaml").text;
    let probe_path = |probe: &str| -> Option<String> {
        let at = text.find(&format!("{probe}:"))?;
        text[at..]
            .lines()
            .find_map(|l| l.trim().strip_prefix("path:").map(yaml_scalar))
    };
    assert_eq!(
        probe_path("livenessProbe").as_deref(),
        Some("/healthz"),
        "{k8s}: liveness probe"
    );
    assert_eq!(
        probe_path("readinessProbe").as_deref(),
        Some("/readyz"),
        "{k8s}: readiness probe"
    );
}

/// Metric names in a line: `counterd_` followed by lowercase letters, digits and underscores.
fn metric_names(line: &str) -> Vec<String> {
    words_with_prefix(line, "counterd_", |b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'
    })
    .into_iter()
    .map(|(_, w)| w)
    .collect()
}

/// A metric name as exported: one of `ALL`, or a histogram's `_bucket`/`_sum`/`_count` series
/// (counters, which end in `_total`, get no suffix).
fn is_exported_metric(name: &str) -> bool {
    let all = counterd::telemetry::ALL;
    all.contains(&name)
        || HISTOGRAM_SUFFIXES.iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| all.contains(&base) && !base.ends_with("_total"))
        })
}

#[test]
fn alert_rules_use_real_metrics() {
    let files = deploy_files();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for f in files
        .iter()
        .filter(|f| f.name.starts_with("deploy/prometheus/"))
    {
        for (n, line) in f.lines() {
            for name in metric_names(line) {
                if !is_exported_metric(&name) {
                    problems.push(format!(
                        "{}:{n}: {name} is not a counterd metric (see counterd::telemetry::ALL)",
                        f.name
                    ));
                }
                used.insert(name);
            }
        }
    }
    report("metrics counterd does not export", &problems);
    for m in [
        counterd::telemetry::STREAM_LAG,
        counterd::telemetry::CHECKPOINT_AGE,
        counterd::telemetry::DIRTY_BACKLOG_SIZE,
        counterd::telemetry::HISTORY_LOST,
        counterd::telemetry::WORKER_ACTIVE,
        counterd::telemetry::BAD_EVENTS,
    ] {
        assert!(used.contains(m), "no alert rule uses {m}");
    }
    assert!(
        used.iter()
            .any(|m| m.starts_with(counterd::telemetry::COUNTER_DRIFT)),
        "no alert rule uses {}",
        counterd::telemetry::COUNTER_DRIFT
    );
}

#[test]
fn every_alert_has_a_runbook() {
    let files = deploy_files();
    let f = file(&files, "prometheus/alerts.yaml");
    let cli = CliSpec::load();
    let settings = setting_names();
    let mut names = Vec::new();
    let mut problems = Vec::new();
    let blocks: Vec<&str> = f.text.split("- alert:").skip(1).collect();
    for block in &blocks {
        let name = block.split_whitespace().next().unwrap_or("").to_string();
        for field in ["expr:", "summary:", "description:", "severity:"] {
            if !block.contains(field) {
                problems.push(format!("{}: alert {name} has no {field}", f.name));
            }
        }
        let runbook: Vec<Vec<String>> = block
            .lines()
            .flat_map(code_spans)
            .filter_map(command_in)
            .collect();
        if !runbook
            .iter()
            .any(|c| !c.is_empty() && cli.check(c, &settings).is_empty())
        {
            problems.push(format!(
                "{}: alert {name} names no `counterd <subcommand>` to run",
                f.name
            ));
        }
        names.push(name);
    }
    report("alerts without a runbook", &problems);
    for needed in EXPECTED_ALERTS {
        assert!(
            names.iter().any(|n| n == needed),
            "{}: no alert {needed} (found {names:?})",
            f.name
        );
    }
}

#[test]
fn example_settings_file_lists_exactly_the_settings() {
    let path = root().join("counterd.example.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("counterd.example.toml does not parse: {e}"));
    let listed: BTreeSet<String> = table.keys().cloned().collect();
    let settings = setting_names();
    let missing: Vec<_> = settings.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&settings).collect();
    assert!(
        missing.is_empty(),
        "counterd.example.toml does not list the settings {missing:?}"
    );
    assert!(
        unknown.is_empty(),
        "counterd.example.toml lists {unknown:?}, which are not settings"
    );
    let loaded = Settings::load(Some(&path), Vec::<(String, String)>::new(), &[])
        .unwrap_or_else(|e| panic!("counterd.example.toml does not load: {e}"));
    assert_eq!(
        loaded,
        Settings::default(),
        "counterd.example.toml says it lists every setting with its default, but its values differ"
    );
}

// ---------------------------------------------------------------------------------------------
// The scanners themselves, on small samples, so that a silent scanner cannot pass the checks.

#[test]
fn scanners_find_what_they_should() {
    assert_eq!(
        env_names("ENV COUNTERD_HTTP_ADDR=0.0.0.0:9187 X_COUNTERD_NOPE=1 COUNTERD_<NAME>"),
        vec![(4, "COUNTERD_HTTP_ADDR".to_string())]
    );
    assert_eq!(
        metric_names("rate(counterd_counter_drift_sum[5m]) and CounterdX counterd.toml"),
        vec!["counterd_counter_drift_sum".to_string()]
    );
    assert!(is_exported_metric("counterd_counter_drift_bucket"));
    assert!(!is_exported_metric("counterd_events_applied_total_count"));
    assert!(!is_exported_metric("counterd_stream_lag"));
    assert_eq!(
        command_in("kubectl exec deploy/app -c counterd -- counterd dirty --limit 5 | head"),
        Some(vec!["dirty".into(), "--limit".into(), "5".into()])
    );
    assert_eq!(command_in("counterd.toml and counterd_x"), None);
    assert_eq!(
        command_in("cargo build --release --bin counterd --locked"),
        None
    );
    assert_eq!(
        command_in("docker run --rm -e A=b registry.example/counterd:1 status --json"),
        Some(vec!["status".into(), "--json".into()])
    );
    assert_eq!(
        command_in("docker build -f deploy/Dockerfile -t counterd:dev ."),
        None
    );

    let cli = CliSpec::load();
    let settings = setting_names();
    let ok = |line: &str| cli.check(&words(line), &settings);
    assert!(ok("--config /etc/c.toml reconcile --sweep --json").is_empty());
    assert!(ok("run --set batch_size=10 --log-json").is_empty());
    assert!(ok("get int:5 --json").is_empty());
    assert!(!ok("reconcile --swep").is_empty());
    assert!(!ok("recount --sweep").is_empty());
    assert!(!ok("run --set batch_sise=10").is_empty());
    assert!(!ok("run --set batch_size=lots").is_empty());
    assert!(!ok("status --limit 5").is_empty());

    let yaml = DeployFile {
        name: "deploy/x.yaml".into(),
        text: [
            "services:",
            "  mongo:",
            "    image: mongo:7",
            "    command: [\"--replSet\", \"rs0\"]",
            "  counterd:",
            "    command: [\"run\", \"--log-json\"]",
            "    environment:",
            "      COUNTERD_DATABASE: \"app\"",
            "      - COUNTERD_LOG_LEVEL=debug",
            "containers:",
            "  - name: counterd",
            "    image: registry.example.com/counterd:0.1.0",
            "    args:",
            "      - status",
            "      - --json",
            "    env:",
            "      - name: COUNTERD_HTTP_ADDR",
            "        value: \"0.0.0.0:9187\"",
            "      - name: COUNTERD_MONGODB_URI",
            "        valueFrom:",
            "          secretKeyRef: {name: s, key: uri}",
            "  - name: other",
            "    image: busybox",
            "    args: [\"--whatever\"]",
        ]
        .join("\n"),
    };
    let found: Vec<Vec<String>> = commands(&yaml).into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        found,
        vec![
            vec!["run".to_string(), "--log-json".to_string()],
            vec!["status".to_string(), "--json".to_string()],
        ]
    );
    let values: Vec<(String, String)> = env_assignments(&yaml)
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .collect();
    assert_eq!(
        values,
        vec![
            ("COUNTERD_DATABASE".to_string(), "app".to_string()),
            ("COUNTERD_LOG_LEVEL".to_string(), "debug".to_string()),
            ("COUNTERD_HTTP_ADDR".to_string(), "0.0.0.0:9187".to_string()),
        ]
    );
}
