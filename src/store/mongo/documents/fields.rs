//! Field rules for the serde-derived documents, used with `#[serde(with = ...)]` or
//! `deserialize_with`: each reads the stored value as plain [`Bson`] first and then applies the
//! one rule for its kind, so a number stored as Int32, Int64 or a whole Double reads the same
//! (the [`integer`] rule), and a hand-edited field of the wrong type means what it meant to the
//! hand-written readers these replace (none, zero, or an error, as each field says).

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{count, integer, Bson, GroupValue};

/// The value when it has the expected type, else the default: a field the readers never
/// insisted on (an optional time, a lease's owner).
pub(super) fn lenient<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    Ok(bson::from_bson(Bson::deserialize(d)?).unwrap_or_default())
}

/// A count (progress numbers, generations, a sweep's tallies): stored as an Int64, read by
/// [`count`] (missing, malformed or negative: zero).
pub(super) mod counted {
    use super::*;

    pub fn serialize<S: Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(*n as i64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Ok(count(Some(&Bson::deserialize(d)?)))
    }
}

/// An integer by the [`integer`] rule where a malformed value counts as none.
pub(super) fn integer_or_none<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    Ok(integer(Some(&Bson::deserialize(d)?)).ok().flatten())
}

/// An integer by the [`integer`] rule where a malformed value counts as zero.
pub(super) fn integer_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(integer_or_none(d)?.unwrap_or(0))
}

/// A counter's number by the [`super::number`] rule that must be there.
pub(super) fn required_number<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<crate::core::num::Num, D::Error> {
    super::number(Some(&Bson::deserialize(d)?))
        .map_err(D::Error::custom)?
        .ok_or_else(|| D::Error::custom("null, expected a number"))
}

/// A post id, stored as its BSON value; a value of no post type is an error.
pub(super) mod post {
    use super::*;

    pub fn serialize<S: Serializer>(post: &GroupValue, s: S) -> Result<S::Ok, S::Error> {
        post.to_bson().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<GroupValue, D::Error> {
        let value = Bson::deserialize(d)?;
        GroupValue::from_bson(&value)
            .ok_or_else(|| D::Error::custom(format!("post {value:?} is not a post id")))
    }
}

/// A post id that may be absent (`None`: not written); when present it must be a post id.
pub(super) mod some_post {
    use super::*;

    pub fn serialize<S: Serializer>(post: &Option<GroupValue>, s: S) -> Result<S::Ok, S::Error> {
        post.as_ref().map(GroupValue::to_bson).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<GroupValue>, D::Error> {
        super::post::deserialize(d).map(Some)
    }
}

/// A post id where anything else (null, another type) reads as none.
pub(super) mod post_or_none {
    pub use super::some_post::serialize;
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<GroupValue>, D::Error> {
        Ok(GroupValue::from_bson(&Bson::deserialize(d)?))
    }
}

/// A sub-document that is either there or not: null reads as none, and anything but a
/// document is an error naming what it found (a document that does not read is one too).
pub(super) fn document_or_none<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Bson::deserialize(d)? {
        Bson::Null => Ok(None),
        Bson::Document(doc) => bson::from_document(doc).map(Some).map_err(D::Error::custom),
        other => Err(D::Error::custom(format!("{other:?}, expected a document"))),
    }
}

/// A sub-document where anything but a document reads as none (a document that does not read
/// is still an error).
pub(super) fn document_if_any<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Bson::deserialize(d)? {
        Bson::Document(doc) => bson::from_document(doc).map(Some).map_err(D::Error::custom),
        _ => Ok(None),
    }
}
