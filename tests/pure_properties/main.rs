//! Properties of the pure core: classification, batch planning, the reconcile fold, and that no
//! input document can make the event model or the classifier panic.
//!
//! By subject: `classification`, `batches`, `schemas`, `fold`, `no_panic`; the rows, their
//! documents and their events, shared by all, are here.

#[path = "../support/update_description.rs"]
mod update_description;

mod batches;
mod classification;
mod fold;
mod no_panic;
mod schemas;

use std::collections::BTreeMap;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use counterd::core::event::Row;
use counterd::core::key::GroupValue;
use counterd::core::time::bucket_of;
use proptest::prelude::*;
use update_description::diff;

const WIDTH: i64 = 60;
/// 2026-01-02T10:00:00Z in milliseconds.
const BASE_MS: i64 = 1_767_348_000_000;

// ---------------------------------------------------------------------------------------------
// Rows and their documents

fn post_strategy() -> impl Strategy<Value = GroupValue> {
    prop_oneof![
        Just(GroupValue::Str("p0".into())),
        Just(GroupValue::Str("p1".into())),
        Just(GroupValue::Int(7)),
    ]
}

/// Creation times in a few buckets, several per bucket, sometimes missing.
fn created_strategy() -> impl Strategy<Value = Option<DateTime>> {
    prop_oneof![
        1 => Just(None),
        6 => (0..4i64, 0..3i64).prop_map(|(m, s)| Some(DateTime::from_millis(
            BASE_MS + m * 60_000 + s * 20_000 + 7
        ))),
    ]
}

/// How a row's `deleted_at` is spelled: absent, `null` (both live) or a date (deleted).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Deleted {
    Absent,
    Null,
    At(i64),
}

impl Deleted {
    fn is_live(self) -> bool {
        !matches!(self, Deleted::At(_))
    }
    fn to_bson(self) -> Option<Bson> {
        match self {
            Deleted::Absent => None,
            Deleted::Null => Some(Bson::Null),
            Deleted::At(ms) => Some(Bson::DateTime(DateTime::from_millis(ms))),
        }
    }
}

fn deleted_strategy() -> impl Strategy<Value = Deleted> {
    prop_oneof![
        3 => Just(Deleted::Absent),
        1 => Just(Deleted::Null),
        3 => (0..1000i64).prop_map(|s| Deleted::At(BASE_MS + 86_400_000 + s * 1000)),
    ]
}

/// A comment row as the test knows it (the truth).
#[derive(Clone, Debug, PartialEq)]
struct Comment {
    post: GroupValue,
    created_at: Option<DateTime>,
    deleted: Deleted,
    body: String,
}

impl Comment {
    fn is_live(&self) -> bool {
        self.deleted.is_live()
    }
    fn row(&self) -> Row {
        Row::of(Some(self.post.clone()), self.created_at, !self.is_live())
    }
    fn doc(&self, id: &Bson) -> Document {
        let mut d = doc! {"_id": id.clone(), "post_id": self.post.to_bson()};
        if let Some(c) = self.created_at {
            d.insert("created_at", c);
        }
        if let Some(v) = self.deleted.to_bson() {
            d.insert("deleted_at", v);
        }
        d.insert("body", self.body.clone());
        d
    }
}

fn comment_strategy() -> impl Strategy<Value = Comment> {
    (
        post_strategy(),
        created_strategy(),
        deleted_strategy(),
        "[a-z]{0,3}",
    )
        .prop_map(|(post, created_at, deleted, body)| Comment {
            post,
            created_at,
            deleted,
            body,
        })
}

/// The fake server's update spec for that change (`$set`/`$unset`), never empty.
fn fake_spec(set: &Document, removed: &[String]) -> Document {
    let mut spec = Document::new();
    if !set.is_empty() {
        spec.insert("$set", set.clone());
    }
    if !removed.is_empty() {
        let unset: Document = removed
            .iter()
            .map(|k| (k.clone(), Bson::from("")))
            .collect();
        spec.insert("$unset", unset);
    }
    if spec.is_empty() {
        spec.insert("$set", doc! {"body": "unchanged"});
    }
    spec
}

/// The fragment the fake server returns as `fullDocument` when the row is gone.
fn fake_fragment(spec: &Document) -> Document {
    let mut fragment = Document::new();
    for part in ["$set", "$unset"] {
        if let Ok(fields) = spec.get_document(part) {
            for (k, v) in fields {
                fragment.insert(k.clone(), v.clone());
            }
        }
    }
    fragment
}

fn token(n: usize) -> String {
    format!("82{:08X}000000012B042C0100296E5A1004", 0x695B_7000 + n)
}

fn real_event(n: usize, op: &str, id: &Bson) -> Document {
    doc! {
        "_id": {"_data": token(n)},
        "operationType": op,
        "clusterTime": Timestamp { time: 0x695B_7000 + n as u32, increment: 1 },
        "wallTime": DateTime::from_millis((0x695B_7000 + n as i64) * 1000),
        "ns": {"db": "app", "coll": "comments"},
        "documentKey": {"_id": id.clone()},
    }
}

fn fake_event(n: usize, op: &str) -> Document {
    doc! {
        "_id": {"_data": format!("6b103333{n:08x}")},
        "operationType": op,
        "clusterTime": Timestamp { time: 1_796_223_795, increment: n as u32 },
    }
}

type Tally = BTreeMap<(GroupValue, i64), i64>;

fn add_live(tally: &mut Tally, comment: Option<&Comment>, sign: i64) {
    if let Some(c) = comment.filter(|c| c.is_live()) {
        *tally
            .entry((c.post.clone(), bucket_of(c.created_at, WIDTH)))
            .or_default() += sign;
    }
}

fn nonzero(mut tally: Tally) -> Tally {
    tally.retain(|_, v| *v != 0);
    tally
}
