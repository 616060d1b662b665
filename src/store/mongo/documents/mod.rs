//! Converters between counterd's types and its stored documents. Serde-derived, private to
//! the MongoDB store: the checkpoint's intents (`intents`: pending batch, snapshot progress and
//! chunk), dirty entries, leases and the sweep cursor (`entries`), reconcile runs; with the
//! field rules they share in `fields`, the [`integer`] rule first. Still by hand here, and why:
//! the ledger entry's row (its write is a field-by-field `$set`/`$unset` that must unset what a
//! row lacks; see [`ledger_row_update`]), and the top level of counter and checkpoint documents,
//! whose errors name the malformed field and the fix (a derived reader's error does not say
//! which field it was in; bson's `serde_path_to_error` feature would, at the price of a
//! dependency). Their reads are pinned in `shapes_top`, the serde-derived ones in `shapes`. The
//! checkpoint's `deployment` is read and written by [`Deployment`] itself.

use serde::Serialize;

use super::*;
use crate::core::definition::Definition;
use crate::core::key::Member;
use crate::core::num::Num;

mod entries;
mod fields;
mod intents;

pub(super) use self::entries::{dirty_from_doc, lease_from_doc, sweep_from_doc, sweep_to_set};
pub(super) use self::intents::{
    pending_from_doc, pending_from_raw, pending_to_raw, snapshot_from_doc, snapshot_to_doc,
};

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

/// A counter's number (a base, a delta, a bucket's amount, a drift): an integer stays an
/// integer, a double stays a double (a sum that turned into one); `Err` for anything else.
pub(super) fn number(value: Option<&Bson>) -> Result<Option<Num>, String> {
    match value {
        None | Some(Bson::Null) => Ok(None),
        Some(v) => Num::from_bson(v)
            .map(Some)
            .ok_or_else(|| format!("{v:?}, expected a number")),
    }
}

/// Amounts by bucket, as a counter and an intent store them: a document keyed by the bucket's
/// start in seconds (BSON keys are strings), each amount by the [`number`] rule; a null amount
/// reads as `null_is` (`None`: an error).
fn bucket_amounts(map: &Document, null_is: Option<Num>) -> Result<BTreeMap<i64, Num>, String> {
    let bucket = |(key, value): (&String, &Bson)| {
        let start = key.parse();
        let start = start.map_err(|_| format!("bucket key `{key}` is not a number of seconds"))?;
        let amount = number(Some(value)).map_err(|e| format!("bucket `{key}` is {e}"))?;
        let null = || format!("bucket `{key}` is null");
        Ok((start, amount.or(null_is).ok_or_else(null)?))
    };
    map.iter().map(bucket).collect()
}

/// A stored count (progress numbers, generations): [`integer`], where a missing, malformed or
/// negative value counts as none done.
fn count(value: Option<&Bson>) -> u64 {
    integer(value).ok().flatten().unwrap_or(0).max(0) as u64
}

/// A ledger entry's row: `None` when the comment is gone. An existing row without `post_id`
/// does not count; `live` says whether a row counts, `deleted` whether it is soft-deleted
/// (entries written before `deleted` existed always had a post, so `live` said it).
pub(super) fn row_from_ledger(doc: &Document, definitions: &[Definition]) -> Option<Row> {
    if !doc.get_bool("exists").unwrap_or(false) {
        return None;
    }
    let live = doc.get_bool("live").unwrap_or(false);
    let post = doc.get(LEDGER_POST).and_then(GroupValue::from_bson);
    Some(Row {
        members: joined(
            post,
            ledger_members_from(doc.get(LEDGER_MEMBERS), definitions),
        ),
        created_at: doc.get_datetime(LEDGER_CREATED).ok().copied(),
        deleted: doc.get_bool("deleted").unwrap_or(!live),
    })
}

/// A document's `_id` as an operator reads it (`"post-1"`, `ObjectId("...")`, `7`), not as
/// Rust debug text (`Some(String("post-1"))`).
fn shown_id(doc: &Document) -> String {
    doc.get("_id")
        .map_or_else(|| "(no _id)".to_string(), |id| id.to_string())
}

