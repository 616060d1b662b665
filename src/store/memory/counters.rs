//! [`Counters`]: the per-post counters, guarded increments and conditional fold installs.

use std::collections::{BTreeMap, BTreeSet};

use bson::{DateTime, Timestamp};
use rand::Rng;

use super::{fence_ok, mongo_limit, not_gte, seam, upsert, Memory, MemoryStore};
use crate::core::batch::{CounterDelta, CounterWrite};
use crate::core::fold::{CounterState, Fold};
use crate::core::key::{CounterIx, CounterKey, GroupValue};
use crate::core::num::Num;
use crate::core::window::{Touch, LOG_ENTRIES};
use crate::store::{ApplyOutcome, CounterDoc, Fence, StoreResult, Writer, WriterPosition};

/// A stored counter document.
#[derive(Clone, Debug, Default)]
pub struct CounterRec {
    pub state: CounterState,
    /// The log of recent batches, oldest first (at most [`LOG_ENTRIES`]).
    pub recent: Vec<Touch>,
    pub folds: i64,
    /// The readers' field: `base_count + live_delta`, kept in the same writes.
    pub count: Num,
    pub last_drift: Option<Num>,
    pub reconciled_at: Option<DateTime>,
    /// Each writer's guard by its slot (see [`crate::store::Writer`]): slot 0's is the
    /// document's own fields (`applied_through`, `epoch`, ...), a partition `n > 0`'s of a
    /// counter several partitions write is `writers.p<n>`.
    pub writers: BTreeMap<u32, WriterRec>,
    /// Writes of every partition to a counter several partitions write.
    pub shared_writes: i64,
}

/// A writer's guard as stored: `(applied_through, epoch, snapshot_chunk)`.
type Guard<'a> = (Option<&'a str>, Option<i64>, Option<u64>);

/// One writer's guard.
#[derive(Clone, Debug, Default)]
pub struct WriterRec {
    pub applied_through: Option<String>,
    pub applied_time: Option<Timestamp>,
    pub touched: BTreeMap<i64, String>,
    pub epoch: Option<i64>,
    /// The last initial-snapshot chunk added to the counter.
    pub snapshot_chunk: Option<u64>,
}

impl CounterRec {
    /// Adds one write's increments (`live_delta`, `count`, each bucket) under the writer's
    /// epoch, by `$inc`'s numeric rules ([`Num`]).
    fn add(&mut self, delta: Num, buckets: &BTreeMap<i64, Num>, fence: &Fence, writer: Writer) {
        self.state.live_delta += delta;
        self.count += delta;
        for (bucket, amount) in buckets {
            *self.state.buckets.entry(*bucket).or_default() += *amount;
        }
        if writer.shared {
            self.shared_writes += 1;
        }
        self.writer(writer).epoch = Some(fence.epoch);
    }

    /// The writer's guard as stored.
    fn guard(&self, writer: Writer) -> Guard<'_> {
        self.writers
            .get(&writer.slot)
            .map_or((None, None, None), |w| {
                (w.applied_through.as_deref(), w.epoch, w.snapshot_chunk)
            })
    }

    /// The writer's guard, to write (made when new).
    fn writer(&mut self, writer: Writer) -> &mut WriterRec {
        self.writers.entry(writer.slot).or_default()
    }

    /// Records a write's position in the writer's guard.
    fn advance(&mut self, writer: Writer, w: &CounterWrite) {
        let rec = self.writer(writer);
        rec.applied_through = Some(w.through.to_string());
        rec.applied_time = w.through_time;
        rec.touched
            .extend(w.touched.iter().map(|(b, t)| (*b, t.to_string())));
    }
}

