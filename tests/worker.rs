//! The worker against the test database: exact counters without reconcile, idempotent restarts
//! and replays, the dirty set, coalescing.

mod support;

use std::time::Duration;

use counterd::core::batch::CounterDelta;
use counterd::core::batch::PendingBatch;
use counterd::core::event::LedgerUpdate;
use counterd::core::event::{CommentId, Row, Token};
use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::store::counting::Concern;
use counterd::store::prelude::*;
use counterd::store::{DirtyOrder, Fence};
use mongodb::bson::{doc, DateTime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{now_secs, post, TestDb};

/// One writer's random operations on its own comments (ids `w<writer>-<n>`).
async fn writer(t: &TestDb, writer: usize, ops: usize, posts: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mine: Vec<String> = Vec::new();
    for n in 0..ops {
        let roll = rng.random_range(0..100);
        if mine.is_empty() || roll < 40 {
            let id = format!("w{writer}-{n}");
            let p = post(rng.random_range(0..posts));
            let created = now_secs() - rng.random_range(0..600);
            t.insert_comment(id.clone(), &p, created).await;
            mine.push(id);
            continue;
        }
        let id = mine[rng.random_range(0..mine.len())].clone();
        let filter = doc! {"_id": &id};
        match roll {
            40..=59 => {
                t.comments
                    .update_one(filter, doc! {"$set": {"deleted_at": DateTime::now()}})
                    .await
                    .unwrap();
            }
            60..=74 => {
                t.comments
                    .update_one(filter, doc! {"$unset": {"deleted_at": ""}})
                    .await
                    .unwrap();
            }
            75..=84 => {
                let p = post(rng.random_range(0..posts));
                t.comments
                    .update_one(filter, doc! {"$set": {"post_id": p.to_bson()}})
                    .await
                    .unwrap();
            }
            85..=89 => {
                t.comments
                    .update_one(filter, doc! {"$set": {"body": "edited"}})
                    .await
                    .unwrap();
            }
            _ => {
                t.comments.delete_one(filter).await.unwrap();
                mine.retain(|m| *m != id);
            }
        }
    }
}

#[tokio::test]
async fn concurrent_writers_leave_every_counter_exact_without_reconcile() {
    let t = TestDb::new("writers").await;
    let posts: Vec<GroupValue> = (0..12).map(post).collect();
    let worker = t.spawn_worker(t.worker_settings()).await;
    let writers = (0..4).map(|w| writer(&t, w, 150, posts.len(), 7 + w as u64));
    futures::future::join_all(writers).await;
    // Exact and settled: the last batch's dirty marks have landed too.
    t.wait_exact(&posts, Duration::from_secs(60)).await;

    // Every touched post is dirty, and no other post is.
    let dirty = t
        .store
        .dirty_list(None, DirtyOrder::Oldest, 1000)
        .await
        .unwrap();
    let mut dirty_posts: Vec<_> = dirty.iter().map(|d| d.post.clone()).collect();
    dirty_posts.sort();
    let mut touched = posts.clone();
    touched.sort();
    assert_eq!(
        dirty_posts, touched,
        "all 12 posts were touched by 600 random operations"
    );
    assert!(!dirty_posts.contains(&post(99)));
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn untouched_posts_are_not_dirty() {
    let t = TestDb::new("untouched").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.insert_comment("a", &post(1), now_secs()).await;
    t.insert_comment("b", &post(2), now_secs()).await;
    t.wait_exact(&[post(1), post(2)], Duration::from_secs(20))
        .await;
    // (wait_exact also waits for the batch's dirty marks, written beside its counters.)
    let dirty = t
        .store
        .dirty_list(None, DirtyOrder::Oldest, 100)
        .await
        .unwrap();
    let posts: Vec<_> = dirty.iter().map(|d| d.post.clone()).collect();
    assert_eq!(posts, vec![post(1), post(2)]);
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn restart_and_deliberate_replay_never_count_twice() {
    let t = TestDb::new("replay").await;
    let posts: Vec<GroupValue> = (0..5).map(post).collect();
    let worker = t.spawn_worker(t.worker_settings()).await;
    writer(&t, 0, 120, posts.len(), 1).await;
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    assert!(t
        .store
        .load_checkpoint("comments")
        .await
        .unwrap()
        .unwrap()
        .token
        .is_some());
    let mut seen = worker.status.events_applied();
    worker.shutdown().await.unwrap();

    // Writes while stopped, then a restart: resumes after the checkpoint.
    writer(&t, 1, 80, posts.len(), 2).await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    seen += worker.status.events_applied();
    worker.shutdown().await.unwrap();

    // Move the checkpoint back to the very first position on purpose and replay everything.
    t.store
        .move_checkpoint("comments", &counterd::store::Position::Unset)
        .await
        .unwrap();
    let mut settings = t.worker_settings();
    settings.start_at = Some(mongodb::bson::Timestamp {
        time: 1,
        increment: 0,
    });
    let counted = t.counted();
    let replay = t.spawn_worker_on(counted.clone(), settings).await;
    // It re-reads both runs' events (all rejected by the guard) and then applies new ones.
    t.wait_applied(&replay, seen, Duration::from_secs(30)).await;
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    writer(&t, 2, 40, posts.len(), 3).await;
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    assert!(
        counted.counts().of(Concern::Counters).statements > 0,
        "the replay did write (and was rejected)"
    );
    replay.shutdown().await.unwrap();
}

/// The ledger keeps a row that exists without a post (its fields, not counted), leaves out
/// entries from before the latest history gap, and the sweep's rebuild replaces only those
/// (never an entry the worker wrote since), while the worker's next write replaces a rebuilt
/// one.
#[tokio::test]
async fn ledger_entries_keep_unposted_rows_and_expire_with_a_history_gap() {
    let t = TestDb::new("ledger").await;
    let fence = Fence {
        stream: "comments".into(),
        epoch: 1,
    };
    let now = now_secs();
    let created = Some(DateTime::from_millis(now * 1000));
    let row = |p: Option<usize>, deleted| Row::of(p.map(post), created, deleted);
    let (a, b) = (CommentId::new("a".into()), CommentId::new("b".into()));
    let update = |c: &CommentId, state| LedgerUpdate {
        comment: c.clone(),
        state,
    };
    let ids = [a.clone(), b.clone()];
    let token = Token("0000000000000010".into());
    t.store
        .write_ledger(
            &fence,
            &[
                update(&a, Some(row(None, true))),
                update(&b, Some(row(Some(1), false))),
            ],
            &token,
            0,
        )
        .await
        .unwrap();
    let read = t.store.read_ledger("comments", &ids, 0).await.unwrap();
    assert_eq!(read[&a.key], Some(row(None, true)), "a row without a post");
    assert_eq!(read[&b.key], Some(row(Some(1), false)));
    // A gap: generation 1. Both entries are from before it.
    assert!(t
        .store
        .read_ledger("comments", &ids, 1)
        .await
        .unwrap()
        .is_empty());
    // The worker applies an event of `a` after the gap; then the sweep rebuilds both.
    let later = Token("0000000000000020".into());
    t.store
        .write_ledger(&fence, &[update(&a, Some(row(Some(2), false)))], &later, 1)
        .await
        .unwrap();
    t.store
        .rebuild_ledger(
            "comments",
            1,
            &[
                (a.clone(), row(Some(3), false)),
                (b.clone(), row(Some(3), true)),
            ],
        )
        .await
        .unwrap();
    let read = t.store.read_ledger("comments", &ids, 1).await.unwrap();
    assert_eq!(
        read[&a.key],
        Some(row(Some(2), false)),
        "the worker's entry stays"
    );
    assert_eq!(
        read[&b.key],
        Some(row(Some(3), true)),
        "the stale entry is rebuilt"
    );
    // Any later write of the worker replaces a rebuilt entry, whatever its token.
    t.store
        .write_ledger(
            &fence,
            &[update(&b, None)],
            &Token("0000000000000015".into()),
            1,
        )
        .await
        .unwrap();
    let read = t.store.read_ledger("comments", &ids, 1).await.unwrap();
    assert_eq!(read[&b.key], None, "gone");

    // What the sweep rebuilds from: every row of a post, soft-deleted ones too.
    t.insert_comment("c", &post(5), now).await;
    t.insert_comment("d", &post(5), now).await;
    t.insert_comment("e", &post(6), now).await;
    t.comments
        .update_one(
            doc! {"_id": "d"},
            doc! {"$set": {"deleted_at": DateTime::now()}},
        )
        .await
        .unwrap();
    let mut rows = t.store.rows_of_post(&post(5)).await.unwrap();
    rows.sort_by(|x, y| x.0.key.cmp(&y.0.key));
    assert_eq!(
        rows,
        vec![
            (CommentId::new("c".into()), row(Some(5), false)),
            (CommentId::new("d".into()), row(Some(5), true)),
        ]
    );
}

#[tokio::test]
async fn the_per_post_guard_rejects_a_duplicate_write() {
    let t = TestDb::new("guard").await;
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    let write = CounterDelta {
        key: CounterKey::new(CounterIx::DEFAULT, post(1)),
        delta: counterd::core::num::Num::ONE,
        buckets: [(0, counterd::core::num::Num::ONE)].into_iter().collect(),
        touched: [0].into_iter().collect(),
        comments: Some(Vec::new()),
    };
    let token = Token("0000000000000010".into());
    let first = t
        .store
        .apply_counters(&fence, std::slice::from_ref(&write), &token, None)
        .await
        .unwrap();
    assert_eq!((first.applied, first.already_applied), (1, 0));
    let again = t
        .store
        .apply_counters(&fence, std::slice::from_ref(&write), &token, None)
        .await
        .unwrap();
    assert_eq!(
        (again.applied, again.already_applied),
        (0, 1),
        "same token: rejected"
    );
    let older = Token("0000000000000008".into());
    let old = t
        .store
        .apply_counters(&fence, std::slice::from_ref(&write), &older, None)
        .await
        .unwrap();
    assert_eq!(old.already_applied, 1, "older token: rejected");
    let newer = Token("0000000000000011".into());
    let new = t
        .store
        .apply_counters(&fence, &[write], &newer, None)
        .await
        .unwrap();
    assert_eq!(new.applied, 1, "newer token: applied");
    assert_eq!(t.displayed(&post(1)).await, 2);
}

/// A worker over the test database with the test settings, for calling its recovery directly.
fn worker(t: &TestDb) -> counterd::worker::Worker<counterd::store::mongo::MongoStore> {
    counterd::worker::Worker::new(
        t.store.clone(),
        t.worker_settings(),
        std::sync::Arc::new(counterd::worker::WorkerStatus::default()),
    )
}

/// A predecessor that has not yet noticed a takeover must leave its successor's intent alone:
/// the successor carries counters across batches, and the carry its intent names goes on in
/// its memory. Re-applied by the predecessor, the carry's first batch was counted once then
/// and once more when the successor wrote the carry (found by the simulation).
#[tokio::test]
async fn a_predecessor_leaves_its_successors_intent_alone() {
    let t = TestDb::new("predecessor").await;
    let (predecessor, successor) = (0, 1);
    let fence = |epoch| Fence {
        stream: "comments".into(),
        epoch,
    };
    let comment = CommentId::new(mongodb::bson::Bson::Int32(1));
    let end = Token("0010".into());
    // The successor's first carried batch: its counter stored under the carry's id, its
    // intent naming the carry.
    let own = PendingBatch {
        end: end.clone(),
        counters: vec![CounterDelta {
            key: CounterKey::new(CounterIx::DEFAULT, post(1)),
            delta: counterd::core::num::Num::ONE,
            buckets: [(0, counterd::core::num::Num::ONE)].into_iter().collect(),
            touched: [0].into_iter().collect(),
            comments: Some(vec![comment.clone()]),
        }],
        dirty: vec![counterd::core::batch::DirtyMark::settled(CounterKey::new(
            CounterIx::DEFAULT,
            post(1),
        ))],
        ..PendingBatch::default()
    };
    let intent = PendingBatch {
        end: end.clone(),
        ledger: vec![LedgerUpdate {
            comment,
            state: Some(Row::of(Some(post(1)), None, false)),
        }],
        carry: Some(end.clone()),
        ..PendingBatch::default()
    };
    t.store
        .record_intent(&fence(successor), &intent, Some(&own))
        .await
        .unwrap();
    let worker = worker(&t);
    let stale = worker.resolve_pending(&fence(predecessor)).await;
    assert!(
        matches!(stale, Err(counterd::store::StoreError::Fenced { .. })),
        "the predecessor re-applied its successor's intent: {stale:?}"
    );
    assert_eq!(t.displayed(&post(1)).await, 0, "nothing written by it");
    let pending = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(pending.pending.as_ref(), Some(&intent), "left in flight");
    // The successor's own re-apply writes it, once.
    let resolved = worker.resolve_pending(&fence(successor)).await.unwrap();
    assert_eq!(resolved.map(|b| b.end), Some(end));
    assert_eq!(t.displayed(&post(1)).await, 1);
}

/// A worker that stopped while it carried counters across batches (see `counterd::core::carry`):
/// both batches' counters and dirty marks stored under the carry's id, their intents recorded,
/// the first batch's ledger states written, nothing else. The next start writes both batches' counters once, each
/// guarded by the last batch that touched it, with one log entry per batch.
#[tokio::test]
async fn a_carry_left_in_flight_is_written_once_by_the_next_start() {
    let t = TestDb::new("carry").await;
    let fence = Fence {
        stream: "comments".into(),
        epoch: 0,
    };
    let comment = |n: i32| CommentId::new(mongodb::bson::Bson::Int32(n));
    let delta = |p: usize, rows: &[i32]| CounterDelta {
        key: CounterKey::new(CounterIx::DEFAULT, post(p)),
        delta: counterd::core::num::Num::Int(rows.len() as i64),
        buckets: [(0, counterd::core::num::Num::Int(rows.len() as i64))]
            .into_iter()
            .collect(),
        touched: [0].into_iter().collect(),
        comments: Some(rows.iter().map(|n| comment(*n)).collect()),
    };
    let row = |p: usize| Row::of(Some(post(p)), None, false);
    let batch = |end: &str, deltas: Vec<CounterDelta>, rows: &[(i32, usize)]| PendingBatch {
        end: Token(end.into()),
        end_time: None,
        counters: deltas,
        ledger: rows
            .iter()
            .map(|(n, p)| LedgerUpdate {
                comment: comment(*n),
                state: Some(row(*p)),
            })
            .collect(),
        dirty: rows
            .iter()
            .map(|(_, p)| {
                counterd::core::batch::DirtyMark::settled(CounterKey::new(
                    CounterIx::DEFAULT,
                    post(*p),
                ))
            })
            .collect(),
        carry: None,
    };
    let first = batch(
        "0010",
        vec![delta(1, &[1]), delta(2, &[2])],
        &[(1, 1), (2, 2)],
    );
    let second = batch("0020", vec![delta(1, &[3])], &[(3, 1)]);
    // What the worker stores for a batch that may be carried: its counters and marks under the
    // carry's id (the first batch's end), then its intent, which names the carry and holds
    // only its ledger states; then its ledger states. The second batch's stop came after its
    // intent.
    let own = |b: &PendingBatch| PendingBatch {
        ledger: Vec::new(),
        ..b.clone()
    };
    let intent = |b: &PendingBatch| PendingBatch {
        counters: Vec::new(),
        dirty: Vec::new(),
        carry: Some(first.end.clone()),
        ..b.clone()
    };
    t.store
        .record_intent(&fence, &intent(&first), Some(&own(&first)))
        .await
        .unwrap();
    t.store
        .write_ledger(&fence, &first.ledger, &first.end, 0)
        .await
        .unwrap();
    t.store
        .record_intent(&fence, &intent(&second), Some(&own(&second)))
        .await
        .unwrap();
    let stored = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(stored.pending.as_ref(), Some(&intent(&second)));
    let read = t
        .store
        .load_carried("comments", &first.end, None, &second.end, 10)
        .await;
    assert_eq!(
        read.unwrap(),
        vec![own(&first), own(&second)],
        "read back as written"
    );
    let read = t
        .store
        .load_carried("comments", &first.end, None, &first.end, 10)
        .await;
    assert_eq!(
        read.unwrap(),
        vec![own(&first)],
        "only those through the pending batch"
    );
    let other = Token("0005".into());
    let read = t
        .store
        .load_carried("comments", &other, None, &second.end, 10)
        .await;
    assert_eq!(read.unwrap(), vec![], "only this carry's");
    // One carried counter had landed before the stop: it is not added again.
    t.store
        .apply_counters(&fence, &[delta(2, &[2])], &first.end, None)
        .await
        .unwrap();

    let worker = worker(&t);
    let resolved = worker.resolve_pending(&fence).await.unwrap();
    assert_eq!(resolved.map(|b| b.end), Some(second.end.clone()));
    assert_eq!(t.displayed(&post(1)).await, 2, "both batches, once");
    assert_eq!(t.displayed(&post(2)).await, 1, "landed before: once");
    let one = t.store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(one.applied_through.as_deref(), Some("0020"));
    let log: Vec<&str> = one.recent.iter().map(|e| e.through.as_str()).collect();
    assert_eq!(log, ["0010", "0020"], "one log entry per batch");
    let two = t.store.read_counter(&post(2)).await.unwrap().unwrap();
    assert_eq!(
        two.applied_through.as_deref(),
        Some("0010"),
        "guarded by the last batch that touched it"
    );
    let after = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(after.token, Some(second.end.clone()));
    assert!(after.pending.is_none(), "{after:?}");
    let left =
        t.db.collection::<mongodb::bson::Document>("counterd_carried");
    assert_eq!(left.count_documents(doc! {}).await.unwrap(), 0, "cleared");
    let dirty = t
        .store
        .dirty_list(Some("comments"), DirtyOrder::Oldest, 10)
        .await
        .unwrap();
    assert_eq!(dirty.len(), 2, "both posts marked: {dirty:?}");
    // Nothing is left to re-apply.
    assert!(worker.resolve_pending(&fence).await.unwrap().is_none());
    assert_eq!(t.displayed(&post(1)).await, 2);
}

#[tokio::test]
async fn a_hot_post_collapses_into_few_counter_writes() {
    let t = TestDb::new("zipf").await;
    let posts: Vec<GroupValue> = (0..50).map(post).collect();
    let mut settings = t.worker_settings();
    settings.max_batch_wait = Duration::from_millis(300);
    let counted = t.counted();
    let worker = t.spawn_worker_on(counted.clone(), settings).await;
    // 10k inserts, post chosen by Zipf(1.1): post-0 gets the lion's share.
    let zipf = rand_distr::Zipf::new(posts.len() as f64, 1.1).unwrap();
    let mut rng = StdRng::seed_from_u64(11);
    let now = now_secs();
    let docs: Vec<_> = (0..10_000)
        .map(|i| {
            let p = posts[rng.sample(zipf) as usize - 1].to_bson();
            doc! {"_id": i, "post_id": p, "created_at": DateTime::from_millis(now * 1000)}
        })
        .collect();
    for chunk in docs.chunks(500) {
        t.comments.insert_many(chunk.to_vec()).await.unwrap();
    }
    t.wait_applied(&worker, 10_000, Duration::from_secs(90))
        .await;
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    let writes = counted.counts().of(Concern::Counters).statements;
    let ratio = 10_000.0 / writes as f64;
    eprintln!("10000 events -> {writes} counter writes (ratio {ratio:.1})");
    assert!(
        ratio >= 5.0,
        "coalescing ratio {ratio:.1} below the floor of 5"
    );
    worker.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_successor_resumes_where_a_worker_without_checkpoint_started() {
    let t = TestDb::new("pinned").await;
    // (The pinned start is a whole second, inclusive: let the harness's own writes age out.)
    support::next_second().await;
    // The first worker opens the stream (pinning "now") and stops before any event arrives.
    let first = t.spawn_worker(t.worker_settings()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !first.status.is_stream_open() {
        assert!(
            std::time::Instant::now() < deadline,
            "the first worker never opened its stream"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown().await.unwrap();
    let pinned = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert!(
        pinned.token.is_none() && pinned.start_time.is_some(),
        "{pinned:?}"
    );
    // Events while nobody runs; then a successor: it starts at the pinned position, not at its
    // own "now", so these are counted.
    support::next_second().await;
    for i in 0..5 {
        t.insert_comment(format!("p{i}"), &post(0), now_secs())
            .await;
    }
    support::next_second().await;
    let second = t.spawn_worker(t.worker_settings()).await;
    t.wait_exact(&[post(0)], Duration::from_secs(20)).await;
    assert_eq!(t.displayed(&post(0)).await, 5);
    second.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_rows_are_skipped_and_the_stream_goes_on() {
    let t = TestDb::new("malformed").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.comments
        .insert_one(doc! {"_id": "no-post", "created_at": DateTime::now()})
        .await
        .unwrap();
    t.comments
        .insert_one(doc! {"_id": "array-post", "post_id": [1, 2], "created_at": DateTime::now()})
        .await
        .unwrap();
    t.comments
        .insert_one(doc! {"_id": "float-post", "post_id": 1.5, "created_at": DateTime::now()})
        .await
        .unwrap();
    t.insert_comment("good", &post(1), now_secs()).await;
    // The bad rows are skipped (and counted as bad events); the good one after them counts.
    t.wait_exact(&[post(1)], Duration::from_secs(20)).await;
    assert_eq!(t.displayed(&post(1)).await, 1);
    assert!(worker.status.is_stream_open());
    worker.shutdown().await.unwrap();
}

/// `8`, `NumberLong(8)` and `8.0` are one post to MongoDB's queries (and Node.js stores large
/// integers as doubles): all three rows count on post 8's counter, which then agrees with the
/// recount, so the reconciler finds no drift.
#[tokio::test]
async fn integral_doubles_count_on_their_integers_counter() {
    let t = TestDb::new("doubles").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    let old = DateTime::from_millis((now_secs() - 3600) * 1000);
    for (id, post_id) in [
        ("i32", mongodb::bson::Bson::Int32(8)),
        ("i64", mongodb::bson::Bson::Int64(8)),
        ("f64", mongodb::bson::Bson::Double(8.0)),
        ("fraction", mongodb::bson::Bson::Double(8.5)),
    ] {
        t.comments
            .insert_one(doc! {"_id": id, "post_id": post_id, "created_at": old})
            .await
            .unwrap();
    }
    let eight = GroupValue::Int(8);
    t.wait_exact(std::slice::from_ref(&eight), Duration::from_secs(20))
        .await;
    assert_eq!(
        (t.displayed(&eight).await, t.truth(&eight).await),
        (3, 3),
        "the integral double joins post 8; 8.5 is no post"
    );
    // Post 8 can be exact before the worker has read the last row (8.5, no post): stopped then,
    // that event stays pending and the recount below is rightly left in flight.
    t.wait_drained(Duration::from_secs(20)).await;
    worker.shutdown().await.unwrap();
    let report = counterd::reconcile::Reconciler::new(
        t.store.clone(),
        counterd::reconcile::ReconcileSettings {
            settle_secs: 5,
            ..Default::default()
        },
    )
    .run_dirty(now_secs())
    .await
    .unwrap();
    assert_eq!(
        (report.summary.posts, report.summary.corrected),
        (1, 0),
        "{:?}",
        report.summary
    );
    assert_eq!(t.displayed(&eight).await, 3);
}

#[tokio::test]
async fn a_dropped_collection_stops_the_worker_with_a_clear_error() {
    let t = TestDb::new("dropped").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    t.insert_comment("a", &post(1), now_secs()).await;
    t.wait_exact(&[post(1)], Duration::from_secs(20)).await;
    t.comments.drop().await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), worker.handle)
        .await
        .expect("the worker stops by itself")
        .unwrap();
    let err = result.unwrap_err();
    assert!(
        err.contains("`drop` event") && err.contains("stops rather than guess"),
        "{err}"
    );
    // Nothing was lost: the checkpoint stayed before the drop, so a restart stops again.
    let again = t.spawn_worker(t.worker_settings()).await;
    let result = tokio::time::timeout(Duration::from_secs(20), again.handle)
        .await
        .unwrap()
        .unwrap();
    assert!(result.unwrap_err().contains("`drop` event"));
}

#[tokio::test]
async fn worker_and_recount_agree_on_every_shape_of_post_id() {
    let t = TestDb::new("shapes").await;
    let worker = t.spawn_worker(t.worker_settings()).await;
    let old = mongodb::bson::DateTime::from_millis((support::now_secs() - 3600) * 1000);
    let shapes = [
        mongodb::bson::Bson::Int32(8),
        mongodb::bson::Bson::Int64(8),
        mongodb::bson::Bson::Double(8.0),
        mongodb::bson::Bson::Array(vec![mongodb::bson::Bson::Int32(8)]),
        mongodb::bson::Bson::String("8".into()),
        mongodb::bson::Bson::Document(doc! {"id": 8}),
        mongodb::bson::Bson::Null,
    ];
    for (i, shape) in shapes.iter().enumerate() {
        t.comments
            .insert_one(doc! {"_id": i as i64, "post_id": shape.clone(), "created_at": old})
            .await
            .unwrap();
    }
    // Moved to an object: no longer counted for 8.
    t.comments
        .insert_one(doc! {"_id": 100_i64, "post_id": 8_i64, "created_at": old})
        .await
        .unwrap();
    t.comments
        .update_one(doc! {"_id": 100_i64}, doc! {"$set": {"post_id": {"id": 8}}})
        .await
        .unwrap();
    let eight = GroupValue::Int(8);
    let text = GroupValue::Str("8".into());
    // Int32, Int64 and the integral Double 8 count for post 8 (MongoDB's equality), "8" for
    // post "8"; nothing else counts.
    assert_eq!(t.truth(&eight).await, 3, "the recount's definition");
    assert_eq!(t.truth(&text).await, 1);
    t.wait_exact(&[eight, text], Duration::from_secs(20)).await;
    worker.shutdown().await.unwrap();
}
