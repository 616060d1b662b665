//! Documents written with the schema (the demo and tests write rows, soft-delete and undelete
//! them), and the dotted-path edits that writing and applying updates share.

use bson::{Bson, DateTime, Document};

use super::{Schema, SoftDelete};
use crate::core::key::GroupValue;

impl Schema {
    /// Builds a comment document with this schema's fields (the demo and tests write rows).
    pub fn row_document(
        &self,
        id: impl Into<Bson>,
        post: &GroupValue,
        created_at: DateTime,
        deleted: bool,
    ) -> Document {
        let mut doc = bson::doc! {"_id": id.into()};
        set_path(&mut doc, self.group(), post.to_bson());
        set_path(&mut doc, &self.created, Bson::DateTime(created_at));
        if let Some((field, value)) = self.deleted_value(created_at).filter(|_| deleted) {
            set_path(&mut doc, field, value);
        }
        doc
    }

    /// The update that soft-deletes a row at `now` (`None`: the rule has no soft deletes).
    pub fn soft_delete_update(&self, now: DateTime) -> Option<Document> {
        let (field, value) = self.deleted_value(now)?;
        Some(bson::doc! {"$set": {field: value}})
    }

    /// The rule's field and the value that marks a row deleted at `now` (`None`: the rule has
    /// no soft deletes).
    fn deleted_value(&self, now: DateTime) -> Option<(&str, Bson)> {
        match &self.soft_delete {
            SoftDelete::Present { field } => Some((field, Bson::DateTime(now))),
            SoftDelete::True { field } => Some((field, Bson::Boolean(true))),
            SoftDelete::OneOf { field, values } => Some((field, values.first()?.clone())),
            SoftDelete::Never => None,
        }
    }

    /// The update that undeletes a soft-deleted row (`None`: the rule has no soft deletes).
    pub fn undelete_update(&self) -> Option<Document> {
        Some(bson::doc! {"$unset": {self.soft_delete.field()?: ""}})
    }
}

/// Removes the value at a dotted `path` (nothing when a step is missing).
pub(super) fn remove_path(doc: &mut Document, path: &str) {
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
    use super::super::tests::js;
    use super::*;
    use crate::core::event::{Row, RowRead};

    #[test]
    fn row_documents_round_trip() {
        for s in [Schema::default(), js(), js().grouped_by("a.b.c")] {
            let t = bson::DateTime::from_millis(1_700_000_000_000);
            for deleted in [false, true] {
                let d = s.row_document(1, &GroupValue::Int(5), t, deleted);
                assert_eq!(
                    s.read_row(&d),
                    RowRead::Row(Row::of(Some(GroupValue::Int(5)), Some(t), deleted)),
                    "{d}"
                );
            }
        }
    }
}
