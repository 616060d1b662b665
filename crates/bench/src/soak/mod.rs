//! `counterd-bench --soak DURATION`: a chaos soak. A realistic load runs against `counterd run`
//! (the real binary, through the fault proxy of `counterd-testdb`) for DURATION while one
//! fault a cycle is injected at random (see [`chaos::Kind`]: lost replies, resets, latency,
//! stalls, the server paused, `kill -9` and restarts of counterd, replays and reconciles by
//! hand). Every cycle ends at a caught-up moment (defined in [`check`]), where every counter
//! must equal the truth; the process's RSS, the collections' sizes and a few metric
//! invariants are recorded along the way. Prints a summary and writes it as JSON; exits
//! non-zero when any check failed.

mod chaos;
mod check;
mod load;
mod process;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::anyhow;
use counterd::store::mongo::{Collections, ConnectOptions, MongoStore};
use counterd_testdb::{FaultProxy, TestServer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::say;
use chaos::Kind;
use process::{sample, signal, Counterd, Launch};

/// How long a caught-up moment may take to come after the writers pause and faults are lifted
/// (recovery bound): a few backoffs, an operation timeout, a lease TTL, a backlog to apply.
const CATCH_UP_BOUND: Duration = Duration::from_secs(120);

/// Writers and the rate of each.
const WRITERS: u64 = 2;
const WRITES_PER_SECOND: u64 = 40;

/// What the soak found, printed and written as JSON.
#[derive(Debug, Default, Serialize)]
struct Summary {
    seconds: f64,
    seed: u64,
    server: String,
    /// No `kill -9` and no restarts (`--soak-keep-process`).
    keep_process: bool,
    cycles: u64,
    faults: BTreeMap<String, u64>,
    /// Restarts that met a lost reply to a start-up step.
    startup_faults: u64,
    proxy: ProxyFigures,
    exactness_checks_passed: u64,
    /// Counters the reconciler corrected (none expected: no drift is injected).
    corrections: i64,
    failures: Vec<String>,
    catch_up_secs_max: f64,
    catch_up_secs_median: f64,
    writes: u64,
    failed_writes: u64,
    counterd_lives: u64,
    /// Resident memory of counterd at each caught-up moment: the first and last (of the
    /// process alive then), and the highest.
    rss_mb_first: f64,
    rss_mb_last: f64,
    rss_mb_max: f64,
    /// RSS at caught-up moments of the longest-lived counterd: its first, last and highest
    /// sample (a leak shows as a climb within one life; restarts reset it).
    rss_mb_longest_life: (f64, f64, f64),
    collections_start: BTreeMap<String, u64>,
    collections_end: BTreeMap<String, u64>,
    /// Every tenth cycle: the time, counterd's RSS and the collections' sizes (growth over
    /// time, which the start and end figures alone would hide).
    over_time: Vec<OverTime>,
    metric_scrapes: u64,
}

#[derive(Debug, Serialize)]
struct OverTime {
    secs: f64,
    rss_mb: Option<f64>,
    writes: u64,
    collections: BTreeMap<String, u64>,
}

#[derive(Debug, Default, Serialize)]
struct ProxyFigures {
    dropped_replies: u64,
    reset_requests: u64,
    reset_connections: u64,
    requests: u64,
}

/// Parses `90s`, `2m`, `30m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text:?} (e.g. 90s, 2m, 30m)"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("not a duration: {text:?} (e.g. 90s, 2m, 30m)")),
    };
    Ok(Duration::from_secs(secs))
}

/// Runs the soak for `duration`; `Err` when the soak could not run, `Ok(false)` when a check
/// failed.
///
/// `keep_process`: no `kill -9` and no restarts, so that one `counterd run` lives through the
/// whole soak and its memory over time shows (restarts reset it).
pub async fn soak(
    duration: Duration,
    seed: u64,
    keep_process: bool,
    out: &Path,
) -> anyhow::Result<bool> {
    let started = Instant::now();
    let mut soak = Soak::start(seed).await?;
    soak.kinds = chaos::KINDS
        .into_iter()
        .filter(|k| !keep_process || !matches!(k, Kind::Kill9 | Kind::Restart))
        .collect();
    soak.summary.keep_process = keep_process;
    say!(
        "soak: {duration:?}, seed {seed}, server {}, counterd logs in {}",
        soak.summary.server,
        soak.launch.log_dir.display()
    );
    soak.load.pause().await;
    soak.summary.collections_start = check::sizes(&soak.store).await;
    while started.elapsed() < duration {
        soak.cycle().await?;
        if soak.summary.cycles.is_multiple_of(10) {
            let sample = OverTime {
                secs: started.elapsed().as_secs_f64(),
                rss_mb: soak.counterd.rss_mb(),
                writes: soak.load.writes.load(Ordering::Relaxed),
                collections: check::sizes(&soak.store).await,
            };
            soak.summary.over_time.push(sample);
            say!(
                "soak: cycle {}, {:.0}s, {} checks passed, {} failures, rss {:?} MB, writes {}",
                soak.summary.cycles,
                started.elapsed().as_secs_f64(),
                soak.summary.exactness_checks_passed,
                soak.summary.failures.len(),
                soak.rss.last(),
                soak.load.writes.load(Ordering::Relaxed)
            );
        }
    }
    let summary = soak.finish(started.elapsed()).await;
    print(&summary);
    std::fs::write(out, serde_json::to_string_pretty(&summary)?)?;
    say!("soak: written to {}", out.display());
    Ok(summary.failures.is_empty())
}

