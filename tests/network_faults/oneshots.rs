//! Faults during the commands an operator runs by hand: `reconcile`, `snapshot` and `replay`
//! through the proxy. A one-shot does not retry for long: it either rides the fault out or
//! stops with exit code 3 and a message that says what failed (never "transient": it gave
//! up, so for it the error was final), having changed
//! nothing it cannot finish; run again, it completes, and `counterd run` afterwards counts
//! exactly (nothing is counted twice).

use std::process::{Command, Output};

use mongodb::bson::doc;

use super::*;

/// `counterd <args>` through the proxy.
fn counterd(f: &Faulty, args: &[&str], extra: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_counterd"));
    command
        .args(args)
        .env_remove("COUNTERD_CONFIG")
        .env("COUNTERD_MONGODB_URI", f.proxy.uri())
        .env("COUNTERD_DATABASE", &f.t.name)
        .env("COUNTERD_CONNECT_TIMEOUT", "5s")
        .env("COUNTERD_SETTLE_TIME", "2s")
        .env("COUNTERD_CATCH_UP_TIMEOUT", "5s");
    for (k, v) in extra {
        command.env(k, v);
    }
    command.output().expect("run counterd")
}

fn said(o: &Output) -> String {
    format!(
        "exit {:?}\n{}{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The command met its fault: it finished anyway (0), or stopped with exit code 3, saying
/// what failed in words (not "transient": the command gave up). Returns whether it finished.
fn finished_or_stopped_cleanly(o: &Output) -> bool {
    match o.status.code() {
        Some(0) => true,
        Some(3) => {
            let said = said(o);
            assert!(
                [
                    "database error during",
                    "cannot reach MongoDB",
                    "no answer within"
                ]
                .iter()
                .any(|why| said.contains(why)),
                "says why: {said}"
            );
            assert!(!said.contains("transient"), "gave up: {said}");
            assert!(!said.contains("labels: {"), "no driver debug text: {said}");
            false
        }
        _ => panic!("a fault ends a one-shot with 0 or 3: {}", said(o)),
    }
}

/// Comments applied by a worker that then stops, leaving a quiet, drained stream.
async fn applied_then_stopped(test: &str) -> Faulty {
    let mut f = Faulty::new(test).await;
    let d = f.active_daemon(test, &[NO_RECONCILE]).await;
    f.insert(16).await;
    f.wait_exact().await;
    f.t.wait_drained(RECOVERY).await;
    assert_eq!(d.terminate(), Some(0));
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_by_hand_with_a_lost_fold_reply() {
    let f = applied_then_stopped("oneshot_reconcile").await;
    // Some drift to correct, so that the run writes folds.
    f.t.db
        .collection::<mongodb::bson::Document>("comment_counters")
        .update_one(
            doc! {"_id": "post-0"},
            doc! {"$inc": {"base_count": 3_i64, "count": 3_i64}},
        )
        .await
        .unwrap();
    f.proxy.drop_replies(on("update", "reconciled_at"), 1);
    let first = counterd(&f, &["reconcile", "--once"], &[]);
    assert!(f.proxy.wait_fired(RECOVERY).await, "{}", said(&first));
    if !finished_or_stopped_cleanly(&first) {
        let again = counterd(&f, &["reconcile", "--once"], &[]);
        assert_eq!(again.status.code(), Some(0), "{}", said(&again));
    }
    f.wait_exact().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_by_hand_with_a_lost_chunk_reply() {
    let mut f = Faulty::new("oneshot_snapshot").await;
    f.insert(30).await;
    let chunks = [("COUNTERD_SNAPSHOT_CHUNK_ROWS", "10")];
    f.proxy.drop_replies(on("update", "snapshot_chunk"), 1);
    let first = counterd(&f, &["snapshot"], &chunks);
    assert!(f.proxy.wait_fired(RECOVERY).await, "{}", said(&first));
    if !finished_or_stopped_cleanly(&first) {
        let again = counterd(&f, &["snapshot"], &chunks);
        assert_eq!(again.status.code(), Some(0), "{}", said(&again));
        assert!(
            said(&again).contains("resumed and finished"),
            "{}",
            said(&again)
        );
    }
    f.wait_exact().await;
    // The stream then counts what follows, once.
    let d = f.active_daemon("after_snapshot", &[NO_RECONCILE]).await;
    f.insert(8).await;
    f.wait_exact().await;
    assert_eq!(d.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_by_hand_with_a_lost_checkpoint_reply() {
    let mut f = applied_then_stopped("oneshot_replay").await;
    let from = counterd::cli::rfc3339(mongodb::bson::DateTime::from_millis(
        (now_secs() - 600) * 1000,
    ));
    f.proxy
        .drop_replies(on("update", "counterd_checkpoints"), 1);
    let first = counterd(&f, &["replay", "--from-time", &from, "--wait"], &[]);
    assert!(f.proxy.wait_fired(RECOVERY).await, "{}", said(&first));
    if !finished_or_stopped_cleanly(&first) {
        let again = counterd(&f, &["replay", "--from-time", &from, "--wait"], &[]);
        assert_eq!(again.status.code(), Some(0), "{}", said(&again));
    }
    // The re-read events were applied before: they only mark posts dirty.
    let d = f.active_daemon("after_replay", &[NO_RECONCILE]).await;
    f.insert(8).await;
    f.wait_exact().await;
    f.t.wait_drained(RECOVERY).await;
    f.wait_exact().await;
    assert_eq!(d.terminate(), Some(0));
}
