//! Faults while `counterd run` starts: each start-up step meets a lost reply (or a stall), is
//! retried, and the process becomes active and counts exactly. Before, one lost reply while
//! creating indexes ended the process ("cannot start: transient database error during create
//! indexes").

use std::time::Duration;

use counterd_testdb::Target;

use super::*;

/// Arms `lost` lost replies to `fault`, starts `counterd run` through the proxy, and checks
/// that it became active, that the fault fired and was counted as a retry of `op`, and that it
/// counts exactly. Reads are lost twice: the driver retries a read once by itself (retryable
/// reads), so only the second loss reaches counterd.
async fn starts_through(test: &str, fault: Target, lost: u64, op: &str) {
    let mut f = Faulty::new(test).await;
    f.proxy.drop_replies(fault.clone(), lost);
    let d = f.daemon(test, &[NO_RECONCILE]);
    assert!(
        f.proxy.wait_fired(RECOVERY).await,
        "the lost reply ({fault:?}) was never asked for: {:?}",
        f.proxy.stats()
    );
    assert!(
        d.wait_role("active", RECOVERY).await,
        "counterd run started after a lost reply ({fault:?}): {:?}",
        d.get("/readyz").await
    );
    wait_retried(&d, op).await;
    f.insert(12).await;
    f.wait_exact().await;
    assert_eq!(f.proxy.stats().dropped_replies, lost);
    assert_eq!(d.terminate(), Some(0), "still running, and SIGTERM exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_creating_indexes_is_retried() {
    starts_through(
        "lost_create_indexes",
        Target::command("createIndexes"),
        1,
        "create_indexes",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_reading_the_server_abilities_is_retried() {
    starts_through(
        "lost_build_info",
        Target::command("buildInfo"),
        2,
        "server_abilities",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_taking_the_lease_is_retried() {
    starts_through(
        "lost_lease",
        Target::command("findAndModify").containing("counterd_leases"),
        1,
        "lease",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_opening_the_first_stream_is_retried() {
    starts_through(
        "lost_first_open",
        Target::command("aggregate").containing("$changeStream"),
        2,
        "worker",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_while_reading_the_first_checkpoint_is_retried() {
    starts_through(
        "lost_first_checkpoint",
        Target::command("find").containing("counterd_checkpoints"),
        2,
        "worker",
    )
    .await;
}

/// A server that answers nothing for longer than the connect timeout while the process starts:
/// `/readyz` says "not connected" meanwhile, the connect step is retried, and the process
/// becomes active once the server answers, by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_at_first_contact_keeps_readyz_unready_until_it_answers() {
    let mut f = Faulty::new("stalled_connect").await;
    // Longer than COUNTERD_CONNECT_TIMEOUT (2 s in the harness): the first attempt fails.
    f.proxy.stall(Duration::from_secs(60));
    let d = f.daemon("stalled_connect", &[NO_RECONCILE]);
    let unready = wait_until(RECOVERY, || async {
        matches!(d.get("/readyz").await, Some((503, body)) if body.contains("not connected"))
    })
    .await;
    assert!(unready, "/readyz unready while the server does not answer");
    wait_retried(&d, "connect").await;
    let (code, body) = d.get("/readyz").await.expect("the endpoint answers");
    assert_eq!(code, 503, "still unready while stalled: {body}");
    f.proxy.resume();
    assert!(
        d.wait_role("active", RECOVERY).await,
        "active once the server answers: {:?}",
        d.get("/readyz").await
    );
    f.insert(8).await;
    f.wait_exact().await;
}

/// Connections reset at first contact (the handshake and the first command) are retried too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_reset_at_first_contact_are_retried() {
    let mut f = Faulty::new("reset_connect").await;
    f.proxy.reset_requests(Target::command("isMaster"), 3);
    let d = f.daemon("reset_connect", &[NO_RECONCILE]);
    assert!(f.proxy.wait_fired(RECOVERY).await, "{:?}", f.proxy.stats());
    assert!(
        d.wait_role("active", RECOVERY).await,
        "{:?}",
        d.get("/readyz").await
    );
    assert_eq!(f.proxy.stats().reset_requests, 3);
    f.insert(8).await;
    f.wait_exact().await;
}