impl Memory {
    /// One statement of `write_counters`: the increment, if the counter's `applied_through` is
    /// below the write's and no newer epoch wrote it. Returns whether it applied (false: the
    /// upsert's insert hit the existing `_id`, a duplicate key: already applied).
    pub fn apply_counter(&mut self, fence: &Fence, w: &CounterWrite) -> bool {
        let admits = |(through, epoch, _): Guard<'_>| {
            not_gte(through, w.through.as_str()) && fence_ok(epoch, fence)
        };
        let Some((c, writer)) = self.admitted(fence, &w.key, admits) else {
            return false;
        };
        c.add(w.delta, &w.buckets, fence, writer);
        c.advance(writer, w);
        if !writer.shared {
            c.recent.extend(w.log.iter().cloned());
            let excess = c.recent.len().saturating_sub(LOG_ENTRIES);
            c.recent.drain(..excess);
        }
        true
    }

    /// The counter `key` as a write under `fence` finds it (made when new), with the writer
    /// it writes as, if the write's guard `admits` the stored one. `None`: refused, or no such
    /// definition (which the batch's call refuses up front).
    fn admitted(
        &mut self,
        fence: &Fence,
        key: &CounterKey,
        admits: impl FnOnce(Guard<'_>) -> bool,
    ) -> Option<(&mut CounterRec, Writer)> {
        let writer = fence.writer(self.shared(key.counter));
        let counters = &mut self.tables_mut(key.counter)?.counters;
        let admits = |c: &CounterRec| admits(c.guard(writer));
        let c = upsert(counters, key.group.clone(), admits, CounterRec::default)?;
        Some((c, writer))
    }

    /// Whether definition `counter` groups by another field than the post (its counters
    /// have several writers under partitions, see [`crate::store::Writer`]).
    pub fn shared(&self, counter: CounterIx) -> bool {
        self.definitions
            .get(counter.0)
            .is_some_and(|d| d.group != super::POST_FIELD)
    }

    /// One statement of `apply_snapshot_counters`: the increment, if the counter has not had
    /// this chunk (or a later one) yet.
    pub fn apply_snapshot_counter(&mut self, fence: &Fence, chunk: u64, w: &CounterDelta) -> bool {
        let admits =
            |(_, epoch, done): Guard<'_>| done.is_none_or(|n| n < chunk) && fence_ok(epoch, fence);
        let Some((c, writer)) = self.admitted(fence, &w.key, admits) else {
            return false;
        };
        c.add(w.delta, &w.buckets, fence, writer);
        c.writer(writer).snapshot_chunk = Some(chunk);
        true
    }

    /// `write_counters`: its statements, each on its own (`ordered: false`).
    pub fn write_counters(
        &mut self,
        fence: &Fence,
        writes: &[CounterWrite],
    ) -> StoreResult<ApplyOutcome> {
        let op = "apply counter increments";
        self.known_counters(op, writes.iter().map(|w| w.key.counter))?;
        Ok(ApplyOutcome::count(
            writes.iter().map(|w| self.apply_counter(fence, w)),
        ))
    }

    /// `apply_snapshot_counters`: its statements, each on its own.
    pub fn apply_snapshot_counters(
        &mut self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        let op = "apply a snapshot chunk's increments";
        self.known_counters(op, writes.iter().map(|w| w.key.counter))?;
        let statements = writes.iter();
        Ok(ApplyOutcome::count(
            statements.map(|w| self.apply_snapshot_counter(fence, chunk, w)),
        ))
    }

    /// Refuses a write for a definition without tables, as the MongoDB store refuses one it
    /// has no collection for.
    pub fn known_counters(
        &self,
        op: &'static str,
        mut counters: impl Iterator<Item = CounterIx>,
    ) -> StoreResult<()> {
        let unknown = counters.find(|c| c.0 >= self.tables.len());
        unknown.map_or(Ok(()), |c| Err(crate::store::unknown_counter(op, c)))
    }

    pub fn read_counter(&self, counter: CounterIx, post: &GroupValue) -> Option<CounterDoc> {
        let c = self.tables(counter).counters.get(post)?;
        let position = |w: &WriterRec| WriterPosition {
            applied_through: w.applied_through.clone(),
            applied_time: w.applied_time,
            touched: w.touched.clone(),
        };
        let own = c.writers.get(&0).map(position).unwrap_or_default();
        Some(CounterDoc {
            post: Some(post.clone()),
            state: c.state.clone(),
            applied_through: own.applied_through,
            applied_time: own.applied_time,
            touched: own.touched,
            recent: c.recent.clone(),
            folds: c.folds,
            writers: c
                .writers
                .iter()
                .filter(|(n, _)| **n > 0)
                .map(|(n, w)| (*n, position(w)))
                .collect(),
            shared_writes: c.shared_writes,
            // Kept in the same single-document writes as its parts (hand edits too).
            count: Some(c.count),
            last_drift: c.last_drift,
            reconciled_at: c.reconciled_at,
        })
    }

    /// Installs `fold` if the counter is still as `expected` (`None`: it must not exist, and
    /// the insert of an existing one is a duplicate key).
    pub fn install_fold(
        &mut self,
        counter: CounterIx,
        post: &GroupValue,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> bool {
        let Some(counters) = self.tables_mut(counter).map(|t| &mut t.counters) else {
            return false;
        };
        let new = || {
            let mut rec = CounterRec::default();
            rec.state.buckets = fold.kept.clone();
            rec.writer(Writer::default()).applied_through = Some(String::new());
            rec
        };
        let installed = match expected {
            None => upsert(counters, post.clone(), |_| false, new),
            Some(expected) => counters.get_mut(post).filter(|c| {
                let own = c.writers.get(&0).and_then(|w| w.applied_through.as_ref());
                own == expected.applied_through.as_ref()
                    && c.state.live_delta == expected.state.live_delta
                    && c.state.base_count == expected.state.base_count
                    && c.folds == expected.folds
                    && c.shared_writes == expected.shared_writes
            }),
        };
        let Some(c) = installed else {
            return false;
        };
        c.state.live_delta = fold.live_delta;
        c.state.base_count = fold.base_count;
        c.count = c.state.displayed();
        c.state.base_watermark = fold.watermark;
        c.last_drift = Some(fold.drift);
        c.reconciled_at = Some(now);
        for bucket in &fold.dropped {
            c.state.buckets.remove(bucket);
        }
        let touched = expected.iter().flat_map(|e| {
            let others = e.writers.iter().map(|(n, p)| (*n, &p.touched));
            std::iter::once((0, &e.touched)).chain(others)
        });
        for (slot, touched) in touched {
            if let Some(rec) = c.writers.get_mut(&slot) {
                for bucket in touched.keys().filter(|b| **b < fold.watermark) {
                    rec.touched.remove(bucket);
                }
            }
        }
        c.folds += 1;
        true
    }

    pub fn posts_after(
        &self,
        counter: CounterIx,
        after: Option<&GroupValue>,
        limit: usize,
    ) -> Vec<GroupValue> {
        let limit = mongo_limit(limit);
        let after_ok = |p: &GroupValue| after.is_none_or(|a| p > a);
        let from_comments: BTreeSet<GroupValue> = self
            .comments
            .values()
            .filter_map(|r| self.group_of(counter, r))
            .filter(after_ok)
            .collect();
        let counters = self.tables(counter).counters.keys();
        let from_counters = counters.filter(|p| after_ok(p)).take(limit);
        let mut posts: Vec<GroupValue> = from_comments
            .into_iter()
            .take(limit)
            .chain(from_counters.cloned())
            .collect();
        posts.sort();
        posts.dedup();
        posts.truncate(limit);
        posts
    }

    pub fn sample_posts(&mut self, counter: CounterIx, n: usize) -> Vec<GroupValue> {
        let with_counters: Vec<GroupValue> =
            self.tables(counter).counters.keys().cloned().collect();
        let with_rows: Vec<GroupValue> = self.live_groups(counter).into_iter().collect();
        let rng = &mut self.sample_rng;
        let mut posts = Vec::new();
        for all in [with_counters, with_rows] {
            posts
                .extend((0..n.min(all.len())).map(|_| all[rng.random_range(0..all.len())].clone()));
        }
        posts.sort();
        posts.dedup();
        posts
    }
}

seam!(Counters {
    try fn write_counters(fence: &Fence, writes: &[CounterWrite]) -> ApplyOutcome;
    view fn read_counter(post: &GroupValue) -> Option<CounterDoc>;
    view fn install_fold(post: &GroupValue, expected: Option<&CounterDoc>, fold: &Fold, now: DateTime) -> bool;
    view fn posts_after(after: Option<&GroupValue>, limit: usize) -> Vec<GroupValue>;
    view fn sample_posts(n: usize) -> Vec<GroupValue>;
    try fn apply_snapshot_counters(fence: &Fence, chunk: u64, writes: &[CounterDelta]) -> ApplyOutcome;
});
