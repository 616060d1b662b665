//! What an update does to a row: the fields it changes, the post it moves the row to, and the
//! row after it (classification reads an update's before → after through these).

use bson::{Bson, Document};

use super::write::{remove_path, set_path};
use super::{below, Schema};
use crate::core::definition::{amount_of, Definition};
use crate::core::event::{Row, UpdateSummary};
use crate::core::key::{CounterIx, CounterKey, GroupValue, Member};
use crate::core::num::Num;

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
    /// The post an update sets the group field to, if it does.
    pub fn post_set_by(&self, update: &UpdateSummary) -> Option<GroupValue> {
        match Self::change(update, self.group()) {
            FieldChange::Set(Some(value)) => GroupValue::from_bson(&value),
            _ => None,
        }
    }

    /// The counters an update moves the row into, of every definition: each group field it
    /// sets to a usable key (the first definition's is [`Schema::post_set_by`]).
    pub fn groups_set_by(&self, update: &UpdateSummary) -> Vec<CounterKey> {
        let set = |(counter, d): (CounterIx, &Definition)| match Self::change(update, &d.group) {
            FieldChange::Set(Some(value)) => {
                Some(CounterKey::new(counter, GroupValue::from_bson(&value)?))
            }
            _ => None,
        };
        self.definitions.iter().filter_map(set).collect()
    }

    /// Best effort without a before-state: the guessed count change of an update through the
    /// soft-delete field alone (`-1`: deleted, `+1`: undeleted; a re-stamp is miscounted, a
    /// documented drift source). `None`: the update did not touch it.
    pub fn soft_delete_guess(&self, update: &UpdateSummary) -> Option<i64> {
        let FieldChange::Set(value) = Self::change(update, self.soft_delete.field()?) else {
            return None;
        };
        let deleted = self.soft_delete.is_deleted(value.as_ref());
        Some(if deleted { -1 } else { 1 })
    }

    /// Whether an update names the group field (moves the row, or changes part of it).
    pub fn moves(&self, update: &UpdateSummary) -> bool {
        Self::change(update, self.group()) != FieldChange::Unchanged
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
            } else if let Some(rest) = below(path, key) {
                // A parent was replaced: the field is whatever the new parent holds there.
                let inner = value.as_document().and_then(|d| Self::get(d, rest));
                change = FieldChange::Set(inner.cloned());
            } else if below(key, path).is_some() {
                return FieldChange::Unknown;
            }
        }
        for key in &update.removed {
            if key == path || below(path, key).is_some() {
                change = FieldChange::Set(None);
            } else if below(key, path).is_some() {
                return FieldChange::Unknown;
            }
        }
        change
    }

    /// Whether [`Schema::apply`] can derive the row after `update` from `before` alone for every
    /// counter definition: the update changes no part of a group field (but the schema's own,
    /// where [`Schema::apply`] reports it as bad input: a part of a field set makes it a
    /// document, which is no group value), and of each condition
    /// either no field or every field it reads (set or removed by name, so the verdict follows
    /// from the update alone: [`Schema::condition_set_by`]); and the row records every
    /// definition. Otherwise the after-state must come from a document (the pre-image with the
    /// update applied, or the `updateLookup` row): a ledger entry keeps whether the row matched
    /// a condition, not the fields it read.
    ///
    /// Deriving matters beyond precision: a looked-up row may be later than its event, which is
    /// harmless only while every later before-state also comes from the ledger. A later event
    /// that brings its pre-image (an event-time state) would count the change in between twice.
    pub fn derives(&self, update: &UpdateSummary, before: &Row) -> bool {
        before.members.len() >= self.definitions.len()
            && self.definitions.iter().all(|(_, definition)| {
                (definition.group == self.group()
                    || Self::change(update, &definition.group) != FieldChange::Unknown)
                    && definition
                        .kind
                        .field()
                        .is_none_or(|f| Self::change(update, f) != FieldChange::Unknown)
                    && (Self::condition_untouched(update, definition)
                        || Self::condition_set_by(update, definition).is_some())
            })
    }

    /// Whether `update` touches no field `definition`'s condition reads.
    fn condition_untouched(update: &UpdateSummary, definition: &Definition) -> bool {
        definition
            .condition
            .paths()
            .into_iter()
            .all(|path| Self::change(update, path) == FieldChange::Unchanged)
    }

    /// The fields `definition`'s condition reads, as `update` leaves them, when it sets or
    /// removes every one of them by name (`None` otherwise: a field it does not name, or names
    /// only through a parent or a part, keeps a value the ledger does not know).
    fn condition_set_by(update: &UpdateSummary, definition: &Definition) -> Option<Document> {
        let mut fields = Document::new();
        for path in definition.condition.paths() {
            if let Some(value) = update.set.get(path) {
                set_path(&mut fields, path, value.clone());
            } else if !update.removed.iter().any(|r| r == path) {
                return None;
            }
            if Self::change(update, path) == FieldChange::Unknown {
                return None;
            }
        }
        Some(fields)
    }

    /// The row after `update`, derived from the row before it: exact at event time, unlike an
    /// `updateLookup` document, also for a row without a post (one that gets a post back is
    /// then filed under its own creation time). `Err`: the group field now holds a value that
    /// cannot be a post id (its type, beside the row, which exists but no longer counts).
    pub fn apply(&self, update: &UpdateSummary, before: &Row) -> Result<Row, (Row, String)> {
        let bad = match Self::change(update, self.group()) {
            FieldChange::Set(Some(value)) if GroupValue::from_bson(&value).is_none() => {
                Some(format!("{:?}", value.element_type()))
            }
            FieldChange::Unknown => Some("Document (a part of it changed)".into()),
            FieldChange::Unchanged | FieldChange::Set(_) => None,
        };
        let created_at = match Self::change(update, &self.created) {
            FieldChange::Unchanged => before.created_at,
            FieldChange::Set(Some(Bson::DateTime(d))) => Some(d),
            FieldChange::Set(_) | FieldChange::Unknown => None,
        };
        let deleted = match self.soft_delete.field().map(|f| Self::change(update, f)) {
            None => false,
            Some(FieldChange::Set(value)) => self.soft_delete.is_deleted(value.as_ref()),
            Some(FieldChange::Unchanged | FieldChange::Unknown) => before.deleted,
        };
        let members = self.definitions.iter().map(|(counter, definition)| {
            let before = before.members.get(counter.0).cloned().unwrap_or_default();
            Self::member_after(update, definition, before)
        });
        let row = Row {
            members: members.collect(),
            created_at,
            deleted,
        };
        match bad {
            None => Ok(row),
            Some(kind) => Err((row, kind)),
        }
    }

    /// What the row is to `definition` after `update`, from what it was (`before`). Callers
    /// check `derives` first: a condition's fields are untouched (the verdict stays) or all
    /// named by the update (the verdict is decided again from them).
    fn member_after(update: &UpdateSummary, definition: &Definition, before: Member) -> Member {
        let (amount, not_a_number) = match definition.kind.field() {
            None => (Num::ONE, None),
            Some(field) => match Self::change(update, field) {
                FieldChange::Set(value) => amount_of(value.as_ref()),
                // `derives` said the field is untouched or named whole.
                FieldChange::Unchanged | FieldChange::Unknown => (before.amount, None),
            },
        };
        Member {
            amount,
            not_a_number,
            group: match Self::change(update, &definition.group) {
                FieldChange::Unchanged => before.group,
                FieldChange::Set(value) => value.as_ref().and_then(GroupValue::from_bson),
                FieldChange::Unknown => None,
            },
            matches: match Self::condition_set_by(update, definition) {
                Some(fields) if !Self::condition_untouched(update, definition) => {
                    definition.condition.matches(&fields)
                }
                _ => before.matches,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{js, row, unposted};
    use super::*;
    use bson::doc;

    fn update(set: Document, removed: &[&str]) -> UpdateSummary {
        UpdateSummary {
            set,
            removed: removed.iter().map(|s| s.to_string()).collect(),
            complete: true,
        }
    }

    /// An update that sets `fields` and removes none.
    fn set(fields: Document) -> UpdateSummary {
        update(fields, &[])
    }

    #[test]
    fn updates_apply_through_the_schema() {
        let s = js();
        let before = row(1, false);
        let applied = [
            (set(doc! {"deleted": true}), &before, row(1, true)),
            (update(doc! {}, &["deleted"]), &row(1, true), row(1, false)),
            (set(doc! {"postId": 2}), &before, row(2, false)),
            (update(doc! {}, &["postId"]), &before, unposted(false)),
            (set(doc! {"body": "x"}), &before, before.clone()),
        ];
        for (change, from, to) in applied {
            assert_eq!(s.apply(&change, from), Ok(to), "{change:?}");
        }
        assert_eq!(s.soft_delete_guess(&set(doc! {"deleted": true})), Some(-1));
        assert_eq!(s.soft_delete_guess(&update(doc! {}, &["deleted"])), Some(1));
        assert_eq!(s.soft_delete_guess(&set(doc! {"body": 1})), None);
        assert_eq!(
            s.post_set_by(&set(doc! {"postId": 9})),
            Some(GroupValue::Int(9))
        );
        assert!(s.apply(&set(doc! {"postId": 2.5}), &before).is_err());
    }

    #[test]
    fn updates_of_a_parent_or_a_child_of_a_dotted_field() {
        let s = Schema::default().grouped_by("meta.post");
        let before = row(1, false);
        let applied = [
            (set(doc! {"meta": {"post": 3}}), row(3, false)),
            (set(doc! {"meta.post": 4}), row(4, false)),
            (update(doc! {}, &["meta"]), unposted(false)),
            (set(doc! {"meta.other": 1}), before.clone()),
        ];
        for (change, to) in applied {
            assert_eq!(s.apply(&change, &before), Ok(to), "{change:?}");
        }
        let after = Schema::apply_to_document(
            &update(doc! {"meta.post": 4}, &["meta.old"]),
            &doc! {"_id": 1, "meta": {"post": 1, "old": 2}},
        );
        assert_eq!(after, doc! {"_id": 1, "meta": {"post": 4}});
        assert!(s.apply(&set(doc! {"meta.post.x": 1}), &before).is_err());
    }

    fn with_definitions() -> Schema {
        js().with_more(vec![
            Definition::count("approved", "postId", doc! {"approved": true}),
            Definition::count("per_author", "author.id", doc! {}),
        ])
    }

    #[test]
    fn an_update_of_a_condition_field_is_derived_only_when_it_names_every_field_read() {
        let s = with_definitions();
        let before =
            s.read_existing_row(&doc! {"postId": 1, "approved": false, "author": {"id": "ann"}});
        assert_eq!(before.members.len(), 3);
        assert!(s.derives(&set(doc! {"deleted": true, "body": "x"}), &before));
        assert!(s.derives(&set(doc! {"author": {"id": "bob"}}), &before));
        // The condition reads `approved` alone: an update that sets or removes it decides it.
        let approve = set(doc! {"approved": true});
        assert!(s.derives(&approve, &before));
        assert!(s.apply(&approve, &before).unwrap().members[1].matches);
        let unapprove = update(doc! {}, &["approved"]);
        let approved = s.apply(&approve, &before).unwrap();
        assert!(s.derives(&unapprove, &approved));
        assert!(!s.apply(&unapprove, &approved).unwrap().members[1].matches);
        assert!(
            !s.derives(&set(doc! {"approved.by": "x"}), &before),
            "a part of a condition's field changed"
        );
        // A condition over two fields, one of them not named: the other's value is unknown.
        let recent = doc! {"approved": true, "score": {"$gt": 3}};
        let two = js().with_more(vec![Definition::count("approved_recent", "postId", recent)]);
        let before = two.read_existing_row(&doc! {"postId": 1, "approved": false, "score": 5});
        assert!(!two.derives(&set(doc! {"approved": true}), &before));
        let both = set(doc! {"approved": true, "score": 1});
        assert!(two.derives(&both, &before));
        assert!(!two.apply(&both, &before).unwrap().members[1].matches);
        assert!(
            !s.derives(&set(doc! {"author.id.x": 1}), &before),
            "a part of a group field changed"
        );
        let old = Row {
            members: before.members[..1].to_vec(),
            ..before.clone()
        };
        assert!(
            !s.derives(&set(doc! {"body": "x"}), &old),
            "an entry written before the definitions existed says nothing about them"
        );
    }

    #[test]
    fn a_derived_row_follows_its_group_fields_in_every_definition() {
        let s = with_definitions();
        let before =
            s.read_existing_row(&doc! {"postId": 1, "approved": true, "author": {"id": "ann"}});
        let moved = set(doc! {"author": {"id": "bob"}, "postId": 2});
        let after = s.apply(&moved, &before).unwrap();
        assert_eq!(after.group(), Some(&GroupValue::Int(2)));
        assert_eq!(after.members[1].group, Some(GroupValue::Int(2)));
        assert!(after.members[1].matches, "the condition's verdict is kept");
        assert_eq!(after.members[2].group, Some(GroupValue::Str("bob".into())));
        let keys = s.groups_set_by(&moved);
        assert_eq!(keys.len(), 3, "{keys:?}");
    }
}
