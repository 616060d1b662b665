//! The stored shapes, pinned: each literal below is what counterd wrote before its documents
//! were serde-derived (taken from the hand-written converters), so a database written by an
//! older counterd still reads, and a newer one writes nothing an older one could not read.

use super::*;
use crate::core::key::{CounterIx, CounterKey};
use crate::core::num::Num;
use bson::oid::ObjectId;

pub(super) fn at(millis: i64) -> DateTime {
    DateTime::from_millis(millis)
}

/// Field names in order: a derived writer keeps the order the hand-written one had.
fn keys(d: &Document) -> Vec<&str> {
    d.keys().map(String::as_str).collect()
}

fn counter_delta() -> CounterDelta {
    CounterDelta {
        key: CounterKey::new(CounterIx::DEFAULT, GroupValue::Int(7)),
        delta: Num::Int(2),
        buckets: BTreeMap::from([(3600, Num::Int(2))]),
        touched: [0, 3600].into(),
        comments: Some(vec![
            CommentId::new(Bson::Int32(5)),
            CommentId::new(Bson::String("c9".into())),
        ]),
    }
}

fn ledger_updates() -> Vec<LedgerUpdate> {
    vec![
        LedgerUpdate {
            comment: CommentId::new(Bson::Int32(5)),
            state: Some(Row::of(
                Some(GroupValue::Str("p".into())),
                Some(at(1_000)),
                false,
            )),
        },
        LedgerUpdate {
            comment: CommentId::new(Bson::String("c9".into())),
            state: None,
        },
        LedgerUpdate {
            comment: CommentId::new(Bson::Int32(6)),
            state: Some(Row::of(None, None, true)),
        },
    ]
}

fn stored_counters() -> Bson {
    bson::bson!([{"post": 7_i64, "delta": 2_i64, "buckets": {"3600": 2_i64}, "touched": [0_i64, 3600_i64], "comments": [5_i32, "c9"]}])
}

fn stored_ledger() -> Bson {
    bson::bson!([
        {"comment": 5_i32, "state": {"deleted": false, "post": "p", "created_at": at(1_000)}},
        {"comment": "c9", "state": null},
        {"comment": 6_i32, "state": {"deleted": true}},
    ])
}

fn pending_batch() -> PendingBatch {
    PendingBatch {
        carry: None,
        end: Token("82AB".into()),
        end_time: Some(Timestamp {
            time: 10,
            increment: 2,
        }),
        counters: vec![counter_delta()],
        ledger: ledger_updates(),
        dirty: vec![DirtyMark {
            key: CounterKey::new(CounterIx::DEFAULT, GroupValue::Int(7)),
            newest_bucket: 3600,
        }],
    }
}

fn stored_pending() -> Document {
    doc! {
        "end": "82AB",
        "counters": stored_counters(),
        "ledger": stored_ledger(),
        "dirty": [{"post": 7_i64, "bucket": 3600_i64}],
        "end_time": Timestamp { time: 10, increment: 2 },
    }
}

#[test]
fn a_batch_that_continues_a_carry_names_it() {
    let batch = PendingBatch {
        carry: Some(Token("82AA".into())),
        ..pending_batch()
    };
    let written = pending_to_raw(&batch).unwrap();
    assert_eq!(written.get_str("carry").unwrap(), "82AA");
    assert_eq!(pending_from_raw(&written).unwrap(), batch);
}

#[test]
fn a_pending_batch_keeps_its_stored_shape() {
    let batch = pending_batch();
    let written = pending_to_raw(&batch).unwrap().to_document().unwrap();
    assert_eq!(written, stored_pending());
    assert_eq!(keys(&written), keys(&stored_pending()));
    assert_eq!(pending_from_doc(&stored_pending()).unwrap(), batch);
}

