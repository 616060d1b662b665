//! deploy/ against the binary: the checks only this project can make. The files' own validity
//! is checked by the real tools in `scripts/deploy-validate` (run by `.ci/run`): promtool,
//! kustomize rendering every kustomization into kubernetes-validate --strict, check-jsonschema
//! with the compose spec, hadolint. Here, with a real YAML parser (serde_norway), a Markdown
//! parser (pulldown-cmark) and the kustomizations read the way kustomize reads them:
//!
//! - every `COUNTERD_*` variable given in deploy/ is a setting, and each container's settings
//!   (environment, the generated ConfigMap's `counterd.toml`, the URI file from the Secret that
//!   deploy/README.md says how to create) load together;
//! - no applied file holds a `Secret`; the URI comes from a file of the mounted Secret, the
//!   settings from a ConfigMap that kustomize generates (a settings change rolls the pods);
//! - every counterd command line (Dockerfile `CMD`, compose `command`, Kubernetes `args`, and
//!   the commands written in alert descriptions and deploy/README.md) parses with clap;
//! - every metric used by the alert rules and the Grafana dashboard is one counterd exports
//!   (or cAdvisor's, on an explicit list), and the dashboard watches the snapshot, the full
//!   sweep, memory and parked streams;
//! - every alert's runbook_url is absolute, from the one base, with an anchor that exists;
//! - every HTTP path probed or scraped is one counterd routes, and every shipped pod is
//!   scraped exactly once by the `counterd` job and an annotation-driven job together;
//! - the sidecar never takes its app down: liveness on /healthz, no readiness or startup gate,
//!   nothing of the app's pod changed, non-root at the container; native and classic alike;
//!   the standalone Deployment has two replicas and a disruption budget that selects them;
//! - the manifests' sizing line agrees with bench/latest.json, the budget and the resources;
//! - counterd.example.toml lists exactly the settings, with their defaults;
//! - the image's build context holds every workspace member (scripts/image-check builds it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::{CommandFactory, Parser};
use counterd::config::Settings;
use serde::Deserialize;
use serde_norway::Value;

fn path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

/// Every document of a YAML file.
fn yaml_docs(rel: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(&read(rel))
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}")))
        .collect()
}

/// Every node of a YAML value, depth first.
fn nodes(v: &Value) -> Vec<&Value> {
    let mut out = vec![v];
    match v {
        Value::Mapping(m) => m.values().for_each(|c| out.extend(nodes(c))),
        Value::Sequence(s) => s.iter().for_each(|c| out.extend(nodes(c))),
        _ => {}
    }
    out
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str()
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_sequence)
        .map(|s| {
            s.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn seq(v: Option<&Value>) -> Vec<&Value> {
    v.and_then(Value::as_sequence)
        .map(|s| s.iter().collect())
        .unwrap_or_default()
}

/// The ways to deploy counterd on Kubernetes: the kustomizations `scripts/deploy-validate`
/// renders (the sidecar components through the examples that use them).
const SHAPES: [(&str, &str); 3] = [
    ("native sidecar", "deploy/kubernetes/sidecar/example/native"),
    (
        "classic sidecar",
        "deploy/kubernetes/sidecar/example/classic",
    ),
    ("standalone", "deploy/kubernetes/standalone"),
];

/// What a kustomization is made of, gathered the way kustomize reads it (resources,
/// components, patches, configMapGenerator files), without rendering: enough to check what
/// the rendered objects hold.
#[derive(Default)]
struct Shape {
    name: &'static str,
    /// Documents of the resource files (the objects as written).
    resources: Vec<Value>,
    /// Documents of the patch files (what the components add to the targets).
    patches: Vec<Value>,
    /// (ConfigMap name, key, file content) of every configMapGenerator.
    generated: Vec<(String, String, String)>,
    /// Every YAML file read, relative to the repository.
    files: Vec<String>,
}

impl Shape {
    fn load(name: &'static str, dir: &str) -> Shape {
        let mut shape = Shape {
            name,
            ..Shape::default()
        };
        shape.gather(dir);
        shape
    }

    fn gather(&mut self, dir: &str) {
        let k = &yaml_docs(&format!("{dir}/kustomization.yaml"))[0];
        for r in strings(k.get("resources")) {
            let rel = format!("{dir}/{r}");
            if path(&rel).is_dir() {
                self.gather(&rel);
            } else {
                self.resources.extend(yaml_docs(&rel));
                self.files.push(rel);
            }
        }
        for c in strings(k.get("components")) {
            self.gather(&format!("{dir}/{c}"));
        }
        for p in seq(k.get("patches")) {
            let rel = format!("{dir}/{}", str_at(p, "path").expect("a patch file"));
            self.patches.extend(yaml_docs(&rel));
            self.files.push(rel);
        }
        for g in seq(k.get("configMapGenerator")) {
            let name = str_at(g, "name").expect("a generated ConfigMap's name");
            for f in strings(g.get("files")) {
                let (key, file) = f.split_once('=').unwrap_or((&f, &f));
                let text = read(&format!("{dir}/{file}"));
                self.generated.push((name.into(), key.into(), text));
            }
        }
    }

    fn all() -> Vec<Shape> {
        SHAPES.iter().map(|(n, d)| Shape::load(n, d)).collect()
    }

    fn docs(&self) -> Vec<&Value> {
        self.resources.iter().chain(&self.patches).collect()
    }

    /// The counterd containers (resources' or patches').
    fn counterd(&self) -> Vec<&Value> {
        self.docs()
            .into_iter()
            .flat_map(counterd_containers)
            .collect()
    }

    /// counterd's settings file: the generated `counterd.toml`.
    fn settings_file(&self) -> &str {
        let files: Vec<_> = self
            .generated
            .iter()
            .filter(|(_, key, _)| key == "counterd.toml")
            .collect();
        assert_eq!(files.len(), 1, "{}: one generated counterd.toml", self.name);
        &files[0].2
    }

    /// The pod template of the shape's Deployment as written (the app's, for a sidecar).
    fn pod(&self) -> &Value {
        let d = self
            .resources
            .iter()
            .find(|d| str_at(d, "kind") == Some("Deployment"))
            .unwrap_or_else(|| panic!("{}: a Deployment", self.name));
        &d["spec"]["template"]
    }

    /// The pod specs that hold volumes for counterd's mounts (patches', else the resource's).
    fn volumes(&self) -> Vec<&Value> {
        self.docs()
            .into_iter()
            .flat_map(|d| seq(d["spec"]["template"]["spec"].get("volumes")))
            .collect()
    }
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| str_at(d, "kind") == Some(kind))
        .collect()
}

/// The counterd containers under a document.
fn counterd_containers(doc: &Value) -> Vec<&Value> {
    nodes(doc)
        .into_iter()
        .filter(|n| str_at(n, "image").is_some_and(|i| i.contains("counterd")))
        .collect()
}

/// The Secret deploy/README.md tells to create: (name, key, the URI it shows).
fn secret_from_readme() -> (String, String, String) {
    let readme = read("deploy/README.md");
    let cmd = readme
        .split("kubectl create secret generic ")
        .nth(1)
        .expect("deploy/README.md shows `kubectl create secret generic …`");
    let name = cmd.split_whitespace().next().unwrap().to_string();
    let literal = cmd
        .split_once("--from-literal=")
        .expect("the Secret's URI as --from-literal=<key>=…")
        .1;
    let (key, rest) = literal.split_once('=').unwrap();
    let uri = rest.trim_start_matches('\'').split('\'').next().unwrap();
    (name, key.to_string(), uri.to_string())
}

/// Whether counterd knows a setting (a name of `counterd.example.toml`).
fn is_setting(name: &str) -> bool {
    match toml::Value::try_from(Settings::default()) {
        Ok(toml::Value::Table(t)) => t.contains_key(name),
        _ => false,
    }
}

/// (variable, value) pairs a container is given: Kubernetes `env` (references give no value)
/// or a compose `environment`.
fn env_of(container: &Value) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    match container
        .get("env")
        .or_else(|| container.get("environment"))
    {
        Some(Value::Sequence(list)) => {
            for e in list {
                let name = str_at(e, "name").unwrap_or_default().to_string();
                out.push((name, str_at(e, "value").map(String::from)));
            }
        }
        Some(Value::Mapping(m)) => {
            for (k, v) in m {
                let value = v.as_str().map(String::from).or(Some(format!("{v:?}")));
                out.push((k.as_str().unwrap_or_default().to_string(), value));
            }
        }
        _ => {}
    }
    out
}

