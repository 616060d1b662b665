//! The store contract: the same cases run against the MongoDB store (on the test database) and
//! the in-process store the simulation uses, so the simulation's store is shown to behave like
//! the real one where correctness depends on it: the token and chunk guards, upserts that hit
//! an existing document, fencing epochs, and conditional installs.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use bson::{Bson, DateTime};
use counterd::core::batch::CounterDelta;
use counterd::core::batch::PendingBatch;
use counterd::core::event::LedgerUpdate;
use counterd::core::event::{CommentId, Row, Token};
use counterd::core::fold::Fold;
use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::core::num::Num;
use counterd::core::window::{LedgerAt, LOG_ENTRIES};
use counterd::store::prelude::*;
use counterd::store::{CounterDoc, DirtyOrder, Fence, StoreError};

const STREAM: &str = "comments";

fn fence(epoch: i64) -> Fence {
    Fence {
        stream: STREAM.into(),
        epoch,
    }
}

fn token(n: u32) -> Token {
    Token(format!("82{n:08X}"))
}

fn post(n: i64) -> GroupValue {
    GroupValue::Int(n)
}

fn delta(p: i64, d: i64) -> CounterDelta {
    CounterDelta {
        key: CounterKey::new(CounterIx::DEFAULT, post(p)),
        delta: Num::Int(d),
        buckets: BTreeMap::from([(0, Num::Int(d))]),
        touched: BTreeSet::from([0]),
        comments: Some(vec![comment(p * 100)]),
    }
}

fn comment(n: i64) -> CommentId {
    CommentId::new(Bson::Int64(n))
}

fn row(p: i64) -> Row {
    Row::of(Some(post(p)), Some(DateTime::from_millis(1_000)), false)
}

fn update(c: i64, state: Option<Row>) -> LedgerUpdate {
    LedgerUpdate {
        comment: comment(c),
        state,
    }
}

async fn shown<S: Store>(store: &S, p: i64) -> Option<i64> {
    store
        .read_counter(&post(p))
        .await
        .unwrap()
        .map(|c| c.shown().as_i64())
}

async fn ledger_state<S: Store>(store: &S, c: i64) -> Option<Option<Row>> {
    let found = store.read_ledger(STREAM, &[comment(c)], 0).await.unwrap();
    found.get(&comment(c).key).cloned()
}

/// A counter increment is applied once per token: a token at or below `applied_through` is
/// counted as already applied (the upsert's guard fails on the existing document).
async fn counters_are_guarded_by_token<S: Store>(store: &S) {
    let f = fence(1);
    let first = store
        .apply_counters(&f, &[delta(1, 2)], &token(10), None)
        .await
        .unwrap();
    assert_eq!((first.applied, first.already_applied), (1, 0));
    for t in [10, 9] {
        let again = store
            .apply_counters(&f, &[delta(1, 2)], &token(t), None)
            .await
            .unwrap();
        assert_eq!((again.applied, again.already_applied), (0, 1), "token {t}");
    }
    assert_eq!(shown(store, 1).await, Some(2));
    let later = store
        .apply_counters(&f, &[delta(1, -1), delta(2, 1)], &token(11), None)
        .await
        .unwrap();
    assert_eq!((later.applied, later.already_applied), (2, 0));
    assert_eq!(shown(store, 1).await, Some(1));
    assert_eq!(shown(store, 2).await, Some(1));
    let counter = store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(counter.applied_through, Some(token(11).0));
}

/// Ledger states are written once per token: an older or equal token leaves the entry.
async fn ledger_writes_are_guarded_by_token<S: Store>(store: &S) {
    let f = fence(1);
    store
        .write_ledger(&f, &[update(1, Some(row(1)))], &token(10), 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(Some(row(1))));
    for t in [10, 9] {
        store
            .write_ledger(&f, &[update(1, None)], &token(t), 0)
            .await
            .unwrap();
        assert_eq!(
            ledger_state(store, 1).await,
            Some(Some(row(1))),
            "token {t}"
        );
    }
    store
        .write_ledger(&f, &[update(1, None)], &token(11), 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(None));
}

/// A snapshot claim never replaces an entry the stream wrote.
async fn claims_leave_existing_entries<S: Store>(store: &S) {
    let f = fence(1);
    store
        .write_ledger(&f, &[update(1, Some(row(1)))], &token(10), 0)
        .await
        .unwrap();
    store
        .claim_ledger(&f, &[update(1, Some(row(7))), update(2, Some(row(2)))], 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(Some(row(1))));
    assert_eq!(ledger_state(store, 2).await, Some(Some(row(2))));
    assert_eq!(ledger_state(store, 3).await, None);
}

/// Snapshot increments are applied once per chunk: a chunk at or below the counter's last one
/// counts as already applied.
async fn snapshot_counters_are_guarded_by_chunk<S: Store>(store: &S) {
    let f = fence(1);
    let first = store
        .apply_snapshot_counters(&f, 1, &[delta(1, 3)])
        .await
        .unwrap();
    assert_eq!((first.applied, first.already_applied), (1, 0));
    let again = store
        .apply_snapshot_counters(&f, 1, &[delta(1, 3)])
        .await
        .unwrap();
    assert_eq!((again.applied, again.already_applied), (0, 1));
    let next = store
        .apply_snapshot_counters(&f, 2, &[delta(1, 1)])
        .await
        .unwrap();
    assert_eq!((next.applied, next.already_applied), (1, 0));
    assert_eq!(shown(store, 1).await, Some(4));
}

