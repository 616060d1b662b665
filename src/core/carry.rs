//! Pure: counter increments carried from batch to batch while the worker is behind.
//!
//! # Why
//! A batch coalesces its own events: a hot post touched forty times in a batch gets one `$inc`.
//! How many writes that saves depends on how many events one write covers, and a batch's events
//! are held in memory until it is written, so the memory budget bounds a batch to a few
//! thousand events. On a skewed load (Zipf) many posts are touched once or twice per batch
//! and again in the next one. Carrying a counter's increments over several batches and writing
//! them once covers many more events per write, without holding the events: what is carried is
//! one small record per counter, not the events that made it.
//!
//! # How it stays exact
//! Each batch is still planned, recorded and written on its own: its intent, then its ledger
//! states. Only its counter increments, its dirty marks (merged the same way: one mark per
//! counter, with the newest bucket) and the checkpoint wait. A batch that may be carried has
//! its counters and marks stored once, as planned, under the carry's id just before its
//! intent (which then holds only its ledger states and names the carry), so a crash anywhere
//! re-applies the whole carry exactly: a stopped worker's successor merges the carry's stored
//! batches with the pending one and writes them before it reads the stream. The checkpoint
//! never passes a carried increment or mark, so every position the reconciler trusts (at or
//! below the checkpoint) still has its counters written and its posts marked, as with one
//! batch in flight.
//!
//! The merged write of a counter is the one its batches' own writes, one after the other,
//! would have left ([`crate::core::batch::CounterWrite`]): the guard is the end of the *last* batch
//! that touched the counter, each bucket records the last batch that changed it, and each batch
//! keeps its own entry in the counter's log, so a row-level recount (see
//! [`crate::core::window`]) finds each changed row's ledger entry written by the batch its
//! entry names.
//!
//! What is carried costs memory and staleness (a counter shown to readers lags the carry), so
//! the worker carries only while it is well behind (catching up a backlog, not keeping up with
//! live writes), within its share of the memory budget and for a bounded time (see
//! `crate::worker`).

use std::collections::BTreeMap;

use bson::{Bson, RawArrayBuf, RawBson, RawDocument, Timestamp};
use smallvec::SmallVec;

use crate::core::batch::{CounterDelta, CounterWrite, DirtyMark, PendingBatch};
use crate::core::cost;
use crate::core::event::{CommentId, Token};
use crate::core::key::CounterKey;
use crate::core::num::Num;
use crate::core::time::BucketStart;
use crate::core::window::{Touch, LOG_COMMENTS, LOG_ENTRIES};

/// The counters of the batches applied since the checkpoint, not written yet.
#[derive(Debug, Default)]
pub struct Carry {
    /// The ends of the batches merged into `merged`, oldest first (a batch's index here names
    /// it in [`Merged`]).
    ends: Vec<(Token, Option<Timestamp>)>,
    merged: BTreeMap<CounterKey, Merged>,
    /// Some batch's counters are stored under the carry's id: once written, the stored
    /// copies are cleared.
    stored: bool,
    /// The running [`Carry::charge`].
    charge: usize,
}

/// One counter's increments and dirty mark over the carried batches, held compactly (a carry
/// holds thousands): small sorted vectors, inline for the first element, rather than maps,
/// since most carried counters were touched by one batch in one bucket, and the rows a log
/// entry lists as their raw BSON ids.
#[derive(Debug, Default)]
struct Merged {
    delta: Num,
    /// Non-zero amounts per bucket, by bucket.
    buckets: SmallVec<[(BucketStart, Num); 1]>,
    /// Bucket → the last batch (index into `Carry::ends`) that changed it, by bucket.
    touched: SmallVec<[(BucketStart, u32); 1]>,
    /// One entry per batch that touched the counter, oldest first: the batch and the ids of
    /// the rows it listed, as the bytes of a BSON array (`None`: unlisted). The newest
    /// [`LOG_ENTRIES`], as the counter's log keeps. Empty: the counter is only marked dirty.
    log: SmallVec<[LogEntry; 1]>,
    /// The newest bucket of the batches' dirty marks (`None`: not marked).
    marked: Option<BucketStart>,
}

/// A merged log entry: the batch (index into `Carry::ends`) and its listed row ids as the
/// bytes of a BSON array (`None`: unlisted).
type LogEntry = (u32, Option<Box<[u8]>>);

