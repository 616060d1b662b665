//! The reconciler against the test database: injected drift is corrected with its sign, only
//! dirty posts are counted, increments racing a run are not lost, and a change in flight while
//! a post is counted is never folded in (the post stays dirty until the worker has applied it).
//! The reconciler's recounts wait for the worker (the quiet window), so a worker runs beside
//! every reconcile here, as in production.

mod support;

use std::sync::Arc;
use std::time::Duration;

use counterd::clock::Clock;
use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::core::num::Num;
use counterd::reconcile::{run_requested_sweeps, ReconcileSettings, Reconciler};
use counterd::store::mongo::MongoStore;
use counterd::store::prelude::*;
use counterd::store::{DirtyOrder, Fence};
use counterd::worker::WorkerSettings;
use mongodb::bson::{doc, DateTime};
use support::{now_secs, post, TestDb};

fn reconciler(t: &TestDb) -> Reconciler<MongoStore> {
    reconciler_on(t.store.clone())
}

/// The tests' reconciler over another store (this test's, counted).
fn reconciler_on<S: Store>(store: Arc<S>) -> Reconciler<S> {
    Reconciler::new(
        store,
        ReconcileSettings {
            settle_secs: 5,
            bucket_width_secs: 60,
            ..ReconcileSettings::default()
        },
    )
}

/// Rows an hour old (below any watermark), applied by a worker, then the worker stopped.
async fn settled_posts(t: &TestDb, posts: usize, per_post: usize) -> Vec<GroupValue> {
    let worker = t.spawn_worker(t.worker_settings()).await;
    let old = now_secs() - 3600;
    let mut n = 0;
    for p in 0..posts {
        for _ in 0..per_post {
            t.insert_comment(format!("c{n}"), &post(p), old).await;
            n += 1;
        }
    }
    let ids: Vec<GroupValue> = (0..posts).map(post).collect();
    t.wait_exact(&ids, Duration::from_secs(30)).await;
    t.wait_drained(Duration::from_secs(30)).await;
    worker.shutdown().await.unwrap();
    ids
}

#[tokio::test]
async fn injected_drift_is_corrected_with_sign_and_size() {
    let t = TestDb::new("drift").await;
    let posts = settled_posts(&t, 4, 5).await;
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    // post-0: live_delta +3 (the seed formula could never fix drift sitting in live_delta);
    // post-1: live_delta -2; post-2: base_count +4; post-3: untouched.
    for (p, update) in [
        (0, doc! {"$inc": {"live_delta": 3}}),
        (1, doc! {"$inc": {"live_delta": -2}}),
        (2, doc! {"$inc": {"base_count": 4}}),
    ] {
        counters
            .update_one(doc! {"_id": post(p).to_bson()}, update)
            .await
            .unwrap();
    }
    assert_eq!(t.displayed(&post(0)).await, 8);
    let worker = t.spawn_worker(t.worker_settings()).await;
    let report = reconciler(&t).run_dirty(now_secs()).await.unwrap();
    worker.shutdown().await.unwrap();
    t.wait_exact(&posts, Duration::from_secs(1)).await;
    let mut drift: Vec<(String, i64, i64, i64)> = report
        .corrections
        .iter()
        .map(|c| {
            let (w, r, d) = (c.wrong.as_i64(), c.right.as_i64(), c.drift.as_i64());
            (c.post.to_string(), w, r, d)
        })
        .collect();
    drift.sort();
    assert_eq!(
        drift,
        vec![
            ("post-0".into(), 8, 5, 3),
            ("post-1".into(), 3, 5, -2),
            ("post-2".into(), 9, 5, 4),
        ]
    );
    let s = &report.summary;
    assert_eq!(
        (
            s.corrected,
            s.total_abs_drift.as_i64(),
            s.max_abs_drift.as_i64(),
            s.drift_high.as_i64(),
            s.drift_low.as_i64()
        ),
        (3, 9, 4, 7, -2)
    );
    let stored = t.store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(stored.last_drift, Some(Num::Int(-2)));
    assert!(stored.reconciled_at.is_some());
    assert!(
        stored.state.buckets.is_empty(),
        "old buckets were folded into base_count"
    );
    assert_eq!(
        (stored.state.base_count, stored.state.live_delta),
        (Num::Int(5), Num::ZERO)
    );
    // The run is recorded for `status`, and the dirty set is empty.
    assert_eq!(t.store.last_run().await.unwrap().unwrap().corrected, 3);
    assert_eq!(t.store.dirty_summary().await.unwrap().size, 0);
}