pub(super) fn counter_from_doc(doc: &Document) -> StoreResult<CounterDoc> {
    let malformed = |detail: String| StoreError::Malformed {
        what: "counter",
        id: shown_id(doc),
        detail,
    };
    let int_or_none = |field: &str| -> StoreResult<Option<i64>> {
        integer(doc.get(field)).map_err(|e| malformed(format!("`{field}` is {e}")))
    };
    let int = |field: &str| -> StoreResult<i64> { Ok(int_or_none(field)?.unwrap_or(0)) };
    // A counter's numbers: integers for a count, a sum's integers or doubles.
    let num_or_none = |field: &str| -> StoreResult<Option<Num>> {
        number(doc.get(field)).map_err(|e| malformed(format!("`{field}` is {e}")))
    };
    let num = |field: &str| -> StoreResult<Num> { Ok(num_or_none(field)?.unwrap_or_default()) };
    let buckets = match doc.get_document("live_by_bucket") {
        Ok(map) => bucket_amounts(map, Some(Num::default())).map_err(malformed)?,
        Err(_) => BTreeMap::new(),
    };
    Ok(CounterDoc {
        post: doc.get("_id").and_then(GroupValue::from_bson),
        state: CounterState {
            base_count: num("base_count")?,
            base_watermark: match doc.get("base_watermark") {
                Some(Bson::DateTime(d)) => crate::core::time::secs(*d),
                _ => int("base_watermark")?,
            },
            live_delta: num("live_delta")?,
            buckets,
        },
        applied_through: doc.get_str("applied_through").ok().map(String::from),
        applied_time: doc.get_timestamp("applied_time").ok(),
        folds: int("folds")?,
        count: num_or_none("count")?,
        touched: touched_from(doc),
        recent: recent_from(doc),
        writers: writers_from(doc),
        shared_writes: int(SHARED_WRITES_FIELD)?,
        last_drift: num_or_none("last_drift")?,
        reconciled_at: doc.get_datetime("reconciled_at").ok().copied(),
    })
}

/// A writer's touched buckets (`touched: {<bucket>: token}`) in `doc`.
fn touched_from(doc: &Document) -> BTreeMap<i64, String> {
    let entries = doc.get_document("touched").ok().into_iter().flatten();
    entries
        .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
        .collect()
}

/// The positions of partitions `n > 0` in a counter several partitions write
/// (`writers: {p<n>: {applied_through, applied_time, touched}}`, see
/// [`crate::store::Writer`]).
fn writers_from(doc: &Document) -> BTreeMap<u32, crate::store::WriterPosition> {
    let writers = doc.get_document(WRITERS_FIELD).ok().into_iter().flatten();
    writers
        .filter_map(|(key, value)| {
            let slot = key.strip_prefix('p')?.parse().ok()?;
            let w = value.as_document()?;
            Some((
                slot,
                crate::store::WriterPosition {
                    applied_through: w.get_str("applied_through").ok().map(String::from),
                    applied_time: w.get_timestamp("applied_time").ok(),
                    touched: touched_from(w),
                },
            ))
        })
        .collect()
}

/// The counter's log of recent batches (`recent: [{t: token, c: [ids] | null}]`). An entry
/// that does not read is kept as unlisted, so a recount spanning it refuses rather than
/// missing a row.
fn recent_from(doc: &Document) -> Vec<Touch> {
    let entries = doc.get_array("recent").ok().into_iter().flatten();
    entries
        .filter_map(Bson::as_document)
        .filter_map(|e| {
            Some(Touch {
                through: e.get_str("t").ok()?.to_string(),
                comments: e
                    .get_array("c")
                    .ok()
                    .map(|ids| ids.iter().cloned().map(CommentId::new).collect()),
            })
        })
        .collect()
}

/// A counter log entry as the counters' raw statements push it: `{t: through, c: [ids] | null}`.
pub(super) fn touch_to_raw(op: &'static str, touch: &Touch) -> StoreResult<RawDocumentBuf> {
    let comments = match &touch.comments {
        Some(ids) => RawBson::Array(
            ids.iter()
                .map(|c| raw_value(op, c.value.clone()))
                .collect::<StoreResult<_>>()?,
        ),
        None => RawBson::Null,
    };
    Ok(rawdoc! {"t": touch.through.as_str(), "c": comments})
}

