//! Classification of real-shaped change events, loaded from `fixtures/events/` (MongoDB 6/7,
//! relaxed extended JSON) and `fixtures/events/fake/` (mongo-java-server's own shapes), and
//! batch planning over sequences of such events.
//!
//! Every case asserts the whole [`Classification`]: deltas (post, bucket time, amount), dirty
//! posts, the ledger's after-state, the source of the before-state and the problem reported.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use bson::{doc, oid::ObjectId, Bson, DateTime, Document, Timestamp};
use counterd::core::batch::{bucket_of, plan_batch, BatchPlan, CounterDelta, LedgerUpdate};
use counterd::core::classify::{
    classify, After, Attribution, Before, Classification, Delta, Malformed, Problem, Source,
    StreamEnded, Unattributable,
};
use counterd::core::event::{ChangeEvent, CommentId, Operation, Row, Token, UpdateSummary};
use counterd::core::key::PostId;
use counterd::core::num::Num;
use counterd::core::schema::Schema;

// ---------------------------------------------------------------------------------------------
// Fixture loading

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/events")
}

/// Reads `fixtures/events/<name>.json` (relaxed extended JSON) into a BSON document.
fn fixture(name: &str) -> Document {
    let path = fixtures_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    match Bson::try_from(json) {
        Ok(Bson::Document(doc)) => doc,
        Ok(other) => panic!("{} is not a document: {other:?}", path.display()),
        Err(e) => panic!("{} is not extended JSON: {e}", path.display()),
    }
}

