//! One active worker per stream: standby takeover after `kill -9`, and fencing of a worker that
//! was paused past its lease.

mod support;

#[path = "support/daemon.rs"]
mod daemon;

use std::time::{Duration, Instant};

use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::store::prelude::*;
use daemon::Daemon;
use mongodb::bson::doc;
use support::{now_secs, post, TestDb};

/// Roles of the daemons as their /readyz says: (active, standby).
async fn roles(daemons: &[&Daemon]) -> (usize, usize) {
    let (mut active, mut standby) = (0, 0);
    for d in daemons {
        match d.get("/readyz").await {
            Some((_, body)) if body.starts_with("active") => active += 1,
            Some((_, body)) if body.starts_with("standby") => standby += 1,
            _ => {}
        }
    }
    (active, standby)
}

async fn insert_some(t: &TestDb, from: usize, n: usize) {
    for i in from..from + n {
        t.insert_comment(format!("h{i}"), &post(i % 4), now_secs() - 100)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_active_and_a_standby_takes_over_after_kill_9() {
    let t = TestDb::new("ha3").await;
    let quiet: &[(&str, &str)] = &[("COUNTERD_RECONCILE_INTERVAL", "1h")];
    let a = Daemon::start(&t.uri, &t.name, "a", quiet);
    assert!(a.wait_role("active", Duration::from_secs(20)).await);
    let b = Daemon::start(&t.uri, &t.name, "b", quiet);
    let c = Daemon::start(&t.uri, &t.name, "c", quiet);
    assert!(b.wait_role("standby", Duration::from_secs(20)).await);
    assert!(c.wait_role("standby", Duration::from_secs(20)).await);
    insert_some(&t, 0, 60).await;
    // Exactly one applies at any moment.
    for _ in 0..10 {
        assert_eq!(roles(&[&a, &b, &c]).await.0, 1, "exactly one active");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let epoch_before = t.store.read_lease("comments").await.unwrap().unwrap().epoch;
    a.kill9();
    let writes = tokio::spawn({
        let uri = t.uri.clone();
        let name = t.name.clone();
        async move {
            let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
            let comments = client
                .database(&name)
                .collection::<mongodb::bson::Document>("comments");
            for i in 60..160 {
                comments
                    .insert_one(doc! {"_id": format!("h{i}"), "post_id": format!("post-{}", i % 4), "created_at": mongodb::bson::DateTime::now()})
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    let killed_at = Instant::now();
    let mut took_over = None;
    while killed_at.elapsed() < Duration::from_secs(15) {
        if roles(&[&b, &c]).await.0 == 1 {
            took_over = Some(killed_at.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took_over = took_over.expect("a standby took over");
    eprintln!("standby took over {took_over:?} after kill -9 (lease_ttl 2s)");
    assert!(
        took_over < Duration::from_secs(6),
        "took over within a few seconds of expiry"
    );
    writes.await.unwrap();
    let posts: Vec<GroupValue> = (0..4).map(post).collect();
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    assert_eq!(roles(&[&b, &c]).await, (1, 1));
    let lease = t.store.read_lease("comments").await.unwrap().unwrap();
    assert!(lease.epoch > epoch_before, "takeover raised the epoch");
    // No counter carries an epoch newer than the lease (no write from outside the fence), and
    // the ones written after the takeover carry the new one.
    let counters =
        t.db.collection::<mongodb::bson::Document>("comment_counters");
    let mut cursor = counters.find(doc! {}).await.unwrap();
    while cursor.advance().await.unwrap() {
        let d = cursor.deserialize_current().unwrap();
        let e = d.get_i64("epoch").unwrap();
        assert!(
            e <= lease.epoch && e >= epoch_before,
            "counter {d} has epoch {e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_paused_past_its_lease_is_fenced_out() {
    let t = TestDb::new("fence").await;
    let quiet: &[(&str, &str)] = &[
        ("COUNTERD_RECONCILE_INTERVAL", "1h"),
        ("COUNTERD_LOG_LEVEL", "counterd=debug"),
    ];
    let a = Daemon::start(&t.uri, &t.name, "a", quiet);
    assert!(a.wait_role("active", Duration::from_secs(20)).await);
    let b = Daemon::start(&t.uri, &t.name, "b", quiet);
    assert!(b.wait_role("standby", Duration::from_secs(20)).await);
    insert_some(&t, 0, 20).await;
    let first_epoch = t.store.read_lease("comments").await.unwrap().unwrap().epoch;
    a.signal("-STOP");
    assert!(
        b.wait_role("active", Duration::from_secs(15)).await,
        "b took over while a was paused"
    );
    insert_some(&t, 20, 20).await;
    a.signal("-CONT");
    // a wakes up believing it is active; its next write carries the old epoch and is refused,
    // so it steps down.
    assert!(
        a.wait_role("standby", Duration::from_secs(15)).await,
        "a stepped down"
    );
    insert_some(&t, 40, 20).await;
    let posts: Vec<GroupValue> = (0..4).map(post).collect();
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    let lease = t.store.read_lease("comments").await.unwrap().unwrap();
    assert_eq!(lease.owner, "b");
    assert!(lease.epoch > first_epoch);
    let checkpoint = t.store.load_checkpoint("comments").await.unwrap().unwrap();
    assert_eq!(
        checkpoint.epoch, lease.epoch,
        "the checkpoint belongs to the new epoch"
    );
    assert_eq!(roles(&[&a, &b]).await, (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_partitions_shared_by_two_processes_stay_exact() {
    let t = TestDb::new("parts").await;
    let env: &[(&str, &str)] = &[
        ("COUNTERD_PARTITIONS", "4"),
        ("COUNTERD_MAX_PARTITIONS_PER_PROCESS", "2"),
        ("COUNTERD_RECONCILE_INTERVAL", "1h"),
    ];
    let a = Daemon::start(&t.uri, &t.name, "a", env);
    let b = Daemon::start(&t.uri, &t.name, "b", env);
    assert!(
        a.wait_role("active (2 of 4", Duration::from_secs(20)).await,
        "a works on 2 partitions"
    );
    assert!(
        b.wait_role("active (2 of 4", Duration::from_secs(20)).await,
        "b works on the other 2: a {:?}, b {:?}",
        a.get("/readyz").await,
        b.get("/readyz").await
    );
    let mut owners = std::collections::BTreeMap::new();
    for p in 0..4 {
        let lease = t
            .store
            .read_lease(&format!("comments/p{p}of4"))
            .await
            .unwrap()
            .unwrap();
        *owners.entry(lease.owner).or_insert(0) += 1;
    }
    assert_eq!(
        owners.values().copied().collect::<Vec<_>>(),
        vec![2, 2],
        "{owners:?}"
    );
    // Moves across posts (and so across partitions), soft and hard deletes.
    let posts: Vec<GroupValue> = (0..12).map(post).collect();
    for i in 0..120 {
        t.insert_comment(format!("m{i}"), &posts[i % 12], now_secs() - 50)
            .await;
    }
    for i in (0..120).step_by(3) {
        t.comments
            .update_one(
                doc! {"_id": format!("m{i}")},
                doc! {"$set": {"post_id": posts[(i + 5) % 12].to_bson()}},
            )
            .await
            .unwrap();
    }
    for i in (0..120).step_by(7) {
        t.comments
            .delete_one(doc! {"_id": format!("m{i}")})
            .await
            .unwrap();
    }
    for i in (1..120).step_by(5) {
        t.comments
            .update_one(
                doc! {"_id": format!("m{i}")},
                doc! {"$set": {"deleted_at": mongodb::bson::DateTime::now()}},
            )
            .await
            .unwrap();
    }
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    // Each partition's dirty entries are its own posts.
    let dirty = t
        .store
        .dirty_list(
            Some("comments/p1of4"),
            counterd::store::DirtyOrder::Oldest,
            100,
        )
        .await
        .unwrap();
    let part = counterd::core::partition::Partition { index: 1, count: 4 };
    assert!(!dirty.is_empty() && dirty.iter().all(|d| part.owns(&d.post)));
    // The ledger is divided (the initial snapshot made it complete): a partition's entries
    // show rows of its own posts only, and the four together hold at most one entry per
    // comment plus one "not here" per move (40), not four per comment. At least the 102
    // comments that still exist have one; a comment inserted and hard-deleted within one batch
    // (a worker behind on a loaded machine reads them together) needs none and gets none.
    let mut entries = 0;
    for index in 0..4 {
        let part = counterd::core::partition::Partition { index, count: 4 };
        let ledger = t
            .db
            .collection::<mongodb::bson::Document>(&format!("counterd_comment_state_p{index}of4"));
        let mut cursor = ledger.find(doc! {}).await.unwrap();
        while let Some(entry) = futures::TryStreamExt::try_next(&mut cursor).await.unwrap() {
            entries += 1;
            if let Some(post) = entry.get("post_id").and_then(GroupValue::from_bson) {
                assert!(part.owns(&post), "partition {index} holds {entry}");
            }
        }
    }
    let existing = t.comments.count_documents(doc! {}).await.unwrap();
    assert_eq!(existing, 102, "120 comments, 18 hard-deleted");
    assert!(
        (existing..=160).contains(&entries),
        "{entries} ledger entries for 120 comments ({existing} still there) and 40 moves"
    );
}

#[tokio::test]
async fn dirty_marks_carry_the_fencing_epoch() {
    use counterd::core::batch::DirtyMark;
    use counterd::store::Fence;
    let t = TestDb::new("dirtyfence").await;
    let fence = |stream: &str, epoch| Fence {
        stream: stream.into(),
        epoch,
    };
    let marks = [DirtyMark::settled(CounterKey::new(
        CounterIx::DEFAULT,
        post(1),
    ))];
    let entry = || async {
        let dirty = t.db.collection::<mongodb::bson::Document>("counterd_dirty");
        let d = dirty
            .find_one(doc! {"_id": "post-1"})
            .await
            .unwrap()
            .unwrap();
        (d.get_i64("epoch").unwrap(), d.get_i64("version").unwrap())
    };
    let now = mongodb::bson::DateTime::now();
    t.store
        .mark_dirty(&fence("comments", 2), &marks, now)
        .await
        .unwrap();
    assert_eq!(entry().await, (2, 1), "the mark carries its writer's epoch");
    // A worker fenced out by epoch 2 cannot touch the entry, not even once.
    t.store
        .mark_dirty(&fence("comments", 1), &marks, now)
        .await
        .unwrap();
    assert_eq!(entry().await, (2, 1), "a stale epoch's mark is refused");
    t.store
        .mark_dirty(&fence("comments", 3), &marks, now)
        .await
        .unwrap();
    assert_eq!(entry().await, (3, 2), "the successor's mark lands");
    // Another stream (a new partitioning) takes the entry over with its own epoch.
    t.store
        .mark_dirty(&fence("comments/p1of2", 1), &marks, now)
        .await
        .unwrap();
    assert_eq!(entry().await, (1, 3));
}