/// Loads settings as a container would: `env` plus an optional `--config` file. The URI file
/// (`COUNTERD_MONGODB_URI_FILE`, a mounted Secret) holds the URI of deploy/README.md's
/// `kubectl create secret` command, its placeholder password replaced.
fn load_like(env: &[(String, Option<String>)], file: Option<&str>) -> Result<Settings, String> {
    let dir = tempfile::tempdir().unwrap();
    let config = file.map(|text| {
        let p = dir.path().join("counterd.toml");
        std::fs::write(&p, text).unwrap();
        p
    });
    let uri = secret_from_readme().2.replace("CHANGE_ME", "s3cret");
    let uri_file = dir.path().join("uri");
    std::fs::write(&uri_file, format!("{uri}\n")).unwrap();
    let env = env
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .filter(|(k, _)| k != "COUNTERD_CONFIG")
        .map(|(k, v)| match k.as_str() {
            // Until `mongodb_uri_file` lands (the park branch), the URI itself.
            "COUNTERD_MONGODB_URI_FILE" if !is_setting("mongodb_uri_file") => {
                ("COUNTERD_MONGODB_URI".to_string(), uri.clone())
            }
            "COUNTERD_MONGODB_URI_FILE" => (k, uri_file.display().to_string()),
            _ => (k, v),
        });
    Settings::load(config.as_deref(), env, &[]).map_err(|e| e.to_string())
}

#[test]
fn every_counterd_variable_is_a_setting_and_each_container_loads() {
    if !is_setting("mongodb_uri_file") {
        eprintln!("note: no mongodb_uri_file setting yet: the URI file's content is given as COUNTERD_MONGODB_URI");
    }
    for shape in Shape::all() {
        let containers = shape.counterd();
        assert!(
            !containers.is_empty(),
            "a counterd container in {}",
            shape.name
        );
        for c in containers {
            let env = env_of(c);
            assert!(env.iter().any(|(k, _)| k == "COUNTERD_CONFIG"));
            load_like(&env, Some(shape.settings_file()))
                .unwrap_or_else(|e| panic!("{}: {e}", shape.name));
        }
    }
    let compose = &yaml_docs("deploy/compose.yaml")[0];
    let service = &compose["services"]["counterd"];
    load_like(&env_of(service), None).unwrap_or_else(|e| panic!("compose.yaml: {e}"));
    for line in read("deploy/Dockerfile").lines() {
        if let Some(rest) = line.strip_prefix("ENV ") {
            let (k, v) = rest.split_once('=').expect("ENV name=value");
            load_like(&[(k.into(), Some(v.into()))], None)
                .unwrap_or_else(|e| panic!("Dockerfile: {e}"));
        }
    }
    // Loading rejects unknown names, so the above covers names too.
    assert!(load_like(&[("COUNTERD_NO_SUCH".into(), Some("x".into()))], None).is_err());
}

