//! The change-event model: what one `comments` change event says, parsed leniently from the raw
//! document so that one malformed event can be reported and skipped without breaking the stream.
//!
//! Two shapes are understood: the one a real MongoDB 6/7 emits (with `updateDescription`,
//! optional `fullDocument` and `fullDocumentBeforeChange`) and the one the fake test server
//! (mongo-java-server) emits (update events carry the update spec in `documentKey`, no
//! `updateDescription`, replaces reported as updates). An event of a multi-document
//! transaction also carries `lsid` and `txnNumber` (real servers only; see [`crate::core::txn`]).

use std::collections::HashMap;
use std::fmt;

use bson::{Bson, DateTime, Document, Timestamp};
use serde::{Deserialize, Serialize};

use crate::core::key::{CounterIx, GroupValue, Member};
use crate::core::num::Num;
use crate::core::txn::TxnKey;

/// A position in the change stream: the resume token's `_data` string.
///
/// Tokens of one deployment sort in event order when compared as strings (MongoDB 4.0.7+), which
/// is what makes the per-post `applied_through` guard a plain `$lt` comparison.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Token(pub String);

impl Token {
    /// The smallest position: before every real token.
    pub fn origin() -> Token {
        Token(String::new())
    }

    /// Reads `_data` out of a resume-token document `{_data: "<hex>"}` (a string: very old
    /// servers used BinData tokens, which do not sort, so they are refused).
    pub fn from_resume_document(doc: &Document) -> Option<Token> {
        doc.get_str("_data").ok().map(|s| Token(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A comment's identity (its `_id`, of any BSON type) with a hashable key derived from it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommentId {
    /// Canonical extended-JSON text of the `_id`: equal ids give equal keys.
    pub key: String,
    pub value: Bson,
}

impl CommentId {
    pub fn new(value: Bson) -> CommentId {
        CommentId {
            key: canonical_key(&value),
            value,
        }
    }
}

/// The canonical extended-JSON text of an id: the common id types (ObjectId, 32- and 64-bit
/// integers) written directly, as `into_canonical_extjson` would write them, without its JSON
/// tree (one per event read and per row id written); every other type through it.
fn canonical_key(value: &Bson) -> String {
    match value {
        Bson::ObjectId(oid) => format!("{{\"$oid\":\"{}\"}}", oid.to_hex()),
        Bson::Int32(n) => format!("{{\"$numberInt\":\"{n}\"}}"),
        Bson::Int64(n) => format!("{{\"$numberLong\":\"{n}\"}}"),
        other => other.clone().into_canonical_extjson().to_string(),
    }
}

/// What counting needs to know about one comment row that exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// What the row is to each counter definition, by its place (`members[i]` is definition
    /// `i`'s, see [`crate::core::definition`]): its group key and whether it satisfies the
    /// condition. Kept in the ledger with the rest of the row, so the next event's
    /// before-state needs no document. Shorter than the definitions (an entry written before a
    /// definition existed): the row counts nowhere for the missing ones.
    pub members: Vec<Member>,
    /// `None` when the row has no creation date: filed under the oldest bucket.
    pub created_at: Option<DateTime>,
    /// Soft-deleted, by the schema's rule ([`crate::core::schema::SoftDelete`]).
    pub deleted: bool,
}

impl Row {
    /// A row known to one count definition only, grouped under `group` (`None`: the row has
    /// no usable key there and counts nowhere, but its other fields are known, so a later
    /// update that gives it a group is derived exactly).
    pub fn of(group: Option<GroupValue>, created_at: Option<DateTime>, deleted: bool) -> Row {
        Row {
            members: vec![Member::counting(group, true)],
            created_at,
            deleted,
        }
    }

    /// The group the row counts in for definition `counter`, if it counts there (see
    /// [`Member::counts`]).
    pub fn counted_in(&self, counter: CounterIx) -> Option<&GroupValue> {
        self.members.get(counter.0)?.counts(self.deleted)
    }

    /// The group the row counts in for definition `counter` and what it adds there: 1 for a
    /// count, the summed field's value for a sum.
    pub fn contribution(&self, counter: CounterIx) -> Option<(&GroupValue, Num)> {
        let member = self.members.get(counter.0)?;
        member.counts(self.deleted).map(|g| (g, member.amount))
    }

    /// The row's group key for definition `counter`, counted or not (a group to mark dirty).
    pub fn group_in(&self, counter: CounterIx) -> Option<&GroupValue> {
        self.members.get(counter.0)?.group.as_ref()
    }

    /// The row's key in the schema's own group field (definition 0's, the field partitions
    /// divide by and best effort reads from an event).
    pub fn group(&self) -> Option<&GroupValue> {
        self.group_in(CounterIx(0))
    }

    /// Every definition the row says something about.
    pub fn counters(&self) -> impl Iterator<Item = CounterIx> {
        (0..self.members.len()).map(CounterIx)
    }

    /// Whether the row counts in its own group field's definition (see [`Row::group`]).
    pub fn is_live(&self) -> bool {
        self.counted_in(CounterIx(0)).is_some()
    }
}

/// What a document says about the row it shows.
#[derive(Clone, Debug, PartialEq)]
pub enum RowRead {
    /// A row with a usable `post_id`.
    Row(Row),
    /// No `post_id` field at all: either a row outside counting or (on the fake server) the
    /// fragment `updateLookup` returns for a deleted row.
    NoPost,
    /// `post_id` with a type that cannot be a post id.
    BadPost(String),
}

/// What an update changed, as far as the event says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpdateSummary {
    /// Fields set, with their new values (`updatedFields`, or `$set` in the fake's spec).
    pub set: Document,
    /// Fields removed (`removedFields`, or `$unset` in the fake's spec).
    pub removed: Vec<String>,
    /// True for a server's `updateDescription`, which is complete; false for the fake server's
    /// update spec, which may use operators counterd does not read (`$currentDate`, `$rename`).
    pub complete: bool,
}

/// The operation of a change event.
#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    Insert,
    Update {
        /// `None` when the server sent no update description (the fake, or a replace).
        summary: Option<UpdateSummary>,
    },
    Replace,
    Delete,
    /// `drop`, `rename`, `dropDatabase`, `invalidate`: the stream can no longer be trusted.
    End(String),
    /// An operation type this version does not know.
    Unknown(String),
}

