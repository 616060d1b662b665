//! Pure classification: one change event plus what is known of the row before it becomes signed
//! deltas per post, posts to mark dirty, and what the comment ledger should now say.
//!
//! A row counts when it exists and has no `deleted_at`; every delta is `live_after - live_before`
//! per post, so a move is `-1` on the old post and `+1` on the new one. "Before" comes from, best
//! first, the pre-image, the comment ledger, or (neither known) best-effort rules whose guesses
//! are documented drift sources that the reconciler later corrects.

use bson::{Bson, DateTime};
use serde::{Deserialize, Serialize};

use crate::event::{
    read_looked_up_row, read_row, ChangeEvent, Operation, PostId, Row, RowRead, Token,
    DELETED_FIELD, POST_FIELD,
};

/// Where the worker takes a row's before-state from (the `attribution` setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Attribution {
    /// Pre-images when the event has one, else the ledger.
    #[default]
    Auto,
    /// Pre-images only (falls back to best effort when a pre-image expired).
    PreImage,
    /// The comment ledger only, even if pre-images are present.
    Ledger,
    /// Neither: guess from the event alone.
    BestEffort,
}

impl Attribution {
    pub fn uses_pre_images(self) -> bool {
        matches!(self, Attribution::Auto | Attribution::PreImage)
    }
    pub fn uses_ledger(self) -> bool {
        matches!(self, Attribution::Auto | Attribution::Ledger)
    }
}

/// What is known of the row just before the event.
#[derive(Clone, Debug, PartialEq)]
pub enum Before {
    /// Known: `None` means the row did not exist (or had no post, so it did not count).
    Known(Option<Row>),
    /// Nothing known: best-effort rules apply.
    Unknown,
}

/// Which source the before-state came from (reported in metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    PreImage,
    Ledger,
    Insert,
    BestEffort,
}

/// A signed change to one post's count, filed under the row's creation time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    pub post: PostId,
    pub created_at: Option<DateTime>,
    pub amount: i64,
}

/// What the ledger should record for the comment after this event.
#[derive(Clone, Debug, PartialEq)]
pub enum After {
    /// The row's state is now known: `None` = gone (or not counted).
    Known(Option<Row>),
    /// The event told nothing reliable about the row's state; keep what the ledger had.
    Unchanged,
}

/// Something about the event that the operator should hear of. The event's known posts are still
/// marked dirty, so the reconciler repairs whatever was not counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Malformed input: a missing or wrongly typed `post_id`, an unknown operation type.
    Bad(String),
    /// Well-formed, but no delta could be attributed (best effort ran out of rules).
    Unattributable(String),
}

/// The outcome of classifying one event.
#[derive(Clone, Debug, PartialEq)]
pub struct Classification {
    pub deltas: Vec<Delta>,
    pub dirty: Vec<PostId>,
    pub after: After,
    pub source: Source,
    pub problem: Option<Problem>,
}

/// The stream can no longer be followed: the collection was dropped or renamed, or the stream
/// was invalidated. Never guessed past.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("change stream ended by a `{operation}` event at token {token}: the `comments` collection was dropped, renamed or the stream invalidated; counterd stops rather than guess (restore the collection, then `counterd replay --from-time` and `counterd reconcile --sweep`)")]
pub struct StreamEnded {
    pub token: Token,
    pub operation: String,
}

