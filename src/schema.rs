//! Pure: the application's schema, from settings. Which field groups a comment under its post,
//! which holds its creation time, and which rule says it is soft-deleted. Classification, the
//! ledger, every count query, the snapshot and the demo read rows through this one definition;
//! nothing else in the code names the application's fields.
//!
//! A row *counts* when it exists, its group field holds a post id (an integer, a string or an
//! ObjectId; a double, an array, a document or a missing field does not count), and the
//! soft-delete rule does not say it is deleted.

use bson::{Bson, DateTime, Document};
use serde::{Deserialize, Serialize};

use crate::event::{PostId, Row, RowRead, UpdateSummary};

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

/// The application's field names and soft-delete rule.
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    /// Dotted path of the post a comment belongs to (`post_id`, `postId`, `meta.post`).
    pub group: String,
    /// Dotted path of the creation time (`created_at`); a row without a date there is filed
    /// under bucket 0, below every watermark, and still counted.
    pub created: String,
    pub soft_delete: SoftDelete,
}

/// What an update did to one field, as far as its description says.
#[derive(Clone, Debug, PartialEq)]
pub enum FieldChange {
    /// The update did not touch the field.
    Unchanged,
    /// The field's new value (`None`: removed).
    Set(Option<Bson>),
    /// A part of the field changed (a sub-path of it): its new value is not known from here.
    Unknown,
}