/// One change event, parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct ChangeEvent {
    pub token: Token,
    pub cluster_time: Option<Timestamp>,
    pub operation: Operation,
    /// The comment's `_id` (from `documentKey`), absent for stream-ending events.
    pub comment: Option<CommentId>,
    /// `documentKey` as sent (on a sharded cluster it holds the shard key too).
    pub document_key: Document,
    /// `fullDocument`: the inserted/replacing row, or (`updateLookup`) the row as it is at lookup
    /// time, which may be later than the event.
    pub full_document: Option<Document>,
    /// `fullDocumentBeforeChange`: the pre-image, when enabled and not expired.
    pub pre_image: Option<Document>,
    /// The multi-document transaction the event belongs to (`lsid` + `txnNumber`), `None`
    /// outside one. A batch never ends between two events of one transaction (see
    /// [`crate::core::txn`]).
    pub txn: Option<TxnKey>,
}

/// Why an event document could not be parsed at all.
#[derive(Clone, Debug, thiserror::Error, PartialEq)]
pub enum EventError {
    #[error("change event has no resume token (_id._data)")]
    NoToken,
    #[error("change event {token} has no operationType")]
    NoOperation { token: Token },
    #[error("change event {token} ({operation}) has no documentKey._id")]
    NoDocumentKey { token: Token, operation: String },
}

/// The fields of a change event a source has read, from a document or straight from raw BSON
/// (the MongoDB store's stream reads its events that way, without a document of the whole
/// event: see `store::mongo::stream`). A field that is missing, or not of its type, is `None`.
#[derive(Clone, Debug, Default)]
pub struct EventParts<'a> {
    /// `_id._data`.
    pub token: Option<Token>,
    pub operation_type: Option<&'a str>,
    pub cluster_time: Option<Timestamp>,
    /// `lsid` + `txnNumber` (see [`TxnKey`]).
    pub txn: Option<TxnKey>,
    pub document_key: Option<Document>,
    pub full_document: Option<Document>,
    pub pre_image: Option<Document>,
    /// `updateDescription`, when it is a document.
    pub update_description: Option<Document>,
}

impl ChangeEvent {
    /// Parses a raw change event document (see [`ChangeEvent::from_document`], which takes it
    /// apart instead of copying its parts).
    pub fn parse(doc: &Document) -> Result<ChangeEvent, EventError> {
        ChangeEvent::from_document(doc.clone())
    }

