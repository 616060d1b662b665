//! Pure: what counterd asks the server to send, built from the schema, so that what it holds per
//! event or per row does not depend on the size of the application's documents.
//!
//! counterd reads three fields of a comment (group, creation time, soft-delete field), the
//! group and condition fields of every further counter definition, and its `_id`. Everything else an application stores (bodies, authors, attachments) would cost
//! network, decoding and memory for nothing: a user whose comments are megabytes would need a
//! sidecar sized for megabytes per event in flight. So the change stream ends with a `$project`
//! stage ([`Schema::stream_projection`]) and every read of rows (snapshot chunks, sweeps,
//! recounts) uses [`Schema::row_projection`].
//!
//! An update's `updateDescription` names the fields it changed, with their new values: an edit
//! of a body carries the body. Its `updatedFields` and `removedFields` are filtered on the server
//! to the keys that bear on the schema's fields: the field itself, a parent of it (a parent
//! replaced whole, `meta` for `meta.post`) or a part of it (`meta.post.x`), the three cases
//! [`Schema::change`] tells apart. What is filtered away never changes a count, so the summary
//! stays as complete, for counting, as the server's.
//!
//! The filter is written with expressions both MongoDB (4.2+) and the fake test server evaluate:
//! `$objectToArray`/`$filter`/`$arrayToObject`, `$in`, `$indexOfBytes` (never `$substrBytes`,
//! which fails on a cut inside a UTF-8 character), `$cond` and `$ifNull`. On an event without
//! `updateDescription` (an insert; every update of the fake server) they yield null, which the
//! event parser reads as no description (see `crate::core::event`).

use std::collections::BTreeSet;

use bson::{doc, Bson, Document};

use super::{below, Schema};

/// The change-event fields counterd reads besides the documents: the resume token, the
/// operation, its cluster time and the document key (on a sharded cluster it holds the shard
/// key too; the fake server puts its update spec there, see `crate::core::event`), and the
/// transaction an event belongs to (`lsid`, `txnNumber`: a batch never ends inside one, see
/// `crate::core::txn`).
const EVENT_FIELDS: [&str; 6] = [
    "_id",
    "operationType",
    "clusterTime",
    "documentKey",
    "lsid",
    "txnNumber",
];

const UPDATED: &str = "$updateDescription.updatedFields";
const REMOVED: &str = "$updateDescription.removedFields";

/// `then` where the field `path` holds a value, else null: the fake server's `$objectToArray`
/// and `$filter` fail on a missing input where MongoDB's yield null. (`$ifNull` turns missing
/// into null: `$eq` alone does not take missing for null.)
fn null_when_absent(path: &str, then: Document) -> Document {
    doc! {"$cond": [{"$eq": [{"$ifNull": [path, Bson::Null]}, Bson::Null]}, Bson::Null, then]}
}

impl Schema {
    /// The dotted paths counterd reads in a comment, without duplicates and without a path
    /// that another one already covers (`meta` covers `meta.post`): a projection naming both
    /// a path and its parent is refused by the server.
    pub fn read_paths(&self) -> Vec<String> {
        let all: BTreeSet<&str> = [Some(self.created.as_str()), self.soft_delete.field()]
            .into_iter()
            .flatten()
            .chain(self.definitions.iter().flat_map(|(_, d)| d.read_paths()))
            .collect();
        let covered = |p: &str| all.iter().any(|other| below(p, other).is_some());
        all.iter()
            .filter(|p| !covered(p))
            .map(|p| p.to_string())
            .collect()
    }

    /// The projection of a comment row: its `_id` and the fields counterd reads.
    pub fn row_projection(&self) -> Document {
        let paths = ["_id".to_string()].into_iter().chain(self.read_paths());
        paths.map(|path| (path, Bson::Int32(1))).collect()
    }

    /// The `$project` stage that ends the change-stream pipeline (see the module doc).
    pub fn stream_projection(&self) -> Document {
        let mut projection = Document::new();
        for field in EVENT_FIELDS {
            projection.insert(field, 1);
        }
        for document in ["fullDocument", "fullDocumentBeforeChange"] {
            projection.insert(format!("{document}._id"), 1);
            for path in self.read_paths() {
                projection.insert(format!("{document}.{path}"), 1);
            }
        }
        let updated = doc! {
            "$arrayToObject": {"$filter": {
                "input": {"$objectToArray": UPDATED},
                "as": "field",
                "cond": self.bears_on_schema("$$field.k"),
            }}
        };
        let removed = doc! {
            "$filter": {
                "input": REMOVED,
                "as": "field",
                "cond": self.bears_on_schema("$$field"),
            }
        };
        // Nested, not dotted: the fake server takes a dotted computed field's name literally.
        projection.insert(
            "updateDescription",
            doc! {
                "updatedFields": null_when_absent(UPDATED, updated),
                "removedFields": null_when_absent(REMOVED, removed),
            },
        );
        doc! {"$project": projection}
    }

    /// An expression: whether the key `key` (an update's dotted path) is a read path, a parent
    /// of one, or a part of one.
    fn bears_on_schema(&self, key: &str) -> Document {
        let paths = self.read_paths();
        // Each path's parents, shortest first, then the path itself.
        let itself_or_parent: Vec<Bson> = paths
            .iter()
            .flat_map(|path| {
                let parents = path.match_indices('.').map(|(at, _)| &path[..at]);
                parents.chain([path.as_str()]).map(Bson::from)
            })
            .collect();
        let mut any = vec![Bson::from(doc! {"$in": [key, itself_or_parent]})];
        any.extend(paths.iter().map(|path| {
            Bson::from(doc! {"$eq": [{"$indexOfBytes": [key, format!("{path}.")]}, 0]})
        }));
        doc! {"$or": any}
    }
}

#[cfg(test)]
mod tests {
    use super::super::SoftDelete;
    use super::*;

    #[test]
    fn read_paths_drop_duplicates_and_covered_children() {
        let schema = Schema {
            created: "meta.created".into(),
            soft_delete: SoftDelete::True {
                field: "meta".into(),
            },
            ..Schema::default().grouped_by("meta")
        };
        assert_eq!(schema.read_paths(), vec!["meta".to_string()]);
        let default = Schema::default();
        assert_eq!(
            default.read_paths(),
            vec!["created_at", "deleted_at", "post_id"]
        );
        let never = Schema {
            soft_delete: SoftDelete::Never,
            ..Schema::default()
        };
        assert_eq!(never.read_paths(), vec!["created_at", "post_id"]);
        // `meta.postx` is not under `meta.post`.
        let siblings = Schema {
            created: "meta.postx".into(),
            soft_delete: SoftDelete::Never,
            ..Schema::default().grouped_by("meta.post")
        };
        assert_eq!(siblings.read_paths(), vec!["meta.post", "meta.postx"]);
    }

    #[test]
    fn row_projection_names_the_id_and_the_read_fields() {
        assert_eq!(
            Schema::default().row_projection(),
            doc! {"_id": 1, "created_at": 1, "deleted_at": 1, "post_id": 1}
        );
    }
}
