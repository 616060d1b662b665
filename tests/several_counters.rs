//! Several counters from one stream, end to end: the real `counterd run` with three definitions
//! on `comments` (per post, the default; per author; approved comments per post) under a writer
//! that inserts, approves and unapproves, changes authors, moves posts, soft-deletes and
//! undeletes, while each definition's counters get drift injected by hand. At every caught-up
//! moment (writers paused, the worker drained past every acknowledged write) every counter of
//! every definition equals its count query; the reconciler corrects the injected drift and
//! reports it under the counter's label. And an existing single-definition database keeps
//! working when `[[counters]]` is added; and a second source collection (`likes`, a
//! `[[sources]]` entry with two counters of its own) runs beside the comments in the same
//! process, exact at every caught-up moment of both streams.

#[path = "support/daemon.rs"]
mod daemon;
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bson::{doc, Bson, DateTime, Document};
use counterd::core::key::CounterIx;
use counterd::core::key::GroupValue;
use counterd::store::prelude::*;
use daemon::Daemon;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use support::{quick_folds, schema_of, settings_file, TestDb};

const DEFINITIONS: &str = r#"
[[counters]]
name = "per_author"
group_field = "author_id"
collection = "author_counters"

[[counters]]
name = "approved"
group_field = "post_id"
condition = { approved = true }
collection = "approved_counters"
"#;

const POSTS: i64 = 12;
const AUTHORS: i64 = 5;

fn author(n: i64) -> GroupValue {
    GroupValue::Str(format!("a{n}"))
}

/// Every group of every definition the writer can touch: (definition, group).
fn groups() -> Vec<(CounterIx, GroupValue)> {
    let posts = (0..POSTS).map(GroupValue::Int);
    let mut all: Vec<(CounterIx, GroupValue)> = posts.clone().map(|p| (CounterIx(0), p)).collect();
    all.extend((0..AUTHORS).map(|a| (CounterIx(1), author(a))));
    all.extend(posts.map(|p| (CounterIx(2), p)));
    all
}

/// Groups whose counter differs from its count query: (definition, group, displayed, truth).
async fn mismatches(t: &TestDb) -> Vec<(usize, GroupValue, i64, i64)> {
    mismatches_in(&t.store, groups()).await
}

/// [`mismatches`] among `groups` of the source `store` reads.
async fn mismatches_in(
    store: &counterd::store::mongo::MongoStore,
    groups: Vec<(CounterIx, GroupValue)>,
) -> Vec<(usize, GroupValue, i64, i64)> {
    let mut wrong = Vec::new();
    for (ix, group) in groups {
        let view = store.for_counter(ix);
        let (shown, truth) = counterd::store::displayed_and_truth(&view, &group)
            .await
            .unwrap();
        if shown.differs(truth) {
            wrong.push((ix.0, group, shown.as_i64(), truth.as_i64()));
        }
    }
    wrong
}

/// The application: random changes to `comments` that move rows between every definition's
/// groups and in and out of the condition.
struct Writer {
    rng: StdRng,
    next_id: i64,
    ids: Vec<i64>,
}

impl Writer {
    fn new(seed: u64) -> Writer {
        Writer {
            rng: StdRng::seed_from_u64(seed),
            next_id: 0,
            ids: Vec::new(),
        }
    }

    fn row(&mut self, id: i64) -> Document {
        let post = self.rng.random_range(0..POSTS);
        let author = self.rng.random_range(0..AUTHORS);
        // Back-dated now and then: an old row lands below the watermark at once.
        let age = if self.rng.random_bool(0.2) { 3_600 } else { 0 };
        doc! {
            "_id": id,
            "post_id": post,
            "author_id": format!("a{author}"),
            "approved": self.rng.random_bool(0.5),
            "created_at": DateTime::from_millis((support::now_secs() - age) * 1000),
        }
    }

