//! Pure classification: one change event plus what is known of the row before it becomes signed
//! deltas per post, posts to mark dirty, and what the comment ledger should now say.
//!
//! A row counts when it exists and has no `deleted_at`; every delta is `live_after - live_before`
//! per post, so a move is `-1` on the old post and `+1` on the new one.
//!
//! Every counter definition ([`crate::core::definition`]) is classified from the same two states: a
//! row carries its group key and condition verdict per definition ([`Row::members`]), so one
//! event becomes deltas for each definition it touches (a row becoming approved enters the
//! approved counter; a move between posts changes the per-post counter and not the per-author
//! one; an author change moves it between authors). No definition reads the event again. "Before" comes from, best
//! first, the pre-image, the comment ledger, or (neither known) best-effort rules whose guesses
//! are documented drift sources that the reconciler later corrects.

use bson::{DateTime, Document};
use serde::{Deserialize, Serialize};

use crate::core::event::{ChangeEvent, Operation, Row, RowRead, Token, UpdateSummary};
use crate::core::key::{CounterIx, CounterKey, GroupValue};
use crate::core::num::Num;
use crate::core::schema::Schema;
use crate::core::time::seconds_rfc3339;

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
    /// Known: `None` means the row did not exist; a row without a post exists but does not
    /// count.
    Known(Option<Row>),
    /// Nothing known: best-effort rules apply.
    Unknown,
    /// From a complete ledger (see [`crate::snapshot`]): `None` means no entry or gone, so the
    /// row does not count. It is the before-state of every event, ahead of a pre-image and of
    /// an insert's "did not exist": the counters hold exactly what the ledger's states count,
    /// and an entry the snapshot claimed may already show the row an older event creates.
    Complete(Option<Row>),
}

/// Which source the before-state came from (counted per batch in `BatchPlan::by_source`, by
/// its snake_case name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Source {
    PreImage,
    Ledger,
    Insert,
    BestEffort,
}

/// A signed change to one counter, filed under the row's creation time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delta {
    /// Which counter: its definition and group value.
    pub key: CounterKey,
    pub created_at: Option<DateTime>,
    /// What the counter gains (negative: loses): whole rows for a count, the field's units
    /// for a sum.
    pub amount: Num,
}

/// What the ledger should record for the comment after this event.
#[derive(Clone, Debug, PartialEq)]
pub enum After {
    /// The row's state is now known: `None` = gone; a row without a post exists but does not
    /// count.
    Known(Option<Row>),
    /// The event told nothing reliable about the row's state; keep what the ledger had.
    Unchanged,
}

impl After {
    /// The row's state after the event, where the event told it (`None`: unchanged).
    pub fn known(&self) -> Option<&Option<Row>> {
        match self {
            After::Known(row) => Some(row),
            After::Unchanged => None,
        }
    }
}

/// Something about the event that the operator should hear of. The event's known posts are still
/// marked dirty, so the reconciler repairs whatever was not counted. Its name (`bad`,
/// `unattributable`) is the `kind` the worker logs with it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Problem {
    /// Malformed input: a missing or wrongly typed `post_id`, an unknown operation type.
    #[error(transparent)]
    Bad(Malformed),
    /// Well-formed, but no delta could be attributed (best effort ran out of rules).
    #[error(transparent)]
    Unattributable(Unattributable),
}

/// How an event is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("unknown operation type `{0}`")]
    UnknownOperation(String),
    /// An inserted or replaced row without the group field.
    #[error("document has no `{field}`")]
    NoPost { field: String },
    /// A group field whose BSON type (`kind`) cannot be a post id.
    #[error("`{field}` has unsupported type {kind}")]
    UnsupportedPostType { field: String, kind: String },
    #[error("event has no fullDocument")]
    NoFullDocument,
    /// A summed field holding something other than a number (the row adds 0 to that sum).
    #[error("summed field `{field}` of counter `{counter}` holds a {kind}, not a number")]
    NotANumber {
        counter: String,
        field: String,
        kind: String,
    },
    /// Adding a row's value overflowed 64-bit integers (the sum became a double instead).
    #[error(
        "the sum of counter `{counter}` overflowed 64-bit integers (it continues as a double)"
    )]
    Overflow { counter: String },
}