/// Classifies one event. `ledger` is the ledger's view of the row before this event
/// (`Before::Unknown` when the ledger is off or has no entry); `attribution` says whether
/// pre-images may be used.
pub fn classify(
    event: &ChangeEvent,
    ledger: Before,
    attribution: Attribution,
) -> Result<Classification, StreamEnded> {
    if matches!(event.operation, Operation::Update { .. }) && event.comment.is_none() {
        // Only the fake server does this: an update whose row was deleted before the lookup, so
        // the event names no comment. The delete event that follows carries the whole change.
        return Ok(Classification {
            deltas: Vec::new(),
            dirty: Vec::new(),
            after: After::Unchanged,
            source: Source::BestEffort,
            problem: None,
        });
    }
    let (before, source) = match &event.operation {
        // An insert creates the row: it did not exist just before, whatever a ledger says.
        Operation::Insert => (Before::Known(None), Source::Insert),
        _ => match (&event.pre_image, attribution.uses_pre_images()) {
            (Some(pre), true) => (Before::Known(row_or_none(read_row(pre))), Source::PreImage),
            _ => match ledger {
                Before::Known(row) if attribution.uses_ledger() => {
                    (Before::Known(row), Source::Ledger)
                }
                _ => (Before::Unknown, Source::BestEffort),
            },
        },
    };

    let after = match &event.operation {
        Operation::End(op) => {
            return Err(StreamEnded {
                token: event.token.clone(),
                operation: op.clone(),
            })
        }
        Operation::Unknown(op) => {
            return Ok(problem_only(
                &before,
                source,
                Problem::Bad(format!("unknown operation type `{op}`")),
            ))
        }
        Operation::Insert | Operation::Replace => {
            match event.full_document.as_ref().map(read_row) {
                Some(RowRead::Row(row)) => After::Known(Some(row)),
                Some(RowRead::NoPost) => {
                    return Ok(problem_only(
                        &before,
                        source,
                        Problem::Bad(format!("document has no `{POST_FIELD}`")),
                    ))
                }
                Some(RowRead::BadPost(kind)) => {
                    return Ok(problem_only(&before, source, bad_post_type(&kind)))
                }
                None => {
                    return Ok(problem_only(
                        &before,
                        source,
                        Problem::Bad("event has no fullDocument".to_string()),
                    ))
                }
            }
        }
        // With a complete update description and a known before-state, the after-state is
        // derived exactly at event time. Otherwise `updateLookup` shows the row as it is now,
        // possibly later than the event: fine while before-states chain through the ledger (the
        // transitions telescope), but never mixed with pre-images, which are event-time states.
        // A pre-image with a complete update description gives the after-state exactly, even
        // for a row without `post_id` (which the ledger cannot describe field by field).
        Operation::Update {
            summary: Some(summary),
        } if summary.complete && source == Source::PreImage => {
            let pre = event.pre_image.as_ref().expect("source is the pre-image");
            match read_row(&summary.apply_to_document(pre)) {
                RowRead::Row(row) => After::Known(Some(row)),
                RowRead::NoPost => After::Known(None),
                RowRead::BadPost(kind) => {
                    return Ok(problem_only(&before, source, bad_post_type(&kind)))
                }
            }
        }
        Operation::Update {
            summary: Some(summary),
        } if summary.complete && matches!(before, Before::Known(Some(_))) => {
            let Before::Known(Some(row)) = &before else {
                unreachable!("guarded above")
            };
            match summary.apply(row) {
                Ok(after) => After::Known(after),
                Err(kind) => return Ok(problem_only(&before, source, bad_post_type(&kind))),
            }
        }
        // A looked-up row without `post_id` no longer counts; no document at all (the row was
        // deleted since) or the fake server's fragment (no `_id`) says nothing: the delete event
        // that follows settles it.
        Operation::Update { .. } => match event.full_document.as_ref().and_then(read_looked_up_row)
        {
            Some(RowRead::Row(row)) => After::Known(Some(row)),
            Some(RowRead::BadPost(kind)) => {
                return Ok(problem_only(&before, source, bad_post_type(&kind)))
            }
            Some(RowRead::NoPost) => After::Known(None),
            None => After::Unchanged,
        },
        Operation::Delete => After::Known(None),
    };

    let mut classified = match before {
        Before::Known(before_row) => exact(before_row, after, source),
        Before::Unknown => best_effort(event, after),
    };
    // A post the row moved to in this update is touched even when a later `updateLookup`
    // state hides the stop there: a recount folded in meanwhile may have counted the row there.
    if let Operation::Update {
        summary: Some(summary),
    } = &event.operation
    {
        push_unique(
            &mut classified.dirty,
            summary.set.get(POST_FIELD).and_then(PostId::from_bson),
        );
    }
    Ok(classified)
}

/// Before-state known: the delta is exact (or zero when the after-state is unknown).
fn exact(before: Option<Row>, after: After, source: Source) -> Classification {
    let mut dirty = Vec::new();
    push_unique(&mut dirty, before.as_ref().map(|r| r.post.clone()));
    let after_row = match &after {
        After::Known(row) => row.clone(),
        // No information: assume unchanged, so no delta; the post is still touched.
        After::Unchanged => before.clone(),
    };
    push_unique(&mut dirty, after_row.as_ref().map(|r| r.post.clone()));
    Classification {
        deltas: transition(before.as_ref(), after_row.as_ref()),
        dirty,
        after,
        source,
        problem: None,
    }
}