/// After a newer epoch wrote a counter, an older one cannot change it; after a newer epoch
/// adopted the checkpoint, an older one cannot move it, nor adopt it back.
async fn older_epochs_are_fenced_out<S: Store>(store: &S) {
    store
        .apply_counters(&fence(2), &[delta(1, 1)], &token(10), None)
        .await
        .unwrap();
    let stale = store
        .apply_counters(&fence(1), &[delta(1, 5)], &token(11), None)
        .await;
    if let Ok(outcome) = stale {
        assert_eq!(outcome.applied, 0);
    }
    assert_eq!(shown(store, 1).await, Some(1));

    store.adopt_checkpoint(&fence(2)).await.unwrap();
    assert_eq!(
        store.load_checkpoint(STREAM).await.unwrap().unwrap().epoch,
        2
    );
    let batch = PendingBatch {
        end: token(12),
        ..PendingBatch::default()
    };
    let refused = store.record_intent(&fence(1), &batch, None).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = store.save_checkpoint(&fence(1), &token(12), None).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let refused = store.adopt_checkpoint(&fence(1)).await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let checkpoint = store.load_checkpoint(STREAM).await.unwrap().unwrap();
    assert_eq!((checkpoint.epoch, checkpoint.token), (2, None));

    store.adopt_checkpoint(&fence(3)).await.unwrap();
    store
        .save_checkpoint(&fence(3), &token(12), None)
        .await
        .unwrap();
    let checkpoint = store.load_checkpoint(STREAM).await.unwrap().unwrap();
    assert_eq!((checkpoint.epoch, checkpoint.token), (3, Some(token(12))));
}

fn fold(base_count: i64) -> Fold {
    Fold {
        watermark: 100,
        base_count: Num::Int(base_count),
        live_delta: Num::ZERO,
        kept: BTreeMap::new(),
        dropped: vec![0],
        wrong: Num::ZERO,
        right: Num::Int(base_count),
        drift: Num::ZERO,
    }
}

/// A fold is installed only while the counter is as read: not when one was created since a
/// caller saw none, nor when an increment moved it since it was read.
async fn installs_are_conditional<S: Store>(store: &S) {
    let now = DateTime::from_millis(5_000);
    assert!(store
        .install_fold(&post(1), None, &fold(4), now)
        .await
        .unwrap());
    assert_eq!(shown(store, 1).await, Some(4));
    assert!(!store
        .install_fold(&post(1), None, &fold(9), now)
        .await
        .unwrap());
    assert_eq!(shown(store, 1).await, Some(4));

    let read = store.read_counter(&post(1)).await.unwrap().unwrap();
    store
        .apply_counters(&fence(1), &[delta(1, 1)], &token(10), None)
        .await
        .unwrap();
    assert!(!store
        .install_fold(&post(1), Some(&read), &fold(9), now)
        .await
        .unwrap());
    assert_eq!(shown(store, 1).await, Some(5));

    let read = store.read_counter(&post(1)).await.unwrap().unwrap();
    assert!(store
        .install_fold(&post(1), Some(&read), &fold(7), now)
        .await
        .unwrap());
    assert_eq!(shown(store, 1).await, Some(7));
}

/// Each batch that writes a counter appends its entry (its token and the rows it named, or
/// `None`: not listed) to the counter's log; an already-applied statement appends nothing, the
/// oldest entries fall off beyond `LOG_ENTRIES`, and a fold leaves the log alone.
async fn counters_log_the_rows_each_batch_changed<S: Store>(store: &S) {
    let f = fence(1);
    let unlisted = CounterDelta {
        comments: None,
        ..delta(1, 1)
    };
    store
        .apply_counters(&f, &[delta(1, 1)], &token(10), None)
        .await
        .unwrap();
    store
        .apply_counters(&f, std::slice::from_ref(&unlisted), &token(11), None)
        .await
        .unwrap();
    store
        .apply_counters(&f, &[unlisted], &token(11), None)
        .await
        .unwrap();
    let log = |c: CounterDoc| {
        c.recent
            .into_iter()
            .map(|t| (t.through, t.comments.map(|c| c.len())))
            .collect::<Vec<_>>()
    };
    let read = store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(
        read.recent[0].comments,
        Some(vec![comment(100)]),
        "the rows as written"
    );
    assert_eq!(
        log(read),
        vec![(token(10).0, Some(1)), (token(11).0, None)],
        "one entry per applied batch, the unlisted one as None"
    );
    for n in 0..LOG_ENTRIES as u32 {
        store
            .apply_counters(&f, &[delta(1, 0)], &token(20 + n), None)
            .await
            .unwrap();
    }
    let read = store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(read.recent.len(), LOG_ENTRIES);
    assert_eq!(read.recent[0].through, token(20).0, "the oldest fell off");
    let before = log(read.clone());
    assert!(store
        .install_fold(&post(1), Some(&read), &fold(9), DateTime::from_millis(1))
        .await
        .unwrap());
    let folded = store.read_counter(&post(1)).await.unwrap().unwrap();
    assert_eq!(folded.shown(), 9);
    assert_eq!(log(folded), before, "a fold keeps the log");
}

