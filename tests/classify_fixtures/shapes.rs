//! The fixtures themselves: every file is listed and parses, the real ones have MongoDB 6/7's
//! shape and token order, and the parser reads both servers' shapes.

use bson::{doc, Timestamp};
use counterd::core::event::{ChangeEvent, Operation, Token, UpdateSummary};

use crate::{dt, event, fixture, fixtures_dir, int_key, oid_key, C1};

pub const REAL: &[&str] = &[
    "drop",
    "drop_database",
    "hard_delete_pre_image_expired",
    "hard_delete_sharded",
    "hard_delete_with_pre_image",
    "hard_delete_without_pre_image",
    "insert_live",
    "insert_missing_post_id",
    "insert_post_id_double",
    "insert_post_id_wrong_type",
    "insert_soft_deleted",
    "invalidate",
    "move_post",
    "move_post_with_pre_image",
    "rename",
    "replace",
    "replace_move",
    "replace_unposted_with_pre_image",
    "restamp_deleted_at",
    "soft_delete",
    "txn_1_insert",
    "txn_2_soft_delete",
    "txn_3_move",
    "undelete",
    "unknown_operation",
    "unknown_operation_future_op",
    "update_body_only",
    "update_lookup_null",
    "update_no_update_description_lookup",
    "update_pre_image_expired",
    "update_set_post_id_pre_image_expired",
    "update_unposted_pre_image_expired",
    "update_unset_post_id",
    "update_with_pre_image",
];

pub const FAKE: &[&str] = &[
    "fake/delete",
    "fake/drop",
    "fake/insert",
    "fake/replace",
    "fake/replace_row_gone",
    "fake/update_set_deleted_at",
    "fake/update_set_deleted_at_row_gone",
    "fake/update_set_post_id",
    "fake/update_unset_deleted_at",
    "fake/update_unset_deleted_at_row_gone",
];

