//! A store that counts what passes through it: [`CountingStore`] wraps any [`Store`], delegates
//! every call unchanged, and tallies per concern the calls made (each at least one round trip to
//! a server store) and the write statements they carry (one per document a bulk call writes).
//!
//! The benchmark measures counterd's server-independent costs with it (write statements per
//! event, round trips per 1 000 events) and the tests assert coalescing and recount budgets
//! through it, so the stores themselves keep no instrumentation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bson::{DateTime, Timestamp};
use serde::Serialize;

use super::*;

/// The concerns of the store, one per trait (the change stream's reads count as [`Stream`]).
///
/// [`Stream`]: Concern::Stream
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Concern {
    Stream,
    Checkpoints,
    Counters,
    Ledger,
    Dirty,
    Truth,
    Leases,
    Runs,
}

impl Concern {
    pub const ALL: [Concern; 8] = [
        Concern::Stream,
        Concern::Checkpoints,
        Concern::Counters,
        Concern::Ledger,
        Concern::Dirty,
        Concern::Truth,
        Concern::Leases,
        Concern::Runs,
    ];
}

/// What one concern saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Calls into the store (each at least one round trip to a server store).
    pub calls: u64,
    /// Write statements: documents written, one per entry of a bulk call.
    pub statements: u64,
}

/// The tallies at one moment; subtract two with [`Counts::since`] to measure a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub by_concern: HashMap<Concern, Tally>,
    /// Recount queries against `comments` (the reconciler's cost): counts below a watermark
    /// (direct or at a cluster time) and latest-row lookups.
    pub count_queries: u64,
}

impl Counts {
    pub fn of(&self, concern: Concern) -> Tally {
        self.by_concern.get(&concern).copied().unwrap_or_default()
    }

    /// Write statements of every concern.
    pub fn statements(&self) -> u64 {
        self.by_concern.values().map(|t| t.statements).sum()
    }

    /// Calls of every concern.
    pub fn calls(&self) -> u64 {
        self.by_concern.values().map(|t| t.calls).sum()
    }

    /// What happened after `earlier` was taken.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let by_concern = Concern::ALL
            .iter()
            .map(|&c| {
                let (now, then) = (self.of(c), earlier.of(c));
                let tally = Tally {
                    calls: now.calls - then.calls,
                    statements: now.statements - then.statements,
                };
                (c, tally)
            })
            .collect();
        Counts {
            by_concern,
            count_queries: self.count_queries - earlier.count_queries,
        }
    }
}

#[derive(Default)]
struct Tallies {
    calls: [AtomicU64; Concern::ALL.len()],
    statements: [AtomicU64; Concern::ALL.len()],
    count_queries: AtomicU64,
}

impl Tallies {
    fn note(&self, concern: Concern, statements: usize) {
        let i = concern as usize;
        self.calls[i].fetch_add(1, Ordering::Relaxed);
        self.statements[i].fetch_add(statements as u64, Ordering::Relaxed);
    }
}

/// Any [`Store`], counted. Clones share their tallies.
#[derive(Clone)]
pub struct CountingStore<S> {
    inner: S,
    tallies: Arc<Tallies>,
}

impl<S> CountingStore<S> {
    pub fn new(inner: S) -> CountingStore<S> {
        CountingStore {
            inner,
            tallies: Arc::default(),
        }
    }

    /// The store underneath (its calls are not counted).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Everything counted so far through this store and its clones.
    pub fn counts(&self) -> Counts {
        let t = &self.tallies;
        let by_concern = Concern::ALL
            .iter()
            .map(|&c| {
                let i = c as usize;
                let tally = Tally {
                    calls: t.calls[i].load(Ordering::Relaxed),
                    statements: t.statements[i].load(Ordering::Relaxed),
                };
                (c, tally)
            })
            .collect();
        Counts {
            by_concern,
            count_queries: t.count_queries.load(Ordering::Relaxed),
        }
    }

    fn note(&self, concern: Concern, statements: usize) {
        self.tallies.note(concern, statements);
    }

    fn count_query(&self) {
        self.tallies.count_queries.fetch_add(1, Ordering::Relaxed);
    }
}

/// An open change stream whose reads are counted as [`Concern::Stream`] calls.
struct CountingEvents {
    inner: Box<dyn EventSource>,
    tallies: Arc<Tallies>,
}

#[async_trait]
impl EventSource for CountingEvents {
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch> {
        self.tallies.note(Concern::Stream, 0);
        self.inner.next_batch(max, max_wait).await
    }
}

#[async_trait]
impl<S: ChangeStreams> ChangeStreams for CountingStore<S> {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        self.note(Concern::Stream, 0);
        let inner = self.inner.open_stream(options).await?;
        Ok(Box::new(CountingEvents {
            inner,
            tallies: self.tallies.clone(),
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        self.note(Concern::Stream, 0);
        self.inner.read_position().await
    }
}

#[async_trait]
impl<S: Checkpoints> Checkpoints for CountingStore<S> {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        self.note(Concern::Checkpoints, 0);
        self.inner.load_checkpoint(stream).await
    }

    async fn record_intent(&self, fence: &Fence, batch: &PendingBatch) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.record_intent(fence, batch).await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.save_checkpoint(fence, token, token_time).await
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.move_checkpoint(stream, to).await
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.record_start(fence, at).await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.record_caught_up(fence, at).await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.record_gap(fence, gap).await
    }