impl Schema {
    /// The value at a dotted `path` of `doc` (`None`: absent, or a step is not a document).
    pub fn get<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
        let mut current = doc;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            let value = current.get(part)?;
            if parts.peek().is_none() {
                return Some(value);
            }
            current = value.as_document()?;
        }
        None
    }

    /// Reads the counting-relevant fields of a comment document: a row with a usable post id,
    /// or why it has none.
    pub fn read_row(&self, doc: &Document) -> RowRead {
        match Self::get(doc, &self.group) {
            None => RowRead::NoPost,
            Some(value) => match PostId::from_bson(value) {
                Some(_) => RowRead::Row(self.read_existing_row(doc)),
                None => RowRead::BadPost(format!("{:?}", value.element_type())),
            },
        }
    }

    /// Reads a document that shows an existing row (a pre-image, a looked-up row), counted or
    /// not: without a usable post id the row exists but does not count (`post: None`).
    pub fn read_existing_row(&self, doc: &Document) -> Row {
        let created_at = match Self::get(doc, &self.created) {
            Some(Bson::DateTime(d)) => Some(*d),
            _ => None,
        };
        let deleted = self
            .soft_delete
            .field()
            .is_some_and(|f| self.soft_delete.is_deleted(Self::get(doc, f)));
        Row {
            post: Self::get(doc, &self.group).and_then(PostId::from_bson),
            created_at,
            deleted,
        }
    }

    /// Reads a looked-up `fullDocument` of an update event. A document without `_id` is not a
    /// row but the fragment the fake server returns when the row is already gone: no
    /// information.
    pub fn read_looked_up_row(&self, doc: &Document) -> Option<RowRead> {
        doc.contains_key("_id").then(|| self.read_row(doc))
    }

    /// The post id an event document names in the group field, if any (a `documentKey` on a
    /// collection sharded on it, a looked-up row, an update's new value).
    pub fn post_in(&self, doc: &Document) -> Option<PostId> {
        Self::get(doc, &self.group).and_then(PostId::from_bson)
    }

    /// The post an update sets the group field to, if it does.
    pub fn post_set_by(&self, update: &UpdateSummary) -> Option<PostId> {
        match Self::change(update, &self.group) {
            FieldChange::Set(Some(value)) => PostId::from_bson(&value),
            _ => None,
        }
    }

    /// Best effort without a before-state: the guessed count change of an update through the
    /// soft-delete field alone (`-1`: deleted, `+1`: undeleted; a re-stamp is miscounted, a
    /// documented drift source). `None`: the update did not touch it.
    pub fn soft_delete_guess(&self, update: &UpdateSummary) -> Option<i64> {
        match Self::change(update, self.soft_delete.field()?) {
            FieldChange::Set(value) => Some(if self.soft_delete.is_deleted(value.as_ref()) {
                -1
            } else {
                1
            }),
            FieldChange::Unchanged | FieldChange::Unknown => None,
        }
    }

    /// Whether an update names the group field (moves the row, or changes part of it).
    pub fn moves(&self, update: &UpdateSummary) -> bool {
        Self::change(update, &self.group) != FieldChange::Unchanged
    }

    /// A document after `update`, from the document before it (dotted paths included).
    pub fn apply_to_document(update: &UpdateSummary, before: &Document) -> Document {
        let mut after = before.clone();
        for (key, value) in &update.set {
            set_path(&mut after, key, value.clone());
        }
        for key in &update.removed {
            remove_path(&mut after, key);
        }
        after
    }

    /// What `update` did to the field at `path`.
    pub fn change(update: &UpdateSummary, path: &str) -> FieldChange {
        let mut change = FieldChange::Unchanged;
        for (key, value) in &update.set {
            if key == path {
                change = FieldChange::Set(Some(value.clone()));
            } else if let Some(rest) = path
                .strip_prefix(key.as_str())
                .and_then(|r| r.strip_prefix('.'))
            {
                // A parent was replaced: the field is whatever the new parent holds there.
                let inner = value.as_document().and_then(|d| Self::get(d, rest));
                change = FieldChange::Set(inner.cloned());
            } else if key.strip_prefix(path).is_some_and(|r| r.starts_with('.')) {
                return FieldChange::Unknown;
            }
        }
        for key in &update.removed {
            let covers = key == path
                || path
                    .strip_prefix(key.as_str())
                    .is_some_and(|r| r.starts_with('.'));
            if covers {
                change = FieldChange::Set(None);
            } else if key.strip_prefix(path).is_some_and(|r| r.starts_with('.')) {
                return FieldChange::Unknown;
            }
        }
        change
    }

    /// Whether an update may have changed whether or where a row counts (its group field or
    /// its soft-delete field; the creation time only moves a row between buckets).
    pub fn touches_counting(&self, update: &UpdateSummary) -> bool {
        let touched = |path: &str| Self::change(update, path) != FieldChange::Unchanged;
        touched(&self.group) || self.soft_delete.field().is_some_and(touched)
    }

    /// The row after `update`, derived from the row before it: exact at event time, unlike an
    /// `updateLookup` document, also for a row without a post (one that gets a post back is
    /// then filed under its own creation time). `Err`: the group field now holds a value that
    /// cannot be a post id (its type, beside the row, which exists but no longer counts).
    pub fn apply(&self, update: &UpdateSummary, before: &Row) -> Result<Row, (Row, String)> {
        let mut bad = None;
        let post = match Self::change(update, &self.group) {
            FieldChange::Unchanged => before.post.clone(),
            FieldChange::Set(None) => None,
            FieldChange::Set(Some(value)) => match PostId::from_bson(&value) {
                Some(p) => Some(p),
                None => {
                    bad = Some(format!("{:?}", value.element_type()));
                    None
                }
            },
            FieldChange::Unknown => {
                bad = Some("Document (a part of it changed)".into());
                None
            }
        };
        let created_at = match Self::change(update, &self.created) {
            FieldChange::Unchanged => before.created_at,
            FieldChange::Set(Some(Bson::DateTime(d))) => Some(d),
            FieldChange::Set(_) | FieldChange::Unknown => None,
        };
        let deleted = match self.soft_delete.field() {
            None => false,
            Some(field) => match Self::change(update, field) {
                FieldChange::Unchanged => before.deleted,
                FieldChange::Set(value) => self.soft_delete.is_deleted(value.as_ref()),
                FieldChange::Unknown => before.deleted,
            },
        };
        let row = Row {
            post,
            created_at,
            deleted,
        };
        match bad {
            None => Ok(row),
            Some(kind) => Err((row, kind)),
        }
    }

    /// Builds a comment document with this schema's fields (the demo and tests write rows).
    pub fn row_document(
        &self,
        id: impl Into<Bson>,
        post: &PostId,
        created_at: DateTime,
        deleted: bool,
    ) -> Document {
        let mut doc = bson::doc! {"_id": id.into()};
        set_path(&mut doc, &self.group, post.to_bson());
        set_path(&mut doc, &self.created, Bson::DateTime(created_at));
        if deleted {
            match &self.soft_delete {
                SoftDelete::Present { field } => {
                    set_path(&mut doc, field, Bson::DateTime(created_at))
                }
                SoftDelete::True { field } => set_path(&mut doc, field, Bson::Boolean(true)),
                SoftDelete::OneOf { field, values } => {
                    if let Some(v) = values.first() {
                        set_path(&mut doc, field, v.clone())
                    }
                }
                SoftDelete::Never => {}
            }
        }
        doc
    }

    /// The update that soft-deletes a row at `now` (`None`: the rule has no soft deletes).
    pub fn soft_delete_update(&self, now: DateTime) -> Option<Document> {
        let (field, value) = match &self.soft_delete {
            SoftDelete::Present { field } => (field, Bson::DateTime(now)),
            SoftDelete::True { field } => (field, Bson::Boolean(true)),
            SoftDelete::OneOf { field, values } => (field, values.first()?.clone()),
            SoftDelete::Never => return None,
        };
        Some(bson::doc! {"$set": {field: value}})
    }

    /// The update that undeletes a soft-deleted row (`None`: the rule has no soft deletes).
    pub fn undelete_update(&self) -> Option<Document> {
        Some(bson::doc! {"$unset": {self.soft_delete.field()?: ""}})
    }

    /// Why the schema cannot be used (`None`: it can): an empty field name, a `$` in one.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let bad_path = |p: &str| {
            p.is_empty()
                || p.split('.')
                    .any(|part| part.is_empty() || part.starts_with('$'))
        };
        if bad_path(&self.group) {
            return Some(("group_field", self.group.clone()));
        }
        if bad_path(&self.created) {
            return Some(("created_field", self.created.clone()));
        }
        if let Some(field) = self.soft_delete.field() {
            if bad_path(field) {
                return Some(("soft_delete_field", field.to_string()));
            }
        }
        None
    }
}

