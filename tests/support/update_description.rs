//! The update description of a change, as a real server reports it, for the pure tests that
//! build change events from a row's before and after states (`tests/pure_properties/`,
//! `tests/classify_definitions.rs`).

use bson::Document;

/// `updatedFields` and `removedFields` that turn `before` into `after` (top-level fields).
pub fn diff(before: &Document, after: &Document) -> (Document, Vec<String>) {
    let mut set = Document::new();
    for (k, v) in after {
        if k != "_id" && before.get(k) != Some(v) {
            set.insert(k.clone(), v.clone());
        }
    }
    let removed = before
        .keys()
        .filter(|k| !after.contains_key(k.as_str()))
        .cloned()
        .collect();
    (set, removed)
}
