//! deploy/ against the binary: the checks only this project can make. The files' own validity
//! is checked by the real tools in `.ci/run` (promtool, kubernetes-validate --strict,
//! check-jsonschema with the compose spec, hadolint). Here, with a real YAML parser
//! (serde_norway) and a Markdown parser (pulldown-cmark):
//!
//! - every `COUNTERD_*` variable given in deploy/ is a setting, and each container's settings
//!   (environment, the ConfigMap's `counterd.toml`, the Secret's URI) load together;
//! - every counterd command line (Dockerfile `CMD`, compose `command`, Kubernetes `args`, and
//!   the commands written in alert descriptions and deploy/README.md) parses with clap;
//! - every metric used by the alert rules and the Grafana dashboard is one counterd exports;
//! - every HTTP path probed or scraped is one counterd routes;
//! - the sidecar never takes its app down: liveness on /healthz, no readiness gate, and the
//!   pod's scrape annotations left to the app (counterd's port is found by name); the
//!   standalone Deployment has two replicas and a disruption budget that selects them;
//! - every Deployment turns Kubernetes service links off, and runs the image's non-root user;
//! - counterd.example.toml lists exactly the settings, with their defaults;
//! - the image's build context holds every workspace member (scripts/image-check builds it).

use std::collections::BTreeSet;
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

/// The Kubernetes examples: the sidecar and the standalone Deployment.
const MANIFESTS: [&str; 2] = [
    "deploy/kubernetes/deployment.yaml",
    "deploy/kubernetes/standalone.yaml",
];

fn deployment() -> Vec<Value> {
    yaml_docs(MANIFESTS[0])
}

fn standalone() -> Vec<Value> {
    yaml_docs(MANIFESTS[1])
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|d| str_at(d, "kind") == Some(kind))
        .collect()
}

/// The pod template of a manifest's Deployment.
fn pod(docs: &[Value]) -> &Value {
    &of_kind(docs, "Deployment").first().expect("a Deployment")["spec"]["template"]
}

/// The counterd containers of the Kubernetes example.
fn k8s_containers(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .flat_map(nodes)
        .filter(|n| str_at(n, "image").is_some_and(|i| i.contains("counterd")))
        .collect()
}