/// A ledger read for a recount carries the token of the batch that wrote each entry; an entry
/// the snapshot claimed has none, and one of an older generation is left out.
async fn ledger_reads_carry_the_batch_that_wrote_them<S: Store>(store: &S) {
    let f = fence(1);
    store
        .write_ledger(
            &f,
            &[update(1, Some(row(1))), update(2, None)],
            &token(10),
            1,
        )
        .await
        .unwrap();
    store
        .claim_ledger(&f, &[update(3, Some(row(1)))], 1)
        .await
        .unwrap();
    let ids = [comment(1), comment(2), comment(3), comment(4)];
    let read = store.read_ledger_at(STREAM, &ids, 1).await.unwrap();
    assert_eq!(
        read.get(&comment(1).key),
        Some(&LedgerAt {
            state: Some(row(1)),
            through: Some(token(10).0)
        })
    );
    assert_eq!(
        read.get(&comment(2).key),
        Some(&LedgerAt {
            state: None,
            through: Some(token(10).0)
        })
    );
    assert_eq!(read.get(&comment(3).key).map(|e| &e.through), Some(&None));
    assert_eq!(read.get(&comment(4).key), None, "no entry: unknown");
    let newer = store.read_ledger_at(STREAM, &ids, 2).await.unwrap();
    assert!(newer.is_empty(), "{newer:?}");
}

/// Each definition keeps its own counters and dirty set: a batch's writes are routed by their
/// definition whatever the handle, a view reads only its definition's, and a write for a
/// definition the store does not know refuses the whole batch before anything is written
/// (it would otherwise land on another definition's counter of the same key).
async fn writes_go_to_their_definitions<S: Store>(store: &S) {
    let f = fence(1);
    let of = |d: &CounterDelta, ix: usize| CounterDelta {
        key: CounterKey::new(CounterIx(ix), d.key.group.clone()),
        ..d.clone()
    };
    let batch = [delta(1, 1), of(&delta(1, 2), 1), of(&delta(1, 5), 2)];
    let outcome = store
        .apply_counters(&f, &batch, &token(10), None)
        .await
        .unwrap();
    assert_eq!(outcome.applied, 3);
    assert_eq!(shown(store, 1).await, Some(1));
    assert_eq!(shown(&store.for_counter(CounterIx(1)), 1).await, Some(2));
    assert_eq!(shown(&store.for_counter(CounterIx(2)), 1).await, Some(5));
    // Each counter keeps its own guard: a replay of the batch is already applied everywhere.
    let again = store
        .apply_counters(&f, &batch, &token(10), None)
        .await
        .unwrap();
    assert_eq!(again.already_applied, 3);
    let mark = counterd::core::batch::DirtyMark::settled(CounterKey::new(CounterIx(2), post(7)));
    store
        .mark_dirty(&f, &[mark], DateTime::from_millis(0))
        .await
        .unwrap();
    let dirty = |s: S| async move {
        s.dirty_list(None, DirtyOrder::Oldest, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.post)
            .collect::<Vec<_>>()
    };
    assert_eq!(dirty(store.for_counter(CounterIx(2))).await, [post(7)]);
    assert!(dirty(store.for_counter(CounterIx::DEFAULT))
        .await
        .is_empty());
    assert!(dirty(store.for_counter(CounterIx(1))).await.is_empty());

    let unknown = of(&delta(2, 1), 3);
    let refused = store
        .apply_counters(&f, &[delta(2, 1), unknown.clone()], &token(11), None)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fatal { .. })),
        "{refused:?}"
    );
    let refused = store.apply_snapshot_counters(&f, 1, &[unknown]).await;
    assert!(
        matches!(refused, Err(StoreError::Fatal { .. })),
        "{refused:?}"
    );
    let mark = counterd::core::batch::DirtyMark::settled(CounterKey::new(CounterIx(3), post(1)));
    let refused = store
        .mark_dirty(&f, &[mark], DateTime::from_millis(0))
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fatal { .. })),
        "{refused:?}"
    );
    assert_eq!(
        shown(store, 2).await,
        None,
        "nothing of the refused batch was written"
    );
}

/// Rows for [`a_view_counts_its_definitions_rows`]: (post, author, approved, deleted).
fn definition_rows() -> Vec<bson::Document> {
    let rows = [
        (1, "ann", true, false),
        (1, "ann", false, false),
        (1, "bob", true, true),
        (2, "ann", true, false),
        (2, "bob", false, false),
    ];
    rows.iter()
        .enumerate()
        .map(|(i, (p, author, approved, deleted))| {
            let mut row = bson::doc! {
                "_id": i as i64 + 1,
                "post_id": *p as i64,
                "author_id": *author,
                "approved": *approved,
                "created_at": DateTime::from_millis(1_000),
            };
            if *deleted {
                row.insert("deleted_at", DateTime::from_millis(2_000));
            }
            row
        })
        .collect()
}

