//! Phase 6, peak memory: of a worker process on its own replaying a backlog (the real `counterd run`
//! when it was built next to this binary, else this binary as a bare worker), and of the bench
//! process itself.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use bson::{DateTime, Timestamp};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{comments, just_before_now, load, phase_timeout, Bench};
use crate::load::{draw_posts, Dist};
use crate::measure::vm_hwm_kb;
use crate::plan::{Plan, TARGET_RSS_MB};
use crate::report::{Row, Status};
use crate::{say, Collected};

#[derive(Debug, Serialize)]
pub struct ChildRss {
    what: String,
    peak_rss_mb: Option<f64>,
    events: usize,
    secs: f64,
}

/// Peak RSS of a worker process replaying a backlog of `plan.events` events.
pub async fn child_rss(bench: &Bench, plan: &Plan) -> anyhow::Result<ChildRss> {
    let n = plan.events;
    let store = bench.store("rss").await?;
    let start = just_before_now();
    let posts = draw_posts(Dist::Zipf, n, plan.load_posts, 14)?;
    load(&comments(&store), &posts, DateTime::now()).await?;
    drop(posts);
    let exe = std::env::current_exe()?;
    let real = exe.with_file_name("counterd");
    let started = Instant::now();
    let result = if real.is_file() {
        say!("rss: `{} run` replays {n} events ...", real.display());
        rss_of_counterd(bench, &real, start, n).await
    } else {
        say!(
            "rss: {} not built; a bare worker child replays {n} events ...",
            real.display()
        );
        rss_of_bare_worker(bench, &exe, start, n).await
    };
    let secs = started.elapsed().as_secs_f64();
    bench.drop_db(&store).await;
    let (what, peak_rss_mb) = result?;
    say!("rss: {what}: {peak_rss_mb:?} MB in {secs:.1} s");
    Ok(ChildRss {
        what,
        peak_rss_mb,
        events: n,
        secs,
    })
}

pub async fn rss_of_counterd(
    bench: &Bench,
    binary: &Path,
    start: Timestamp,
    n: usize,
) -> anyhow::Result<(String, Option<f64>)> {
    let (what, peak, _) = rss_of_counterd_in(bench, binary, start, n, "rss").await?;
    Ok((what, peak))
}

/// [`rss_of_counterd`] on the phase database `phase`, with the CPU time (user + system) the
/// process had used when it had applied the `n` events.
pub async fn rss_of_counterd_in(
    bench: &Bench,
    binary: &Path,
    start: Timestamp,
    n: usize,
    phase: &str,
) -> anyhow::Result<(String, Option<f64>, Option<Duration>)> {
    let mut child = CounterdChild::start(bench, binary, start, phase, &[]).await?;
    child.wait_applied(n).await?;
    let cpu = child.cpu();
    let peak = child.peak_rss_mb();
    let what = child.stop().await;
    Ok((what, peak, cpu))
}

/// A `counterd run` process of the benchmark, reached through its `/metrics`.
pub struct CounterdChild {
    child: tokio::process::Child,
    pid: u32,
    addr: String,
    binary: std::path::PathBuf,
    /// The highest VmHWM seen, KiB.
    peak_kb: Option<u64>,
}

