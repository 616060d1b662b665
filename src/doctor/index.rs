//! An index recounts can use: counterd indexes only its own collections, and a recount counts
//! the live rows of one post created below a watermark (`{<group>: post, <created>: {$lt: W},
//! <soft delete>}`). Without an index led by the group field, each of up to
//! `reconcile_counts_per_second` recounts scans the whole collection on the primary.

use bson::{Bson, Document};

use super::{db_expr, js_string, Expectations, Finding};

/// The `createIndex` command that serves recounts.
pub fn create_index_command(expect: &Expectations) -> String {
    format!(
        "{}.getCollection({}).createIndex({{{}: 1, {}: 1}})",
        db_expr(&expect.database),
        js_string(&expect.comments),
        js_string(&expect.schema.group),
        js_string(&expect.schema.created)
    )
}

/// The key fields of an index specification, in order.
fn keys(spec: &Document) -> Vec<(&str, &Bson)> {
    spec.get_document("key")
        .map(|k| k.iter().map(|(f, v)| (f.as_str(), v)).collect())
        .unwrap_or_default()
}

pub fn check(
    indexes: &Result<Vec<Document>, String>,
    collection: &Result<Option<Document>, String>,
    expect: &Expectations,
) -> Finding {
    const CHECK: &str = "recount_index";
    let (group, created) = (&expect.schema.group, &expect.schema.created);
    if matches!(collection, Ok(None)) {
        return Finding::warning(
            CHECK,
            format!(
                "{}.{} does not exist yet: no index to check",
                expect.database, expect.comments
            ),
            format!(
                "create it with the index recounts use: {}",
                create_index_command(expect)
            ),
        );
    }
    let specs = match indexes {
        Ok(s) => s,
        Err(e) => {
            return Finding::skipped(
                CHECK,
                format!("listIndexes on {} failed ({e})", expect.comments),
            )
        }
    };
    // A partial index serves only the rows its filter keeps: not usable for every recount.
    let usable = specs
        .iter()
        .filter(|s| !s.contains_key("partialFilterExpression"));
    let led_by_group: Vec<&Document> = usable
        .filter(|s| keys(s).first().is_some_and(|(f, _)| f == group))
        .collect();
    let name = |s: &Document| s.get_str("name").unwrap_or("?").to_string();
    if let Some(best) = led_by_group
        .iter()
        .find(|s| keys(s).get(1).is_some_and(|(f, _)| f == created))
    {
        return Finding::ok(
            CHECK,
            format!("recounts use index {} ({group}, {created})", name(best)),
        );
    }
    if let Some(some) = led_by_group.first() {
        return Finding::warning(
            CHECK,
            format!(
                "index {} is led by {group} but has no {created} after it: recounts read every row of a post to apply the watermark",
                name(some)
            ),
            create_index_command(expect),
        );
    }
    Finding::warning(
        CHECK,
        format!(
            "no index on {}.{} is led by {group}: every recount (up to reconcile_counts_per_second) scans the collection",
            expect.database, expect.comments
        ),
        create_index_command(expect),
    )
}
