//! Partitions beside a definition grouped by another field (issue 42, part B), end to end: the
//! real `counterd run`, in two processes that share the partitions, with `partitions = 2` and
//! `partitions = 4` and a per-author definition beside the default per-post one. A writer
//! inserts, moves comments between posts (and so between partitions), changes authors,
//! soft-deletes, undeletes and hard-deletes them, and one process is killed with SIGKILL with
//! writes in flight and started again. An author's counter is written by every partition that
//! owns one of the author's comments, each under its own guard: at every caught-up moment
//! (writers paused, every partition's worker drained past every acknowledged write) every
//! counter of both definitions equals its count query; drift injected into an author's counter
//! is folded away by a recount that waits for every partition; and the ledger stays divided
//! (about one entry per comment in total, not one per partition).

#[path = "support/daemon.rs"]
mod daemon;
mod support;

use std::time::{Duration, Instant};

use bson::{doc, Document};
use counterd::core::definition::Definition;
use counterd::core::key::CounterIx;
use counterd::core::key::GroupValue;
use counterd::core::partition::stream_names;
use counterd::store::prelude::*;
use daemon::Daemon;
use futures::TryStreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::TestDb;

const POSTS: i64 = 16;
const AUTHORS: i64 = 5;

/// The per-author definition, for the test's own store (its views count the truth).
fn schema() -> counterd::core::schema::Schema {
    counterd::core::schema::Schema::default().with_more(vec![Definition {
        name: "per_author".into(),
        group: "author_id".into(),
        condition: counterd::core::condition::Condition::default(),
        collection: "author_counters".into(),
        kind: counterd::core::definition::Kind::Count,
    }])
}