impl CounterdChild {
    /// Starts `binary run` on the phase database `phase`, its stream starting at `start`, with
    /// extra `COUNTERD_*` settings `env`.
    pub async fn start(
        bench: &Bench,
        binary: &Path,
        start: Timestamp,
        phase: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<CounterdChild> {
        let port = counterd_testdb::free_port();
        let addr = format!("127.0.0.1:{port}");
        let start_at = chrono::DateTime::from_timestamp(start.time as i64, 0)
            .ok_or_else(|| anyhow!("bad start time"))?
            .to_rfc3339();
        let child = tokio::process::Command::new(binary)
            .arg("run")
            .env("COUNTERD_MONGODB_URI", bench.uri())
            .env("COUNTERD_DATABASE", bench.db_name(phase))
            .env("COUNTERD_HTTP_ADDR", &addr)
            .env("COUNTERD_START_AT", start_at)
            .env("COUNTERD_LOG_LEVEL", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("counterd exited at once"))?;
        Ok(CounterdChild {
            child,
            pid,
            addr,
            binary: binary.to_path_buf(),
            peak_kb: None,
        })
    }

    /// Waits until the process has applied `n` events (its `counterd_events_applied_total`),
    /// noting its peak RSS meanwhile.
    pub async fn wait_applied(&mut self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + phase_timeout(n);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("`counterd run` exited early ({status})");
            }
            self.peak_kb = vm_hwm_kb(Some(self.pid)).or(self.peak_kb);
            if scrape_applied(&self.addr).await.unwrap_or(0.0) >= n as f64 {
                self.peak_kb = vm_hwm_kb(Some(self.pid)).or(self.peak_kb);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill().await;
                bail!("`counterd run` did not apply {n} events in time");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's `/metrics` text.
    pub async fn metrics(&self) -> Option<String> {
        scrape(&self.addr).await
    }

    /// CPU time (user + system) used so far.
    pub fn cpu(&self) -> Option<Duration> {
        crate::measure::child_cpu(self.pid)
    }

    /// The peak RSS seen, MiB.
    pub fn peak_rss_mb(&self) -> Option<f64> {
        self.peak_kb.map(|kb| kb as f64 / 1024.0)
    }

    /// Stops the process gracefully (SIGTERM); returns what it was, for the report.
    pub async fn stop(mut self) -> String {
        // SIGTERM: the graceful path (std's kill is SIGKILL).
        let _ = std::process::Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status();
        match tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await {
            Ok(Ok(status)) if !status.success() => {
                say!("rss: `counterd run` exited with {status} after SIGTERM");
            }
            Ok(_) => {}
            Err(_) => {
                let _ = self.child.kill().await;
                say!("rss: `counterd run` ignored SIGTERM for 15 s; killed");
            }
        }
        let modified = std::fs::metadata(&self.binary)
            .and_then(|m| m.modified())
            .ok()
            .map(|t| {
                chrono::DateTime::<chrono::Utc>::from(t)
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            })
            .unwrap_or_default();
        format!(
            "`counterd run` (worker + reconciler + HTTP), {} built {modified}",
            self.binary.display()
        )
    }
}

async fn rss_of_bare_worker(
    bench: &Bench,
    exe: &Path,
    start: Timestamp,
    n: usize,
) -> anyhow::Result<(String, Option<f64>)> {
    let output = tokio::time::timeout(
        phase_timeout(n),
        tokio::process::Command::new(exe)
            .arg("--child-worker")
            .arg(bench.uri())
            .arg(bench.db_name("rss"))
            .arg(start.time.to_string())
            .arg(n.to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| anyhow!("the bare worker child did not finish in time"))??;
    if !output.status.success() {
        bail!("the bare worker child failed ({})", output.status);
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix("VMHWM_KB "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    Ok((
        "bare worker (this binary, --child-worker; `counterd` was not built next to it)".into(),
        kb.map(|kb| kb as f64 / 1024.0),
    ))
}

/// `counterd_events_applied_total` from a running `counterd`'s /metrics.
async fn scrape_applied(addr: &str) -> Option<f64> {
    scrape(addr)
        .await?
        .lines()
        .find(|l| l.starts_with("counterd_events_applied_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

/// A running `counterd`'s /metrics text.
async fn scrape(addr: &str) -> Option<String> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
            .await
            .ok()?
            .ok()?;
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    Some(body)
}

/// The memory rows: the worker process on its own, and this process.
pub fn memory_rows(child: &ChildRss, bench_rss_mb: Option<f64>, out: &mut Collected) {
    let target = format!("< {TARGET_RSS_MB:.0} MB");
    out.rows.push(match child.peak_rss_mb {
        Some(mb) => Row::info("worker_rss", "6. worker process peak RSS (VmHWM)", mb, "MB")
            .against(TARGET_RSS_MB, "target")
            .target(&target, Status::of(mb < TARGET_RSS_MB))
            .note(format!("{}, {} events", child.what, child.events)),
        None => Row::info(
            "worker_rss",
            "6. worker process peak RSS (VmHWM)",
            f64::NAN,
            "MB",
        )
        .target(&target, Status::NotJudged)
        .note(format!("not measured: {}", child.what)),
    });
    out.rows.push(
        Row::info(
            "bench_rss",
            "6. bench process peak RSS (worker + load generator)",
            bench_rss_mb.unwrap_or(f64::NAN),
            "MB",
        )
        .note("VmHWM of this process after the throughput phases; holds the load data too"),
    );
}