/// Every YAML file under deploy/kubernetes/.
fn kubernetes_files() -> Vec<String> {
    fn walk(dir: PathBuf, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(p, out);
            } else if p.extension().is_some_and(|x| x == "yaml") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(path("deploy/kubernetes"), &mut out);
    let root = path("");
    let mut rel: Vec<String> = out
        .iter()
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    rel.sort();
    rel
}

/// The mount of a container that holds `file`, and the rest of the path below it.
fn mount_of<'a>(container: &'a Value, file: &str) -> Option<(&'a Value, String)> {
    seq(container.get("volumeMounts"))
        .into_iter()
        .find_map(|m| {
            let dir = str_at(m, "mountPath")?;
            let rest = file.strip_prefix(dir)?.strip_prefix('/')?;
            Some((m, rest.to_string()))
        })
}

fn volume_named<'a>(shape: &'a Shape, name: &str) -> &'a Value {
    shape
        .volumes()
        .into_iter()
        .find(|v| str_at(v, "name") == Some(name))
        .unwrap_or_else(|| panic!("{}: no volume {name}", shape.name))
}

#[test]
fn no_applied_file_holds_a_secret_and_settings_roll_the_pods() {
    let files = kubernetes_files();
    assert!(
        files.len() >= 8,
        "deploy/kubernetes/ files found: {files:?}"
    );
    for f in &files {
        for doc in yaml_docs(f) {
            assert_ne!(
                str_at(&doc, "kind"),
                Some("Secret"),
                "{f}: an applied Secret overwrites the one made out of band"
            );
            assert_ne!(
                str_at(&doc, "kind"),
                Some("ConfigMap"),
                "{f}: a ConfigMap written out does not roll the pods when it changes; generate it"
            );
        }
    }
    let (secret, key, uri) = secret_from_readme();
    assert!(
        uri.contains(":CHANGE_ME@"),
        "deploy/README.md's Secret shows the placeholder counterd refuses: {uri}"
    );
    assert!(
        !uri.contains("directConnection"),
        "a production URI without directConnection (it defeats failover)"
    );
    for shape in Shape::all() {
        for c in shape.counterd() {
            assert_mounted_files(&shape, c, &secret, &key);
        }
    }
}

/// counterd's URI and settings come from mounted files: the URI from the README's Secret's
/// key (never from the environment: `kubectl describe`, /proc/*/environ), the settings from
/// a generated ConfigMap (its name gets the content's hash and kustomize rewrites this
/// reference, so a settings change rolls the pods); every mount read-only.
fn assert_mounted_files(shape: &Shape, c: &Value, secret: &str, key: &str) {
    let env: BTreeMap<String, Option<String>> = env_of(c).into_iter().collect();
    let name = shape.name;
    assert!(
        !env.contains_key("COUNTERD_MONGODB_URI"),
        "{name}: a URI in the environment"
    );
    let file = env["COUNTERD_MONGODB_URI_FILE"].clone().expect("a path");
    let (mount, rest) = mount_of(c, &file).expect("the URI file is mounted");
    let volume = volume_named(shape, str_at(mount, "name").unwrap());
    assert_eq!(
        str_at(&volume["secret"], "secretName"),
        Some(secret),
        "{name}"
    );
    assert_eq!(rest, key, "{name}: the URI file is the Secret's key");
    let file = env["COUNTERD_CONFIG"].clone().expect("a path");
    let (mount, rest) = mount_of(c, &file).expect("the settings file is mounted");
    let volume = volume_named(shape, str_at(mount, "name").unwrap());
    let map = str_at(&volume["configMap"], "name").expect("a ConfigMap volume");
    let generated = shape
        .generated
        .iter()
        .any(|(n, k, _)| n == map && *k == rest);
    assert!(
        generated,
        "{name}: {file} is not a generated ConfigMap's key"
    );
    for m in seq(c.get("volumeMounts")) {
        assert_eq!(
            m["readOnly"].as_bool(),
            Some(true),
            "{name}: read-only mounts"
        );
    }
}

/// Commands in a text: each `counterd` followed by a subcommand or a flag, up to a shell
/// operator or comment; `<placeholder>` words stand for a value.
fn commands_in(text: &str) -> Vec<Vec<String>> {
    let subcommands: Vec<String> = counterd::cli::Cli::command()
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let next = words.get(i + 1).copied().unwrap_or("");
        let flag = next.starts_with("--") && next.len() > 2;
        // `--bin counterd --locked`: an option's value, not a command.
        let value = i > 0 && words[i - 1].starts_with('-') && words[i - 1] != "--";
        if *w != "counterd" || value || !(subcommands.iter().any(|s| s == next) || flag) {
            continue;
        }
        let cmd: Vec<String> = words[i..]
            .iter()
            .take_while(|w| !["|", "&&", ";", "#", "\\"].contains(w) && !w.starts_with('`'))
            .map(|w| w.trim_end_matches([',', ')', '.', '`']).to_string())
            .map(|w| if w.starts_with('<') { "x".into() } else { w })
            .collect();
        out.push(cmd);
    }
    out
}

/// Commands in the `code spans` of a text.
fn commands_in_spans(text: &str) -> Vec<Vec<String>> {
    let spans = text.split('`').skip(1).step_by(2);
    spans.flat_map(commands_in).collect()
}

fn assert_parses(origin: &str, cmd: &[String]) {
    if let Err(e) = counterd::cli::Cli::try_parse_from(cmd) {
        panic!("{origin}: `{}` does not parse:\n{e}", cmd.join(" "));
    }
}

