//! Pure coalescing: a batch of events becomes one counter write per counter (hot posts collapse
//! to a single `$inc`), one ledger write per comment, and one dirty mark per counter. A counter
//! is a group key of one definition ([`CounterKey`]); with only the default definition that is
//! one write and one mark per post, as it always was.
//!
//! Before-states chain through the batch: the second event of a comment sees the first event's
//! after-state, so the transitions telescope and their sum is right even when `updateLookup`
//! shows a row later than its event.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bson::Timestamp;
use indexmap::IndexMap;

use crate::core::classify::{
    classify, known_before, After, Attribution, Before, Classification, Malformed, Problem, Source,
    StreamEnded,
};
use crate::core::event::{
    ChangeEvent, CommentId, LedgerUpdate, LedgerView, Operation, Row, Seen, Token,
};
use crate::core::key::{CounterIx, CounterKey};
use crate::core::num::Num;
use crate::core::partition::Partition;
use crate::core::schema::Schema;
use crate::core::time::{bucket_of, bucket_start, BucketStart};
use crate::core::window::Touch;

/// One coalesced counter write: `$inc` of `delta` on `live_delta` and of each bucket's amount.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterDelta {
    /// Which counter: its definition (its collection) and group value.
    pub key: CounterKey,
    /// Whole rows for a count, the field's units for a sum ([`Num`]'s rules).
    pub delta: Num,
    /// Non-zero amounts per bucket; they sum to `delta`.
    pub buckets: BTreeMap<BucketStart, Num>,
    /// Every bucket an event of the batch changed for this post, including changes that cancel
    /// out (a soft delete and an undelete in one batch). The counter records the batch's token
    /// under each, so the reconciler can tell that a recount may have seen a change in flight
    /// even when the net increment is zero.
    pub touched: BTreeSet<BucketStart>,
    /// The rows whose events in the batch named this post (before or after the event), in
    /// stream order without repeats: the counter's log entry for the batch, from which a
    /// row-level recount learns which rows changed while it read (see
    /// [`crate::core::window`]). `None`: an event named the post without a row id, so the
    /// batch's changes cannot be listed.
    pub comments: Option<Vec<CommentId>>,
}

/// What the store writes for one counter: the increments of one or more batches that changed
/// its group, as one guarded statement (see [`crate::core::carry`]).
///
/// The statement leaves the counter as the batches' own writes, one after the other, would
/// have: `applied_through` (the guard) is the last batch's end, each bucket records the last
/// batch that touched it, and each batch keeps its own entry in the counter's log.
#[derive(Clone, Debug, PartialEq)]
pub struct CounterWrite {
    pub key: CounterKey,
    pub delta: Num,
    /// Non-zero amounts per bucket; they sum to `delta`.
    pub buckets: BTreeMap<BucketStart, Num>,
    /// The end of the last batch that changed the group: the write is guarded by
    /// `applied_through < through` and sets it.
    pub through: Token,
    pub through_time: Option<bson::Timestamp>,
    /// Every bucket a batch changed, with the end of the last batch that changed it.
    pub touched: BTreeMap<BucketStart, Token>,
    /// One entry per batch, oldest first (the newest [`crate::core::window::LOG_ENTRIES`]).
    pub log: Vec<Touch>,
}

impl CounterWrite {
    /// The write of one batch ending at `end`.
    pub fn of_batch(d: &CounterDelta, end: &Token, end_time: Option<bson::Timestamp>) -> Self {
        CounterWrite {
            key: d.key.clone(),
            delta: d.delta,
            buckets: d.buckets.clone(),
            through: end.clone(),
            through_time: end_time,
            touched: d.touched.iter().map(|b| (*b, end.clone())).collect(),
            log: vec![Touch::new(end.as_str(), d.comments.as_deref())],
        }
    }
}