/// A view's truth is its definition's: its group field, its condition, the shared soft delete.
async fn a_view_counts_its_definitions_rows<S: Store>(store: &S) {
    let (approved, by_author) = (
        store.for_counter(CounterIx(1)),
        store.for_counter(CounterIx(2)),
    );
    let ann = GroupValue::Str("ann".into());
    assert_eq!(store.count_live(&post(1)).await.unwrap(), 2);
    assert_eq!(approved.count_live(&post(1)).await.unwrap(), 1);
    assert_eq!(approved.count_live(&post(2)).await.unwrap(), 1);
    assert_eq!(by_author.count_live(&ann).await.unwrap(), 3);
    assert_eq!(
        by_author
            .count_live(&GroupValue::Str("bob".into()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(approved.count_live_below(&post(1), 10).await.unwrap(), 1);
    assert_eq!(approved.count_live_below(&post(1), 0).await.unwrap(), 0);
    let ids = by_author.live_ids_below(&ann, 10, 10).await.unwrap();
    assert_eq!(ids.map(|i| i.len()), Some(3));
    assert_eq!(by_author.rows_of_post(&ann).await.unwrap().len(), 3);
    assert_eq!(by_author.latest_created(&ann).await.unwrap(), Some(1));
    let groups = by_author.posts_after(None, 10).await.unwrap();
    assert_eq!(groups, [ann, GroupValue::Str("bob".into())]);
}

#[tokio::test]
async fn writes_go_to_their_definitions_on_mongo() {
    let t =
        support::TestDb::with_schema("writes_go_to_their_definitions", schema_with_definitions())
            .await;
    writes_go_to_their_definitions(&*t.store).await;
}

#[tokio::test]
async fn writes_go_to_their_definitions_in_memory() {
    writes_go_to_their_definitions(&memory_with_definitions()).await;
}

#[tokio::test]
async fn a_view_counts_its_definitions_rows_on_mongo() {
    let t = support::TestDb::with_schema(
        "a_view_counts_its_definitions_rows",
        schema_with_definitions(),
    )
    .await;
    t.comments.insert_many(definition_rows()).await.unwrap();
    a_view_counts_its_definitions_rows(&*t.store).await;
}

#[tokio::test]
async fn a_view_counts_its_definitions_rows_in_memory() {
    let store = memory_with_definitions();
    for row in definition_rows() {
        store.lock().insert_row(row);
    }
    a_view_counts_its_definitions_rows(&store).await;
}

/// The in-process store keeping [`schema_with_definitions`]'s definitions.
fn memory_with_definitions() -> counterd::store::memory::MemoryStore {
    let store = memory();
    store
        .lock()
        .define_counters(schema_with_definitions().definitions.extra().to_vec());
    store
}

async fn mongo(test: &str) -> support::TestDb {
    support::TestDb::new(test).await
}

fn memory() -> counterd::store::memory::MemoryStore {
    counterd::store::memory::MemoryStore::new(1_000)
}

/// A dirty entry is cleared only at the version a fold listed; a requeue restarts its age
/// whatever its version (a mark since the listing must not leave the age of a post that keeps
/// changing where it was), never moves it back, and creates nothing.
async fn dirty_entries_clear_at_their_version_and_requeue_at_any<S: Store>(store: &S) {
    use counterd::core::batch::DirtyMark;
    let at = DateTime::from_millis;
    let mark = |n| {
        vec![DirtyMark::settled(CounterKey::new(
            CounterIx::DEFAULT,
            post(n),
        ))]
    };
    store
        .mark_dirty(&fence(1), &mark(1), at(1_000))
        .await
        .unwrap();
    let listed = store
        .dirty_list(Some(STREAM), DirtyOrder::Oldest, 10)
        .await
        .unwrap();
    let entry = listed.iter().find(|e| e.post == post(1)).unwrap().clone();
    assert_eq!(entry.first_dirty_at, at(1_000));
    // Marked again after the listing: the fold's clear misses, its requeue lands.
    store
        .mark_dirty(&fence(1), &mark(1), at(2_000))
        .await
        .unwrap();
    assert!(!store.clear_dirty(&post(1), entry.version).await.unwrap());
    assert!(store.requeue_dirty(&post(1), at(3_000)).await.unwrap());
    assert!(store.requeue_dirty(&post(1), at(2_500)).await.unwrap());
    let age = |list: Vec<counterd::store::DirtyEntry>| {
        list.into_iter()
            .find(|e| e.post == post(1))
            .map(|e| (e.first_dirty_at, e.version))
    };
    let (first, version) = age(store
        .dirty_list(Some(STREAM), DirtyOrder::Oldest, 10)
        .await
        .unwrap())
    .unwrap();
    assert_eq!(
        first,
        at(3_000),
        "restarted at the later fold, not moved back"
    );
    assert!(store.clear_dirty(&post(1), version).await.unwrap());
    assert!(!store.requeue_dirty(&post(1), at(4_000)).await.unwrap());
    assert_eq!(
        age(store
            .dirty_list(Some(STREAM), DirtyOrder::Oldest, 10)
            .await
            .unwrap()),
        None,
        "a requeue creates no entry"
    );
}

/// A batch's counters stored under its carry's id (see `counterd::core::carry`) are fenced like every
/// worker write: a predecessor that has not noticed its successor cannot overwrite the
/// successor's copy of the same batch with its own plan, while the successor may overwrite a
/// predecessor's. What is read back is the newest epoch's copy, through the pending batch only.
async fn carried_copies_are_fenced<S: Store>(store: &S) {
    let own = |end: u32, d: i64| PendingBatch {
        end: token(end),
        counters: vec![delta(1, d)],
        ..PendingBatch::default()
    };
    let intent = |end: u32| PendingBatch {
        end: token(end),
        carry: Some(token(20)),
        ..PendingBatch::default()
    };
    // A predecessor stored its copy of batch 20; the successor's replaces it.
    store
        .record_intent(&fence(1), &intent(20), Some(&own(20, 5)))
        .await
        .unwrap();
    store.adopt_checkpoint(&fence(2)).await.unwrap();
    store
        .record_intent(&fence(2), &intent(20), Some(&own(20, 1)))
        .await
        .unwrap();
    store
        .record_intent(&fence(2), &intent(21), Some(&own(21, 2)))
        .await
        .unwrap();
    // The predecessor, still running, tries to store its plan of batch 21 again.
    let refused = store
        .record_intent(&fence(1), &intent(21), Some(&own(21, 7)))
        .await;
    assert!(
        matches!(refused, Err(StoreError::Fenced { .. })),
        "{refused:?}"
    );
    let read = store
        .load_carried(STREAM, &token(20), None, &token(21), 10)
        .await
        .unwrap();
    assert_eq!(read, vec![own(20, 1), own(21, 2)], "the successor's copies");
    let read = store
        .load_carried(STREAM, &token(20), None, &token(20), 10)
        .await
        .unwrap();
    assert_eq!(read, vec![own(20, 1)], "through the pending batch only");
    let first = store
        .load_carried(STREAM, &token(20), None, &token(21), 1)
        .await
        .unwrap();
    let next = store
        .load_carried(STREAM, &token(20), Some(&token(20)), &token(21), 1)
        .await
        .unwrap();
    assert_eq!(
        (first, next),
        (vec![own(20, 1)], vec![own(21, 2)]),
        "in pages, oldest first"
    );
    // The predecessor, re-applying the same pending carry, clears it: the successor's stay.
    let _ = store.clear_carried(&fence(1), &token(20)).await;
    let read = store
        .load_carried(STREAM, &token(20), None, &token(21), 10)
        .await
        .unwrap();
    assert_eq!(read.len(), 2, "a newer epoch's copies stay");
    store.clear_carried(&fence(2), &token(20)).await.unwrap();
    let read = store
        .load_carried(STREAM, &token(20), None, &token(21), 10)
        .await
        .unwrap();
    assert_eq!(read, vec![], "cleared");
}

macro_rules! contract {
    ($($case:ident),* $(,)?) => {
        mod on_mongo {
            $(
                #[tokio::test]
                async fn $case() {
                    let t = super::mongo(stringify!($case)).await;
                    super::$case(&*t.store).await;
                }
            )*
        }
        mod in_memory {
            $(
                #[tokio::test]
                async fn $case() {
                    super::$case(&super::memory()).await;
                }
            )*
        }
    };
}

contract!(
    counters_are_guarded_by_token,
    ledger_writes_are_guarded_by_token,
    claims_leave_existing_entries,
    snapshot_counters_are_guarded_by_chunk,
    older_epochs_are_fenced_out,
    installs_are_conditional,
    counters_log_the_rows_each_batch_changed,
    ledger_reads_carry_the_batch_that_wrote_them,
    dirty_entries_clear_at_their_version_and_requeue_at_any,
    carried_copies_are_fenced,
);

/// Two definitions beyond the default (`approved` per post, `per_author`).
fn schema_with_definitions() -> counterd::core::schema::Schema {
    let definition = |name: &str, group: &str, condition: bson::Document| {
        counterd::core::definition::Definition {
            name: name.into(),
            group: group.into(),
            condition: counterd::core::condition::Condition::parse(&condition).unwrap(),
            collection: format!("{name}_counters"),
            kind: counterd::core::definition::Kind::Count,
        }
    };
    counterd::core::schema::Schema::default().with_more(vec![
        definition("approved", "post_id", bson::doc! {"approved": true}),
        definition("per_author", "author_id", bson::doc! {}),
    ])
}

/// A ledger entry keeps the row's verdict for every definition (the next event's before-state
/// needs no document), and "gone" clears them.
async fn ledger_keeps_every_definitions_verdict<S: Store>(store: &S) {
    use counterd::core::key::Member;
    let f = fence(1);
    let mut state = row(1);
    state.members.extend([
        Member::counting(Some(post(1)), false),
        Member::counting(Some(GroupValue::Str("ann".into())), true),
    ]);
    store
        .write_ledger(&f, &[update(1, Some(state.clone()))], &token(10), 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(Some(state.clone())));
    state.members[1].matches = true;
    state.members[2].group = None;
    store
        .write_ledger(&f, &[update(1, Some(state.clone()))], &token(11), 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(Some(state)));
    store
        .write_ledger(&f, &[update(1, None)], &token(12), 0)
        .await
        .unwrap();
    assert_eq!(ledger_state(store, 1).await, Some(None));
}

#[tokio::test]
async fn ledger_keeps_every_definitions_verdict_on_mongo() {
    let t = support::TestDb::with_schema(
        "ledger_keeps_every_definitions_verdict",
        schema_with_definitions(),
    )
    .await;
    ledger_keeps_every_definitions_verdict(&*t.store).await;
}

#[tokio::test]
async fn ledger_keeps_every_definitions_verdict_in_memory() {
    ledger_keeps_every_definitions_verdict(&memory()).await;
}

/// An existing database keeps working when definitions are added: a ledger entry written
/// without them (as every entry before definitions existed) reads with its row intact and
/// counts nowhere for the new definitions (whose counters start from their first changes, and
/// the reconciler's recounts), and writing it again with definitions keeps the row.
#[tokio::test]
async fn a_ledger_written_before_definitions_reads_with_them() {
    let old = support::TestDb::new("ledger_before_definitions").await;
    old.store
        .write_ledger(&fence(1), &[update(1, Some(row(1)))], &token(10), 0)
        .await
        .unwrap();
    let stored = old
        .db
        .collection::<bson::Document>("counterd_comment_state")
        .find_one(bson::doc! {})
        .await
        .unwrap()
        .unwrap();
    assert!(
        !stored.contains_key("members"),
        "without definitions the entry is written as before them: {stored}"
    );
    let store =
        counterd::store::mongo::MongoStore::connect(&counterd::store::mongo::ConnectOptions {
            uri: old.uri.clone(),
            database: old.name.clone(),
            comments: "comments".into(),
            connect_timeout: std::time::Duration::from_secs(10),
            collections: counterd::store::mongo::Collections::default(),
            schema: schema_with_definitions(),
        })
        .await
        .unwrap();
    let mut expected = row(1);
    expected
        .members
        .extend([Default::default(), Default::default()]);
    assert_eq!(ledger_state(&store, 1).await, Some(Some(expected)));
    assert_eq!(shown(&*old.store, 1).await, None);
}

/// The rows [`updates_come_without_the_row_and_are_looked_up`] writes: three comments on post
/// 1, then a soft delete of the first, a move of the second and a hard delete of the third.
const LOOKUP_ROWS: [i64; 3] = [1, 2, 3];

/// An update event names its row but carries no row of it (no `updateLookup`: at most the fake
/// server's fragment of the update, without `_id`) unless pre-images are asked for, and
/// `look_up` reads the rows as they are now, in one read, a row that is gone absent: the
/// batched read that replaces the server's lookups (`counterd::core::lookup`).
async fn updates_come_without_the_row_and_are_looked_up<S: Store>(
    store: &S,
    start: bson::Timestamp,
) {
    use counterd::core::event::{ChangeEvent, Operation};
    use counterd::store::{StreamOptions, StreamStart};
    let mut source = store
        .open_stream(StreamOptions {
            start: StreamStart::AtTime(start),
            pre_images: false,
            pipeline: Vec::new(),
            max_await: std::time::Duration::from_millis(100),
        })
        .await
        .unwrap();
    let mut events = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while events.len() < 6 && std::time::Instant::now() < deadline {
        let batch = source
            .next_batch(10, std::time::Duration::from_millis(100))
            .await
            .unwrap();
        events.extend(batch.events.into_iter().map(Result::unwrap));
    }
    let updates: Vec<&ChangeEvent> = events
        .iter()
        .filter(|e| matches!(e.operation, Operation::Update { .. }))
        .collect();
    assert_eq!(updates.len(), 2, "{events:?}");
    for u in &updates {
        assert!(u.comment.is_some(), "the event names its row: {u:?}");
        let row = u.full_document.as_ref();
        assert!(
            !row.is_some_and(|d| d.contains_key("_id")),
            "no lookup: {u:?}"
        );
    }
    let ids: Vec<CommentId> = LOOKUP_ROWS.iter().map(|c| comment(*c)).collect();
    let rows = store.look_up(&ids).await.unwrap();
    assert_eq!(rows.len(), 2, "the hard-deleted row is absent: {rows:?}");
    let first = &rows[&comment(1).key];
    assert!(
        first.contains_key("deleted_at"),
        "soft-deleted since: {first}"
    );
    let second = &rows[&comment(2).key];
    assert_eq!(second.get_i64("post_id"), Ok(2), "moved since: {second}");
    assert!(!second.contains_key("body"), "read with the row projection");
    assert_eq!(store.look_up(&[]).await.unwrap().len(), 0);
}

fn lookup_row(c: i64) -> bson::Document {
    bson::doc! {"_id": c, "post_id": 1_i64, "created_at": DateTime::from_millis(1_000), "body": "text"}
}

#[tokio::test]
async fn updates_come_without_the_row_and_are_looked_up_on_mongo() {
    let t = mongo("updates_come_without_the_row_and_are_looked_up").await;
    let start = t.store.read_position().await.unwrap().lower;
    let start = bson::Timestamp {
        time: start.time.saturating_sub(1),
        increment: 0,
    };
    let rows: Vec<bson::Document> = LOOKUP_ROWS.iter().map(|c| lookup_row(*c)).collect();
    t.comments.insert_many(rows).await.unwrap();
    let set = |doc: bson::Document| bson::doc! {"$set": doc};
    t.comments
        .update_one(
            bson::doc! {"_id": 1_i64},
            set(bson::doc! {"deleted_at": DateTime::now()}),
        )
        .await
        .unwrap();
    t.comments
        .update_one(
            bson::doc! {"_id": 2_i64},
            set(bson::doc! {"post_id": 2_i64}),
        )
        .await
        .unwrap();
    t.comments
        .delete_one(bson::doc! {"_id": 3_i64})
        .await
        .unwrap();
    updates_come_without_the_row_and_are_looked_up(&*t.store, start).await;
}

#[tokio::test]
async fn updates_come_without_the_row_and_are_looked_up_in_memory() {
    for descriptions in [true, false] {
        let store = memory();
        let start = store.read_position().await.unwrap().lower;
        {
            let mut m = store.lock();
            m.update_descriptions = descriptions;
            for c in LOOKUP_ROWS {
                m.insert_row(lookup_row(c));
            }
            m.update(1, bson::doc! {"deleted_at": DateTime::now()}, &[]);
            m.update(2, bson::doc! {"post_id": 2_i64}, &[]);
            m.delete_row(3);
        }
        updates_come_without_the_row_and_are_looked_up(&store, start).await;
    }
}

/// A sum of `rating` per author with its row count (`with_count`): two definitions whose
/// counters share one document per author.
fn schema_with_a_sum() -> counterd::core::schema::Schema {
    let settings: counterd::config::Settings = toml::from_str(
        "[[counters]]\nname = \"rating_sum\"\ngroup_field = \"author_id\"\nkind = \"sum\"\nfield = \"rating\"\nwith_count = true\ncollection = \"rating_counters\"\n",
    )
    .unwrap();
    counterd::core::schema::Schema::default()
        .with_more(settings.definitions().unwrap().extra().to_vec())
}

/// Rows with ratings: ann's add up to 4.5 (an integer and a half), bob's to 2; a string adds
/// nothing but is a row; a soft-deleted row is not counted at all.
fn rated_rows() -> Vec<bson::Document> {
    let rows: [(&str, Bson, bool); 5] = [
        ("ann", Bson::Int32(4), false),
        ("ann", Bson::Double(0.5), false),
        ("ann", Bson::Int32(9), true),
        ("bob", Bson::Int64(2), false),
        ("bob", Bson::String("n/a".into()), false),
    ];
    rows.into_iter()
        .enumerate()
        .map(|(i, (author, rating, deleted))| {
            let mut row = bson::doc! {
                "_id": i as i64 + 1,
                "post_id": 1_i64,
                "author_id": author,
                "rating": rating,
                "created_at": DateTime::from_millis(1_000),
            };
            if deleted {
                row.insert("deleted_at", DateTime::from_millis(2_000));
            }
            row
        })
        .collect()
}

/// A sum and its row count: guarded increments of each (a double stays a double), `$sum` and
/// row counts as the truth, and a fold of the row count into a document the sum created.
async fn a_sum_and_its_row_count_share_a_document<S: Store>(store: &S) {
    let (sum, rows) = (
        store.for_counter(CounterIx(1)),
        store.for_counter(CounterIx(2)),
    );
    let ann = GroupValue::Str("ann".into());
    let bob = GroupValue::Str("bob".into());
    let write = |ix: usize, d: Num| CounterDelta {
        key: CounterKey::new(CounterIx(ix), ann.clone()),
        delta: d,
        buckets: BTreeMap::from([(0, d)]),
        touched: BTreeSet::from([0]),
        comments: Some(vec![comment(1), comment(2)]),
    };
    let batch = [write(1, Num::Double(4.5)), write(2, Num::Int(2))];
    let f = fence(1);
    let outcome = store
        .apply_counters(&f, &batch, &token(10), None)
        .await
        .unwrap();
    assert_eq!(outcome.applied, 2);
    let again = store
        .apply_counters(&f, &batch, &token(10), None)
        .await
        .unwrap();
    assert_eq!(again.already_applied, 2, "each part keeps its own guard");
    async fn shown<S: Store>(s: &S, p: &GroupValue) -> Option<Num> {
        s.read_counter(p).await.unwrap().map(|c| c.shown())
    }
    assert_eq!(shown(&sum, &ann).await, Some(Num::Double(4.5)));
    assert_eq!(shown(&rows, &ann).await, Some(Num::Int(2)));
    // The truth: `$sum` of the live rows' ratings, and the number of those rows.
    assert_eq!(sum.count_live(&ann).await.unwrap(), Num::Double(4.5));
    assert_eq!(rows.count_live(&ann).await.unwrap(), Num::Int(2));
    assert_eq!(sum.count_live(&bob).await.unwrap(), Num::Int(2));
    assert_eq!(rows.count_live(&bob).await.unwrap(), Num::Int(2));
    assert_eq!(sum.count_live_below(&bob, 100).await.unwrap(), Num::Int(2));
    assert_eq!(
        sum.count_live_below(&bob, 1).await.unwrap(),
        Num::ZERO,
        "created at 1 s"
    );
    assert_eq!(
        sum.live_ids_below(&bob, i64::MAX, 100).await.unwrap(),
        None,
        "a sum's recount is the server's $sum, never row ids"
    );
    // The sum's fold creates bob's document; the row count then folds into the same one.
    let fold = |n: Num| Fold {
        watermark: 100,
        base_count: n,
        live_delta: Num::ZERO,
        kept: BTreeMap::new(),
        dropped: vec![],
        wrong: Num::ZERO,
        right: n,
        drift: -n,
    };
    let now = DateTime::from_millis(5_000);
    assert!(sum
        .install_fold(&bob, None, &fold(Num::Int(2)), now)
        .await
        .unwrap());
    let read = rows.read_counter(&bob).await.unwrap();
    assert!(rows
        .install_fold(&bob, read.as_ref(), &fold(Num::Int(2)), now)
        .await
        .unwrap());
    assert_eq!(shown(&sum, &bob).await, Some(Num::Int(2)));
    assert_eq!(shown(&rows, &bob).await, Some(Num::Int(2)));
    let c = sum.read_counter(&bob).await.unwrap().unwrap();
    assert_eq!((c.last_drift, c.folds), (Some(Num::Int(-2)), 1));
    // The row count's own fold does not touch the sum's.
    let c = rows.read_counter(&bob).await.unwrap().unwrap();
    assert_eq!(c.folds, 1);
}

#[tokio::test]
async fn a_sum_and_its_row_count_share_a_document_on_mongo() {
    let t = support::TestDb::with_schema("a_sum_and_its_row_count", schema_with_a_sum()).await;
    t.comments.insert_many(rated_rows()).await.unwrap();
    a_sum_and_its_row_count_share_a_document(&*t.store).await;
    // One document per author: the sum in `count`, the rows in `rows.count`.
    let ann =
        t.db.collection::<bson::Document>("rating_counters")
            .find_one(bson::doc! {"_id": "ann"})
            .await
            .unwrap()
            .unwrap();
    assert_eq!(ann.get("count"), Some(&Bson::Double(4.5)), "{ann}");
    assert_eq!(
        ann.get_document("rows").ok().and_then(|r| r.get("count")),
        Some(&Bson::Int64(2)),
        "{ann}"
    );
    let n =
        t.db.collection::<bson::Document>("rating_counters")
            .count_documents(bson::doc! {})
            .await
            .unwrap();
    assert_eq!(n, 2, "one document per author");
}

#[tokio::test]
async fn a_sum_and_its_row_count_share_a_document_in_memory() {
    let store = memory();
    store
        .lock()
        .define_counters(schema_with_a_sum().definitions.extra().to_vec());
    for row in rated_rows() {
        store.lock().insert_row(row);
    }
    a_sum_and_its_row_count_share_a_document(&store).await;
}

/// A counter several partitions write (per author, while partitions divide by post) keeps one
/// guard per writer: partition 0 in the document's own fields, partition `n` under
/// `writers.p<n>`, each with its own token, epoch and snapshot chunk, so a lagging partition's
/// older token is not taken for "already applied" and one partition's lease epoch does not
/// fence out another's. Every writer's write moves `shared_writes`, which the install pins:
/// even a write that moved no number voids a fold read before it. A counter grouped by the
/// post keeps today's single guard whatever partition writes it.
async fn a_counter_several_partitions_write_guards_each_writer<S: Store>(store: &S) {
    let by_author = store.for_counter(CounterIx(2));
    let ann = GroupValue::Str("ann".into());
    let of_ann = |d: i64| CounterDelta {
        key: CounterKey::new(CounterIx(2), ann.clone()),
        ..delta(1, d)
    };
    let p = |index: u32, epoch: i64| Fence {
        stream: format!("{STREAM}/p{index}of2"),
        epoch,
    };
    let shown_ann = || async { by_author.read_counter(&ann).await.unwrap().unwrap() };
    let applied = |o: counterd::store::ApplyOutcome| (o.applied, o.already_applied);
    let write = |fence: Fence, d: i64, t: u32| {
        let batch = [of_ann(d)];
        async move {
            let o = store
                .apply_counters(&fence, &batch, &token(t), None)
                .await
                .unwrap();
            applied(o)
        }
    };
    assert_eq!(write(p(0, 3), 1, 20).await, (1, 0));
    // Partition 1 lags behind: its token is older than partition 0's, and its epoch lower.
    assert_eq!(write(p(1, 1), 2, 10).await, (1, 0), "its own guard");
    assert_eq!(shown_ann().await.shown(), 3);
    assert_eq!(write(p(1, 1), 2, 10).await, (0, 1), "a replay");
    assert_eq!(write(p(1, 1), 2, 9).await, (0, 1), "an older batch");
    assert_eq!(write(p(0, 3), 1, 20).await, (0, 1), "a replay");
    assert_eq!(
        write(p(1, 0), 5, 11).await,
        (0, 1),
        "fenced by its own epoch"
    );
    let read = shown_ann().await;
    assert_eq!(read.shown(), 3);
    assert_eq!(read.applied_through.as_deref(), Some(token(20).as_str()));
    assert_eq!(
        read.writers.get(&1).and_then(|w| w.applied_through.clone()),
        Some(token(10).to_string())
    );
    assert_eq!(read.writers[&1].touched.keys().collect::<Vec<_>>(), [&0]);
    assert_eq!(read.shared_writes, 2);
    assert!(read.recent.is_empty(), "no log: recounts are counts alone");

    // A write that moves no number (a touch) still voids a fold read before it.
    let touch = CounterDelta {
        delta: Num::ZERO,
        buckets: BTreeMap::new(),
        ..of_ann(0)
    };
    store
        .apply_counters(&p(1, 1), &[touch], &token(12), None)
        .await
        .unwrap();
    let now = DateTime::from_millis(5_000);
    assert!(!by_author
        .install_fold(&ann, Some(&read), &fold(7), now)
        .await
        .unwrap());
    let read = shown_ann().await;
    assert!(by_author
        .install_fold(&ann, Some(&read), &fold(7), now)
        .await
        .unwrap());
    let folded = shown_ann().await;
    assert_eq!(folded.shown(), 7);
    assert!(
        folded.touched.is_empty() && folded.writers[&1].touched.is_empty(),
        "every writer's touches below the watermark are covered: {folded:?}"
    );

    // The initial snapshot's chunks: each partition's own chunk guard.
    let snap = |fence: Fence, chunk: u64| {
        let batch = [of_ann(1)];
        async move {
            let o = store
                .apply_snapshot_counters(&fence, chunk, &batch)
                .await
                .unwrap();
            applied(o)
        }
    };
    assert_eq!(snap(p(0, 3), 2).await, (1, 0));
    assert_eq!(snap(p(1, 1), 1).await, (1, 0), "its own chunk guard");
    assert_eq!(snap(p(1, 1), 1).await, (0, 1));
    assert_eq!(shown_ann().await.shown(), 9);

    // Grouped by the post: one writer, today's guard and log.
    store
        .apply_counters(&p(1, 1), &[delta(5, 1)], &token(10), None)
        .await
        .unwrap();
    let post_counter = store.read_counter(&post(5)).await.unwrap().unwrap();
    assert_eq!(
        post_counter.applied_through.as_deref(),
        Some(token(10).as_str())
    );
    assert!(post_counter.writers.is_empty() && post_counter.shared_writes == 0);
    assert_eq!(post_counter.recent.len(), 1);
}

#[tokio::test]
async fn a_counter_several_partitions_write_guards_each_writer_on_mongo() {
    let t = support::TestDb::with_schema(
        "a_counter_several_partitions_write_guards_each_writer",
        schema_with_definitions(),
    )
    .await;
    a_counter_several_partitions_write_guards_each_writer(&*t.store).await;
}

#[tokio::test]
async fn a_counter_several_partitions_write_guards_each_writer_in_memory() {
    a_counter_several_partitions_write_guards_each_writer(&memory_with_definitions()).await;
}