/// Why no delta could be attributed to a well-formed event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unattributable {
    #[error("hard delete without pre-image, ledger entry or shard key")]
    DeleteOfUnknownRow,
    #[error("update of an unknown row without a post in the event")]
    UpdateWithoutPost,
    #[error("post_id moved and the old post is unknown")]
    MoveFromUnknownPost,
    #[error("change of an unknown row without a post in the event")]
    ChangeWithoutPost,
}

/// The outcome of classifying one event.
#[derive(Clone, Debug, PartialEq)]
pub struct Classification {
    pub deltas: Vec<Delta>,
    /// Every counter the event named (before or after it), of every definition.
    pub dirty: Vec<CounterKey>,
    pub after: After,
    pub source: Source,
    pub problem: Option<Problem>,
}

impl Classification {
    /// No delta, no counter dirty, no problem: what each way of classifying starts from.
    fn of(after: After, source: Source) -> Classification {
        Classification {
            deltas: Vec::new(),
            dirty: Vec::new(),
            after,
            source,
            problem: None,
        }
    }
}

/// The stream can no longer be followed: the collection was dropped or renamed, or the stream
/// was invalidated. Never guessed past. The message says how to recover, with the time to
/// replay from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("change stream ended by a `{operation}` event at token {token}{}: the `comments` collection was dropped, renamed or the stream invalidated, and counterd stops rather than guess. To recover: restore or recreate the collection, run `counterd replay --from-time {}` (just after this event: what happened since is counted), start `counterd run` again, and run `counterd reconcile --sweep` once beside it to recount every post (the counters still include the rows that went away)", at_text(.at), replay_from(.at))]
pub struct StreamEnded {
    pub token: Token,
    pub operation: String,
    /// The event's cluster time, where the server sent one.
    pub at: Option<bson::Timestamp>,
}

/// ` (at <time>)`, or nothing without a time.
fn at_text(at: &Option<bson::Timestamp>) -> String {
    at.map(|t| format!(" (at {})", seconds_rfc3339(t.time as i64)))
        .unwrap_or_default()
}

/// The time to replay from after an end at `at`: the next whole second.
pub fn replay_from(at: &Option<bson::Timestamp>) -> String {
    at.map(|t| seconds_rfc3339(t.time as i64 + 1))
        .unwrap_or_else(|| "<RFC 3339 time just after the drop>".into())
}

/// Classifies one event. `ledger` is the ledger's view of the row before this event
/// (`Before::Unknown` when the ledger is off or has no entry); `attribution` says whether
/// pre-images may be used; `schema` names the application's fields.
///
/// Three steps: where the before-state comes from ([`before_state`]), what the row is after
/// the event ([`after_state`]), then the deltas between the two, exact or best effort, with the
/// counters the event touched marked dirty.
pub fn classify(
    event: &ChangeEvent,
    ledger: Before,
    attribution: Attribution,
    schema: &Schema,
) -> Result<Classification, StreamEnded> {
    if matches!(event.operation, Operation::Update { .. }) && event.comment.is_none() {
        // Only the fake server does this: an update whose row was deleted before the lookup, so
        // the event names no comment. The delete event that follows carries the whole change.
        return Ok(Classification::of(After::Unchanged, Source::BestEffort));
    }
    let (before, source) = before_state(event, ledger, attribution, schema);
    let (after, bad) = match after_state(event, &before, source, schema) {
        Reading::After(read) => read,
        Reading::Ended(end) => return Err(end),
        Reading::Refused(problem) => return Ok(problem_only(&before, source, problem)),
    };
    let mut classified = match before {
        Before::Known(before_row) | Before::Complete(before_row) => {
            exact(before_row, after, source)
        }
        Before::Unknown => best_effort(event, after, schema),
    };
    if let Some(problem) = bad.or_else(|| not_a_number(&classified.after, schema)) {
        classified.problem = Some(problem);
    }
    // A post the row moved to in this update is touched even when a later `updateLookup`
    // state hides the stop there: a recount folded in meanwhile may have counted the row there.
    if let Operation::Update {
        summary: Some(summary),
    } = &event.operation
    {
        for key in schema.groups_set_by(summary) {
            push_unique(&mut classified.dirty, Some(key));
        }
    }
    Ok(classified)
}