pub fn json_files(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures_dir().join(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .map(|n| {
            let stem = n.trim_end_matches(".json");
            if dir.is_empty() {
                stem.to_string()
            } else {
                format!("{dir}/{stem}")
            }
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_fixture_is_listed_and_parses() {
    assert_eq!(json_files(""), REAL, "fixtures/events/ and REAL differ");
    assert_eq!(
        json_files("fake"),
        FAKE,
        "fixtures/events/fake/ and FAKE differ"
    );
    for name in REAL.iter().chain(FAKE) {
        let ev = event(name);
        assert!(!ev.token.as_str().is_empty(), "{name}");
        assert!(ev.cluster_time.is_some(), "{name} has no clusterTime");
    }
}

#[test]
fn real_fixtures_have_the_shape_of_mongodb_6_and_7() {
    for name in REAL {
        let doc = fixture(name);
        let data = doc.get_document("_id").unwrap().get_str("_data").unwrap();
        assert!(
            data.starts_with("82") && data.chars().all(|c| c.is_ascii_hexdigit()),
            "{name}: token {data}"
        );
        assert!(doc.get_datetime("wallTime").is_ok(), "{name}: wallTime");
        let op = doc.get_str("operationType").unwrap();
        if op != "invalidate" {
            assert_eq!(
                doc.get_document("ns").unwrap().get_str("db").unwrap(),
                "app",
                "{name}"
            );
        }
        if matches!(op, "insert" | "update" | "replace" | "delete") {
            let key = doc.get_document("documentKey").unwrap();
            assert!(key.get_object_id("_id").is_ok(), "{name}: documentKey");
        }
        if op == "update" && *name != "update_no_update_description_lookup" {
            let desc = doc.get_document("updateDescription").unwrap();
            assert!(desc.get_document("updatedFields").is_ok(), "{name}");
            assert!(desc.get_array("removedFields").is_ok(), "{name}");
            assert!(desc.get_array("truncatedArrays").is_ok(), "{name}");
        }
    }
}

#[test]
fn real_tokens_sort_in_cluster_time_order() {
    let mut events: Vec<ChangeEvent> = REAL.iter().map(|n| event(n)).collect();
    events.sort_by_key(|e| {
        let t = e.cluster_time.unwrap();
        (t.time, t.increment)
    });
    let tokens: Vec<&Token> = events.iter().map(|e| &e.token).collect();
    let mut sorted = tokens.clone();
    sorted.sort();
    assert_eq!(tokens, sorted);
    assert!(tokens.iter().all(|t| **t > Token::origin()));
}

#[test]
fn parse_reads_the_real_shapes() {
    let ev = event("insert_live");
    assert_eq!(ev.operation, Operation::Insert);
    assert_eq!(ev.comment.as_ref().unwrap().key, oid_key(C1));
    assert_eq!(
        ev.cluster_time,
        Some(Timestamp {
            time: 1767600001,
            increment: 1
        })
    );
    assert!(ev.pre_image.is_none());

    let ev = event("soft_delete");
    assert_eq!(
        ev.operation,
        Operation::Update {
            summary: Some(UpdateSummary {
                set: doc! {"deleted_at": dt("2026-01-05T07:59:59.500Z")},
                removed: vec![],
                complete: true,
            })
        }
    );
    let ev = event("undelete");
    assert_eq!(
        ev.operation,
        Operation::Update {
            summary: Some(UpdateSummary {
                set: doc! {},
                removed: vec!["deleted_at".to_string()],
                complete: true,
            })
        }
    );
    let ev = event("update_no_update_description_lookup");
    assert_eq!(ev.operation, Operation::Update { summary: None });
    assert_eq!(ev.comment.as_ref().unwrap().key, oid_key(C1));

    let ev = event("update_lookup_null");
    assert!(ev.full_document.is_none());
    assert_eq!(ev.comment.as_ref().unwrap().key, oid_key(C1));

    assert!(event("update_with_pre_image").pre_image.is_some());
    assert!(event("update_pre_image_expired").pre_image.is_none());
    assert!(event("hard_delete_pre_image_expired").pre_image.is_none());
    assert_eq!(event("replace").operation, Operation::Replace);
    assert_eq!(event("hard_delete_sharded").operation, Operation::Delete);
    assert_eq!(
        event("hard_delete_sharded").document_key.get_str("post_id"),
        Ok("post-1")
    );
    assert_eq!(
        event("unknown_operation").operation,
        Operation::Unknown("createIndexes".into())
    );
    assert!(event("unknown_operation").comment.is_none());
    assert_eq!(
        event("unknown_operation_future_op").operation,
        Operation::Unknown("futureOp".into())
    );
    for (name, op) in [
        ("drop", "drop"),
        ("rename", "rename"),
        ("invalidate", "invalidate"),
        ("drop_database", "dropDatabase"),
    ] {
        let ev = event(name);
        assert_eq!(ev.operation, Operation::End(op.into()), "{name}");
        assert!(ev.comment.is_none(), "{name}");
    }
}

#[test]
fn parse_reads_the_fake_servers_shapes() {
    let ev = event("fake/insert");
    assert_eq!(ev.token, Token("6b10333300000001".into()));
    assert_eq!(ev.comment.as_ref().unwrap().key, int_key(1));

    // Update spec in documentKey, the comment named by the looked-up row.
    let ev = event("fake/update_set_deleted_at");
    assert_eq!(ev.comment.as_ref().unwrap().key, int_key(1));
    assert_eq!(
        ev.operation,
        Operation::Update {
            summary: Some(UpdateSummary {
                set: doc! {"deleted_at": dt("2026-12-01T12:05:00Z")},
                removed: vec![],
                complete: false,
            })
        }
    );
    let ev = event("fake/update_unset_deleted_at");
    assert_eq!(
        ev.operation,
        Operation::Update {
            summary: Some(UpdateSummary {
                set: doc! {},
                removed: vec!["deleted_at".into()],
                complete: false,
            })
        }
    );
    // Row gone before the lookup: a fragment without _id, no comment.
    for name in [
        "fake/update_set_deleted_at_row_gone",
        "fake/update_unset_deleted_at_row_gone",
    ] {
        let ev = event(name);
        assert!(ev.comment.is_none(), "{name}");
        assert!(matches!(
            ev.operation,
            Operation::Update { summary: Some(_) }
        ));
    }
    // A replace reported as an update: the replacement in documentKey, no update spec.
    for name in ["fake/replace", "fake/replace_row_gone"] {
        let ev = event(name);
        assert_eq!(ev.operation, Operation::Update { summary: None }, "{name}");
        assert_eq!(ev.comment.as_ref().unwrap().key, int_key(1), "{name}");
    }
    let ev = event("fake/delete");
    assert_eq!(ev.operation, Operation::Delete);
    assert!(ev.full_document.is_none());
    assert_eq!(ev.comment.as_ref().unwrap().key, int_key(1));
    assert_eq!(event("fake/drop").operation, Operation::End("drop".into()));
}

#[test]
fn events_without_a_document_key_are_refused() {
    let mut doc = fixture("hard_delete_without_pre_image");
    doc.remove("documentKey");
    let err = ChangeEvent::parse(&doc).unwrap_err();
    assert!(err.to_string().contains("documentKey"), "{err}");
    let mut doc = fixture("insert_live");
    doc.remove("_id");
    assert!(ChangeEvent::parse(&doc).is_err());
    let mut doc = fixture("insert_live");
    doc.remove("operationType");
    assert!(ChangeEvent::parse(&doc).is_err());
}