/// Sets `key`'s value in a vector sorted by key: `update` of the old one, or of the default.
fn upsert<K: Ord + Copy, V: Default>(
    entries: &mut SmallVec<[(K, V); 1]>,
    key: K,
    update: impl FnOnce(&mut V),
) {
    let at = match entries.binary_search_by(|(k, _)| k.cmp(&key)) {
        Ok(at) => at,
        Err(at) => {
            entries.insert(at, (key, V::default()));
            at
        }
    };
    update(&mut entries[at].1);
}

impl Carry {
    /// The carry's id: the end of its first batch (`None`: nothing carried). A batch that
    /// continues the carry records it in its intent, and the batches carried before it are
    /// stored under it, so a restart finds exactly this carry's batches.
    pub fn id(&self) -> Option<&Token> {
        self.ends.first().map(|(end, _)| end)
    }

    /// Rebuilds the carry a stopped worker left, one stored batch at a time (oldest first,
    /// merged as it comes, so recovery holds the carry as compactly as the worker did): a
    /// batch stored under the carry's id.
    pub fn push_stored(&mut self, batch: PendingBatch) {
        self.push(batch.end, batch.end_time, batch.counters, batch.dirty);
        self.stored = true;
    }

    /// Then the batch whose intent is pending, unless it is the newest stored one (its
    /// counters and marks were stored instead of recorded in its intent).
    pub fn push_pending(&mut self, pending: &PendingBatch) {
        if self.end().is_some_and(|(end, _)| *end == pending.end) {
            return;
        }
        self.push(
            pending.end.clone(),
            pending.end_time,
            pending.counters.clone(),
            pending.dirty.clone(),
        );
    }

    /// Whether batches are carried (their counters and the checkpoint not written yet).
    pub fn is_open(&self) -> bool {
        !self.ends.is_empty()
    }

    /// Batches carried.
    pub fn batches(&self) -> usize {
        self.ends.len()
    }

    /// Counters a flush writes now (an upper bound: some may be only marked dirty).
    pub fn counters(&self) -> usize {
        self.merged.len()
    }

    /// What the carry holds, in the memory budget's bytes.
    pub fn charge(&self) -> usize {
        self.charge
    }

    /// Whether some batch's counters are stored under the carry's id (see
    /// [`Carry::stored_under_id`]): to be cleared once the carry is written.
    pub fn is_stored(&self) -> bool {
        self.stored
    }

    /// Records that the carry's newest batch's counters and marks were stored under its id.
    pub fn stored_under_id(&mut self) {
        self.stored = true;
    }

    /// Carries one more batch: the one ending at `end`, with its planned `counters` and dirty
    /// marks, merged into what is carried at once.
    pub fn push(
        &mut self,
        end: Token,
        end_time: Option<Timestamp>,
        counters: Vec<CounterDelta>,
        dirty: Vec<DirtyMark>,
    ) {
        let index = self.ends.len() as u32;
        self.ends.push((end, end_time));
        for mark in dirty {
            let merged = self.entry(mark.key);
            merged.marked = merged.marked.max(Some(mark.newest_bucket));
        }
        for d in counters {
            let listed = d
                .comments
                .filter(|c| c.len() <= LOG_COMMENTS)
                .and_then(|c| raw_ids(&c));
            let added = log_charge(&listed);
            let merged = self.entry(d.key);
            for (bucket, amount) in d.buckets {
                upsert(&mut merged.buckets, bucket, |sum| *sum += amount);
            }
            merged.buckets.retain(|(_, amount)| !amount.is_zero());
            // The buckets' sum, as `plan_batch` makes a batch's (a sum's amounts that cancel
            // leave no double behind).
            merged.delta = merged.buckets.iter().map(|(_, a)| *a).sum();
            for bucket in d.touched {
                upsert(&mut merged.touched, bucket, |last| *last = index);
            }
            merged.log.push((index, listed));
            let dropped = if merged.log.len() > LOG_ENTRIES {
                log_charge(&merged.log.remove(0).1)
            } else {
                0
            };
            self.charge = self.charge + added - dropped;
        }
    }

    /// The merged entry of a counter, made (and charged) when it is new.
    fn entry(&mut self, key: CounterKey) -> &mut Merged {
        self.merged.entry(key).or_insert_with(|| {
            self.charge += cost::CARRIED_COUNTER;
            Merged::default()
        })
    }

