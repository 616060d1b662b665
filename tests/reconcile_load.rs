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

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use counterd::clock::SystemClock;
use counterd::event::PostId;
use counterd::reconcile::{Correction, ReconcileSettings, Reconciler};
use counterd::recount::{CatchUp, Recounter};
use mongodb::bson::{doc, DateTime, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{now_secs, TestDb};

const POSTS: usize = 50;

fn post(i: usize) -> PostId {
    PostId::Int(i as i64)
}

fn load_secs() -> u64 {
    std::env::var("COUNTERD_TEST_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
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
async fn writer(t: Arc<TestDb>, mut rows: Vec<Comment>, until: Instant, rate: u32) -> usize {
    let mut rng = StdRng::seed_from_u64(11);
    let mut next_id = 1_000_000;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut writes = 0;
    while Instant::now() < until {
        tick.tick().await;
        let now = now_secs();
        let old: Vec<usize> = (0..rows.len())
            .filter(|i| rows[*i].created < now - 40)
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
                post: rng.random_range(0..POSTS),
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
                    let to = rng.random_range(0..POSTS);
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
    let t = Arc::new(TestDb::new("load").await);
    let worker = t.spawn_worker(t.worker_settings()).await;
    let posts: Vec<PostId> = (0..POSTS).map(post).collect();

    // Existing comments, created 40 s to 2 h ago, applied by the worker.
    let mut rng = StdRng::seed_from_u64(5);
    let now = now_secs();
    let mut rows = Vec::new();
    for id in 0..1000_i64 {
        rows.push(Comment {
            id,
            post: rng.random_range(0..POSTS),
            created: now - rng.random_range(45..7200),
        });
    }
    let docs: Vec<Document> = rows
        .iter()
        .map(|c| doc! {"_id": c.id, "post_id": c.post as i64, "created_at": DateTime::from_millis(c.created * 1000)})
        .collect();
    t.comments.insert_many(docs).await.unwrap();
    t.wait_exact(&posts, Duration::from_secs(60)).await;

    let settings = ReconcileSettings {
        settle_secs: 30,
        bucket_width_secs: 60,
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

    let until = Instant::now() + Duration::from_secs(load_secs());
    let writes = tokio::spawn(writer(t.clone(), rows, until, 70));

    // Reconcile every 3 s, keeping every correction.
    let corrections: Arc<Mutex<Vec<Correction>>> = Arc::default();
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let reconciles = {
        let (reconciler, corrections, stop_rx) =
            (reconciler.clone(), corrections.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let (mut runs, mut folded, mut in_flight) = (0, 0, 0);
            while !*stop_rx.borrow() {
                tokio::time::sleep(Duration::from_secs(3)).await;
                let report = reconciler.run_dirty(now_secs()).await.unwrap();
                runs += 1;
                folded += report.summary.posts;
                in_flight += report.summary.in_flight;
                corrections.lock().unwrap().extend(report.corrections);
            }
            (runs, folded, in_flight)
        })
    };

    // Knock a counter off by hand every 4 s (each post at most once).
    let injected: Arc<Mutex<BTreeMap<PostId, i64>>> = Arc::default();
    let injector = {
        let (t, injected, stop_rx) = (t.clone(), injected.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(9);
            let counters = t.db.collection::<Document>("comment_counters");
            while !*stop_rx.borrow() {
                tokio::time::sleep(Duration::from_secs(4)).await;
                let p = post(rng.random_range(0..POSTS));
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
        let injected_now = injected.lock().unwrap().clone();
        for o in observer.observe(&posts).await.unwrap() {
            let Some(_) = o.truth else {
                skipped += 1;
                continue;
            };
            compared += 1;
            let off = o.mismatch().unwrap_or(0);
            let allowed = injected_now.get(&o.post).copied().unwrap_or(0);
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
    let (runs, folded, in_flight) = reconciles.await.unwrap();
    injector.await.unwrap();
    let during_load = corrections.lock().unwrap().len();

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
    assert!(
        writes > 2000,
        "the writer kept up its rate ({writes} writes)"
    );
    assert!(
        runs >= 10 && folded >= 100,
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
    let mut reported: BTreeMap<PostId, i64> = BTreeMap::new();
    for c in corrections.lock().unwrap().iter() {
        *reported.entry(c.post.clone()).or_default() += c.drift;
    }
    let injected = injected.lock().unwrap().clone();
    assert!(!injected.is_empty(), "drift was injected");
    assert_eq!(
        reported, injected,
        "reported drift per post (left) against injected (right)"
    );
}
