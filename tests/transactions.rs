//! Multi-document transactions: their real shape (`fixtures/events/txn_*.json`, three events of
//! one MongoDB 6/7 transaction), and the rule that a read of the change stream, and so a batch,
//! never ends between two of their events (`counterd::core::txn`), held by the in-process store's
//! reader (the MongoDB store's reader applies the same pure rule; the fake test server has no
//! transactions, see `integration_transactions_need_a_real_server`).

use std::path::PathBuf;

mod support;

use bson::{doc, Bson, Document, Timestamp};
use counterd::core::cost::ReadLimit;
use counterd::core::event::{ChangeEvent, Operation};
use counterd::core::txn::{inner_boundaries, may_end_between, TxnKey};
use counterd::store::memory::{Cursor, Memory, OplogTxn};
use counterd::store::{StreamOptions, StreamStart};

fn fixture(name: &str) -> Document {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/events")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    match Bson::try_from(json).unwrap() {
        Bson::Document(d) => d,
        other => panic!("{other:?}"),
    }
}

const TXN: [&str; 3] = ["txn_1_insert", "txn_2_soft_delete", "txn_3_move"];

fn txn_events() -> Vec<ChangeEvent> {
    TXN.iter()
        .map(|n| ChangeEvent::parse(&fixture(n)).unwrap())
        .collect()
}

#[test]
fn a_real_transactions_events_share_lsid_txn_number_and_cluster_time() {
    let raw: Vec<Document> = TXN.iter().map(|n| fixture(n)).collect();
    for doc in &raw {
        // The shapes a real server sends: lsid {id: UUID, uid: 32 bytes}, txnNumber a long.
        let lsid = doc.get_document("lsid").unwrap();
        let id = lsid.get_binary_generic("id").err();
        assert!(id.is_some(), "lsid.id is a UUID (subtype 4), not generic");
        match lsid.get("id") {
            Some(Bson::Binary(b)) => {
                assert_eq!(b.subtype, bson::spec::BinarySubtype::Uuid);
                assert_eq!(b.bytes.len(), 16);
            }
            other => panic!("lsid.id: {other:?}"),
        }
        assert_eq!(lsid.get_binary_generic("uid").unwrap().len(), 32);
        assert_eq!(doc.get("txnNumber"), Some(&Bson::Int64(7)));
    }
    let events = txn_events();
    let key = events[0].txn.clone().expect("a transaction's event");
    assert_eq!(key.number, 7);
    for e in &events {
        assert_eq!(e.txn.as_ref(), Some(&key));
        assert_eq!(
            e.cluster_time,
            Some(Timestamp {
                time: 1_767_600_100,
                increment: 1
            }),
            "one cluster time for the whole transaction"
        );
    }
    // Distinct tokens, in the transaction's order (its txnOpIndex is part of the token).
    assert!(events[0].token < events[1].token && events[1].token < events[2].token);
    // The three events parse as any others: an insert and two updates with descriptions.
    assert_eq!(events[0].operation, Operation::Insert);
    assert!(matches!(
        events[1].operation,
        Operation::Update { summary: Some(_) }
    ));
    assert!(matches!(
        events[2].operation,
        Operation::Update { summary: Some(_) }
    ));
}

#[test]
fn events_outside_a_transaction_carry_none() {
    for name in ["insert_live", "soft_delete", "move_post", "fake/insert"] {
        let e = ChangeEvent::parse(&fixture(name)).unwrap();
        assert_eq!(e.txn, None, "{name}");
    }
}

#[test]
fn no_batch_may_end_inside_the_real_transaction() {
    let mut events = vec![ChangeEvent::parse(&fixture("insert_live")).unwrap()];
    events.extend(txn_events());
    events.push(ChangeEvent::parse(&fixture("soft_delete")).unwrap());
    let txns: Vec<Option<&TxnKey>> = events.iter().map(|e| e.txn.as_ref()).collect();
    // Free before the transaction and after it; never between its events.
    assert_eq!(inner_boundaries(&txns), [2, 3]);
    assert!(may_end_between(txns[0], txns[1]));
    assert!(may_end_between(txns[3], txns[4]));
}

#[test]
fn the_stream_projection_keeps_the_transaction() {
    let stage = counterd::core::schema::Schema::default().stream_projection();
    let spec = stage.get_document("$project").unwrap();
    assert_eq!(spec.get("lsid"), Some(&Bson::Int32(1)));
    assert_eq!(spec.get("txnNumber"), Some(&Bson::Int32(1)));
}

// ---------------------------------------------------------------------------------------------
// The in-process store's reader

/// An oplog: one plain insert, a transaction of `txn_len` inserts, one plain insert.
fn oplog_with_a_transaction(txn_len: i64) -> Memory {
    let mut m = Memory::new(1_000);
    m.insert_row(doc! {"_id": 1_i64, "post_id": 1_i64});
    m.begin_transaction(OplogTxn {
        session: 9,
        number: 1,
    });
    for id in 0..txn_len {
        m.insert_row(doc! {"_id": 100 + id, "post_id": 2_i64});
    }
    m.commit_transaction();
    m.insert_row(doc! {"_id": 2_i64, "post_id": 1_i64});
    m
}

fn cursor(m: &Memory) -> Cursor {
    m.open_cursor(&StreamOptions {
        start: StreamStart::AtTime(Timestamp {
            time: 0,
            increment: 0,
        }),
        pre_images: false,
        pipeline: Vec::new(),
        max_await: std::time::Duration::from_millis(1),
    })
    .unwrap()
}

