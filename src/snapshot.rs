//! The initial snapshot: counting the rows that existed before the stream's start.
//!
//! A stream started on a `comments` collection that already has rows sees only what changes
//! from then on. The snapshot adds the rest, consistently with the stream, by the chunk
//! technique of change-data-capture snapshots (DBLog; Debezium's incremental snapshots), made
//! simple by the comment ledger:
//!
//! 1. the stream's start is pinned *before* anything is read, so every change after the scan
//!    reads a row is in the stream;
//! 2. the worker scans `comments` in `_id` order, one chunk at a time, *between* its batches
//!    (never concurrently with one), up to the largest `_id` that existed at the start;
//! 3. each row the ledger does not know yet is **claimed**: its state as read becomes its
//!    ledger entry (only where no entry exists), and it adds one to its post's counter if it
//!    counts. A row the ledger already knows was seen by the stream, whose state is newer than
//!    the read: the stream wins, and the snapshot adds nothing for it.
//!
//! From the start, the ledger is then *complete*: every row the counters count has an entry,
//! and each counter is the number of its post's entries that count. A comment without an entry
//! is known not to count, and an event's before-state is always the ledger's (also for an
//! insert, whose row a chunk may have claimed before the worker reached its event). An event
//! older than the read it is applied after re-derives states the claim already holds: the
//! transitions telescope back to the claimed state, so nothing counts twice.
//!
//! Each chunk is crash-safe like a batch: its plan (claims and increments) is recorded as an
//! intent in the checkpoint, then the claims are written (`$setOnInsert`), then the increments
//! (each guarded by the counter's `snapshot_chunk < n`), then the cursor moves. A restart
//! finishes a recorded chunk exactly as planned before anything else, so a chunk is read at
//! most once more after a crash, and its writes land once. Folds wait until the snapshot is
//! done (a recount would count rows that a later chunk then adds again), and none is folded
//! from a recount the snapshot began or moved during ([`crate::recount::snapshot_moved`]).

use std::collections::BTreeMap;
use std::time::Duration;

use bson::DateTime;

use crate::config::InitialSnapshot;
use crate::core::batch::{counter_of, CounterDelta};
use crate::core::event::{CommentId, Row};
use crate::core::event::{LedgerUpdate, LedgerView};
use crate::core::key::CounterKey;
use crate::core::partition::Partition;
use crate::core::time::bucket_of;
use crate::store::{
    Checkpoint, CommentsExtent, Fence, SnapshotChunk, SnapshotProgress, SnapshotState, Store,
    StoreResult,
};
use crate::telemetry as m;

/// The snapshot's knobs (from the configuration, see [`crate::daemon`]).
#[derive(Clone, Debug)]
pub struct SnapshotSettings {
    pub initial: InitialSnapshot,
    /// Rows read per chunk.
    pub chunk_rows: usize,
    /// Rows read per second at most (0: unthrottled).
    pub rows_per_second: u32,
}

impl SnapshotSettings {
    /// The pause after a chunk of `rows` that keeps the scan at `rows_per_second`.
    pub fn pause_after(&self, rows: u64) -> Duration {
        match self.rows_per_second {
            0 => Duration::ZERO,
            rate => Duration::from_secs_f64(rows as f64 / rate as f64),
        }
    }
}

/// A new snapshot over `extent`, begun at `now` (done at once on an empty collection).
pub fn begin(extent: &CommentsExtent, now: DateTime) -> SnapshotProgress {
    let empty = extent.last_id.is_none();
    SnapshotProgress {
        state: if empty {
            SnapshotState::Done
        } else {
            SnapshotState::Running
        },
        started_at: now,
        finished_at: empty.then_some(now),
        last_id: extent.last_id.clone(),
        cursor: None,
        chunks_done: 0,
        rows_scanned: 0,
        rows_counted: 0,
        estimated_rows: extent.estimated_rows,
        pending: None,
        chunks_resumed: 0,
        reading: None,
        chunks_reread: 0,
    }
}

