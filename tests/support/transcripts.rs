//! The deployment the pages' transcripts show, shared by the tests that run them against the
//! real binary (`tests/readme_commands.rs` for the reference pages, `tests/operator_sequences.rs`
//! for the worked sequences): the sidecar's owner id, the recount index as the production
//! checklist creates it, and the dirty set the transcripts print.
//!
//! Needs `mod support;` and `mod daemon;` (`support/daemon.rs`) beside it in the test binary.
#![allow(dead_code)]

use std::time::Duration;

use counterd::core::key::GroupValue;
use mongodb::bson::{doc, Document};

use crate::daemon::Daemon;
use crate::support::TestDb;

/// The owner id the pages show for the sidecar's counterd.
pub const OWNER: &str = "app-7c9d8b6f5-x2kqp";

/// `counterd run` as the pages' sidecar (owner [`OWNER`], with `env`), once it is active.
pub async fn sidecar(t: &TestDb, env: &[(&str, &str)]) -> Daemon {
    let d = Daemon::start(&t.uri, &t.name, OWNER, env);
    assert!(
        d.wait_role("active", Duration::from_secs(30)).await,
        "the sidecar did not become active"
    );
    d
}

/// Waits (30 s each) until the counters of `posts` are exact and the worker has drained the
/// stream, so that what a command prints next does not depend on a batch in flight.
pub async fn settled(t: &TestDb, posts: &[GroupValue]) {
    t.wait_exact(posts, Duration::from_secs(30)).await;
    t.wait_drained(Duration::from_secs(30)).await;
}

/// The recount index, as the production checklist creates it.
pub async fn recount_index(t: &TestDb) {
    t.db.run_command(doc! {
        "createIndexes": "comments",
        "indexes": [{"key": {"post_id": 1, "created_at": 1}, "name": "recount"}],
    })
    .await
    .unwrap();
}

/// How many posts the dirty set holds (of the default definition).
pub async fn dirty_posts(t: &TestDb) -> u64 {
    t.db.collection::<Document>("counterd_dirty")
        .count_documents(doc! {})
        .await
        .unwrap()
}