/// A post to mark dirty, with the newest creation bucket the marking events changed: the post
/// may leave the dirty set only once a fold's watermark is above that bucket (every change that
/// dirtied it is then covered by a recount).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirtyMark {
    pub key: CounterKey,
    pub newest_bucket: BucketStart,
}

impl DirtyMark {
    /// A mark for a change to rows below every watermark (bucket 0): any fold covers it.
    pub fn settled(key: CounterKey) -> DirtyMark {
        DirtyMark {
            key,
            newest_bucket: 0,
        }
    }
}

/// An event that was skipped or could not be attributed, for the log.
#[derive(Clone, Debug, PartialEq)]
pub struct Skipped {
    pub token: Token,
    pub problem: Problem,
}

/// Everything one batch must write, in the order the worker writes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchPlan {
    pub counters: Vec<CounterDelta>,
    pub ledger: Vec<LedgerUpdate>,
    pub dirty: Vec<DirtyMark>,
    /// Events classified (stream-ending events excluded).
    pub events: usize,
    pub skipped: Vec<Skipped>,
    pub by_source: HashMap<&'static str, usize>,
}

impl BatchPlan {
    pub fn bad_events(&self) -> usize {
        self.skipped
            .iter()
            .filter(|s| matches!(s.problem, Problem::Bad(_)))
            .count()
    }
    pub fn unattributable_events(&self) -> usize {
        self.skipped.len() - self.bad_events()
    }
}

/// How much of `comments` the ledger describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coverage {
    /// Only the rows the stream has seen change: a comment without an entry is unknown.
    Partial,
    /// Every row the counters count (the initial snapshot claimed the rows that existed before
    /// the stream's start, see [`crate::snapshot`]): a comment without an entry does not count,
    /// and the ledger's state is every event's before-state.
    Complete,
}

/// Plans a batch against a ledger that covers only what the stream has seen (see
/// [`plan_batch_covering`]).
pub fn plan_batch(
    events: &[ChangeEvent],
    ledger: &LedgerView,
    attribution: Attribution,
    schema: &Schema,
    bucket_width_secs: i64,
) -> (BatchPlan, Option<StreamEnded>) {
    plan_batch_covering(PlanInput {
        events,
        ledger,
        coverage: Coverage::Partial,
        attribution,
        schema,
        bucket_width_secs,
        partition: None,
    })
}

/// What a batch is planned from.
#[derive(Clone, Copy)]
pub struct PlanInput<'a> {
    pub events: &'a [ChangeEvent],
    /// Comment keys to their ledger state before the batch (absent: no entry).
    pub ledger: &'a LedgerView,
    /// What an absent ledger entry means.
    pub coverage: Coverage,
    pub attribution: Attribution,
    pub schema: &'a Schema,
    pub bucket_width_secs: i64,
    /// Plan only this partition's part of each change (see [`own_part`]); `ledger` is then
    /// the partition's own view of it ([`Partition::own_view`]).
    pub partition: Option<Partition>,
}

/// Plans a batch. `input.ledger` maps comment keys to their ledger state before the batch
/// (absent: no entry), and `input.coverage` says what an absent entry means. Events after a
/// stream-ending event are not planned; the end is returned beside the plan of what came
/// before it.
pub fn plan_batch_covering(input: PlanInput<'_>) -> (BatchPlan, Option<StreamEnded>) {
    let mut planner = Planner::new(input);
    for event in input.events {
        if let Err(end) = planner.add(event) {
            return (planner.finish(), Some(end));
        }
    }
    (planner.finish(), None)
}

/// The plan of a batch as its events are added one by one, in stream order.
struct Planner<'a> {
    input: PlanInput<'a>,
    plan: BatchPlan,
    /// Each comment's state after the batch's events so far (the next event's before-state),
    /// in the order the batch first changed it: its ledger writes.
    known: IndexMap<String, LedgerUpdate>,
    counters: BTreeMap<CounterKey, CounterDelta>,
    /// The counters to mark dirty, in the order the batch first named them, each with the
    /// newest bucket the change may belong to.
    dirty: IndexMap<CounterKey, BucketStart>,
}