/// Everything a soak runs and what it has seen so far.
struct Soak {
    rng: StdRng,
    /// The kinds of fault drawn from.
    kinds: Vec<Kind>,
    /// Kept for its process (dropping it stops the server).
    server: TestServer,
    proxy: FaultProxy,
    /// counterd's own database, reached directly (never through the proxy).
    store: MongoStore,
    launch: Launch,
    counterd: Counterd,
    lives: u64,
    load: Arc<load::Load>,
    writers: Vec<tokio::task::JoinHandle<()>>,
    summary: Summary,
    catch_ups: Vec<f64>,
    rss: Vec<f64>,
    /// RSS samples per process life.
    life_rss: BTreeMap<u64, Vec<f64>>,
    /// The last `counterd_events_applied_total` seen, and of which process.
    last_applied: (u32, f64),
}

impl Soak {
    /// The server, the proxy in front of it, the writers (not writing yet) and the first
    /// `counterd run`.
    async fn start(seed: u64) -> anyhow::Result<Soak> {
        let binary = Launch::binary_beside_this_one()?;
        let server = tokio::task::spawn_blocking(TestServer::start)
            .await?
            .map_err(|e| anyhow!("cannot start the test database: {e}"))?;
        let proxy = FaultProxy::start(&server.uri).map_err(|e| anyhow!("fault proxy: {e}"))?;
        let database = format!("soak_{}", std::process::id());
        let store = MongoStore::connect(&ConnectOptions {
            uri: server.uri.clone(),
            database: database.clone(),
            comments: "comments".into(),
            connect_timeout: Duration::from_secs(10),
            collections: Collections::default(),
            schema: counterd::core::schema::Schema::default(),
        })
        .await?;
        let comments = store.database().collection::<bson::Document>("comments");
        // The collection exists before the first stream opens.
        let seed_row =
            bson::doc! {"_id": "seed", "post_id": 0_i64, "created_at": bson::DateTime::now()};
        comments.insert_one(seed_row).await?;
        comments.delete_one(bson::doc! {"_id": "seed"}).await?;
        let log_dir = std::env::temp_dir().join(format!("counterd-soak-{}", std::process::id()));
        std::fs::create_dir_all(&log_dir)?;
        let launch = Launch {
            binary,
            uri: proxy.uri().to_string(),
            database,
            log_dir,
        };
        let counterd = launch.start(1)?;
        let load = Arc::new(load::Load::default());
        let writers = (0..WRITERS)
            .map(|w| {
                tokio::spawn(load::writer(
                    comments.clone(),
                    load.clone(),
                    seed * 10 + w,
                    WRITES_PER_SECOND,
                ))
            })
            .collect();
        let summary = Summary {
            seed,
            server: format!("{:?}", server.kind),
            ..Summary::default()
        };
        Ok(Soak {
            rng: StdRng::seed_from_u64(seed),
            kinds: chaos::KINDS.to_vec(),
            server,
            proxy,
            store,
            launch,
            counterd,
            lives: 1,
            load,
            writers,
            summary,
            catch_ups: Vec::new(),
            rss: Vec::new(),
            life_rss: BTreeMap::new(),
            last_applied: (0, 0.0),
        })
    }

    fn fail(&mut self, what: String) {
        say!("soak: FAILED: {what}");
        self.summary.failures.push(what);
    }

