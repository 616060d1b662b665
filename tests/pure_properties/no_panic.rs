//! Arbitrary documents never panic the event model, the classifier or the planner.

use bson::{doc, oid::ObjectId, Bson, DateTime, Document, Timestamp};
use counterd::core::batch::plan_batch;
use counterd::core::classify::{classify, Attribution, Before};
use counterd::core::event::{ChangeEvent, CommentId, Row};
use counterd::core::key::GroupValue;
use counterd::core::num::Num;
use counterd::core::schema::Schema;
use proptest::prelude::*;
use proptest::sample::select;

use crate::BASE_MS;

pub const KEYS: &[&str] = &[
    "_id",
    "_data",
    "operationType",
    "documentKey",
    "fullDocument",
    "fullDocumentBeforeChange",
    "updateDescription",
    "updatedFields",
    "removedFields",
    "post_id",
    "created_at",
    "deleted_at",
    "$set",
    "$unset",
    "clusterTime",
    "body",
];

pub const OPS: &[&str] = &[
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
    "createIndexes",
    "futureOp",
    "",
];

pub fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(KEYS).prop_map(String::from),
        1 => "[a-z$._]{0,4}",
    ]
}

pub fn leaf_strategy() -> impl Strategy<Value = Bson> {
    prop_oneof![
        "\\PC{0,6}".prop_map(Bson::String),
        select(OPS).prop_map(Bson::from),
        select(vec!["p1", "post-1", "deleted_at", "post_id", "82AB"]).prop_map(Bson::from),
        any::<i32>().prop_map(Bson::Int32),
        (-3..3i32).prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<f64>().prop_map(Bson::Double),
        Just(Bson::Double(f64::NAN)),
        Just(Bson::Null),
        any::<bool>().prop_map(Bson::Boolean),
        any::<i64>().prop_map(|ms| Bson::DateTime(DateTime::from_millis(ms))),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(-1i64), Just(0i64)]
            .prop_map(|ms| Bson::DateTime(DateTime::from_millis(ms))),
        (any::<u32>(), any::<u32>())
            .prop_map(|(time, increment)| Bson::Timestamp(Timestamp { time, increment })),
        any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
    ]
}

pub fn bson_strategy() -> impl Strategy<Value = Bson> {
    leaf_strategy().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Bson::Array),
            proptest::collection::vec((key_strategy(), inner), 0..6)
                .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
        ]
    })
}

/// A document that often looks like an event: a token, an operation, and arbitrary fields.
pub fn event_like() -> impl Strategy<Value = Document> {
    (
        proptest::option::weighted(
            0.9,
            prop_oneof![
                4 => "[0-9A-F]{1,12}".prop_map(Bson::String),
                1 => bson_strategy(),
            ],
        ),
        proptest::option::weighted(
            0.9,
            prop_oneof![
                4 => select(OPS).prop_map(Bson::from),
                1 => bson_strategy(),
            ],
        ),
        proptest::collection::vec((key_strategy(), bson_strategy()), 0..8),
    )
        .prop_map(|(data, op, fields)| {
            let mut d = Document::new();
            if let Some(data) = data {
                d.insert("_id", doc! {"_data": data});
            }
            if let Some(op) = op {
                d.insert("operationType", op);
            }
            for (k, v) in fields {
                d.insert(k, v);
            }
            d
        })
}

/// A fixture with random parts replaced, removed or added, at the top or one level down.
pub fn mutated_fixture() -> impl Strategy<Value = Document> {
    let fixtures = load_fixtures();
    (
        select(fixtures),
        proptest::collection::vec(
            (
                select(vec![
                    "",
                    "fullDocument",
                    "documentKey",
                    "updateDescription",
                    "fullDocumentBeforeChange",
                    "_id",
                ]),
                key_strategy(),
                proptest::option::weighted(0.8, bson_strategy()),
            ),
            1..4,
        ),
    )
        .prop_map(|(mut doc, edits)| {
            for (at, key, value) in edits {
                let target = if at.is_empty() {
                    Some(&mut doc)
                } else {
                    doc.get_document_mut(at).ok()
                };
                if let Some(target) = target {
                    match value {
                        Some(v) => {
                            target.insert(key, v);
                        }
                        None => {
                            target.remove(&key);
                        }
                    }
                }
            }
            doc
        })
}

pub fn load_fixtures() -> Vec<Document> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/events");
    let mut docs = Vec::new();
    for dir in [root.clone(), root.join("fake")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                match Bson::try_from(json).unwrap() {
                    Bson::Document(d) => docs.push(d),
                    other => panic!("{}: {other:?}", path.display()),
                }
            }
        }
    }
    docs.sort_by_key(|d| d.to_string());
    docs
}

pub fn befores() -> Vec<Before> {
    let row = |deleted| {
        Row::of(
            Some(GroupValue::Str("p1".into())),
            Some(DateTime::from_millis(BASE_MS)),
            deleted,
        )
    };
    vec![
        Before::Unknown,
        Before::Known(None),
        Before::Known(Some(row(false))),
        Before::Known(Some(row(true))),
        Before::Known(Some(Row::of(
            Some(GroupValue::Int(-1)),
            Some(DateTime::MIN),
            false,
        ))),
        // A row that exists without a post.
        Before::Known(Some(Row::of(
            None,
            Some(DateTime::from_millis(BASE_MS)),
            false,
        ))),
    ]
}

pub const ALL: [Attribution; 4] = [
    Attribution::Auto,
    Attribution::PreImage,
    Attribution::Ledger,
    Attribution::BestEffort,
];

pub fn never_panics(docs: &[Document], ledger_pick: &[u8]) {
    let mut events = Vec::new();
    for doc in docs {
        let Ok(event) = ChangeEvent::parse(doc) else {
            continue;
        };
        for before in befores() {
            for attribution in ALL {
                let _ = classify(&event, before.clone(), attribution, &Schema::default());
            }
        }
        events.push(event);
    }
    // A ledger that knows some of the comments, in any state.
    let states = befores();
    let mut ledger = counterd::core::event::LedgerView::default();
    for (event, pick) in events.iter().zip(ledger_pick) {
        if let (Some(comment), Before::Known(state)) =
            (&event.comment, &states[*pick as usize % states.len()])
        {
            ledger.insert(comment.key.clone(), state.clone());
        }
    }
    for attribution in ALL {
        for width in [1, 60, 3600] {
            let (plan, _) = plan_batch(&events, &ledger, attribution, &Schema::default(), width);
            for c in &plan.counters {
                assert_eq!(c.buckets.values().sum::<Num>(), c.delta);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn arbitrary_documents_never_panic(
        docs in proptest::collection::vec(event_like(), 1..6),
        ledger_pick in proptest::collection::vec(any::<u8>(), 6),
    ) {
        never_panics(&docs, &ledger_pick);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        docs in proptest::collection::vec(mutated_fixture(), 1..6),
        ledger_pick in proptest::collection::vec(any::<u8>(), 6),
    ) {
        never_panics(&docs, &ledger_pick);
    }

    #[test]
    fn arbitrary_values_never_panic(value in bson_strategy()) {
        if let Bson::Document(doc) = &value {
            never_panics(std::slice::from_ref(doc), &[2]);
        }
        let _ = CommentId::new(value.clone());
        let _ = GroupValue::from_bson(&value);
        if let Bson::Document(doc) = value {
            let _ = Schema::default().read_row(&doc);
        }
    }
}