    /// One change; what it did, for the failure message.
    async fn step(&mut self, t: &TestDb) -> &'static str {
        let comments = &t.comments;
        if self.ids.is_empty() || self.rng.random_bool(0.3) {
            let id = self.next_id;
            self.next_id += 1;
            let row = self.row(id);
            comments.insert_one(row).await.unwrap();
            self.ids.push(id);
            return "insert";
        }
        let id = self.ids[self.rng.random_range(0..self.ids.len())];
        let (what, update) = match self.rng.random_range(0..6) {
            0 => ("approve", doc! {"$set": {"approved": true}}),
            1 => ("unapprove", doc! {"$set": {"approved": false}}),
            2 => {
                let a = self.rng.random_range(0..AUTHORS);
                (
                    "author change",
                    doc! {"$set": {"author_id": format!("a{a}")}},
                )
            }
            3 => {
                let p = self.rng.random_range(0..POSTS);
                ("move", doc! {"$set": {"post_id": p}})
            }
            4 => (
                "soft delete",
                doc! {"$set": {"deleted_at": DateTime::from_millis(support::now_secs() * 1000)}},
            ),
            _ => ("undelete", doc! {"$unset": {"deleted_at": ""}}),
        };
        comments.update_one(doc! {"_id": id}, update).await.unwrap();
        what
    }

    /// A burst of `n` changes.
    async fn burst(&mut self, t: &TestDb, n: usize) -> BTreeSet<&'static str> {
        let mut did = BTreeSet::new();
        for _ in 0..n {
            did.insert(self.step(t).await);
        }
        did
    }
}

