//! An index recounts can use: counterd indexes only its own collections, and a recount counts
//! the live rows of one post created below a watermark (`{<group>: post, <created>: {$lt: W},
//! <soft delete>}`). Without an index led by the group field, each of up to
//! `reconcile_counts_per_second` recounts scans the whole collection on the primary. Every
//! counter definition recounts by its own group field, so each distinct group field is checked.
//! A sum's recount also adds up its field (`$sum`): the index should hold it after the group
//! and the creation time, so that the server adds it up from the index.

use bson::{Bson, Document};

use super::{db_expr, js_string, Expectations, Finding};

/// The `createIndex` command that serves the default definition's recounts.
pub fn create_index_command(expect: &Expectations) -> String {
    create_index_command_for(expect, expect.schema.group(), &[])
}

/// The `createIndex` command that serves recounts grouped by `group`, and the sums of `sums`.
fn create_index_command_for(expect: &Expectations, group: &str, sums: &[&str]) -> String {
    let mut keys = vec![js_string(group), js_string(&expect.schema.created)];
    keys.extend(sums.iter().map(|f| js_string(f)));
    let keys: Vec<String> = keys.into_iter().map(|k| format!("{k}: 1")).collect();
    format!(
        "{}.getCollection({}).createIndex({{{}}})",
        db_expr(&expect.database),
        js_string(&expect.comments),
        keys.join(", ")
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
    // Each distinct group field, with the fields its sums add up.
    let mut groups: Vec<(&str, Vec<&str>)> = Vec::new();
    for (_, definition) in expect.schema.definitions.iter() {
        let sum = definition.kind.field();
        match groups.iter_mut().find(|(g, _)| *g == definition.group) {
            Some((_, sums)) => sums.extend(sum.filter(|f| !sums.contains(f))),
            None => groups.push((&definition.group, sum.into_iter().collect())),
        }
    }
    groups
        .into_iter()
        .map(|(group, sums)| check_group(indexes, collection, expect, group, &sums))
        .collect()
}

/// The check's name in its findings.
const CHECK: &str = "recount_index";

/// The index recounts by `group` (adding up `sums`) use, if the collection and its index list
/// could be read.
fn check_group(
    indexes: &Result<Vec<Document>, String>,
    collection: &Result<Option<Document>, String>,
    expect: &Expectations,
    group: &str,
    sums: &[&str],
) -> Finding {
    if matches!(collection, Ok(None)) {
        return Finding::warning(
            CHECK,
            format!(
                "{}.{} does not exist yet: no index to check",
                expect.database, expect.comments
            ),
            format!(
                "create it with the index recounts use: {}",
                create_index_command_for(expect, group, sums)
            ),
        );
    }
    match indexes {
        Ok(specs) => judge_indexes(specs, expect, group, sums),
        Err(e) => Finding::skipped(
            CHECK,
            format!("listIndexes on {} failed ({e})", expect.comments),
        ),
    }
}

/// The best of `specs` for recounts by `group` adding up `sums`: led by the group, then the
/// creation field, holding the summed fields.
fn judge_indexes(specs: &[Document], expect: &Expectations, group: &str, sums: &[&str]) -> Finding {
    let created = &expect.schema.created;
    // A partial index serves only the rows its filter keeps: not usable for every recount.
    let usable = specs
        .iter()
        .filter(|s| !s.contains_key("partialFilterExpression"));
    let led_by_group: Vec<&Document> = usable
        .filter(|s| keys(s).first().is_some_and(|(f, _)| *f == group))
        .collect();
    let name = |s: &Document| s.get_str("name").unwrap_or("?").to_string();
    let served = |s: &&&Document| keys(s).get(1).is_some_and(|(f, _)| f == created);
    let holds_sums = |s: &&&Document| {
        let keys = keys(s);
        sums.iter().all(|f| keys.iter().any(|(k, _)| k == f))
    };
    if let Some(best) = led_by_group.iter().find(|s| served(s) && holds_sums(s)) {
        return Finding::ok(
            CHECK,
            format!(
                "recounts use index {} ({group}, {created}{})",
                name(best),
                sums.iter().map(|f| format!(", {f}")).collect::<String>()
            ),
        );
    }
    // Served but without the sums (without sums, the index above would have served).
    if let Some(best) = led_by_group.iter().find(served) {
        return Finding::warning(
            CHECK,
            format!(
                "index {} serves the recounts by {group}, but the sums' $sum of {} reads every counted row to add it up",
                name(best),
                sums.join(", ")
            ),
            create_index_command_for(expect, group, sums),
        );
    }
    unserved(led_by_group.first().copied(), expect, group, sums)
}

/// No index serves the recounts: `some` is led by the group (without the creation field
/// after it), if any.
fn unserved(some: Option<&Document>, expect: &Expectations, group: &str, sums: &[&str]) -> Finding {
    let created = &expect.schema.created;
    let name = |s: &Document| s.get_str("name").unwrap_or("?").to_string();
    if let Some(some) = some {
        return Finding::warning(
            CHECK,
            format!(
                "index {} is led by {group} but has no {created} after it: recounts read every row of a post to apply the watermark",
                name(some)
            ),
            create_index_command_for(expect, group, sums),
        );
    }
    Finding::warning(
        CHECK,
        format!(
            "no index on {}.{} is led by {group}: every recount (up to reconcile_counts_per_second) scans the collection",
            expect.database, expect.comments
        ),
        create_index_command_for(expect, group, sums),
    )
}
