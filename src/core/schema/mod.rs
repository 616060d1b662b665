//! Pure: the application's schema, from settings. Which field groups a comment under its post,
//! which holds its creation time, and which rule says it is soft-deleted. Classification, the
//! ledger, every count query, the snapshot and the demo read rows through this one definition;
//! nothing else in the code names the application's fields.
//!
//! A row *counts* when it exists, its group field holds a post id (an integer, a string or an
//! ObjectId; a double, an array, a document or a missing field does not count), and the
//! soft-delete rule does not say it is deleted.

//!
//! Where it lives: `mod.rs` the rule and reading rows; `update.rs` what an update does to a row
//! (classification's before → after); `write.rs` documents written with the schema (the demo
//! and tests) and the dotted-path edits both use.

use bson::{Bson, Document};
use serde::{Deserialize, Serialize};

use crate::core::definition::{Definition, Definitions};
use crate::core::event::{Row, RowRead};
use crate::core::key::GroupValue;

mod projection;
mod update;
mod write;

pub use write::set_path;

/// How a soft-deleted row is recognised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftDelete {
    /// Deleted when the field is present and not null (`deleted_at: <date>`).
    Present { field: String },
    /// Deleted when the field is the boolean `true` (`deleted: true`).
    True { field: String },
    /// Deleted when the field equals one of these values (`status: "removed"`).
    OneOf { field: String, values: Vec<Bson> },
    /// Rows are never soft-deleted (only hard deletes remove them).
    Never,
}

impl SoftDelete {
    /// The field the rule reads (`None` for [`SoftDelete::Never`]).
    pub fn field(&self) -> Option<&str> {
        match self {
            SoftDelete::Present { field }
            | SoftDelete::True { field }
            | SoftDelete::OneOf { field, .. } => Some(field),
            SoftDelete::Never => None,
        }
    }

    /// Whether a row whose rule field holds `value` (`None`: absent) is deleted.
    pub fn is_deleted(&self, value: Option<&Bson>) -> bool {
        match self {
            SoftDelete::Present { .. } => !matches!(value, None | Some(Bson::Null)),
            SoftDelete::True { .. } => matches!(value, Some(Bson::Boolean(true))),
            SoftDelete::OneOf { values, .. } => value.is_some_and(|v| values.contains(v)),
            SoftDelete::Never => false,
        }
    }
}

/// The application's field names and soft-delete rule, and every counter definition.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    /// Dotted path of the creation time (`created_at`); a row without a date there is filed
    /// under bucket 0, below every watermark, and still counted.
    pub created: String,
    pub soft_delete: SoftDelete,
    /// Every counter definition, the default first: every row read records what the row is
    /// to each ([`Row::members`]). The first one's group field is the schema's own
    /// ([`Schema::group`]).
    pub definitions: Definitions,
}

impl Schema {
    /// Dotted path of the field that groups a comment under its post (`post_id`, `postId`,
    /// `meta.post`): the first definition's, the field partitions divide by and best effort
    /// reads from an event.
    pub fn group(&self) -> &str {
        &self.definitions.first().group
    }

    /// This schema with its rows grouped by `group` (the first definition's group field).
    pub fn grouped_by(self, group: &str) -> Schema {
        let first = Definition {
            group: group.into(),
            ..self.definitions.first().clone()
        };
        Schema {
            definitions: Definitions::new(first, self.definitions.extra().to_vec()),
            ..self
        }
    }

    /// This schema with `more` as the definitions after the first.
    pub fn with_more(self, more: Vec<Definition>) -> Schema {
        Schema {
            definitions: Definitions::new(self.definitions.first().clone(), more),
            ..self
        }
    }

    /// Whether definition `counter` groups rows by another field than the post, the field
    /// partitions divide by: its counters are then written by several partitions, each under
    /// its own guard (see [`crate::core::partition`]).
    pub fn shared(&self, counter: crate::core::key::CounterIx) -> bool {
        self.definitions
            .get(counter)
            .is_some_and(|d| d.group != self.group())
    }