/// Adds `k` to a counter by hand (`base_count` and `count`, as an operator's edit would), for
/// the definition `ix`'s group.
async fn inject(t: &TestDb, collection: &str, group: &GroupValue, k: i64) {
    let hit =
        t.db.collection::<Document>(collection)
            .update_one(
                doc! {"_id": group.to_bson()},
                doc! {"$inc": {"base_count": k, "count": k}},
            )
            .await
            .unwrap();
    assert_eq!(hit.matched_count, 1, "no counter {group} in {collection}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_definitions_stay_exact_and_their_drift_is_corrected_per_counter() {
    let t = TestDb::with_schema("three_definitions", schema_of(DEFINITIONS)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, DEFINITIONS);
    let daemon = Daemon::start(&t.uri, &t.name, "one", &quick_folds(Some(&config)));
    let mut writer = Writer::new(26);
    let mut seen = BTreeSet::new();

    // Writes continue between caught-up moments; at each, every counter is exact.
    for round in 0..6 {
        seen.extend(writer.burst(&t, 60).await);
        t.wait_caught_up(Duration::from_secs(30)).await;
        let wrong = mismatches(&t).await;
        assert!(
            wrong.is_empty(),
            "round {round}: (definition, group, displayed, truth) {wrong:?}"
        );
    }
    assert_eq!(seen.len(), 7, "every kind of change was written: {seen:?}");

    // Drift in each definition's counters, then more writes (which dirty those groups too).
    let hit = [
        ("comment_counters", "default", GroupValue::Int(3), 4),
        ("author_counters", "per_author", author(2), -3),
        ("approved_counters", "approved", GroupValue::Int(5), 2),
    ];
    for (collection, _, group, k) in &hit {
        inject(&t, collection, group, *k).await;
    }
    // A new comment in every injected group, so each is dirty and folded.
    let mut row = writer.row(1_000_000);
    row.insert("post_id", 3_i64);
    t.comments.insert_one(row).await.unwrap();
    let mut row = writer.row(1_000_001);
    row.insert("author_id", "a2");
    t.comments.insert_one(row).await.unwrap();
    let mut row = writer.row(1_000_002);
    row.insert("post_id", 5_i64);
    row.insert("approved", true);
    t.comments.insert_one(row).await.unwrap();

    // Writes continue; the drift must be folded away and reported under each counter's label.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        writer.burst(&t, 20).await;
        t.wait_caught_up(Duration::from_secs(30)).await;
        let wrong = mismatches(&t).await;
        let mut reported = Vec::new();
        for (_, name, _, _) in &hit {
            reported.push(daemon.drift_reported(name).await.0);
        }
        if wrong.is_empty() && reported.iter().all(|n| *n > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "drift not corrected and reported within 60 s: mismatches {wrong:?}, drift samples per counter {reported:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The commands read a definition's counters with `--counter` (writers paused, caught up).
    t.wait_caught_up(Duration::from_secs(30)).await;
    for (counter, ix, group) in [
        ("per_author", 1, author(2)),
        ("approved", 2, GroupValue::Int(5)),
        ("default", 0, GroupValue::Int(3)),
    ] {
        let shown = group.to_string();
        // `get` compares only at a point the worker has caught up to; a loaded machine can
        // make one look find a change still in flight (it says so): look again.
        let looking = Instant::now() + Duration::from_secs(60);
        let got = loop {
            let o = t.counterd_with(&config, &["get", &shown, "--counter", counter, "--json"]);
            assert!(o.status.success(), "get --counter {counter}: {o:?}");
            let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if got["in_flight"] != true {
                break got;
            }
            assert!(
                Instant::now() < looking,
                "get --counter {counter} {group} said 'in flight' for 60 s: {got}"
            );
        };
        let truth = t
            .store
            .for_counter(CounterIx(ix))
            .count_live(&group)
            .await
            .unwrap();
        let truth = truth.as_i64();
        assert_eq!(got["true_count"], truth, "{counter} {group}: {got}");
        assert_eq!(got["displayed"], truth, "{counter} {group}: {got}");
        // A one-shot command against a loaded test server can lose its connection (exit 3,
        // said on stderr); what is asserted is the comparison, so such a run is repeated.
        let mut attempts = 0;
        let o = loop {
            attempts += 1;
            let o = t.counterd_with(&config, &["verify", "--counter", counter, "--sample", "50"]);
            if o.status.code() != Some(3) || attempts == 3 {
                break o;
            }
            eprintln!(
                "verify --counter {counter} could not reach the server, again: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        assert!(
            o.status.success(),
            "verify --counter {counter} ({:?}): {}{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // Configured from the start, the definitions were counted by the initial snapshot: marked
    // adopted without a sweep of their own.
    for marker in ["comments#per_author#adopted", "comments#approved#adopted"] {
        let found = ids(&t, "counterd_sweeps", doc! {"_id": marker}).await;
        assert_eq!(found.len(), 1, "{marker}");
    }
    let sweeps = ids(&t, "counterd_reconcile_runs", doc! {"kind": "sweep"}).await;
    assert!(sweeps.is_empty(), "no sweep ran: {sweeps:?}");
    // The counters are where readers look for them, one collection per definition.
    for collection in ["comment_counters", "author_counters", "approved_counters"] {
        let n =
            t.db.collection::<Document>(collection)
                .estimated_document_count()
                .await
                .unwrap();
        assert!(n > 0, "{collection} is empty");
    }
    let status = daemon.terminate();
    assert_eq!(status, Some(0), "counterd run stopped cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_definition_database_keeps_working_when_counters_are_added() {
    let t = TestDb::with_schema("upgrade_to_definitions", schema_of(DEFINITIONS)).await;
    // Before: today's configuration, one definition.
    let before = Daemon::start(&t.uri, &t.name, "old", &quick_folds(None));
    let mut writer = Writer::new(7);
    writer.burst(&t, 80).await;
    t.wait_caught_up(Duration::from_secs(30)).await;
    let posts: Vec<GroupValue> = (0..POSTS).map(GroupValue::Int).collect();
    t.wait_exact(&posts, Duration::from_secs(30)).await;
    let old_counters = ids(&t, "comment_counters", doc! {}).await;
    assert_eq!(before.terminate(), Some(0));

    // After: the same database with `[[counters]]` added.
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, DEFINITIONS);
    let after = Daemon::start(&t.uri, &t.name, "new", &quick_folds(Some(&config)));
    // Every group of every definition changes once more, so each is dirty and recounted.
    for p in 0..POSTS {
        let mut row = writer.row(2_000_000 + p);
        row.insert("post_id", p);
        row.insert("approved", true);
        row.insert("author_id", format!("a{}", p % AUTHORS));
        t.comments.insert_one(row).await.unwrap();
    }
    writer.burst(&t, 40).await;
    t.wait_caught_up(Duration::from_secs(30)).await;
    // The default definition's counters were exact at the upgrade and stay exact at once.
    let wrong: Vec<_> = mismatches(&t)
        .await
        .into_iter()
        .filter(|(ix, ..)| *ix == 0)
        .collect();
    assert!(
        wrong.is_empty(),
        "default counters after the upgrade: {wrong:?}"
    );
    // The new definitions' counters start from the recounts of their dirty groups.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        t.wait_caught_up(Duration::from_secs(30)).await;
        let wrong = mismatches(&t).await;
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counters after the upgrade not exact within 60 s: {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Existing collections kept their names: the same counter documents, the same dirty set.
    let still = ids(
        &t,
        "comment_counters",
        doc! {"_id": {"$in": old_counters.clone()}},
    )
    .await;
    assert_eq!(still.len(), old_counters.len());
    has_collections(
        &t,
        &[
            "counterd_dirty",
            "counterd_checkpoints",
            "author_counters",
            "approved_counters",
        ],
    )
    .await;
    assert_eq!(after.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn definitions_added_later_are_adopted_without_a_new_write() {
    let t = TestDb::with_schema("adopt_definitions", schema_of(DEFINITIONS)).await;
    // Before: one definition, rows in every group.
    let before = Daemon::start(&t.uri, &t.name, "old", &quick_folds(None));
    Writer::new(13).burst(&t, 80).await;
    t.wait_caught_up(Duration::from_secs(30)).await;
    assert_eq!(before.terminate(), Some(0));
    let default_only = mismatches(&t).await;
    assert!(
        default_only.iter().all(|(ix, ..)| *ix != 0) && !default_only.is_empty(),
        "the default exact, the others absent: {default_only:?}"
    );

    // After: the definitions added, and no write at all: each new definition is swept once.
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, DEFINITIONS);
    // A settle time longer than the restart: the newest rows are above the first watermarks,
    // where a fold trusts the stream, which counted them before the definitions existed.
    let mut env = quick_folds(Some(&config));
    env.push(("COUNTERD_SETTLE_TIME", "5s"));
    let after = Daemon::start(&t.uri, &t.name, "new", &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let wrong = mismatches(&t).await;
        if wrong.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "definitions not adopted within 60 s: {wrong:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Adopted once: a marker per new definition beside the background sweep's cursors,
    // written just after its sweep's last fold.
    for marker in ["comments#per_author#adopted", "comments#approved#adopted"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        while ids(&t, "counterd_sweeps", doc! {"_id": marker})
            .await
            .is_empty()
        {
            let all = ids(&t, "counterd_sweeps", doc! {}).await;
            assert!(Instant::now() < deadline, "no {marker} in {all:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(after.terminate(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_by_hand_covers_every_definition_before_it_clears_the_request() {
    let t = TestDb::with_schema("sweep_every_definition", schema_of(DEFINITIONS)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, DEFINITIONS);
    let daemon = Daemon::start(&t.uri, &t.name, "sweeper", &quick_folds(Some(&config)));
    Writer::new(11).burst(&t, 60).await;
    t.wait_caught_up(Duration::from_secs(30)).await;
    assert_eq!(daemon.terminate(), Some(0));
    // Drift in one counter of every definition, and a sweep requested (as after lost history).
    for collection in ["comment_counters", "author_counters", "approved_counters"] {
        let first = ids(&t, collection, doc! {}).await;
        let group = GroupValue::from_bson(&first[0]).unwrap();
        inject(&t, collection, &group, 3).await;
    }
    t.store.set_sweep_requested("comments", true).await.unwrap();
    let requested = || async {
        let c = t.store.load_checkpoint("comments").await.unwrap().unwrap();
        c.sweep_requested
    };
    let wrong_in = |wrong: &[(usize, GroupValue, i64, i64)], ix: usize| {
        wrong.iter().filter(|w| w.0 == ix).count()
    };

    // One definition by hand: its drift is corrected; the request stays for the others.
    let o = t.counterd_with(
        &config,
        &["reconcile", "--sweep", "--counter", "per_author", "--json"],
    );
    assert!(o.status.success(), "{o:?}");
    let wrong = mismatches(&t).await;
    assert_eq!(wrong_in(&wrong, 1), 0, "{wrong:?}");
    assert_eq!(
        (wrong_in(&wrong, 0), wrong_in(&wrong, 2)),
        (1, 1),
        "{wrong:?}"
    );
    assert!(
        requested().await,
        "one definition's sweep does not clear the request"
    );

    // Without --counter: every definition, one report each; then the request is cleared.
    let o = t.counterd_with(&config, &["reconcile", "--sweep", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let reports: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let counters: Vec<&str> = reports
        .as_array()
        .unwrap()
        .iter()
        // The default's runs carry no name (as every run stored before definitions existed).
        .map(|r| r["summary"]["counter"].as_str().unwrap_or("default"))
        .collect();
    assert_eq!(counters, ["default", "per_author", "approved"], "{reports}");
    assert!(mismatches(&t).await.is_empty());
    assert!(
        !requested().await,
        "every definition swept: the request is cleared"
    );
}

/// A second source: likes per post (the source's first counter, named after it) and per user,
/// with their own soft-delete field; the comments' three definitions stay as they are.
const LIKES: &str = r#"
[[sources]]
name = "likes"
collection = "likes"
group_field = "post_id"
counters_collection = "like_counters"
soft_delete_field = "unliked_at"

[[sources.counters]]
name = "likes_by_user"
group_field = "user_id"
collection = "likes_by_user"
"#;

const USERS: i64 = 4;

/// The `likes` source as its own store (its collections, schema and definitions), derived from
/// the same configuration `counterd run` reads.
async fn likes_store(t: &TestDb) -> counterd::store::mongo::MongoStore {
    let mut settings: counterd::config::Settings =
        toml::from_str(&format!("{DEFINITIONS}{LIKES}")).unwrap();
    settings.mongodb_uri = t.uri.clone();
    settings.database = t.name.clone();
    let likes = settings.source_named("likes").unwrap();
    counterd::store::mongo::MongoStore::connect(&(&likes).into())
        .await
        .unwrap()
}

/// Every likes counter the writer can touch that differs from its count query:
/// (definition, group, displayed, truth).
async fn likes_mismatches(
    likes: &counterd::store::mongo::MongoStore,
) -> Vec<(usize, GroupValue, i64, i64)> {
    let mut groups: Vec<(CounterIx, GroupValue)> = (0..POSTS)
        .map(|p| (CounterIx(0), GroupValue::Int(p)))
        .collect();
    groups.extend((0..USERS).map(|u| (CounterIx(1), GroupValue::Str(format!("u{u}")))));
    mismatches_in(likes, groups).await
}

/// The application's likes: like, unlike (soft), like again, and delete for good.
async fn like_step(t: &TestDb, rng: &mut StdRng, liked: &mut Vec<i64>, next: &mut i64) {
    let likes = t.db.collection::<Document>("likes");
    if liked.is_empty() || rng.random_bool(0.4) {
        let id = *next;
        *next += 1;
        let row = doc! {
            "_id": id,
            "post_id": rng.random_range(0..POSTS),
            "user_id": format!("u{}", rng.random_range(0..USERS)),
            "created_at": DateTime::from_millis(support::now_secs() * 1000),
        };
        likes.insert_one(row).await.unwrap();
        liked.push(id);
        return;
    }
    let at = rng.random_range(0..liked.len());
    let id = liked[at];
    match rng.random_range(0..3) {
        0 => {
            let now = DateTime::from_millis(support::now_secs() * 1000);
            let unlike = doc! {"$set": {"unliked_at": now}};
            likes.update_one(doc! {"_id": id}, unlike).await.unwrap();
        }
        1 => {
            let again = doc! {"$unset": {"unliked_at": ""}};
            likes.update_one(doc! {"_id": id}, again).await.unwrap();
        }
        _ => {
            likes.delete_one(doc! {"_id": id}).await.unwrap();
            liked.swap_remove(at);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_source_collection_is_counted_beside_the_comments() {
    let t = TestDb::with_schema("second_source", schema_of(DEFINITIONS)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = settings_file(&dir, &format!("{DEFINITIONS}{LIKES}"));
    let likes = likes_store(&t).await;
    // Likes that exist before counterd first runs: the initial snapshot counts them.
    let mut rng = StdRng::seed_from_u64(41);
    let (mut liked, mut next) = (Vec::new(), 0);
    for _ in 0..30 {
        like_step(&t, &mut rng, &mut liked, &mut next).await;
    }
    let daemon = Daemon::start(&t.uri, &t.name, "sources", &quick_folds(Some(&config)));
    let mut writer = Writer::new(5);

    // Comments and likes change together; at each caught-up moment of both streams every
    // counter of both sources is exact.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut rounds = 0;
    loop {
        writer.burst(&t, 20).await;
        for _ in 0..20 {
            like_step(&t, &mut rng, &mut liked, &mut next).await;
        }
        t.wait_caught_up(Duration::from_secs(30)).await;
        support::caught_up_on(&likes, "likes", Duration::from_secs(30)).await;
        let wrong = (mismatches(&t).await, likes_mismatches(&likes).await);
        // The snapshot of the likes that predate the stream settles in its first seconds;
        // from then on, every caught-up moment is exact.
        let snapshot_done = likes
            .load_checkpoint("likes")
            .await
            .unwrap()
            .is_some_and(|c| !c.snapshot_running());
        if snapshot_done {
            assert!(
                wrong.0.is_empty() && wrong.1.is_empty(),
                "round {rounds}: comments {:?}, likes {:?}",
                wrong.0,
                wrong.1
            );
            rounds += 1;
        }
        if rounds == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the likes' initial snapshot did not finish within 90 s"
        );
    }

    // Drift in a likes counter is folded away and reported under the source's counter name.
    let like = doc! {"_id": 1_000_000_i64, "post_id": 2_i64, "user_id": "u1",
    "created_at": DateTime::from_millis((support::now_secs() - 3_600) * 1000)};
    t.db.collection::<Document>("likes")
        .insert_one(like)
        .await
        .unwrap();
    support::caught_up_on(&likes, "likes", Duration::from_secs(30)).await;
    inject(&t, "like_counters", &GroupValue::Int(2), 5).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // One more like on the post, so that it is dirty after the injection.
        like_step(&t, &mut rng, &mut liked, &mut next).await;
        let nudge = doc! {"_id": next + 2_000_000, "post_id": 2_i64, "user_id": "u0",
        "created_at": DateTime::from_millis(support::now_secs() * 1000)};
        t.db.collection::<Document>("likes")
            .insert_one(nudge)
            .await
            .unwrap();
        next += 1;
        support::caught_up_on(&likes, "likes", Duration::from_secs(30)).await;
        let wrong = likes_mismatches(&likes).await;
        let reported = daemon.drift_reported("likes").await.0;
        if wrong.is_empty() && reported > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "likes drift not corrected and reported within 60 s: {wrong:?}, {reported} drift samples"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // The commands find a source's counters by name; `--source` picks the source's stream.
    support::caught_up_on(&likes, "likes", Duration::from_secs(30)).await;
    for (counter, group) in [("likes", "2"), ("likes_by_user", "str:u1")] {
        let looking = Instant::now() + Duration::from_secs(60);
        let got = loop {
            let o = t.counterd_with(&config, &["get", group, "--counter", counter, "--json"]);
            assert!(o.status.success(), "get --counter {counter}: {o:?}");
            let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if got["in_flight"] != true {
                break got;
            }
            assert!(
                Instant::now() < looking,
                "{counter} {group} in flight for 60 s: {got}"
            );
        };
        assert_eq!(
            got["displayed"], got["true_count"],
            "{counter} {group}: {got}"
        );
        assert!(
            got["true_count"].as_i64().unwrap() > 0,
            "{counter} {group}: {got}"
        );
    }
    let status = t.counterd_with(&config, &["status", "--source", "likes", "--json"]);
    assert!(status.status.success(), "status --source likes: {status:?}");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("\"likes\""), "the likes stream: {text}");
    // Without `--source`, every source `run` keeps: the comments' streams and counters, then
    // the likes'.
    let all = t.counterd_with(&config, &["status", "--json"]);
    assert!(all.status.success(), "status: {all:?}");
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).unwrap();
    let names = |key: &str, field: &str| -> Vec<(String, String)> {
        all[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let of = |f: &str| s[f].as_str().unwrap_or_default().to_string();
                (of("source"), of(field))
            })
            .collect()
    };
    let streams = names("streams", "stream");
    assert_eq!(
        streams.first().map(|s| s.0.as_str()),
        Some("comments"),
        "{all}"
    );
    assert!(
        streams.contains(&("likes".into(), "likes".into())),
        "the likes stream beside the comments': {all}"
    );
    let counters = names("counters", "name");
    assert!(
        counters.contains(&("likes".into(), "likes_by_user".into())),
        "the likes source's counters: {all}"
    );
    let text = String::from_utf8_lossy(&t.counterd_with(&config, &["status"]).stdout).to_string();
    assert!(
        text.contains("stream            likes (source likes)"),
        "{text}"
    );
    let unknown = t.counterd_with(&config, &["get", "2", "--counter", "shares"]);
    assert_eq!(unknown.status.code(), Some(2));
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        said.contains("likes_by_user"),
        "lists every counter: {said}"
    );
    // One process, two streams: both ready, each with its own bookkeeping.
    assert_eq!(daemon.get("/readyz").await.map(|r| r.0), Some(200));
    has_collections(
        &t,
        &[
            "counterd_checkpoints",
            "counterd_likes_checkpoints",
            "like_counters",
            "likes_by_user",
        ],
    )
    .await;
    assert_eq!(daemon.terminate(), Some(0), "counterd run stopped cleanly");
}

/// Asserts that every collection of `expected` exists.
async fn has_collections(t: &TestDb, expected: &[&str]) {
    let names = t.db.list_collection_names().await.unwrap();
    for expected in expected {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
}

/// The `_id`s of the documents of `collection` matching `filter`.
async fn ids(t: &TestDb, collection: &str, filter: Document) -> Vec<Bson> {
    use futures::TryStreamExt;
    let docs: Vec<Document> =
        t.db.collection::<Document>(collection)
            .find(filter)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
    docs.into_iter()
        .filter_map(|d| d.get("_id").cloned())
        .collect()
}
