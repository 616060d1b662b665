//! The configured fields in a sample of rows, with the types counterd reads. A misspelled
//! `group_field` makes every row "not a comment": nothing is counted and the only symptom is
//! an alert about unattributable events. Checked here, before it becomes that alert.

use std::collections::BTreeSet;

use bson::{Bson, Document};

use super::{Expectations, Finding};
use crate::core::event::RowRead;
use crate::core::schema::{Schema, SoftDelete};

/// The findings' check name.
const CHECK: &str = "fields";

/// One finding per configured field: the group field, the creation field, the soft-delete
/// field (if the rule reads one).
pub fn check(sample: &Result<Vec<Document>, String>, expect: &Expectations) -> Vec<Finding> {
    let comments = &expect.comments;
    let skipped = |why: String| vec![Finding::skipped(CHECK, why)];
    let rows = match sample {
        Ok(rows) if !rows.is_empty() => rows,
        Ok(_) => return skipped(format!("{comments} has no rows to sample yet")),
        Err(e) => return skipped(format!("could not read a sample of {comments} ({e})")),
    };
    let schema = &expect.schema;
    let mut out = vec![group_field(rows, schema), created_field(rows, schema)];
    out.extend(soft_delete_field(rows, schema));
    out
}

/// The group field: present, and of a type counterd counts, in every sampled row.
fn group_field(rows: &[Document], schema: &Schema) -> Finding {
    let n = rows.len();
    let (mut absent, mut bad_types) = (0, BTreeSet::new());
    let mut bad = 0;
    for row in rows {
        match schema.read_row(row) {
            RowRead::NoPost => absent += 1,
            RowRead::BadPost(kind) => {
                bad += 1;
                bad_types.insert(kind);
            }
            RowRead::Row(_) => {}
        }
    }
    let group = schema.group();
    if absent == n {
        Finding::problem(
            CHECK,
            format!("none of {n} sampled rows has {group:?} (fields seen: {}): nothing would be counted", seen_fields(rows)),
            "set group_field to the field that holds the post id (a dotted path for a nested one)",
        )
    } else if absent + bad > 0 {
        Finding::warning(
            CHECK,
            format!(
                "{group}: {absent} of {n} sampled rows lack it and {bad} hold a type counterd does not count ({}); those rows are not counted",
                bad_types.into_iter().collect::<Vec<_>>().join(", ")
            ),
            "post ids must be an integer, a string or an ObjectId; fix the writer or the rows",
        )
    } else {
        Finding::ok(
            CHECK,
            format!("{group}: an integer, string or ObjectId in all {n} sampled rows"),
        )
    }
}

/// The creation field: a date in every sampled row.
fn created_field(rows: &[Document], schema: &Schema) -> Finding {
    let n = rows.len();
    let created = &schema.created;
    let dated = rows
        .iter()
        .filter(|r| matches!(Schema::get(r, created), Some(Bson::DateTime(_))))
        .count();
    if dated == 0 {
        Finding::problem(
            CHECK,
            format!("none of {n} sampled rows has a date at {created:?}: every row falls in bucket 0, so every recount waits on the whole post"),
            "set created_field to the field that holds the creation date (a BSON date)",
        )
    } else if dated < n {
        Finding::warning(
            CHECK,
            format!("{created}: {} of {n} sampled rows have no date there (filed under bucket 0, still counted)", n - dated),
            "store creation times as BSON dates",
        )
    } else {
        Finding::ok(CHECK, format!("{created}: a date in all {n} sampled rows"))
    }
}

/// The soft-delete field, where the rule reads a boolean: a boolean or absent in every
/// sampled row.
fn soft_delete_field(rows: &[Document], schema: &Schema) -> Option<Finding> {
    let n = rows.len();
    let SoftDelete::True { field } = &schema.soft_delete else {
        return None;
    };
    let not_bool = rows
        .iter()
        .filter(|r| {
            Schema::get(r, field).is_some_and(|v| !matches!(v, Bson::Boolean(_) | Bson::Null))
        })
        .count();
    Some(if not_bool > 0 {
        Finding::warning(
            CHECK,
            format!("{field}: {not_bool} of {n} sampled rows hold a non-boolean there; soft_delete = \"true\" counts a row deleted only when it is the boolean true"),
            "use soft_delete = \"present\" or \"one_of\", or store booleans",
        )
    } else {
        Finding::ok(
            CHECK,
            format!("{field}: a boolean or absent in all {n} sampled rows"),
        )
    })
}

/// The top-level fields of the sampled rows, for a misspelled field's message.
fn seen_fields(rows: &[Document]) -> String {
    let fields: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.keys().map(String::as_str))
        .collect();
    fields.into_iter().take(12).collect::<Vec<_>>().join(", ")
}