#[test]
fn every_counterd_command_line_parses() {
    let mut seen = 0;
    // The containers: the image's ENTRYPOINT is `counterd`.
    let docker = read("deploy/Dockerfile");
    for key in ["ENTRYPOINT ", "CMD "] {
        let line = docker.lines().find(|l| l.starts_with(key)).expect(key);
        let args: Vec<String> = serde_json::from_str(&line[key.len()..]).expect("exec form");
        if key == "ENTRYPOINT " {
            assert_eq!(args, ["counterd"]);
        } else {
            assert_parses("Dockerfile CMD", &[vec!["counterd".into()], args].concat());
            seen += 1;
        }
    }
    for shape in Shape::all() {
        for c in shape.counterd() {
            let args = strings(c.get("args"));
            assert_parses("kubernetes args", &[vec!["counterd".into()], args].concat());
            seen += 1;
        }
    }
    let compose = &yaml_docs("deploy/compose.yaml")[0]["services"]["counterd"];
    let command = [vec!["counterd".into()], strings(compose.get("command"))].concat();
    assert_parses("compose command", &command);
    // Commands written for people: alert descriptions and deploy/README.md's code.
    for rule in nodes(&yaml_docs("deploy/prometheus/alerts.yaml")[0]) {
        let Some(text) = str_at(rule, "description") else {
            continue;
        };
        for cmd in commands_in_spans(text) {
            assert_parses("alerts.yaml", &cmd);
            seen += 1;
        }
    }
    use pulldown_cmark::{Event, Parser as Markdown, Tag, TagEnd};
    let mut in_code = false;
    for event in Markdown::new(&read("deploy/README.md")) {
        in_code = match &event {
            Event::Start(Tag::CodeBlock(_)) => true,
            Event::End(TagEnd::CodeBlock) => false,
            _ => in_code,
        };
        let code = match event {
            Event::Code(c) => c.to_string(),
            Event::Text(t) if in_code => t.to_string(),
            _ => continue,
        };
        for line in code.lines() {
            for cmd in commands_in(line) {
                assert_parses("deploy/README.md", &cmd);
                seen += 1;
            }
        }
    }
    assert!(seen >= 20, "only {seen} command lines: is the scan blind?");
}

/// Metrics queried that counterd does not export: cAdvisor's (through the kubelet), named in
/// the dashboard as such.
const EXTERNAL_METRICS: [&str; 1] = ["container_spec_memory_limit_bytes"];

/// Metrics being added on another branch (the parked state, issue 38): accepted while
/// `counterd::telemetry::ALL` does not hold them (with a note saying whether the source tree
/// defines them yet), then checked like the others.
const PENDING_METRICS: [&str; 1] = ["counterd_parked"];

/// Whether src/telemetry/mod.rs defines a metric name (a `NAME = "<name>"` entry of its
/// `metric_names!` list).
fn defined_in_source(name: &str) -> bool {
    read("src/telemetry/mod.rs").contains(&format!(" = \"{name}\""))
}

/// Metric names in a PromQL expression.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            ["counterd_", "process_", "container_"]
                .iter()
                .any(|p| w.starts_with(p))
        })
        .map(String::from)
        .collect()
}

fn is_exported(name: &str) -> bool {
    use counterd::telemetry::{ALL, HISTOGRAMS};
    ALL.contains(&name)
        || HISTOGRAMS.iter().any(|(h, _)| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s) == Some(*h))
        })
}

/// Every (origin, expression) of the alert rules and of the dashboard's panels.
fn queries() -> Vec<(String, String)> {
    let mut exprs: Vec<(String, String)> = Vec::new();
    for n in nodes(&yaml_docs("deploy/prometheus/alerts.yaml")[0]) {
        if let (Some(alert), Some(expr)) = (str_at(n, "alert"), str_at(n, "expr")) {
            let desc = n["annotations"]["description"].as_str().unwrap_or("");
            assert!(
                !commands_in_spans(desc).is_empty(),
                "alert {alert}: its description names no `counterd` command to run"
            );
            exprs.push((format!("alert {alert}"), expr.into()));
        }
    }
    // JSON is YAML: the dashboard's panels are walked like the rules.
    for n in &yaml_docs("deploy/grafana/counterd.json") {
        for e in nodes(n).into_iter().filter_map(|p| str_at(p, "expr")) {
            exprs.push(("dashboard".into(), e.into()));
        }
    }
    exprs
}

#[test]
fn rules_and_dashboard_use_exported_metrics() {
    let exprs = queries();
    assert!(exprs.len() >= 40, "alert rules and dashboard panels found");
    let mut used: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (origin, expr) in &exprs {
        for name in metrics_in(expr) {
            let pending = PENDING_METRICS.contains(&name.as_str()) && !is_exported(&name);
            if pending {
                let state = if defined_in_source(&name) {
                    "defined in src/telemetry/mod.rs but not listed in telemetry::ALL"
                } else {
                    "not defined yet"
                };
                eprintln!("note: {origin}: {name} is {state} (pending, issue 38)");
            }
            assert!(
                is_exported(&name) || EXTERNAL_METRICS.contains(&name.as_str()) || pending,
                "{origin}: {name} is not a counterd metric"
            );
            let kind = if origin == "dashboard" {
                "dashboard"
            } else {
                "alerts"
            };
            used.entry(kind.into()).or_default().insert(name);
        }
    }
    for key in [
        "counterd_stream_lag_seconds",
        "counterd_dirty_posts",
        "counterd_drift_comments_sum",
        "counterd_parked",
        "counterd_snapshot_running",
    ] {
        assert!(used["alerts"].contains(key), "{key} is alerted on");
    }
    // What the dashboard must show (issue 40): the initial snapshot's progress and time left,
    // the full sweep after lost history, memory against the budget and the container's limit,
    // and parked streams.
    for key in [
        "counterd_snapshot_rows_scanned",
        "counterd_snapshot_rows_estimated",
        "counterd_snapshot_seconds_left",
        "counterd_snapshot_running",
        "counterd_full_sweep_progress_posts",
        "counterd_sweep_posts_total",
        "counterd_memory_budget_bytes",
        "counterd_memory_in_use_bytes",
        "container_spec_memory_limit_bytes",
        "counterd_parked",
    ] {
        assert!(used["dashboard"].contains(key), "the dashboard shows {key}");
    }
    assert!(metrics_in("rate(counterd_drift_comments_bucket[5m]) by (le)").len() == 1);
    assert!(!is_exported("counterd_events_applied_total_count"));
    assert!(!is_exported("container_spec_memory_limit_bytes"));
    assert!(defined_in_source("counterd_worker_active"));
}