/// Plans chunk `number` over `rows` (read in `_id` order): claims for the rows `ledger` has no
/// entry for (of `partition`'s posts, if any), and one increment per post for the claims that
/// count.
pub fn plan_chunk(
    number: u64,
    rows: &[(CommentId, Row)],
    ledger: &LedgerView,
    partition: Option<Partition>,
    bucket_width_secs: i64,
) -> SnapshotChunk {
    let mut counters: BTreeMap<CounterKey, CounterDelta> = BTreeMap::new();
    let mut claims = Vec::new();
    for (comment, row) in rows {
        if ledger.contains_key(&comment.key) {
            continue; // the stream saw this row: its entry is newer than the read
        }
        if partition.is_some_and(|p| !p.owns_row(Some(row))) {
            continue; // another partition's row (see `crate::core::partition`)
        }
        claims.push(LedgerUpdate {
            comment: comment.clone(),
            state: Some(row.clone()),
        });
        // One claim, counted in every definition it counts for.
        let bucket = bucket_of(row.created_at, bucket_width_secs);
        for counter in row.counters() {
            let Some((group, amount)) = row.contribution(counter) else {
                continue;
            };
            let entry = counter_of(&mut counters, &CounterKey::new(counter, group.clone()));
            entry.delta += amount;
            *entry.buckets.entry(bucket).or_default() += amount;
            entry.touched.insert(bucket);
        }
    }
    SnapshotChunk {
        number,
        last: rows.last().map(|(c, _)| c.clone()),
        rows: rows.len() as u64,
        claims,
        counters: counters.into_values().collect(),
    }
}

/// The progress once `chunk` is done.
pub fn finish_chunk(progress: &mut SnapshotProgress, chunk: &SnapshotChunk) {
    progress.cursor = chunk.last.clone().or(progress.cursor.take());
    progress.chunks_done = progress.chunks_done.max(chunk.number);
    progress.rows_scanned += chunk.rows;
    // Live rows claimed (a sum's amounts are not rows).
    let live = |c: &&LedgerUpdate| c.state.as_ref().is_some_and(Row::is_live);
    progress.rows_counted += chunk.claims.iter().filter(live).count() as u64;
    progress.pending = None;
    progress.reading = None;
}

/// Seconds left at `rows_per_second`, from the estimated size (`None`: unknown or unthrottled).
pub fn seconds_left(progress: &SnapshotProgress, rows_per_second: u32) -> Option<u64> {
    if progress.state != SnapshotState::Running || rows_per_second == 0 {
        return None;
    }
    let left = progress
        .estimated_rows
        .saturating_sub(progress.rows_scanned);
    Some(left.div_ceil(rows_per_second as u64))
}

/// What one call of [`Snapshotter::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A chunk of this many rows was read and applied.
    Chunk { rows: u64 },
    /// The scan reached the end: the snapshot is done.
    Done,
    /// Nothing to do (no snapshot running).
    Idle,
}

/// Where the snapshot does its I/O: the store, the stream's fence, and the worker's view of the
/// checkpoint (kept up to date here).
pub struct Snapshotter<'a, S: Store + ?Sized> {
    pub store: &'a S,
    pub fence: &'a Fence,
    pub settings: &'a SnapshotSettings,
    pub partition: Option<Partition>,
    pub bucket_width_secs: i64,
    pub clock: &'a dyn crate::clock::Clock,
}

