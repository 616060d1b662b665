//! Pure: the rows a batch must read from `comments` itself, in place of `updateLookup`.
//!
//! An update event names its row and (on a real server) what changed, not the row after the
//! change. counterd derives that after-state from the row's state before the event (the ledger,
//! or the batch's own earlier events) and a complete description ([`Schema::derives`]); only
//! where it cannot (a row the ledger does not know, a field it cannot derive, an incomplete
//! description such as the fake server's update spec) does it need the row as it is now.
//!
//! The stream used to ask the server for that row with every update (`fullDocument:
//! updateLookup`): a point read on the primary per update event, whether counterd used it or
//! not, at the moment the primary is busiest recovering. Now the stream asks for it only where
//! pre-images are read (an event-time pre-image is never mixed with a later row: see
//! [`crate::core::classify`]), and the worker reads the rows it cannot derive in one batched read per
//! batch ([`rows_to_read`], then [`attach`] them to the events as their `fullDocument`).
//!
//! Exactness is unchanged: a row read after the batch was read is the same kind of
//! later-than-the-event state that a lookup is (a lookup too runs when the server sends the
//! event, not when the change happened), so the ledger's rules for it stay as they are: the
//! transitions telescope through the ledger, and a batch with such a state touches every bucket
//! of the posts it names (see `crate::core::batch`).

use std::collections::{HashMap, HashSet};

use bson::Document;

use crate::core::classify::Attribution;
use crate::core::event::{ChangeEvent, CommentId, LedgerView, Operation, Row};
use crate::core::schema::Schema;

/// The comments whose rows the batch must read: those of the update events whose after-state
/// [`crate::core::classify`] cannot derive and whose event carries no looked-up row. Walks the batch
/// as the planner does ([`crate::core::batch::plan_batch_covering`]): an event's before-state is the
/// after-state of the comment's previous event in the batch, else its ledger entry. Errs on the
/// side of reading: a row read that turns out not to be needed costs a little, one that is
/// missing would leave the update uncounted. A comment without a ledger entry is no row to
/// derive from, whether the ledger is complete (it does not count) or not (it is unknown).
pub fn rows_to_read(
    events: &[ChangeEvent],
    ledger: &LedgerView,
    attribution: Attribution,
    schema: &Schema,
) -> Vec<CommentId> {
    // Only comments the batch updates can need a row; an insert-only batch (a backlog of new
    // comments) needs none, and reading the rows of its inserts was a few per cent of the
    // worker's CPU per event.
    let updated: HashSet<&str> = events
        .iter()
        .filter(|e| matches!(e.operation, Operation::Update { .. }))
        .filter_map(|e| e.comment.as_ref().map(|c| c.key.as_str()))
        .collect();
    if updated.is_empty() {
        return Vec::new();
    }
    // The comment's state after its latest event in the batch: `None` = unknown or gone.
    let mut state: HashMap<&str, Option<Row>> = HashMap::new();
    let mut wanted: Vec<CommentId> = Vec::new();
    let mut asked: HashSet<&str> = HashSet::new();
    for event in events {
        let Some(comment) = &event.comment else {
            continue;
        };
        let key = comment.key.as_str();
        if !updated.contains(key) {
            continue;
        }
        let after = match &event.operation {
            Operation::Insert | Operation::Replace => event
                .full_document
                .as_ref()
                .map(|d| schema.read_existing_row(d)),
            Operation::Update { summary } => {
                let before = match state.get(key) {
                    Some(row) => row.clone(),
                    None => ledger.get(key).cloned().flatten(),
                };
                // Without the ledger (its attribution), classification never derives.
                let derived = summary
                    .as_ref()
                    .filter(|s| s.complete && attribution.uses_ledger())
                    .zip(before.as_ref())
                    .filter(|(s, row)| schema.derives(s, row))
                    .map(|(s, row)| schema.apply(s, row).unwrap_or_else(|(row, _)| row));
                if derived.is_none() && event.looked_up().is_none() && asked.insert(key) {
                    wanted.push(comment.clone());
                }
                derived
            }
            Operation::Delete | Operation::End(_) | Operation::Unknown(_) => None,
        };
        state.insert(key, after);
    }
    wanted
}

/// Sets the rows read (`rows`, by comment key; a comment missing from it is gone) as the
/// `fullDocument` of every update event of a comment in `wanted` that carries no looked-up row,
/// as `updateLookup` would have: the row as it is when read, or nothing when it is gone.
pub fn attach(events: &mut [ChangeEvent], wanted: &[CommentId], rows: &HashMap<String, Document>) {
    let wanted: HashSet<&str> = wanted.iter().map(|c| c.key.as_str()).collect();
    for event in events.iter_mut() {
        if !matches!(event.operation, Operation::Update { .. }) || event.looked_up().is_some() {
            continue;
        }
        let Some(comment) = &event.comment else {
            continue;
        };
        if wanted.contains(comment.key.as_str()) {
            event.full_document = rows.get(&comment.key).cloned();
        }
    }
}