/// `counterd run`'s configuration: `partitions` beside the per-author definition.
fn config_file(dir: &tempfile::TempDir, partitions: u32) -> String {
    let path = dir.path().join("counterd.toml");
    let text = format!(
        "partitions = {partitions}\n\n[[counters]]\nname = \"per_author\"\ngroup_field = \"author_id\"\ncollection = \"author_counters\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// Short intervals (one-second buckets and settle time, folds every half second), no
/// background sweep, and each process working on half of the partitions.
fn env(config: &str, per_process: &str) -> Vec<(String, String)> {
    [
        ("COUNTERD_BUCKET_WIDTH", "1s"),
        ("COUNTERD_SETTLE_TIME", "1s"),
        ("COUNTERD_RECONCILE_INTERVAL", "500ms"),
        ("COUNTERD_BACKGROUND_SWEEP_PASS", "0s"),
        ("COUNTERD_MAX_PARTITIONS_PER_PROCESS", per_process),
        ("COUNTERD_CONFIG", config),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn start(t: &TestDb, owner: &str, env: &[(String, String)]) -> Daemon {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Daemon::start(&t.uri, &t.name, owner, &env)
}

fn author(n: i64) -> GroupValue {
    GroupValue::Str(format!("a{n}"))
}

/// Groups whose counter differs from its count query: (definition, group, displayed, truth).
async fn mismatches(t: &TestDb) -> Vec<(usize, GroupValue, i64, i64)> {
    let mut groups: Vec<(CounterIx, GroupValue)> = (0..POSTS)
        .map(|p| (CounterIx(0), GroupValue::Int(p)))
        .collect();
    groups.extend((0..AUTHORS).map(|a| (CounterIx(1), author(a))));
    let mut wrong = Vec::new();
    for (ix, group) in groups {
        let view = t.store.for_counter(ix);
        let (shown, truth) = counterd::store::displayed_and_truth(&view, &group)
            .await
            .unwrap();
        if shown.differs(truth) {
            wrong.push((ix.0, group, shown.as_i64(), truth.as_i64()));
        }
    }
    wrong
}

/// Waits until every partition's worker has applied every write acknowledged before this
/// call: each stream was found drained at a position after them, with no batch in flight.
async fn caught_up(t: &TestDb, partitions: u32, within: Duration) {
    let after = t.store.read_position().await.unwrap().upper;
    let deadline = Instant::now() + within;
    for (stream, _) in stream_names("comments", partitions) {
        loop {
            let c = t.store.load_checkpoint(&stream).await.unwrap();
            if c.is_some_and(|c| {
                c.pending.is_none() && c.caught_up_at.is_some_and(|at| at >= after)
            }) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the worker of {stream} did not catch up within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The application: random changes that move rows between posts (partitions) and authors.
struct Writer {
    rng: StdRng,
    next_id: i64,
    ids: Vec<i64>,
    /// Moves between posts written so far (each may leave a "not here" ledger entry behind).
    moves: usize,
}

impl Writer {
    fn new(seed: u64) -> Writer {
        Writer {
            rng: StdRng::seed_from_u64(seed),
            next_id: 0,
            ids: Vec::new(),
            moves: 0,
        }
    }

    fn row(&mut self, id: i64) -> Document {
        // Back-dated now and then: an old row lands below the watermark at once.
        let age = if self.rng.random_bool(0.2) { 3_600 } else { 0 };
        doc! {
            "_id": id,
            "post_id": self.rng.random_range(0..POSTS),
            "author_id": format!("a{}", self.rng.random_range(0..AUTHORS)),
            "created_at": bson::DateTime::from_millis((support::now_secs() - age) * 1000),
        }
    }

    /// One change; what it did.
    async fn step(&mut self, t: &TestDb) -> &'static str {
        if self.ids.is_empty() || self.rng.random_bool(0.3) {
            let id = self.next_id;
            self.next_id += 1;
            let row = self.row(id);
            t.comments.insert_one(row).await.unwrap();
            self.ids.push(id);
            return "insert";
        }
        let at = self.rng.random_range(0..self.ids.len());
        let id = self.ids[at];
        let (what, update) = match self.rng.random_range(0..6) {
            0 => {
                let a = self.rng.random_range(0..AUTHORS);
                (
                    "author change",
                    doc! {"$set": {"author_id": format!("a{a}")}},
                )
            }
            1 | 2 => {
                self.moves += 1;
                let p = self.rng.random_range(0..POSTS);
                ("move", doc! {"$set": {"post_id": p}})
            }
            3 => (
                "soft delete",
                doc! {"$set": {"deleted_at": bson::DateTime::from_millis(support::now_secs() * 1000)}},
            ),
            4 => ("undelete", doc! {"$unset": {"deleted_at": ""}}),
            _ => {
                self.ids.swap_remove(at);
                t.comments.delete_one(doc! {"_id": id}).await.unwrap();
                return "hard delete";
            }
        };
        t.comments
            .update_one(doc! {"_id": id}, update)
            .await
            .unwrap();
        what
    }

    async fn burst(&mut self, t: &TestDb, n: usize) -> Vec<&'static str> {
        let mut did = Vec::new();
        for _ in 0..n {
            did.push(self.step(t).await);
        }
        did
    }
}

/// Ledger entries of every partition, in total.
async fn ledger_entries(t: &TestDb, partitions: u32) -> u64 {
    let mut total = 0;
    for i in 0..partitions {
        let name = format!("counterd_comment_state_p{i}of{partitions}");
        total +=
            t.db.collection::<Document>(&name)
                .count_documents(doc! {})
                .await
                .unwrap();
    }
    total
}

/// The server's oplog entries (inserts, updates, deletes) of this test's database: those of
/// `comments` (the application's events) and those of every partition's ledger. A guarded
/// write that changes nothing leaves no entry, so this counts the ledger writes that happened.
async fn oplog_writes(t: &TestDb) -> (u64, u64) {
    let prefix = format!("{}.", t.db.name());
    let oplog =
        t.db.client()
            .database("local")
            .collection::<Document>("oplog.rs");
    let mut cursor = oplog
        .find(doc! {"op": {"$in": ["i", "u", "d"]}})
        .await
        .unwrap();
    let (mut events, mut ledger) = (0, 0);
    while let Some(entry) = cursor.try_next().await.unwrap() {
        match entry
            .get_str("ns")
            .ok()
            .and_then(|ns| ns.strip_prefix(&prefix))
        {
            Some("comments") => events += 1,
            Some(c) if c.starts_with("counterd_comment_state_") => ledger += 1,
            _ => {}
        }
    }
    (events, ledger)
}

/// Runs the scenario with `partitions` partitions shared by two processes.
async fn scenario(name: &str, partitions: u32, seed: u64) {
    let t = TestDb::with_schema(name, schema()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(&dir, partitions);
    let env = env(&config, &(partitions / 2).to_string());
    let mut a = start(&t, "a", &env);
    let b = start(&t, "b", &env);
    let mut writer = Writer::new(seed);
    let mut did = Vec::new();
    for round in 0..6 {
        did.extend(writer.burst(&t, 50).await);
        if round % 2 == 1 {
            // SIGKILL with writes in flight, more writes while it is down, then a restart
            // (the same owner takes its leases back at once).
            a.kill9();
            did.extend(writer.burst(&t, 20).await);
            a = start(&t, "a", &env);
        }
        caught_up(&t, partitions, Duration::from_secs(60)).await;
        let wrong = mismatches(&t).await;
        assert!(
            wrong.is_empty(),
            "{partitions} partitions, round {round}: (definition, group, displayed, truth) {wrong:?}"
        );
    }
    for kind in [
        "insert",
        "move",
        "author change",
        "soft delete",
        "undelete",
        "hard delete",
    ] {
        assert!(did.contains(&kind), "never written: {kind}");
    }
    // Several partitions wrote one author's counter, each under its own guard.
    let counters = t.db.collection::<Document>("author_counters");
    let shared = counters
        .count_documents(doc! {"writers": {"$exists": true}})
        .await
        .unwrap();
    assert!(shared > 0, "no author counter has a second writer");

    // The ledger stays divided: one entry per comment, plus one "not here" per move at most.
    let entries = ledger_entries(&t, partitions).await;
    let comments = writer.next_id as u64;
    assert!(
        entries <= comments + writer.moves as u64,
        "{entries} ledger entries for {comments} comments and {} moves",
        writer.moves
    );

    // About one ledger write per event in total (each event is written by the partition that
    // owns its row; a move between partitions by both), kill -9 and its re-applied intents
    // included: not one per partition.
    let (events, ledger) = oplog_writes(&t).await;
    let per_event = ledger as f64 / events.max(1) as f64;
    println!("{partitions} partitions: {ledger} ledger writes for {events} events ({per_event:.2} per event)");
    assert!(
        events > 0 && per_event <= 1.3,
        "{partitions} partitions: {ledger} ledger writes for {events} events ({per_event:.2} per event)"
    );

    // Drift in an author's counter, then a new comment of that author (which dirties it): the
    // fold, which waits for every partition, corrects it.
    let hit = counters
        .update_one(
            doc! {"_id": "a2"},
            doc! {"$inc": {"base_count": -3_i64, "count": -3_i64}},
        )
        .await
        .unwrap();
    assert_eq!(hit.matched_count, 1, "no counter for a2");
    let mut row = writer.row(1_000_000);
    row.insert("author_id", "a2");
    t.comments.insert_one(row).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        writer.burst(&t, 10).await;
        caught_up(&t, partitions, Duration::from_secs(60)).await;
        let wrong = mismatches(&t).await;
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{partitions} partitions: drift not corrected within 90 s: {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reconciled = counters
        .find_one(doc! {"_id": "a2"})
        .await
        .unwrap()
        .unwrap();
    assert!(
        reconciled.get_i64("folds").unwrap_or(0) > 0,
        "a2 was folded: {reconciled}"
    );
    a.terminate();
    b.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_partitions_keep_a_per_author_counter_exact_under_kill_9() {
    scenario("parts2", 2, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_partitions_keep_a_per_author_counter_exact_under_kill_9() {
    scenario("parts4", 4, 11).await;
}