impl<S: Store + ?Sized> Snapshotter<'_, S> {
    /// Begins a snapshot if the stream has never applied anything and none was taken: pins the
    /// start at the server's position (so the stream has every change after the scan's reads),
    /// then records the extent to scan. Returns whether one began.
    pub async fn begin_if_new(
        &self,
        checkpoint: &mut Checkpoint,
        configured_start: Option<bson::Timestamp>,
    ) -> StoreResult<bool> {
        if !checkpoint.untouched() || self.settings.initial == InitialSnapshot::Never {
            return Ok(false);
        }
        if checkpoint.start_time.is_none() && configured_start.is_none() {
            // The server's own position, not this process's clock: a clock ahead of the
            // server's would start the stream after changes the scan does not see.
            let at = self.store.read_position().await?.lower;
            self.store.record_start(self.fence, at).await?;
            checkpoint.start_time = Some(at);
        }
        let extent = self.store.comments_extent().await?;
        let progress = begin(&extent, self.clock.now());
        self.store.save_snapshot(self.fence, &progress).await?;
        tracing::info!(stream = %self.fence.stream, estimated_rows = extent.estimated_rows,
            state = progress.state.as_ref(), "initial snapshot: counting the rows that exist before the stream's start");
        self.report(&progress);
        checkpoint.snapshot = Some(progress);
        Ok(true)
    }

    /// Reads and applies the next chunk (or finishes one a previous run left in flight).
    pub async fn step(&self, checkpoint: &mut Checkpoint) -> StoreResult<Step> {
        self.step_within(checkpoint, self.settings.chunk_rows).await
    }

    /// [`Snapshotter::step`] with a chunk of at most `max_rows` rows (at least one; what the
    /// memory budget has room for, see `crate::budget`).
    pub async fn step_within(
        &self,
        checkpoint: &mut Checkpoint,
        max_rows: usize,
    ) -> StoreResult<Step> {
        let max_rows = max_rows.clamp(1, self.settings.chunk_rows.max(1));
        // A chunk shorter than asked ends the scan. A chunk a previous run left in flight was
        // asked with a limit not known here: the scan then ends on the next, empty, read.
        let mut asked = max_rows as u64;
        if !checkpoint.snapshot_running() {
            return Ok(Step::Idle);
        }
        let generation = checkpoint.ledger_generation();
        let mut progress = checkpoint.snapshot.clone().expect("running snapshot");
        let chunk = match progress.pending.clone() {
            Some(chunk) => {
                tracing::info!(stream = %self.fence.stream, chunk = chunk.number, "finishing the snapshot chunk a previous run left in flight");
                progress.chunks_resumed += 1;
                // Never "short": its size is unknown, so the next read decides.
                asked = 0;
                chunk
            }
            None => {
                let Some(last) = progress.last_id.clone() else {
                    return self.finish(checkpoint, progress).await;
                };
                let number = progress.chunks_done + 1;
                if progress.reading == Some(number) {
                    // A restart came between this chunk's read and its plan: read again.
                    progress.chunks_reread += 1;
                    tracing::info!(stream = %self.fence.stream, chunk = number, "reading again the snapshot chunk a previous run was reading");
                }
                progress.reading = Some(number);
                self.store.save_snapshot(self.fence, &progress).await?;
                let rows = self
                    .store
                    .rows_after(progress.cursor.as_ref(), &last, max_rows)
                    .await?;
                if rows.is_empty() {
                    return self.finish(checkpoint, progress).await;
                }
                let ids: Vec<CommentId> = rows.iter().map(|(c, _)| c.clone()).collect();
                let ledger = self
                    .store
                    .read_ledger(&self.fence.stream, &ids, generation)
                    .await?;
                let chunk = plan_chunk(
                    number,
                    &rows,
                    &ledger,
                    self.partition,
                    self.bucket_width_secs,
                );
                progress.pending = Some(chunk.clone());
                self.store.save_snapshot(self.fence, &progress).await?; // the intent
                chunk
            }
        };
        self.store
            .claim_ledger(self.fence, &chunk.claims, generation)
            .await?;
        self.store
            .apply_snapshot_counters(self.fence, chunk.number, &chunk.counters)
            .await?;
        finish_chunk(&mut progress, &chunk);
        metrics::counter!(m::SNAPSHOT_ROWS, "stream" => self.fence.stream.clone())
            .increment(chunk.rows);
        if chunk.rows < asked {
            // A short chunk: no row of the range was left at its read. Rows inserted since
            // are the stream's (their inserts came after the start).
            return self.finish(checkpoint, progress).await;
        }
        self.store.save_snapshot(self.fence, &progress).await?;
        self.report(&progress);
        if progress.chunks_done.is_multiple_of(10) {
            tracing::info!(stream = %self.fence.stream, chunks = progress.chunks_done,
                rows_scanned = progress.rows_scanned, estimated_rows = progress.estimated_rows,
                seconds_left = ?seconds_left(&progress, self.settings.rows_per_second),
                "initial snapshot progress");
        }
        checkpoint.snapshot = Some(progress);
        Ok(Step::Chunk { rows: chunk.rows })
    }

    async fn finish(
        &self,
        checkpoint: &mut Checkpoint,
        mut progress: SnapshotProgress,
    ) -> StoreResult<Step> {
        progress.state = SnapshotState::Done;
        progress.reading = None;
        progress.finished_at = Some(self.clock.now());
        self.store.save_snapshot(self.fence, &progress).await?;
        tracing::info!(stream = %self.fence.stream, rows_scanned = progress.rows_scanned,
            rows_counted = progress.rows_counted, chunks_resumed = progress.chunks_resumed,
            chunks_reread = progress.chunks_reread,
            "initial snapshot done: every row that existed before the stream's start is counted");
        self.report(&progress);
        checkpoint.snapshot = Some(progress);
        Ok(Step::Done)
    }

    /// Exports a snapshot's progress as gauges.
    fn report(&self, progress: &SnapshotProgress) {
        let stream = self.fence.stream.clone();
        metrics::gauge!(m::SNAPSHOT_RUNNING, "stream" => stream.clone())
            .set(f64::from(progress.state == SnapshotState::Running));
        metrics::gauge!(m::SNAPSHOT_ROWS_SCANNED, "stream" => stream.clone())
            .set(progress.rows_scanned as f64);
        metrics::gauge!(m::SNAPSHOT_ROWS_ESTIMATED, "stream" => stream.clone())
            .set(progress.estimated_rows as f64);
        metrics::gauge!(m::SNAPSHOT_SECONDS_LEFT, "stream" => stream)
            .set(seconds_left(progress, self.settings.rows_per_second).unwrap_or(0) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::GroupValue;
    use bson::Bson;

    fn row(post: i64, live: bool) -> Row {
        Row::of(
            Some(GroupValue::Int(post)),
            Some(DateTime::from_millis(125_000)),
            !live,
        )
    }

    fn id(n: i32) -> CommentId {
        CommentId::new(Bson::Int32(n))
    }

    #[test]
    fn claims_only_what_the_ledger_does_not_know_and_counts_only_live_rows() {
        let rows = vec![
            (id(1), row(7, true)),
            (id(2), row(7, true)),
            (id(3), row(7, false)),
            (id(4), row(8, true)),
        ];
        let ledger: LedgerView = [(id(2).key, None)].into_iter().collect();
        let chunk = plan_chunk(3, &rows, &ledger, None, 60);
        assert_eq!(chunk.number, 3);
        assert_eq!(chunk.rows, 4);
        assert_eq!(chunk.last, Some(id(4)));
        let claimed: Vec<&CommentId> = chunk.claims.iter().map(|c| &c.comment).collect();
        assert_eq!(claimed, vec![&id(1), &id(3), &id(4)]);
        type Increment = (GroupValue, i64, Vec<(i64, i64)>);
        let deltas: Vec<Increment> = chunk
            .counters
            .iter()
            .map(|c| {
                (
                    c.key.group.clone(),
                    c.delta.as_i64(),
                    c.buckets.iter().map(|(k, v)| (*k, v.as_i64())).collect(),
                )
            })
            .collect();
        assert_eq!(
            deltas,
            vec![
                (GroupValue::Int(7), 1, vec![(120, 1)]),
                (GroupValue::Int(8), 1, vec![(120, 1)])
            ]
        );
    }

    #[test]
    fn a_claimed_row_counts_in_every_definition_it_counts_for() {
        use crate::core::key::{CounterIx, Member};
        let member =
            |group: &str, matches| Member::counting(Some(GroupValue::Str(group.into())), matches);
        let with = |live, more: [Member; 2]| {
            let mut row = row(7, live);
            row.members.extend(more);
            row
        };
        let approved_by_ann = with(true, [member("approved", true), member("ann", true)]);
        let unapproved_by_ann = with(true, [member("approved", false), member("ann", true)]);
        let deleted_by_bob = with(false, [member("approved", true), member("bob", true)]);
        let rows = vec![
            (id(1), approved_by_ann),
            (id(2), unapproved_by_ann),
            (id(3), deleted_by_bob),
        ];
        let chunk = plan_chunk(1, &rows, &LedgerView::default(), None, 60);
        let counted: Vec<(CounterIx, GroupValue, i64)> = chunk
            .counters
            .iter()
            .map(|c| (c.key.counter, c.key.group.clone(), c.delta.as_i64()))
            .collect();
        assert_eq!(
            counted,
            vec![
                (CounterIx(0), GroupValue::Int(7), 2),
                (CounterIx(1), GroupValue::Str("approved".into()), 1),
                (CounterIx(2), GroupValue::Str("ann".into()), 2),
            ]
        );
        assert_eq!(
            chunk.claims.len(),
            3,
            "one claim per row, whatever it counts in"
        );
    }

    #[test]
    fn a_partition_claims_and_counts_only_the_rows_of_its_posts() {
        let partition = Partition { index: 1, count: 2 };
        let rows: Vec<(CommentId, Row)> = (1..=20).map(|i| (id(i), row(i as i64, true))).collect();
        let chunk = plan_chunk(1, &rows, &LedgerView::default(), Some(partition), 60);
        let owned = rows
            .iter()
            .filter(|(_, r)| partition.owns_row(Some(r)))
            .count();
        assert!(owned > 0 && owned < 20, "both partitions have rows here");
        assert_eq!(chunk.claims.len(), owned);
        assert!(chunk
            .claims
            .iter()
            .all(|c| partition.owns_row(c.state.as_ref())));
        assert_eq!(chunk.counters.len(), owned);
        assert!(chunk.counters.iter().all(|c| partition.owns(&c.key.group)));
    }

    #[test]
    fn progress_moves_the_cursor_and_adds_up() {
        let extent = CommentsExtent {
            last_id: Some(id(9)),
            estimated_rows: 10_000,
        };
        let mut progress = begin(&extent, DateTime::from_millis(0));
        assert_eq!(progress.state, SnapshotState::Running);
        let rows = vec![(id(1), row(7, true)), (id(2), row(7, false))];
        let chunk = plan_chunk(1, &rows, &LedgerView::default(), None, 60);
        progress.pending = Some(chunk.clone());
        finish_chunk(&mut progress, &chunk);
        assert_eq!(progress.cursor, Some(id(2)));
        assert_eq!(
            (
                progress.rows_scanned,
                progress.rows_counted,
                progress.chunks_done
            ),
            (2, 1, 1)
        );
        assert!(progress.pending.is_none());
        assert_eq!(seconds_left(&progress, 1000), Some(10));
        assert_eq!(seconds_left(&progress, 0), None);
    }

    #[test]
    fn an_empty_collection_is_done_at_once() {
        let progress = begin(&CommentsExtent::default(), DateTime::from_millis(0));
        assert_eq!(progress.state, SnapshotState::Done);
        assert!(progress.finished_at.is_some());
    }
}