fn event(name: &str) -> ChangeEvent {
    ChangeEvent::parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn parse(doc: &Document) -> ChangeEvent {
    ChangeEvent::parse(doc).unwrap_or_else(|e| panic!("{e}: {doc}"))
}

fn run(name: &str, before: Before, attribution: Attribution) -> Classification {
    classify(&event(name), before, attribution, &Schema::default())
        .unwrap_or_else(|e| panic!("{name} under {attribution:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The data the fixtures describe

const ALL: [Attribution; 4] = [
    Attribution::Auto,
    Attribution::PreImage,
    Attribution::Ledger,
    Attribution::BestEffort,
];
/// Attributions that read the ledger.
const LEDGER_USERS: [Attribution; 2] = [Attribution::Auto, Attribution::Ledger];

/// The comment most real fixtures are about.
const C1: &str = "69579ac2a1b2c3d4e5f60718";
/// The soft-deleted comment of `insert_soft_deleted`.
const C2: &str = "69579b10a1b2c3d4e5f60719";

fn dt(text: &str) -> DateTime {
    DateTime::parse_rfc3339_str(text).unwrap()
}
/// `created_at` of C1.
fn c1() -> Option<DateTime> {
    Some(dt("2026-01-02T10:15:30.123Z"))
}
/// `created_at` of C2.
fn c2() -> Option<DateTime> {
    Some(dt("2026-01-02T10:16:48.456Z"))
}
/// `created_at` of the fake server's comment 1.
fn fc() -> Option<DateTime> {
    Some(dt("2026-12-01T12:00:00Z"))
}

fn post(name: &str) -> PostId {
    PostId::Str(name.to_string())
}
fn live(p: &str, created_at: Option<DateTime>) -> Row {
    Row {
        members: Vec::new(),
        post: Some(post(p)),
        created_at,
        deleted: false,
    }
}
fn dead(p: &str, created_at: Option<DateTime>) -> Row {
    Row {
        members: Vec::new(),
        post: Some(post(p)),
        created_at,
        deleted: true,
    }
}
/// A row that exists without a `post_id`: it does not count, but the ledger knows its fields.
fn unposted(created_at: Option<DateTime>, deleted: bool) -> Row {
    Row {
        members: Vec::new(),
        post: None,
        created_at,
        deleted,
    }
}
fn delta(p: &str, created_at: Option<DateTime>, amount: i64) -> Delta {
    Delta {
        counter: counterd::core::key::CounterIx::DEFAULT,
        post: post(p),
        created_at,
        amount: Num::Int(amount),
    }
}
fn posts(names: &[&str]) -> Vec<PostId> {
    names.iter().map(|n| post(n)).collect()
}
fn oid_key(hex: &str) -> String {
    CommentId::new(Bson::ObjectId(ObjectId::parse_str(hex).unwrap())).key
}
fn int_key(id: i32) -> String {
    CommentId::new(Bson::Int32(id)).key
}

fn outcome(
    deltas: Vec<Delta>,
    dirty: &[&str],
    after: After,
    source: Source,
    problem: Option<Problem>,
) -> Classification {
    Classification {
        deltas,
        dirty: posts(dirty)
            .into_iter()
            .map(|group| counterd::core::key::CounterKey {
                counter: counterd::core::key::CounterIx::DEFAULT,
                group,
            })
            .collect(),
        after,
        source,
        problem,
    }
}

fn unattributable(why: Unattributable) -> Option<Problem> {
    Some(Problem::Unattributable(why))
}
fn bad(how: Malformed) -> Option<Problem> {
    Some(Problem::Bad(how))
}
fn unsupported_post_type(kind: &str) -> Malformed {
    Malformed::UnsupportedPostType {
        field: "post_id".into(),
        kind: kind.into(),
    }
}

const DELETE_UNATTRIBUTABLE: Unattributable = Unattributable::DeleteOfUnknownRow;
const UPDATE_UNATTRIBUTABLE: Unattributable = Unattributable::UpdateWithoutPost;
const MOVE_UNATTRIBUTABLE: Unattributable = Unattributable::MoveFromUnknownPost;

// ---------------------------------------------------------------------------------------------
// The fixtures themselves

const REAL: &[&str] = &[
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

const FAKE: &[&str] = &[
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

fn json_files(dir: &str) -> Vec<String> {
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

// ---------------------------------------------------------------------------------------------
// Inserts

#[test]
fn insert_live_counts_whatever_the_ledger_says() {
    for attribution in ALL {
        for before in [
            Before::Unknown,
            Before::Known(None),
            Before::Known(Some(live("post-1", c1()))),
            Before::Known(Some(dead("post-9", None))),
        ] {
            assert_eq!(
                run("insert_live", before.clone(), attribution),
                outcome(
                    vec![delta("post-1", c1(), 1)],
                    &["post-1"],
                    After::Known(Some(live("post-1", c1()))),
                    Source::Insert,
                    None,
                ),
                "{attribution:?} {before:?}"
            );
        }
    }
}

#[test]
fn insert_soft_deleted_counts_nothing_but_dirties() {
    for attribution in ALL {
        assert_eq!(
            run("insert_soft_deleted", Before::Unknown, attribution),
            outcome(
                vec![],
                &["post-1"],
                After::Known(Some(dead("post-1", c2()))),
                Source::Insert,
                None,
            )
        );
    }
    assert_eq!(
        event("insert_soft_deleted").comment.unwrap().key,
        oid_key(C2)
    );
}

#[test]
fn insert_with_bad_post_id_is_reported_not_counted() {
    for attribution in ALL {
        for (name, problem) in [
            (
                "insert_missing_post_id",
                Malformed::NoPost {
                    field: "post_id".into(),
                },
            ),
            ("insert_post_id_wrong_type", unsupported_post_type("Array")),
            ("insert_post_id_double", unsupported_post_type("Double")),
        ] {
            // The row exists but does not count: the ledger knows it, so a later fix of its
            // post id is counted exactly.
            let row = Row {
                members: Vec::new(),
                post: None,
                created_at: c1(),
                deleted: false,
            };
            assert_eq!(
                run(name, Before::Unknown, attribution),
                outcome(
                    vec![],
                    &[],
                    After::Known(Some(row)),
                    Source::Insert,
                    bad(problem)
                ),
                "{name} {attribution:?}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Updates

#[test]
fn soft_delete_from_the_ledger() {
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "soft_delete",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
        // Replayed: the ledger already holds the deleted state.
        assert_eq!(
            run(
                "soft_delete",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
        // Ledger says the row did not count before (no row): nothing to subtract.
        assert_eq!(
            run("soft_delete", Before::Known(None), attribution),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
}

#[test]
fn soft_delete_best_effort() {
    let expected = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        After::Known(Some(dead("post-1", c1()))),
        Source::BestEffort,
        None,
    );
    // No ledger entry, or the ledger is not to be used.
    for (before, attribution) in [
        (Before::Unknown, Attribution::Auto),
        (Before::Unknown, Attribution::Ledger),
        (
            Before::Known(Some(live("post-1", c1()))),
            Attribution::PreImage,
        ),
        (
            Before::Known(Some(dead("post-1", c1()))),
            Attribution::BestEffort,
        ),
    ] {
        assert_eq!(
            run("soft_delete", before, attribution),
            expected,
            "{attribution:?}"
        );
    }
}

#[test]
fn undelete() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "undelete",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), 1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    assert_eq!(
        run("undelete", Before::Unknown, Attribution::Auto),
        outcome(
            vec![delta("post-1", c1(), 1)],
            &["post-1"],
            after,
            Source::BestEffort,
            None
        )
    );
}

#[test]
fn restamp_deleted_at() {
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "restamp_deleted_at",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
    // Best effort guesses a delete of a live row: a documented drift source (the post is dirty,
    // the reconciler corrects it).
    assert_eq!(
        run(
            "restamp_deleted_at",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(
            vec![delta("post-1", c1(), -1)],
            &["post-1"],
            after,
            Source::BestEffort,
            None
        )
    );
}

#[test]
fn move_post() {
    let after = After::Known(Some(live("post-2", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "move_post",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1), delta("post-2", c1(), 1)],
                &["post-1", "post-2"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
        // A soft-deleted row moved: counts nowhere before or after, both posts touched.
        assert_eq!(
            run(
                "move_post",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1", "post-2"],
                After::Known(Some(dead("post-2", c1()))),
                Source::Ledger,
                None
            ),
            "the after-state is derived at event time from the update description, not the lookup"
        );
    }
    assert_eq!(
        run("move_post", Before::Unknown, Attribution::Auto),
        outcome(
            vec![delta("post-2", c1(), 1)],
            &["post-2"],
            after,
            Source::BestEffort,
            unattributable(MOVE_UNATTRIBUTABLE)
        )
    );
}

#[test]
fn move_post_with_pre_image() {
    let exact = outcome(
        vec![delta("post-1", c1(), -1), delta("post-2", c1(), 1)],
        &["post-1", "post-2"],
        After::Known(Some(live("post-2", c1()))),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        assert_eq!(
            run("move_post_with_pre_image", Before::Unknown, attribution),
            exact
        );
        // The pre-image wins over a (stale) ledger entry.
        assert_eq!(
            run(
                "move_post_with_pre_image",
                Before::Known(Some(dead("post-3", None))),
                attribution
            ),
            exact
        );
    }
    // Ledger-only attribution ignores the pre-image.
    assert_eq!(
        run(
            "move_post_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Ledger
        ),
        Classification {
            source: Source::Ledger,
            ..exact
        }
    );
}

#[test]
fn update_body_only_changes_nothing() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_body_only",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
    assert_eq!(
        run("update_body_only", Before::Unknown, Attribution::BestEffort),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn update_unset_post_id_best_effort_is_unattributable() {
    assert_eq!(
        run(
            "update_unset_post_id",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(
            vec![],
            &[],
            After::Known(Some(unposted(c1(), false))),
            Source::BestEffort,
            unattributable(UPDATE_UNATTRIBUTABLE)
        )
    );
}

/// The row loses its `post_id`: it stopped counting, but it still exists, and the ledger keeps
/// its other fields (a later update that gives it a post back is then derived exactly).
#[test]
fn update_unset_post_id_from_the_ledger() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_unset_post_id",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(Some(unposted(c1(), false))),
                Source::Ledger,
                None
            )
        );
    }
}

/// A row the ledger knows without a post, updated while its pre-image has expired: the
/// after-state is derived from the ledger's fields and the update description at event time,
/// never taken from the later `updateLookup` document (which here shows the row back on
/// post-2, live, or soft-deleted again).
#[test]
fn update_of_an_unposted_row_without_pre_image_is_derived_from_the_ledger() {
    for attribution in LEDGER_USERS {
        // A soft delete: still not counted.
        assert_eq!(
            run(
                "update_unposted_pre_image_expired",
                Before::Known(Some(unposted(c1(), false))),
                attribution
            ),
            outcome(
                vec![],
                &[],
                After::Known(Some(unposted(c1(), true))),
                Source::Ledger,
                None
            )
        );
        // It gets a post: counted there, under its own creation time.
        assert_eq!(
            run(
                "update_set_post_id_pre_image_expired",
                Before::Known(Some(unposted(c1(), false))),
                attribution
            ),
            outcome(
                vec![delta("post-2", c1(), 1)],
                &["post-2"],
                After::Known(Some(live("post-2", c1()))),
                Source::Ledger,
                None
            )
        );
    }
}

#[test]
fn update_without_update_description() {
    // A server that sends no updateDescription, only the looked-up row.
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_no_update_description_lookup",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    // Best effort: the post is known, the change is not.
    assert_eq!(
        run(
            "update_no_update_description_lookup",
            Before::Unknown,
            Attribution::Auto
        ),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn update_whose_lookup_is_null() {
    // The row was deleted before the lookup, but the update description and a known
    // before-state still give the exact after-state at event time.
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_lookup_null",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(Some(dead("post-1", c1()))),
                Source::Ledger,
                None
            )
        );
        assert_eq!(
            run(
                "update_lookup_null",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1"],
                After::Known(Some(dead("post-1", c1()))),
                Source::Ledger,
                None
            )
        );
        // The ledger says the row does not exist: nothing to derive from, and no lookup.
        assert_eq!(
            run("update_lookup_null", Before::Known(None), attribution),
            outcome(vec![], &[], After::Unchanged, Source::Ledger, None)
        );
    }
    for attribution in ALL {
        assert_eq!(
            run("update_lookup_null", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Unchanged,
                Source::BestEffort,
                unattributable(UPDATE_UNATTRIBUTABLE)
            )
        );
    }
}

#[test]
fn update_with_pre_image() {
    let after = After::Known(Some(dead("post-1", c1())));
    let exact = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        after.clone(),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        for before in [
            Before::Unknown,
            Before::Known(Some(dead("post-1", c1()))),
            Before::Known(None),
        ] {
            assert_eq!(
                run("update_with_pre_image", before, attribution),
                exact,
                "{attribution:?}"
            );
        }
    }
    // Ledger-only: the (here: already applied) ledger entry decides.
    assert_eq!(
        run(
            "update_with_pre_image",
            Before::Known(Some(dead("post-1", c1()))),
            Attribution::Ledger
        ),
        outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
    );
    assert_eq!(
        run(
            "update_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::BestEffort
        ),
        Classification {
            source: Source::BestEffort,
            ..exact
        }
    );
}

#[test]
fn update_whose_pre_image_expired() {
    let after = After::Known(Some(dead("post-1", c1())));
    // Auto falls back to the ledger.
    assert_eq!(
        run(
            "update_pre_image_expired",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Auto
        ),
        outcome(
            vec![delta("post-1", c1(), -1)],
            &["post-1"],
            after.clone(),
            Source::Ledger,
            None
        )
    );
    // Pre-images only: falls back to best effort, ledger or not.
    for before in [Before::Unknown, Before::Known(Some(dead("post-1", c1())))] {
        assert_eq!(
            run("update_pre_image_expired", before, Attribution::PreImage),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::BestEffort,
                None
            )
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Replaces

#[test]
fn replace_in_place() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "replace",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
        // Replacing a soft-deleted row with one without deleted_at revives it.
        assert_eq!(
            run(
                "replace",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), 1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    assert_eq!(
        run("replace", Before::Unknown, Attribution::BestEffort),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn replace_move() {
    let after = After::Known(Some(live("post-2", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "replace_move",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1), delta("post-2", c1(), 1)],
                &["post-1", "post-2"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    // Best effort: only the new post is known; it is dirtied, nothing is counted.
    assert_eq!(
        run("replace_move", Before::Unknown, Attribution::Auto),
        outcome(vec![], &["post-2"], after, Source::BestEffort, None)
    );
}

// ---------------------------------------------------------------------------------------------
// Hard deletes

#[test]
fn hard_delete_with_pre_image() {
    let exact = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        After::Known(None),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        for before in [Before::Unknown, Before::Known(Some(dead("post-1", c1())))] {
            assert_eq!(
                run("hard_delete_with_pre_image", before, attribution),
                exact
            );
        }
    }
    assert_eq!(
        run(
            "hard_delete_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Ledger
        ),
        Classification {
            source: Source::Ledger,
            ..exact
        }
    );
    for attribution in [Attribution::Ledger, Attribution::BestEffort] {
        assert_eq!(
            run("hard_delete_with_pre_image", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Known(None),
                Source::BestEffort,
                unattributable(DELETE_UNATTRIBUTABLE)
            )
        );
    }
}

#[test]
fn hard_delete_from_the_ledger() {
    for name in [
        "hard_delete_without_pre_image",
        "hard_delete_pre_image_expired",
    ] {
        for attribution in LEDGER_USERS {
            assert_eq!(
                run(name, Before::Known(Some(live("post-1", c1()))), attribution),
                outcome(
                    vec![delta("post-1", c1(), -1)],
                    &["post-1"],
                    After::Known(None),
                    Source::Ledger,
                    None
                ),
                "{name}"
            );
            assert_eq!(
                run(name, Before::Known(Some(dead("post-1", c1()))), attribution),
                outcome(
                    vec![],
                    &["post-1"],
                    After::Known(None),
                    Source::Ledger,
                    None
                )
            );
            // Already gone (replay).
            assert_eq!(
                run(name, Before::Known(None), attribution),
                outcome(vec![], &[], After::Known(None), Source::Ledger, None)
            );
        }
        // Nothing known and no shard key.
        for (before, attribution) in [
            (Before::Unknown, Attribution::Auto),
            (Before::Unknown, Attribution::Ledger),
            (
                Before::Known(Some(live("post-1", c1()))),
                Attribution::PreImage,
            ),
            (
                Before::Known(Some(live("post-1", c1()))),
                Attribution::BestEffort,
            ),
        ] {
            assert_eq!(
                run(name, before, attribution),
                outcome(
                    vec![],
                    &[],
                    After::Known(None),
                    Source::BestEffort,
                    unattributable(DELETE_UNATTRIBUTABLE)
                ),
                "{name} {attribution:?}"
            );
        }
    }
}

#[test]
fn hard_delete_sharded_on_post_id() {
    // Best effort: the shard key names the post; the row's bucket is unknown (bucket 0).
    for attribution in ALL {
        assert_eq!(
            run("hard_delete_sharded", Before::Unknown, attribution),
            outcome(
                vec![delta("post-1", None, -1)],
                &["post-1"],
                After::Known(None),
                Source::BestEffort,
                None
            )
        );
    }
    // The ledger is exact: a soft-deleted row's hard delete changes no count.
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "hard_delete_sharded",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
        assert_eq!(
            run(
                "hard_delete_sharded",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Unknown and stream-ending operations

#[test]
fn unknown_operations_are_reported() {
    for attribution in ALL {
        assert_eq!(
            run("unknown_operation", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Unchanged,
                Source::BestEffort,
                bad(Malformed::UnknownOperation("createIndexes".into()))
            )
        );
    }
    // A future operation on a known comment dirties its post.
    assert_eq!(
        run(
            "unknown_operation_future_op",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Auto
        ),
        outcome(
            vec![],
            &["post-1"],
            After::Unchanged,
            Source::Ledger,
            bad(Malformed::UnknownOperation("futureOp".into()))
        )
    );
}

#[test]
fn stream_ending_events_stop_the_stream() {
    for (name, operation) in [
        ("drop", "drop"),
        ("rename", "rename"),
        ("invalidate", "invalidate"),
        ("drop_database", "dropDatabase"),
        ("fake/drop", "drop"),
    ] {
        let ev = event(name);
        for attribution in ALL {
            for before in [
                Before::Unknown,
                Before::Known(None),
                Before::Known(Some(live("post-1", c1()))),
            ] {
                assert_eq!(
                    classify(&ev, before, attribution, &Schema::default()),
                    Err(StreamEnded {
                        token: ev.token.clone(),
                        operation: operation.to_string(),
                        at: ev.cluster_time,
                    }),
                    "{name}"
                );
            }
        }
        let message = classify(&ev, Before::Unknown, Attribution::Auto, &Schema::default())
            .unwrap_err()
            .to_string();
        assert!(message.contains(operation), "{message}");
        if let Some(at) = ev.cluster_time {
            // The recovery names the second after the event to replay from.
            let from = chrono::DateTime::from_timestamp(at.time as i64 + 1, 0)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            assert!(
                message.contains(&format!("counterd replay --from-time {from}")),
                "{message}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fake server's shapes

#[test]
fn fake_insert() {
    for attribution in ALL {
        assert_eq!(
            run("fake/insert", Before::Unknown, attribution),
            outcome(
                vec![delta("p1", fc(), 1)],
                &["p1"],
                After::Known(Some(live("p1", fc()))),
                Source::Insert,
                None
            )
        );
    }
}

#[test]
fn fake_updates_with_the_row_present() {
    let cases = [
        // (fixture, ledger before, deltas, dirty, after row)
        (
            "fake/update_set_deleted_at",
            live("p1", fc()),
            vec![delta("p1", fc(), -1)],
            vec!["p1"],
            dead("p1", fc()),
        ),
        (
            "fake/update_unset_deleted_at",
            dead("p1", fc()),
            vec![delta("p1", fc(), 1)],
            vec!["p1"],
            live("p1", fc()),
        ),
        (
            "fake/update_set_post_id",
            live("p1", fc()),
            vec![delta("p1", fc(), -1), delta("p2", fc(), 1)],
            vec!["p1", "p2"],
            live("p2", fc()),
        ),
        (
            "fake/replace",
            live("p1", fc()),
            vec![delta("p1", fc(), -1), delta("p2", fc(), 1)],
            vec!["p1", "p2"],
            live("p2", fc()),
        ),
    ];
    for (name, before, deltas, dirty, after) in cases {
        for attribution in LEDGER_USERS {
            assert_eq!(
                run(name, Before::Known(Some(before.clone())), attribution),
                outcome(
                    deltas.clone(),
                    &dirty,
                    After::Known(Some(after.clone())),
                    Source::Ledger,
                    None
                ),
                "{name}"
            );
        }
    }
}

#[test]
fn fake_updates_best_effort() {
    let cases = [
        (
            "fake/update_set_deleted_at",
            vec![delta("p1", fc(), -1)],
            vec!["p1"],
            dead("p1", fc()),
            None,
        ),
        (
            "fake/update_unset_deleted_at",
            vec![delta("p1", fc(), 1)],
            vec!["p1"],
            live("p1", fc()),
            None,
        ),
        (
            "fake/update_set_post_id",
            vec![delta("p2", fc(), 1)],
            vec!["p2"],
            live("p2", fc()),
            unattributable(MOVE_UNATTRIBUTABLE),
        ),
        // Replace reported as an update: no spec, only the post.
        ("fake/replace", vec![], vec!["p2"], live("p2", fc()), None),
    ];
    for (name, deltas, dirty, after, problem) in cases {
        assert_eq!(
            run(name, Before::Unknown, Attribution::BestEffort),
            outcome(
                deltas,
                &dirty,
                After::Known(Some(after)),
                Source::BestEffort,
                problem
            ),
            "{name}"
        );
    }
}

#[test]
fn fake_updates_whose_row_is_gone_say_nothing() {
    for name in [
        "fake/update_set_deleted_at_row_gone",
        "fake/update_unset_deleted_at_row_gone",
    ] {
        for attribution in ALL {
            for before in [
                Before::Unknown,
                Before::Known(None),
                Before::Known(Some(live("p1", fc()))),
            ] {
                assert_eq!(
                    run(name, before, attribution),
                    outcome(vec![], &[], After::Unchanged, Source::BestEffort, None),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn fake_replace_whose_row_is_gone() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "fake/replace_row_gone",
                Before::Known(Some(live("p1", fc()))),
                attribution
            ),
            outcome(vec![], &["p1"], After::Unchanged, Source::Ledger, None)
        );
    }
    // Best effort: the replacement in documentKey names the new post.
    assert_eq!(
        run(
            "fake/replace_row_gone",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(vec![], &["p2"], After::Unchanged, Source::BestEffort, None)
    );
}

#[test]
fn fake_delete() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "fake/delete",
                Before::Known(Some(live("p1", fc()))),
                attribution
            ),
            outcome(
                vec![delta("p1", fc(), -1)],
                &["p1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
    }
    assert_eq!(
        run("fake/delete", Before::Unknown, Attribution::Auto),
        outcome(
            vec![],
            &[],
            After::Known(None),
            Source::BestEffort,
            unattributable(DELETE_UNATTRIBUTABLE)
        )
    );
}

// ---------------------------------------------------------------------------------------------
// Batches

const WIDTH: i64 = 60;

/// A fresh resume token for the `n`th event of a made-up sequence, sorting in `n` order.
fn token(n: u32) -> String {
    format!(
        "82{:08X}{:08X}2B042C0100296E5A10043D5F8A1C9B2E4F6A8C7D1E2F3A4B5C6D04",
        0x695B_7000 + n,
        1
    )
}

/// A fixture with a new token and, when given, a new looked-up `fullDocument`.
fn retoken(name: &str, n: u32, full_document: Option<Bson>) -> ChangeEvent {
    let mut doc = fixture(name);
    doc.insert("_id", doc! {"_data": token(n)});
    if let Some(full) = full_document {
        doc.insert("fullDocument", full);
    }
    parse(&doc)
}

fn c1_doc(post_id: &str, deleted: bool) -> Bson {
    let mut d = doc! {
        "_id": ObjectId::parse_str(C1).unwrap(),
        "post_id": post_id,
        "created_at": c1().unwrap(),
        "body": "Great post, thanks!",
    };
    if deleted {
        d.insert("deleted_at", dt("2026-01-05T07:59:59.500Z"));
    }
    Bson::Document(d)
}

fn counter(p: &str, buckets: &[(Option<DateTime>, i64)]) -> CounterDelta {
    let mut map = BTreeMap::new();
    for (created_at, amount) in buckets {
        *map.entry(bucket_of(*created_at, WIDTH)).or_insert(0) += amount;
    }
    let touched = map.keys().copied().collect();
    map.retain(|_, v| *v != 0);
    CounterDelta {
        counter: counterd::core::key::CounterIx::DEFAULT,
        post: post(p),
        delta: Num::Int(buckets.iter().map(|(_, a)| a).sum()),
        buckets: map.into_iter().map(|(k, v)| (k, Num::Int(v))).collect(),
        touched,
        comments: None,
    }
}

/// The writes that change a count (a batch also writes touch-only statements for changes that
/// cancel out; `batch_touches_changes_that_cancel_out` checks those).
fn net(counters: &[CounterDelta]) -> Vec<CounterDelta> {
    counters
        .iter()
        .filter(|c| c.delta != 0 || !c.buckets.is_empty())
        .map(|c| CounterDelta {
            counter: counterd::core::key::CounterIx::DEFAULT,
            // Touches beyond the changed buckets (bucket 0 for hidden states) are checked by
            // `batch_touches_changes_that_cancel_out` and `batch_touches_every_bucket_*`.
            touched: c
                .touched
                .iter()
                .copied()
                .filter(|b| *b != 0 || c.buckets.contains_key(b))
                .collect(),
            // The rows named are checked by `batch_names_the_rows_it_changed_per_post`.
            comments: None,
            ..c.clone()
        })
        .collect()
}

/// The posts a plan marks dirty, in order.
fn dirty_posts(plan: &BatchPlan) -> Vec<PostId> {
    plan.dirty.iter().map(|d| d.post.clone()).collect()
}

fn assert_buckets_sum(counters: &[CounterDelta]) {
    for c in counters {
        assert_eq!(c.buckets.values().sum::<Num>(), c.delta, "{c:?}");
        assert!(c.buckets.values().all(|v| *v != 0), "{c:?}");
    }
}

fn ledger_of(entries: &[(&str, Option<Row>)]) -> HashMap<String, Option<Row>> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// insert → soft delete → undelete → move, each looked up promptly (the fixtures' lookups).
fn lifecycle_prompt() -> Vec<ChangeEvent> {
    vec![
        retoken("insert_live", 1, None),
        retoken("soft_delete", 2, None),
        retoken("undelete", 3, None),
        retoken("move_post", 4, None),
    ]
}

#[test]
fn batch_lifecycle_with_prompt_lookups() {
    let events = lifecycle_prompt();
    for attribution in LEDGER_USERS {
        let (plan, end) = plan_batch(
            &events,
            &HashMap::new(),
            attribution,
            &Schema::default(),
            WIDTH,
        );
        assert!(end.is_none());
        assert_eq!(net(&plan.counters), vec![counter("post-2", &[(c1(), 1)])]);
        assert_eq!(dirty_posts(&plan), posts(&["post-1", "post-2"]));
        assert_eq!(
            plan.ledger,
            vec![LedgerUpdate {
                comment: events[0].comment.clone().unwrap(),
                state: Some(live("post-2", c1())),
            }]
        );
        assert_eq!(plan.events, 4);
        assert!(plan.skipped.is_empty());
        assert_eq!(plan.by_source.get("insert"), Some(&1));
        assert_eq!(plan.by_source.get("ledger"), Some(&3));

        // ... then a hard delete in the same batch: everything telescopes to zero.
        let mut all = events.clone();
        all.push(retoken("hard_delete_without_pre_image", 5, None));
        let (plan, end) = plan_batch(
            &all,
            &HashMap::new(),
            attribution,
            &Schema::default(),
            WIDTH,
        );
        assert!(end.is_none());
        assert_eq!(net(&plan.counters), vec![]);
        assert_eq!(dirty_posts(&plan), posts(&["post-1", "post-2"]));
        assert_eq!(plan.ledger.len(), 1);
        assert_eq!(plan.ledger[0].state, None);
        assert_eq!(plan.events, 5);
        assert!(plan.skipped.is_empty());
    }
}

#[test]
fn batch_touches_changes_that_cancel_out() {
    // insert → soft delete → undelete → move: post-1 nets zero but its row's bucket changed
    // twice; a recount of post-1 that saw the soft delete must not be installed, so the write
    // records the touch. With the hard delete, post-2 nets zero too.
    let mut events = lifecycle_prompt();
    events.push(retoken("hard_delete_without_pre_image", 5, None));
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Ledger,
        &Schema::default(),
        WIDTH,
    );
    let bucket = bucket_of(c1(), WIDTH);
    let touch_only = |p: &str| CounterDelta {
        counter: counterd::core::key::CounterIx::DEFAULT,
        post: post(p),
        delta: Num::ZERO,
        buckets: BTreeMap::new(),
        touched: [bucket].into_iter().collect(),
        comments: None,
    };
    // The hard delete (no pre-image) may follow updates that hid states: post-2 is touched in
    // every bucket (0).
    let mut post_2 = touch_only("post-2");
    post_2.touched.insert(0);
    let unnamed: Vec<CounterDelta> = plan
        .counters
        .iter()
        .map(|c| CounterDelta {
            counter: counterd::core::key::CounterIx::DEFAULT,
            comments: None,
            ..c.clone()
        })
        .collect();
    assert_eq!(unnamed, vec![touch_only("post-1"), post_2]);
    let marks: Vec<(PostId, i64)> = plan
        .dirty
        .iter()
        .map(|d| (d.post.clone(), d.newest_bucket))
        .collect();
    assert_eq!(
        marks,
        vec![(post("post-1"), bucket), (post("post-2"), bucket)]
    );
}

#[test]
fn batch_names_the_rows_it_changed_per_post() {
    // One row's whole life in a batch: both posts it passed through name it once (the counter's
    // log entry a row-level recount settles against, see `counterd::core::window`).
    let events = lifecycle_prompt();
    let row = events[0].comment.clone().unwrap();
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Ledger,
        &Schema::default(),
        WIDTH,
    );
    let named: Vec<(PostId, Option<Vec<String>>)> = plan
        .counters
        .iter()
        .map(|c| {
            let keys = c
                .comments
                .as_ref()
                .map(|l| l.iter().map(|c| c.key.clone()).collect());
            (c.post.clone(), keys)
        })
        .collect();
    assert_eq!(
        named,
        vec![
            (post("post-1"), Some(vec![row.key.clone()])),
            (post("post-2"), Some(vec![row.key.clone()])),
        ]
    );
}

#[test]
fn batch_lifecycle_with_late_lookups() {
    // Read after everything happened: every update's lookup shows the final row, live on post-2.
    let late = Some(c1_doc("post-2", false));
    let events = vec![
        retoken("insert_live", 1, None),
        retoken("soft_delete", 2, late.clone()),
        retoken("undelete", 3, late.clone()),
        retoken("move_post", 4, late),
    ];
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![counter("post-2", &[(c1(), 1)])]);
    assert_eq!(dirty_posts(&plan), posts(&["post-1", "post-2"]));
    assert_eq!(plan.ledger[0].state, Some(live("post-2", c1())));

    // Read after the hard delete too: every lookup is null.
    let events = vec![
        retoken("insert_live", 1, None),
        retoken("soft_delete", 2, Some(Bson::Null)),
        retoken("undelete", 3, Some(Bson::Null)),
        retoken("move_post", 4, Some(Bson::Null)),
        retoken("hard_delete_without_pre_image", 5, None),
    ];
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![]);
    assert_eq!(
        dirty_posts(&plan),
        posts(&["post-1", "post-2"]),
        "derived states still see the move"
    );
    assert_eq!(plan.ledger[0].state, None);
    assert!(plan.skipped.is_empty());
}

#[test]
fn batch_lifecycle_across_batches_with_a_ledger() {
    // The comment existed, live on post-1, before the first batch.
    let mut ledger = ledger_of(&[(&oid_key(C1), Some(live("post-1", c1())))]);
    let batches = [
        vec![retoken("soft_delete", 2, None)],
        vec![
            retoken("undelete", 3, Some(c1_doc("post-2", false))),
            retoken("move_post", 4, None),
        ],
        vec![retoken("hard_delete_without_pre_image", 5, None)],
    ];
    let mut net: BTreeMap<PostId, i64> = BTreeMap::new();
    for batch in &batches {
        let (plan, _) = plan_batch(
            batch,
            &ledger,
            Attribution::Ledger,
            &Schema::default(),
            WIDTH,
        );
        assert_buckets_sum(&plan.counters);
        assert!(plan.skipped.is_empty());
        for c in &plan.counters {
            *net.entry(c.post.clone()).or_default() += c.delta.as_i64();
        }
        for update in plan.ledger {
            ledger.insert(update.comment.key, update.state);
        }
    }
    // Live on post-1 before, gone after.
    assert_eq!(net.get(&post("post-1")), Some(&-1));
    assert_eq!(net.get(&post("post-2")).copied().unwrap_or(0), 0);
    assert_eq!(ledger[&oid_key(C1)], None);
}

/// The bug `with_pre_images` found (`SIM_PRE_IMAGES=1 SIM_SEED=88`): a comment without
/// `post_id`, known to the ledger, is soft-deleted (pre-image expired) and then replaced onto
/// post-2 (pre-image present). The soft delete used to take its after-state from the lookup,
/// which already showed the replacement live on post-2 (+1), and the replace, classified from
/// its own pre-image, counted the same change again (+1). Whatever the batch boundaries, post-2
/// must gain exactly one.
#[test]
fn an_unposted_row_with_an_expired_pre_image_is_counted_once() {
    let events = || -> Vec<ChangeEvent> {
        vec![
            event("update_unposted_pre_image_expired"),
            event("replace_unposted_with_pre_image"),
        ]
    };
    for attribution in LEDGER_USERS {
        for cut in [1, 2] {
            let mut ledger = ledger_of(&[(&oid_key(C1), Some(unposted(c1(), false)))]);
            let events = events();
            let mut net: BTreeMap<PostId, i64> = BTreeMap::new();
            for batch in [&events[..cut], &events[cut..]] {
                let (plan, _) = plan_batch(batch, &ledger, attribution, &Schema::default(), WIDTH);
                assert_buckets_sum(&plan.counters);
                assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
                for c in &plan.counters {
                    *net.entry(c.post.clone()).or_default() += c.delta.as_i64();
                }
                for update in plan.ledger {
                    ledger.insert(update.comment.key, update.state);
                }
            }
            net.retain(|_, d| *d != 0);
            assert_eq!(
                net,
                BTreeMap::from([(post("post-2"), 1)]),
                "{attribution:?}, batches cut after {cut}"
            );
            assert_eq!(ledger[&oid_key(C1)], Some(live("post-2", c1())));
        }
    }
}

#[test]
fn batch_fake_update_of_a_deleted_row_is_settled_by_the_delete() {
    // All in one batch: the update names no comment; the delete finds the insert's state.
    let events: Vec<ChangeEvent> = [
        "fake/insert",
        "fake/update_set_deleted_at_row_gone",
        "fake/delete",
    ]
    .iter()
    .map(|n| event(n))
    .collect();
    let (plan, end) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert!(end.is_none());
    assert_eq!(net(&plan.counters), vec![]);
    assert_eq!(dirty_posts(&plan), posts(&["p1"]));
    assert_eq!(
        plan.ledger,
        vec![LedgerUpdate {
            comment: CommentId::new(Bson::Int32(1)),
            state: None
        }]
    );
    assert!(plan.skipped.is_empty());
    assert_eq!(plan.events, 3);

    // The insert was in an earlier batch: its ledger entry settles the delete.
    let ledger = ledger_of(&[(&int_key(1), Some(live("p1", fc())))]);
    for name in [
        "fake/update_set_deleted_at_row_gone",
        "fake/update_unset_deleted_at_row_gone",
    ] {
        let events = vec![event(name), event("fake/delete")];
        let (plan, _) = plan_batch(
            &events,
            &ledger,
            Attribution::Auto,
            &Schema::default(),
            WIDTH,
        );
        assert_eq!(net(&plan.counters), vec![counter("p1", &[(fc(), -1)])]);
        assert_eq!(dirty_posts(&plan), posts(&["p1"]));
        assert_eq!(plan.ledger.len(), 1);
        assert_eq!(plan.ledger[0].state, None);
        assert!(plan.skipped.is_empty());
    }
    // An already soft-deleted row: its hard delete changes no count.
    let ledger = ledger_of(&[(&int_key(1), Some(dead("p1", fc())))]);
    let events = vec![
        event("fake/update_set_deleted_at_row_gone"),
        event("fake/delete"),
    ];
    let (plan, _) = plan_batch(
        &events,
        &ledger,
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![]);
    assert_eq!(dirty_posts(&plan), posts(&["p1"]));

    // Without a ledger the delete is unattributable, and nothing is counted.
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::BestEffort,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![]);
    assert_eq!(plan.unattributable_events(), 1);
    assert_eq!(plan.bad_events(), 0);
}

#[test]
fn batch_fake_lifecycle_with_the_row_present() {
    // insert p1 → soft delete → undelete → move to p2 → replace (p2) → delete, looked up
    // promptly as the fixtures show.
    let events: Vec<ChangeEvent> = [
        "fake/insert",
        "fake/update_set_deleted_at",
        "fake/update_unset_deleted_at",
        "fake/update_set_post_id",
        "fake/replace",
    ]
    .iter()
    .map(|n| event(n))
    .collect();
    let (plan, _) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![counter("p2", &[(fc(), 1)])]);
    assert_eq!(dirty_posts(&plan), posts(&["p1", "p2"]));
    assert_eq!(plan.ledger[0].state, Some(live("p2", fc())));

    let mut all = events;
    all.push(event("fake/delete"));
    let (plan, _) = plan_batch(
        &all,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(net(&plan.counters), vec![]);
    assert_eq!(plan.ledger[0].state, None);
    assert!(plan.skipped.is_empty());
}

/// A real-shaped event on comment `oid` of `post-hot`.
fn hot_event(kind: &str, n: u32, oid: ObjectId, created_at: DateTime, deleted: bool) -> Document {
    let mut row = doc! {"_id": oid, "post_id": "post-hot", "created_at": created_at, "body": "+1"};
    if deleted {
        row.insert("deleted_at", dt("2026-01-05T09:00:00Z"));
    }
    let mut ev = doc! {
        "_id": {"_data": token(n)},
        "operationType": kind,
        "clusterTime": Timestamp { time: 0x695B_7000 + n, increment: 1 },
        "wallTime": DateTime::from_millis((0x695B_7000 + n as i64) * 1000),
        "ns": {"db": "app", "coll": "comments"},
        "documentKey": {"_id": oid},
    };
    match kind {
        "insert" => {
            ev.insert("fullDocument", row);
        }
        "update" => {
            ev.insert("fullDocument", row);
            ev.insert(
                "updateDescription",
                doc! {
                    "updatedFields": {"deleted_at": dt("2026-01-05T09:00:00Z")},
                    "removedFields": [],
                    "truncatedArrays": [],
                },
            );
        }
        _ => {}
    }
    ev
}

#[test]
fn batch_coalesces_a_hot_post_into_one_counter_delta() {
    let start = dt("2026-01-05T08:00:00Z").timestamp_millis();
    let mut docs = Vec::new();
    let mut n = 0;
    let mut expected: BTreeMap<i64, i64> = BTreeMap::new();
    let mut ledger = HashMap::new();
    let mut comments = Vec::new();
    // 30 comments that existed before the batch (live, in the ledger), created 09:00-09:29.
    for i in 0..30u32 {
        let oid = ObjectId::new();
        let created = DateTime::from_millis(start + 3_600_000 + i as i64 * 60_000);
        ledger.insert(
            CommentId::new(Bson::ObjectId(oid)).key,
            Some(live("post-hot", Some(created))),
        );
        comments.push((oid, created));
    }
    // 200 inserts spread over ten minutes.
    for i in 0..200u32 {
        let oid = ObjectId::new();
        let created = DateTime::from_millis(start + i as i64 * 3_000);
        n += 1;
        docs.push(hot_event("insert", n, oid, created, false));
        *expected.entry(bucket_of(Some(created), WIDTH)).or_default() += 1;
        comments.push((oid, created));
    }
    // Soft-delete every 7th comment, hard delete every 11th (some of them soft-deleted first).
    for (i, (oid, created)) in comments.iter().enumerate() {
        let bucket = bucket_of(Some(*created), WIDTH);
        let mut is_live = true;
        if i % 7 == 0 {
            n += 1;
            docs.push(hot_event("update", n, *oid, *created, true));
            *expected.entry(bucket).or_default() -= 1;
            is_live = false;
        }
        if i % 11 == 0 {
            n += 1;
            docs.push(hot_event("delete", n, *oid, *created, false));
            if is_live {
                *expected.entry(bucket).or_default() -= 1;
            }
        }
    }
    let events: Vec<ChangeEvent> = docs.iter().map(parse).collect();
    let (plan, end) = plan_batch(
        &events,
        &ledger,
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert!(end.is_none());
    assert!(plan.skipped.is_empty());
    assert_eq!(plan.events, events.len());
    assert_eq!(plan.counters.len(), 1, "one write for the hot post");
    let hot = &plan.counters[0];
    assert_eq!(hot.post, post("post-hot"));
    expected.retain(|_, v| *v != 0);
    let expected: BTreeMap<i64, Num> = expected
        .into_iter()
        .map(|(k, v)| (k, Num::Int(v)))
        .collect();
    assert_eq!(hot.buckets, expected);
    assert_eq!(hot.delta, expected.values().sum::<Num>());
    assert_buckets_sum(&plan.counters);
    assert_eq!(dirty_posts(&plan), posts(&["post-hot"]));
    let touched_before = (0..30).filter(|i| i % 7 == 0 || i % 11 == 0).count();
    assert_eq!(plan.ledger.len(), 200 + touched_before);
}

#[test]
fn batch_stops_at_a_stream_end() {
    for end_name in ["drop", "rename", "invalidate", "drop_database", "fake/drop"] {
        let events = vec![
            retoken("insert_live", 1, None),
            event(end_name),
            retoken("insert_soft_deleted", 3, None),
        ];
        let (plan, end) = plan_batch(
            &events,
            &HashMap::new(),
            Attribution::Auto,
            &Schema::default(),
            WIDTH,
        );
        let end = end.expect("the stream ended");
        assert_eq!(end.token, events[1].token);
        assert_eq!(plan.events, 1);
        assert_eq!(net(&plan.counters), vec![counter("post-1", &[(c1(), 1)])]);
        assert_eq!(plan.ledger.len(), 1, "nothing after the end is planned");
        assert_eq!(plan.ledger[0].comment.key, oid_key(C1));
    }
}

#[test]
fn batch_reports_bad_and_unattributable_events() {
    let events = vec![
        retoken("insert_missing_post_id", 1, None),
        retoken("insert_post_id_wrong_type", 2, None),
        retoken("unknown_operation", 3, None),
        retoken("hard_delete_without_pre_image", 4, None),
        retoken("insert_live", 5, None),
    ];
    let (plan, end) = plan_batch(
        &events,
        &HashMap::new(),
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    assert!(end.is_none());
    assert_eq!(plan.events, 5);
    assert_eq!(plan.bad_events(), 3);
    // The malformed inserts of C1 are known as rows that exist without counting, so its hard
    // delete is attributed exactly (nothing to take off).
    assert_eq!(plan.unattributable_events(), 0);
    assert_eq!(
        plan.skipped.iter().map(|s| &s.token).collect::<Vec<_>>(),
        events[..3].iter().map(|e| &e.token).collect::<Vec<_>>()
    );
    // The hard delete of C1 came before its insert in this batch: the insert still counts.
    assert_eq!(net(&plan.counters), vec![counter("post-1", &[(c1(), 1)])]);
}

/// With pre-images on, the before-state of an update is the pre-image (exact, at event time)
/// but its after-state is the `updateLookup` row (at read time, possibly later, or null). A
/// pre-image before-state does not continue the chain of after-states, so the transitions do
/// not telescope: the later part of a comment's history is counted twice, or not at all.
#[test]
fn batch_pre_images_with_late_lookups() {
    let pre_live = c1_doc("post-1", false);
    let pre_dead = c1_doc("post-1", true);
    let with_pre = |name: &str, n: u32, full: Bson, pre: Bson| {
        let mut doc = fixture(name);
        doc.insert("_id", doc! {"_data": token(n)});
        doc.insert("fullDocument", full);
        doc.insert("fullDocumentBeforeChange", pre);
        parse(&doc)
    };
    let delete_with_pre = |n: u32, pre: Bson| {
        let mut doc = fixture("hard_delete_with_pre_image");
        doc.insert("_id", doc! {"_data": token(n)});
        doc.insert("fullDocumentBeforeChange", pre);
        parse(&doc)
    };
    let scenarios = [
        (
            // Soft delete then undelete, both read after the undelete. Truth: no change.
            // Actual: post-1 +1 (0 for the soft delete, +1 for the undelete).
            "soft delete + undelete, late lookups",
            vec![
                with_pre("soft_delete", 1, pre_live.clone(), pre_live.clone()),
                with_pre("undelete", 2, pre_live.clone(), pre_dead.clone()),
            ],
            vec![],
        ),
        (
            // Soft delete read after the hard delete (lookup null), then the hard delete.
            // Truth: -1. Actual: no change (0 for the update, 0 for deleting a dead row).
            "soft delete + hard delete, lookup null",
            vec![
                with_pre("soft_delete", 1, Bson::Null, pre_live.clone()),
                delete_with_pre(2, pre_dead.clone()),
            ],
            vec![counter("post-1", &[(c1(), -1)])],
        ),
        (
            // The update's pre-image expired (ledger path, lookup null), the delete's did not.
            // Truth: -1. Actual: no change.
            "expired pre-image on the update, pre-image on the delete",
            vec![
                with_pre("soft_delete", 1, Bson::Null, Bson::Null),
                delete_with_pre(2, pre_dead),
            ],
            vec![counter("post-1", &[(c1(), -1)])],
        ),
    ];
    let mut failures = Vec::new();
    for (what, events, expected) in scenarios {
        for attribution in [Attribution::Auto, Attribution::PreImage] {
            if what.starts_with("expired") && attribution == Attribution::PreImage {
                continue; // without the ledger the update is a best-effort guess
            }
            let ledger = ledger_of(&[(&oid_key(C1), Some(live("post-1", c1())))]);
            let (plan, _) = plan_batch(&events, &ledger, attribution, &Schema::default(), WIDTH);
            if net(&plan.counters) != expected {
                failures.push(format!(
                    "{what} ({attribution:?}): expected {expected:?}, got {:?}",
                    plan.counters
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Applications' schemas: every soft-delete rule, on real-shaped and fake-server events
// (fixtures/events/schema/).

fn js_schema() -> Schema {
    Schema {
        counters: Vec::new(),
        group: "postId".into(),
        created: "createdAt".into(),
        soft_delete: counterd::core::schema::SoftDelete::True {
            field: "deleted".into(),
        },
    }
}

fn status_schema() -> Schema {
    Schema {
        counters: Vec::new(),
        soft_delete: counterd::core::schema::SoftDelete::OneOf {
            field: "status".into(),
            values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
        },
        ..Schema::default()
    }
}

fn nested_schema() -> Schema {
    Schema {
        counters: Vec::new(),
        group: "meta.post".into(),
        created: "meta.created".into(),
        ..Schema::default()
    }
}

#[test]
fn every_soft_delete_rule_on_real_and_fake_shapes() {
    let row = |p: &str, deleted: bool| Row {
        members: Vec::new(),
        post: Some(post(p)),
        created_at: c1(),
        deleted,
    };
    let known = |p: &str, deleted: bool| Before::Known(Some(row(p, deleted)));
    type Case = (&'static str, Schema, Before, Vec<(&'static str, i64)>);
    let cases: Vec<Case> = vec![
        ("js_insert_deleted", js_schema(), Before::Unknown, vec![]),
        (
            "js_soft_delete",
            js_schema(),
            known("post-1", false),
            vec![("post-1", -1)],
        ),
        (
            "js_soft_delete",
            js_schema(),
            Before::Unknown,
            vec![("post-1", -1)],
        ),
        (
            "js_undelete",
            js_schema(),
            known("post-1", true),
            vec![("post-1", 1)],
        ),
        (
            "js_undelete",
            js_schema(),
            Before::Unknown,
            vec![("post-1", 1)],
        ),
        (
            "status_soft_delete",
            status_schema(),
            known("post-1", false),
            vec![("post-1", -1)],
        ),
        (
            "status_soft_delete",
            status_schema(),
            Before::Unknown,
            vec![("post-1", -1)],
        ),
        (
            "status_undelete",
            status_schema(),
            known("post-1", true),
            vec![("post-1", 1)],
        ),
        (
            "status_undelete",
            status_schema(),
            Before::Unknown,
            vec![("post-1", 1)],
        ),
        (
            "nested_move",
            nested_schema(),
            known("post-1", false),
            vec![("post-1", -1), ("post-2", 1)],
        ),
        (
            "fake_js_soft_delete",
            js_schema(),
            known("post-1", false),
            vec![("post-1", -1)],
        ),
        (
            "fake_status_undelete",
            status_schema(),
            known("post-1", true),
            vec![("post-1", 1)],
        ),
    ];
    for (name, schema, before, want) in cases {
        let ev = event(&format!("schema/{name}"));
        let attribution = match before {
            Before::Unknown => Attribution::BestEffort,
            Before::Known(_) | Before::Complete(_) => Attribution::Ledger,
        };
        let c = classify(&ev, before.clone(), attribution, &schema)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut got: Vec<(String, i64)> = c
            .deltas
            .iter()
            .map(|d| (d.post.to_string(), d.amount.as_i64()))
            .collect();
        got.sort();
        let want: Vec<(String, i64)> = want.iter().map(|(p, a)| (p.to_string(), *a)).collect();
        assert_eq!(got, want, "{name} with {before:?}");
        assert!(
            c.problem.is_none() || want.is_empty(),
            "{name}: {:?}",
            c.problem
        );
    }
}

#[test]
fn the_default_schema_does_not_read_another_applications_fields() {
    let c = classify(
        &event("schema/js_soft_delete"),
        Before::Unknown,
        Attribution::BestEffort,
        &Schema::default(),
    )
    .unwrap();
    assert!(c.deltas.is_empty(), "{c:?}");
    assert!(
        c.problem.is_some(),
        "no post in the default group field: {c:?}"
    );
}

#[test]
fn batch_touches_every_bucket_of_an_update_known_only_from_its_lookup() {
    // The fake server's update (no description): its lookup may show a later state than the
    // event, hiding a restamp or a delete/undelete in between that a recount may have seen.
    let ledger = ledger_of(&[(&int_key(1), Some(live("p1", fc())))]);
    let events = vec![event("fake/update_set_deleted_at")];
    let (plan, _) = plan_batch(
        &events,
        &ledger,
        Attribution::Auto,
        &Schema::default(),
        WIDTH,
    );
    let p1 = plan
        .counters
        .iter()
        .find(|c| c.post == post("p1"))
        .expect("p1 written");
    assert!(p1.touched.contains(&0), "{p1:?}");
    // A real update with a complete description is derived exactly: only its own buckets.
    let events = vec![retoken("soft_delete", 2, None)];
    let ledger = ledger_of(&[(&oid_key(C1), Some(live("post-1", c1())))]);
    let (plan, _) = plan_batch(
        &events,
        &ledger,
        Attribution::Ledger,
        &Schema::default(),
        WIDTH,
    );
    assert_eq!(plan.counters.len(), 1);
    assert!(
        !plan.counters[0].touched.contains(&0),
        "{:?}",
        plan.counters
    );
}