    /// One cycle: load with one random fault for a few seconds, then the writers pause, the
    /// fault is lifted, and the counters are checked at the caught-up moment.
    async fn cycle(&mut self) -> anyhow::Result<()> {
        self.summary.cycles += 1;
        self.load.resume();
        let kind = self.kinds[self.rng.random_range(0..self.kinds.len())];
        *self.summary.faults.entry(format!("{kind:?}")).or_default() += 1;
        let window = Duration::from_millis(self.rng.random_range(3000..9000));
        let before = Duration::from_millis(self.rng.random_range(500..2000));
        tokio::time::sleep(before).await; // the load flows before the fault
        let (spent, lasts) = self.inject(kind).await?;
        // The fault lasts, the load flows, until the window ends.
        tokio::time::sleep(window.saturating_sub(before + spent).max(lasts)).await;
        self.load.pause().await;
        self.proxy.clear();
        if let Some(status) = self.counterd.exited() {
            let logs = self.launch.log_dir.display().to_string();
            self.fail(format!(
                "cycle {}: counterd run stopped by itself ({status}) after {kind:?}; see {logs}",
                self.summary.cycles
            ));
            self.restart()?;
        }
        self.check(kind).await?;
        self.observe().await;
        Ok(())
    }

    /// Injects one fault; returns how long the injection itself took (a server pause) and how
    /// long the fault lasts from now on (latency, a stall), until [`FaultProxy::clear`].
    async fn inject(&mut self, kind: Kind) -> anyhow::Result<(Duration, Duration)> {
        let cycle = self.summary.cycles;
        match kind {
            Kind::ServerPaused => {
                let Some(pid) = self.server.pid() else {
                    return Ok(Default::default()); // an external server: nothing to pause
                };
                let d = Duration::from_millis(self.rng.random_range(1000..6000));
                signal(pid, "-STOP");
                tokio::time::sleep(d).await;
                signal(pid, "-CONT");
                return Ok((d, Duration::ZERO));
            }
            Kind::Kill9 => {
                self.counterd.kill9();
                self.restart_meeting_a_fault()?;
            }
            Kind::Restart => {
                let code = self.counterd.terminate();
                if code != Some(0) {
                    self.fail(format!("cycle {cycle}: SIGTERM exited {code:?}, not 0"));
                }
                self.restart_meeting_a_fault()?;
            }
            Kind::Replay => {
                let now = chrono::Utc::now().timestamp();
                let from = chrono::DateTime::from_timestamp(now - 20, 0)
                    .expect("a time")
                    .to_rfc3339();
                let args = ["replay", "--from-time", &from, "--force"];
                let (code, said) = self.launch.one_shot(&self.server.uri, &args)?;
                if code != 0 {
                    self.fail(format!("cycle {cycle}: replay exited {code}: {said}"));
                }
            }
            Kind::Reconcile => {
                let args = ["reconcile", "--once"];
                let (code, said) = self.launch.one_shot(&self.server.uri, &args)?;
                if code != 0 {
                    self.fail(format!("cycle {cycle}: reconcile exited {code}: {said}"));
                }
            }
            network => {
                let lasts = chaos::arm(&self.proxy, network, &mut self.rng).unwrap_or_default();
                return Ok((Duration::ZERO, lasts));
            }
        }
        Ok(Default::default())
    }

    /// A new life of `counterd run`, which half the time meets a lost reply while it starts.
    fn restart_meeting_a_fault(&mut self) -> anyhow::Result<()> {
        if chaos::arm_startup(&self.proxy, &mut self.rng) {
            self.summary.startup_faults += 1;
        }
        self.restart()
    }

    /// A new life of `counterd run` in place of the current one (stopped or not).
    fn restart(&mut self) -> anyhow::Result<()> {
        self.lives += 1;
        self.counterd = self.launch.start(self.lives as usize)?;
        Ok(())
    }

    /// The caught-up moment after a cycle, and the counters at it.
    async fn check(&mut self, kind: Kind) -> anyhow::Result<()> {
        let cycle = self.summary.cycles;
        let Some(took) = check::wait_caught_up(&self.store, CATCH_UP_BOUND).await? else {
            let ready = self.counterd.get("/readyz").await;
            self.fail(format!("cycle {cycle}: no caught-up moment within {CATCH_UP_BOUND:?} after {kind:?} (readyz {ready:?})"));
            return Ok(());
        };
        self.catch_ups.push(took.as_secs_f64());
        let bad = check::mismatches(&self.store).await?;
        if bad.is_empty() {
            self.summary.exactness_checks_passed += 1;
        } else {
            let some = &bad[..bad.len().min(5)];
            self.fail(format!("cycle {cycle} after {kind:?}: {} counters differ from the truth (post, displayed, truth): {some:?}", bad.len()));
        }
        let (corrected, drift) = check::corrections(&self.store).await?;
        if corrected > self.summary.corrections {
            let more = corrected - self.summary.corrections;
            self.summary.corrections = corrected;
            self.fail(format!("cycle {cycle} after {kind:?}: the reconciler corrected {more} more counter(s) (total |drift| {drift}): a counter was wrong before a fold hid it"));
        }
        Ok(())
    }

