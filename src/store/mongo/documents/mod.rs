//! Converters between counterd's types and its stored documents (checkpoints, pending
//! batches, snapshot progress, counters, ledger entries, dirty entries, runs).

use super::*;

/// A stored integer, by the one rule every reader uses: counterd writes `Int64`, but a hand edit
/// in the shell leaves an `Int32` or a whole `Double`, which mean the same number. Absent or
/// null: `Ok(None)`. Anything else (a fraction, a string) is not a number counterd wrote:
/// `Err` describes it, and the caller decides whether that is malformed or a default.
pub(super) fn integer(value: Option<&Bson>) -> Result<Option<i64>, String> {
    match value {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Int32(i)) => Ok(Some(i64::from(*i))),
        Some(Bson::Int64(i)) => Ok(Some(*i)),
        Some(Bson::Double(d)) if d.fract() == 0.0 => Ok(Some(*d as i64)),
        Some(other) => Err(format!("{other:?}, expected an integer")),
    }
}

/// A stored count (progress numbers, generations): [`integer`], where a missing, malformed or
/// negative value counts as none done.
fn count(value: Option<&Bson>) -> u64 {
    integer(value).ok().flatten().unwrap_or(0).max(0) as u64
}

/// A ledger entry's row: `None` when the comment is gone. An existing row without `post_id`
/// does not count; `live` says whether a row counts, `deleted` whether it is soft-deleted
/// (entries written before `deleted` existed always had a post, so `live` said it).
pub(super) fn row_from_ledger(doc: &Document) -> Option<Row> {
    if !doc.get_bool("exists").unwrap_or(false) {
        return None;
    }
    let live = doc.get_bool("live").unwrap_or(false);
    Some(Row {
        post: doc.get(LEDGER_POST).and_then(PostId::from_bson),
        created_at: doc.get_datetime(LEDGER_CREATED).ok().copied(),
        deleted: doc.get_bool("deleted").unwrap_or(!live),
    })
}

pub(super) fn counter_from_doc(doc: &Document) -> StoreResult<CounterDoc> {
    let malformed = |detail: String| StoreError::Malformed {
        what: "counter",
        id: format!("{:?}", doc.get("_id")),
        detail,
    };
    let int_or_none = |field: &str| -> StoreResult<Option<i64>> {
        integer(doc.get(field)).map_err(|e| malformed(format!("`{field}` is {e}")))
    };
    let int = |field: &str| -> StoreResult<i64> { Ok(int_or_none(field)?.unwrap_or(0)) };
    let mut buckets = BTreeMap::new();
    if let Ok(map) = doc.get_document("live_by_bucket") {
        for (key, value) in map {
            let start: i64 = key
                .parse()
                .map_err(|_| malformed(format!("bucket key `{key}` is not a number of seconds")))?;
            let amount = integer(Some(value))
                .map_err(|e| malformed(format!("bucket `{key}` is {e}")))?
                .unwrap_or(0);
            buckets.insert(start, amount);
        }
    }
    Ok(CounterDoc {
        post: doc.get("_id").and_then(PostId::from_bson),
        state: CounterState {
            base_count: int("base_count")?,
            base_watermark: match doc.get("base_watermark") {
                Some(Bson::DateTime(d)) => d.timestamp_millis().div_euclid(1000),
                _ => int("base_watermark")?,
            },
            live_delta: int("live_delta")?,
            buckets,
        },
        applied_through: doc.get_str("applied_through").ok().map(String::from),
        applied_time: doc.get_timestamp("applied_time").ok(),
        folds: int("folds")?,
        count: int_or_none("count")?,
        touched: match doc.get_document("touched") {
            Ok(map) => map
                .iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
                .collect(),
            Err(_) => BTreeMap::new(),
        },
        last_drift: int_or_none("last_drift")?,
        reconciled_at: doc.get_datetime("reconciled_at").ok().copied(),
    })
}

