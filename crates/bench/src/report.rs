//! The results: rows judged against targets, printed as a table on stdout and written as JSON.

use std::path::PathBuf;

use anyhow::Context;
use counterd_testdb::{ServerKind, TestServer};
use serde::Serialize;

use crate::plan::{Args, Plan};
use crate::{say, Collected, START};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Met,
    Missed,
    /// Reported for context; no target.
    Info,
    /// The target could not be judged in this run (the note says why).
    NotJudged,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Met => "MET",
            Status::Missed => "MISSED",
            Status::Info => "-",
            Status::NotJudged => "N/A",
        }
    }

    pub fn of(met: bool) -> Status {
        if met {
            Status::Met
        } else {
            Status::Missed
        }
    }
}

/// One line of the results table: a figure, what it is set against, and the target it meets.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub key: String,
    pub metric: String,
    pub value: f64,
    pub unit: &'static str,
    pub baseline: Option<f64>,
    pub baseline_of: Option<String>,
    pub ratio: Option<f64>,
    pub target: Option<String>,
    pub status: Status,
    pub note: Option<String>,
}

impl Row {
    pub fn info(key: &str, metric: &str, value: f64, unit: &'static str) -> Row {
        Row {
            key: key.into(),
            metric: metric.into(),
            value,
            unit,
            baseline: None,
            baseline_of: None,
            ratio: None,
            target: None,
            status: Status::Info,
            note: None,
        }
    }

    pub fn against(mut self, baseline: f64, of: &str) -> Row {
        self.baseline = Some(baseline);
        self.baseline_of = Some(of.into());
        self.ratio = (baseline != 0.0).then(|| self.value / baseline);
        self
    }

    pub fn target(mut self, text: &str, status: Status) -> Row {
        self.target = Some(text.into());
        self.status = status;
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Row {
        self.note = Some(note.into());
        self
    }
}

/// Everything written to the JSON file.
#[derive(Serialize)]
struct Report {
    date: String,
    command: String,
    machine: Machine,
    server: ServerInfo,
    plan: Plan,
    rows: Vec<Row>,
    phases: serde_json::Map<String, serde_json::Value>,
    total_secs: f64,
}

#[derive(Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    memory_gib: f64,
    arch: &'static str,
    kernel: String,
}

#[derive(Serialize)]
pub struct ServerInfo {
    pub kind: String,
    pub description: String,
    pub version: String,
    pub wire_version: i32,
    /// The fake only: whether its launcher serves `_id`-equality filters from the `_id` index
    /// (`counterd_testdb::FAKE_ID_INDEX_VAR`).
    pub fake_id_index: Option<bool>,
}

/// The table on stdout and the JSON file.
pub fn write_report(
    args: &Args,
    server: ServerInfo,
    plan: Plan,
    out: Collected,
) -> anyhow::Result<()> {
    let report = Report {
        date: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        server,
        plan,
        rows: out.rows,
        phases: out.phases,
        total_secs: START
            .get()
            .map(|s| s.elapsed().as_secs_f64())
            .unwrap_or(0.0),
    };
    print_table(&report);
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let json = serde_json::to_string_pretty(&report)?;
    std::fs::write(&args.out, json + "\n")
        .with_context(|| format!("write {}", args.out.display()))?;
    say!("results written to {}", args.out.display());
    Ok(())
}

pub fn describe_server(server: &TestServer) -> String {
    match server.kind {
        ServerKind::External => "COUNTERD_TEST_MONGODB_URI (external server)".into(),
        ServerKind::Mongod => "throwaway mongod single-node replica set".into(),
        ServerKind::Fake => {
            let dir = std::env::var_os("COUNTERD_TESTDB_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdb"));
            let version = std::fs::read_to_string(dir.join("pom.xml"))
                .ok()
                .and_then(|pom| {
                    let at = pom.find("mongo-java-server-memory-backend")?;
                    let rest = &pom[at..];
                    let from = rest.find("<version>")? + "<version>".len();
                    let to = rest[from..].find("</version>")?;
                    Some(rest[from..from + to].trim().to_string())
                })
                .unwrap_or_else(|| "unknown version".into());
            let planner = if server.fake_id_index() == Some(false) {
                "stock planner"
            } else {
                "_id index for _id-equality filters"
            };
            format!("fake mongo-java-server {version} (in-memory, oplog on, {planner})")
        }
    }
}

fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).trim().to_string())
        .unwrap_or_default();
    let memory_kb: f64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        memory_gib: (memory_kb / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        arch: std::env::consts::ARCH,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
    }
}

fn fmt_num(v: f64, unit: &str) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    let digits = match unit {
        "s" if v < 1.0 => 3,
        "s" | "MB" | "µs/event" | "statements/event" | "writes/event" | "calls" => 2,
        _ => 0,
    };
    format!("{v:.digits$} {unit}")
}

/// The note printed above the table on the fake server: which planner this run's figures
/// come from (issue #16 asks for it next to every figure).
fn planner_note(fake_id_index: Option<bool>) -> Option<&'static str> {
    match fake_id_index {
        Some(true) => Some(
            "note: every figure below was measured with the fake server's launcher (testdb/FakeMongo.java) serving each filter that pins _id by equality from its _id index, as MongoDB does (since 2026-12-03, issue #16); runs before that (bench/RESULTS.md of 2026-12-02) measured full collection scans for every guarded update",
        ),
        Some(false) => Some(
            "note: COUNTERD_TESTDB_ID_INDEX=0: the fake server's stock planner, as in runs before 2026-12-03, so every guarded update scans its collection",
        ),
        None => None,
    }
}

fn print_table(report: &Report) {
    let plan = &report.plan;
    println!();
    println!(
        "counterd-bench ({} mode) on {}: {} events per backlog over {} posts, {} reconcile posts, lag writers for {} s",
        plan.mode, report.server.description, plan.events, plan.load_posts, plan.posts, plan.lag_secs
    );
    if let Some(note) = planner_note(report.server.fake_id_index) {
        println!("{note}");
    }
    let header = ["metric", "value", "baseline", "ratio", "target", "status"];
    let lines: Vec<[String; 6]> = report
        .rows
        .iter()
        .map(|r| {
            [
                r.metric.clone(),
                fmt_num(r.value, r.unit),
                r.baseline
                    .map(|b| fmt_num(b, r.unit))
                    .unwrap_or_else(|| "-".into()),
                r.ratio
                    .map(|x| format!("{x:.3}"))
                    .unwrap_or_else(|| "-".into()),
                r.target.clone().unwrap_or_else(|| "-".into()),
                r.status.label().to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for line in &lines {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let print = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            let pad = w - cell.chars().count();
            if i == 0 || i >= 4 {
                out.push_str(cell);
                out.push_str(&" ".repeat(pad));
            } else {
                out.push_str(&" ".repeat(pad));
                out.push_str(cell);
            }
            out.push_str("  ");
        }
        println!("{}", out.trim_end());
    };
    print(&header.map(String::from));
    print(&widths.map(|w| "-".repeat(w)));
    for line in &lines {
        print(line);
    }
    println!();
    for r in report.rows.iter().filter(|r| r.note.is_some()) {
        println!("  {}: {}", r.key, r.note.as_deref().unwrap_or_default());
    }
    println!();
    for r in report.rows.iter().filter(|r| r.target.is_some()) {
        let by = r
            .ratio
            .map(|x| format!(" (ratio {x:.3})"))
            .unwrap_or_default();
        println!(
            "target {:<8} {}: {} against {}{by}",
            r.status.label(),
            r.key,
            fmt_num(r.value, r.unit),
            r.target.as_deref().unwrap_or_default()
        );
    }
    println!("total time {:.1} s", report.total_secs);
}