    /// Parses a raw change event document, moving its rows into the event.
    pub fn from_document(mut doc: Document) -> Result<ChangeEvent, EventError> {
        let mut take = |field: &str| match doc.remove(field) {
            Some(Bson::Document(d)) => Some(d),
            _ => None,
        };
        // The rows are moved out first; the rest is read from what remains.
        ChangeEvent::from_parts(EventParts {
            document_key: take("documentKey"),
            full_document: take("fullDocument"),
            pre_image: take("fullDocumentBeforeChange"),
            update_description: take("updateDescription"),
            token: (doc.get_document("_id").ok()).and_then(Token::from_resume_document),
            operation_type: doc.get_str("operationType").ok(),
            cluster_time: doc.get_timestamp("clusterTime").ok(),
            txn: TxnKey::of_event(&doc),
        })
    }

    /// The event of `parts`, or why it cannot be one.
    pub fn from_parts(parts: EventParts<'_>) -> Result<ChangeEvent, EventError> {
        let token = parts.token.ok_or(EventError::NoToken)?;
        let op_name = parts
            .operation_type
            .ok_or_else(|| EventError::NoOperation {
                token: token.clone(),
            })?;
        let document_key = parts.document_key.unwrap_or_default();
        let full_document = parts.full_document;
        let operation = match op_name {
            "insert" => Operation::Insert,
            "update" => Operation::Update {
                summary: update_summary(parts.update_description, &document_key),
            },
            "replace" => Operation::Replace,
            "delete" => Operation::Delete,
            "drop" | "rename" | "dropDatabase" | "invalidate" => Operation::End(op_name.into()),
            _ => Operation::Unknown(op_name.into()),
        };
        // The fake server's update events carry the update spec in `documentKey` and no `_id`;
        // the looked-up `fullDocument` (a real row has `_id`) names the comment instead. When
        // neither does, the row was deleted before the lookup and its delete event settles it.
        let comment = document_key
            .get("_id")
            .or_else(|| full_document.as_ref().and_then(|d| d.get("_id")))
            .cloned()
            .map(CommentId::new);
        let needs_key = matches!(
            operation,
            Operation::Insert | Operation::Replace | Operation::Delete
        );
        if needs_key && comment.is_none() {
            return Err(EventError::NoDocumentKey {
                token,
                operation: op_name.into(),
            });
        }
        Ok(ChangeEvent {
            token,
            cluster_time: parts.cluster_time,
            operation,
            comment,
            document_key,
            full_document,
            pre_image: parts.pre_image,
            txn: parts.txn,
        })
    }

    /// The looked-up row an update event carries (`fullDocument` with `_id`). A document
    /// without `_id` is no row but the fragment of the update that the fake server's update
    /// events carry without a lookup, or when the row is already gone: no information.
    pub fn looked_up(&self) -> Option<&Document> {
        self.full_document
            .as_ref()
            .filter(|d| d.contains_key("_id"))
    }
}

/// Reads the update description of a real server, or the update spec the fake server puts into
/// `documentKey` (`{_id, $set: {...}, $unset: {...}}`).
///
/// A description counts only when its `updatedFields` is a document: the stream's `$project`
/// (see `crate::core::schema::Schema::stream_projection`) turns a missing description into
/// `{updatedFields: null, removedFields: null}`, which says nothing.
fn update_summary(description: Option<Document>, document_key: &Document) -> Option<UpdateSummary> {
    let mut desc = description.unwrap_or_default();
    if let Some(Bson::Document(set)) = desc.remove("updatedFields") {
        let removed = desc
            .get_array("removedFields")
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        return Some(UpdateSummary {
            set,
            removed,
            complete: true,
        });
    }
    if !document_key.keys().any(|k| k.starts_with('$')) {
        return None;
    }
    let set = document_key
        .get_document("$set")
        .cloned()
        .unwrap_or_default();
    let removed = document_key
        .get_document("$unset")
        .map(|d| d.keys().cloned().collect())
        .unwrap_or_default();
    Some(UpdateSummary {
        set,
        removed,
        complete: false,
    })
}

