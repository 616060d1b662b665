//! Sizing from one source: the table of docs/sizing.md, the manifests' memory settings and
//! their `# sizing:` lines, the README's figures and the benchmark's files must agree. A new
//! benchmark run, a changed manifest or an edited page that leaves the others behind fails here,
//! naming the figure and what each source says.
//!
//! The `# sizing:` line's format is agreed with the manifests (see deploy/README.md):
//! `# sizing: peak RSS 36-39 MiB (bench/latest.json phases.memory), memory_budget 16 MiB, request 64Mi, limit 96Mi`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn json(path: &str) -> Value {
    serde_json::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `9850` -> `9 850`: thousands apart by a space, as the pages write them.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

fn row(bench: &Value, key: &str) -> f64 {
    bench["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key"] == key)
        .unwrap_or_else(|| panic!("no row {key}"))["value"]
        .as_f64()
        .unwrap()
}

/// Min and max of one figure of the memory phase.
fn memory_range(bench: &Value, field: &str) -> (f64, f64) {
    let values: Vec<f64> = bench["phases"]["memory"]
        .as_array()
        .expect("phases.memory")
        .iter()
        .map(|m| m[field].as_f64().unwrap())
        .collect();
    let min = values.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = values.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// The table of docs/sizing.md: first cell -> value cell.
fn sizing_table() -> Vec<(String, String)> {
    let md = read("docs/sizing.md");
    let start = md
        .find("## The table")
        .expect("docs/sizing.md: ## The table");
    md[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_string(), cells[2].to_string())
        })
        .collect()
}

/// What the manifests set for counterd: memory_budget (bytes), requests, limits, and their
/// `# sizing:` lines (peak lo, peak hi, budget MiB, request Mi, limit Mi).
#[derive(Default, Debug)]
struct Manifests {
    budgets: BTreeSet<u64>,
    requests: BTreeSet<String>,
    limits: BTreeSet<String>,
    sizing_lines: Vec<(String, [u64; 5])>,
}

/// Every file under `dir` whose name ends in one of `extensions`.
fn files(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files(&path, extensions, out);
        } else if path
            .extension()
            .is_some_and(|e| extensions.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// `memory_budget = N` lines of a settings file (a generated ConfigMap's, or one inline).
fn budgets_in(text: &str, found: &mut Manifests) {
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("memory_budget") {
            if let Some(n) = rest.trim().strip_prefix('=') {
                found
                    .budgets
                    .insert(n.trim().parse().expect("memory_budget bytes"));
            }
        }
    }
}

/// Containers named counterd (in `containers` or `initContainers`, a native sidecar) and
/// settings held inline with `memory_budget = N`, anywhere in a YAML document.
fn collect(value: &serde_norway::Value, found: &mut Manifests) {
    use serde_norway::Value as Y;
    match value {
        Y::Mapping(map) => {
            if map.get("name").and_then(Y::as_str) == Some("counterd") {
                if let Some(resources) = map.get("resources") {
                    if let Some(m) = resources["requests"]["memory"].as_str() {
                        found.requests.insert(m.to_string());
                    }
                    if let Some(m) = resources["limits"]["memory"].as_str() {
                        found.limits.insert(m.to_string());
                    }
                }
            }
            for (_, v) in map {
                collect(v, found);
            }
        }
        Y::Sequence(items) => items.iter().for_each(|v| collect(v, found)),
        Y::String(text) => budgets_in(text, found),
        _ => {}
    }
}

/// `# sizing: peak RSS 36-39 MiB (bench/latest.json phases.memory), memory_budget 16 MiB,
/// request 64Mi, limit 96Mi` -> [36, 39, 16, 64, 96].
fn sizing_line(line: &str) -> Option<[u64; 5]> {
    let rest = line.trim().strip_prefix("# sizing: peak RSS ")?;
    let (peak, rest) = rest.split_once(" MiB (bench/latest.json phases.memory), memory_budget ")?;
    let (lo, hi) = peak.split_once('-')?;
    let (budget, rest) = rest.split_once(" MiB, request ")?;
    let (request, limit) = rest.split_once("Mi, limit ")?;
    let limit = limit.strip_suffix("Mi")?;
    Some([
        lo.parse().ok()?,
        hi.parse().ok()?,
        budget.parse().ok()?,
        request.parse().ok()?,
        limit.parse().ok()?,
    ])
}

