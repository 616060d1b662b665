//! Phase M, flat memory: the peak RSS of `counterd run` at its default settings while it
//! catches up a backlog, against the backlog's size (at 2 KB comment bodies) and against the
//! size of the comments (at one backlog size), beside the catch-up rate. Memory is bounded by
//! the budget, so the goal is a flat line: the peaks of the largest and the smallest backlog
//! within 10 % of each other, and every peak within the target.

use std::time::Instant;

use bson::DateTime;
use serde::Serialize;

use crate::harness::{comments, just_before_now, load_with_body, Bench};
use crate::load::{draw_posts, Dist};
use crate::phases::rss::rss_of_counterd_in;
use crate::plan::{Plan, TARGET_FLAT_RSS_MB, TARGET_RSS_SPREAD};
use crate::report::{Row, Status};
use crate::{say, Collected};

/// Comment bodies of the backlog-size axis (the measurement).
const BODY_BYTES: usize = 2048;
/// Comment bodies of the document-size axis.
const BODY_SIZES: [usize; 3] = [256, 2048, 16 * 1024];

/// One catch-up measured.
#[derive(Debug, Serialize)]
pub struct Point {
    pub events: usize,
    pub body_bytes: usize,
    pub peak_rss_mb: Option<f64>,
    pub load_secs: f64,
    pub catch_up_secs: f64,
    pub events_per_sec: f64,
    /// CPU (user + system) of `counterd run` per event, from its start to the last event
    /// applied: the worker, the reconciler, the driver and the runtime.
    pub cpu_us_per_event: Option<f64>,
}

/// Peak RSS of `counterd run` catching up each backlog (a fresh server each).
pub async fn memory_phase(bench: &Bench, plan: &Plan, out: &mut Collected) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let binary = exe.with_file_name("counterd");
    if !binary.is_file() {
        say!(
            "memory: skipped: the phase runs `counterd run`, and {} is not built (cargo build --release -p counterd)",
            binary.display()
        );
        return Ok(());
    }
    let base = plan.events;
    let mut runs: Vec<(usize, usize)> = vec![(base, BODY_BYTES), (base * 3, BODY_BYTES)];
    // The document-size axis on a third of the backlog (16 KB bodies: 1.6 GB at the full
    // size would not fit the fake server's heap).
    let docs = (base / 3).max(1000);
    runs.extend(BODY_SIZES.iter().map(|b| (docs, *b)));
    let mut points = Vec::new();
    for (i, (events, body_bytes)) in runs.into_iter().enumerate() {
        let phase = format!("mem{i}");
        let store = bench.store(&phase).await?;
        let start = just_before_now();
        let posts = draw_posts(Dist::Zipf, events, plan.load_posts, 21 + i as u64)?;
        say!("memory: loading {events} comments with {body_bytes}-byte bodies ...");
        let load_secs =
            load_with_body(&comments(&store), &posts, DateTime::now(), body_bytes).await?;
        drop(posts);
        let started = Instant::now();
        let (_, peak_rss_mb, cpu) =
            rss_of_counterd_in(bench, &binary, start, events, &phase).await?;
        let catch_up_secs = started.elapsed().as_secs_f64();
        bench.drop_db(&store).await;
        let point = Point {
            events,
            body_bytes,
            peak_rss_mb,
            load_secs,
            catch_up_secs,
            events_per_sec: events as f64 / catch_up_secs,
            cpu_us_per_event: cpu.map(|c| c.as_secs_f64() * 1e6 / events as f64),
        };
        say!(
            "memory: {events} events, {body_bytes} B bodies: peak RSS {:?} MB, caught up in {catch_up_secs:.1} s ({:.0} events/s, {:.1} µs CPU per event)",
            peak_rss_mb,
            point.events_per_sec,
            point.cpu_us_per_event.unwrap_or(f64::NAN)
        );
        points.push(point);
    }
    print_table(&points);
    rows(&points, base, out);
    out.phase("memory", &points)?;
    Ok(())
}

/// The table the issue asks for, on stderr with the progress (stdout holds the report).
fn print_table(points: &[Point]) {
    say!("memory: peak RSS of `counterd run` (default settings) catching up a backlog");
    say!(
        "  {:>8}  {:>10}  {:>12}  {:>10}  {:>12}",
        "events",
        "body (B)",
        "peak RSS MB",
        "events/s",
        "CPU µs/event"
    );
    for p in points {
        say!(
            "  {:>8}  {:>10}  {:>12}  {:>10.0}  {:>12}",
            p.events,
            p.body_bytes,
            p.peak_rss_mb.map_or("-".into(), |m| format!("{m:.1}")),
            p.events_per_sec,
            p.cpu_us_per_event.map_or("-".into(), |c| format!("{c:.1}"))
        );
    }
}

fn rows(points: &[Point], base: usize, out: &mut Collected) {
    let peak = |events: usize, body: usize| {
        points
            .iter()
            .find(|p| p.events == events && p.body_bytes == body)
            .and_then(|p| p.peak_rss_mb)
    };
    let target = format!("<= {TARGET_FLAT_RSS_MB:.0} MB");
    for p in points {
        let Some(mb) = p.peak_rss_mb else { continue };
        out.rows.push(
            Row::info(
                &format!("flat_rss_{}_{}", p.events, p.body_bytes),
                &format!(
                    "M. `counterd run` peak RSS, {} events, {} B bodies",
                    p.events, p.body_bytes
                ),
                mb,
                "MB",
            )
            .target(&target, Status::of(mb <= TARGET_FLAT_RSS_MB))
            .note(format!(
                "catch-up {:.0} events/s, {} µs CPU per event",
                p.events_per_sec,
                p.cpu_us_per_event.map_or("-".into(), |c| format!("{c:.1}"))
            )),
        );
    }
    if let (Some(small), Some(large)) = (peak(base, BODY_BYTES), peak(base * 3, BODY_BYTES)) {
        let spread = (large - small).abs() / small;
        out.rows.push(
            Row::info(
                "flat_rss_spread",
                "M. peak RSS, 3x backlog vs 1x (2 KB bodies)",
                large,
                "MB",
            )
            .against(small, &format!("{base} events"))
            .target(
                &format!("within {:.0} %", TARGET_RSS_SPREAD * 100.0),
                Status::of(spread <= TARGET_RSS_SPREAD),
            ),
        );
    }
}