/// The one base of every runbook_url (README: how to set it to where you publish the docs).
const RUNBOOK_BASE: &str = "https://github.com/counterd/counterd/blob/main";

/// Alerts whose runbook section is being written on another branch (docs/runbooks.md, issue
/// 40): accepted without a heading while docs/runbooks.md does not exist yet.
const PENDING_RUNBOOKS: [&str; 1] = ["CounterdParked"];

/// The anchors of a Markdown file's headings (GitHub's: lower case, spaces to dashes,
/// punctuation other than `-` and `_` dropped).
fn anchors(markdown: &str) -> BTreeSet<String> {
    use pulldown_cmark::{Event, Parser as Markdown, Tag, TagEnd};
    let mut out = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Markdown::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let h = heading.take().unwrap_or_default().to_lowercase();
                let slug = h
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                out.insert(slug);
            }
            _ => {}
        }
    }
    out
}

#[test]
fn every_runbook_url_has_the_one_base_and_an_existing_anchor() {
    let runbooks = path("docs/runbooks.md").is_file();
    let headings = anchors(&read(if runbooks {
        "docs/runbooks.md"
    } else {
        "README.md"
    }));
    let mut alerts = 0;
    for rule in nodes(&yaml_docs("deploy/prometheus/alerts.yaml")[0]) {
        let Some(alert) = str_at(rule, "alert") else {
            continue;
        };
        alerts += 1;
        let url = str_at(&rule["annotations"], "runbook_url")
            .unwrap_or_else(|| panic!("{alert} has no runbook_url"));
        let anchor = alert.to_lowercase();
        assert_eq!(
            url,
            format!("{RUNBOOK_BASE}/docs/runbooks.md#{anchor}"),
            "{alert}: its own section of docs/runbooks.md, under the one base"
        );
        // While the runbooks still live in README.md (before docs/runbooks.md exists), the
        // section is looked for there.
        if headings.contains(&anchor) {
            continue;
        }
        let pending = !runbooks && PENDING_RUNBOOKS.contains(&alert);
        assert!(
            pending,
            "{alert}: {} has no heading #{anchor}",
            if runbooks {
                "docs/runbooks.md"
            } else {
                "README.md"
            }
        );
        eprintln!("note: {alert}: no runbook heading yet (docs/runbooks.md is pending)");
    }
    assert!(alerts >= 15, "alerts found: {alerts}");
    assert!(anchors("### CounterdParked\n\n## Health and alerts\n").contains("health-and-alerts"));
    assert!(anchors("# a\n```sh\n# not a heading\n```\n").len() == 1);
}

fn annotation_of<'a>(pod: &'a Value, key: &str) -> Option<&'a str> {
    str_at(&pod["metadata"]["annotations"], key)
}

/// counterd's container runs the image's non-root user, read-only and unprivileged, with a
/// liveness probe that asks only whether the process serves HTTP (200 while parked).
fn assert_container_is_safe(shape: &str, c: &Value, user: &str) {
    let sc = &c["securityContext"];
    let uid = sc["runAsUser"].as_u64().map(|u| u.to_string());
    assert_eq!(
        uid.as_deref(),
        Some(user),
        "{shape}: runAsUser is the image's USER"
    );
    assert_eq!(sc["runAsNonRoot"].as_bool(), Some(true), "{shape}");
    assert_eq!(
        sc["readOnlyRootFilesystem"].as_bool(),
        Some(true),
        "{shape}"
    );
    assert_eq!(
        sc["allowPrivilegeEscalation"].as_bool(),
        Some(false),
        "{shape}"
    );
    let liveness = str_at(&c["livenessProbe"]["httpGet"], "path");
    assert_eq!(liveness, Some("/healthz"), "{shape}: liveness on /healthz");
}

#[test]
fn probes_and_scrapes_use_routed_paths_and_the_pod_is_safe() {
    let routed = counterd::http::ROUTES;
    let mut paths: Vec<String> = Vec::new();
    let user = read("deploy/Dockerfile")
        .lines()
        .find_map(|l| {
            l.strip_prefix("USER ")
                .map(|u| u.split(':').next().unwrap().to_string())
        })
        .expect("USER in the Dockerfile");
    for shape in Shape::all() {
        for c in shape.counterd() {
            paths.extend(
                nodes(c)
                    .into_iter()
                    .filter_map(|n| str_at(n.get("httpGet")?, "path").map(String::from)),
            );
            assert_container_is_safe(shape.name, c, &user);
        }
    }
    // The standalone pod is counterd's own: service links off (a Service named counterd-…
    // would inject COUNTERD_…_SERVICE_HOST, an unknown setting).
    let standalone = Shape::load(SHAPES[2].0, SHAPES[2].1);
    assert_eq!(
        standalone.pod()["spec"]["enableServiceLinks"].as_bool(),
        Some(false)
    );
    let job = counterd_job();
    paths.extend(str_at(&job, "metrics_path").map(String::from));
    for rules in strings(prometheus_config().get("rule_files")) {
        assert!(
            path("deploy/prometheus").join(&rules).is_file(),
            "prometheus.yaml loads {rules}, which is not in deploy/prometheus/"
        );
    }
    let compose = &yaml_docs("deploy/compose.yaml")[0];
    for word in strings(compose["services"]["counterd"]["healthcheck"].get("test")) {
        if let Some((_, rest)) = word.split_once("GET ") {
            paths.extend(rest.split_whitespace().next().map(String::from));
        }
    }
    assert!(paths.len() >= 6, "probes found: {paths:?}");
    for p in &paths {
        assert!(
            routed.contains(&p.as_str()),
            "{p} is not served by counterd"
        );
    }
}