/// (variable, value) pairs a container is given: Kubernetes `env` (a `secretKeyRef` resolves
/// to the Secret's `stringData`; other references give no value) or a compose `environment`.
fn env_of(container: &Value, docs: &[Value]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    match container
        .get("env")
        .or_else(|| container.get("environment"))
    {
        Some(Value::Sequence(list)) => {
            for e in list {
                let name = str_at(e, "name").unwrap_or_default().to_string();
                let value = str_at(e, "value").map(String::from).or_else(|| {
                    let r = e.get("valueFrom")?.get("secretKeyRef")?;
                    docs.iter()
                        .find(|d| {
                            str_at(d, "kind") == Some("Secret")
                                && d.get("metadata").and_then(|m| str_at(m, "name"))
                                    == str_at(r, "name")
                        })?
                        .get("stringData")?
                        .get(str_at(r, "key")?)?
                        .as_str()
                        .map(String::from)
                });
                out.push((name, value));
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

/// Loads settings as a container would: `env` plus an optional `--config` file.
fn load_like(env: &[(String, Option<String>)], file: Option<&str>) -> Result<Settings, String> {
    let dir = tempfile::tempdir().unwrap();
    let config = file.map(|text| {
        let p = dir.path().join("counterd.toml");
        std::fs::write(&p, text).unwrap();
        p
    });
    let env = env
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .filter(|(k, _)| k != "COUNTERD_CONFIG");
    Settings::load(config.as_deref(), env, &[]).map_err(|e| e.to_string())
}

#[test]
fn every_counterd_variable_is_a_setting_and_each_container_loads() {
    for manifest in MANIFESTS {
        let docs = yaml_docs(manifest);
        let configmap = docs
            .iter()
            .find(|d| str_at(d, "kind") == Some("ConfigMap"))
            .and_then(|d| str_at(d.get("data")?, "counterd.toml"))
            .expect("the ConfigMap holds counterd.toml");
        let containers = k8s_containers(&docs);
        assert!(!containers.is_empty(), "a counterd container in {manifest}");
        for c in containers {
            let env = env_of(c, &docs);
            assert!(env.iter().any(|(k, _)| k == "COUNTERD_CONFIG"));
            let settings =
                load_like(&env, Some(configmap)).unwrap_or_else(|e| panic!("{manifest}: {e}"));
            assert!(
                !settings.mongodb_uri.contains("directConnection"),
                "{manifest}: a production URI without directConnection (it defeats failover)"
            );
        }
    }
    let compose = &yaml_docs("deploy/compose.yaml")[0];
    let service = &compose["services"]["counterd"];
    load_like(&env_of(service, &[]), None).unwrap_or_else(|e| panic!("compose.yaml: {e}"));
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
    for c in MANIFESTS
        .iter()
        .flat_map(|m| yaml_docs(m))
        .collect::<Vec<_>>()
        .iter()
    {
        for c in k8s_containers(std::slice::from_ref(c)) {
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

/// Metric names in a PromQL expression.
fn metrics_in(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("counterd_") || w.starts_with("process_"))
        .map(String::from)
        .collect()
}

fn is_exported(name: &str) -> bool {
    use counterd::telemetry::{ALL, HISTOGRAMS};
    ALL.contains(&name)
        || HISTOGRAMS.iter().any(|h| {
            ["_bucket", "_sum", "_count"]
                .iter()
                .any(|s| name.strip_suffix(s) == Some(h))
        })
}

#[test]
fn rules_and_dashboard_use_exported_metrics() {
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
    assert!(exprs.len() >= 25, "alert rules and dashboard panels found");
    let mut used = BTreeSet::new();
    for (origin, expr) in &exprs {
        for name in metrics_in(expr) {
            assert!(
                is_exported(&name),
                "{origin}: {name} is not a counterd metric"
            );
            used.insert(name);
        }
    }
    for key in [
        "counterd_stream_lag_seconds",
        "counterd_dirty_posts",
        "counterd_drift_comments_sum",
    ] {
        assert!(used.contains(key), "{key} is watched");
    }
    assert!(metrics_in("rate(counterd_drift_comments_bucket[5m]) by (le)").len() == 1);
    assert!(!is_exported("counterd_events_applied_total_count"));
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
    for manifest in MANIFESTS {
        let docs = yaml_docs(manifest);
        paths.extend(
            docs.iter()
                .flat_map(nodes)
                .filter_map(|n| str_at(n.get("httpGet")?, "path").map(String::from)),
        );
        let pod = pod(&docs);
        assert_eq!(
            pod["spec"]["enableServiceLinks"].as_bool(),
            Some(false),
            "{manifest}: a Service named counterd would inject COUNTERD_PORT=tcp://… into the pod"
        );
        for c in k8s_containers(&docs) {
            let uid = c["securityContext"]["runAsUser"]
                .as_u64()
                .map(|u| u.to_string());
            assert_eq!(
                uid.as_deref(),
                Some(user.as_str()),
                "{manifest}: runAsUser is the image's USER"
            );
            assert_eq!(
                str_at(&c["livenessProbe"]["httpGet"], "path"),
                Some("/healthz"),
                "{manifest}: liveness asks only whether the process serves HTTP"
            );
        }
    }
    // The standalone pod is counterd's own: its annotations name counterd's port and path.
    let standalone = standalone();
    let own = &pod(&standalone)["metadata"]["annotations"];
    paths.extend(str_at(own, "prometheus.io/path").map(String::from));
    // The Prometheus job finds counterd by its port's name, with a routed path.
    let prometheus = &yaml_docs("deploy/prometheus/prometheus.yaml")[0];
    let job = prometheus["scrape_configs"]
        .as_sequence()
        .and_then(|jobs| {
            jobs.iter()
                .find(|j| str_at(j, "job_name") == Some("counterd"))
        })
        .expect("a counterd scrape job");
    paths.extend(str_at(job, "metrics_path").map(String::from));
    let keep = job["relabel_configs"]
        .as_sequence()
        .and_then(|r| {
            r.iter().find(|r| {
                str_at(r, "action") == Some("keep")
                    && strings(r.get("source_labels"))
                        == ["__meta_kubernetes_pod_container_port_name"]
            })
        })
        .and_then(|r| str_at(r, "regex"))
        .expect("the job keeps a container port by name");
    for manifest in MANIFESTS {
        for c in k8s_containers(&yaml_docs(manifest)) {
            let names: Vec<&str> = c["ports"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|p| str_at(p, "name"))
                .collect();
            assert!(
                names.contains(&keep),
                "{manifest}: the counterd job keeps port {keep}, the container names {names:?}"
            );
        }
    }
    for rules in strings(prometheus.get("rule_files")) {
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

#[test]
fn the_sidecar_never_takes_its_app_down() {
    let docs = deployment();
    for c in k8s_containers(&docs) {
        assert!(
            c.get("readinessProbe").is_none() && c.get("startupProbe").is_none(),
            "the sidecar's readiness is its pod's: no readiness gate (lag is an alert)"
        );
    }
    // The pod's prometheus.io/* annotations are the app's: they do not name counterd's port.
    let counterd_ports: Vec<String> = k8s_containers(&docs)
        .iter()
        .flat_map(|c| c["ports"].as_sequence().into_iter().flatten())
        .filter_map(|p| p["containerPort"].as_u64().map(|n| n.to_string()))
        .collect();
    let annotations = &pod(&docs)["metadata"]["annotations"];
    if let Some(port) = str_at(annotations, "prometheus.io/port") {
        assert!(
            !counterd_ports.iter().any(|p| p == port),
            "prometheus.io/port {port} is counterd's: the app's own scrape would be replaced"
        );
    }
}

#[test]
fn the_standalone_deployment_keeps_one_replica_through_disruptions() {
    let docs = standalone();
    let deployment = of_kind(&docs, "Deployment")[0];
    assert_eq!(
        deployment["spec"]["replicas"].as_u64(),
        Some(2),
        "active + standby"
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let pdbs = of_kind(&docs, "PodDisruptionBudget");
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