fn manifests() -> Manifests {
    let dir = root().join("deploy/kubernetes");
    let mut found = Manifests::default();
    // Settings files a kustomize configMapGenerator turns into the ConfigMap.
    let mut settings = Vec::new();
    files(&dir, &["toml"], &mut settings);
    for file in settings {
        budgets_in(&std::fs::read_to_string(&file).unwrap(), &mut found);
    }
    let mut manifests = Vec::new();
    files(&dir, &["yaml", "yml"], &mut manifests);
    for file in manifests {
        let text = std::fs::read_to_string(&file).unwrap();
        for line in text.lines().filter(|l| l.trim().starts_with("# sizing:")) {
            let parsed = sizing_line(line).unwrap_or_else(|| {
                panic!(
                    "{}: a `# sizing:` line not in the agreed format: {line}",
                    file.display()
                )
            });
            found
                .sizing_lines
                .push((file.display().to_string(), parsed));
        }
        for doc in serde_norway::Deserializer::from_str(&text) {
            use serde::Deserialize;
            if let Ok(value) = serde_norway::Value::deserialize(doc) {
                collect(&value, &mut found);
            }
        }
    }
    found
}

/// The one value of a set (every manifest agrees), or a failure naming them all.
fn one<T: Clone + std::fmt::Debug>(what: &str, set: &BTreeSet<T>) -> T {
    assert_eq!(
        set.len(),
        1,
        "the manifests disagree on {what} (or set none): {set:?}"
    );
    set.iter().next().unwrap().clone()
}

