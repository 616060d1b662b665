//! Applications' own schemas against the test database: a JavaScript-style collection
//! (`postId`, `createdAt`, a boolean `deleted`) and one with a nested group field and a status
//! value for soft deletes. The worker and the reconciler read rows through the configured
//! schema only: every event kind is counted exactly without a reconcile, a reconcile then finds
//! nothing to correct, and every counter's `count` equals `base_count + live_delta`.

mod support;

use std::time::Duration;

use counterd::core::key::GroupValue;
use counterd::core::schema::{Schema, SoftDelete};
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::store::prelude::*;
use mongodb::bson::{doc, Bson, DateTime, Document};
use support::{now_secs, TestDb};

const POSTS: i64 = 4;

fn post(i: i64) -> GroupValue {
    GroupValue::Int(i)
}

/// Inserts, soft deletes, undeletes, moves, hard deletes, rows born deleted and a row without a
/// creation time, all through `t.schema`; then checks every counter against the truth.
async fn every_event_kind_is_counted(t: TestDb) {
    let schema = t.schema.clone();
    let worker = t.spawn_worker(t.worker_settings()).await;
    let posts: Vec<GroupValue> = (0..POSTS).map(post).collect();
    let old = DateTime::from_millis((now_secs() - 3600) * 1000);
    let new = DateTime::from_millis(now_secs() * 1000);
    for i in 0..40_i64 {
        let created = if i < 10 { old } else { new };
        let row = schema.row_document(i, &post(i % POSTS), created, false);
        t.comments.insert_one(row).await.unwrap();
    }
    for i in 40..42_i64 {
        let row = schema.row_document(i, &post(i % POSTS), old, true);
        t.comments.insert_one(row).await.unwrap();
    }
    // A row without a creation time: bucket 0, still counted.
    let mut undated = schema.row_document(42_i64, &post(1), old, false);
    remove_path(&mut undated, &schema.created);
    t.comments.insert_one(undated).await.unwrap();
    let by_id = |i: i64| doc! {"_id": i};
    for i in [0, 3, 11, 17, 22, 25, 30, 41] {
        let update = schema.soft_delete_update(DateTime::now()).unwrap();
        t.comments.update_one(by_id(i), update).await.unwrap();
    }
    for i in [3, 22, 41] {
        let update = schema.undelete_update().unwrap();
        t.comments.update_one(by_id(i), update).await.unwrap();
    }
    for (i, to) in [(1, 2), (5, 3), (12, 0), (19, 1), (33, 2)] {
        let update = doc! {"$set": {schema.group(): Bson::Int64(to)}};
        t.comments.update_one(by_id(i), update).await.unwrap();
    }
    for i in [2, 8, 14, 36] {
        t.comments.delete_one(by_id(i)).await.unwrap();
    }
    // The truth by this schema, computed here from the documents themselves.
    let mut expected = vec![0_i64; POSTS as usize];
    let docs: Vec<Document> = {
        use futures::TryStreamExt;
        t.comments
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap()
    };
    for d in &docs {
        let row = schema.read_existing_row(d);
        if let Some(GroupValue::Int(p)) = row.counted_in(counterd::core::key::CounterIx(0)) {
            expected[*p as usize] += 1;
        }
    }
    // 40 live + 1 undated; 7 live rows soft-deleted; 3 undeleted (one born deleted); 4 removed.
    assert_eq!(expected.iter().sum::<i64>(), 41 - 7 + 3 - 4);
    for (p, want) in posts.iter().zip(&expected) {
        assert_eq!(
            t.truth(p).await,
            *want,
            "the store's count query agrees on {p}"
        );
    }
    t.wait_exact(&posts, Duration::from_secs(30)).await;

    // A reconcile (beside the worker) finds nothing to correct.
    let reconciler = Reconciler::new(
        t.store.clone(),
        ReconcileSettings {
            settle_secs: 1,
            ..ReconcileSettings::default()
        },
    );
    let report = reconciler.run_dirty(now_secs()).await.unwrap();
    let swept = reconciler.sweep(now_secs(), |_| {}, None).await.unwrap();
    worker.shutdown().await.unwrap();
    assert_eq!(report.summary.corrected, 0, "{:?}", report.summary);
    assert_eq!(swept.summary.corrected, 0, "{:?}", swept.summary);
    t.wait_exact(&posts, Duration::from_secs(1)).await;
    for p in &posts {
        let c = t.store.read_counter(p).await.unwrap().unwrap();
        assert_eq!(c.count, Some(c.state.displayed()), "count of {p}: {c:?}");
    }
}

fn remove_path(doc: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            doc.remove(path);
        }
        Some((head, rest)) => {
            if let Ok(inner) = doc.get_document_mut(head) {
                remove_path(inner, rest);
            }
        }
    }
}

#[tokio::test]
async fn a_javascript_schema_with_a_boolean_soft_delete() {
    let schema = Schema {
        created: "createdAt".into(),
        soft_delete: SoftDelete::True {
            field: "deleted".into(),
        },
        ..Schema::default().grouped_by("postId")
    };
    every_event_kind_is_counted(TestDb::with_schema("jsschema", schema).await).await;
}

#[tokio::test]
async fn a_nested_group_field_and_a_status_value() {
    let schema = Schema {
        created: "meta.created".into(),
        soft_delete: SoftDelete::OneOf {
            field: "status".into(),
            values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
        },
        ..Schema::default().grouped_by("meta.post")
    };
    every_event_kind_is_counted(TestDb::with_schema("nestedschema", schema).await).await;
}