pub(super) fn checkpoint_from_doc(stream: &str, doc: &Document) -> StoreResult<Checkpoint> {
    let malformed = |detail: String| {
        StoreError::Malformed {
        what: "checkpoint",
        id: stream.to_string(),
        detail: format!("{detail} (fix or delete it in counterd's checkpoints collection, or run `counterd replay --from-time ...`)"),
    }
    };
    let token = match doc.get("token") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(s)) if !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit()) => {
            Some(Token(s.clone()))
        }
        Some(other) => {
            return Err(malformed(format!(
                "`token` is {other:?}, expected a resume token's hex `_data`"
            )))
        }
    };
    let high_water = match doc.get("high_water") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(s)) => Some(Token(s.clone())),
        Some(other) => return Err(malformed(format!("`high_water` is {other:?}"))),
    };
    let epoch = integer(doc.get("epoch"))
        .map_err(|e| malformed(format!("`epoch` is {e}")))?
        .unwrap_or(0);
    let gaps = doc
        .get_array("gaps")
        .map(|gaps| {
            gaps.iter()
                .filter_map(|g| g.as_document())
                .map(|g| Gap {
                    from: g.get_datetime("from").ok().copied(),
                    to: g.get_datetime("to").ok().copied().unwrap_or(DateTime::MIN),
                })
                .collect()
        })
        .unwrap_or_default();
    let pending = match doc.get("pending") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(p)) => Some(pending_from_doc(p).map_err(malformed)?),
        Some(other) => return Err(malformed(format!("`pending` is {other:?}"))),
    };
    let snapshot = match doc.get("snapshot") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(p)) => Some(snapshot_from_doc(p).map_err(malformed)?),
        Some(other) => return Err(malformed(format!("`snapshot` is {other:?}"))),
    };
    Ok(Checkpoint {
        snapshot,
        stream: stream.to_string(),
        pending,
        token,
        token_time: doc.get_timestamp("token_time").ok(),
        start_time: doc.get_timestamp("start_time").ok(),
        caught_up_at: doc.get_timestamp("caught_up_at").ok(),
        high_water,
        epoch,
        deployment: match doc.get("deployment") {
            None | Some(Bson::Null) => None,
            Some(Bson::Document(d)) => Some(Deployment::from_document(d)),
            Some(other) => return Err(malformed(format!("`deployment` is {other:?}"))),
        },
        updated_at: doc.get_datetime("updated_at").ok().copied(),
        gaps,
        sweep_requested: doc.get_bool("sweep_requested").unwrap_or(false),
    })
}

/// The history-gap generation a ledger entry was written under (entries written before
/// generations existed: 0).
pub(super) fn entry_generation(doc: &Document) -> u64 {
    count(doc.get("generation"))
}

/// The `$set` of a ledger entry's row state (a row that exists; without a post it does not
/// count), and the fields to `$unset`.
pub(super) fn ledger_row_update(row: &Row) -> (Document, Document) {
    let mut set = doc! {"live": row.is_live(), "deleted": row.deleted, "exists": true};
    let mut unset = doc! {"gone_at": ""};
    match &row.post {
        Some(post) => set.insert(LEDGER_POST, post.to_bson()),
        None => unset.insert(LEDGER_POST, ""),
    };
    match row.created_at {
        Some(t) => set.insert(LEDGER_CREATED, t),
        None => unset.insert(LEDGER_CREATED, ""),
    };
    (set, unset)
}

pub(super) fn row_to_doc(row: &Row) -> Document {
    let mut d = doc! {"deleted": row.deleted};
    if let Some(post) = &row.post {
        d.insert("post", post.to_bson());
    }
    if let Some(t) = row.created_at {
        d.insert("created_at", t);
    }
    d
}

pub(super) fn row_from_doc(d: &Document) -> Result<Row, String> {
    let post = match d.get("post") {
        None => None, // a row that exists without a post
        Some(p) => Some(PostId::from_bson(p).ok_or("pending ledger row with a malformed post")?),
    };
    Ok(Row {
        post,
        created_at: d.get_datetime("created_at").ok().copied(),
        deleted: d.get_bool("deleted").map_err(|e| e.to_string())?,
    })
}

/// The pending batch as stored in the checkpoint document.
pub(super) fn pending_to_doc(batch: &PendingBatch) -> Document {
    let dirty: Vec<Bson> = batch
        .dirty
        .iter()
        .map(|d| Bson::Document(doc! {"post": d.post.to_bson(), "bucket": d.newest_bucket}))
        .collect();
    let mut d = doc! {
        "end": batch.end.as_str(),
        "counters": counters_to_bson(&batch.counters),
        "ledger": ledger_to_bson(&batch.ledger),
        "dirty": dirty,
    };
    if let Some(t) = batch.end_time {
        d.insert("end_time", t);
    }
    d
}

/// Planned counter increments as stored in an intent (a pending batch or snapshot chunk).
pub(super) fn counters_to_bson(counters: &[CounterDelta]) -> Vec<Bson> {
    counters
        .iter()
        .map(|c| {
            let mut buckets = Document::new();
            for (k, v) in &c.buckets {
                buckets.insert(k.to_string(), *v);
            }
            let touched: Vec<i64> = c.touched.iter().copied().collect();
            Bson::Document(
                doc! {"post": c.post.to_bson(), "delta": c.delta, "buckets": buckets, "touched": touched},
            )
        })
        .collect()
}

/// Planned ledger states as stored in an intent.
pub(super) fn ledger_to_bson(ledger: &[LedgerUpdate]) -> Vec<Bson> {
    ledger
        .iter()
        .map(|l| {
            Bson::Document(doc! {
                "comment": l.comment.value.clone(),
                "state": l.state.as_ref().map(|r| Bson::Document(row_to_doc(r))).unwrap_or(Bson::Null),
            })
        })
        .collect()
}

