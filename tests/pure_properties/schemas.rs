//! Applications' schemas: a renamed schema on renamed documents plans exactly what the default
//! schema plans on the original ones.

use bson::{Bson, Document};
use counterd::core::batch::plan_batch;
use counterd::core::classify::Attribution;
use counterd::core::event::{ChangeEvent, CommentId, LedgerView};
use counterd::core::schema::Schema;
use proptest::prelude::*;
use proptest::sample::select;

use crate::batches::{emit, op_strategy, simulate, Mode, COMMENTS};
use crate::{comment_strategy, Comment, WIDTH};

/// The renamed application: `post_id` → `meta.postId` (nested), `created_at` → `createdAt`,
/// `deleted_at` → `deletedAt`.
pub fn renamed_schema() -> Schema {
    Schema {
        created: "createdAt".into(),
        soft_delete: counterd::core::schema::SoftDelete::Present {
            field: "deletedAt".into(),
        },
        ..Schema::default().grouped_by("meta.postId")
    }
}

pub fn rename_path(key: &str) -> String {
    match key {
        "post_id" => "meta.postId".into(),
        "created_at" => "createdAt".into(),
        "deleted_at" => "deletedAt".into(),
        other => other.into(),
    }
}

/// A row document with its fields renamed (nested where the new path is dotted).
pub fn rename_row(doc: &Document) -> Document {
    let mut out = Document::new();
    for (k, v) in doc {
        counterd::core::schema::set_path(&mut out, &rename_path(k), v.clone());
    }
    out
}

/// Field names renamed as flat (dotted) keys: updatedFields, `$set`, `$unset`.
pub fn rename_keys(doc: &Document) -> Document {
    doc.iter()
        .map(|(k, v)| (rename_path(k), v.clone()))
        .collect()
}

/// A change event with every field name of the row renamed, wherever the event carries it.
pub fn rename_event(event: &Document) -> Document {
    let mut e = event.clone();
    for field in ["fullDocument", "fullDocumentBeforeChange"] {
        if let Ok(d) = event.get_document(field) {
            let renamed = if d.contains_key("_id") {
                rename_row(d)
            } else {
                rename_keys(d) // the fake server's fragment of a gone row: flat keys
            };
            e.insert(field, renamed);
        }
    }
    if let Ok(key) = event.get_document("documentKey") {
        let mut renamed = Document::new();
        for (k, v) in key {
            match (k.as_str(), v) {
                ("$set" | "$unset", Bson::Document(d)) => {
                    renamed.insert(k.clone(), rename_keys(d));
                }
                _ => counterd::core::schema::set_path(&mut renamed, &rename_path(k), v.clone()),
            }
        }
        e.insert("documentKey", renamed);
    }
    if let Ok(desc) = event.get_document("updateDescription") {
        let mut desc = desc.clone();
        if let Ok(set) = desc.get_document("updatedFields") {
            let renamed = rename_keys(set);
            desc.insert("updatedFields", renamed);
        }
        if let Ok(removed) = desc.get_array("removedFields") {
            let renamed: Vec<Bson> = removed
                .iter()
                .map(|b| Bson::String(rename_path(b.as_str().unwrap_or_default())))
                .collect();
            desc.insert("removedFields", renamed);
        }
        e.insert("updateDescription", desc);
    }
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_renamed_schema_plans_what_the_default_one_plans(
        initial in proptest::collection::vec(proptest::option::of(comment_strategy()), COMMENTS),
        known in proptest::collection::vec(any::<bool>(), COMMENTS),
        ops in proptest::collection::vec((0..COMMENTS, op_strategy()), 1..30),
        lags in proptest::collection::vec(0..4usize, 30),
        mode in select(vec![Mode::RealLookup, Mode::RealLedgerIgnoringPreImages, Mode::RealPreImage, Mode::Fake]),
        attribution in select(vec![Attribution::Auto, Attribution::Ledger, Attribution::PreImage, Attribution::BestEffort]),
    ) {
        let steps = simulate(&initial, &ops);
        let docs: Vec<Document> = (0..steps.len())
            .map(|i| emit(&steps, i, (i + lags[i]).min(steps.len() - 1), mode))
            .collect();
        let parse = |d: &Document| ChangeEvent::parse(d).unwrap();
        let events: Vec<ChangeEvent> = docs.iter().map(parse).collect();
        let renamed: Vec<ChangeEvent> = docs.iter().map(|d| parse(&rename_event(d))).collect();
        let mut ledger = LedgerView::default();
        for (i, c) in initial.iter().enumerate() {
            if known[i] {
                ledger.insert(CommentId::new(Bson::Int32(i as i32)).key, c.as_ref().map(Comment::row));
            }
        }
        let (default_plan, _) = plan_batch(&events, &ledger, attribution, &Schema::default(), WIDTH);
        let (renamed_plan, _) = plan_batch(&renamed, &ledger, attribution, &renamed_schema(), WIDTH);
        prop_assert_eq!(&renamed_plan.counters, &default_plan.counters);
        prop_assert_eq!(&renamed_plan.dirty, &default_plan.dirty);
        prop_assert_eq!(&renamed_plan.ledger, &default_plan.ledger);
        prop_assert_eq!(renamed_plan.events, default_plan.events);
        prop_assert_eq!(renamed_plan.skipped.len(), default_plan.skipped.len());
    }
}
