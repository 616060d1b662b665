//! Sums beside counts, end to end: the real `counterd run` keeping `rating` summed per author
//! with its row count (`with_count`) beside the default per-post count, while a writer inserts
//! rated comments, changes ratings (integers and halves), moves comments between authors,
//! soft-deletes, undeletes and hard-deletes them, and the daemon is killed with SIGKILL between
//! bursts and started again. At every caught-up moment (writers paused, the worker drained
//! past every acknowledged write) each author's sum and row count equal `$group` with `$sum`
//! over the live rows, read straight from `comments`. Drift injected into a sum and into a row
//! count is corrected and reported with its sign and size, under each counter's name.

#[path = "support/daemon.rs"]
mod daemon;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Bson, DateTime, Document};
use counterd::core::num::Num;
use daemon::Daemon;
use futures::TryStreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{quick_folds, schema_of, settings_file, TestDb};

const CONFIG: &str = r#"
[[counters]]
name = "rating"
group_field = "author_id"
kind = "sum"
field = "rating"
with_count = true
collection = "author_ratings"
"#;

const AUTHORS: i64 = 6;
const POSTS: i64 = 8;

/// What every author's live rows add up to, by the server's own `$group`: (sum, rows).
async fn truth(t: &TestDb) -> BTreeMap<String, (Num, i64)> {
    let pipeline = vec![
        doc! {"$match": {"deleted_at": Bson::Null}},
        doc! {"$group": {"_id": "$author_id", "sum": {"$sum": "$rating"}, "rows": {"$sum": 1}}},
    ];
    let docs: Vec<Document> = t
        .comments
        .aggregate(pipeline)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    docs.into_iter()
        .filter_map(|d| {
            let author = d.get_str("_id").ok()?.to_string();
            let sum = d.get("sum").and_then(Num::from_bson).unwrap_or_default();
            let rows = d.get("rows").and_then(Num::from_bson)?.as_i64();
            Some((author, (sum, rows)))
        })
        .collect()
}

/// What every author's counter document shows: (`count`, `rows.count`).
async fn shown(t: &TestDb) -> BTreeMap<String, (Num, i64)> {
    let docs: Vec<Document> =
        t.db.collection::<Document>("author_ratings")
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    docs.into_iter()
        .filter_map(|d| {
            let author = d.get_str("_id").ok()?.to_string();
            let sum = d.get("count").and_then(Num::from_bson).unwrap_or_default();
            let rows = d
                .get_document("rows")
                .ok()
                .and_then(|r| r.get("count"))
                .and_then(Num::from_bson)
                .unwrap_or_default()
                .as_i64();
            Some((author, (sum, rows)))
        })
        .collect()
}

/// Authors whose sum or row count differs from the truth: (author, shown, truth).
async fn mismatches(t: &TestDb) -> Vec<(String, (Num, i64), (Num, i64))> {
    let (truth, shown) = (truth(t).await, shown(t).await);
    let mut authors: Vec<&String> = truth.keys().chain(shown.keys()).collect();
    authors.sort();
    authors.dedup();
    authors
        .into_iter()
        .filter_map(|a| {
            let want = truth.get(a).copied().unwrap_or_default();
            let got = shown.get(a).copied().unwrap_or_default();
            (got.0.differs(want.0) || got.1 != want.1).then(|| (a.clone(), got, want))
        })
        .collect()
}

/// The application: rated comments, their ratings changed, moved between authors, deleted.
struct Writer {
    rng: StdRng,
    next_id: i64,
    ids: Vec<i64>,
}

impl Writer {
    fn rating(&mut self) -> Bson {
        // Integers mostly; halves make a sum a double (exact in binary, so sums compare).
        if self.rng.random_bool(0.2) {
            Bson::Double(self.rng.random_range(1..=10) as f64 / 2.0)
        } else {
            Bson::Int32(self.rng.random_range(1..=5))
        }
    }

    fn author(&mut self) -> String {
        format!("a{}", self.rng.random_range(0..AUTHORS))
    }

    fn row(&mut self, id: i64) -> Document {
        doc! {
            "_id": id,
            "post_id": self.rng.random_range(0..POSTS),
            "author_id": self.author(),
            "rating": self.rating(),
            "created_at": DateTime::from_millis(support::now_secs() * 1000),
        }
    }

    async fn insert(&mut self, t: &TestDb) {
        let id = self.next_id;
        self.next_id += 1;
        let row = self.row(id);
        t.comments.insert_one(row).await.unwrap();
        self.ids.push(id);
    }