#[test]
fn the_table_the_manifests_the_readme_and_the_benchmark_agree() {
    let bench = json("bench/latest.json");
    let oplog = json("bench/oplog-latest.json");
    let m = manifests();
    let budget_mib = one("memory_budget", &m.budgets) / (1024 * 1024);
    let request = one("the memory request", &m.requests);
    let limit = one("the memory limit", &m.limits);
    let (peak_lo, peak_hi) = memory_range(&bench, "peak_rss_mb");
    let peak = format!("{}-{} MiB", peak_lo.round(), peak_hi.round());
    let (rate_lo, rate_hi) = memory_range(&bench, "events_per_sec");
    let hundreds = |x: f64| thousands(((x / 100.0).round() * 100.0) as u64);
    let (cpu_lo, cpu_hi) = memory_range(&bench, "cpu_us_per_event");
    let oplog_row = |key: &str| format!("{} B", thousands(row(&oplog, key).round() as u64));
    let app = &oplog["phases"]["oplog"]["catching_up"];
    let app_bytes = app["application"]["bytes"].as_f64().unwrap() / app["events"].as_f64().unwrap();
    let reconcile = &bench["phases"]["reconcile"];
    let expected: Vec<(&str, String)> = vec![
        ("peak memory of `counterd run` catching up", peak.clone()),
        (
            "`memory_budget` in the manifests",
            format!("{budget_mib} MiB"),
        ),
        (
            "memory request / limit in the manifests",
            format!("{request} / {limit}"),
        ),
        (
            "`counterd run` catching up, events per second",
            format!("{}-{}", hundreds(rate_lo), hundreds(rate_hi)),
        ),
        (
            "`counterd run` CPU per event",
            format!("{}-{} µs", cpu_lo.round(), cpu_hi.round()),
        ),
        (
            "worker alone, events per second",
            thousands(((row(&bench, "worker_rate") / 10.0).round() * 10.0) as u64),
        ),
        (
            "worker CPU per event",
            format!("{:.1} µs", row(&bench, "cpu_per_event")),
        ),
        (
            "write statements per event",
            format!("{:.2}", row(&bench, "statements_per_event")),
        ),
        (
            "counterd's oplog bytes per application event, catching up",
            oplog_row("oplog_bytes_per_event_catch_up"),
        ),
        (
            "counterd's oplog bytes per application event, keeping up",
            oplog_row("oplog_bytes_per_event_live"),
        ),
        (
            "the application's own oplog bytes",
            format!("{} B", app_bytes.round()),
        ),
        (
            "full sweep on the test server",
            format!("{} s", reconcile["sweep_secs"].as_f64().unwrap().round()),
        ),
    ];
    let table = sizing_table();
    let mut wrong = Vec::new();
    for (label, value) in &expected {
        match table.iter().find(|(l, _)| l.starts_with(label)) {
            Some((_, shown)) if shown == value => {}
            Some((_, shown)) => wrong.push(format!(
                "`{label}`: the table says {shown}, the sources {value}"
            )),
            None => wrong.push(format!("`{label}`: no such row in docs/sizing.md's table")),
        }
    }
    // The sweep's row names the size it was measured on.
    let sweep_label = format!(
        "{} posts ({} comments)",
        thousands(reconcile["posts"].as_u64().unwrap()),
        thousands(reconcile["comments"].as_u64().unwrap())
    );
    assert!(
        table.iter().any(|(l, _)| l.contains(&sweep_label)),
        "docs/sizing.md: the sweep's row should say {sweep_label}"
    );
    // The manifests' sizing lines say the same (every shape carries one).
    assert!(
        m.sizing_lines.len() >= 2,
        "no `# sizing:` lines found under deploy/kubernetes: is the scan blind? {m:?}"
    );
    for (file, [lo, hi, budget, req, lim]) in &m.sizing_lines {
        let said = format!("{lo}-{hi} MiB, {budget} MiB, {req}Mi, {lim}Mi");
        let sources = format!("{peak}, {budget_mib} MiB, {request}, {limit}");
        if said != sources {
            wrong.push(format!(
                "{file}'s `# sizing:` line says {said}; the benchmark and the manifest: {sources}"
            ));
        }
    }
    // The README quotes the same figures.
    let readme = read("README.md");
    for figure in [
        &peak,
        &request,
        &limit,
        &oplog_row("oplog_bytes_per_event_catch_up"),
        &oplog_row("oplog_bytes_per_event_live"),
    ] {
        if !readme.contains(figure.as_str()) {
            wrong.push(format!("README.md does not quote {figure}"));
        }
    }
    assert!(wrong.is_empty(), "sizing disagrees:\n{}", wrong.join("\n"));
}

/// The per-collection figures of the oplog table are the benchmark's.
#[test]
fn the_oplog_table_is_the_benchmarks() {
    let oplog = json("bench/oplog-latest.json");
    let md = read("docs/sizing.md");
    for (run, line_start) in [
        ("catching_up", "| catching up"),
        ("keeping_up", "| keeping up"),
    ] {
        let phase = &oplog["phases"]["oplog"][run];
        let events = phase["events"].as_f64().unwrap();
        let line = md
            .lines()
            .find(|l| l.starts_with(line_start))
            .unwrap_or_else(|| panic!("docs/sizing.md: no oplog row {line_start}"));
        for (collection, name) in [
            ("counterd_comment_state", "ledger"),
            ("comment_counters", "counters"),
            ("counterd_dirty", "dirty marks"),
            ("counterd_checkpoints", "checkpoint"),
            ("counterd_carried", "carried batches"),
        ] {
            let Some(bytes) = phase["counterd"][collection]["bytes"].as_f64() else {
                continue;
            };
            let figure = format!("{name} {}", (bytes / events).round());
            assert!(line.contains(&figure), "{run}: `{figure}` in {line}");
        }
    }
}

#[test]
fn the_helpers_read_what_they_should() {
    assert_eq!(thousands(9850), "9 850");
    assert_eq!(thousands(29887), "29 887");
    assert_eq!(thousands(728), "728");
    assert_eq!(
        sizing_line("    # sizing: peak RSS 36-39 MiB (bench/latest.json phases.memory), memory_budget 16 MiB, request 64Mi, limit 96Mi"),
        Some([36, 39, 16, 64, 96])
    );
    assert_eq!(sizing_line("# sizing: about 40 MiB"), None);
}