/// The before-state [`classify`] takes for `event` given `ledger`, where one is known (`None`:
/// unknown, the best-effort rules apply; `Some(None)`: the row did not exist or does not
/// count). Partitions split a change by it (see [`crate::core::partition::Partition::own_transition`]).
pub fn known_before(
    event: &ChangeEvent,
    ledger: Before,
    attribution: Attribution,
    schema: &Schema,
) -> Option<Option<Row>> {
    match before_state(event, ledger, attribution, schema).0 {
        Before::Known(row) | Before::Complete(row) => Some(row),
        Before::Unknown => None,
    }
}

/// Where the row's before-state comes from, best first: a complete ledger, an insert's "did not
/// exist", the pre-image, the ledger, else nothing (best effort).
fn before_state(
    event: &ChangeEvent,
    ledger: Before,
    attribution: Attribution,
    schema: &Schema,
) -> (Before, Source) {
    match (&event.operation, ledger) {
        (_, Before::Complete(row)) if attribution.uses_ledger() => {
            (Before::Known(row), Source::Ledger)
        }
        // An insert creates the row: it did not exist just before, whatever a ledger says.
        (Operation::Insert, _) => (Before::Known(None), Source::Insert),
        (_, ledger) => match (&event.pre_image, attribution.uses_pre_images()) {
            // A pre-image shows a row that exists, counted or not.
            (Some(pre), true) => (
                Before::Known(Some(schema.read_existing_row(pre))),
                Source::PreImage,
            ),
            _ => match ledger {
                Before::Known(row) if attribution.uses_ledger() => {
                    (Before::Known(row), Source::Ledger)
                }
                _ => (Before::Unknown, Source::BestEffort),
            },
        },
    }
}

/// What the event says of the row after it.
enum Reading {
    /// The after-state, and a malformed group field in it (the row exists but no longer
    /// counts, and the event is reported as bad input).
    After((After, Option<Problem>)),
    /// The stream ended: never guessed past.
    Ended(StreamEnded),
    /// Nothing can be read from the event: reported, its known posts marked dirty.
    Refused(Problem),
}

fn after_state(event: &ChangeEvent, before: &Before, source: Source, schema: &Schema) -> Reading {
    match &event.operation {
        Operation::End(op) => Reading::Ended(StreamEnded {
            token: event.token.clone(),
            operation: op.clone(),
            at: event.cluster_time,
        }),
        Operation::Unknown(op) => {
            Reading::Refused(Problem::Bad(Malformed::UnknownOperation(op.clone())))
        }
        Operation::Insert | Operation::Replace => match event.full_document.as_ref() {
            Some(doc) => Reading::After(row_after(doc, schema, true)),
            None => Reading::Refused(Problem::Bad(Malformed::NoFullDocument)),
        },
        Operation::Update { summary } => {
            let read = after_update(event, summary.as_ref(), before, source, schema);
            Reading::After(read)
        }
        Operation::Delete => Reading::After((After::Known(None), None)),
    }
}

/// The row a document shows whole: without a usable post id it exists but does not count, and
/// a malformed post id is reported, a missing one too where the document is an inserted or
/// replaced row (`inserted`).
fn row_after(doc: &Document, schema: &Schema, inserted: bool) -> (After, Option<Problem>) {
    let problem = match schema.read_row(doc) {
        RowRead::Row(row) => return (After::Known(Some(row)), None),
        RowRead::NoPost => inserted.then(|| {
            Problem::Bad(Malformed::NoPost {
                field: schema.group().to_string(),
            })
        }),
        RowRead::BadPost(kind) => Some(bad_post_type(schema, &kind)),
    };
    (After::Known(Some(schema.read_existing_row(doc))), problem)
}