impl<'a> Planner<'a> {
    fn new(input: PlanInput<'a>) -> Self {
        Planner {
            input,
            plan: BatchPlan::default(),
            known: IndexMap::new(),
            counters: BTreeMap::new(),
            dirty: IndexMap::new(),
        }
    }

    /// Classifies one event against what is known before it and adds it to the plan; a
    /// stream-ending event adds nothing.
    fn add(&mut self, event: &ChangeEvent) -> Result<(), StreamEnded> {
        let (attribution, schema) = (self.input.attribution, self.input.schema);
        let before = self.before(event);
        let classified = classify(event, before.clone(), attribution, schema)?;
        let classified = match self.input.partition {
            Some(p) => own_part(p, classified, event, before.clone(), (attribution, schema)),
            None => classified,
        };
        self.plan.events += 1;
        *self
            .plan
            .by_source
            .entry(classified.source.into())
            .or_default() += 1;
        let newest = self.add_deltas(event, &classified);
        // Without a delta, the rows known before and after say which bucket the post's change
        // (a body edit, say) belongs to.
        let rows = [
            match &before {
                Before::Known(row) | Before::Complete(row) => row.as_ref(),
                Before::Unknown => None,
            },
            classified.after.known().and_then(Option::as_ref),
        ];
        if hidden_states(event, &classified, rows[0], schema) {
            for post in &classified.dirty {
                counter_of(&mut self.counters, post).touched.insert(0);
            }
        }
        self.name_rows(event, &classified);
        self.mark_dirty(event, &classified.dirty, rows, &newest);
        if let (After::Known(state), Some(comment)) = (classified.after, event.comment.as_ref()) {
            let known = self.known.entry(comment.key.clone());
            known
                .or_insert_with(|| LedgerUpdate {
                    comment: comment.clone(),
                    state: None,
                })
                .state = state;
        }
        if let Some(problem) = classified.problem {
            self.plan.skipped.push(Skipped {
                token: event.token.clone(),
                problem,
            });
        }
        Ok(())
    }

    /// The event's before-state: its comment's state after the batch's earlier events, else
    /// its ledger entry, read as `coverage` says.
    fn before(&self, event: &ChangeEvent) -> Before {
        let Some(key) = event.comment.as_ref().map(|c| c.key.as_str()) else {
            return Before::Unknown;
        };
        let seen = match self.known.get(key) {
            Some(known) => known.state.as_ref().map_or(Seen::Gone, Seen::Row),
            None => self.input.ledger.before(key),
        };
        match (seen, self.input.coverage) {
            (seen, Coverage::Complete) => Before::Complete(seen.row().cloned()),
            (Seen::Unknown, Coverage::Partial) => Before::Unknown,
            (seen, Coverage::Partial) => Before::Known(seen.row().cloned()),
        }
    }

    /// Adds the event's deltas to their counters' writes. Returns the newest bucket each
    /// counter's deltas changed.
    fn add_deltas(
        &mut self,
        event: &ChangeEvent,
        classified: &Classification,
    ) -> BTreeMap<CounterKey, BucketStart> {
        let (schema, bucket_width_secs) = (self.input.schema, self.input.bucket_width_secs);
        let mut newest: BTreeMap<CounterKey, BucketStart> = BTreeMap::new();
        for delta in &classified.deltas {
            let bucket = bucket_of(delta.created_at, bucket_width_secs);
            let key = &delta.key;
            let entry = counter_of(&mut self.counters, key);
            if entry.delta.checked_add(delta.amount).is_none() {
                // Never wrapped: the sum goes on as a double, and the event is reported.
                self.plan.skipped.push(Skipped {
                    token: event.token.clone(),
                    problem: Problem::Bad(Malformed::Overflow {
                        counter: counter_name(schema, key.counter),
                    }),
                });
            }
            entry.delta += delta.amount;
            *entry.buckets.entry(bucket).or_default() += delta.amount;
            entry.touched.insert(bucket);
            let n = newest.entry(key.clone()).or_insert(bucket);
            *n = (*n).max(bucket);
        }
        newest
    }

