//! Update events without `updateLookup` (`fixtures/events/no_lookup/`: MongoDB 6/7's shapes
//! without `fullDocument`, and the fake test server's, whose update names its row beside its
//! update spec in `documentKey` and carries a fragment of the update as `fullDocument`), the
//! rows a batch reads for them ([`counterd::core::lookup`]) and what they classify to: the same as
//! with the lookup wherever the lookup showed the row the batched read shows.

use std::collections::HashMap;
use std::path::PathBuf;

use bson::{doc, Bson, DateTime, Document};
use counterd::core::batch::plan_batch;
use counterd::core::classify::{classify, Attribution, Before, Classification};
use counterd::core::event::{ChangeEvent, CommentId, LedgerView, Operation, Row};
use counterd::core::key::GroupValue;
use counterd::core::lookup::{attach, rows_to_read};
use counterd::core::schema::Schema;

fn load(path: &str) -> Document {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/events/{path}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    match Bson::try_from(json).unwrap() {
        Bson::Document(d) => d,
        other => panic!("{other:?}"),
    }
}

fn event(path: &str) -> ChangeEvent {
    ChangeEvent::parse(&load(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn row(post: &str, created: &str, deleted: bool) -> Row {
    let mut doc = doc! {"_id": 0, "post_id": post, "created_at": DateTime::parse_rfc3339_str(created).unwrap()};
    if deleted {
        doc.insert("deleted_at", DateTime::now());
    }
    Schema::default().read_existing_row(&doc)
}

fn classified(event: &ChangeEvent, before: Option<Row>) -> Classification {
    classify(
        event,
        Before::Known(before),
        Attribution::Auto,
        &Schema::default(),
    )
    .unwrap()
}

/// The row the with-lookup fixture's server looked up.
fn looked_up(path: &str) -> Document {
    load(path).get_document("fullDocument").unwrap().clone()
}

/// `rows_to_read` over one event, against a ledger holding `before` for its comment (or no
/// entry).
fn wanted(event: &ChangeEvent, before: Option<Row>) -> Vec<CommentId> {
    let comment = event.comment.clone().expect("the event names its row");
    let ledger: LedgerView = before.map(|r| (comment.key, Some(r))).into_iter().collect();
    rows_to_read(
        std::slice::from_ref(event),
        &ledger,
        Attribution::Auto,
        &Schema::default(),
    )
}

const C1_CREATED: &str = "2026-01-02T10:15:30.123Z";

#[test]
fn real_update_events_without_the_row_parse_and_name_it() {
    for name in ["soft_delete", "move_post", "undelete", "update_body_only"] {
        let ev = event(&format!("no_lookup/{name}"));
        assert!(ev.full_document.is_none(), "{name}");
        assert!(ev.comment.is_some(), "{name}: documentKey names the row");
        match &ev.operation {
            Operation::Update { summary: Some(s) } => assert!(s.complete, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn a_known_row_is_derived_and_not_read() {
    let before = row("post-1", C1_CREATED, false);
    for name in ["soft_delete", "move_post", "update_body_only"] {
        let ev = event(&format!("no_lookup/{name}"));
        assert_eq!(wanted(&ev, Some(before.clone())), vec![], "{name}");
        // Derived exactly as with the lookup (the ledger row and the description decide).
        assert_eq!(
            classified(&ev, Some(before.clone())),
            classified(&event(name), Some(before.clone())),
            "{name}"
        );
    }
}

#[test]
fn an_unknown_row_is_read_and_classifies_as_with_the_lookup() {
    for name in ["soft_delete", "move_post", "undelete"] {
        let mut ev = event(&format!("no_lookup/{name}"));
        let want = wanted(&ev, None);
        assert_eq!(want, vec![ev.comment.clone().unwrap()], "{name}");
        let with_lookup = event(name);
        let rows: HashMap<String, Document> = [(want[0].key.clone(), looked_up(name))].into();
        attach(std::slice::from_mut(&mut ev), &want, &rows);
        assert_eq!(ev.full_document, with_lookup.full_document, "{name}");
        let ledger = Before::Unknown;
        let schema = Schema::default();
        assert_eq!(
            classify(&ev, ledger.clone(), Attribution::Auto, &schema),
            classify(&with_lookup, ledger, Attribution::Auto, &schema),
            "{name}"
        );
    }
}

#[test]
fn a_row_gone_before_the_read_leaves_the_state_to_the_delete_that_follows() {
    let mut ev = event("no_lookup/soft_delete");
    let want = wanted(&ev, None);
    attach(std::slice::from_mut(&mut ev), &want, &HashMap::new());
    assert!(ev.full_document.is_none());
    let c = classify(
        &ev,
        Before::Unknown,
        Attribution::Ledger,
        &Schema::default(),
    )
    .unwrap();
    assert!(c.deltas.is_empty(), "{c:?}");
}

#[test]
fn the_fake_servers_updates_name_their_row_and_are_read() {
    for name in [
        "update_set_deleted_at",
        "update_set_post_id",
        "update_unset_deleted_at",
    ] {
        let mut ev = event(&format!("no_lookup/fake_{name}"));
        assert_eq!(ev.comment, Some(CommentId::new(Bson::Int32(1))), "{name}");
        // The fragment is no row: without `_id` it says nothing of the row's state.
        assert!(!ev.full_document.as_ref().unwrap().contains_key("_id"));
        // Its spec is not complete (it may hold operators counterd does not read): read.
        let before = row(
            "p1",
            "2026-12-01T12:00:00Z",
            name == "update_unset_deleted_at",
        );
        let want = wanted(&ev, Some(before.clone()));
        assert_eq!(want.len(), 1, "{name}");
        let with_lookup = event(&format!("fake/{name}"));
        let rows: HashMap<String, Document> =
            [(want[0].key.clone(), looked_up(&format!("fake/{name}")))].into();
        attach(std::slice::from_mut(&mut ev), &want, &rows);
        assert_eq!(
            classified(&ev, Some(before.clone())),
            classified(&with_lookup, Some(before)),
            "{name}"
        );
    }
}

#[test]
fn a_row_inserted_earlier_in_the_batch_is_derived_from_the_insert() {
    let insert = event("insert_live");
    let soft_delete = event("no_lookup/soft_delete");
    assert_eq!(insert.comment, soft_delete.comment);
    let batch = vec![insert, soft_delete];
    let schema = Schema::default();
    let want = rows_to_read(&batch, &LedgerView::default(), Attribution::Auto, &schema);
    assert_eq!(
        want,
        vec![],
        "the insert's row and the description give the state"
    );
    let (plan, _) = plan_batch(
        &batch,
        &LedgerView::default(),
        Attribution::Auto,
        &schema,
        60,
    );
    let net: i64 = plan.counters.iter().map(|c| c.delta.as_i64()).sum();
    assert_eq!(net, 0, "inserted and soft-deleted: {plan:?}");
    let gone = plan.ledger.last().unwrap().state.as_ref().unwrap();
    assert!(!gone.is_live());
    assert_eq!(gone.group(), Some(&GroupValue::Str("post-1".into())));
}

#[test]
fn without_the_ledger_every_update_is_read() {
    let batch = vec![event("insert_live"), event("no_lookup/soft_delete")];
    for attribution in [Attribution::BestEffort, Attribution::PreImage] {
        let want = rows_to_read(
            &batch,
            &LedgerView::default(),
            attribution,
            &Schema::default(),
        );
        assert_eq!(want.len(), 1, "{attribution:?}");
    }
}

#[test]
fn every_update_of_a_comment_read_gets_the_row_and_a_looked_up_one_keeps_its_own() {
    let first = event("no_lookup/undelete");
    let second = event("no_lookup/soft_delete");
    let looked = event("soft_delete");
    let mut batch = vec![first, second, looked];
    let want = rows_to_read(
        &batch,
        &LedgerView::default(),
        Attribution::Auto,
        &Schema::default(),
    );
    assert_eq!(want.len(), 1, "one read per comment");
    let row = doc! {"_id": 1, "post_id": "elsewhere"};
    let rows: HashMap<String, Document> = [(want[0].key.clone(), row.clone())].into();
    attach(&mut batch, &want, &rows);
    assert_eq!(batch[0].full_document.as_ref(), Some(&row));
    assert_eq!(batch[1].full_document.as_ref(), Some(&row));
    assert_ne!(
        batch[2].full_document.as_ref(),
        Some(&row),
        "a lookup stays"
    );
}