/// The row after an update.
///
/// With a complete update description and a known existing row before it (from the pre-image
/// or the ledger, counted or not), the after-state is derived exactly at event time. Otherwise
/// `updateLookup` shows the row as it is now, possibly later than the event: fine while
/// before-states chain through the ledger (the transitions telescope), but never mixed with
/// pre-images, which are event-time states. So a row the ledger knows without a post is
/// described field by field too: taking a later state for it from the lookup, when the next
/// event's before-state comes from its own pre-image, would count the change in between twice.
/// A ledger row is not enough when the update touches a field a definition's condition reads
/// (the ledger keeps the verdict, not the field): the lookup decides ([`Schema::derives`]).
fn after_update(
    event: &ChangeEvent,
    summary: Option<&UpdateSummary>,
    before: &Before,
    source: Source,
    schema: &Schema,
) -> (After, Option<Problem>) {
    let complete = summary.filter(|s| s.complete);
    if let (Some(summary), Source::PreImage) = (complete, source) {
        let pre = event.pre_image.as_ref().expect("source is the pre-image");
        let after = Schema::apply_to_document(summary, pre);
        return row_after(&after, schema, false);
    }
    if let (Some(summary), Before::Known(Some(row))) = (complete, before) {
        if schema.derives(summary, row) {
            return match schema.apply(summary, row) {
                Ok(after) => (After::Known(Some(after)), None),
                Err((after, kind)) => (
                    After::Known(Some(after)),
                    Some(bad_post_type(schema, &kind)),
                ),
            };
        }
    }
    // A looked-up row without `post_id` exists but no longer counts; no document at all (the
    // row was deleted since) or the fake server's fragment (no `_id`) says nothing: the delete
    // event that follows settles it.
    match event.looked_up() {
        Some(doc) => row_after(doc, schema, false),
        None => (After::Unchanged, None),
    }
}

/// Before-state known: the delta is exact (or zero when the after-state is unknown).
fn exact(before: Option<Row>, after: After, source: Source) -> Classification {
    let mut dirty = Vec::new();
    push_groups(&mut dirty, before.as_ref());
    // No information: assume unchanged, so no delta; the post is still touched.
    let after_row = after.known().unwrap_or(&before).clone();
    push_groups(&mut dirty, after_row.as_ref());
    Classification {
        deltas: transition(before.as_ref(), after_row.as_ref()),
        dirty,
        ..Classification::of(after, source)
    }
}

/// `live_after - live_before` per counter of every definition (and creation bucket).
pub fn transition(before: Option<&Row>, after: Option<&Row>) -> Vec<Delta> {
    let known = |r: Option<&Row>| r.map_or(0, |r| r.members.len());
    let mut deltas = Vec::new();
    for counter in (0..known(before).max(known(after))).map(CounterIx) {
        transition_in(counter, before, after, &mut deltas);
    }
    deltas
}

/// [`transition`] for one definition: minus what the row added where it counted, plus what it
/// adds where it counts now (`-1`/`+1` for a count, the old and new values for a sum); on the
/// same group and bucket the two make one delta, `after - before`, and none when it is 0.
fn transition_in(
    counter: CounterIx,
    before: Option<&Row>,
    after: Option<&Row>,
    out: &mut Vec<Delta>,
) {
    let start = out.len();
    let delta = |row: &Row, post: &GroupValue, amount| Delta {
        key: CounterKey::new(counter, post.clone()),
        created_at: row.created_at,
        amount,
    };
    if let Some((row, (post, amount))) = before.and_then(|r| Some((r, r.contribution(counter)?))) {
        out.push(delta(row, post, -amount));
    }
    if let Some((row, (post, amount))) = after.and_then(|r| Some((r, r.contribution(counter)?))) {
        let same = out[start..]
            .iter()
            .position(|d| d.key.group == *post && d.created_at == row.created_at);
        // One delta where the difference is exact; two (each exact) where it would overflow.
        match same.and_then(|pos| Some((pos, amount.checked_add(out[start + pos].amount)?))) {
            Some((pos, net)) if net.is_zero() => {
                out.remove(start + pos);
            }
            Some((pos, net)) => out[start + pos].amount = net,
            None => out.push(delta(row, post, amount)),
        }
    }
}