    /// Notes the event's row under every counter it named ([`CounterDelta::comments`]: in
    /// stream order without repeats; `None` once an event named the counter without a row id).
    fn name_rows(&mut self, event: &ChangeEvent, classified: &Classification) {
        let keys_named = classified
            .deltas
            .iter()
            .map(|d| &d.key)
            .chain(&classified.dirty);
        for key in keys_named {
            let named = &mut counter_of(&mut self.counters, key).comments;
            match (named.as_mut(), event.comment.as_ref()) {
                (Some(list), Some(c)) => {
                    if !list.iter().any(|known| known.key == c.key) {
                        list.push(c.clone());
                    }
                }
                (Some(_), None) => *named = None,
                (None, _) => {}
            }
        }
    }

    /// Marks the counters the event named dirty, each with the newest bucket the change may
    /// belong to: its deltas' (`newest`), else its known rows', else the event's own time.
    fn mark_dirty(
        &mut self,
        event: &ChangeEvent,
        named_dirty: &[CounterKey],
        rows: [Option<&Row>; 2],
        newest: &BTreeMap<CounterKey, BucketStart>,
    ) {
        let bucket_width_secs = self.input.bucket_width_secs;
        // A post named by the event without a delta (an unattributable change) is taken as
        // changed at the event's own time: only a recount above it covers the change.
        let event_bucket = event
            .cluster_time
            .map_or(0, |t| bucket_start(t.time as i64, bucket_width_secs));
        for key in named_dirty {
            let known_rows = rows
                .iter()
                .flatten()
                .filter(|r| r.group_in(key.counter) == Some(&key.group))
                .map(|r| bucket_of(r.created_at, bucket_width_secs))
                .max();
            let bucket = newest
                .get(key)
                .copied()
                .or(known_rows)
                .unwrap_or(event_bucket);
            let newest = self.dirty.entry(key.clone()).or_insert(bucket);
            *newest = (*newest).max(bucket);
        }
    }

    /// The plan of the events added so far.
    fn finish(mut self) -> BatchPlan {
        self.plan.counters = self
            .counters
            .into_values()
            .map(|mut c| {
                // A sum's changes that cancel out leave no bucket and no double behind (a row
                // with 2.5 inserted and deleted in one batch leaves an integer sum an integer).
                c.buckets.retain(|_, amount| !amount.is_zero());
                c.delta = c.buckets.values().sum();
                c
            })
            // A counter only named (a change that moved no count, such as a body edit of a
            // known row) is not written: its rows count as before for every watermark, and
            // their ledger entries stay at or before the counter's position.
            .filter(|c| !c.touched.is_empty())
            .collect();
        self.plan.dirty = self
            .dirty
            .into_iter()
            .map(|(key, newest_bucket)| DirtyMark { key, newest_bucket })
            .collect();
        self.plan.ledger = self.known.into_values().collect();
        self.plan
    }
}

/// Whether the event may hide intermediate states of its rows.
///
/// An update whose after-state was not derived from a complete description (the
/// `updateLookup` document, possibly later than the event, or nothing at all) may hide
/// intermediate states in any bucket: a restamp into a settled bucket, a soft delete and
/// undelete. A recount may have seen them, so the batch touches every bucket of the posts
/// it names (bucket 0 is below every watermark).
/// A delete known only from the ledger may follow such an update that named no row at
/// all (the fake server's update of a row gone before its lookup).
fn hidden_states(
    event: &ChangeEvent,
    classified: &Classification,
    before: Option<&Row>,
    schema: &Schema,
) -> bool {
    match &event.operation {
        // Derived at event time only from a complete description applied to a known row
        // (the pre-image's or the ledger's); a partition that knows the row only as "not
        // here" takes the looked-up one.
        Operation::Update { summary } => {
            let derived = summary.as_ref().filter(|s| s.complete).is_some_and(|s| {
                classified.source == Source::PreImage
                    || before.is_some_and(|row| schema.derives(s, row))
            });
            !derived || classified.source == Source::BestEffort
        }
        Operation::Delete => classified.source != Source::PreImage,
        _ => false,
    }
}