pub(super) fn counters_from_doc(d: &Document) -> Result<Vec<CounterDelta>, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let mut counters = Vec::new();
    for c in d.get_array("counters").map_err(err)? {
        let c = c.as_document().ok_or("pending counter is not a document")?;
        let mut buckets = BTreeMap::new();
        for (k, v) in c.get_document("buckets").map_err(err)? {
            let amount = integer(Some(v)).ok().flatten().ok_or("bucket amount")?;
            buckets.insert(k.parse().map_err(|_| "bucket key")?, amount);
        }
        // Batches recorded before `touched` existed touched exactly their non-zero buckets.
        let touched = match c.get_array("touched") {
            Ok(list) => list
                .iter()
                .map(|b| b.as_i64().ok_or("touched bucket"))
                .collect::<Result<_, _>>()?,
            Err(_) => buckets.keys().copied().collect(),
        };
        counters.push(CounterDelta {
            post: c
                .get("post")
                .and_then(PostId::from_bson)
                .ok_or("pending counter post")?,
            delta: c.get_i64("delta").map_err(err)?,
            buckets,
            touched,
        });
    }
    Ok(counters)
}

pub(super) fn ledger_from_doc(d: &Document) -> Result<Vec<LedgerUpdate>, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let mut ledger = Vec::new();
    for l in d.get_array("ledger").map_err(err)? {
        let l = l
            .as_document()
            .ok_or("pending ledger entry is not a document")?;
        let state = match l.get("state") {
            Some(Bson::Document(r)) => Some(row_from_doc(r)?),
            _ => None,
        };
        ledger.push(LedgerUpdate {
            comment: CommentId::new(l.get("comment").cloned().ok_or("pending ledger comment")?),
            state,
        });
    }
    Ok(ledger)
}

pub(super) fn pending_from_doc(d: &Document) -> Result<PendingBatch, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let dirty = d
        .get_array("dirty")
        .map_err(err)?
        .iter()
        .map(|p| match p {
            Bson::Document(d) => Some(DirtyMark {
                post: d.get("post").and_then(PostId::from_bson)?,
                newest_bucket: d.get_i64("bucket").ok()?,
            }),
            // Recorded before marks carried a bucket: covered by any fold, as before.
            other => PostId::from_bson(other).map(|post| DirtyMark {
                post,
                newest_bucket: 0,
            }),
        })
        .map(|m| m.ok_or("pending dirty post"))
        .collect::<Result<_, _>>()?;
    Ok(PendingBatch {
        end: Token(d.get_str("end").map_err(err)?.to_string()),
        end_time: d.get_timestamp("end_time").ok(),
        counters: counters_from_doc(d)?,
        ledger: ledger_from_doc(d)?,
        dirty,
    })
}

/// The snapshot's progress as stored in the checkpoint document.
pub(super) fn snapshot_to_doc(p: &SnapshotProgress) -> Document {
    let id = |c: &Option<CommentId>| c.as_ref().map(|c| c.value.clone()).unwrap_or(Bson::Null);
    let count = |n: u64| n as i64;
    doc! {
        "state": p.state.as_str(),
        "started_at": p.started_at,
        "finished_at": p.finished_at.map(Bson::DateTime).unwrap_or(Bson::Null),
        "last_id": id(&p.last_id),
        "cursor": id(&p.cursor),
        "chunks_done": count(p.chunks_done),
        "rows_scanned": count(p.rows_scanned),
        "rows_counted": count(p.rows_counted),
        "estimated_rows": count(p.estimated_rows),
        "chunks_resumed": count(p.chunks_resumed),
        "reading": p.reading.map(|n| Bson::Int64(n as i64)).unwrap_or(Bson::Null),
        "chunks_reread": count(p.chunks_reread),
        "pending": match &p.pending {
            None => Bson::Null,
            Some(c) => Bson::Document(doc! {
                "number": count(c.number),
                "last": id(&c.last),
                "rows": count(c.rows),
                "ledger": ledger_to_bson(&c.claims),
                "counters": counters_to_bson(&c.counters),
            }),
        },
    }
}

