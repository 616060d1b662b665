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
        // The worker's stream ends with the schema's `$project` (which names
        // `fullDocumentBeforeChange`); the start-up preflight's probe opens a plain change
        // stream, so it does not take the lost replies.
        Target::command("aggregate").containing("fullDocumentBeforeChange"),
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

/// Starts `counterd run` with every request matching `target` refused by the "server" with
/// `code`, and checks that it stops at once, with exit code 3 and a message that says what
/// failed (`said` must be in it) and does not call it transient.
async fn stops_for_good(test: &str, user: &str, target: Target, code: i32, said: &[&str]) {
    let f = Faulty::new(test).await;
    f.proxy
        .refuse(target, 1_000, code, "refused by the test (fault proxy)");
    let log = tempfile::NamedTempFile::new().unwrap();
    let uri = f.proxy.uri().replacen("://", &format!("://{user}"), 1);
    // It may stop before its HTTP endpoint listens: do not wait for that.
    // on_fatal = "exit": the exit codes a supervisor may want (the default parks the stream:
    // tests/parked.rs).
    let extra = [NO_RECONCILE, ("COUNTERD_ON_FATAL", "exit")];
    let mut d = Daemon::spawn_logged(&uri, &f.t.name, test, &extra, log.path());
    let exited = wait_until(RECOVERY, || {
        let exited = d.child.try_wait().unwrap().is_some();
        async move { exited }
    })
    .await;
    let log_text = std::fs::read_to_string(log.path()).unwrap();
    assert!(exited, "counterd run stopped: {log_text}");
    let status = d.child.try_wait().unwrap().and_then(|s| s.code());
    assert_eq!(status, Some(3), "exit code 3 (MongoDB): {log_text}");
    for text in said {
        assert!(log_text.contains(text), "{text:?} in: {log_text}");
    }
    let stopped = log_text
        .lines()
        .find(|l| l.contains("counterd stopped"))
        .unwrap_or_else(|| panic!("the reason is logged: {log_text}"));
    assert!(
        !stopped.contains("transient"),
        "not called transient: {stopped}"
    );
    eprintln!("{test}: {stopped}");
    assert!(f.proxy.stats().refused >= 1);
}

/// Refused credentials at first contact (the login's `saslStart` answered with
/// `AuthenticationFailed`, code 18, as a server without this user answers): no retry mends
/// them, so the start ends at once and says what to check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_stop_the_start_with_a_clear_message() {
    stops_for_good(
        "refused_login",
        "counterd:wrong@",
        Target::command("saslStart"),
        18,
        &["cannot start", "refused counterd", "check the credentials"],
    )
    .await;
}

/// A user without the right to create indexes (`Unauthorized`, code 13): the start ends at
/// once, naming the step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_index_creation_stops_the_start_with_a_clear_message() {
    stops_for_good(
        "unauthorized_indexes",
        "",
        Target::command("createIndexes"),
        13,
        &["cannot start: database error during create indexes"],
    )
    .await;
}

/// A refused lease command (no right on `counterd_leases`): standing by would never end, so
/// the start ends at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lease_stops_the_start_with_a_clear_message() {
    stops_for_good(
        "refused_lease",
        "",
        Target::command("findAndModify").containing("counterd_leases"),
        13,
        &["cannot look at the lease of stream `comments`"],
    )
    .await;
}

/// A primary stepping down while counterd creates its indexes (every `createIndexes` refused
/// with `NotWritablePrimary`, code 10107, a transient error) keeps the start retrying, with
/// `/readyz` unready and the retries counted, until a primary answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_stepping_down_while_indexes_are_created_keeps_readyz_unready_until_it_is_back() {
    let mut f = Faulty::new("stepdown_indexes").await;
    f.proxy.refuse(
        Target::command("createIndexes"),
        1_000,
        10107,
        "not primary (fault proxy)",
    );
    let d = f.daemon("stepdown_indexes", &[NO_RECONCILE]);
    let retried = wait_until(RECOVERY, || async {
        retries(&d, "create_indexes").await >= 2.0
    })
    .await;
    assert!(retried, "index creation retried: {:?}", f.proxy.stats());
    let (code, body) = d.get("/readyz").await.expect("the endpoint answers");
    assert_eq!(code, 503, "unready while preparing: {body}");
    assert!(body.contains("still preparing"), "{body}");
    f.proxy.clear();
    assert!(
        d.wait_role("active", RECOVERY).await,
        "active once a primary answers: {:?}",
        d.get("/readyz").await
    );
    f.insert(8).await;
    f.wait_exact().await;
}
