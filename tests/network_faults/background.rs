//! Faults inside `counterd run`'s background work: each read and write of a recount (the
//! dirty set, the count, the fold) and of an initial snapshot's chunk.

use counterd::store::prelude::*;
use counterd::store::SnapshotState;
use counterd_testdb::FaultProxy;

use super::*;

/// The fold's write applied but its reply lost: the reconciler retries, the post stays dirty
/// until a fold is known to have landed, and the counter is exact (a fold installs a recount,
/// so landing twice changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fold_reply() {
    let mut f = Faulty::new("lost_fold").await;
    f.proxy.drop_replies(on("update", "reconciled_at"), 1);
    // The reconciler on (every second, the harness's default); rows an hour old are settled.
    let d = f.active_daemon("lost_fold", &[]).await;
    f.insert(12).await;
    assert!(
        f.proxy.wait_fired(RECOVERY).await,
        "a fold was written: {:?}",
        f.proxy.stats()
    );
    wait_retried(&d, "reconcile").await;
    f.wait_exact().await;
    // Every post folds in the end, and leaves the dirty set.
    let folded = wait_until(RECOVERY, || async {
        f.t.store.dirty_summary().await.is_ok_and(|s| s.size == 0)
    })
    .await;
    assert!(folded, "the dirty set drained after the lost fold reply");
    f.wait_exact().await;
}

/// Rows that exist before the first start are counted by the initial snapshot; a lost reply
/// to a chunk's counter writes makes the chunk be applied again, guarded, not twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_snapshot_chunk_reply() {
    let mut f = Faulty::new("lost_chunk").await;
    f.insert(40).await;
    f.proxy.drop_replies(on("update", "snapshot_chunk"), 2);
    let d = f
        .active_daemon(
            "lost_chunk",
            &[NO_RECONCILE, ("COUNTERD_SNAPSHOT_CHUNK_ROWS", "10")],
        )
        .await;
    assert!(f.proxy.wait_fired(RECOVERY).await, "{:?}", f.proxy.stats());
    wait_retried(&d, "worker").await;
    let snapshot = || async {
        let checkpoint = f.t.store.load_checkpoint("comments").await.unwrap();
        checkpoint.and_then(|c| c.snapshot)
    };
    let done = wait_until(RECOVERY, || async {
        snapshot()
            .await
            .is_some_and(|s| s.state == SnapshotState::Done)
    })
    .await;
    assert!(done, "the snapshot finished: {:?}", snapshot().await);
    f.wait_exact().await;
    let snapshot = snapshot().await.expect("a snapshot was taken");
    // Every row scanned (rows inserted while it ran may be scanned too, and skipped: the
    // stream counts them), and at least one chunk finished from its recorded intent.
    assert_eq!(snapshot.state, SnapshotState::Done, "{snapshot:?}");
    assert!(snapshot.rows_scanned >= 40, "{snapshot:?}");
    assert!(snapshot.chunks_resumed >= 1, "{snapshot:?}");
    // What comes next is the stream's, counted once.
    f.insert(8).await;
    f.wait_exact().await;
}

/// Starts `counterd run` with the reconciler on, arms `arm` once comments are applied, adds
/// more (so their posts are dirty and recounted), and checks that the reconciler counted a
/// retry, that the counters are exact and that the dirty set drains.
async fn reconciles_through(test: &str, arm: impl Fn(&FaultProxy)) {
    let mut f = Faulty::new(test).await;
    let d = f.active_daemon(test, &[]).await;
    f.insert(8).await;
    f.wait_exact().await;
    arm(&f.proxy);
    f.fire(test).await;
    wait_retried(&d, "reconcile").await;
    f.wait_exact().await;
    let drained = wait_until(RECOVERY, || async {
        f.t.store.dirty_summary().await.is_ok_and(|s| s.size == 0)
    })
    .await;
    assert!(drained, "the dirty set drained after the fault");
    f.wait_exact().await;
}

/// A recount's read of the live rows lost (twice: the driver retries a read once). The
/// row-level recount reads their ids with the live filter (its `$type`), which no chunk read,
/// preflight sample or dirty-set read carries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_recount_reply() {
    reconciles_through("lost_recount", |p| p.drop_replies(on("find", "$type"), 2)).await;
}

/// The reconciler's read of the dirty set lost (twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_dirty_list_reply() {
    reconciles_through("lost_dirty_list", |p| {
        p.drop_replies(on("find", "counterd_dirty"), 2)
    })
    .await;
}

/// A snapshot chunk's read of `comments` lost (twice): the chunk is read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_snapshot_read_reply() {
    let mut f = Faulty::new("lost_chunk_read").await;
    f.insert(30).await;
    // A chunk reads an `_id` range (`$lte` the pinned last row); the start-up preflight's
    // sample of rows does not, so it does not take the lost replies.
    f.proxy.drop_replies(on("find", "$lte"), 2);
    let d = f
        .active_daemon(
            "lost_chunk_read",
            &[NO_RECONCILE, ("COUNTERD_SNAPSHOT_CHUNK_ROWS", "10")],
        )
        .await;
    assert!(f.proxy.wait_fired(RECOVERY).await, "{:?}", f.proxy.stats());
    wait_retried(&d, "worker").await;
    f.wait_exact().await;
    f.insert(8).await;
    f.wait_exact().await;
}