/// A malformed checkpoint's error, with the fix.
fn checkpoint_malformed(stream: &str) -> impl Fn(String) -> StoreError + '_ {
    move |detail| {
        StoreError::Malformed {
        what: "checkpoint",
        id: stream.to_string(),
        detail: format!("{detail} (fix or delete it in counterd's checkpoints collection, or run `counterd replay --from-time ...`)"),
    }
    }
}

/// A checkpoint as read, raw: its pending intent (every counter, ledger state and dirty mark
/// of a batch in flight, thousands while behind) is parsed from its bytes, never held as a
/// document tree; the rest is small and read as a document.
pub(super) fn checkpoint_from_raw(
    stream: &str,
    raw: &bson::RawDocument,
) -> StoreResult<Checkpoint> {
    let malformed = checkpoint_malformed(stream);
    let mut doc = Document::new();
    let mut pending = None;
    for element in raw {
        let (key, value) = element.map_err(|e| malformed(e.to_string()))?;
        match (key, value) {
            ("pending", bson::RawBsonRef::Document(p)) => {
                pending = Some(pending_from_raw(p).map_err(&malformed)?)
            }
            _ => {
                let value = Bson::try_from(value).map_err(|e| malformed(e.to_string()))?;
                doc.insert(key, value);
            }
        }
    }
    let mut checkpoint = checkpoint_from_doc(stream, &doc)?;
    checkpoint.pending = pending.or(checkpoint.pending.take());
    Ok(checkpoint)
}

pub(super) fn checkpoint_from_doc(stream: &str, doc: &Document) -> StoreResult<Checkpoint> {
    let malformed = checkpoint_malformed(stream);
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
    let gaps = doc.get_array("gaps").ok().into_iter().flatten();
    let gaps = gaps.filter_map(Bson::as_document).map(|g| Gap {
        from: g.get_datetime("from").ok().copied(),
        to: g.get_datetime("to").ok().copied().unwrap_or(DateTime::MIN),
    });
    // An optional sub-document: absent or null is none, anything but a document malformed.
    let sub = |field: &str| match doc.get(field) {
        None | Some(Bson::Null) => Ok(None),
        Some(Bson::Document(d)) => Ok(Some(d)),
        Some(other) => Err(malformed(format!("`{field}` is {other:?}"))),
    };
    let pending = sub("pending")?.map(pending_from_doc).transpose();
    let pending = pending.map_err(&malformed)?;
    let snapshot = sub("snapshot")?.map(snapshot_from_doc).transpose();
    let snapshot = snapshot.map_err(&malformed)?;
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
        deployment: sub("deployment")?.map(Deployment::from_document),
        updated_at: doc.get_datetime("updated_at").ok().copied(),
        gaps: gaps.collect(),
        sweep_requested: doc.get_bool("sweep_requested").unwrap_or(false),
    })
}

/// The history-gap generation a ledger entry was written under (entries written before
/// generations existed: 0).
pub(super) fn entry_generation(doc: &Document) -> u64 {
    count(doc.get("generation"))
}

/// The `$set` of a ledger entry's row state (a row that exists; without a post it does not
/// count), and the fields to `$unset`, as raw BSON (a ledger write is one statement per event).
pub(super) fn ledger_row_update(
    op: &'static str,
    row: &Row,
    definitions: &[Definition],
) -> StoreResult<(RawDocumentBuf, RawDocumentBuf)> {
    let mut set = rawdoc! {"live": row.is_live(), "deleted": row.deleted, "exists": true};
    let mut unset = rawdoc! {"gone_at": ""};
    let (post, more) = split(row);
    match post {
        Some(post) => set.append(LEDGER_POST, raw_value(op, post.to_bson())?),
        None => unset.append(LEDGER_POST, ""),
    };
    match row.created_at {
        Some(t) => set.append(LEDGER_CREATED, t),
        None => unset.append(LEDGER_CREATED, ""),
    };
    // Without definitions beyond the default, the entry is written exactly as before them.
    if !definitions.is_empty() {
        let members = ledger_members_to_bson(more, definitions);
        set.append(LEDGER_MEMBERS, raw_value(op, members)?);
    }
    Ok((set, unset))
}