    /// The end of the newest batch: where the checkpoint moves once the carry is written.
    pub fn end(&self) -> Option<(&Token, Option<Timestamp>)> {
        self.ends.last().map(|(end, at)| (end, *at))
    }

    /// The dirty marks of every carried batch, one per counter (with the newest bucket), in
    /// counter and post order. Taken before [`Carry::take_writes`], which empties the carry.
    pub fn take_dirty(&mut self) -> Vec<DirtyMark> {
        self.merged
            .iter_mut()
            .filter_map(|(key, m)| {
                m.marked.take().map(|newest_bucket| DirtyMark {
                    key: key.clone(),
                    newest_bucket,
                })
            })
            .collect()
    }

    /// The writes of every carried counter, one per counter, in counter and post order: made
    /// one by one as they are taken (a flush writes them in slices, so that only a slice of
    /// statements is held at once). Empties the carry.
    pub fn take_writes(&mut self) -> impl Iterator<Item = CounterWrite> {
        let Carry { ends, merged, .. } = std::mem::take(self);
        merged
            .into_iter()
            .filter(|(_, m)| !m.log.is_empty())
            .map(move |(key, m)| {
                let end = |index: u32| &ends[index as usize];
                let (through, through_time) = end(m.log.last().expect("not empty").0);
                CounterWrite {
                    key,
                    delta: m.delta,
                    buckets: m.buckets.into_iter().collect(),
                    through: through.clone(),
                    through_time: *through_time,
                    touched: m
                        .touched
                        .into_iter()
                        .map(|(bucket, index)| (bucket, end(index).0.clone()))
                        .collect(),
                    log: m
                        .log
                        .into_iter()
                        .map(|(index, ids)| Touch {
                            through: end(index).0.as_str().to_string(),
                            comments: ids.and_then(|ids| comment_ids(&ids)),
                        })
                        .collect(),
                }
            })
    }
}

/// Row ids as the bytes of a raw BSON array, exactly sized (`None`: one that cannot be
/// encoded, which leaves the entry unlisted: a recount spanning it refuses, never miscounts).
fn raw_ids(ids: &[CommentId]) -> Option<Box<[u8]>> {
    let mut raw = RawArrayBuf::new();
    for id in ids {
        raw.push(RawBson::try_from(id.value.clone()).ok()?);
    }
    Some(raw.as_bytes().into())
}

/// The row ids of [`raw_ids`] again.
fn comment_ids(raw: &[u8]) -> Option<Vec<CommentId>> {
    let array = RawDocument::from_bytes(raw).ok()?;
    array
        .into_iter()
        .map(|element| {
            let (_, value) = element.ok()?;
            Some(CommentId::new(Bson::try_from(value).ok()?))
        })
        .collect()
}

