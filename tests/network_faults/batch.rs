//! Faults at each step of a batch while `counterd run` is active under load: the step's reply
//! is lost after the server applied it (the worst case for counting twice: the guards must
//! reject the re-applied writes), or its connection is reset before the server saw it, or the
//! link slows down or stalls. The worker reopens its stream from the checkpoint by itself.

use std::time::Duration;

use counterd_testdb::{FaultProxy, Target};

use super::*;

/// Starts an active `counterd run`, applies some comments, arms the fault, writes until it
/// fired, then checks the counters are exact, the worker is active again and (`retried`) that
/// `counterd_retries_total{op}` counted it.
async fn survives(test: &str, retried: Option<&str>, arm: impl Fn(&FaultProxy)) {
    let mut f = Faulty::new(test).await;
    let d = f.active_daemon(test, &[NO_RECONCILE]).await;
    f.insert(8).await;
    f.wait_exact().await;
    arm(&f.proxy);
    f.fire(test).await;
    if let Some(op) = retried {
        wait_retried(&d, op).await;
    }
    f.insert(8).await;
    f.wait_exact().await;
    assert!(
        d.wait_role("active", RECOVERY).await,
        "ready and active again: {:?}",
        d.get("/readyz").await
    );
    eprintln!("{test}: {:?}", f.proxy.stats());
}

/// A lost reply to the change stream's `getMore`: the driver resumes the stream by itself (a
/// resumable error) with a new `aggregate`; when that is lost too (twice: the driver retries
/// a read once), the error reaches the worker, which reopens the stream from the checkpoint.
/// No event is lost or counted twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_read_reply() {
    survives("lost_getmore", Some("worker"), |p| {
        p.drop_replies(Target::command("getMore"), 1);
        p.drop_replies(on("aggregate", "$changeStream"), 2);
    })
    .await;
}

/// A lost `getMore` reply alone: the driver's own resume absorbs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_read_reply_resumed_by_the_driver() {
    survives("lost_getmore_resumed", None, |p| {
        p.drop_replies(Target::command("getMore"), 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ledger_read_reply() {
    // Twice: the driver retries a read once by itself.
    survives("lost_ledger_read", Some("worker"), |p| {
        p.drop_replies(on("find", "counterd_comment_state"), 2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_counter_write_reply() {
    survives("lost_counter_write", Some("worker"), |p| {
        p.drop_replies(on("update", "comment_counters"), 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ledger_write_reply() {
    survives("lost_ledger_write", Some("worker"), |p| {
        p.drop_replies(on("update", "counterd_comment_state"), 1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_dirty_mark_reply() {
    survives("lost_dirty_write", Some("worker"), |p| {
        p.drop_replies(on("update", "counterd_dirty"), 1)
    })
    .await;
}

/// The intent and the checkpoint after it (both `update`s of `counterd_checkpoints`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_intent_and_checkpoint_replies() {
    survives("lost_checkpoint", Some("worker"), |p| {
        p.drop_replies(on("update", "counterd_checkpoints"), 2)
    })
    .await;
}

/// Counter writes never reach the server: their connection is reset first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_writes_reset_before_the_server_sees_them() {
    survives("reset_counter_write", Some("worker"), |p| {
        p.reset_requests(on("update", "comment_counters"), 2)
    })
    .await;
}

/// Every connection reset, five times, while comments keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_reset_again_and_again_under_load() {
    let mut f = Faulty::new("reset_all").await;
    let d = f.active_daemon("reset_all", &[NO_RECONCILE]).await;
    for _ in 0..5 {
        // Applied: the worker's connections are open (pooled), so there is something to reset.
        f.insert(6).await;
        f.wait_exact().await;
        let before = f.proxy.stats().reset_connections;
        f.proxy.reset_all();
        let closed = wait_until(RECOVERY, || async {
            f.proxy.stats().reset_connections > before
        })
        .await;
        assert!(closed, "open connections were reset");
    }
    f.insert(6).await;
    f.wait_exact().await;
    assert!(
        d.wait_role("active", RECOVERY).await,
        "{:?}",
        d.get("/readyz").await
    );
}

/// 40 ms on every request: slower, still exact, still ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_on_every_request() {
    let mut f = Faulty::new("latency").await;
    let d = f.active_daemon("latency", &[NO_RECONCILE]).await;
    f.proxy.set_latency(Duration::from_millis(40));
    f.insert(24).await;
    f.wait_exact().await;
    assert!(f.proxy.stats().requests > 0);
    assert!(
        d.wait_role("active", RECOVERY).await,
        "{:?}",
        d.get("/readyz").await
    );
}

/// All traffic held for longer than `ready_max_stall` under load: `/readyz` turns unready
/// ("no progress"), the step times out (operation_timeout) and is retried, and once the link
/// is back the worker catches up by itself, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_under_load_turns_readyz_unready_and_recovers() {
    let mut f = Faulty::new("stall").await;
    let d = f
        .active_daemon("stall", &[NO_RECONCILE, ("COUNTERD_READY_MAX_STALL", "2s")])
        .await;
    f.insert(8).await;
    f.wait_exact().await;
    f.proxy.stall(Duration::from_secs(60));
    f.insert(8).await;
    let unready = wait_until(RECOVERY, || async {
        matches!(d.get("/readyz").await, Some((503, body)) if body.contains("no progress"))
    })
    .await;
    assert!(
        unready,
        "/readyz unready while stalled: {:?}",
        d.get("/readyz").await
    );
    // The step abandoned after operation_timeout (3 s in the harness) is a retry.
    wait_retried(&d, "worker").await;
    f.proxy.resume();
    f.wait_exact().await;
    assert!(
        d.wait_role("active", RECOVERY).await,
        "{:?}",
        d.get("/readyz").await
    );
}

/// The primary goes away under load (every write refused with `NotWritablePrimary`, code
/// 10107, as during an election) and comes back: the worker retries with backoff meanwhile and
/// catches up by itself, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_away_and_back_under_load() {
    let mut f = Faulty::new("primary_away").await;
    let d = f.active_daemon("primary_away", &[NO_RECONCILE]).await;
    f.insert(8).await;
    f.wait_exact().await;
    f.proxy.refuse(
        Target::command("update"),
        1_000_000,
        10107,
        "not primary (fault proxy)",
    );
    f.insert(8).await;
    let refused = wait_until(RECOVERY, || async {
        f.proxy.stats().refused >= 3 && retries(&d, "worker").await >= 2.0
    })
    .await;
    assert!(refused, "writes refused and retried: {:?}", f.proxy.stats());
    f.proxy.clear();
    f.insert(8).await;
    f.wait_exact().await;
    assert!(
        d.wait_role("active", RECOVERY).await,
        "{:?}",
        d.get("/readyz").await
    );
}
