//! Small documents read whole, serde-derived: dirty entries, leases and the sweep cursor. Their
//! writes stay `$set`/`$inc`/`$max` updates built in the store methods (a dirty mark bumps a
//! version and keeps the oldest time; a lease takeover increments its epoch), which a derived
//! document cannot express; only the sweep cursor is written whole.

use serde::{Deserialize, Serialize};

use super::fields::{counted, integer_or_none, integer_or_zero, lenient, post_or_none};
use super::*;
use crate::core::time::BucketStart;

/// A dirty entry as stored: an entry without a post id or either time is not one.
#[derive(Deserialize)]
struct DirtyDoc {
    #[serde(rename = "_id", default, with = "post_or_none")]
    post: Option<GroupValue>,
    #[serde(default, deserialize_with = "lenient")]
    first_dirty_at: Option<DateTime>,
    #[serde(default, deserialize_with = "lenient")]
    last_dirty_at: Option<DateTime>,
    #[serde(default, deserialize_with = "integer_or_zero")]
    version: i64,
    /// `None`: an entry written before the newest bucket was recorded.
    #[serde(default, deserialize_with = "integer_or_none")]
    newest_bucket: Option<BucketStart>,
}

pub(in crate::store::mongo) fn dirty_from_doc(doc: &Document) -> Option<DirtyEntry> {
    let d: DirtyDoc = bson::from_document(doc.clone()).ok()?;
    Some(DirtyEntry {
        post: d.post?,
        first_dirty_at: d.first_dirty_at?,
        last_dirty_at: d.last_dirty_at?,
        version: d.version,
        newest_bucket: d.newest_bucket,
    })
}

/// A lease as stored under the stream's `_id`; what is missing reads as expired long ago,
/// owned by nobody, at epoch 0.
#[derive(Deserialize, Default)]
struct LeaseDoc {
    #[serde(default, deserialize_with = "lenient")]
    owner: String,
    #[serde(default, deserialize_with = "lenient")]
    expires_at: Option<DateTime>,
    #[serde(default, deserialize_with = "integer_or_zero")]
    epoch: i64,
}

pub(in crate::store::mongo) fn lease_from_doc(stream: &str, doc: &Document) -> Lease {
    let d: LeaseDoc = bson::from_document(doc.clone()).unwrap_or_default();
    Lease {
        stream: stream.to_string(),
        owner: d.owner,
        expires_at: d.expires_at.unwrap_or(DateTime::MIN),
        epoch: d.epoch,
    }
}

/// The sweep cursor as stored under the stream's `_id` (every field written, the unset ones as
/// null).
#[derive(Serialize, Deserialize, Default)]
struct SweepDoc {
    #[serde(default, with = "post_or_none")]
    after: Option<GroupValue>,
    #[serde(default, deserialize_with = "lenient")]
    pass_started: Option<DateTime>,
    #[serde(default, with = "counted")]
    posts_done: u64,
    #[serde(default, with = "counted")]
    passes: u64,
    #[serde(default, with = "counted")]
    last_pass_posts: u64,
}

pub(in crate::store::mongo) fn sweep_from_doc(doc: &Document) -> SweepCursor {
    let d: SweepDoc = bson::from_document(doc.clone()).unwrap_or_default();
    SweepCursor {
        after: d.after,
        pass_started: d.pass_started,
        posts_done: d.posts_done,
        passes: d.passes,
        last_pass_posts: d.last_pass_posts,
    }
}

/// The `$set` that saves the cursor (with the time it was saved).
pub(in crate::store::mongo) fn sweep_to_set(cursor: &SweepCursor) -> StoreResult<Document> {
    let mut set = to_stored(
        "save the sweep cursor",
        &SweepDoc {
            after: cursor.after.clone(),
            pass_started: cursor.pass_started,
            posts_done: cursor.posts_done,
            passes: cursor.passes,
            last_pass_posts: cursor.last_pass_posts,
        },
    )?;
    set.insert("updated_at", DateTime::now());
    Ok(set)
}
