//! [`Truth`]: the application's `comments` rows, the application's writes to them (each
//! appends its change event to the oplog), and the counts counterd checks against.

use std::collections::BTreeSet;
use std::ops::Bound;

use bson::{Bson, DateTime, Document};

use super::{seam, Memory, MemoryStore, OpKind, CREATED_FIELD, DELETED_FIELD};
use crate::core::definition::Definition;
use crate::core::event::{CommentId, Row};
use crate::core::key::CounterIx;
use crate::core::key::GroupValue;
use crate::core::num::Num;
use crate::core::schema::Schema;
use crate::store::CommentsExtent;

/// What the count queries read of a row document: (group, created_at, counts).
pub type Facts = (GroupValue, Option<DateTime>, bool);

/// (post, created_at, live) of a row document, when it counts at all (it has a post).
pub fn row_facts(row: &Document) -> Option<Facts> {
    facts_in(Schema::default().definitions.first(), row)
}

/// (group, created_at, counts) of a row document for `definition`, when it has a group there:
/// `counts` is live (not soft-deleted) and satisfying the definition's condition.
fn facts_in(definition: &Definition, row: &Document) -> Option<Facts> {
    let row = read_row(std::slice::from_ref(definition), row);
    let counts = row.counted_in(CounterIx(0)).is_some();
    Some((row.group()?.clone(), row.created_at, counts))
}

/// The row as it is, counted or not, with what it is to each definition.
fn read_row(definitions: &[Definition], row: &Document) -> Row {
    Row {
        members: definitions.iter().map(|d| d.member(row)).collect(),
        created_at: row.get(CREATED_FIELD).and_then(Bson::as_datetime).copied(),
        deleted: !matches!(row.get(DELETED_FIELD), None | Some(Bson::Null)),
    }
}

fn comment_id(id: i64) -> CommentId {
    CommentId::new(Bson::Int64(id))
}

impl Memory {
    /// (group, created_at, counts) of a row document for definition `counter`, when it has a
    /// group there (see [`facts_in`]).
    pub fn facts(&self, counter: CounterIx, row: &Document) -> Option<Facts> {
        facts_in(self.definitions.get(counter.0)?, row)
    }

    /// What a row document adds to its counter of definition `counter` where it counts: 1, or
    /// a sum's field value (0 for a missing or non-numeric one), as `$sum` adds them.
    pub fn amount(&self, counter: CounterIx, row: &Document) -> Num {
        let definition = self.definitions.get(counter.0);
        definition.map_or(Num::ONE, |d| d.member(row).amount)
    }

    /// Whether definition `counter` is a sum (its recount is the `$sum` alone, never row ids).
    fn sums(&self, counter: CounterIx) -> bool {
        let definition = self.definitions.get(counter.0);
        definition.is_some_and(|d| d.kind.field().is_some())
    }

    /// The group of a row document in definition `counter`, live or not.
    pub fn group_of(&self, counter: CounterIx, row: &Document) -> Option<GroupValue> {
        self.facts(counter, row).map(|(group, _, _)| group)
    }

    /// Groups of definition `counter` with at least one row that counts.
    pub fn live_groups(&self, counter: CounterIx) -> BTreeSet<GroupValue> {
        self.comments
            .values()
            .filter_map(|r| self.facts(counter, r))
            .filter(|(_, _, live)| *live)
            .map(|(group, _, _)| group)
            .collect()
    }

    /// `insertOne(row)` (and its insert event) at the clock.
    pub fn insert_row(&mut self, row: Document) {
        let id = row.get_i64("_id").expect("an integer _id");
        self.comments.insert(id, row.clone());
        self.append(id, OpKind::Insert(row), None);
    }

    /// `updateOne({_id}, {$set, $unset})`: no event when nothing changed, as on a real server.
    /// Returns whether the row changed.
    pub fn update(&mut self, id: i64, set: Document, unset: &[&str]) -> bool {
        let Some(old) = self.comments.get(&id).cloned() else {
            return false;
        };
        let mut new = old.clone();
        let mut updated = Document::new();
        for (k, v) in set {
            if old.get(&k) != Some(&v) {
                updated.insert(k.clone(), v.clone());
            }
            new.insert(k, v);
        }
        let mut removed = Vec::new();
        for k in unset {
            if new.remove(*k).is_some() {
                removed.push(k.to_string());
            }
        }
        if updated.is_empty() && removed.is_empty() {
            return false;
        }
        self.comments.insert(id, new);
        self.append(id, OpKind::Update { updated, removed }, Some(old));
        true
    }

