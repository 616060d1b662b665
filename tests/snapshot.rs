//! The initial snapshot against the test database, as real `counterd run` processes: an
//! existing `comments` collection is counted with writers running during the scan, a `kill -9`
//! halfway resumes from the last chunk, and afterwards changes to the pre-existing comments
//! (hard deletes, moves, undeletes, without pre-images) are counted exactly with no reconcile.

mod support;

#[path = "support/daemon.rs"]
mod daemon;

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::{Duration, Instant};

use counterd::config::InitialSnapshot;
use counterd::core::key::GroupValue;
use counterd::snapshot::SnapshotSettings;
use counterd::store::prelude::*;
use counterd::store::{SnapshotProgress, SnapshotState};
use counterd::worker::WorkerSettings;
use daemon::Daemon;
use mongodb::bson::{doc, DateTime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{now_secs, output_text, TestDb};

const ROWS: i64 = 10_000;
const POSTS: i64 = 1_000;
/// Comments inserted by the writers: ids above the seed's, interleaved between the two
/// writers (as time-ordered ObjectIds of two application servers would be).
const NEW_IDS: i64 = 1_000_000;

fn post(i: i64) -> GroupValue {
    GroupValue::Int(i)
}

/// 10 000 comments over 1 000 posts, a tenth of them soft-deleted, created over the past day.
async fn seed(t: &TestDb) {
    let docs: Vec<_> = (0..ROWS)
        .map(|i| {
            let created = DateTime::from_millis((now_secs() - 86_400 + i * 8) * 1000);
            let mut d = doc! {"_id": i, "post_id": i % POSTS, "created_at": created};
            if i % 10 == 3 {
                d.insert("deleted_at", DateTime::now());
            }
            d
        })
        .collect();
    for chunk in docs.chunks(2000) {
        t.comments.insert_many(chunk.to_vec()).await.unwrap();
    }
    // A stream started now on the fake server also delivers the current second's events:
    // start in a later one, so the stream sees none of the seed and the snapshot counts it all.
    support::next_second().await;
}

/// Changes pre-existing and new comments until `stop`: soft deletes, undeletes, moves, hard
/// deletes and inserts.
async fn write_until(t: Arc<TestDb>, stop: tokio::sync::watch::Receiver<bool>, seed: u64) -> u64 {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !*stop.borrow() {
        let old = rng.random_range(0..ROWS);
        let p = rng.random_range(0..POSTS);
        let _ = match rng.random_range(0..10) {
            0..=2 => t
                .comments
                .insert_one(doc! {"_id": NEW_IDS + 2 * n as i64 + seed as i64, "post_id": p, "created_at": DateTime::now()})
                .await
                .map(|_| ()),
            3..=4 => t.comments.update_one(doc! {"_id": old}, doc! {"$set": {"deleted_at": DateTime::now()}}).await.map(|_| ()),
            5..=6 => t.comments.update_one(doc! {"_id": old}, doc! {"$unset": {"deleted_at": ""}}).await.map(|_| ()),
            7..=8 => t.comments.update_one(doc! {"_id": old}, doc! {"$set": {"post_id": p}}).await.map(|_| ()),
            _ => t.comments.delete_one(doc! {"_id": old}).await.map(|_| ()),
        };
        n += 1;
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    n
}

async fn progress(t: &TestDb) -> Option<SnapshotProgress> {
    t.store
        .load_checkpoint("comments")
        .await
        .unwrap()
        .and_then(|c| c.snapshot)
}

async fn wait_for(
    t: &TestDb,
    within: Duration,
    what: &str,
    done: impl Fn(&SnapshotProgress) -> bool,
) -> SnapshotProgress {
    let deadline = Instant::now() + within;
    loop {
        if let Some(p) = progress(t).await {
            if done(&p) {
                return p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}: {:?}",
            progress(t).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// No reconcile runs (so nothing is folded): the snapshot and the stream alone must be exact.
const NO_RECONCILE: [(&str, &str); 5] = [
    // The fake server scans a whole collection for every guarded write (issue #16): batches
    // against a 10 000-entry ledger take seconds there.
    ("COUNTERD_OPERATION_TIMEOUT", "30s"),
    ("COUNTERD_RECONCILE_INTERVAL", "1h"),
    ("COUNTERD_BACKGROUND_SWEEP_PASS", "0s"),
    ("COUNTERD_SNAPSHOT_ROWS_PER_SECOND", "2500"),
    ("COUNTERD_SNAPSHOT_CHUNK_ROWS", "500"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_collection_is_counted_under_writes_and_a_kill_resumes_from_the_last_chunk() {
    let t = Arc::new(TestDb::new("snapshot").await);
    seed(&t).await;
    let all: Vec<GroupValue> = (0..POSTS).map(post).collect();

    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let writers: Vec<_> = (0..2)
        .map(|w| tokio::spawn(write_until(t.clone(), stop_rx.clone(), w)))
        .collect();
    let first = Daemon::start(&t.uri, &t.name, "snap", &NO_RECONCILE);
    // Halfway through the scan, kill -9.
    let halfway = wait_for(
        &t,
        Duration::from_secs(60),
        "the snapshot reached half",
        |p| p.rows_scanned >= (ROWS / 2) as u64,
    )
    .await;
    assert_eq!(halfway.state, SnapshotState::Running);
    first.kill9();
    let killed_at = progress(&t).await.unwrap();
    let second = Daemon::start(&t.uri, &t.name, "snap", &NO_RECONCILE);
    let done = wait_for(&t, Duration::from_secs(60), "the snapshot finished", |p| {
        p.state == SnapshotState::Done
    })
    .await;
    eprintln!("killed at {killed_at:?}\ndone: {done:?}");
    assert!(
        done.chunks_reread <= 1,
        "at most the chunk being read at the kill is read twice: {done:?}"
    );
    assert!(
        done.chunks_resumed + done.chunks_reread <= 1,
        "one kill leaves at most one chunk in flight: {done:?}"
    );
    assert!(
        done.rows_scanned <= ROWS as u64,
        "no row scanned twice: {done:?}"
    );
    assert!(done.chunks_done >= done.rows_scanned / 500);
    assert!(
        done.rows_counted > (ROWS as u64) / 2,
        "the snapshot, not the stream, counted most rows: {done:?}"
    );

    // Writers keep going a moment after the snapshot, then stop; once the worker has applied
    // everything, every counter is exact without any reconcile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    let mut writes = 0;
    for w in writers {
        writes += w.await.unwrap();
    }
    assert!(
        writes > 100,
        "writers ran during the snapshot ({writes} writes)"
    );
    t.wait_exact(&all, Duration::from_secs(30)).await;
    let runs = t.store.last_run().await.unwrap();
    assert!(runs.is_none(), "no reconcile ran: {runs:?}");

    // Changes to comments the snapshot claimed are attributed through the ledger it built:
    // hard deletes, moves, soft deletes and undeletes, with no pre-images.
    for i in (0..ROWS).step_by(97).take(60) {
        let before = t.comments.find_one(doc! {"_id": i}).await.unwrap();
        if before.is_none() {
            continue; // hard-deleted by a writer
        }
        match i % 4 {
            0 => drop(t.comments.delete_one(doc! {"_id": i}).await.unwrap()),
            1 => drop(
                t.comments
                    .update_one(doc! {"_id": i}, doc! {"$set": {"post_id": (i * 7) % POSTS}})
                    .await
                    .unwrap(),
            ),
            2 => drop(
                t.comments
                    .update_one(
                        doc! {"_id": i},
                        doc! {"$set": {"deleted_at": DateTime::now()}},
                    )
                    .await
                    .unwrap(),
            ),
            _ => drop(
                t.comments
                    .update_one(doc! {"_id": i}, doc! {"$unset": {"deleted_at": ""}})
                    .await
                    .unwrap(),
            ),
        }
    }
    t.wait_exact(&all, Duration::from_secs(30)).await;
    assert!(
        t.store.last_run().await.unwrap().is_none(),
        "still no reconcile"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn folds_wait_for_the_snapshot_and_never_count_a_row_twice() {
    let t = Arc::new(TestDb::new("snapfold").await);
    seed(&t).await;
    let all: Vec<GroupValue> = (0..POSTS).map(post).collect();
    // A slow snapshot with reconciles every second: every dirty post waits for it.
    let settings = [
        ("COUNTERD_OPERATION_TIMEOUT", "30s"),
        ("COUNTERD_SNAPSHOT_ROWS_PER_SECOND", "2000"),
        ("COUNTERD_SNAPSHOT_CHUNK_ROWS", "1000"),
        ("COUNTERD_BACKGROUND_SWEEP_PASS", "0s"),
    ];
    let daemon = Daemon::start(&t.uri, &t.name, "snapfold", &settings);
    wait_for(&t, Duration::from_secs(20), "the snapshot started", |p| {
        p.rows_scanned > 0
    })
    .await;
    // Dirty some posts while the snapshot runs.
    for i in 0..50 {
        t.comments
            .insert_one(doc! {"_id": 1_000_000 + i, "post_id": i % 20, "created_at": DateTime::from_millis((now_secs() - 3600) * 1000)})
            .await
            .unwrap();
    }
    wait_for(&t, Duration::from_secs(60), "the snapshot finished", |p| {
        p.state == SnapshotState::Done
    })
    .await;
    t.wait_exact(&all, Duration::from_secs(30)).await;
    // Reconciles ran meanwhile: while the snapshot ran they folded nothing (posts waited), and
    // afterwards they found no drift.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dirty = t.store.dirty_summary().await.unwrap().size;
        if dirty == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "dirty posts left: {dirty}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut corrected = 0;
    let runs = t.store.recent_runs(1000).await.unwrap();
    let mut waited = 0;
    for r in &runs {
        corrected += r.corrected;
        waited += r.waiting_for_snapshot;
    }
    assert!(waited > 0, "some run found the snapshot running: {runs:?}");
    assert_eq!(corrected, 0, "no fold corrected anything: {runs:?}");
    t.wait_exact(&all, Duration::from_secs(5)).await;
    drop(daemon);
}

fn counterd(t: &TestDb, args: &[&str]) -> Output {
    t.counterd()
        .args(args)
        .env("COUNTERD_SNAPSHOT_ROWS_PER_SECOND", "0")
        .env("COUNTERD_OPERATION_TIMEOUT", "30s")
        .output()
        .expect("run counterd")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counterd_snapshot_takes_it_by_hand_and_refuses_a_stream_that_already_counts() {
    let t = TestDb::new("snapcmd").await;
    for i in 0..300_i64 {
        t.comments
            .insert_one(doc! {"_id": i, "post_id": i % 30, "created_at": DateTime::from_millis((now_secs() - 7200) * 1000)})
            .await
            .unwrap();
    }
    support::next_second().await;
    let all: Vec<GroupValue> = (0..30).map(post).collect();
    let o = counterd(&t, &["snapshot"]);
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("snapshot taken"),
        "{}",
        output_text(&o)
    );
    let done = progress(&t).await.unwrap();
    assert_eq!((done.state, done.rows_counted), (SnapshotState::Done, 300));
    t.wait_exact(&all, Duration::from_secs(1)).await;
    // Again: nothing to do.
    let o = counterd(&t, &["snapshot"]);
    assert!(
        o.status.success() && output_text(&o).contains("already done"),
        "{}",
        output_text(&o)
    );
    // `run` (with initial_snapshot = never) continues from the snapshot's pinned start, and a
    // hard delete of a snapshotted comment is attributed through the ledger it built.
    let daemon = Daemon::start(
        &t.uri,
        &t.name,
        "after-snapshot",
        &[
            ("COUNTERD_INITIAL_SNAPSHOT", "never"),
            ("COUNTERD_RECONCILE_INTERVAL", "1h"),
        ],
    );
    assert!(daemon.wait_role("active", Duration::from_secs(20)).await);
    t.comments.delete_one(doc! {"_id": 7_i64}).await.unwrap();
    t.comments
        .update_one(doc! {"_id": 8_i64}, doc! {"$set": {"post_id": 9_i64}})
        .await
        .unwrap();
    t.wait_exact(&all, Duration::from_secs(20)).await;
    assert_eq!(t.displayed(&post(7)).await, 9);
    drop(daemon);

    // A stream that applied events without a snapshot already counts: refused, exit 1.
    let other = TestDb::new("snapcmd2").await;
    let worker = other
        .spawn_worker(WorkerSettings {
            snapshot: SnapshotSettings {
                initial: InitialSnapshot::Never,
                ..Default::default()
            },
            ..other.worker_settings()
        })
        .await;
    other
        .comments
        .insert_one(doc! {"_id": 1_i64, "post_id": 1_i64, "created_at": DateTime::now()})
        .await
        .unwrap();
    other.wait_exact(&[post(1)], Duration::from_secs(20)).await;
    other.wait_drained(Duration::from_secs(20)).await;
    worker.shutdown().await.unwrap();
    let o = counterd(&other, &["snapshot"]);
    assert_eq!(o.status.code(), Some(1), "{}", output_text(&o));
    assert!(
        output_text(&o).contains("reconcile --sweep"),
        "{}",
        output_text(&o)
    );
}

/// Until the initial snapshot is done no counter can be compared with the truth: `verify`
/// and `get` exit 5 (not yet verifiable), which a script tells apart from 1 (differs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_and_get_say_not_yet_while_the_snapshot_runs() {
    let t = TestDb::new("snapnotyet").await;
    for i in 0..40_i64 {
        t.comments
            .insert_one(doc! {"_id": i, "post_id": i % 4, "created_at": DateTime::from_millis((now_secs() - 7200) * 1000)})
            .await
            .unwrap();
    }
    support::next_second().await;
    // One row per chunk, one row per second: the snapshot runs for the whole test.
    let mut slow = Command::new(env!("CARGO_BIN_EXE_counterd"))
        .args(["snapshot"])
        .env("COUNTERD_MONGODB_URI", &t.uri)
        .env("COUNTERD_DATABASE", &t.name)
        .env("COUNTERD_SNAPSHOT_CHUNK_ROWS", "1")
        .env("COUNTERD_SNAPSHOT_ROWS_PER_SECOND", "1")
        .env_remove("COUNTERD_CONFIG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&t, Duration::from_secs(30), "the snapshot started", |p| {
        p.state == SnapshotState::Running
    })
    .await;
    let verify = counterd(&t, &["verify"]);
    let get = counterd(&t, &["get", "post-1"]);
    let still_running = progress(&t).await.map(|p| p.state) == Some(SnapshotState::Running);
    let _ = slow.kill();
    let _ = slow.wait();
    assert!(still_running, "the snapshot ended before the checks");
    assert_eq!(verify.status.code(), Some(5), "{}", output_text(&verify));
    assert!(
        output_text(&verify).contains("initial snapshot is still counting"),
        "{}",
        output_text(&verify)
    );
    assert_eq!(get.status.code(), Some(5), "{}", output_text(&get));
    assert!(
        output_text(&get).contains("not compared"),
        "{}",
        output_text(&get)
    );
}
