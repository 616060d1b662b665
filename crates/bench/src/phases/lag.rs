//! Phase 4, event-to-counter lag at a fixed offered rate: a writer inserts at that rate against a
//! live worker, and every (rate/20)-th insert goes to a fresh probe post whose counter is
//! polled until it shows the comment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use bson::{doc, Bson, DateTime, Document};
use counterd::store::mongo::Collections;
use futures::TryStreamExt;
use serde::Serialize;
use tokio::sync::watch;

use crate::harness::{just_before_now, worker_settings, Bench, Running};
use crate::load::{draw_posts, Dist};
use crate::measure::percentile;
use crate::plan::{Plan, TARGET_LAG_MEDIAN_MS, TARGET_LAG_RATE};
use crate::report::{Row, Status};
use crate::{say, Collected};

#[derive(Debug, Serialize)]
struct Lag {
    offered_rate: u32,
    achieved_rate: f64,
    writer_secs: f64,
    events: usize,
    probes: usize,
    missing: usize,
    median_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    worker_applied: i64,
}

/// Lag at half the worker's measured throughput (where it keeps up), and at the target's
/// 5 000 events/s when the server absorbs the worker's writes at that rate.
pub async fn lag_phase(
    bench: &Bench,
    plan: &Plan,
    worker_rate: f64,
    server_rate: f64,
    out: &mut Collected,
) -> anyhow::Result<()> {
    let half = ((worker_rate * 0.5 / 100.0).floor() * 100.0).max(100.0) as u32;
    let mut rates = vec![("lag_half", half)];
    if server_rate >= TARGET_LAG_RATE as f64 {
        rates.push(("lag_target", TARGET_LAG_RATE));
    }
    for (key, rate) in rates {
        let lag = measure(bench, key, plan, rate).await?;
        out.phase(key, &lag)?;
        let reached = lag.achieved_rate >= 0.95 * rate as f64;
        let note = format!(
            "offered {rate}/s, achieved {:.0}/s for {:.1} s; {} probes, {} not seen within {} s after the writer stopped (counted at that cut-off: lower bounds when any are); worker applied {} of {} events by then",
            lag.achieved_rate, lag.writer_secs, lag.probes, lag.missing, plan.lag_drain_secs, lag.worker_applied, lag.events
        );
        let what = if key == "lag_half" {
            "half the worker's throughput"
        } else {
            "the target rate"
        };
        out.rows.push(
            Row::info(
                &format!("{key}_median"),
                &format!("4. event-to-counter lag, median, at {rate}/s ({what})"),
                lag.median_ms,
                "ms",
            )
            .against(TARGET_LAG_MEDIAN_MS, "target")
            .target(
                &format!("< {TARGET_LAG_MEDIAN_MS:.0} ms"),
                if reached {
                    Status::of(lag.median_ms < TARGET_LAG_MEDIAN_MS)
                } else {
                    Status::NotJudged
                },
            )
            .note(if reached {
                note
            } else {
                format!("{note}; the writer did not reach the offered rate: not judged")
            }),
        );
        out.rows.push(Row::info(
            &format!("{key}_p99"),
            &format!("4. event-to-counter lag, p99, at {rate}/s"),
            lag.p99_ms,
            "ms",
        ));
    }
    if server_rate < TARGET_LAG_RATE as f64 {
        out.rows.push(
            Row::info(
                "lag_target_median",
                &format!("4. event-to-counter lag, median, at {TARGET_LAG_RATE}/s"),
                f64::NAN,
                "ms",
            )
            .target(&format!("< {TARGET_LAG_MEDIAN_MS:.0} ms"), Status::NotJudged)
            .note(format!(
                "not run: this server absorbs the worker's writes at only {server_rate:.0} events/s (bulk baseline), below {TARGET_LAG_RATE}/s"
            )),
        );
    }
    Ok(())
}

