//! Applications' schemas: every soft-delete rule, on real-shaped and fake-server events
//! (fixtures/events/schema/).

use bson::Bson;
use counterd::core::classify::{classify, Attribution, Before};
use counterd::core::event::Row;
use counterd::core::schema::Schema;

use crate::{c1, event, post};

pub fn js_schema() -> Schema {
    Schema {
        created: "createdAt".into(),
        soft_delete: counterd::core::schema::SoftDelete::True {
            field: "deleted".into(),
        },
        ..Schema::default().grouped_by("postId")
    }
}

pub fn status_schema() -> Schema {
    Schema {
        soft_delete: counterd::core::schema::SoftDelete::OneOf {
            field: "status".into(),
            values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
        },
        ..Schema::default()
    }
}

pub fn nested_schema() -> Schema {
    Schema {
        created: "meta.created".into(),
        ..Schema::default().grouped_by("meta.post")
    }
}

#[test]
fn every_soft_delete_rule_on_real_and_fake_shapes() {
    let row = |p: &str, deleted: bool| Row::of(Some(post(p)), c1(), deleted);
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
            .map(|d| (d.key.group.to_string(), d.amount.as_i64()))
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