/// A row's members as stored documents keep them, as they were written before definitions
/// existed: the first definition's group apart (`post_id`), the others after it (`members`).
pub(super) fn split(row: &Row) -> (Option<&GroupValue>, &[Member]) {
    (row.group(), row.members.get(1..).unwrap_or_default())
}

/// [`split`] read back: the first definition counts every row of its group.
pub(super) fn joined(post: Option<GroupValue>, more: Vec<Member>) -> Vec<Member> {
    std::iter::once(Member::counting(post, true))
        .chain(more)
        .collect()
}

/// A row's verdicts as a ledger entry keeps them: by definition *name*
/// (`members: {approved: {group: 8, matches: true}}`), so an entry still reads right after
/// definitions are added, removed or reordered (a definition it does not name reads as "counts
/// nowhere", as for a row written before the definition existed; removed ones are ignored).
pub(super) fn ledger_members_to_bson(members: &[Member], definitions: &[Definition]) -> Bson {
    let by_name = members.iter().zip(definitions);
    let by_name = by_name.map(|(m, d)| (d.name.clone(), member_to_bson(m)));
    Bson::Document(by_name.collect())
}

/// [`ledger_members_to_bson`] read back, in the order of `definitions`.
pub(super) fn ledger_members_from(value: Option<&Bson>, definitions: &[Definition]) -> Vec<Member> {
    let by_name = value.and_then(Bson::as_document);
    definitions
        .iter()
        .map(|d| member_from(by_name.and_then(|m| m.get(&d.name))))
        .collect()
}

/// `{matches, group, amount}`: `amount` only where it is not 1 (a sum's value; a count's
/// members stay as they were written before sums existed).
fn member_to_bson(member: &Member) -> Bson {
    let mut d = doc! {"matches": member.matches};
    if let Some(group) = &member.group {
        d.insert("group", group.to_bson());
    }
    if member.amount != Num::ONE {
        d.insert("amount", member.amount.to_bson());
    }
    Bson::Document(d)
}

/// Anything unreadable is a member that counts nowhere (the reconciler recounts what it misses).
fn member_from(value: Option<&Bson>) -> Member {
    match value {
        Some(Bson::Document(d)) => Member {
            group: d.get("group").and_then(GroupValue::from_bson),
            matches: d.get_bool("matches").unwrap_or(false),
            amount: match d.get("amount") {
                None => Num::ONE,
                Some(v) => Num::from_bson(v).unwrap_or_default(),
            },
            not_a_number: None,
        },
        _ => Member::default(),
    }
}

/// A row's verdicts as a pending batch's intent keeps them: in definition order (an intent is
/// re-applied by the next start, before any event is read; a configuration that changed the
/// definitions in between gets them re-dirtied by the reconciler's recount at worst).
pub(super) fn members_to_bson(members: &[Member]) -> Bson {
    Bson::Array(members.iter().map(member_to_bson).collect())
}

/// [`members_to_bson`] read back.
pub(super) fn members_from(value: Option<&Bson>) -> Vec<Member> {
    let list = value.and_then(Bson::as_array).into_iter().flatten();
    list.map(|m| member_from(Some(m))).collect()
}

/// A document serde writes: the record's stored shape, for `op` (a failure is a bug, reported
/// as fatal rather than a panic).
pub(super) fn to_stored<T: Serialize>(op: &'static str, value: &T) -> StoreResult<Document> {
    bson::to_document(value).map_err(unencodable(op))
}

/// A stored reconcile run: the document `record_run` wrote with serde, read back with serde
/// (fields a run written by an older counterd lacks take their defaults).
pub(super) fn run_from_doc(d: Document) -> StoreResult<RunSummary> {
    let id = shown_id(&d);
    bson::from_document(d).map_err(|e| StoreError::Malformed {
        what: "reconcile run",
        id,
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod shapes;
#[cfg(test)]
mod shapes_top;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reads_back_as_written_and_an_older_one_takes_defaults() {
        let run = RunSummary {
            kind: "sweep".into(),
            posts: 3,
            drift_low: Num::Int(-2),
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
