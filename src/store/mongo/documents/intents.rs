//! The intents stored in the checkpoint document, serde-derived: a pending batch (`pending`) and
//! the snapshot's progress with its pending chunk (`snapshot`), and the planned counter
//! increments and ledger states both carry.

use serde::{Deserialize, Serialize};
use serde_with::FromIntoRef;

use super::fields::{self, counted, document_if_any, document_or_none, lenient};
use super::*;
use crate::core::key::{CounterIx, CounterKey};
use crate::core::num::Num;
use crate::core::time::BucketStart;

/// Planned counter increments for one post.
#[derive(Serialize, Deserialize)]
struct CounterDeltaDoc {
    /// The definition's place (absent: the default, as every intent before definitions).
    #[serde(default, skip_serializing_if = "is_default_counter")]
    counter: usize,
    #[serde(with = "fields::post")]
    post: GroupValue,
    #[serde(deserialize_with = "fields::required_number")]
    delta: Num,
    #[serde(with = "buckets")]
    buckets: BTreeMap<BucketStart, Num>,
    /// `None`: a batch recorded before `touched` existed, which touched exactly its non-zero
    /// buckets.
    #[serde(default)]
    touched: Option<std::collections::BTreeSet<BucketStart>>,
    /// The rows the batch named for the post (`None`: not listed, or a batch recorded before
    /// the counter's log existed; a recount spanning it refuses).
    #[serde(default)]
    comments: Option<Vec<Bson>>,
}

impl From<&CounterDelta> for CounterDeltaDoc {
    fn from(c: &CounterDelta) -> Self {
        CounterDeltaDoc {
            counter: c.key.counter.0,
            post: c.key.group.clone(),
            delta: c.delta,
            buckets: c.buckets.clone(),
            touched: Some(c.touched.clone()),
            comments: c
                .comments
                .as_ref()
                .map(|list| list.iter().map(|c| c.value.clone()).collect()),
        }
    }
}

impl From<CounterDeltaDoc> for CounterDelta {
    fn from(c: CounterDeltaDoc) -> Self {
        let nonzero = || c.buckets.keys().copied().collect();
        let touched = c.touched.unwrap_or_else(nonzero);
        CounterDelta {
            key: CounterKey::new(CounterIx(c.counter), c.post),
            delta: c.delta,
            buckets: c.buckets,
            touched,
            comments: c
                .comments
                .map(|list| list.into_iter().map(CommentId::new).collect()),
        }
    }
}

/// Amounts by bucket: a document keyed by the bucket's start in seconds (BSON keys are
/// strings), each amount by the integer rule.
mod buckets {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::{bucket_amounts, BTreeMap, BucketStart, Document, Num};