/// The ledger's new state for one comment (`None`: gone): what a batch writes to the ledger,
/// and what each partition keeps of it (here, below both, so neither imports the other).
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerUpdate {
    pub comment: CommentId,
    pub state: Option<Row>,
}

/// What the ledger says of a batch's comments, by comment key, in three states: a row, gone
/// (`None`), or unknown (no entry: never seen, or not read). Reads as a map; the question the
/// code asks of it is [`LedgerView::before`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerView(pub HashMap<String, Option<Row>>);

/// What a [`LedgerView`] says a comment's row was before an event.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Seen<'a> {
    Unknown,
    Gone,
    Row(&'a Row),
}

impl LedgerView {
    /// What `comment`'s row was before its next event, as far as this view knows.
    pub fn before(&self, comment: &str) -> Seen<'_> {
        match self.0.get(comment) {
            None => Seen::Unknown,
            Some(None) => Seen::Gone,
            Some(Some(row)) => Seen::Row(row),
        }
    }
}

impl<'a> Seen<'a> {
    /// The row, if it existed.
    pub fn row(self) -> Option<&'a Row> {
        match self {
            Seen::Row(row) => Some(row),
            Seen::Unknown | Seen::Gone => None,
        }
    }
}

impl std::ops::Deref for LedgerView {
    type Target = HashMap<String, Option<Row>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for LedgerView {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl FromIterator<(String, Option<Row>)> for LedgerView {
    fn from_iter<I: IntoIterator<Item = (String, Option<Row>)>>(entries: I) -> Self {
        LedgerView(entries.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_fast_keys_are_the_canonical_extended_json() {
        use bson::{oid::ObjectId, Bson};
        let slow = |v: &Bson| v.clone().into_canonical_extjson().to_string();
        let mut values = vec![
            Bson::ObjectId(ObjectId::new()),
            Bson::ObjectId(ObjectId::parse_str("000000000000000000000000").unwrap()),
            Bson::Int64(i64::MAX),
            Bson::Int64(i64::MIN),
            Bson::String("a \"quoted\" id".into()),
            Bson::Double(2.5),
        ];
        for n in [0, 1, -1, 42, i32::MAX, i32::MIN] {
            values.extend([Bson::Int64(n.into()), Bson::Int32(n)]);
        }
        for v in &values {
            assert_eq!(super::canonical_key(v), slow(v), "{v:?}");
        }
    }

    use super::*;

    #[test]
    fn a_row_counts_in_each_definition_where_it_counts_there() {
        let mut approved_by_ann = Row::of(Some(GroupValue::Int(1)), None, false);
        approved_by_ann.members.extend([
            Member::counting(Some(GroupValue::Int(1)), false),
            Member::counting(Some(GroupValue::Str("ann".into())), true),
        ]);
        assert_eq!(
            approved_by_ann.group_in(CounterIx(1)),
            Some(&GroupValue::Int(1))
        );
        for (ix, counted) in [
            (0, Some(GroupValue::Int(1))),
            (1, None), // the condition fails there
            (2, Some(GroupValue::Str("ann".into()))),
            (3, None), // a definition it predates
        ] {
            let counted_in = approved_by_ann.counted_in(CounterIx(ix));
            assert_eq!(counted_in, counted.as_ref(), "definition {ix}");
        }
        let mut deleted = approved_by_ann.clone();
        deleted.deleted = true;
        assert_eq!(deleted.counted_in(CounterIx(2)), None);
    }

    #[test]
    fn integers_of_every_numeric_type_are_one_post() {
        for (value, post) in [
            (Bson::Int32(8), 8),
            (Bson::Int64(8), 8),
            (Bson::Double(8.0), 8),
            (Bson::Double(-0.0), 0),
            // Node.js stores integers beyond 2^31 as doubles.
            (Bson::Double(3_000_000_000.0), 3_000_000_000),
            (Bson::Double(-9_223_372_036_854_775_808.0), i64::MIN),
        ] {
            let read = GroupValue::from_bson(&value);
            assert_eq!(read, Some(GroupValue::Int(post)), "{value:?}");
        }
    }

    #[test]
    fn doubles_that_equal_no_integer_are_not_posts() {
        for d in [
            1.5,
            -0.25,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            9_223_372_036_854_775_808.0,
            1e300,
        ] {
            assert_eq!(GroupValue::from_bson(&Bson::Double(d)), None, "{d}");
        }
    }
}