/// Before-state unknown (no pre-image, no ledger entry): the documented guesses. They are
/// made for the schema's own counter of the post ([`own_key`]); the groups the after-state
/// names are dirty, and the reconciler recounts them.
fn best_effort(event: &ChangeEvent, after: After, schema: &Schema) -> Classification {
    let after_row = after.known().cloned().flatten();
    let mut c = Classification::of(after, Source::BestEffort);
    let key_post = schema.post_in(&event.document_key);
    let row_post = || after_row.as_ref().and_then(|r| r.group().cloned());
    // The post, and what its counter gains by the guess (`None`: nothing, it is only dirty).
    let (post, gain) = match &event.operation {
        // Sharded on post_id: the key names the post. Whether the row was live is a guess.
        Operation::Delete => match key_post {
            Some(post) => (post, Some(-1)),
            None => return unattributable(c, Unattributable::DeleteOfUnknownRow),
        },
        Operation::Update {
            summary: Some(summary),
        } => {
            let post = row_post()
                .or_else(|| schema.post_set_by(summary))
                .or(key_post);
            let Some(post) = post else {
                return unattributable(c, Unattributable::UpdateWithoutPost);
            };
            if schema.moves(summary) {
                c.problem = Some(Problem::Unattributable(Unattributable::MoveFromUnknownPost));
                (
                    post,
                    after_row.as_ref().is_some_and(Row::is_live).then_some(1),
                )
            } else {
                // Setting the soft-delete field deletes a live row, clearing it revives a
                // deleted one (a re-stamp would be miscounted: a documented drift source).
                (post, schema.soft_delete_guess(summary))
            }
        }
        // Replace, or update without any description: only the post is known, if that.
        _ => match row_post().or(key_post) {
            Some(post) => (post, None),
            None => {
                push_groups(&mut c.dirty, after_row.as_ref());
                return unattributable(c, Unattributable::ChangeWithoutPost);
            }
        },
    };
    let key = own_key(post);
    if let Some(gain) = gain {
        c.deltas.push(Delta {
            key: key.clone(),
            created_at: after_row.as_ref().and_then(|r| r.created_at),
            amount: Num::Int(gain),
        });
    }
    c.dirty.push(key);
    push_groups(&mut c.dirty, after_row.as_ref());
    c
}

/// `c` with `why` no delta could be attributed.
fn unattributable(mut c: Classification, why: Unattributable) -> Classification {
    c.problem = Some(Problem::Unattributable(why));
    c
}

/// A summed field of the row after the event that holds something other than a number: the
/// row adds 0 to that sum, and the event is reported as bad input.
fn not_a_number(after: &After, schema: &Schema) -> Option<Problem> {
    let After::Known(Some(row)) = after else {
        return None;
    };
    row.members
        .iter()
        .zip(schema.definitions.iter())
        .find_map(|(member, (_, definition))| {
            let kind = member.not_a_number.as_ref()?;
            Some(Problem::Bad(Malformed::NotANumber {
                counter: definition.name.clone(),
                field: definition.kind.field().unwrap_or_default().to_string(),
                kind: kind.clone(),
            }))
        })
}

/// The problem of a group field whose BSON type cannot be a post id.
fn bad_post_type(schema: &Schema, kind: &str) -> Problem {
    Problem::Bad(Malformed::UnsupportedPostType {
        field: schema.group().to_string(),
        kind: kind.to_string(),
    })
}

/// A classification that changes nothing but reports a problem and dirties the known post.
fn problem_only(before: &Before, source: Source, problem: Problem) -> Classification {
    let mut dirty = Vec::new();
    if let Before::Known(Some(row)) = before {
        push_groups(&mut dirty, Some(row));
    }
    Classification {
        dirty,
        problem: Some(problem),
        ..Classification::of(After::Unchanged, source)
    }
}

fn push_unique(list: &mut Vec<CounterKey>, key: Option<CounterKey>) {
    if let Some(key) = key.filter(|key| !list.contains(key)) {
        list.push(key);
    }
}

/// The counter of `post` in the schema's own group field (the first definition's, see
/// [`Schema::group`]), which best effort guesses for: a count of every live row of the field
/// an event names is the only counter an event alone tells anything about.
fn own_key(post: GroupValue) -> CounterKey {
    CounterKey::new(CounterIx(0), post)
}

/// The row's group of every definition, counted or not: changes there may have touched them.
fn push_groups(list: &mut Vec<CounterKey>, row: Option<&Row>) {
    let Some(row) = row else { return };
    for counter in row.counters() {
        push_unique(
            list,
            row.group_in(counter)
                .map(|g| CounterKey::new(counter, g.clone())),
        );
    }
}
