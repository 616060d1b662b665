//! The soak's checks at a caught-up moment.
//!
//! A **caught-up moment** is a moment at which the worker's checkpoint covers every write made
//! so far: the writers are paused and every write they made is acknowledged; `P` is the
//! server's position read after that (`read_position().upper`: after every acknowledged
//! write); and the checkpoint holds no batch in flight (no intent) and records that the worker
//! found the stream drained at or after `P` (`caught_up_at >= P`: every event before it is
//! applied). At such a moment each counter's displayed value (`base_count + live_delta`) must
//! equal the number of live rows of its post, whatever faults came before: nothing lost,
//! nothing counted twice. (A fold the reconciler installs meanwhile installs a recount of the
//! same rows, so it cannot make a displayed value differ.)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::{doc, Bson, Document};
use counterd::store::mongo::MongoStore;
use counterd::store::prelude::*;
use futures::TryStreamExt;

/// Waits for a caught-up moment (writers already paused); returns how long it took, or `None`
/// if none came within `within`.
pub async fn wait_caught_up(
    store: &MongoStore,
    within: Duration,
) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    let p = store.read_position().await?.upper;
    loop {
        if let Some(c) = store.load_checkpoint("comments").await? {
            if c.pending.is_none() && c.caught_up_at.is_some_and(|at| at >= p) {
                return Ok(Some(started.elapsed()));
            }
        }
        if started.elapsed() > within {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counters that differ from the truth: (post, displayed, live rows).
pub async fn mismatches(store: &MongoStore) -> anyhow::Result<Vec<(String, i64, i64)>> {
    let db = store.database();
    let int = |d: &Document, f: &str| match d.get(f) {
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Int32(n)) => *n as i64,
        _ => 0,
    };
    let mut truth: BTreeMap<String, i64> = BTreeMap::new();
    let mut live = db
        .collection::<Document>("comments")
        .aggregate(vec![
            doc! {"$match": {"deleted_at": {"$exists": false}}},
            doc! {"$group": {"_id": "$post_id", "n": {"$sum": 1}}},
        ])
        .await?;
    while let Some(d) = live.try_next().await? {
        let key = d.get("_id").map(|v| v.to_string()).unwrap_or_default();
        truth.insert(key, int(&d, "n"));
    }
    let mut shown: BTreeMap<String, i64> = BTreeMap::new();
    let mut counters = db
        .collection::<Document>("comment_counters")
        .find(doc! {})
        .await?;
    while let Some(d) = counters.try_next().await? {
        let key = d.get("_id").map(|v| v.to_string()).unwrap_or_default();
        shown.insert(key, int(&d, "base_count") + int(&d, "live_delta"));
    }
    let mut bad = Vec::new();
    let posts: std::collections::BTreeSet<&String> = truth.keys().chain(shown.keys()).collect();
    for post in posts {
        let (s, t) = (
            shown.get(post).copied().unwrap_or(0),
            truth.get(post).copied().unwrap_or(0),
        );
        if s != t {
            bad.push((post.clone(), s, t));
        }
    }
    Ok(bad)
}

/// Documents in each collection the soak watches.
pub async fn sizes(store: &MongoStore) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for name in [
        "comments",
        "comment_counters",
        "counterd_comment_state",
        "counterd_dirty",
        "counterd_checkpoints",
        "counterd_leases",
        "counterd_reconcile_runs",
    ] {
        let n = store
            .database()
            .collection::<Document>(name)
            .estimated_document_count()
            .await
            .unwrap_or(0);
        out.insert(name.to_string(), n);
    }
    out
}

/// Counters the reconciler has corrected so far, and their total |drift|, from the run history
/// (`counterd_reconcile_runs`, kept across process lives). The soak injects no drift, so with
/// ledger attribution any correction means a counter was wrong before the fold hid it: exact
/// at a caught-up moment is not enough, the reconciler must have had nothing to fix.
pub async fn corrections(store: &MongoStore) -> anyhow::Result<(i64, i64)> {
    let mut runs = store
        .database()
        .collection::<Document>("counterd_reconcile_runs")
        .find(doc! {"corrected": {"$gt": 0_i64}})
        .await?;
    let (mut corrected, mut drift) = (0, 0);
    while let Some(run) = runs.try_next().await? {
        let int = |f: &str| match run.get(f) {
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Int32(n)) => *n as i64,
            _ => 0,
        };
        corrected += int("corrected");
        drift += int("total_abs_drift");
    }
    Ok((corrected, drift))
}