    /// Memory and metric sanity of the process alive now.
    async fn observe(&mut self) {
        let cycle = self.summary.cycles;
        if let Some(mb) = self.counterd.rss_mb() {
            self.rss.push(mb);
            self.life_rss.entry(self.lives).or_default().push(mb);
        }
        let Some((200, scrape)) = self.counterd.get("/metrics").await else {
            return self.fail(format!("cycle {cycle}: /metrics did not answer"));
        };
        self.summary.metric_scrapes += 1;
        let applied = sample(&scrape, "counterd_events_applied_total");
        let pid = self.counterd.pid();
        let (last_pid, last) = self.last_applied;
        if last_pid == pid && applied < last {
            self.fail(format!("cycle {cycle}: counterd_events_applied_total went down within one process ({last} -> {applied})"));
        }
        self.last_applied = (pid, applied);
        for gauge in [
            "counterd_stream_lag_seconds",
            "counterd_dirty_posts",
            "counterd_checkpoint_age_seconds",
        ] {
            let v = sample(&scrape, gauge);
            if !(0.0..1.0e6).contains(&v) {
                self.fail(format!("cycle {cycle}: {gauge} = {v} is not plausible"));
            }
        }
    }

    /// Stops the writers and counterd; the summary.
    async fn finish(mut self, took: Duration) -> Summary {
        self.load.stop.store(true, Ordering::SeqCst);
        self.load.resume();
        for w in std::mem::take(&mut self.writers) {
            let _ = w.await;
        }
        self.summary.collections_end = check::sizes(&self.store).await;
        let code = self.counterd.terminate();
        if code != Some(0) {
            self.fail(format!(
                "the last counterd run exited {code:?} on SIGTERM, not 0"
            ));
        }
        let stats = self.proxy.stats();
        let _ = self.store.database().drop().await;
        let mut s = self.summary;
        s.proxy = ProxyFigures {
            dropped_replies: stats.dropped_replies,
            reset_requests: stats.reset_requests,
            reset_connections: stats.reset_connections,
            requests: stats.requests,
        };
        s.seconds = took.as_secs_f64();
        s.writes = self.load.writes.load(Ordering::Relaxed);
        s.failed_writes = self.load.failed.load(Ordering::Relaxed);
        s.counterd_lives = self.lives;
        s.rss_mb_first = self.rss.first().copied().unwrap_or(0.0);
        s.rss_mb_last = self.rss.last().copied().unwrap_or(0.0);
        s.rss_mb_max = self.rss.iter().copied().fold(0.0, f64::max);
        if let Some(longest) = self.life_rss.values().max_by_key(|v| v.len()) {
            let max = longest.iter().copied().fold(0.0, f64::max);
            s.rss_mb_longest_life = (longest[0], longest[longest.len() - 1], max);
        }
        let mut catch_ups = self.catch_ups;
        catch_ups.sort_by(f64::total_cmp);
        s.catch_up_secs_max = catch_ups.last().copied().unwrap_or(0.0);
        s.catch_up_secs_median = catch_ups.get(catch_ups.len() / 2).copied().unwrap_or(0.0);
        s
    }
}

fn print(s: &Summary) {
    println!(
        "chaos soak: {:.0} s, seed {}, server {}, {} cycles",
        s.seconds, s.seed, s.server, s.cycles
    );
    println!(
        "faults injected by kind: {}",
        s.faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("  at the proxy: {} replies lost, {} requests reset, {} connections reset, {} requests forwarded", s.proxy.dropped_replies, s.proxy.reset_requests, s.proxy.reset_connections, s.proxy.requests);
    println!("exactness checks at caught-up moments: {} passed; failures of any check: {}; catch-up after the fault lifted: median {:.1} s, max {:.1} s", s.exactness_checks_passed, s.failures.len(), s.catch_up_secs_median, s.catch_up_secs_max);
    println!(
        "restarts that met a lost reply while starting: {}",
        s.startup_faults
    );
    println!(
        "reconciler corrections (none expected: no drift is injected): {}",
        s.corrections
    );
    println!(
        "writes: {} ({} failed at the application), counterd lives: {}",
        s.writes, s.failed_writes, s.counterd_lives
    );
    println!("counterd RSS (MB) at caught-up moments: first {:.1}, last {:.1}, max {:.1}; longest life: first {:.1}, last {:.1}, max {:.1}", s.rss_mb_first, s.rss_mb_last, s.rss_mb_max, s.rss_mb_longest_life.0, s.rss_mb_longest_life.1, s.rss_mb_longest_life.2);
    println!("collections at start -> end:");
    for (name, end) in &s.collections_end {
        println!(
            "  {name}: {} -> {end}",
            s.collections_start.get(name).copied().unwrap_or(0)
        );
    }
    println!("metric scrapes checked: {}", s.metric_scrapes);
    for f in &s.failures {
        println!("FAILED: {f}");
    }
}
