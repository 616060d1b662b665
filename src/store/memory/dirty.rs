//! [`DirtySet`]: posts waiting for a recount.

use bson::DateTime;

use super::{mongo_limit, seam, upsert, Memory, MemoryStore};
use crate::core::batch::DirtyMark;
use crate::core::key::CounterIx;
use crate::core::key::GroupValue;
use crate::store::{DirtyEntry, DirtyOrder, DirtySummary, Fence};

/// A stored dirty entry: the entry as the seam lists it, and who marked it last.
#[derive(Clone, Debug)]
pub struct DirtyRec {
    pub entry: DirtyEntry,
    /// The stream that marked it last.
    pub stream: String,
    /// The fencing epoch of the worker that marked it last.
    pub epoch: i64,
}

impl Memory {
    /// One statement of `mark_dirty`: an entry this stream marked under a newer epoch refuses
    /// it; otherwise the upsert bumps its version and raises its newest bucket.
    pub fn mark_dirty_one(&mut self, fence: &Fence, m: &DirtyMark, now: DateTime) {
        let Some(dirty) = self.tables_mut(m.key.counter).map(|t| &mut t.dirty) else {
            return; // refused up front by `mark_dirty`
        };
        let admits = |d: &DirtyRec| d.stream != fence.stream || d.epoch <= fence.epoch;
        let new = || DirtyRec {
            entry: DirtyEntry {
                post: m.key.group.clone(),
                first_dirty_at: now,
                last_dirty_at: now,
                version: 0,
                newest_bucket: Some(m.newest_bucket),
            },
            stream: fence.stream.clone(),
            epoch: fence.epoch,
        };
        let Some(rec) = upsert(dirty, m.key.group.clone(), admits, new) else {
            return;
        };
        let entry = &mut rec.entry;
        entry.newest_bucket = entry.newest_bucket.max(Some(m.newest_bucket));
        entry.version += 1;
        entry.last_dirty_at = now;
        rec.stream = fence.stream.clone();
        rec.epoch = fence.epoch;
    }

    pub fn dirty_list(
        &self,
        counter: CounterIx,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> Vec<DirtyEntry> {
        let mut list: Vec<DirtyEntry> = self
            .tables(counter)
            .dirty
            .iter()
            .filter(|(_, d)| stream.is_none_or(|st| d.stream == st))
            .map(|(_, d)| d.entry.clone())
            .collect();
        match order {
            DirtyOrder::Oldest => list.sort_by_key(|d| (d.first_dirty_at, d.post.clone())),
            DirtyOrder::ByVersion => list.sort_by_key(|d| (-d.version, d.post.clone())),
        }
        list.truncate(mongo_limit(limit));
        list
    }

    pub fn dirty_summary(&self, counter: CounterIx) -> DirtySummary {
        let dirty = &self.tables(counter).dirty;
        DirtySummary {
            size: dirty.len() as u64,
            oldest: dirty.values().map(|d| d.entry.first_dirty_at).min(),
        }
    }

    pub fn clear_dirty(&mut self, counter: CounterIx, post: &GroupValue, version: i64) -> bool {
        let Some(dirty) = self.tables_mut(counter).map(|t| &mut t.dirty) else {
            return false;
        };
        dirty.get(post).is_some_and(|d| d.entry.version == version) && dirty.remove(post).is_some()
    }

    pub fn requeue_dirty(&mut self, counter: CounterIx, post: &GroupValue, now: DateTime) -> bool {
        let Some(d) = self.tables_mut(counter).and_then(|t| t.dirty.get_mut(post)) else {
            return false;
        };
        d.entry.first_dirty_at = d.entry.first_dirty_at.max(now);
        true
    }

    pub fn dirty_posts(&self, counter: CounterIx) -> Vec<GroupValue> {
        self.tables(counter).dirty.keys().cloned().collect()
    }

    /// `mark_dirty`: its statements, each on its own.
    pub fn mark_dirty(
        &mut self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> crate::store::StoreResult<()> {
        self.known_counters("mark posts dirty", marks.iter().map(|m| m.key.counter))?;
        for mark in marks {
            self.mark_dirty_one(fence, mark, now);
        }
        Ok(())
    }
}

seam!(DirtySet {
    try fn mark_dirty(fence: &Fence, marks: &[DirtyMark], now: DateTime) -> ();
    view fn dirty_list(stream: Option<&str>, order: DirtyOrder, limit: usize) -> Vec<DirtyEntry>;
    view fn dirty_summary() -> DirtySummary;
    view fn clear_dirty(post: &GroupValue, version: i64) -> bool;
    view fn requeue_dirty(post: &GroupValue, now: DateTime) -> bool;
});