/// A post with more rows than the recounter may hold ids of is recounted by a count alone (the
/// memory budget's share for recounts bounds what a recount holds, not the post's size), and
/// its drift is still corrected; the ids read stop at the allowance.
#[tokio::test]
async fn a_post_larger_than_the_recounts_share_is_recounted_by_count() {
    let t = TestDb::new("recount_rows").await;
    let posts = settled_posts(&t, 2, 6).await;
    let watermark = now_secs();
    assert_eq!(
        t.store
            .live_ids_below(&post(0), watermark, 6)
            .await
            .unwrap()
            .map(|ids| ids.len()),
        Some(6),
        "six rows fit an allowance of six"
    );
    assert_eq!(
        t.store
            .live_ids_below(&post(0), watermark, 5)
            .await
            .unwrap(),
        None,
        "six rows do not fit five"
    );
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    for p in 0..2 {
        counters
            .update_one(
                doc! {"_id": post(p).to_bson()},
                doc! {"$inc": {"live_delta": 2}},
            )
            .await
            .unwrap();
    }
    let worker = t.spawn_worker(t.worker_settings()).await;
    // Room for one post's ids: the second post of the group is counted alone.
    let reconciler = Reconciler::new(
        t.store.clone(),
        ReconcileSettings {
            settle_secs: 5,
            bucket_width_secs: 60,
            recount_rows: 8,
            ..ReconcileSettings::default()
        },
    );
    let report = reconciler.run_dirty(now_secs()).await.unwrap();
    worker.shutdown().await.unwrap();
    let mut drift: Vec<(String, i64)> = report
        .corrections
        .iter()
        .map(|c| (c.post.to_string(), c.drift.as_i64()))
        .collect();
    drift.sort();
    assert_eq!(drift, vec![("post-0".into(), 2), ("post-1".into(), 2)]);
    t.wait_exact(&posts, Duration::from_secs(1)).await;
}

/// One read for a group of posts finds, for each post, exactly the rows a read of that post
/// alone finds: numbers by value across int, long and double, strings apart from numbers,
/// arrays, soft-deleted rows and rows above the post's own watermark left out.
#[tokio::test]
async fn a_group_read_finds_each_posts_rows_as_a_read_per_post_does() {
    use mongodb::bson::Bson;
    let t = TestDb::new("group_read").await;
    let at = |secs: i64| DateTime::from_millis(secs * 1000);
    let rows = [
        doc! {"_id": 1, "post_id": 8_i32, "created_at": at(100)},
        doc! {"_id": 2, "post_id": 8_i64, "created_at": at(100)},
        doc! {"_id": 3, "post_id": 8.0, "created_at": at(100)},
        doc! {"_id": 4, "post_id": 8.5, "created_at": at(100)},
        doc! {"_id": 5, "post_id": "8", "created_at": at(100)},
        doc! {"_id": 6, "post_id": [8], "created_at": at(100)},
        doc! {"_id": 7, "post_id": 8, "created_at": at(100), "deleted_at": at(150)},
        doc! {"_id": 8, "post_id": 8, "created_at": at(500)},
        doc! {"_id": 9, "post_id": 8},
        doc! {"_id": 10, "post_id": "x", "created_at": at(100)},
        doc! {"_id": 11, "post_id": "x", "created_at": at(900)},
        doc! {"_id": 12, "post_id": 9, "created_at": at(100)},
    ];
    t.comments.insert_many(rows).await.unwrap();
    let wanted = vec![
        (GroupValue::Int(8), 200),
        (GroupValue::Str("8".into()), 200),
        (GroupValue::Str("x".into()), 1000),
        (GroupValue::Int(9), 50),
        (GroupValue::Int(404), 1000),
    ];
    let ids = |read: Vec<counterd::core::event::CommentId>| {
        let mut keys: Vec<Bson> = read.into_iter().map(|c| c.value).collect();
        keys.sort_by_key(|b| b.as_i32());
        keys
    };
    let group = t
        .store
        .live_ids_below_each(&wanted, 100)
        .await
        .unwrap()
        .expect("twelve rows fit");
    let mut alone = Vec::new();
    for (post, watermark) in &wanted {
        let read = t.store.live_ids_below(post, *watermark, 100).await.unwrap();
        alone.push(ids(read.expect("fits")));
    }
    let group: Vec<Vec<Bson>> = group.into_iter().map(ids).collect();
    assert_eq!(group, alone);
    let int = |ns: &[i32]| ns.iter().map(|n| Bson::Int32(*n)).collect::<Vec<_>>();
    assert_eq!(
        group,
        vec![
            int(&[1, 2, 3, 9]),
            int(&[5]),
            int(&[10, 11]),
            int(&[]),
            int(&[])
        ]
    );
    assert_eq!(
        t.store.live_ids_below_each(&wanted, 6).await.unwrap(),
        None,
        "seven rows do not fit six"
    );
}