/// Reads everything with `limit`, returning the number of events of each read.
fn read_all(m: &Memory, limit: ReadLimit, whole: bool) -> Vec<usize> {
    let mut c = cursor(m);
    let mut sizes = Vec::new();
    while m.available(&c) > 0 {
        let n = m.read_events_cut(&mut c, limit, whole).events.len();
        assert!(n > 0, "a read made no progress");
        sizes.push(n);
    }
    sizes
}

#[test]
fn the_in_process_oplog_renders_a_transaction_like_a_server() {
    let m = oplog_with_a_transaction(3);
    let mut c = cursor(&m);
    let batch = m.read_events(&mut c, ReadLimit::events(10));
    let events: Vec<ChangeEvent> = batch.events.into_iter().map(Result::unwrap).collect();
    assert_eq!(events.len(), 5);
    assert_eq!(events[0].txn, None);
    assert_eq!(events[4].txn, None);
    let key = events[1].txn.clone().unwrap();
    assert!(events[1..4].iter().all(|e| e.txn.as_ref() == Some(&key)));
    let times: Vec<_> = events.iter().map(|e| e.cluster_time.unwrap()).collect();
    assert!(times[1] == times[2] && times[2] == times[3]);
    assert!(times[0] < times[1] && times[3] < times[4]);
}

#[test]
fn a_read_by_count_never_ends_inside_a_transaction() {
    let m = oplog_with_a_transaction(3);
    for n in 1..=6 {
        let sizes = read_all(&m, ReadLimit::events(n), true);
        // Every read ends at an event that may end a batch: the boundaries inside the
        // transaction (after events 2 and 3 of the five) are never read ends.
        let mut end = 0;
        for size in &sizes {
            end += size;
            assert!(![2, 3].contains(&end), "limit {n}: reads {sizes:?}");
        }
        assert_eq!(end, 5);
    }
    // The limit of one event takes the transaction whole (three events over the limit).
    assert_eq!(read_all(&m, ReadLimit::events(1), true), [1, 3, 1]);
    // The broken reader cuts wherever the limit falls.
    assert_eq!(read_all(&m, ReadLimit::events(1), false), [1, 1, 1, 1, 1]);
}

#[test]
fn a_read_by_bytes_takes_a_transaction_larger_than_its_limit_whole() {
    let m = oplog_with_a_transaction(4);
    let one = {
        let mut c = cursor(&m);
        m.read_events(&mut c, ReadLimit::events(1)).costs[0]
    };
    // Room for about two events: the read that starts the transaction within its limit
    // finishes it beyond the limit.
    let two = ReadLimit {
        events: 100,
        bytes: one * 2 + one / 2,
        at_least_one: true,
    };
    assert_eq!(read_all(&m, two, true), [5, 1]);
    // Room for one and a half: the first read ends before the transaction, the next one
    // (which holds nothing, so it always gets one event) takes all four.
    let one_and_a_half = ReadLimit {
        bytes: one + one / 2,
        ..two
    };
    assert_eq!(read_all(&m, one_and_a_half, true), [1, 4, 1]);
    assert_eq!(read_all(&m, one_and_a_half, false), [1, 1, 1, 1, 1, 1]);
    // Its charge is over the limit: the worker overdraws the budget by the excess
    // (`Grant::merge` of an overdraw), as for one oversized event.
}

/// Against the test database: a transaction of three inserts, read one event at a time, comes
/// back in one read. The fake test server (mongo-java-server) has no multi-document
/// transactions: there the test is skipped with its reason (the shapes are covered by the
/// fixtures above, the rule by the in-process reader and `counterd::core::txn`'s unit tests).
#[tokio::test]
async fn a_real_transaction_is_read_whole() {
    use counterd::store::prelude::*;
    let db = support::TestDb::new("txn_read_whole").await;
    let mut source = db
        .store
        .open_stream(StreamOptions {
            start: StreamStart::Now,
            pre_images: false,
            pipeline: Vec::new(),
            max_await: std::time::Duration::from_millis(200),
        })
        .await
        .unwrap();
    let client = db.db.client().clone();
    let written = async {
        let mut session = client.start_session().await?;
        session.start_transaction().await?;
        for id in 0..3_i64 {
            db.comments
                .insert_one(doc! {"_id": id, "post_id": 1_i64, "body": "in a transaction"})
                .session(&mut session)
                .await?;
        }
        session.commit_transaction().await
    }
    .await;
    if let Err(e) = written {
        support::skip(
            "a_real_transaction_is_read_whole",
            &format!("the test server refused a multi-document transaction ({e}); the fake test server has none"),
        );
        return;
    }
    let mut reads = Vec::new();
    let mut events = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while events.len() < 3 {
        assert!(std::time::Instant::now() < deadline, "read {events:?}");
        let batch = source
            .read(ReadLimit::events(1), std::time::Duration::from_millis(200))
            .await
            .unwrap();
        if !batch.events.is_empty() {
            reads.push(batch.events.len());
        }
        events.extend(batch.events);
    }
    if events.iter().all(|e| e.as_ref().unwrap().txn.is_none()) {
        support::skip(
            "a_real_transaction_is_read_whole",
            "the test server accepted the transaction but its events carry no lsid/txnNumber (no real transactions)",
        );
        return;
    }
    assert_eq!(
        reads,
        [3],
        "one read, over its limit of one event, took the transaction whole"
    );
}
