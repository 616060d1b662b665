//! Pure: the keys every seam speaks. A group value ([`GroupValue`]: what a definition's group field
//! holds, with MongoDB's equality), the definition it belongs to ([`CounterIx`]), both together
//! ([`CounterKey`]), and what one row is to one definition ([`Member`]).
//!
//! # Why a file of its own
//! The event model (a row's members) and the definitions (which read a member from a document)
//! both speak these types; kept in either, each imported the other. Here they depend on
//! nothing but the numbers ([`crate::core::num`]).

use std::fmt;

use bson::{oid::ObjectId, Bson, Document};
use serde::{Deserialize, Serialize};

use crate::core::num::Num;

/// A group value: what a definition's group field holds (a post id for the default definition,
/// an author or thread id for others). Applications use strings, integers or ObjectIds; anything
/// else in a group field is bad input.
///
/// Integers follow MongoDB's equality: `8` (int32), `NumberLong(8)` and `8.0` (a double) are one
/// post to MongoDB's queries and unique indexes, and Node.js drivers store every integer beyond
/// 2^31 as a double, so an integral double is the integer it equals. A fractional double (or
/// one beyond i64) matches no integer and is bad input, as arrays and documents are.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GroupValue {
    Int(i64),
    Str(String),
    Oid(ObjectId),
}

/// The integer a double equals exactly, if any (MongoDB compares numbers by value).
fn integral(d: f64) -> Option<i64> {
    // 2^63 is exactly representable; every double strictly inside (-2^63, 2^63) with no
    // fraction converts to i64 without loss. -2^63 itself is i64::MIN.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (d.is_finite() && d.fract() == 0.0 && (-LIMIT..LIMIT).contains(&d)).then_some(d as i64)
}

impl GroupValue {
    /// Reads a group value from a BSON value; `None` for a type that cannot be one.
    pub fn from_bson(value: &Bson) -> Option<GroupValue> {
        match value {
            Bson::Int32(i) => Some(GroupValue::Int(*i as i64)),
            Bson::Int64(i) => Some(GroupValue::Int(*i)),
            Bson::Double(d) => integral(*d).map(GroupValue::Int),
            Bson::String(s) => Some(GroupValue::Str(s.clone())),
            Bson::ObjectId(o) => Some(GroupValue::Oid(*o)),
            _ => None,
        }
    }

    pub fn to_bson(&self) -> Bson {
        match self {
            GroupValue::Int(i) => Bson::Int64(*i),
            GroupValue::Str(s) => Bson::String(s.clone()),
            GroupValue::Oid(o) => Bson::ObjectId(*o),
        }
    }

    /// Parses an operator's spelling: `int:5`, `str:abc`, `oid:<24 hex>`, or unprefixed, where an
    /// integer is an `Int`, 24 hex digits an `Oid`, and anything else a `Str`.
    pub fn parse(text: &str) -> GroupValue {
        if let Some(rest) = text.strip_prefix("str:") {
            return GroupValue::Str(rest.to_string());
        }
        let int = |t: &str| t.parse().ok().map(GroupValue::Int);
        let oid = |t: &str| ObjectId::parse_str(t).ok().map(GroupValue::Oid);
        (text.strip_prefix("int:").and_then(int))
            .or_else(|| text.strip_prefix("oid:").and_then(oid))
            .or_else(|| int(text))
            .or_else(|| oid(text).filter(|_| text.len() == 24))
            .unwrap_or_else(|| GroupValue::Str(text.to_string()))
    }

    /// A stable 64-bit hash, the same on every machine and release, used to split posts across
    /// partitions.
    pub fn stable_hash(&self) -> u64 {
        let bytes: Vec<u8> = match self {
            GroupValue::Int(i) => [b"i".as_slice(), &i.to_be_bytes()].concat(),
            GroupValue::Str(s) => [b"s".as_slice(), s.as_bytes()].concat(),
            GroupValue::Oid(o) => [b"o".as_slice(), &o.bytes()].concat(),
        };
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }
}

impl fmt::Display for GroupValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupValue::Int(i) => write!(f, "{i}"),
            GroupValue::Str(s) => f.write_str(s),
            GroupValue::Oid(o) => write!(f, "{o}"),
        }
    }
}

/// Which definition, by its place in [`Definitions`] (0: the default). Small and `Copy`, so a
/// delta, a dirty mark or a ledger entry names its counter without carrying the definition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CounterIx(pub usize);

impl CounterIx {
    /// The default definition's place.
    pub const DEFAULT: CounterIx = CounterIx(0);
}

/// One counter: a group value of one definition (`per_author` / `"ada"`). What a delta, a
/// counter write and a dirty mark name; the group value alone is the counter document's `_id`
/// inside the definition's collection.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CounterKey {
    pub counter: CounterIx,
    pub group: GroupValue,
}

impl CounterKey {
    pub fn new(counter: CounterIx, group: GroupValue) -> CounterKey {
        CounterKey { counter, group }
    }
}

/// What one row is to one definition: the group it belongs to and whether it satisfies the
/// condition. Whether it *counts* also takes the row's soft-delete state, which every definition
/// shares ([`Member::counts`]). This pair is what a ledger entry keeps per definition, so the
/// next event's before-state needs no document.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// The row's key in the definition's group field (`None`: absent or not a usable key; the
    /// row counts nowhere for this definition).
    pub group: Option<GroupValue>,
    /// Whether the row satisfies the definition's condition (always true without one).
    pub matches: bool,
    /// What the row adds where it counts: 1 for a count, the field's value for a sum (0 for a
    /// missing or non-numeric value). Kept in the ledger, so that a change of the value, a
    /// move or a delete takes back exactly what the row added.
    pub amount: Num,
    /// The BSON type of a summed field that holds something other than a number (reported as
    /// a bad event; the row adds 0). Not kept in the ledger.
    pub not_a_number: Option<String>,
}

impl Member {
    /// The group the row counts in, if it counts: it exists (the caller holds it), is not
    /// soft-deleted, has a group and satisfies the condition.
    pub fn counts(&self, deleted: bool) -> Option<&GroupValue> {
        self.group.as_ref().filter(|_| self.matches && !deleted)
    }

    /// What a row of a count definition is beyond its group and verdict: 1.
    pub fn counting(group: Option<GroupValue>, matches: bool) -> Member {
        Member {
            group,
            matches,
            amount: Num::ONE,
            not_a_number: None,
        }
    }
}

/// The value at a dotted `path` of `doc`, through documents only (`None`: absent, or a step is
/// not a document): how a group field is read, so a group field inside an array has no single
/// key.
pub fn value_at<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    match path.split_once('.') {
        None => doc.get(path),
        Some((head, rest)) => value_at(doc.get(head)?.as_document()?, rest),
    }
}