/// Removes the value at a dotted `path` (nothing when a step is missing).
fn remove_path(doc: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            doc.remove(path);
        }
        Some((head, rest)) => {
            if let Some(Bson::Document(inner)) = doc.get_mut(head) {
                remove_path(inner, rest);
            }
        }
    }
}

/// Sets `value` at a dotted `path`, creating sub-documents.
pub fn set_path(doc: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
        }
        Some((head, rest)) => {
            if !matches!(doc.get(head), Some(Bson::Document(_))) {
                doc.insert(head, Document::new());
            }
            if let Some(Bson::Document(inner)) = doc.get_mut(head) {
                set_path(inner, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn js() -> Schema {
        Schema {
            group: "postId".into(),
            created: "createdAt".into(),
            soft_delete: SoftDelete::True {
                field: "deleted".into(),
            },
        }
    }

    fn row(post: i64, deleted: bool) -> Row {
        Row {
            post: Some(PostId::Int(post)),
            created_at: None,
            deleted,
        }
    }

    fn unposted(deleted: bool) -> Row {
        Row {
            post: None,
            created_at: None,
            deleted,
        }
    }

    #[test]
    fn dotted_paths_read_nested_fields() {
        let s = Schema {
            group: "meta.post".into(),
            ..Schema::default()
        };
        assert_eq!(
            s.read_row(&doc! {"_id": 1, "meta": {"post": 7}}),
            RowRead::Row(row(7, false))
        );
        assert_eq!(s.read_row(&doc! {"_id": 1, "meta": 7}), RowRead::NoPost);
        assert_eq!(s.read_row(&doc! {"_id": 1}), RowRead::NoPost);
    }

    #[test]
    fn every_soft_delete_rule() {
        let present = Schema::default();
        assert!(
            matches!(present.read_row(&doc! {"post_id": 1, "deleted_at": bson::DateTime::now()}), RowRead::Row(r) if r.deleted)
        );
        assert!(
            matches!(present.read_row(&doc! {"post_id": 1, "deleted_at": null}), RowRead::Row(r) if !r.deleted)
        );
        let boolean = js();
        assert!(
            matches!(boolean.read_row(&doc! {"postId": 1, "deleted": true}), RowRead::Row(r) if r.deleted)
        );
        assert!(
            matches!(boolean.read_row(&doc! {"postId": 1, "deleted": false}), RowRead::Row(r) if !r.deleted)
        );
        assert!(
            matches!(boolean.read_row(&doc! {"postId": 1, "deleted": "yes"}), RowRead::Row(r) if !r.deleted)
        );
        let status = Schema {
            soft_delete: SoftDelete::OneOf {
                field: "status".into(),
                values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
            },
            ..Schema::default()
        };
        assert!(
            matches!(status.read_row(&doc! {"post_id": 1, "status": "spam"}), RowRead::Row(r) if r.deleted)
        );
        assert!(
            matches!(status.read_row(&doc! {"post_id": 1, "status": "ok"}), RowRead::Row(r) if !r.deleted)
        );
        assert!(matches!(status.read_row(&doc! {"post_id": 1}), RowRead::Row(r) if !r.deleted));
        let never = Schema {
            soft_delete: SoftDelete::Never,
            ..Schema::default()
        };
        assert!(
            matches!(never.read_row(&doc! {"post_id": 1, "deleted_at": 1}), RowRead::Row(r) if !r.deleted)
        );
    }

    fn update(set: Document, removed: &[&str]) -> UpdateSummary {
        UpdateSummary {
            set,
            removed: removed.iter().map(|s| s.to_string()).collect(),
            complete: true,
        }
    }

    #[test]
    fn updates_apply_through_the_schema() {
        let s = js();
        let before = row(1, false);
        assert_eq!(
            s.apply(&update(doc! {"deleted": true}, &[]), &before),
            Ok(row(1, true))
        );
        assert_eq!(
            s.apply(&update(doc! {}, &["deleted"]), &row(1, true)),
            Ok(row(1, false))
        );
        assert_eq!(
            s.apply(&update(doc! {"postId": 2}, &[]), &before),
            Ok(row(2, false))
        );
        assert_eq!(
            s.apply(&update(doc! {}, &["postId"]), &before),
            Ok(unposted(false))
        );
        assert_eq!(
            s.soft_delete_guess(&update(doc! {"deleted": true}, &[])),
            Some(-1)
        );
        assert_eq!(s.soft_delete_guess(&update(doc! {}, &["deleted"])), Some(1));
        assert_eq!(s.soft_delete_guess(&update(doc! {"body": 1}, &[])), None);
        assert_eq!(
            s.post_set_by(&update(doc! {"postId": 9}, &[])),
            Some(PostId::Int(9))
        );
        assert!(s
            .apply(&update(doc! {"postId": 2.5}, &[]), &before)
            .is_err());
        assert_eq!(
            s.apply(&update(doc! {"body": "x"}, &[]), &before),
            Ok(before.clone())
        );
        assert!(!s.touches_counting(&update(doc! {"body": "x", "createdAt": 1}, &[])));
        assert!(s.touches_counting(&update(doc! {"deleted": false}, &[])));
    }

    #[test]
    fn updates_of_a_parent_or_a_child_of_a_dotted_field() {
        let s = Schema {
            group: "meta.post".into(),
            ..Schema::default()
        };
        let before = row(1, false);
        assert_eq!(
            s.apply(&update(doc! {"meta": {"post": 3}}, &[]), &before),
            Ok(row(3, false))
        );
        assert_eq!(
            s.apply(&update(doc! {"meta.post": 4}, &[]), &before),
            Ok(row(4, false))
        );
        assert_eq!(
            s.apply(&update(doc! {}, &["meta"]), &before),
            Ok(unposted(false))
        );
        let after = Schema::apply_to_document(
            &update(doc! {"meta.post": 4}, &["meta.old"]),
            &doc! {"_id": 1, "meta": {"post": 1, "old": 2}},
        );
        assert_eq!(after, doc! {"_id": 1, "meta": {"post": 4}});
        assert!(s
            .apply(&update(doc! {"meta.post.x": 1}, &[]), &before)
            .is_err());
        assert_eq!(
            s.apply(&update(doc! {"meta.other": 1}, &[]), &before),
            Ok(before.clone())
        );
    }

    #[test]
    fn row_documents_round_trip() {
        for s in [
            Schema::default(),
            js(),
            Schema {
                group: "a.b.c".into(),
                ..js()
            },
        ] {
            let t = bson::DateTime::from_millis(1_700_000_000_000);
            for deleted in [false, true] {
                let d = s.row_document(1, &PostId::Int(5), t, deleted);
                assert_eq!(
                    s.read_row(&d),
                    RowRead::Row(Row {
                        post: Some(PostId::Int(5)),
                        created_at: Some(t),
                        deleted
                    }),
                    "{d}"
                );
            }
        }
    }

    #[test]
    fn bad_field_names_are_named() {
        let bad = Schema {
            group: String::new(),
            ..Schema::default()
        };
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