fn prometheus_config() -> Value {
    yaml_docs("deploy/prometheus/prometheus.yaml").remove(0)
}

fn counterd_job() -> Value {
    seq(prometheus_config().get("scrape_configs"))
        .into_iter()
        .find(|j| str_at(j, "job_name") == Some("counterd"))
        .cloned()
        .expect("a counterd scrape job")
}

/// The conventional annotation-driven job (Prometheus' example configuration for Kubernetes,
/// `kubernetes-pods`): pods annotated prometheus.io/scrape: "true", at prometheus.io/port if
/// given (else at each declared port).
const ANNOTATION_JOB: &str = r#"
job_name: kubernetes-pods
relabel_configs:
  - source_labels: [__meta_kubernetes_pod_annotation_prometheus_io_scrape]
    action: keep
    regex: "true"
  - source_labels: [__address__, __meta_kubernetes_pod_annotation_prometheus_io_port]
    action: replace
    regex: ([^:]+)(?::\d+)?;(\d+)
    replacement: $1:$2
    target_label: __address__
"#;

/// Applies a job's relabel_configs to one discovered target, as Prometheus does (regexes
/// anchored at both ends, `;` between source labels, a missing label empty); None: dropped.
fn relabel(job: &Value, mut labels: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    for rule in seq(job.get("relabel_configs")) {
        let sources: Vec<String> = strings(rule.get("source_labels"))
            .iter()
            .map(|l| labels.get(l).cloned().unwrap_or_default())
            .collect();
        let value = sources.join(str_at(rule, "separator").unwrap_or(";"));
        let pattern = str_at(rule, "regex").unwrap_or("(.*)");
        let re = regex::Regex::new(&format!("^(?:{pattern})$")).unwrap();
        match str_at(rule, "action").unwrap_or("replace") {
            "keep" if !re.is_match(&value) => return None,
            "drop" if re.is_match(&value) => return None,
            "keep" | "drop" => {}
            "replace" => {
                if let Some(caps) = re.captures(&value) {
                    let mut out = String::new();
                    caps.expand(str_at(rule, "replacement").unwrap_or("$1"), &mut out);
                    labels.insert(str_at(rule, "target_label").unwrap().into(), out);
                }
            }
            other => panic!("relabel action {other} is not simulated"),
        }
    }
    Some(labels)
}

/// Prometheus' pod discovery: one target per declared container port (init containers'
/// too), with the pod's annotations.
fn discover(
    annotations: &BTreeMap<String, String>,
    containers: &[(&Value, bool)],
) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    for (c, init) in containers {
        for port in seq(c.get("ports")) {
            let number = port["containerPort"].as_u64().unwrap().to_string();
            let mut labels = BTreeMap::from([
                ("__address__".into(), format!("10.0.0.7:{number}")),
                ("__meta_kubernetes_pod_container_port_number".into(), number),
                (
                    "__meta_kubernetes_pod_container_init".into(),
                    init.to_string(),
                ),
            ]);
            if let Some(name) = str_at(port, "name") {
                labels.insert(
                    "__meta_kubernetes_pod_container_port_name".into(),
                    name.into(),
                );
            }
            for (k, v) in annotations {
                let key: String = k
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                labels.insert(format!("__meta_kubernetes_pod_annotation_{key}"), v.clone());
            }
            out.push(labels);
        }
    }
    out
}

/// How many times counterd's port is scraped, by each job, for a pod with these annotations.
fn scrapes_of_counterd(
    shape: &Shape,
    annotations: &BTreeMap<String, String>,
) -> BTreeMap<String, usize> {
    let mut containers: Vec<(&Value, bool)> = Vec::new();
    for doc in shape.docs() {
        let spec = &doc["spec"]["template"]["spec"];
        containers.extend(seq(spec.get("containers")).into_iter().map(|c| (c, false)));
        containers.extend(
            seq(spec.get("initContainers"))
                .into_iter()
                .map(|c| (c, true)),
        );
    }
    let port = shape.counterd()[0]["ports"][0]["containerPort"]
        .as_u64()
        .unwrap();
    let annotation_job: Value = serde_norway::from_str(ANNOTATION_JOB).unwrap();
    let mut out = BTreeMap::new();
    for job in [counterd_job(), annotation_job] {
        let addresses: BTreeSet<String> = discover(annotations, &containers)
            .into_iter()
            .filter_map(|t| relabel(&job, t))
            .map(|t| t["__address__"].clone())
            .collect();
        let hits = addresses
            .iter()
            .filter(|a| a.ends_with(&format!(":{port}")))
            .count();
        let name = str_at(&job, "job_name").unwrap().to_string();
        if name == "counterd" {
            assert!(
                addresses.iter().all(|a| a.ends_with(&format!(":{port}"))),
                "{}: the counterd job scrapes only counterd's port: {addresses:?}",
                shape.name
            );
        }
        out.insert(name, hits);
    }
    out
}