    async fn deployment(&self) -> StoreResult<Deployment> {
        self.note(Concern::Checkpoints, 0);
        self.inner.deployment().await
    }

    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.record_deployment(fence, deployment).await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.set_sweep_requested(stream, requested).await
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.adopt_checkpoint(fence).await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        self.note(Concern::Checkpoints, 1);
        self.inner.save_snapshot(fence, progress).await
    }
}

#[async_trait]
impl<S: Counters> Counters for CountingStore<S> {
    async fn apply_counters(
        &self,
        fence: &Fence,
        writes: &[CounterDelta],
        through: &Token,
        through_time: Option<Timestamp>,
    ) -> StoreResult<ApplyOutcome> {
        self.note(Concern::Counters, writes.len());
        self.inner
            .apply_counters(fence, writes, through, through_time)
            .await
    }

    async fn read_counter(&self, post: &PostId) -> StoreResult<Option<CounterDoc>> {
        self.note(Concern::Counters, 0);
        self.inner.read_counter(post).await
    }

    async fn install_fold(
        &self,
        post: &PostId,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.note(Concern::Counters, 1);
        self.inner.install_fold(post, expected, fold, now).await
    }

    async fn posts_after(&self, after: Option<&PostId>, limit: usize) -> StoreResult<Vec<PostId>> {
        self.note(Concern::Counters, 0);
        self.inner.posts_after(after, limit).await
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<PostId>> {
        self.note(Concern::Counters, 0);
        self.inner.sample_posts(n).await
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        self.note(Concern::Counters, writes.len());
        self.inner
            .apply_snapshot_counters(fence, chunk, writes)
            .await
    }
}

#[async_trait]
impl<S: Ledger> Ledger for CountingStore<S> {
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, Option<Row>>> {
        self.note(Concern::Ledger, 0);
        self.inner.read_ledger(stream, comments, generation).await
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        self.note(Concern::Ledger, updates.len());
        self.inner
            .write_ledger(fence, updates, through, generation)
            .await
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        self.note(Concern::Ledger, rows.len());
        self.inner.rebuild_ledger(stream, generation, rows).await
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        self.note(Concern::Ledger, claims.len());
        self.inner.claim_ledger(fence, claims, generation).await
    }
}

#[async_trait]
impl<S: DirtySet> DirtySet for CountingStore<S> {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        self.note(Concern::Dirty, marks.len());
        self.inner.mark_dirty(fence, marks, now).await
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        self.note(Concern::Dirty, 0);
        self.inner.dirty_list(stream, order, limit).await
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        self.note(Concern::Dirty, 0);
        self.inner.dirty_summary().await
    }

    async fn clear_dirty(&self, post: &PostId, version: i64) -> StoreResult<bool> {
        self.note(Concern::Dirty, 1);
        self.inner.clear_dirty(post, version).await
    }

    async fn requeue_dirty(&self, post: &PostId, version: i64, now: DateTime) -> StoreResult<bool> {
        self.note(Concern::Dirty, 1);
        self.inner.requeue_dirty(post, version, now).await
    }
}

#[async_trait]
impl<S: Truth> Truth for CountingStore<S> {
    async fn count_live_below(&self, post: &PostId, watermark: i64) -> StoreResult<i64> {
        self.note(Concern::Truth, 0);
        self.count_query();
        self.inner.count_live_below(post, watermark).await
    }

    async fn count_live_below_at(
        &self,
        post: &PostId,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<i64>> {
        self.note(Concern::Truth, 0);
        let counted = self.inner.count_live_below_at(post, watermark, at).await;
        // `None`: the store has no snapshot reads here and issued no count.
        if matches!(counted, Ok(Some(_))) {
            self.count_query();
        }
        counted
    }

    async fn latest_created(&self, post: &PostId) -> StoreResult<Option<i64>> {
        self.note(Concern::Truth, 0);
        self.count_query();
        self.inner.latest_created(post).await
    }

    async fn count_live(&self, post: &PostId) -> StoreResult<i64> {
        self.note(Concern::Truth, 0);
        self.inner.count_live(post).await
    }

    async fn rows_of_post(&self, post: &PostId) -> StoreResult<Vec<(CommentId, Row)>> {
        self.note(Concern::Truth, 0);
        self.inner.rows_of_post(post).await
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        self.note(Concern::Truth, 0);
        self.inner.comments_extent().await
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        self.note(Concern::Truth, 0);
        self.inner.rows_after(after, last, limit).await
    }
}

#[async_trait]
impl<S: Leases> Leases for CountingStore<S> {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        self.note(Concern::Leases, 0);
        self.inner.read_lease(stream).await
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        self.note(Concern::Leases, 1);
        self.inner.acquire_lease(stream, owner, ttl, now).await
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        self.note(Concern::Leases, 1);
        self.inner.renew_lease(stream, owner, epoch, ttl, now).await
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        self.note(Concern::Leases, 1);
        self.inner.seize_lease(stream, owner, ttl, now).await
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.note(Concern::Leases, 1);
        self.inner.release_lease(stream, owner, epoch).await
    }
}

#[async_trait]
impl<S: RunHistory> RunHistory for CountingStore<S> {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        self.note(Concern::Runs, 1);
        self.inner.record_run(run).await
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        self.note(Concern::Runs, 0);
        self.inner.last_run().await
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        self.note(Concern::Runs, 0);
        self.inner.load_sweep_cursor(stream).await
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        self.note(Concern::Runs, 1);
        self.inner.save_sweep_cursor(stream, cursor).await
    }
}
