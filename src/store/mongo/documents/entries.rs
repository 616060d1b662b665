//! Small documents read whole, serde-derived: dirty entries, leases and the sweep cursor. Their
//! writes stay `$set`/`$inc`/`$max` updates built in the store methods (a dirty mark bumps a
//! version and keeps the oldest time; a lease takeover increments its epoch), which a derived
//! document cannot express; only the sweep cursor is written whole.

use serde::{Deserialize, Serialize};

use super::fields::{counted, integer_or_none, integer_or_zero, lenient, post, post_or_none};
use super::*;
use crate::core::time::BucketStart;

/// A dirty entry as stored, read straight into a [`DirtyEntry`]: an entry without a post id or
/// either time (or with one of another type) does not read, and is not one.
#[derive(Deserialize)]
#[serde(remote = "DirtyEntry")]
struct DirtyDoc {
    #[serde(rename = "_id", deserialize_with = "post::deserialize")]
    post: GroupValue,
    first_dirty_at: DateTime,
    last_dirty_at: DateTime,
    #[serde(default, deserialize_with = "integer_or_zero")]
    version: i64,
    /// `None`: an entry written before the newest bucket was recorded.
    #[serde(default, deserialize_with = "integer_or_none")]
    newest_bucket: Option<BucketStart>,
}

pub(in crate::store::mongo) fn dirty_from_doc(doc: &Document) -> Option<DirtyEntry> {
    DirtyDoc::deserialize(bson::Deserializer::new(doc.clone().into())).ok()
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
/// null): a [`SweepCursor`] by the stored shape's rules.
#[derive(Serialize, Deserialize)]
#[serde(remote = "SweepCursor")]
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
    SweepDoc::deserialize(bson::Deserializer::new(doc.clone().into())).unwrap_or_default()
}

/// The `$set` that saves the cursor (with the time it was saved).
pub(in crate::store::mongo) fn sweep_to_set(cursor: &SweepCursor) -> StoreResult<Document> {
    let op = "save the sweep cursor";
    let stored = SweepDoc::serialize(cursor, bson::Serializer::new()).map_err(unencodable(op))?;
    let mut set = bson::from_bson::<Document>(stored).map_err(unencodable(op))?;
    set.insert("updated_at", DateTime::now());
    Ok(set)
}