/// What a merged log entry holds: the entry and its listed ids' bytes.
fn log_charge(ids: &Option<Box<[u8]>>) -> usize {
    cost::CARRIED_TOUCH + ids.as_ref().map_or(0, |ids| ids.len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use bson::Bson;

    use super::*;
    use crate::core::key::{CounterIx, GroupValue};

    fn token(n: u32) -> Token {
        Token(format!("{n:04}"))
    }

    fn id(n: i32) -> CommentId {
        CommentId::new(Bson::Int32(n))
    }

    /// The cluster time every test batch ends at.
    const END_TIME: Option<Timestamp> = Some(Timestamp {
        time: 7,
        increment: 1,
    });

    fn delta(post: i64, buckets: &[(BucketStart, i64)], rows: &[i32]) -> CounterDelta {
        CounterDelta {
            key: CounterKey::new(CounterIx::DEFAULT, GroupValue::Int(post)),
            delta: Num::Int(buckets.iter().map(|(_, a)| a).sum()),
            buckets: buckets
                .iter()
                .filter(|(_, a)| *a != 0)
                .map(|(b, a)| (*b, Num::Int(*a)))
                .collect(),
            touched: buckets.iter().map(|(b, _)| *b).collect::<BTreeSet<_>>(),
            comments: Some(rows.iter().map(|n| id(*n)).collect()),
        }
    }

    /// The counter a sequence of per-batch writes leaves, as the store applies them: the
    /// reference the merged write must equal.
    fn written_one_by_one(batches: &[(Token, Vec<CounterDelta>)], post: i64) -> CounterWrite {
        let mut out: Option<CounterWrite> = None;
        for (end, deltas) in batches {
            for d in deltas
                .iter()
                .filter(|d| d.key.group == GroupValue::Int(post))
            {
                let w = CounterWrite::of_batch(d, end, END_TIME);
                let Some(acc) = &mut out else {
                    out = Some(w);
                    continue;
                };
                acc.delta += w.delta;
                for (b, a) in w.buckets {
                    *acc.buckets.entry(b).or_default() += a;
                }
                acc.buckets.retain(|_, a| *a != 0);
                acc.touched.extend(w.touched);
                acc.log.extend(w.log);
                let excess = acc.log.len().saturating_sub(LOG_ENTRIES);
                acc.log.drain(..excess);
                acc.through = w.through;
                acc.through_time = w.through_time;
            }
        }
        out.expect("the post was touched")
    }

    #[test]
    fn a_carried_counter_is_written_as_its_batches_would_have_left_it() {
        let batches = vec![
            (
                token(1),
                vec![
                    delta(1, &[(0, 1), (60, 1)], &[1, 2]),
                    delta(2, &[(0, 1)], &[3]),
                ],
            ),
            (token(2), vec![delta(2, &[(0, -1)], &[3])]),
            (token(3), vec![delta(1, &[(60, -1), (120, 1)], &[2, 4])]),
            (token(4), vec![delta(3, &[(0, 0)], &[5])]),
        ];
        let mut carry = Carry::default();
        for (end, deltas) in &batches {
            carry.push(end.clone(), END_TIME, deltas.clone(), vec![]);
        }
        assert_eq!(carry.batches(), 4);
        assert_eq!(carry.end().map(|(t, _)| t.clone()), Some(token(4)));
        let writes: Vec<CounterWrite> = carry.take_writes().collect();
        assert!(!carry.is_open(), "taking the writes empties the carry");
        assert_eq!(carry.charge(), 0);
        assert_eq!(writes.len(), 3, "one write per counter");
        for (post, w) in [1, 2, 3].into_iter().zip(&writes) {
            assert_eq!(*w, written_one_by_one(&batches, post), "post {post}");
        }
        // Spelled out for post 1: the guard is the last batch that touched it, not the carry's
        // end; bucket 60 nets to zero but stays touched by batch 3.
        assert_eq!(writes[0].through, token(3));
        assert_eq!(writes[0].delta, 2);
        assert_eq!(
            writes[0].buckets,
            BTreeMap::from([(0, Num::ONE), (120, Num::ONE)])
        );
        assert_eq!(writes[0].touched[&60], token(3));
        assert_eq!(writes[0].touched[&0], token(1));
        assert_eq!(writes[0].log.len(), 2);
        // Post 2 nets to zero and is still written: its log and buckets record the batches.
        assert_eq!(
            (writes[1].delta, writes[1].through.clone()),
            (Num::ZERO, token(2))
        );
    }

    #[test]
    fn the_log_keeps_the_newest_entries_and_long_lists_are_unlisted() {
        let many: Vec<i32> = (0..=LOG_COMMENTS as i32).collect();
        let batches: Vec<(Token, Vec<CounterDelta>)> = (0..LOG_ENTRIES as u32 + 3)
            .map(|n| {
                let rows = if n == 0 { many.clone() } else { vec![n as i32] };
                (token(n), vec![delta(1, &[(0, 1)], &rows)])
            })
            .collect();
        let mut carry = Carry::default();
        let mut charged = Vec::new();
        for (end, deltas) in &batches {
            carry.push(end.clone(), None, deltas.clone(), vec![]);
            charged.push(carry.charge());
        }
        let full = &charged[LOG_ENTRIES + 1..];
        assert!(
            full.windows(2).all(|w| w[0] == w[1]),
            "a full log is charged the same: what falls off is no longer charged ({full:?})"
        );
        let writes: Vec<CounterWrite> = carry.take_writes().collect();
        assert_eq!(writes[0].log.len(), LOG_ENTRIES);
        assert_eq!(
            writes[0].log[0].through,
            token(3).0,
            "the oldest entries fall off"
        );
        assert_eq!(
            writes[0].log[1].comments,
            Some(vec![id(4)]),
            "ids kept raw, read back"
        );
        let mut carry = Carry::default();
        carry.push(token(1), None, vec![delta(1, &[(0, 1)], &many)], vec![]);
        assert_eq!(
            carry.take_writes().next().unwrap().log[0].comments,
            None,
            "too many rows to list"
        );
    }

    #[test]
    fn a_stopped_workers_carry_is_merged_again_from_what_it_stored() {
        let batches = [
            (
                token(1),
                vec![delta(1, &[(0, 1)], &[1]), delta(2, &[(0, 1)], &[2])],
            ),
            (token(2), vec![delta(1, &[(0, 1)], &[3])]),
            (token(3), vec![delta(2, &[(0, -1)], &[2])]),
        ];
        let planned = |n: usize| PendingBatch {
            end: batches[n].0.clone(),
            counters: batches[n].1.clone(),
            dirty: vec![mark(1, n as i64)],
            ..PendingBatch::default()
        };
        let mut live = Carry::default();
        for n in 0..batches.len() {
            let batch = planned(n);
            live.push(batch.end, batch.end_time, batch.counters, batch.dirty);
        }
        let (dirty, writes) = (live.take_dirty(), live.take_writes().collect::<Vec<_>>());
        // Each batch stored its counters and marks just before its own intent, which then
        // holds neither.
        let stored: Vec<PendingBatch> = (0..3).map(planned).collect();
        let pending = PendingBatch {
            counters: vec![],
            dirty: vec![],
            ..planned(2)
        };
        let again = |stored: &[PendingBatch], pending: &PendingBatch| {
            let mut carry = Carry::default();
            for batch in stored {
                carry.push_stored(batch.clone());
            }
            carry.push_pending(pending);
            carry
        };
        let mut carry = again(&stored, &pending);
        assert!(carry.is_stored());
        assert_eq!(carry.batches(), 3, "the pending batch is its stored copy");
        assert_eq!(carry.take_dirty(), dirty);
        assert_eq!(carry.take_writes().collect::<Vec<_>>(), writes);
        // The newest batch kept its counters in its intent (the worker had caught up).
        let mut carry = again(&stored[..2], &planned(2));
        assert_eq!(carry.take_dirty(), dirty);
        assert_eq!(carry.take_writes().collect::<Vec<_>>(), writes);
        // Nothing stored: the pending batch alone, nothing to clear.
        let alone = again(&[], &planned(0));
        assert!(!alone.is_stored());
        assert_eq!(alone.batches(), 1);
    }

    fn mark(post: i64, newest_bucket: BucketStart) -> DirtyMark {
        DirtyMark {
            key: CounterKey::new(CounterIx::DEFAULT, GroupValue::Int(post)),
            newest_bucket,
        }
    }

    #[test]
    fn dirty_marks_merge_to_one_per_counter_with_the_newest_bucket() {
        let mut carry = Carry::default();
        carry.push(token(1), None, vec![], vec![mark(1, 60), mark(2, 0)]);
        assert_eq!(carry.charge(), 2 * cost::CARRIED_COUNTER);
        carry.push(token(2), None, vec![], vec![mark(1, 0), mark(3, 120)]);
        assert_eq!(carry.charge(), 3 * cost::CARRIED_COUNTER, "one per counter");
        carry.push(token(3), None, vec![], vec![mark(2, 180)]);
        assert_eq!(carry.charge(), 3 * cost::CARRIED_COUNTER);
        assert_eq!(
            carry.take_dirty(),
            vec![mark(1, 60), mark(2, 180), mark(3, 120)]
        );
        assert_eq!(
            carry.take_writes().count(),
            0,
            "marked only: nothing to write"
        );
        assert!(!carry.is_open());
    }

    #[test]
    fn the_charge_follows_what_is_held() {
        let entry = |ids: &[i32]| {
            let ids: Vec<CommentId> = ids.iter().map(|n| id(*n)).collect();
            log_charge(&raw_ids(&ids))
        };
        let mut carry = Carry::default();
        assert_eq!(carry.charge(), 0);
        carry.push(token(1), None, vec![delta(1, &[(0, 1)], &[1])], vec![]);
        assert_eq!(carry.charge(), cost::CARRIED_COUNTER + entry(&[1]));
        carry.push(token(2), None, vec![delta(1, &[(0, 1)], &[2])], vec![]);
        carry.push(token(3), None, vec![], vec![]);
        // One merged counter with two entries.
        assert_eq!(
            carry.charge(),
            cost::CARRIED_COUNTER + entry(&[1]) + entry(&[2])
        );
        assert!(
            entry(&[1]) < cost::CARRIED_TOUCH + 16,
            "an id is a few raw bytes"
        );
        assert_eq!(carry.counters(), 1);
        assert_eq!(carry.batches(), 3);
    }
}