    /// The value at a dotted `path` of `doc` (`None`: absent, or a step is not a document).
    pub fn get<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
        crate::core::key::value_at(doc, path)
    }

    /// Reads the counting-relevant fields of a comment document: a row with a usable post id,
    /// or why it has none.
    pub fn read_row(&self, doc: &Document) -> RowRead {
        match Self::get(doc, self.group()) {
            None => RowRead::NoPost,
            Some(value) => match GroupValue::from_bson(value) {
                Some(_) => RowRead::Row(self.read_existing_row(doc)),
                None => RowRead::BadPost(format!("{:?}", value.element_type())),
            },
        }
    }

    /// Reads a document that shows an existing row (a pre-image, a looked-up row), counted or
    /// not: without a usable post id the row exists but does not count (`post: None`).
    pub fn read_existing_row(&self, doc: &Document) -> Row {
        let created_at = Self::get(doc, &self.created)
            .and_then(Bson::as_datetime)
            .copied();
        let deleted = self
            .soft_delete
            .field()
            .is_some_and(|f| self.soft_delete.is_deleted(Self::get(doc, f)));
        Row {
            members: self
                .definitions
                .iter()
                .map(|(_, d)| d.member(doc))
                .collect(),
            created_at,
            deleted,
        }
    }

    /// The post id an event document names in the group field, if any (a `documentKey` on a
    /// collection sharded on it, a looked-up row, an update's new value).
    pub fn post_in(&self, doc: &Document) -> Option<GroupValue> {
        Self::get(doc, self.group()).and_then(GroupValue::from_bson)
    }

    /// Why the schema cannot be used (`None`: it can): an empty field name, a `$` in one.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let fields = [
            ("group_field", Some(self.group())),
            ("created_field", Some(self.created.as_str())),
            ("soft_delete_field", self.soft_delete.field()),
        ];
        fields.into_iter().find_map(|(setting, path)| {
            let path = path.filter(|p| bad_path(p))?;
            Some((setting, path.to_string()))
        })
    }
}

/// What is left of the dotted `path` under `parent` (`post` of `meta.post` under `meta`), if
/// it is under it (`meta.postx` is not under `meta.post`).
pub(super) fn below<'a>(path: &'a str, parent: &str) -> Option<&'a str> {
    path.strip_prefix(parent)?.strip_prefix('.')
}

/// Whether `path` cannot name a field: empty, an empty part (`a..b`), a part starting with `$`.
pub fn bad_path(path: &str) -> bool {
    path.is_empty()
        || path
            .split('.')
            .any(|part| part.is_empty() || part.starts_with('$'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    pub(super) fn js() -> Schema {
        Schema {
            created: "createdAt".into(),
            soft_delete: SoftDelete::True {
                field: "deleted".into(),
            },
            ..Schema::default().grouped_by("postId")
        }
    }

    pub(super) fn row(post: i64, deleted: bool) -> Row {
        Row::of(Some(GroupValue::Int(post)), None, deleted)
    }

    pub(super) fn unposted(deleted: bool) -> Row {
        Row::of(None, None, deleted)
    }

    #[test]
    fn dotted_paths_read_nested_fields() {
        let s = Schema::default().grouped_by("meta.post");
        assert_eq!(
            s.read_row(&doc! {"_id": 1, "meta": {"post": 7}}),
            RowRead::Row(row(7, false))
        );
        assert_eq!(s.read_row(&doc! {"_id": 1, "meta": 7}), RowRead::NoPost);
        assert_eq!(s.read_row(&doc! {"_id": 1}), RowRead::NoPost);
    }

    #[test]
    fn every_soft_delete_rule() {
        let (present, boolean) = (Schema::default(), js());
        let status = Schema {
            soft_delete: SoftDelete::OneOf {
                field: "status".into(),
                values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
            },
            ..Schema::default()
        };
        let never = Schema {
            soft_delete: SoftDelete::Never,
            ..Schema::default()
        };
        let cases = [
            (
                &present,
                doc! {"post_id": 1, "deleted_at": bson::DateTime::now()},
                true,
            ),
            (&present, doc! {"post_id": 1, "deleted_at": null}, false),
            (&boolean, doc! {"postId": 1, "deleted": true}, true),
            (&boolean, doc! {"postId": 1, "deleted": false}, false),
            (&boolean, doc! {"postId": 1, "deleted": "yes"}, false),
            (&status, doc! {"post_id": 1, "status": "spam"}, true),
            (&status, doc! {"post_id": 1, "status": "ok"}, false),
            (&status, doc! {"post_id": 1}, false),
            (&never, doc! {"post_id": 1, "deleted_at": 1}, false),
        ];
        for (schema, row, deleted) in cases {
            let read = schema.read_row(&row);
            assert!(
                matches!(read, RowRead::Row(r) if r.deleted == deleted),
                "{row}"
            );
        }
    }

    #[test]
    fn bad_field_names_are_named() {
        let bad = Schema::default().grouped_by("");
        assert_eq!(bad.problem().map(|p| p.0), Some("group_field"));
        let bad = Schema {
            created: "$x".into(),
            ..Schema::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("created_field"));
        let bad = Schema {
            soft_delete: SoftDelete::True {
                field: "a..b".into(),
            },
            ..Schema::default()
        };
        assert_eq!(bad.problem().map(|p| p.0), Some("soft_delete_field"));
        assert_eq!(Schema::default().problem(), None);
    }
}