#[test]
fn an_older_pending_batch_still_reads() {
    // Before marks carried a bucket, before `touched`, without a cluster time, with amounts
    // edited into an Int32 and a whole Double.
    let older = doc! {
        "end": "82AB",
        "counters": [{"post": 7_i32, "delta": 2_i64, "buckets": {"3600": 1_i32, "7200": 1.0}}],
        "ledger": [],
        "dirty": ["p2"],
    };
    let read = pending_from_doc(&older).unwrap();
    assert_eq!(read.end_time, None);
    assert_eq!(
        read.dirty,
        vec![DirtyMark::settled(CounterKey::new(
            CounterIx::DEFAULT,
            GroupValue::Str("p2".into()),
        ))]
    );
    let counter = &read.counters[0];
    assert_eq!(
        counter.buckets,
        BTreeMap::from([(3600, Num::ONE), (7200, Num::Double(1.0))]),
        "a double stays a double (a sum's amounts may be doubles)"
    );
    assert_eq!(counter.touched, [3600, 7200].into());
    assert_eq!(
        counter.comments, None,
        "not listed: a recount spanning it refuses"
    );
}

#[test]
fn a_malformed_pending_batch_is_an_error() {
    // The stored batch with `changed`'s fields in place of its own.
    let with = |changed: Document| {
        let mut bad = stored_pending();
        bad.extend(changed);
        bad
    };
    let mut no_end = stored_pending();
    no_end.remove("end");
    for bad in [
        no_end,
        // A post of no post type, a row's null post, a row without `deleted`, a text amount.
        with(doc! {"counters": [{"post": 1.5, "delta": 1_i64, "buckets": {}}]}),
        with(doc! {"ledger": [{"comment": 1_i32, "state": {"deleted": false, "post": null}}]}),
        with(doc! {"ledger": [{"comment": 1_i32, "state": {}}]}),
        with(doc! {"counters": [{"post": 1_i64, "delta": 1_i64, "buckets": {"0": "0.5"}}]}),
    ] {
        assert!(pending_from_doc(&bad).is_err(), "{bad}");
        let raw = bson::RawDocumentBuf::from_document(&bad).unwrap();
        assert!(pending_from_raw(&raw).is_err(), "{bad}");
    }
}

#[test]
fn a_checkpoint_read_raw_is_the_checkpoint_read_as_a_document() {
    let stored = doc! {
        "_id": "comments",
        "token": "82AB",
        "high_water": "82AC",
        "epoch": 3_i64,
        "pending": stored_pending(),
        "updated_at": at(5),
        "sweep_requested": true,
    };
    let raw = bson::RawDocumentBuf::from_document(&stored).unwrap();
    let read = checkpoint_from_raw("comments", &raw).unwrap();
    assert_eq!(read, checkpoint_from_doc("comments", &stored).unwrap());
    assert_eq!(read.pending, Some(pending_batch()));
    let mut bad = stored.clone();
    bad.insert("pending", doc! {"end": 1_i32});
    let raw = bson::RawDocumentBuf::from_document(&bad).unwrap();
    let err = checkpoint_from_raw("comments", &raw).unwrap_err();
    assert!(err.to_string().contains("pending batch"), "{err}");
}

fn snapshot() -> SnapshotProgress {
    SnapshotProgress {
        state: SnapshotState::Running,
        started_at: at(2_000),
        finished_at: None,
        last_id: Some(CommentId::new(Bson::Int32(99))),
        cursor: None,
        chunks_done: 3,
        rows_scanned: 300,
        rows_counted: 250,
        estimated_rows: 1_000,
        chunks_resumed: 1,
        reading: Some(4),
        chunks_reread: 0,
        pending: Some(SnapshotChunk {
            number: 4,
            last: Some(CommentId::new(Bson::String("z".into()))),
            rows: 100,
            claims: ledger_updates(),
            counters: vec![counter_delta()],
        }),
    }
}