#[tokio::test]
async fn only_dirty_posts_are_counted() {
    let t = TestDb::new("onlydirty").await;
    let old = DateTime::from_millis((now_secs() - 3600) * 1000);
    let docs: Vec<_> = (0..10_000)
        .map(|i| doc! {"_id": i as i64, "post_id": post(i).to_bson(), "created_at": old})
        .collect();
    for chunk in docs.chunks(2000) {
        t.comments.insert_many(chunk.to_vec()).await.unwrap();
    }
    let dirty: Vec<GroupValue> = (0..10_000).step_by(200).map(post).collect();
    assert_eq!(dirty.len(), 50);
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    t.store
        .mark_dirty(&fence, &marks(&dirty), DateTime::now())
        .await
        .unwrap();
    let counted = t.counted();
    // The rows predate the worker, which takes no initial snapshot here: it never sees them,
    // and the recount installs them. (A stream started "now" on the fake server also delivers
    // the events of the current second: start in the next one.)
    support::next_second().await;
    let settings = WorkerSettings {
        snapshot: counterd::snapshot::SnapshotSettings {
            initial: counterd::config::InitialSnapshot::Never,
            ..Default::default()
        },
        ..t.worker_settings()
    };
    let worker = t.spawn_worker(settings).await;
    let report = reconciler_on(counted.clone())
        .run_dirty(now_secs())
        .await
        .unwrap();
    worker.shutdown().await.unwrap();
    let counts = counted.counts();
    assert_eq!(
        counts.posts_counted, 50,
        "counts only for the 50 dirty posts"
    );
    if !t.store.abilities().await.unwrap().snapshot_reads {
        assert_eq!(
            counts.count_queries, 1,
            "one read for the whole group's rows (a snapshot count is one per post)"
        );
    }
    assert_eq!(report.summary.counts, 50);
    assert_eq!(report.summary.posts, 50);
    // Posts with rows but no counter get one, with the true value.
    assert_eq!(report.summary.corrected, 50);
    for p in &dirty {
        assert_eq!(t.displayed(p).await, 1);
    }
    assert!(
        t.store.read_counter(&post(1)).await.unwrap().is_none(),
        "clean posts untouched"
    );
}

#[tokio::test]
async fn posts_whose_rows_are_gone_go_to_zero() {
    let t = TestDb::new("gone").await;
    let posts = settled_posts(&t, 1, 3).await;
    // The ledger is lost, so the worker cannot attribute the hard deletes: only the reconciler
    // can notice.
    t.db.collection::<mongodb::bson::Document>("counterd_comment_state")
        .delete_many(doc! {})
        .await
        .unwrap();
    t.comments.delete_many(doc! {}).await.unwrap();
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    let worker = t.spawn_worker(t.worker_settings()).await;
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    t.store
        .mark_dirty(&fence, &marks(&posts), DateTime::now())
        .await
        .unwrap();
    let report = reconciler(&t).run_dirty(now_secs()).await.unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(report.summary.drift_high, 3, "{:?}", report.summary);
    let c = counters
        .find_one(doc! {"_id": post(0).to_bson()})
        .await
        .unwrap();
    assert!(c.is_some(), "the counter is kept, not deleted");
    assert_eq!(t.displayed(&post(0)).await, 0);
}