/// One writer at `offered` events/s for `plan.lag_secs` against a live worker.
async fn measure(bench: &Bench, phase: &str, plan: &Plan, offered: u32) -> anyhow::Result<Lag> {
    let store = bench.store(phase).await?;
    let db = store.inner().database().clone();
    db.create_collection("comments").await?;
    let comments = db.collection::<Document>("comments");
    let counters = db.collection::<Document>(&Collections::default().counters);
    let mut worker = Running::spawn(store.clone(), worker_settings(plan, just_before_now()));
    let open_by = Instant::now() + Duration::from_secs(30);
    while !worker.status.is_stream_open() {
        if worker.handle.is_finished() || Instant::now() > open_by {
            let _ = worker.stop.send(true);
            let result = (&mut worker.handle).await?;
            bail!("{phase}: the worker did not open its stream: {result:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let rate = offered as f64;
    let total = (rate * plan.lag_secs as f64) as usize;
    let every = (offered as usize / 20).max(1); // ~20 probes per second
    let background = draw_posts(Dist::Zipf, total, plan.load_posts, 13)?;
    let outstanding: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let lags: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (done_tx, done_rx) = watch::channel(false);

    // The sampler: one `$in` query over the outstanding probes every 25 ms.
    let sampler = {
        let (outstanding, lags, counters) = (outstanding.clone(), lags.clone(), counters.clone());
        tokio::spawn(async move {
            loop {
                let ids: Vec<Bson> = outstanding
                    .lock()
                    .expect("probe map")
                    .keys()
                    .map(|k| Bson::String(k.clone()))
                    .collect();
                if ids.is_empty() && *done_rx.borrow() {
                    return Ok::<(), anyhow::Error>(());
                }
                if !ids.is_empty() {
                    let found: Vec<Document> = counters
                        .find(doc! {"_id": {"$in": ids}})
                        .projection(doc! {"base_count": 1, "live_delta": 1})
                        .await?
                        .try_collect()
                        .await?;
                    let now = Instant::now();
                    let mut map = outstanding.lock().expect("probe map");
                    for d in found {
                        if int(&d, "base_count") + int(&d, "live_delta") < 1 {
                            continue;
                        }
                        if let Some(sent) = d.get_str("_id").ok().and_then(|id| map.remove(id)) {
                            lags.lock()
                                .expect("lags")
                                .push((now - sent).as_secs_f64() * 1000.0);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    say!(
        "{phase}: writer at {offered} events/s for {} s ...",
        plan.lag_secs
    );
    let created = DateTime::now();
    let started = Instant::now();
    let mut sent = 0;
    let mut probes = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while sent < total {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as usize).min(total);
        let upto = due.min(sent + 2000);
        if upto <= sent {
            continue;
        }
        let now = Instant::now();
        let docs: Vec<Document> = (sent..upto)
            .map(|i| {
                let post = if i % every == 0 {
                    let id = format!("probe-{i}");
                    outstanding.lock().expect("probe map").insert(id.clone(), now);
                    probes += 1;
                    Bson::String(id)
                } else {
                    Bson::Int64(background[i])
                };
                doc! {"_id": i as i64, "post_id": post, "created_at": created, "t_ms": DateTime::now(), "body": "lag probe"}
            })
            .collect();
        comments.insert_many(docs).await?;
        sent = upto;
    }
    let writer_secs = started.elapsed().as_secs_f64();
    say!(
        "{phase}: writer done, {sent} events in {writer_secs:.1} s ({:.0}/s); waiting for the probes ...",
        sent as f64 / writer_secs
    );
    // Let the worker catch up (bounded), then stop the sampler.
    let cutoff = Instant::now() + Duration::from_secs(plan.lag_drain_secs);
    while !outstanding.lock().expect("probe map").is_empty() && Instant::now() < cutoff {
        if worker.handle.is_finished() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missing: Vec<Instant> = outstanding
        .lock()
        .expect("probe map")
        .drain()
        .map(|(_, t)| t)
        .collect();
    let _ = done_tx.send(true);
    sampler.await??;
    let applied = worker.applied();
    worker.shutdown().await?;
    let mut lags = std::mem::take(&mut *lags.lock().expect("lags"));
    let end = Instant::now();
    lags.extend(missing.iter().map(|t| (end - *t).as_secs_f64() * 1000.0));
    lags.sort_by(f64::total_cmp);
    let lag = Lag {
        offered_rate: offered,
        achieved_rate: sent as f64 / writer_secs,
        writer_secs,
        events: sent,
        probes,
        missing: missing.len(),
        median_ms: percentile(&lags, 0.5),
        p99_ms: percentile(&lags, 0.99),
        max_ms: lags.last().copied().unwrap_or(f64::NAN),
        worker_applied: applied,
    };
    say!(
        "{phase}: median {:.0} ms, p99 {:.0} ms over {} probes",
        lag.median_ms,
        lag.p99_ms,
        lag.probes
    );
    bench.drop_db(&store).await;
    Ok(lag)
}

fn int(d: &Document, field: &str) -> i64 {
    match d.get(field) {
        Some(Bson::Int32(i)) => *i as i64,
        Some(Bson::Int64(i)) => *i,
        Some(Bson::Double(f)) => *f as i64,
        _ => 0,
    }
}