/// `live_after - live_before` per post (and creation bucket).
pub fn transition(before: Option<&Row>, after: Option<&Row>) -> Vec<Delta> {
    let mut deltas = Vec::new();
    if let Some(row) = before.filter(|r| r.is_live()) {
        deltas.push(Delta {
            post: row.post.clone(),
            created_at: row.created_at,
            amount: -1,
        });
    }
    if let Some(row) = after.filter(|r| r.is_live()) {
        if let Some(pos) = deltas
            .iter()
            .position(|d| d.post == row.post && d.created_at == row.created_at)
        {
            deltas.remove(pos); // -1 and +1 on the same post and bucket cancel out
        } else {
            deltas.push(Delta {
                post: row.post.clone(),
                created_at: row.created_at,
                amount: 1,
            });
        }
    }
    deltas
}

/// Before-state unknown (no pre-image, no ledger entry): the documented guesses.
fn best_effort(event: &ChangeEvent, after: After) -> Classification {
    let after_row = match &after {
        After::Known(row) => row.clone(),
        After::Unchanged => None,
    };
    let mut c = Classification {
        deltas: Vec::new(),
        dirty: Vec::new(),
        after,
        source: Source::BestEffort,
        problem: None,
    };
    let key_post = event
        .document_key
        .get(POST_FIELD)
        .and_then(PostId::from_bson);
    match &event.operation {
        Operation::Delete => match key_post {
            // Sharded on post_id: the key names the post. Whether the row was live is a guess.
            Some(post) => {
                c.deltas.push(Delta {
                    post: post.clone(),
                    created_at: None,
                    amount: -1,
                });
                c.dirty.push(post);
            }
            None => {
                c.problem = Some(Problem::Unattributable(
                    "hard delete without pre-image, ledger entry or shard key".into(),
                ))
            }
        },
        Operation::Update {
            summary: Some(summary),
        } => {
            let post = after_row
                .as_ref()
                .map(|r| r.post.clone())
                .or_else(|| summary.set.get(POST_FIELD).and_then(PostId::from_bson))
                .or(key_post);
            let Some(post) = post else {
                c.problem = Some(Problem::Unattributable(
                    "update of an unknown row without a post in the event".into(),
                ));
                return c;
            };
            let created_at = after_row.as_ref().and_then(|r| r.created_at);
            c.dirty.push(post.clone());
            if summary.set.contains_key(POST_FIELD) {
                if after_row.as_ref().is_some_and(Row::is_live) {
                    c.deltas.push(Delta {
                        post,
                        created_at,
                        amount: 1,
                    });
                }
                c.problem = Some(Problem::Unattributable(
                    "post_id moved and the old post is unknown".into(),
                ));
            } else if let Some(value) = summary.set.get(DELETED_FIELD) {
                // Guess: a set deleted_at deletes a live row (a re-stamp would be miscounted).
                let amount = if matches!(value, Bson::Null) { 1 } else { -1 };
                c.deltas.push(Delta {
                    post,
                    created_at,
                    amount,
                });
            } else if summary.removed.iter().any(|f| f == DELETED_FIELD) {
                c.deltas.push(Delta {
                    post,
                    created_at,
                    amount: 1,
                });
            }
        }
        // Replace, or update without any description: only the post is known, if that.
        _ => match after_row.map(|r| r.post).or(key_post) {
            Some(post) => c.dirty.push(post),
            None => {
                c.problem = Some(Problem::Unattributable(
                    "change of an unknown row without a post in the event".into(),
                ))
            }
        },
    }
    c
}

/// The problem of a `post_id` whose BSON type cannot be a post id.
fn bad_post_type(kind: &str) -> Problem {
    Problem::Bad(format!("`{POST_FIELD}` has unsupported type {kind}"))
}

/// A classification that changes nothing but reports a problem and dirties the known post.
fn problem_only(before: &Before, source: Source, problem: Problem) -> Classification {
    let mut dirty = Vec::new();
    if let Before::Known(Some(row)) = before {
        dirty.push(row.post.clone());
    }
    Classification {
        deltas: Vec::new(),
        dirty,
        after: After::Unchanged,
        source,
        problem: Some(problem),
    }
}

fn row_or_none(read: RowRead) -> Option<Row> {
    match read {
        RowRead::Row(row) => Some(row),
        RowRead::NoPost | RowRead::BadPost(_) => None,
    }
}

fn push_unique(list: &mut Vec<PostId>, post: Option<PostId>) {
    if let Some(post) = post {
        if !list.contains(&post) {
            list.push(post);
        }
    }
}