/// What `partition` applies of one classified event, for every definition (see
/// [`crate::core::partition`]):
/// - a change whose before-state is known: [`Partition::own_transition`], the before-row's
///   contributions taken back where that row is the partition's, the after-row's added where
///   that one is, whatever the counters' keys;
/// - a best-effort guess (no known before-state): the guess is the partition's where the row
///   the event shows is (its after-row, else the post its document names; neither: partition
///   0's).
///
/// Marks: a counter grouped by the partitions' field (the post) is marked by its owner, as
/// before; one grouped by another field by each partition that the event's rows belong to.
fn own_part(
    partition: Partition,
    mut classified: Classification,
    event: &ChangeEvent,
    ledger: Before,
    (attribution, schema): (Attribution, &Schema),
) -> Classification {
    let before = known_before(event, ledger, attribution, schema);
    let after = classified.after.known().or(before.as_ref()).cloned();
    let event_is_mine = match (&before, &after) {
        (Some(b), Some(a)) => partition.owns_row(b.as_ref()) || partition.owns_row(a.as_ref()),
        (_, Some(Some(row))) => partition.applies_row(row),
        _ => {
            let post = [event.full_document.as_ref(), Some(&event.document_key)]
                .into_iter()
                .flatten()
                .find_map(|d| schema.post_in(d));
            match post {
                Some(post) => partition.owns(&post),
                None => partition.index == 0,
            }
        }
    };
    let mine = |key: &CounterKey| match schema.shared(key.counter) {
        true => event_is_mine,
        false => partition.owns(&key.group),
    };
    classified.deltas = match (before, after) {
        (Some(b), Some(a)) => partition.own_transition(b.as_ref(), a.as_ref()),
        _ => std::mem::take(&mut classified.deltas)
            .into_iter()
            .filter(|d| mine(&d.key))
            .collect(),
    };
    classified.dirty.retain(|key| mine(key));
    classified
}

/// The batch's write for the counter `key`, empty until an event adds to it.
pub(crate) fn counter_of<'a>(
    counters: &'a mut BTreeMap<CounterKey, CounterDelta>,
    key: &CounterKey,
) -> &'a mut CounterDelta {
    counters.entry(key.clone()).or_insert_with(|| CounterDelta {
        key: key.clone(),
        delta: Num::ZERO,
        buckets: BTreeMap::new(),
        touched: BTreeSet::new(),
        comments: Some(Vec::new()),
    })
}

/// The name of definition `counter` (for a report).
fn counter_name(schema: &Schema, counter: CounterIx) -> String {
    schema
        .definitions
        .get(counter)
        .map_or_else(|| format!("#{}", counter.0), |d| d.name.clone())
}

/// The writes of one batch, recorded as its intent before any of them is issued. Replaying the
/// stored plan (not re-reading and re-classifying the events) makes recovery exact even though
/// `updateLookup` would now show later row states.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct PendingBatch {
    /// The batch's last event: the guard token of every write and the next checkpoint.
    pub end: Token,
    pub end_time: Option<Timestamp>,
    pub counters: Vec<CounterDelta>,
    pub ledger: Vec<LedgerUpdate>,
    pub dirty: Vec<DirtyMark>,
    /// The carry the batch belongs to (see [`crate::core::carry`]): the end of its first batch, under
    /// which the carry's batches store their counters and marks, this one's too if it may be
    /// carried (its intent then holds neither). `None`: nothing is carried, nothing stored.
    pub carry: Option<Token>,
}