pub(super) fn snapshot_from_doc(d: &Document) -> Result<SnapshotProgress, String> {
    let id = |v: Option<&Bson>| match v {
        None | Some(Bson::Null) => None,
        Some(v) => Some(CommentId::new(v.clone())),
    };
    let count = |d: &Document, field: &str| count(d.get(field));
    let state = d.get_str("state").unwrap_or_default();
    let pending = match d.get("pending") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(c)) => Some(SnapshotChunk {
            number: count(c, "number"),
            last: id(c.get("last")),
            rows: count(c, "rows"),
            claims: ledger_from_doc(c)?,
            counters: counters_from_doc(c)?,
        }),
        Some(other) => return Err(format!("snapshot `pending` is {other:?}")),
    };
    Ok(SnapshotProgress {
        state: SnapshotState::parse(state)
            .ok_or_else(|| format!("snapshot `state` is {state:?}"))?,
        started_at: d
            .get_datetime("started_at")
            .copied()
            .map_err(|e| format!("snapshot: {e}"))?,
        finished_at: d.get_datetime("finished_at").ok().copied(),
        last_id: id(d.get("last_id")),
        cursor: id(d.get("cursor")),
        chunks_done: count(d, "chunks_done"),
        rows_scanned: count(d, "rows_scanned"),
        rows_counted: count(d, "rows_counted"),
        estimated_rows: count(d, "estimated_rows"),
        chunks_resumed: count(d, "chunks_resumed"),
        reading: integer(d.get("reading"))
            .ok()
            .flatten()
            .map(|n| n.max(0) as u64),
        chunks_reread: count(d, "chunks_reread"),
        pending,
    })
}

pub(super) fn dirty_from_doc(doc: &Document) -> Option<DirtyEntry> {
    Some(DirtyEntry {
        post: doc.get("_id").and_then(PostId::from_bson)?,
        first_dirty_at: doc.get_datetime("first_dirty_at").ok().copied()?,
        last_dirty_at: doc.get_datetime("last_dirty_at").ok().copied()?,
        version: integer(doc.get("version")).ok().flatten().unwrap_or(0),
        newest_bucket: doc.get("newest_bucket").and_then(Bson::as_i64),
    })
}

pub(super) fn lease_from_doc(stream: &str, d: &Document) -> Lease {
    Lease {
        stream: stream.to_string(),
        owner: d.get_str("owner").unwrap_or_default().to_string(),
        expires_at: d
            .get_datetime("expires_at")
            .ok()
            .copied()
            .unwrap_or(DateTime::MIN),
        epoch: d.get_i64("epoch").unwrap_or(0),
    }
}

pub(super) fn sweep_from_doc(d: &Document) -> SweepCursor {
    SweepCursor {
        after: d.get("after").and_then(PostId::from_bson),
        pass_started: d.get_datetime("pass_started").ok().copied(),
        posts_done: d.get_i64("posts_done").unwrap_or_default() as u64,
        passes: d.get_i64("passes").unwrap_or_default() as u64,
        last_pass_posts: d.get_i64("last_pass_posts").unwrap_or_default() as u64,
    }
}

pub(super) fn sweep_to_set(cursor: &SweepCursor) -> Document {
    let after = cursor.after.as_ref().map_or(Bson::Null, PostId::to_bson);
    let started = cursor.pass_started.map_or(Bson::Null, Bson::DateTime);
    doc! {
        "after": after,
        "pass_started": started,
        "posts_done": cursor.posts_done as i64,
        "passes": cursor.passes as i64,
        "last_pass_posts": cursor.last_pass_posts as i64,
        "updated_at": DateTime::now(),
    }
}

/// A stored reconcile run: the document `record_run` wrote with serde, read back with serde
/// (fields a run written by an older counterd lacks take their defaults).
pub(super) fn run_from_doc(d: Document) -> StoreResult<RunSummary> {
    let id = format!("{:?}", d.get("_id"));
    bson::from_document(d).map_err(|e| StoreError::Malformed {
        what: "reconcile run",
        id,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod shapes;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reads_back_as_written_and_an_older_one_takes_defaults() {
        let run = RunSummary {
            kind: "sweep".into(),
            posts: 3,
            drift_low: -2,
            finished_at: Some(DateTime::from_millis(5_000)),
            ..RunSummary::default()
        };
        let stored = bson::to_document(&run).unwrap();
        assert_eq!(run_from_doc(stored).unwrap(), run);
        // A run stored before `waiting` existed, with a count edited into an Int32.
        let older = doc! {"_id": bson::oid::ObjectId::new(), "kind": "dirty", "posts": 7_i32};
        let read = run_from_doc(older).unwrap();
        assert_eq!(
            (read.kind.as_str(), read.posts, read.waiting),
            ("dirty", 7, 0)
        );
    }

    #[test]
    fn integers_follow_one_rule() {
        assert_eq!(integer(None), Ok(None));
        assert_eq!(integer(Some(&Bson::Null)), Ok(None));
        assert_eq!(integer(Some(&Bson::Int32(-4))), Ok(Some(-4)));
        assert_eq!(integer(Some(&Bson::Int64(9))), Ok(Some(9)));
        assert_eq!(integer(Some(&Bson::Double(2.0))), Ok(Some(2)));
        assert!(integer(Some(&Bson::Double(2.5))).is_err());
        assert!(integer(Some(&Bson::String("1".into()))).is_err());
        assert_eq!(count(Some(&Bson::Int64(-1))), 0);
    }
}