#[tokio::test]
async fn writers_racing_reconcile_lose_no_increment() {
    let t = TestDb::new("racing").await;
    let posts: Vec<GroupValue> = (0..5).map(post).collect();
    let worker = t.spawn_worker(t.worker_settings()).await;
    let rec = Arc::new(reconciler(&t));
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let loop_rec = rec.clone();
    let reconciles = tokio::spawn(async move {
        let mut runs = 0;
        while !*stop_rx.borrow() {
            loop_rec.run_dirty(now_secs()).await.unwrap();
            runs += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        runs
    });
    // Old and new rows, inserts and soft deletes, while reconciles run.
    for i in 0..300 {
        let p = &posts[i % posts.len()];
        let age = if i % 2 == 0 { 3600 } else { 0 };
        t.insert_comment(format!("r{i}"), p, now_secs() - age).await;
        if i % 7 == 0 {
            t.comments
                .update_one(
                    doc! {"_id": format!("r{}", i / 2)},
                    doc! {"$set": {"deleted_at": DateTime::now()}},
                )
                .await
                .unwrap();
        }
    }
    let _ = stop.send(true);
    let runs = reconciles.await.unwrap();
    assert!(runs >= 2, "reconcile ran during the writes ({runs} runs)");
    // Writers stopped: the worker catches up (exact and settled), then one more run completes
    // and must leave every counter exact.
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    rec.run_dirty(now_secs()).await.unwrap();
    assert_eq!(
        t.mismatches(&posts).await,
        vec![],
        "a reconcile broke a counter"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_change_in_flight_is_never_folded_in() {
    let t = TestDb::new("race").await;
    let posts = settled_posts(&t, 1, 4).await;
    // The soft delete of an old row commits, but the worker (stopped) has not applied it yet
    // when the reconciler counts: the count already excludes the row. Installing it would
    // count the delete twice once the worker applies it (the false drift the seed showed).
    t.comments
        .update_one(
            doc! {"_id": "c0"},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await
        .unwrap();
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    t.store
        .mark_dirty(&fence, &marks(&posts), DateTime::now())
        .await
        .unwrap();
    let quick = Reconciler::new(
        t.store.clone(),
        ReconcileSettings {
            settle_secs: 5,
            catch_up: counterd::recount::CatchUp {
                timeout: Duration::from_millis(500),
                poll: Duration::from_millis(50),
                probe_without_worker: true,
            },
            ..ReconcileSettings::default()
        },
    );
    let first = quick.run_dirty(now_secs()).await.unwrap();
    assert_eq!(
        (first.summary.corrected, first.summary.in_flight),
        (0, 1),
        "the worker has not applied what the count saw: nothing is installed"
    );
    assert_eq!(t.displayed(&post(0)).await, 4, "the counter is untouched");
    let dirty = t
        .store
        .dirty_list(None, DirtyOrder::Oldest, 10)
        .await
        .unwrap();
    assert_eq!(dirty.len(), 1, "and the post stays dirty");
    // The worker applies the delete itself: exact, with no correction anywhere.
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    let second = reconciler(&t).run_dirty(now_secs()).await.unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(
        (second.summary.corrected, second.summary.posts),
        (0, 1),
        "the next run finds nothing to correct: {:?}",
        second.summary
    );
    assert_eq!(t.store.dirty_summary().await.unwrap().size, 0);
    t.wait_exact(&posts, Duration::from_secs(1)).await;
}

/// Dirty marks for changes to settled rows of these posts.
fn marks(posts: &[GroupValue]) -> Vec<counterd::core::batch::DirtyMark> {
    posts
        .iter()
        .map(|p| CounterKey::new(CounterIx::DEFAULT, p.clone()))
        .map(counterd::core::batch::DirtyMark::settled)
        .collect()
}

/// A reconciler with small buckets and settle time, so the watermark passes new rows in seconds.
fn quick_buckets(t: &TestDb) -> Reconciler<MongoStore> {
    Reconciler::new(
        t.store.clone(),
        ReconcileSettings {
            settle_secs: 1,
            bucket_width_secs: 2,
            background_pass: Some(Duration::from_secs(1)),
            interval: Duration::from_secs(1),
            ..ReconcileSettings::default()
        },
    )
}

#[tokio::test]
async fn a_post_stays_dirty_until_a_fold_covers_its_newest_change() {
    let t = TestDb::new("newest").await;
    // The worker files deltas under the reconciler's (small) buckets.
    let worker = t
        .spawn_worker(WorkerSettings {
            bucket_width_secs: 2,
            ..t.worker_settings()
        })
        .await;
    let p = post(0);
    for i in 0..5 {
        t.insert_comment(format!("n{i}"), &p, now_secs()).await;
    }
    t.wait_exact(std::slice::from_ref(&p), Duration::from_secs(20))
        .await;
    // Drift in the new rows' bucket (and live_delta), which no watermark covers yet.
    let counter = t.store.read_counter(&p).await.unwrap().unwrap();
    let bucket = *counter.state.buckets.keys().next_back().unwrap();
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(
            doc! {"_id": p.to_bson()},
            doc! {"$inc": {"live_delta": 3, format!("live_by_bucket.{bucket}"): 3}},
        )
        .await
        .unwrap();
    let rec = quick_buckets(&t);
    let first = rec.run_dirty(now_secs() - 30).await.unwrap();
    assert_eq!(
        (first.summary.corrected, first.summary.waiting),
        (0, 1),
        "folded below an old watermark, kept dirty: {:?}",
        first.summary
    );
    assert_eq!(t.store.dirty_summary().await.unwrap().size, 1);
    // Once the watermark passes the rows' bucket, the fold corrects the drift and clears the post.
    let mut corrected = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while t.store.dirty_summary().await.unwrap().size > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the post never left the dirty set"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let run = rec.run_dirty(now_secs()).await.unwrap();
        corrected += run.summary.drift_high.as_i64();
    }
    worker.shutdown().await.unwrap();
    assert_eq!(
        corrected, 3,
        "the drift in the new bucket was found, with its sign"
    );
    assert_eq!(t.displayed(&p).await, 5);
}

#[tokio::test]
async fn the_background_sweep_finds_drift_no_event_points_at() {
    let t = TestDb::new("background").await;
    let posts = settled_posts(&t, 6, 2).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    let rec = quick_buckets(&t);
    rec.run_dirty(now_secs()).await.unwrap();
    assert_eq!(t.store.dirty_summary().await.unwrap().size, 0);
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    // Nobody comments on post-4 any more; its counter is edited by hand, and post-5's deleted.
    counters
        .update_one(
            doc! {"_id": post(4).to_bson()},
            doc! {"$inc": {"base_count": -2}},
        )
        .await
        .unwrap();
    counters
        .delete_one(doc! {"_id": post(5).to_bson()})
        .await
        .unwrap();
    assert_eq!(
        rec.run_dirty(now_secs()).await.unwrap().summary.posts,
        0,
        "nothing is dirty"
    );
    // Paced to a one-second pass with one-second steps: each step takes a window of posts.
    let mut drift = Vec::new();
    for _ in 0..4 {
        let report = rec
            .background_step(now_secs(), false)
            .await
            .unwrap()
            .unwrap();
        drift.extend(
            report
                .corrections
                .iter()
                .map(|c| (c.post.clone(), c.drift.as_i64())),
        );
    }
    worker.shutdown().await.unwrap();
    drift.sort();
    assert_eq!(drift, vec![(post(4), -2), (post(5), -2)]);
    t.wait_exact(&posts, Duration::from_secs(1)).await;
    let cursor = t
        .store
        .load_sweep_cursor("comments")
        .await
        .unwrap()
        .unwrap();
    assert!(
        cursor.passes >= 1,
        "a pass completed and was recorded: {cursor:?}"
    );
}

#[tokio::test]
async fn a_pass_with_time_to_spare_sweeps_a_whole_window_at_the_default_pace() {
    let t = TestDb::new("spare").await;
    let posts = settled_posts(&t, 6, 2).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    // The default background pace (a pass a day: one post per step here), and an interval
    // long enough that a pass with no dirty post has time to spare on any machine.
    let rec = Reconciler::new(
        t.store.clone(),
        ReconcileSettings {
            settle_secs: 1,
            bucket_width_secs: 2,
            interval: Duration::from_secs(120),
            ..ReconcileSettings::default()
        },
    );
    let since = DateTime::now();
    rec.run_dirty(now_secs()).await.unwrap();
    assert_eq!(t.store.dirty_summary().await.unwrap().size, 0);
    // Nobody comments on post-5 any more (the last post of the pass); its counter is edited.
    t.db.collection::<mongodb::bson::Document>("comment_counters")
        .update_one(
            doc! {"_id": post(5).to_bson()},
            doc! {"$inc": {"base_count": 3}},
        )
        .await
        .unwrap();
    let reports =
        counterd::reconcile::run_pass(std::slice::from_ref(&rec), now_secs(), since, None)
            .await
            .unwrap();
    worker.shutdown().await.unwrap();
    let background: Vec<_> = reports
        .iter()
        .filter(|r| r.summary.kind == "background")
        .collect();
    assert_eq!(background.len(), 1, "one background step: {reports:?}");
    assert_eq!(
        background[0].summary.posts,
        posts.len() as u64,
        "the step recounted every post, not one"
    );
    let drift: Vec<_> = background[0]
        .corrections
        .iter()
        .map(|c| (c.post.clone(), c.drift.as_i64()))
        .collect();
    assert_eq!(drift, vec![(post(5), 3)], "the hand edit was found");
    t.wait_exact(&posts, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn servers_with_snapshot_reads_recount_at_the_counters_cluster_time() {
    let t = TestDb::new("snapshot").await;
    let abilities = t.store.abilities().await.unwrap();
    if !abilities.snapshot_reads {
        support::skip(
            "servers_with_snapshot_reads_recount_at_the_counters_cluster_time",
            "the test server has no snapshot reads at a cluster time (probed: the fake accepts readConcern snapshot and ignores it); the quiet window covers it",
        );
        return;
    }
    let posts = settled_posts(&t, 3, 4).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    // Old rows change while the reconciler counts: a snapshot count needs no quiet window.
    for i in 0..3 {
        t.comments
            .update_one(
                doc! {"_id": format!("c{}", i * 4)},
                doc! {"$set": {"deleted_at": DateTime::now()}},
            )
            .await
            .unwrap();
    }
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    let report = reconciler(&t).run_dirty(now_secs()).await.unwrap();
    worker.shutdown().await.unwrap();
    assert!(report.summary.snapshot_counts > 0, "{:?}", report.summary);
    assert_eq!(report.summary.corrected, 0, "{:?}", report.summary);
}

#[tokio::test]
async fn the_top_n_read_is_served_by_the_count_index() {
    let t = TestDb::new("topn").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    let posts: Vec<GroupValue> = (0..8).map(post).collect();
    for (i, p) in posts.iter().enumerate() {
        for j in 0..=i {
            t.insert_comment(format!("t{i}-{j}"), p, now_secs() - 3600)
                .await;
        }
    }
    t.wait_exact(&posts, Duration::from_secs(20)).await;
    worker.shutdown().await.unwrap();
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    let top: Vec<mongodb::bson::Document> = {
        use futures::TryStreamExt;
        counters
            .find(doc! {})
            .sort(doc! {"count": -1})
            .limit(3)
            .projection(doc! {"count": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    let ranked: Vec<(String, i64)> = top
        .iter()
        .map(|d| {
            (
                d.get_str("_id").unwrap().to_string(),
                d.get_i64("count").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ranked,
        vec![
            ("post-7".into(), 8),
            ("post-6".into(), 7),
            ("post-5".into(), 6)
        ]
    );
    let explained = t
        .db
        .run_command(doc! {"explain": {"find": "comment_counters", "filter": {}, "sort": {"count": -1}, "limit": 3}})
        .await;
    let plan = explained
        .ok()
        .and_then(|e| e.get_document("queryPlanner").ok().cloned())
        .and_then(|q| q.get_document("winningPlan").ok().cloned());
    match plan {
        Some(plan) => assert!(
            plan.to_string().contains("count_desc"),
            "the top-N query uses the count index: {plan}"
        ),
        None => support::skip(
            "the_top_n_read_is_served_by_the_count_index (plan check)",
            "the test server reports no query plan (explain); the ranking was checked",
        ),
    }
}

/// While the worker catches up a backlog, the reconciler does not count the dirty posts it has
/// not reached (a count would see changes the worker has not applied and could not be folded:
/// before, every such count was made and found in flight); once caught up, it counts and
/// folds them all. Over the whole catch-up, recounts left in flight are at most 5 % of the
/// counts made.
#[tokio::test]
async fn posts_the_worker_has_not_reached_are_left_uncounted() {
    let t = TestDb::new("behind").await;
    let posts = settled_posts(&t, 20, 2).await;
    let owner = leave_the_worker_behind(&t, &posts).await;
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    t.store
        .mark_dirty(&fence, &marks(&posts), DateTime::now())
        .await
        .unwrap();
    let settings = ReconcileSettings {
        settle_secs: 5,
        // The count's wait is bounded by the clock: it must outlast the worker's drained-position
        // records (about one a second when idle, slower on a loaded machine), or a caught-up
        // worker's counts end in flight for want of a record, not of events.
        catch_up: counterd::recount::CatchUp {
            timeout: Duration::from_secs(5),
            poll: Duration::from_millis(50),
            probe_without_worker: true,
        },
        ..ReconcileSettings::default()
    };
    let quick = Reconciler::new(t.store.clone(), settings.clone());
    // A requested full sweep waits too, and its request stays for a later pass.
    t.store.set_sweep_requested("comments", true).await.unwrap();
    let reconcilers = [Reconciler::new(t.store.clone(), settings.clone())];
    let swept = run_requested_sweeps(&reconcilers, now_secs(), None)
        .await
        .unwrap();
    assert!(
        swept.is_empty(),
        "no requested sweep while the worker is behind: {swept:?}"
    );
    assert!(sweep_requested(&t).await, "the request stays");
    let behind = quick.run_dirty(now_secs()).await.unwrap();
    assert_eq!(
        (behind.summary.counts, behind.summary.deferred),
        (0, posts.len() as u64),
        "nothing counted while the worker is behind: {:?}",
        behind.summary
    );
    assert_eq!(
        t.store.dirty_summary().await.unwrap().size,
        posts.len() as u64,
        "every post stays dirty"
    );
    // The worker comes back and catches up: every post is counted and folded.
    t.store
        .release_lease("comments", "behind-worker", owner)
        .await
        .unwrap();
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.wait_drained(Duration::from_secs(30)).await;
    let caught_up = Reconciler::new(t.store.clone(), settings)
        .run_dirty(now_secs())
        .await
        .unwrap();
    worker.shutdown().await.unwrap();
    let counts = behind.summary.counts + caught_up.summary.counts;
    let in_flight = behind.summary.in_flight + caught_up.summary.in_flight;
    assert_eq!(caught_up.summary.deferred, 0, "{:?}", caught_up.summary);
    assert_eq!(caught_up.summary.counts, posts.len() as u64);
    assert!(
        in_flight * 20 <= counts,
        "recounts in flight {in_flight} of {counts} counts"
    );
    assert_eq!(
        caught_up.summary.posts,
        posts.len() as u64,
        "every post folded: {:?}",
        caught_up.summary
    );
    // Caught up, the requested sweep runs and clears its request.
    let swept = run_requested_sweeps(&reconcilers, now_secs(), None)
        .await
        .unwrap();
    assert_eq!(swept.len(), 1, "the requested sweep ran: {swept:?}");
    assert!(!sweep_requested(&t).await, "the request is cleared");
    t.wait_exact(&posts, Duration::from_secs(5)).await;
}

/// The outage: a backlog over `posts` the worker has not read, while a worker holds the lease
/// (alive, behind: the lease's epoch is returned), and the server's clock past the worker's
/// position by more than a count's wait covers.
async fn leave_the_worker_behind(t: &TestDb, posts: &[GroupValue]) -> i64 {
    let old = now_secs() - 3600;
    for n in 0..200 {
        t.insert_comment(format!("b{n}"), &posts[n % posts.len()], old)
            .await;
    }
    let owner = t
        .store
        .acquire_lease(
            "comments",
            "behind-worker",
            Duration::from_secs(60),
            DateTime::now(),
        )
        .await
        .unwrap()
        .expect("the lease is free");
    let applied = t
        .store
        .load_checkpoint("comments")
        .await
        .unwrap()
        .and_then(|c| counterd::recount::applied_before(&c))
        .expect("the worker applied the settled rows");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while t.store.read_position().await.unwrap().lower.time <= applied.time + 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server's clock moves"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    owner
}

/// A clock whose pauses pass at once and move it on by their length: the time a reconcile pass
/// spends waiting for the worker reads off it exactly, however loaded the machine.
struct PausesPassAtOnce(std::sync::Mutex<DateTime>);

#[async_trait::async_trait]
impl Clock for PausesPassAtOnce {
    fn now(&self) -> DateTime {
        *self.0.lock().unwrap()
    }

    async fn sleep(&self, delay: Duration) {
        {
            let mut now = self.0.lock().unwrap();
            *now = DateTime::from_millis(now.timestamp_millis() + delay.as_millis() as i64);
        }
        tokio::task::yield_now().await;
    }
}

/// Two definitions beside the default, on the same stream.
const TWO_MORE: &str = r#"
[[counters]]
name = "approved"
group_field = "post_id"
condition = { approved = true }
collection = "approved_counters"

[[counters]]
name = "pinned"
group_field = "post_id"
condition = { pinned = true }
collection = "pinned_counters"
"#;

#[tokio::test]
async fn a_pass_waits_for_a_catching_up_worker_once_whatever_its_definitions() {
    let t = TestDb::with_schema("behind_once", support::schema_of(TWO_MORE)).await;
    let posts = settled_posts(&t, 5, 1).await;
    let _owner = leave_the_worker_behind(&t, &posts).await;
    // Every definition has dirty posts and a full sweep is requested: each step of the pass
    // asks whether the worker is behind.
    let names = ["default", "approved", "pinned"];
    let marks: Vec<_> = (0..names.len())
        .flat_map(|ix| {
            posts
                .iter()
                .map(move |p| CounterKey::new(CounterIx(ix), p.clone()))
        })
        .map(counterd::core::batch::DirtyMark::settled)
        .collect();
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    t.store
        .mark_dirty(&fence, &marks, DateTime::now())
        .await
        .unwrap();
    t.store.set_sweep_requested("comments", true).await.unwrap();
    let timeout = Duration::from_secs(10);
    let settings = ReconcileSettings {
        settle_secs: 5,
        catch_up: counterd::recount::CatchUp {
            timeout,
            poll: Duration::from_millis(50),
            probe_without_worker: true,
        },
        ..ReconcileSettings::default()
    };
    let clock = Arc::new(PausesPassAtOnce(std::sync::Mutex::new(DateTime::now())));
    let reconcilers: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(ix, name)| {
            let settings = settings.clone().for_counter(CounterIx(ix), name);
            Reconciler::with_clock(t.store.clone(), settings, clock.clone())
        })
        .collect();
    let since = DateTime::now();
    let started = clock.now().timestamp_millis();
    let reports = counterd::reconcile::run_pass(&reconcilers, now_secs(), since, None)
        .await
        .unwrap();
    let waited = Duration::from_millis((clock.now().timestamp_millis() - started) as u64);
    let runs: Vec<_> = reports
        .iter()
        .map(|r| {
            (
                r.summary.kind.as_str(),
                r.summary.counts,
                r.summary.deferred,
            )
        })
        .collect();
    assert_eq!(
        runs,
        vec![("dirty", 0, posts.len() as u64); names.len()],
        "every definition's dirty posts are left uncounted, and nothing else runs: {reports:?}"
    );
    assert!(sweep_requested(&t).await, "the requested sweep waits too");
    assert!(
        timeout <= waited && waited < 2 * timeout,
        "the pass waited for the worker once ({timeout:?}), not once per step: {waited:?}"
    );
}

async fn sweep_requested(t: &TestDb) -> bool {
    t.store
        .load_checkpoint("comments")
        .await
        .unwrap()
        .is_some_and(|c| c.sweep_requested)
}