    pub fn serialize<S: Serializer>(
        buckets: &BTreeMap<BucketStart, Num>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_map(buckets.iter().map(|(k, v)| (k.to_string(), v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<BucketStart, Num>, D::Error> {
        bucket_amounts(&Document::deserialize(d)?, None).map_err(D::Error::custom)
    }
}

/// A planned ledger state: `state` null (or anything but a document) is a comment gone.
#[derive(Serialize, Deserialize)]
struct LedgerUpdateDoc {
    comment: Bson,
    #[serde(default, deserialize_with = "document_if_any")]
    state: Option<RowDoc>,
}

/// A row as an intent stores it (the ledger's own entries store it as `$set` fields instead,
/// see [`ledger_row_update`]).
#[derive(Serialize, Deserialize)]
struct RowDoc {
    deleted: bool,
    /// Absent: a row that exists without a post; present, it must be a post id.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "fields::some_post"
    )]
    post: Option<GroupValue>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    created_at: Option<DateTime>,
    /// The row's verdicts per definition beyond the default (see `members_to_bson`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    members: Option<Bson>,
}

impl From<&LedgerUpdate> for LedgerUpdateDoc {
    fn from(l: &LedgerUpdate) -> Self {
        LedgerUpdateDoc {
            comment: l.comment.value.clone(),
            state: l.state.as_ref().map(|r| {
                let (post, more) = super::split(r);
                RowDoc {
                    members: (!more.is_empty()).then(|| super::members_to_bson(more)),
                    deleted: r.deleted,
                    post: post.cloned(),
                    created_at: r.created_at,
                }
            }),
        }
    }
}

impl From<LedgerUpdateDoc> for LedgerUpdate {
    fn from(l: LedgerUpdateDoc) -> Self {
        LedgerUpdate {
            comment: CommentId::new(l.comment),
            state: l.state.map(|r| Row {
                members: super::joined(r.post, super::members_from(r.members.as_ref())),
                created_at: r.created_at,
                deleted: r.deleted,
            }),
        }
    }
}

/// A post to mark dirty, stored as `{post, bucket}`; a batch recorded before marks carried a
/// bucket stored the bare post id, which reads as bucket 0 (covered by any fold, as before).
/// Read by hand from [`Bson`] because the two shapes share no field to tell them apart by.
#[derive(Serialize, Deserialize)]
#[serde(try_from = "Bson")]
struct MarkDoc {
    /// The definition's place (absent: the default, as every intent before definitions).
    #[serde(default, skip_serializing_if = "is_default_counter")]
    counter: usize,
    #[serde(with = "fields::post")]
    post: GroupValue,
    bucket: BucketStart,
}

impl From<&DirtyMark> for MarkDoc {
    fn from(m: &DirtyMark) -> Self {
        MarkDoc {
            counter: m.key.counter.0,
            post: m.key.group.clone(),
            bucket: m.newest_bucket,
        }
    }
}

impl From<MarkDoc> for DirtyMark {
    fn from(m: MarkDoc) -> Self {
        DirtyMark {
            key: CounterKey::new(CounterIx(m.counter), m.post),
            newest_bucket: m.bucket,
        }
    }
}

fn is_default_counter(counter: &usize) -> bool {
    crate::core::definition::keeps_historical_names(CounterIx(*counter))
}

impl TryFrom<Bson> for MarkDoc {
    type Error = String;

    fn try_from(value: Bson) -> Result<Self, String> {
        let (post, bucket, counter) = match &value {
            Bson::Document(d) => (
                d.get("post"),
                integer(d.get("bucket")).ok().flatten(),
                integer(d.get("counter")).ok().flatten().unwrap_or(0),
            ),
            bare => (Some(bare), Some(0), 0),
        };
        match (
            post.and_then(GroupValue::from_bson),
            bucket,
            usize::try_from(counter),
        ) {
            (Some(post), Some(bucket), Ok(counter)) => Ok(MarkDoc {
                counter,
                post,
                bucket,
            }),
            _ => Err(format!("pending dirty post {value:?}")),
        }
    }
}

/// A batch's intent, as `pending` in the checkpoint document: a [`PendingBatch`] by the stored
/// shape's rules, each planned item through its stored form, converted as it is written or
/// read (no copy of the batch in between).
#[serde_with::serde_as]
#[derive(Serialize, Deserialize)]
#[serde(remote = "PendingBatch")]
struct PendingDoc {
    end: Token,
    #[serde_as(as = "Vec<FromIntoRef<CounterDeltaDoc>>")]
    counters: Vec<CounterDelta>,
    #[serde_as(as = "Vec<FromIntoRef<LedgerUpdateDoc>>")]
    ledger: Vec<LedgerUpdate>,
    #[serde_as(as = "Vec<FromIntoRef<MarkDoc>>")]
    dirty: Vec<DirtyMark>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    end_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    carry: Option<Token>,
}

/// A pending batch written, and read, as [`PendingDoc`].
#[derive(Serialize)]
struct PendingOut<'a>(#[serde(with = "PendingDoc")] &'a PendingBatch);
#[derive(Deserialize)]
struct PendingIn(#[serde(with = "PendingDoc")] PendingBatch);

/// The pending batch as the checkpoint stores it, as raw BSON: a batch's intent names every
/// counter, ledger state and dirty mark it plans (thousands while behind), which as a document
/// tree held several megabytes beside the batch's other state: serde writes it straight to
/// bytes, without the document tree `to_stored` builds (see `checkpoints::record_intent`).
pub(in crate::store::mongo) fn pending_to_raw(
    batch: &PendingBatch,
) -> StoreResult<bson::RawDocumentBuf> {
    let stored = bson::to_raw_document_buf(&PendingOut(batch));
    stored.map_err(unencodable("record the batch intent"))
}

pub(in crate::store::mongo) fn pending_from_doc(d: &Document) -> Result<PendingBatch, String> {
    let p: PendingIn = bson::from_document(d.clone()).map_err(|e| format!("pending batch: {e}"))?;
    Ok(p.0)
}

/// [`pending_from_doc`] from the intent's bytes, without a document tree of it.
pub(in crate::store::mongo) fn pending_from_raw(
    d: &bson::RawDocument,
) -> Result<PendingBatch, String> {
    let p: PendingIn = bson::from_slice(d.as_bytes()).map_err(|e| format!("pending batch: {e}"))?;
    Ok(p.0)
}

/// The snapshot's progress, as `snapshot` in the checkpoint document. Every field is written,
/// the unset ones as null; counts read by the count rule (missing: none done yet).
#[derive(Serialize, Deserialize)]
struct SnapshotDoc {
    #[serde(default, deserialize_with = "lenient")]
    state: String,
    started_at: DateTime,
    #[serde(default, deserialize_with = "lenient")]
    finished_at: Option<DateTime>,
    #[serde(default)]
    last_id: Option<Bson>,
    #[serde(default)]
    cursor: Option<Bson>,
    #[serde(default, with = "counted")]
    chunks_done: u64,
    #[serde(default, with = "counted")]
    rows_scanned: u64,
    #[serde(default, with = "counted")]
    rows_counted: u64,
    #[serde(default, with = "counted")]
    estimated_rows: u64,
    #[serde(default, with = "counted")]
    chunks_resumed: u64,
    /// The chunk being read (null: no read in flight).
    #[serde(default, deserialize_with = "fields::integer_or_none")]
    reading: Option<i64>,
    #[serde(default, with = "counted")]
    chunks_reread: u64,
    #[serde(default, deserialize_with = "document_or_none")]
    pending: Option<ChunkDoc>,
}

/// A snapshot chunk's intent, as `snapshot.pending`.
#[derive(Serialize, Deserialize)]
struct ChunkDoc {
    #[serde(default, with = "counted")]
    number: u64,
    #[serde(default)]
    last: Option<Bson>,
    #[serde(default, with = "counted")]
    rows: u64,
    ledger: Vec<LedgerUpdateDoc>,
    counters: Vec<CounterDeltaDoc>,
}

fn comment_value(id: &Option<CommentId>) -> Option<Bson> {
    id.as_ref().map(|c| c.value.clone())
}

/// The snapshot's progress as stored in the checkpoint document.
pub(in crate::store::mongo) fn snapshot_to_doc(p: &SnapshotProgress) -> StoreResult<Document> {
    to_stored(
        "record the snapshot's progress",
        &SnapshotDoc {
            state: p.state.as_ref().to_string(),
            started_at: p.started_at,
            finished_at: p.finished_at,
            last_id: comment_value(&p.last_id),
            cursor: comment_value(&p.cursor),
            chunks_done: p.chunks_done,
            rows_scanned: p.rows_scanned,
            rows_counted: p.rows_counted,
            estimated_rows: p.estimated_rows,
            chunks_resumed: p.chunks_resumed,
            reading: p.reading.map(|n| n as i64),
            chunks_reread: p.chunks_reread,
            pending: p.pending.as_ref().map(|c| ChunkDoc {
                number: c.number,
                last: comment_value(&c.last),
                rows: c.rows,
                ledger: c.claims.iter().map(LedgerUpdateDoc::from).collect(),
                counters: c.counters.iter().map(CounterDeltaDoc::from).collect(),
            }),
        },
    )
}

pub(in crate::store::mongo) fn snapshot_from_doc(d: &Document) -> Result<SnapshotProgress, String> {
    let s: SnapshotDoc = bson::from_document(d.clone()).map_err(|e| format!("snapshot: {e}"))?;
    Ok(SnapshotProgress {
        state: s
            .state
            .parse()
            .map_err(|_| format!("snapshot `state` is {:?}", s.state))?,
        started_at: s.started_at,
        finished_at: s.finished_at,
        last_id: s.last_id.map(CommentId::new),
        cursor: s.cursor.map(CommentId::new),
        chunks_done: s.chunks_done,
        rows_scanned: s.rows_scanned,
        rows_counted: s.rows_counted,
        estimated_rows: s.estimated_rows,
        chunks_resumed: s.chunks_resumed,
        reading: s.reading.map(|n| n.max(0) as u64),
        chunks_reread: s.chunks_reread,
        pending: s.pending.map(|c| SnapshotChunk {
            number: c.number,
            last: c.last.map(CommentId::new),
            rows: c.rows,
            claims: c.ledger.into_iter().map(LedgerUpdate::from).collect(),
            counters: c.counters.into_iter().map(CounterDelta::from).collect(),
        }),
    })
}