fn stored_snapshot() -> Document {
    doc! {
        "state": "running",
        "started_at": at(2_000),
        "finished_at": null,
        "last_id": 99_i32,
        "cursor": null,
        "chunks_done": 3_i64,
        "rows_scanned": 300_i64,
        "rows_counted": 250_i64,
        "estimated_rows": 1_000_i64,
        "chunks_resumed": 1_i64,
        "reading": 4_i64,
        "chunks_reread": 0_i64,
        "pending": {
            "number": 4_i64,
            "last": "z",
            "rows": 100_i64,
            "ledger": stored_ledger(),
            "counters": stored_counters(),
        },
    }
}

#[test]
fn snapshot_progress_keeps_its_stored_shape() {
    let written = snapshot_to_doc(&snapshot()).unwrap();
    assert_eq!(written, stored_snapshot());
    assert_eq!(keys(&written), keys(&stored_snapshot()));
    assert_eq!(snapshot_from_doc(&stored_snapshot()).unwrap(), snapshot());
    let done = SnapshotProgress {
        state: SnapshotState::Done,
        finished_at: Some(at(3_000)),
        reading: None,
        pending: None,
        ..snapshot()
    };
    let mut stored_done = stored_snapshot();
    stored_done
        .extend(doc! {"state": "done", "finished_at": at(3_000), "reading": null, "pending": null});
    assert_eq!(snapshot_to_doc(&done).unwrap(), stored_done);
    assert_eq!(snapshot_from_doc(&stored_done).unwrap(), done);
}

#[test]
fn older_snapshot_progress_still_reads_and_a_malformed_one_is_an_error() {
    // Before the counts past `chunks_done` existed, one edited into an Int32, one negative.
    let older = doc! {"state": "abandoned", "started_at": at(2_000), "chunks_done": 2_i32, "rows_scanned": -5_i64};
    let read = snapshot_from_doc(&older).unwrap();
    assert_eq!(read.state, SnapshotState::Abandoned);
    assert_eq!(
        (read.chunks_done, read.rows_scanned, read.chunks_reread),
        (2, 0, 0)
    );
    assert_eq!(
        (read.reading, read.last_id, read.pending),
        (None, None, None)
    );
    let mut bad_state = stored_snapshot();
    bad_state.insert("state", "paused");
    let mut no_start = stored_snapshot();
    no_start.remove("started_at");
    let mut bad_pending = stored_snapshot();
    bad_pending.insert("pending", 3_i64);
    for bad in [bad_state, no_start, bad_pending] {
        assert!(snapshot_from_doc(&bad).is_err(), "{bad}");
    }
}

#[test]
fn a_dirty_entry_keeps_its_stored_shape() {
    let stored = doc! {
        "_id": 7_i64,
        "first_dirty_at": at(1_000),
        "last_dirty_at": at(2_000),
        "version": 3_i64,
        "newest_bucket": 3600_i64,
    };
    let entry = DirtyEntry {
        post: GroupValue::Int(7),
        first_dirty_at: at(1_000),
        last_dirty_at: at(2_000),
        version: 3,
        newest_bucket: Some(3600),
    };
    assert_eq!(dirty_from_doc(&stored), Some(entry.clone()));
    // Before `newest_bucket` existed; without a version.
    let older = doc! {"_id": 7_i64, "first_dirty_at": at(1_000), "last_dirty_at": at(2_000)};
    let read = dirty_from_doc(&older).unwrap();
    assert_eq!((read.version, read.newest_bucket), (0, None));
    let edited = doc! {"_id": 7_i32, "first_dirty_at": at(1_000), "last_dirty_at": at(2_000), "version": 3.0, "newest_bucket": 3600_i32};
    assert_eq!(dirty_from_doc(&edited), Some(entry.clone()));
    // Not an entry: a post of no post type, or a missing time.
    assert_eq!(
        dirty_from_doc(&doc! {"_id": 1.5, "first_dirty_at": at(1), "last_dirty_at": at(1)}),
        None
    );
    assert_eq!(
        dirty_from_doc(&doc! {"_id": 7_i64, "first_dirty_at": at(1)}),
        None
    );
}