#[test]
fn every_shipped_pod_is_scraped_once() {
    for shape in Shape::all() {
        let written: BTreeMap<String, String> = shape.pod()["metadata"]["annotations"]
            .as_mapping()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.as_str().unwrap().into(), v.as_str().unwrap().into()))
            .collect();
        let scrapes = scrapes_of_counterd(&shape, &written);
        assert_eq!(
            scrapes.values().sum::<usize>(),
            1,
            "{}: counterd's port scraped once by both jobs together: {scrapes:?}",
            shape.name
        );
        assert_eq!(
            scrapes["counterd"], 1,
            "{}: by the counterd job",
            shape.name
        );
        // Annotations an operator might add (or an app's own): still one scrape.
        let port = shape.counterd()[0]["ports"][0]["containerPort"]
            .as_u64()
            .unwrap();
        for extra in [vec![], vec![("prometheus.io/port", port.to_string())]] {
            let mut annotations = written.clone();
            annotations.insert("prometheus.io/scrape".into(), "true".into());
            annotations.remove("prometheus.io/port");
            annotations.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
            let scrapes = scrapes_of_counterd(&shape, &annotations);
            assert_eq!(
                scrapes.values().sum::<usize>(),
                1,
                "{}: with annotations {annotations:?}: {scrapes:?}",
                shape.name
            );
        }
    }
    // The standalone pods carry no scrape annotations at all: the counterd job is the way.
    let standalone = Shape::load(SHAPES[2].0, SHAPES[2].1);
    assert_eq!(
        annotation_of(standalone.pod(), "prometheus.io/scrape"),
        None
    );
}

/// The counterd container a sidecar component adds, and the pod-level keys its patch sets.
fn sidecar_patch(shape: &Shape) -> (&Value, Vec<String>) {
    assert_eq!(shape.patches.len(), 1, "{}: one patch", shape.name);
    let spec = &shape.patches[0]["spec"]["template"]["spec"];
    let keys = spec
        .as_mapping()
        .unwrap()
        .keys()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    (shape.counterd()[0], keys)
}

#[test]
fn the_sidecar_never_takes_its_app_down() {
    let shapes = Shape::all();
    let (native, classic) = (&shapes[0], &shapes[1]);
    for shape in [native, classic] {
        let (c, keys) = sidecar_patch(shape);
        assert!(
            c.get("readinessProbe").is_none() && c.get("startupProbe").is_none(),
            "{}: a sidecar's readiness is its pod's: no readiness or startup gate",
            shape.name
        );
        // The patch adds counterd and its volumes, and changes nothing else of the app's pod
        // (no pod-level securityContext binding the app's containers, no service links).
        let expected = if shape.name.starts_with("native") {
            "initContainers"
        } else {
            "containers"
        };
        assert_eq!(
            keys,
            [expected, "volumes"],
            "{}: pod-level keys",
            shape.name
        );
        assert!(shape.patches[0]["spec"]["template"]
            .get("metadata")
            .is_none());
        assert_eq!(shape.patches[0]["spec"].as_mapping().unwrap().len(), 1);
    }
    let (n, _) = sidecar_patch(native);
    let (c, _) = sidecar_patch(classic);
    assert_eq!(
        str_at(n, "restartPolicy"),
        Some("Always"),
        "a native sidecar"
    );
    let mut n = n.clone();
    n.as_mapping_mut().unwrap().remove("restartPolicy");
    assert_eq!(&n, c, "the classic sidecar's container is the native one's");
    // The example's app keeps its own scrape annotations, which do not name counterd's port.
    let port = n["ports"][0]["containerPort"].as_u64().unwrap().to_string();
    for shape in [native, classic] {
        let own = annotation_of(shape.pod(), "prometheus.io/port");
        assert!(
            own.is_some_and(|p| p != port),
            "{}: the app's annotations",
            shape.name
        );
    }
}