    /// `replaceOne({_id}, row)`: no event when nothing changed. Returns whether it changed.
    pub fn replace_row(&mut self, id: i64, row: Document) -> bool {
        let old = self.comments.get(&id).cloned();
        if old.as_ref() == Some(&row) {
            return false;
        }
        self.comments.insert(id, row.clone());
        self.append(id, OpKind::Replace(row), old);
        true
    }

    /// `deleteOne({_id})` (and its delete event). Returns the row deleted.
    pub fn delete_row(&mut self, id: i64) -> Option<Document> {
        let old = self.comments.remove(&id)?;
        self.append(id, OpKind::Delete, Some(old.clone()));
        Some(old)
    }

    /// The rows of `post` that count for definition `counter`, those created before
    /// `watermark` (seconds) when one is given: what the count queries select.
    fn live_rows<'a>(
        &'a self,
        counter: CounterIx,
        post: &'a GroupValue,
        watermark: Option<i64>,
    ) -> impl Iterator<Item = (&'a i64, &'a Document)> {
        let below = watermark.map(|w| w.saturating_mul(1000));
        self.comments.iter().filter(move |(_, r)| {
            self.facts(counter, r).is_some_and(|(p, created, live)| {
                &p == post
                    && live
                    && below.is_none_or(|b| created.is_none_or(|c| c.timestamp_millis() < b))
            })
        })
    }

    pub fn count_live_below(&self, counter: CounterIx, post: &GroupValue, watermark: i64) -> Num {
        let rows = self.live_rows(counter, post, Some(watermark));
        rows.map(|(_, r)| self.amount(counter, r)).sum()
    }

    /// The ids of the rows `count_live_below` counts (`None`: more than `at_most`).
    pub fn live_ids_below(
        &self,
        counter: CounterIx,
        post: &GroupValue,
        watermark: i64,
        at_most: usize,
    ) -> Option<Vec<CommentId>> {
        if self.sums(counter) {
            return None; // as the MongoDB store: a sum's recount is the `$sum` alone
        }
        let ids: Vec<CommentId> = self
            .live_rows(counter, post, Some(watermark))
            .map(|(id, _)| comment_id(*id))
            .take(at_most.saturating_add(1))
            .collect();
        (ids.len() <= at_most).then_some(ids)
    }

    pub fn latest_created(&self, counter: CounterIx, post: &GroupValue) -> Option<i64> {
        self.comments
            .values()
            .filter_map(|r| self.facts(counter, r))
            .filter(|(p, _, _)| p == post)
            .filter_map(|(_, created, _)| created)
            .map(crate::core::time::secs)
            .max()
    }

    pub fn count_live(&self, counter: CounterIx, post: &GroupValue) -> Num {
        let rows = self.live_rows(counter, post, None);
        rows.map(|(_, r)| self.amount(counter, r)).sum()
    }

    pub fn rows_of_post(&self, counter: CounterIx, post: &GroupValue) -> Vec<(CommentId, Row)> {
        self.comments
            .iter()
            .filter(|(_, row)| self.group_of(counter, row).as_ref() == Some(post))
            .map(|(id, row)| (comment_id(*id), read_row(&self.definitions, row)))
            .collect()
    }

    pub fn comments_extent(&self) -> CommentsExtent {
        CommentsExtent {
            last_id: self.comments.keys().next_back().map(|id| comment_id(*id)),
            estimated_rows: self.comments.len() as u64,
        }
    }

    /// Rows with `_id` in `(after, last]`, in order (the in-process truth's ids are longs).
    pub fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> Vec<(CommentId, Row)> {
        let int = |c: &CommentId| {
            c.value
                .as_i64()
                .expect("the in-process store's ids are longs")
        };
        let from = after.map(int).map_or(Bound::Unbounded, Bound::Excluded);
        self.comments
            .range((from, Bound::Included(int(last))))
            .take(limit)
            .map(|(id, row)| (comment_id(*id), read_row(&self.definitions, row)))
            .collect()
    }
}

seam!(Truth {
    view fn count_live_below(post: &GroupValue, watermark: i64) -> Num;
    view fn live_ids_below(post: &GroupValue, watermark: i64, at_most: usize) -> Option<Vec<CommentId>>;
    view fn latest_created(post: &GroupValue) -> Option<i64>;
    view fn count_live(post: &GroupValue) -> Num;
    view fn rows_of_post(post: &GroupValue) -> Vec<(CommentId, Row)>;
    ok fn comments_extent() -> CommentsExtent;
    ok fn rows_after(after: Option<&CommentId>, last: &CommentId, limit: usize) -> Vec<(CommentId, Row)>;
});