#[test]
fn a_lease_keeps_its_stored_shape() {
    let oid = ObjectId::new();
    let stored =
        doc! {"_id": "s", "owner": "w1", "expires_at": at(9_000), "epoch": 4_i64, "other": oid};
    let lease = Lease {
        stream: "s".into(),
        owner: "w1".into(),
        expires_at: at(9_000),
        epoch: 4,
    };
    assert_eq!(lease_from_doc("s", &stored), lease);
    let empty = lease_from_doc("s", &doc! {"_id": "s"});
    assert_eq!(
        (empty.owner.as_str(), empty.expires_at, empty.epoch),
        ("", DateTime::MIN, 0)
    );
    // An epoch edited into an Int32 reads by the integer rule; an owner of another type is none.
    let edited = lease_from_doc("s", &doc! {"owner": 3_i32, "epoch": 4_i32});
    assert_eq!((edited.owner.as_str(), edited.epoch), ("", 4));
}

#[test]
fn a_sweep_cursor_keeps_its_stored_shape() {
    let cursor = SweepCursor {
        after: Some(GroupValue::Int(7)),
        pass_started: Some(at(5_000)),
        posts_done: 5,
        passes: 2,
        last_pass_posts: 40,
    };
    let mut set = sweep_to_set(&cursor).unwrap();
    assert!(matches!(set.remove("updated_at"), Some(Bson::DateTime(_))));
    assert_eq!(
        set,
        doc! {"after": 7_i64, "pass_started": at(5_000), "posts_done": 5_i64, "passes": 2_i64, "last_pass_posts": 40_i64}
    );
    assert_eq!(sweep_from_doc(&set), cursor);
    let fresh = SweepCursor::default();
    let mut set = sweep_to_set(&fresh).unwrap();
    set.remove("updated_at");
    assert_eq!(
        set,
        doc! {"after": null, "pass_started": null, "posts_done": 0_i64, "passes": 0_i64, "last_pass_posts": 0_i64}
    );
    assert_eq!(sweep_from_doc(&set), fresh);
    assert_eq!(sweep_from_doc(&doc! {"_id": "s"}), fresh);
    // Counts edited into an Int32 or a whole Double read by the integer rule; negative is none.
    let edited = doc! {"after": "p", "posts_done": 5_i32, "passes": 2.0, "last_pass_posts": -1_i64};
    let read = sweep_from_doc(&edited);
    assert_eq!(read.after, Some(GroupValue::Str("p".into())));
    assert_eq!(
        (read.posts_done, read.passes, read.last_pass_posts),
        (5, 2, 0)
    );
}

#[test]
fn a_ledger_entry_keeps_its_stored_shape() {
    use crate::core::key::Member;
    // As written before definitions were one list: the first one's group in `post_id`, the
    // others by name under `members`.
    let stored = doc! {
        "_id": 5_i32, "live": true, "deleted": false, "exists": true, "post_id": "p",
        "created_at": at(1_000), "members": {"approved": {"matches": false, "group": "p"}},
    };
    let post = Some(GroupValue::Str("p".into()));
    let mut row = Row::of(post.clone(), Some(at(1_000)), false);
    row.members.push(Member::counting(post, false));
    let definitions = [Definition::count("approved", "post_id", doc! {})];
    assert_eq!(row_from_ledger(&stored, &definitions), Some(row.clone()));
    let (set, unset) = ledger_row_update("test", &row, &definitions).unwrap();
    let set = set.to_document().unwrap();
    for (field, value) in stored.iter().filter(|(field, _)| *field != "_id") {
        assert_eq!(set.get(field), Some(value), "{field}");
    }
    assert_eq!(keys(&unset.to_document().unwrap()), ["gone_at"]);
}
