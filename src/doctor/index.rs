//! An index recounts can use: counterd indexes only its own collections, and a recount counts
//! the live rows of one post created below a watermark (`{<group>: post, <created>: {$lt: W},
//! <soft delete>}`). Without an index led by the group field, each of up to
//! `reconcile_counts_per_second` recounts scans the whole collection on the primary. Every
//! counter definition recounts by its own group field, so each distinct group field is checked.

use bson::{Bson, Document};

use super::{db_expr, js_string, Expectations, Finding};

/// The `createIndex` command that serves the default definition's recounts.
pub fn create_index_command(expect: &Expectations) -> String {
    create_index_command_for(expect, &expect.schema.group)
}

/// The `createIndex` command that serves recounts grouped by `group`.
fn create_index_command_for(expect: &Expectations, group: &str) -> String {
    format!(
        "{}.getCollection({}).createIndex({{{}: 1, {}: 1}})",
        db_expr(&expect.database),
        js_string(&expect.comments),
        js_string(group),
        js_string(&expect.schema.created)
    )
}

/// The key fields of an index specification, in order.
fn keys(spec: &Document) -> Vec<(&str, &Bson)> {
    spec.get_document("key")
        .map(|k| k.iter().map(|(f, v)| (f.as_str(), v)).collect())
        .unwrap_or_default()
}

/// One finding per distinct group field of the definitions, the default's first.
pub fn check(
    indexes: &Result<Vec<Document>, String>,
    collection: &Result<Option<Document>, String>,
    expect: &Expectations,
) -> Vec<Finding> {
    let mut groups = vec![expect.schema.group.as_str()];
    for definition in &expect.schema.counters {
        if !groups.contains(&definition.group.as_str()) {
            groups.push(&definition.group);
        }
    }
    groups
        .into_iter()
        .map(|group| check_group(indexes, collection, expect, group))
        .collect()
}

fn check_group(
    indexes: &Result<Vec<Document>, String>,
    collection: &Result<Option<Document>, String>,
    expect: &Expectations,
    group: &str,
) -> Finding {
    const CHECK: &str = "recount_index";
    let created = &expect.schema.created;
    if matches!(collection, Ok(None)) {
        return Finding::warning(
            CHECK,
            format!(
                "{}.{} does not exist yet: no index to check",
                expect.database, expect.comments
            ),
            format!(
                "create it with the index recounts use: {}",
                create_index_command_for(expect, group)
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
        .filter(|s| keys(s).first().is_some_and(|(f, _)| *f == group))
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
            create_index_command_for(expect, group),
        );
    }
    Finding::warning(
        CHECK,
        format!(
            "no index on {}.{} is led by {group}: every recount (up to reconcile_counts_per_second) scans the collection",
            expect.database, expect.comments
        ),
        create_index_command_for(expect, group),
    )
}