    /// One change; what it did.
    async fn step(&mut self, t: &TestDb) -> &'static str {
        if self.ids.is_empty() || self.rng.random_bool(0.3) {
            self.insert(t).await;
            return "insert";
        }
        let at = self.rng.random_range(0..self.ids.len());
        let id = self.ids[at];
        let (what, update) = match self.rng.random_range(0..6) {
            0 | 1 => ("rating change", doc! {"$set": {"rating": self.rating()}}),
            2 => ("author change", doc! {"$set": {"author_id": self.author()}}),
            3 => (
                "soft delete",
                doc! {"$set": {"deleted_at": DateTime::from_millis(support::now_secs() * 1000)}},
            ),
            4 => ("undelete", doc! {"$unset": {"deleted_at": ""}}),
            _ => {
                t.comments.delete_one(doc! {"_id": id}).await.unwrap();
                self.ids.swap_remove(at);
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

/// The document of `author` in the sums' collection.
async fn counter_doc(t: &TestDb, author: &str) -> Document {
    t.db.collection::<Document>("author_ratings")
        .find_one(doc! {"_id": author})
        .await
        .unwrap()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_and_their_row_counts_stay_exact_under_kill_9_and_drift_is_corrected() {
    let t = TestDb::with_schema("sums", schema_of(CONFIG)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, CONFIG);
    let mut writer = Writer {
        rng: StdRng::seed_from_u64(42),
        next_id: 0,
        ids: Vec::new(),
    };
    let mut did = Vec::new();
    let mut daemon = Daemon::start(&t.uri, &t.name, "one", &quick_folds(Some(&config)));
    for round in 0..6 {
        did.extend(writer.burst(&t, 50).await);
        if round % 2 == 1 {
            // SIGKILL with writes in flight, more writes while it is down, then a restart
            // (the same owner takes its lease back at once).
            daemon.kill9();
            did.extend(writer.burst(&t, 20).await);
            daemon = Daemon::start(&t.uri, &t.name, "one", &quick_folds(Some(&config)));
        }
        t.wait_caught_up(Duration::from_secs(60)).await;
        let wrong = mismatches(&t).await;
        assert!(
            wrong.is_empty(),
            "round {round}: (author, shown (sum, rows), truth (sum, rows)) {wrong:?}"
        );
    }
    for kind in [
        "insert",
        "rating change",
        "author change",
        "soft delete",
        "undelete",
        "hard delete",
    ] {
        assert!(did.contains(&kind), "never written: {kind}");
    }
    let truth_now = truth(&t).await;
    assert!(
        truth_now.values().any(|(sum, _)| sum.is_double()),
        "some author's ratings include a half: {truth_now:?}"
    );

    // Drift: +2.5 into a2's sum, -1 into a3's row count (as an operator's hand edit would).
    let ratings = t.db.collection::<Document>("author_ratings");
    for (i, (author, update)) in [
        ("a2", doc! {"$inc": {"base_count": 2.5, "count": 2.5}}),
        (
            "a3",
            doc! {"$inc": {"rows.base_count": -1_i64, "rows.count": -1_i64}},
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let hit = ratings
            .update_one(doc! {"_id": author}, update)
            .await
            .unwrap();
        assert_eq!(hit.matched_count, 1, "no counter for {author}");
        // A new comment of the author dirties both of its counters.
        let mut row = writer.row(1_000_000 + i as i64);
        row.insert("author_id", author);
        t.comments.insert_one(row).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        t.wait_caught_up(Duration::from_secs(60)).await;
        let wrong = mismatches(&t).await;
        let sum_drift = counter_doc(&t, "a2").await.get("last_drift").cloned();
        let rows_drift = counter_doc(&t, "a3")
            .await
            .get_document("rows")
            .ok()
            .and_then(|r| r.get("last_drift").cloned());
        let reported = (
            daemon.drift_reported("rating").await,
            daemon.drift_reported("rating_rows").await,
        );
        if wrong.is_empty()
            && sum_drift == Some(Bson::Double(2.5))
            && rows_drift.as_ref().and_then(Num::from_bson) == Some(Num::Int(-1))
            && reported.0 .0 > 0
            && reported.1 .0 > 0
        {
            // Sign and size in the field's units: ran high by 2.5, the row count low by 1.
            assert!((reported.0 .1 - 2.5).abs() < 1e-9, "{reported:?}");
            assert!((reported.1 .1 - 1.0).abs() < 1e-9, "{reported:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drift not corrected and reported within 90 s: mismatches {wrong:?}, last drift {sum_drift:?} / {rows_drift:?}, reported {reported:?}"
        );
        writer.burst(&t, 5).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // `get` and `verify` read a sum in its field's units.
    t.wait_caught_up(Duration::from_secs(60)).await;
    let want = truth(&t).await["a2"].0;
    let looking = Instant::now() + Duration::from_secs(60);
    let got = loop {
        let o = t.counterd_with(&config, &["get", "a2", "--counter", "rating", "--json"]);
        assert!(o.status.success(), "get: {o:?}");
        let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        if got["in_flight"] != true {
            break got;
        }
        assert!(
            Instant::now() < looking,
            "get said 'in flight' for 60 s: {got}"
        );
    };
    assert_eq!(got["sum_of"], "rating", "{got}");
    let displayed = got["displayed"].as_f64().unwrap();
    assert!((displayed - want.as_f64()).abs() < 1e-9, "{got} vs {want}");
    assert_eq!(got["difference"].as_f64(), Some(0.0), "{got}");
    let text = t.counterd_with(&config, &["get", "a2", "--counter", "rating"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("sum of          `rating`") && text.contains("true sum"),
        "{text}"
    );
    for counter in ["rating", "rating_rows"] {
        let mut attempts = 0;
        let o = loop {
            attempts += 1;
            let o = t.counterd_with(&config, &["verify", "--counter", counter, "--sample", "20"]);
            if o.status.code() != Some(3) || attempts == 3 {
                break o;
            }
        };
        assert!(
            o.status.success(),
            "verify --counter {counter}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    assert_eq!(daemon.terminate(), Some(0), "counterd run stopped cleanly");
}