#[test]
fn the_standalone_deployment_keeps_one_replica_through_disruptions() {
    let shape = Shape::load(SHAPES[2].0, SHAPES[2].1);
    let docs = &shape.resources;
    let deployment = of_kind(docs, "Deployment")[0];
    assert_eq!(
        deployment["spec"]["replicas"].as_u64(),
        Some(2),
        "active + standby"
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pdbs = of_kind(docs, "PodDisruptionBudget");
    assert_eq!(pdbs.len(), 1, "a PodDisruptionBudget");
    let selector = &pdbs[0]["spec"]["selector"]["matchLabels"];
    let selects = selector.as_mapping().is_some_and(|m| {
        !m.is_empty()
            && m.iter()
                .all(|(k, v)| labels.get(k.as_str().unwrap()) == Some(v))
    });
    assert!(selects, "the budget selects the Deployment's pods");
    assert_eq!(
        pdbs[0]["spec"]["maxUnavailable"].as_u64(),
        Some(1),
        "evictions one at a time"
    );
    assert_eq!(
        str_at(&pdbs[0]["spec"], "unhealthyPodEvictionPolicy"),
        Some("AlwaysAllow"),
        "a parked (unready) pair never blocks a node drain"
    );
}

/// `# sizing: peak RSS <lo>-<hi> MiB (bench/latest.json phases.memory), memory_budget <b> MiB,
/// request <r>Mi, limit <l>Mi`: the line the manifests carry beside counterd's resources (its
/// format is shared with the README's sizing test).
const SIZING: &str = r"^\s*# sizing: peak RSS (\d+)-(\d+) MiB \(bench/latest\.json phases\.memory\), memory_budget (\d+) MiB, request (\d+)Mi, limit (\d+)Mi$";

/// The lowest and highest peak RSS of the benchmark's memory phase, rounded to MiB.
fn benchmark_peaks() -> (u64, u64) {
    let latest: serde_json::Value = serde_json::from_str(&read("bench/latest.json")).unwrap();
    let peaks: Vec<f64> = latest["phases"]["memory"]
        .as_array()
        .expect("bench/latest.json has a memory phase")
        .iter()
        .map(|r| r["peak_rss_mb"].as_f64().expect("peak_rss_mb"))
        .collect();
    let lo = peaks.iter().copied().fold(f64::MAX, f64::min);
    let hi = peaks.iter().copied().fold(0.0, f64::max);
    (lo.round() as u64, hi.round() as u64)
}

#[test]
fn the_sizing_line_matches_the_benchmark_the_budget_and_the_resources() {
    let re = regex::Regex::new(SIZING).unwrap();
    let (lo, hi) = benchmark_peaks();
    let mut checked = BTreeSet::new();
    for shape in Shape::all() {
        let settings: toml::Table = shape.settings_file().parse().unwrap();
        let budget = settings["memory_budget"]
            .as_integer()
            .expect("memory_budget set") as u64;
        for file in &shape.files {
            let docs = yaml_docs(file);
            let Some(c) = docs.iter().flat_map(counterd_containers).next() else {
                continue;
            };
            let lines: Vec<_> = read(file)
                .lines()
                .filter(|l| l.trim_start().starts_with("# sizing:"))
                .map(String::from)
                .collect();
            assert_eq!(lines.len(), 1, "{file}: one sizing line");
            let caps = re
                .captures(&lines[0])
                .unwrap_or_else(|| panic!("{file}: the sizing line's format: {}", lines[0]));
            let n = |i: usize| caps[i].parse::<u64>().unwrap();
            assert_eq!(
                (n(1), n(2)),
                (lo, hi),
                "{file}: the peaks of bench/latest.json"
            );
            assert_eq!(
                n(3) * 1024 * 1024,
                budget,
                "{file}: the ConfigMap's memory_budget"
            );
            let resources = &c["resources"];
            assert_eq!(
                str_at(&resources["requests"], "memory"),
                Some(&*format!("{}Mi", n(4)))
            );
            assert_eq!(
                str_at(&resources["limits"], "memory"),
                Some(&*format!("{}Mi", n(5)))
            );
            assert!(
                n(5) > n(2) * 2,
                "{file}: the limit leaves room above the peak"
            );
            checked.insert(file.clone());
        }
    }
    assert!(checked.len() >= 3, "sizing lines checked: {checked:?}");
}

#[test]
fn example_settings_file_lists_exactly_the_settings() {
    let text = read("counterd.example.toml");
    let listed: BTreeSet<String> = text
        .parse::<toml::Table>()
        .expect("counterd.example.toml parses")
        .keys()
        .cloned()
        .collect();
    let settings: BTreeSet<String> = match toml::Value::try_from(Settings::default()) {
        Ok(toml::Value::Table(t)) => t.keys().cloned().collect(),
        other => panic!("settings are not a table: {other:?}"),
    };
    assert_eq!(
        listed, settings,
        "counterd.example.toml lists exactly the settings"
    );
    let loaded = Settings::load(Some(&path("counterd.example.toml")), Vec::new(), &[]).unwrap();
    assert_eq!(loaded, Settings::default(), "with their defaults");
}

#[test]
fn the_command_scanner_finds_what_it_should() {
    let found =
        commands_in("kubectl exec deploy/app -c counterd -- counterd dirty --limit 5 | head");
    assert_eq!(found, vec![vec!["counterd", "dirty", "--limit", "5"]]);
    let found = commands_in("docker compose exec counterd counterd reconcile --post <post>");
    assert_eq!(found, vec![vec!["counterd", "reconcile", "--post", "x"]]);
    assert!(commands_in("cargo build --release --bin counterd --locked").is_empty());
    assert!(commands_in("counterd as a sidecar; counterd.toml").is_empty());
    assert!(counterd::cli::Cli::try_parse_from(["counterd", "stauts"]).is_err());
}

/// The image's build context covers the workspace: every member's directory is copied by the
/// builder stage and not excluded by the .dockerignore (cargo cannot load the workspace, and
/// `--locked` fails, without every member's manifest). The full proof, building the binary
/// from exactly what the Dockerfile copies, is `scripts/image-check` in `.ci/run`; this catches
/// a new member in seconds.
#[test]
fn the_image_build_context_holds_every_workspace_member() {
    let manifest: toml::Table = read("Cargo.toml").parse().unwrap();
    let members: Vec<String> = manifest["workspace"]["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m.as_str().map(String::from))
        .filter(|m| m != ".")
        .collect();
    assert!(!members.is_empty());
    let docker = read("deploy/Dockerfile");
    let copied: Vec<String> = docker
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .filter(|l| !l.starts_with("--from"))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.trim_end_matches('/').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    let ignored: Vec<String> = read("deploy/Dockerfile.dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    for member in &members {
        assert!(
            copied
                .iter()
                .any(|c| member == c || member.starts_with(&format!("{c}/"))),
            "deploy/Dockerfile copies no source of workspace member {member} (copies {copied:?})"
        );
        let parts: Vec<&str> = member.split('/').collect();
        for n in 1..=parts.len() {
            let prefix = parts[..n].join("/");
            assert!(
                !ignored.contains(&prefix),
                "deploy/Dockerfile.dockerignore excludes {prefix}, part of workspace member {member}"
            );
        }
    }
    for file in ["Cargo.toml", "Cargo.lock", "src"] {
        assert!(
            copied.iter().any(|c| c == file),
            "the builder copies {file}"
        );
    }
}
