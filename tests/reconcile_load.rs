//! The reconciler under steady load against the test database: it never invents drift, and the
//! drift it reports is exactly the drift injected by hand, per post and with its sign.
//!
//! For a minute (`COUNTERD_TEST_LOAD_SECS`), a writer inserts comments (most created now, some
//! back-dated) over 50 posts at about 70 writes a second, and soft-deletes, undeletes, moves and
//! hard-deletes comments older than 40 s, with the default settle time (30 s) and bucket width
//! (60 s), while the worker applies the stream, a reconcile runs every few seconds, and now and
//! then a counter's `base_count` is knocked off by hand (each post at most once). Throughout, a
//! sampler compares every counter with the truth consistently with the stream (a post with a
//! change in flight is skipped, never reported): a post never knocked off must always be exact,
//! a knocked-off one off by exactly its injection or exact; and every counter document's `count`
//! equals its `base_count + live_delta`. At the end, a sweep after the
//! writers stop leaves every counter exact, and the corrections reported over the whole run
//! are exactly the injections.
//!
//! Knobs for measuring by hand: `COUNTERD_TEST_LOAD_POSTS`, `COUNTERD_TEST_LOAD_RATE`,
//! `COUNTERD_TEST_RECONCILE_EVERY` (seconds between runs, default 3), `COUNTERD_TEST_LOAD_ZIPF`.
//!
//! The hot-post variant (`COUNTERD_TEST_HOT_LOAD_SECS`, default 45) sends most inserts and most
//! old-row changes to three posts, the counters most people read, and knocks those off first:
//! each hot post keeps rows changing inside every recount's window, and every drift injected
//! into any post must be corrected while the load goes on (the quiet window this replaced
//! never folded such posts until the load stopped).

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use counterd::clock::SystemClock;
use counterd::core::key::GroupValue;
use counterd::reconcile::{self, schedule, Correction, ReconcileSettings, Reconciler};
use counterd::recount::{CatchUp, Recounter};
use mongodb::bson::{doc, DateTime, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{now_secs, TestDb};

/// Posts of the load (`COUNTERD_TEST_LOAD_POSTS`, default 50).
fn posts_n() -> usize {
    load_secs("COUNTERD_TEST_LOAD_POSTS", 50) as usize
}

/// Writes a second (`COUNTERD_TEST_LOAD_RATE`, default 70).
fn rate() -> u32 {
    load_secs("COUNTERD_TEST_LOAD_RATE", 70) as u32
}

/// `COUNTERD_TEST_LOAD_ZIPF=1`: the hot-post variant picks posts by Zipf(1.1) (post 0 the
/// hottest) instead of sending 7 in 10 to three posts, and old rows uniformly; used for the
/// measurements in bench/RESULTS.md (150 writes/s over 500 posts, 120 s).
fn zipf() -> bool {
    std::env::var("COUNTERD_TEST_LOAD_ZIPF").is_ok_and(|v| v == "1")
}

fn post(i: usize) -> GroupValue {
    GroupValue::Int(i as i64)
}

fn load_secs(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Posts that take most of the load in the hot-post variant.
const HOT: usize = 3;

/// A post for a new comment: with `hot`, one of the first [`HOT`] posts seven times in ten.
fn pick_post(rng: &mut StdRng, hot: bool) -> usize {
    use rand_distr::Distribution;
    let n = posts_n();
    if hot && zipf() {
        let z = rand_distr::Zipf::new(n as f64, 1.1).expect("a Zipf distribution");
        return (z.sample(rng) as usize).clamp(1, n) - 1;
    }
    if hot && rng.random_bool(0.7) {
        rng.random_range(0..HOT)
    } else {
        rng.random_range(0..n)
    }
}

/// A comment the writer knows about.
#[derive(Clone)]
struct Comment {
    id: i64,
    post: usize,
    created: i64,
}

/// Writes at about `rate` a second until `until`: inserts (most created now, some back-dated),
/// and soft deletes, undeletes, moves and hard deletes of comments older than 40 s.
async fn writer(
    t: Arc<TestDb>,
    mut rows: Vec<Comment>,
    until: Instant,
    rate: u32,
    hot: bool,
) -> usize {
    let mut rng = StdRng::seed_from_u64(11);
    let mut next_id = 1_000_000;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut writes = 0;
    while Instant::now() < until {
        tick.tick().await;
        let now = now_secs();
        let hot_rows = hot && !zipf() && rng.random_bool(0.7);
        let old: Vec<usize> = (0..rows.len())
            .filter(|i| rows[*i].created < now - 40)
            .filter(|i| !hot_rows || rows[*i].post < HOT)
            .collect();
        let roll = rng.random_range(0..100);
        if roll < 60 || old.is_empty() {
            let created = if roll < 50 {
                now
            } else {
                now - rng.random_range(40..7200)
            };
            let c = Comment {
                id: next_id,
                post: pick_post(&mut rng, hot),
                created,
            };
            next_id += 1;
            t.comments
                .insert_one(doc! {"_id": c.id, "post_id": c.post as i64, "created_at": DateTime::from_millis(c.created * 1000), "body": "load"})
                .await
                .unwrap();
            rows.push(c);
        } else {
            let i = old[rng.random_range(0..old.len())];
            let id = rows[i].id;
            match roll {
                60..=74 => {
                    t.comments
                        .update_one(
                            doc! {"_id": id},
                            doc! {"$set": {"deleted_at": DateTime::now()}},
                        )
                        .await
                        .unwrap();
                }
                75..=86 => {
                    t.comments
                        .update_one(doc! {"_id": id}, doc! {"$unset": {"deleted_at": ""}})
                        .await
                        .unwrap();
                }
                87..=93 => {
                    let to = pick_post(&mut rng, hot);
                    t.comments
                        .update_one(doc! {"_id": id}, doc! {"$set": {"post_id": to as i64}})
                        .await
                        .unwrap();
                    rows[i].post = to;
                }
                _ => {
                    t.comments.delete_one(doc! {"_id": id}).await.unwrap();
                    rows.swap_remove(i);
                }
            }
        }
        writes += 1;
    }
    writes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_false_drift_under_load_and_injected_drift_is_reported_exactly() {
    run_load("load", false, load_secs("COUNTERD_TEST_LOAD_SECS", 60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_posts_fold_while_the_load_goes_on() {
    run_load(
        "hotload",
        true,
        load_secs("COUNTERD_TEST_HOT_LOAD_SECS", 45),
    )
    .await;
}

/// The load, the sampler, the injections and the checks (see the module doc); `hot`: the
/// hot-post variant, which also requires every injection to be corrected during the load.
async fn run_load(name: &str, hot: bool, secs: u64) {
    let t = Arc::new(TestDb::new(name).await);
    let worker = t.spawn_worker(t.worker_settings()).await;
    let posts: Vec<GroupValue> = (0..posts_n()).map(post).collect();

    // Existing comments, created 40 s to 2 h ago, applied by the worker.
    let mut rng = StdRng::seed_from_u64(5);
    let now = now_secs();
    let mut rows = Vec::new();
    for id in 0..1000_i64 {
        rows.push(Comment {
            id,
            post: rng.random_range(0..posts_n()),
            created: now - rng.random_range(45..7200),
        });
    }
    let docs: Vec<Document> = rows
        .iter()
        .map(|c| doc! {"_id": c.id, "post_id": c.post as i64, "created_at": DateTime::from_millis(c.created * 1000)})
        .collect();
    t.comments.insert_many(docs).await.unwrap();
    t.wait_exact(&posts, Duration::from_secs(60)).await;

    let every = Duration::from_secs(load_secs("COUNTERD_TEST_RECONCILE_EVERY", 3));
    let (settle, bucket) = (30, 60);
    let settings = ReconcileSettings {
        settle_secs: settle,
        bucket_width_secs: bucket,
        interval: every,
        ..ReconcileSettings::default()
    };
    let reconciler = Arc::new(Reconciler::new(t.store.clone(), settings.clone()));
    let observer = Recounter::new(
        t.store.clone(),
        Arc::new(SystemClock),
        settings.stream.clone(),
        60,
        CatchUp::default(),
    );

    // The existing comments dirtied their posts before this reconciler existed: one pass
    // folds them first, so that the dirty-to-fold waits measured below are the load's.
    let before_load = reconcile::run_pass(
        std::slice::from_ref(&*reconciler),
        now_secs(),
        DateTime::now(),
        None,
    )
    .await
    .unwrap();
    assert!(
        before_load.iter().all(|r| r.corrections.is_empty()),
        "no drift before any injection: {before_load:?}"
    );

    let until = Instant::now() + Duration::from_secs(secs);
    let writes = tokio::spawn(writer(t.clone(), rows, until, rate(), hot));

    // The daemon's reconcile passes (dirty posts, then a background step) every `every`
    // seconds at a fixed rate, keeping every correction (with when its run ended).
    let corrections: Arc<Mutex<Vec<Correction>>> = Arc::default();
    let corrected_at: Arc<Mutex<BTreeMap<GroupValue, Instant>>> = Arc::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let reconciles = {
        let (reconciler, corrections, stop_rx) =
            (reconciler.clone(), corrections.clone(), stop_rx.clone());
        let corrected_at = corrected_at.clone();
        tokio::spawn(async move {
            let (mut runs, mut folded, mut in_flight, mut longest) = (0, 0, 0, 0);
            let (since, mut elapsed) = (DateTime::now(), Duration::ZERO);
            while !*stop_rx.borrow() {
                tokio::time::sleep(schedule::next_pass_delay(every, 0.0, elapsed)).await;
                let started = Instant::now();
                let reports = reconcile::run_pass(
                    std::slice::from_ref(&*reconciler),
                    now_secs(),
                    since,
                    None,
                )
                .await
                .unwrap();
                elapsed = started.elapsed();
                for report in reports {
                    runs += usize::from(report.summary.kind == "dirty");
                    folded += report.summary.posts;
                    in_flight += report.summary.in_flight;
                    longest = longest.max(report.summary.longest_dirty_to_fold_secs.unwrap_or(0));
                    let mut at = corrected_at.lock().unwrap();
                    for c in &report.corrections {
                        at.entry(c.post.clone()).or_insert_with(Instant::now);
                    }
                    corrections.lock().unwrap().extend(report.corrections);
                }
            }
            (runs, folded, in_flight, longest)
        })
    };

    // Knock a counter off by hand every 4 s (each post at most once; in the hot variant the
    // hot posts first).
    let injected: Arc<Mutex<BTreeMap<GroupValue, i64>>> = Arc::default();
    let injected_at: Arc<Mutex<BTreeMap<GroupValue, Instant>>> = Arc::default();
    let injector = {
        let (t, injected, stop_rx) = (t.clone(), injected.clone(), stop_rx.clone());
        let injected_at = injected_at.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(9);
            let counters = t.db.collection::<Document>("comment_counters");
            // With Zipf: the 10 hottest first, then 10 cold ones (the measurement).
            let mut hot_first: Vec<usize> = match (hot, zipf()) {
                (false, _) => Vec::new(),
                (true, false) => (0..HOT).collect(),
                (true, true) => (posts_n() - 10..posts_n()).chain(0..10).collect(),
            };
            while !*stop_rx.borrow() {
                tokio::time::sleep(Duration::from_secs(4)).await;
                let p = post(
                    hot_first
                        .pop()
                        .unwrap_or_else(|| rng.random_range(0..posts_n())),
                );
                if injected.lock().unwrap().contains_key(&p) {
                    continue;
                }
                let amount = if rng.random_bool(0.5) {
                    rng.random_range(1..=4)
                } else {
                    -rng.random_range(1..=3)
                };
                // Recorded before the edit, so a sampler never sees an edit it cannot explain.
                injected.lock().unwrap().insert(p.clone(), amount);
                let r = counters
                    .update_one(
                        doc! {"_id": p.to_bson()},
                        doc! {"$inc": {"base_count": amount, "count": amount}},
                    )
                    .await
                    .unwrap();
                if r.modified_count == 0 {
                    injected.lock().unwrap().remove(&p);
                } else {
                    injected_at.lock().unwrap().insert(p, Instant::now());
                }
            }
        })
    };

    // Sample every counter against the truth while everything runs.
    let mut samples = 0;
    let mut compared = 0;
    let mut skipped = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let observed = observer.observe(&posts).await.unwrap();
        // Read after the observation: an edit made while it ran (recorded before it is made)
        // may already be in a counter it compared.
        let injected_now = injected.lock().unwrap().clone();
        for o in observed {
            let Some(_) = o.truth else {
                skipped += 1;
                continue;
            };
            compared += 1;
            let off = o.mismatch().map_or(0, |m| m.as_i64());
            let allowed = injected_now.get(&o.post).copied().unwrap_or(0);
            if !(off == 0 || off == allowed) {
                let raw =
                    t.db.collection::<Document>("comment_counters")
                        .find_one(doc! {"_id": o.post.to_bson()})
                        .await
                        .unwrap();
                eprintln!(
                    "MISMATCH {o:?}\n  counter now {raw:?}\n  truth now {}",
                    t.truth(&o.post).await
                );
            }
            assert!(
                off == 0 || off == allowed,
                "post {}: displayed {} is off the truth by {off:+} at a caught-up moment (injected: {allowed:+})",
                o.post,
                o.displayed
            );
        }
        // Readers' field: `count` equals `base_count + live_delta` in every document, always.
        let mut docs =
            t.db.collection::<Document>("comment_counters")
                .find(doc! {})
                .await
                .unwrap();
        use futures::TryStreamExt;
        while let Some(d) = docs.try_next().await.unwrap() {
            let int = |f: &str| {
                d.get(f)
                    .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
            };
            assert_eq!(
                int("count"),
                Some(int("base_count").unwrap_or(0) + int("live_delta").unwrap_or(0)),
                "count is base_count + live_delta in {d}"
            );
        }
        samples += 1;
    }
    let writes = writes.await.unwrap();
    let _ = stop.send(true);
    let (runs, folded, in_flight, longest) = reconciles.await.unwrap();
    injector.await.unwrap();
    let during_load = corrections.lock().unwrap().len();
    // How long each injection waited for its correction during the load (`None`: not
    // corrected before the load stopped).
    let latencies: Vec<(GroupValue, Option<Duration>, Duration)> = {
        let (at, corrected) = (injected_at.lock().unwrap(), corrected_at.lock().unwrap());
        at.iter()
            .map(|(p, when)| {
                let fixed = corrected.get(p).filter(|c| *c >= when);
                (
                    p.clone(),
                    fixed.map(|c| c.duration_since(*when)),
                    until.saturating_duration_since(*when),
                )
            })
            .collect()
    };

    // The writers stopped: once the worker has caught up, a sweep folds every post.
    let swept = reconciler.sweep(now_secs(), |_| {}, None).await.unwrap();
    corrections
        .lock()
        .unwrap()
        .extend(swept.corrections.clone());
    let again = observer.observe(&posts).await.unwrap();
    worker.shutdown().await.unwrap();
    eprintln!(
        "{writes} writes; {runs} reconcile runs folded {folded} posts ({in_flight} left for later: in flight); \
         {samples} samples compared {compared} counters ({skipped} in flight); \
         corrections during load {during_load}, in the final sweep {} (in flight {})",
        swept.corrections.len(),
        swept.summary.in_flight
    );
    let worst = latencies.iter().filter_map(|(_, l, _)| *l).max();
    let hot_latencies: Vec<String> = latencies
        .iter()
        .filter(|(p, _, _)| matches!(p, GroupValue::Int(i) if (*i as usize) < if zipf() { 10 } else { HOT }))
        .map(|(p, l, _)| format!("{p}: {l:?}"))
        .collect();
    // Every change is covered by a fold within settle time + bucket width + 3 intervals (the
    // longest a dirty entry waited for a fold that covered it, as the histogram records it).
    let covered_within = settle + bucket + every.as_secs() as i64 * 3;
    eprintln!("longest wait from dirty to a covering fold: {longest} s (bound {covered_within} s)");
    assert!(
        longest <= covered_within,
        "a dirty post waited {longest} s for a fold (settle + bucket + 3 intervals: {covered_within} s)"
    );
    // The target: within 3 reconcile intervals of the edit, of the injections made at
    // least that long before the load stopped.
    let three = every * 3;
    let judged: Vec<_> = latencies
        .iter()
        .filter(|(_, _, left)| *left >= three)
        .collect();
    eprintln!(
        "injections corrected during the load: {} of {} (slowest {worst:?}; hot posts {hot_latencies:?}); \
         within 3 intervals ({three:?}): {} of {} made that long before the end",
        latencies.iter().filter(|(_, l, _)| l.is_some()).count(),
        latencies.len(),
        judged.iter().filter(|(_, l, _)| l.is_some_and(|l| l <= three)).count(),
        judged.len()
    );
    if hot {
        // Every injection made long enough before the load stopped (settle time, a bucket's
        // rounding and a few reconcile intervals are not needed for a base edit: any fold of
        // the post corrects it) was corrected while the load went on.
        for (p, corrected, left) in &latencies {
            if *left >= Duration::from_secs(15) {
                assert!(
                    corrected.is_some(),
                    "post {p}: knocked off {left:?} before the load stopped and not corrected during it ({latencies:?})"
                );
            }
        }
    }
    assert!(
        writes > 2000,
        "the writer kept up its rate ({writes} writes)"
    );
    // A pass every `every` seconds, each taking a few seconds on a loaded machine.
    assert!(
        runs as u64 >= (secs / (every.as_secs() + 5)).max(5) && folded >= 100,
        "reconciles folded under load ({runs} runs, {folded} posts)"
    );
    assert!(
        compared >= 100,
        "the sampler compared counters under load ({compared})"
    );
    assert_eq!(
        swept.summary.in_flight, 0,
        "the final sweep recounted every post"
    );
    for o in &again {
        assert_eq!(
            o.mismatch(),
            None,
            "post {} after the final sweep: {o:?}",
            o.post
        );
    }

    // Every correction is an injection, with its sign: no more, no less.
    let mut reported: BTreeMap<GroupValue, i64> = BTreeMap::new();
    for c in corrections.lock().unwrap().iter() {
        *reported.entry(c.post.clone()).or_default() += c.drift.as_i64();
    }
    let injected = injected.lock().unwrap().clone();
    assert!(!injected.is_empty(), "drift was injected");
    assert_eq!(
        reported, injected,
        "reported drift per post (left) against injected (right)"
    );
}
