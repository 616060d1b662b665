//! Applying one batch: classify and coalesce it against the ledger, record the intent, write
//! counters, ledger and dirty marks, then move the checkpoint.

use std::collections::HashSet;

use super::{SessionError, Worker};
use crate::budget::{Budget, Grant};
use crate::core::batch::PendingBatch;
use crate::core::batch::{
    plan_batch_covering, BatchPlan, CounterDelta, CounterWrite, Coverage, DirtyMark, PlanInput,
};
use crate::core::carry::Carry;
use crate::core::classify::StreamEnded;
use crate::core::cost;
use crate::core::event::{ChangeEvent, CommentId, Token};
use crate::core::event::{LedgerUpdate, LedgerView};
use crate::store::{ApplyOutcome, Checkpoint, Fence, Store, StoreError, StoreResult};
use crate::telemetry as m;

/// Ledger entries read ahead for the next batch while the current one was written, with the
/// current batch's own writes laid over them.
///
/// The read may land before, between or after the current batch's ledger writes, so for the
/// comments that batch wrote it is replaced by what the batch wrote ([`Prefetched::overlay`]);
/// every other entry is one nobody else writes meanwhile (the snapshot's claims run between
/// batches, and no read ahead is made while a snapshot runs; a sweep's rebuild races a plain
/// read just the same). A comment the read did not ask for is read when its batch is applied.
#[derive(Debug, Default)]
pub(super) struct Prefetched {
    generation: u64,
    asked: HashSet<String>,
    entries: LedgerView,
}

impl Prefetched {
    /// Lays the current batch's ledger writes over the read.
    pub(super) fn overlay(&mut self, written: Vec<LedgerUpdate>) {
        for update in written {
            self.asked.insert(update.comment.key.clone());
            self.entries.insert(update.comment.key, update.state);
        }
    }
}

impl<S: Store + ?Sized> Worker<S> {
    /// Reads the ledger entries of the comments of `events` (of `generation`), as a read ahead.
    pub(super) async fn prefetch_ledger(
        &self,
        stream: &str,
        generation: u64,
        events: &[ChangeEvent],
    ) -> StoreResult<Prefetched> {
        let ids: Vec<CommentId> = events.iter().filter_map(|e| e.comment.clone()).collect();
        let entries = self.store.read_ledger(stream, &ids, generation).await?;
        Ok(Prefetched {
            generation,
            asked: ids.into_iter().map(|c| c.key).collect(),
            entries,
        })
    }

    /// The ledger entries of the comments of `events`: from `prefetched` where it has them
    /// (and is of the ledger's generation), the rest read now.
    async fn batch_ledger(
        &self,
        stream: &str,
        checkpoint: &Checkpoint,
        events: &[ChangeEvent],
        prefetched: Option<Prefetched>,
    ) -> StoreResult<LedgerView> {
        let generation = checkpoint.ledger_generation();
        let prefetched = prefetched
            .filter(|p| p.generation == generation)
            .unwrap_or_default();
        let missing: Vec<CommentId> = events
            .iter()
            .filter_map(|e| e.comment.clone())
            .filter(|c| !prefetched.asked.contains(&c.key))
            .collect();
        let mut ledger = prefetched.entries;
        if !missing.is_empty() {
            let read = self.store.read_ledger(stream, &missing, generation).await?;
            ledger.extend(read.0);
        }
        Ok(ledger)
    }

    /// Reads the rows of the batch's updates whose after-state cannot be derived, in one
    /// batched read, and sets each as its events' `fullDocument` (see [`crate::core::lookup`]).
    /// Returns what the rows are charged against the memory budget while the batch is planned
    /// (like the ledger entries read for it, a row's projection per updated comment).
    async fn look_up_rows(
        &self,
        stream: &str,
        events: &mut [ChangeEvent],
        ledger: &LedgerView,
    ) -> StoreResult<Grant> {
        let wanted = crate::core::lookup::rows_to_read(
            events,
            ledger,
            self.settings.attribution,
            &self.settings.schema,
        );
        if wanted.is_empty() {
            return Ok(self.settings.budget.none());
        }
        let grant = self.settings.budget.overdraw(wanted.len() * cost::ROW_COST);
        let rows = self.store.look_up(&wanted).await?;
        crate::core::lookup::attach(events, &wanted, &rows);
        metrics::counter!(m::UPDATE_ROWS_READ, "stream" => stream.to_string())
            .increment(wanted.len() as u64);
        Ok(grant)
    }

    /// Classifies one batch and applies it (or, below the high water, only marks it dirty).
    /// Returns the ledger states it wrote. The events are dropped once planned: only the plan
    /// is held while it is written (memory per event in flight).
    ///
    /// With `may_carry` (the worker is behind and more events are read), the batch's counter
    /// increments join the counters carried across batches instead of being written now, if
    /// `carrying` has room for them (see [`crate::core::carry`]); otherwise everything carried is
    /// written with this batch and the checkpoint moves.
    ///
    /// The stages: [`Worker::plan`]; then [`Worker::write_planned`] in the crash-safe order
    /// (or [`Worker::mark_replayed`] below the high water); then [`Worker::report_batch`].
    pub(super) async fn apply(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: Batch,
        carrying: &mut Carrying,
        may_carry: bool,
    ) -> Result<Vec<LedgerUpdate>, SessionError> {
        let Planned {
            batch,
            ended,
            report,
        } = self.plan(fence, checkpoint, batch).await?;
        let mut written = Vec::new();
        if let Some(batch) = batch {
            let end_time = batch.end_time;
            let seen = checkpoint
                .high_water
                .as_ref()
                .is_some_and(|h| batch.end <= *h);
            let started = std::time::Instant::now();
            if seen {
                self.mark_replayed(fence, checkpoint, batch, carrying)
                    .await?;
            } else {
                written = self
                    .write_planned(fence, checkpoint, batch, carrying, may_carry)
                    .await?;
                metrics::counter!(m::UNATTRIBUTABLE_EVENTS, "stream" => fence.stream.clone())
                    .increment(report.unattributable as u64);
            }
            self.report_batch(fence, checkpoint, &report, end_time, started);
        }
        ended.map_or(Ok(written), |end| Err(SessionError::Ended(end)))
    }

    /// Plans a batch: its ledger entries (read ahead or read now) and the rows its updates
    /// need, classified and coalesced, kept to this partition's share. The events, their
    /// ledger entries and rows are dropped here.
    async fn plan(
        &self,
        fence: &Fence,
        checkpoint: &Checkpoint,
        batch: Batch,
    ) -> Result<Planned, StoreError> {
        let Batch { events, prefetched } = batch;
        let (ledger, coverage, divided) = self
            .ledger_view(&fence.stream, checkpoint, &events, prefetched)
            .await?;
        let mut events = events;
        let rows_grant = self
            .look_up_rows(&fence.stream, &mut events, &ledger)
            .await?;
        let (mut plan, ended) = plan_batch_covering(PlanInput {
            events: &events,
            ledger: &ledger,
            coverage,
            attribution: self.settings.attribution,
            schema: &self.settings.schema,
            bucket_width_secs: self.settings.bucket_width_secs,
            partition: self.settings.partition,
        });
        self.keep_own(&mut plan, divided, &ledger);
        let report = BatchReport::of(&plan, &events, &self.settings.schema);
        // The batch's guard token: its last event before any stream end.
        let batch = plan.events.checked_sub(1).map(|i| PendingBatch {
            end: events[i].token.clone(),
            end_time: events[i].cluster_time,
            counters: plan.counters,
            ledger: plan.ledger,
            dirty: plan.dirty,
            carry: None,
        });
        drop((events, ledger, rows_grant));
        Ok(Planned {
            batch,
            ended,
            report,
        })
    }

    /// The ledger entries of a batch's comments as this worker sees them (`Default`: none
    /// without the ledger), what an absent entry means, and whether the ledger is divided
    /// between partitions.
    async fn ledger_view(
        &self,
        stream: &str,
        checkpoint: &Checkpoint,
        events: &[ChangeEvent],
        prefetched: Option<Prefetched>,
    ) -> StoreResult<(LedgerView, Coverage, bool)> {
        let mut ledger = if self.settings.attribution.uses_ledger() {
            self.batch_ledger(stream, checkpoint, events, prefetched)
                .await?
        } else {
            Default::default()
        };
        let complete = checkpoint.ledger_complete();
        // The ledger is divided between partitions only where it is complete: elsewhere a
        // comment without an entry is unknown, not "not here" (see `crate::core::partition`).
        let divided = self.settings.partition.filter(|_| complete);
        if let Some(partition) = divided {
            partition.own_view(&mut ledger);
        }
        let coverage = if complete {
            Coverage::Complete
        } else {
            Coverage::Partial
        };
        Ok((ledger, coverage, divided.is_some()))
    }

    /// Keeps what this worker writes of a plan: no ledger states without the ledger, and with
    /// partitions the ledger entries of this partition's comments (its part of the counters and
    /// marks is planned, see `plan_batch_covering`).
    fn keep_own(&self, plan: &mut BatchPlan, divided: bool, ledger: &LedgerView) {
        if !self.settings.attribution.uses_ledger() {
            plan.ledger.clear();
        }
        if let Some(partition) = self.settings.partition {
            // Every partition classifies every event against its own ledger and plans only its
            // part of each change (`plan_batch_covering`); it keeps the ledger entries of its
            // comments (see `crate::core::partition`).
            if divided {
                plan.ledger = partition.own_writes(std::mem::take(&mut plan.ledger), ledger);
            }
            if partition.index != 0 {
                plan.skipped.clear(); // reported once, by partition 0
            }
        }
    }

    /// A batch at or below the high water, already applied before (an operator replay):
    /// recount, never count again. (Carried counters are of later events: written first,
    /// should any be.)
    async fn mark_replayed(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: PendingBatch,
        carrying: &mut Carrying,
    ) -> Result<(), StoreError> {
        self.flush(fence, checkpoint, carrying).await?;
        self.store
            .mark_dirty(fence, &batch.dirty, self.clock.now())
            .await?;
        self.store
            .save_checkpoint(fence, &batch.end, batch.end_time)
            .await?;
        checkpoint.token = Some(batch.end.clone());
        checkpoint.token_time = batch.end_time;
        Ok(())
    }

    /// Writes a new batch in the crash-safe order: (0) its intent, then its (b) ledger states
    /// with its (a) counters and (c) dirty marks carried, or with everything carried written
    /// beside them and (d) the checkpoint moved (see [`Worker::write_batch`]). Returns the
    /// ledger states written.
    async fn write_planned(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        mut batch: PendingBatch,
        carrying: &mut Carrying,
        may_carry: bool,
    ) -> Result<Vec<LedgerUpdate>, StoreError> {
        // Only well behind: a worker keeping up with live writes writes every batch, so
        // that counters follow the stream within about a batch's latency.
        let behind = batch.end_time.is_some_and(|t| {
            crate::core::time::secs(self.clock.now()) - t.time as i64 >= CARRY_BEHIND_SECS
        });
        let may_carry = may_carry && behind;
        let (counters, dirty) = self
            .record_intent(fence, &mut batch, carrying, may_carry)
            .await?;
        checkpoint.high_water = Some(batch.end.clone());
        carrying
            .carry
            .push(batch.end.clone(), batch.end_time, counters, dirty);
        if may_carry {
            carrying.carry.stored_under_id();
        }
        if may_carry && carrying.has_room(&self.settings.budget, self.clock.now()) {
            self.write_ledger_states(fence, checkpoint, &batch).await?;
            carrying.settled = true;
        } else {
            self.write_batch(fence, checkpoint, Some(&batch), &mut carrying.carry)
                .await?;
            carrying.closed();
        }
        Ok(batch.ledger)
    }

    /// (0) Records the batch's intent, which names the carry the batch joins. A batch that may
    /// be carried stores its counters and marks under the carry's id instead of in its intent:
    /// written once, where a restart finds them with the carry's other batches. Returns the
    /// batch's counters and marks, taken out of it.
    async fn record_intent(
        &self,
        fence: &Fence,
        batch: &mut PendingBatch,
        carrying: &mut Carrying,
        may_carry: bool,
    ) -> Result<(Vec<CounterDelta>, Vec<DirtyMark>), StoreError> {
        batch.carry = carrying.carry.id().cloned();
        carrying.settled = false;
        if may_carry {
            batch.carry.get_or_insert_with(|| batch.end.clone());
            let own = PendingBatch {
                end: batch.end.clone(),
                end_time: batch.end_time,
                counters: std::mem::take(&mut batch.counters),
                dirty: std::mem::take(&mut batch.dirty),
                ..PendingBatch::default()
            };
            self.store.record_intent(fence, batch, Some(&own)).await?;
            Ok((own.counters, own.dirty))
        } else {
            self.store.record_intent(fence, batch, None).await?;
            Ok((
                std::mem::take(&mut batch.counters),
                std::mem::take(&mut batch.dirty),
            ))
        }
    }

    /// Reports an applied batch: metrics, the events it did not count, the worker's status
    /// and the checkpointed position.
    fn report_batch(
        &self,
        fence: &Fence,
        checkpoint: &Checkpoint,
        report: &BatchReport,
        end_time: Option<bson::Timestamp>,
        started: std::time::Instant,
    ) {
        let stream = fence.stream.clone();
        metrics::histogram!(m::BATCH_APPLY_DURATION, "stream" => stream.clone())
            .record(started.elapsed().as_secs_f64());
        metrics::histogram!(m::BATCH_SIZE, "stream" => stream.clone()).record(report.events as f64);
        metrics::counter!(m::EVENTS_APPLIED, "stream" => stream.clone())
            .increment(report.events as u64);
        metrics::counter!(m::BAD_EVENTS, "stream" => stream.clone()).increment(report.bad as u64);
        for skipped in &report.skipped {
            skipped.log(&fence.stream);
        }
        self.status.batch_applied(
            report.events,
            end_time.map(|t| t.time as i64),
            self.clock.now(),
        );
        if let Some(t) = end_time {
            metrics::gauge!(m::LAST_EVENT_TIMESTAMP, "stream" => stream).set(t.time as f64);
        }
        self.report_checkpoint(&fence.stream, crate::recount::applied_before(checkpoint));
    }

    /// Writes what `carry` holds, (a) its counters and (c) dirty marks, with `batch`'s (b)
    /// ledger states, then (d) moves the checkpoint to the carry's end (`batch`: none when its
    /// own writes already landed, see [`Worker::flush`]).
    ///
    /// (a), (b) and (c) go out side by side (one round trip of latency instead of three): the
    /// batch's whole plan is recorded before any of them (its intent, and the carry's
    /// counters and marks stored under the carry's id), and a crash anywhere is repaired by
    /// re-applying that plan, each write guarded by its batch's end token, so which of them
    /// landed first never matters. No reader depends on their order either: the reconciler
    /// trusts only positions at or below the checkpoint, which (d) moves after all three are
    /// acknowledged. The simulation interleaves and fails them one by one.
    pub(super) async fn write_batch(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: Option<&PendingBatch>,
        carry: &mut Carry,
    ) -> Result<(), StoreError> {
        let Some((end, end_time)) = carry.end().map(|(t, at)| (t.clone(), at)) else {
            return Ok(());
        };
        let (batches, posts) = (carry.batches(), carry.counters());
        let stored = carry.id().filter(|_| carry.is_stored()).cloned();
        let marks = carry.take_dirty();
        let counters = self.write_counters(fence, carry.take_writes()); // (a)
        let ledger = async {
            match batch {
                Some(batch) => self.write_ledger_states(fence, checkpoint, batch).await,
                None => Ok(()),
            }
        };
        let dirty = self.mark_dirty(fence, &marks); // (c)
        let (outcome, (), ()) = futures::try_join!(counters, ledger, dirty)?;
        if let Some(carry) = stored {
            // Written: the stored copies go, before the checkpoint moves past them.
            self.store.clear_carried(fence, &carry).await?;
        }
        self.store.save_checkpoint(fence, &end, end_time).await?; // (d)
        checkpoint.token = Some(end.clone());
        checkpoint.token_time = end_time;
        checkpoint.pending = None;
        self.report_written(fence, &end, (batches, posts), outcome);
        Ok(())
    }

    /// (a) Writes counters in slices: only one slice's writes and statements are held at once.
    async fn write_counters(
        &self,
        fence: &Fence,
        mut writes: impl Iterator<Item = CounterWrite>,
    ) -> Result<ApplyOutcome, StoreError> {
        let mut outcome = ApplyOutcome::default();
        loop {
            let slice: Vec<CounterWrite> = writes.by_ref().take(FLUSH_SLICE).collect();
            if slice.is_empty() {
                return Ok::<_, StoreError>(outcome);
            }
            let wrote = self.store.write_counters(fence, &slice).await?; // (a)
            outcome.applied += wrote.applied;
            outcome.already_applied += wrote.already_applied;
        }
    }

    /// (c) Marks counters dirty, in slices.
    async fn mark_dirty(&self, fence: &Fence, marks: &[DirtyMark]) -> Result<(), StoreError> {
        for slice in marks.chunks(FLUSH_SLICE) {
            self.store
                .mark_dirty(fence, slice, self.clock.now())
                .await?; // (c)
        }
        Ok(())
    }

    /// Reports a carry written up to `end`: `batches` batches, `posts` counter writes.
    fn report_written(
        &self,
        fence: &Fence,
        end: &Token,
        (batches, posts): (usize, usize),
        outcome: ApplyOutcome,
    ) {
        let stream = fence.stream.clone();
        metrics::counter!(m::BATCHES, "stream" => stream.clone()).increment(batches as u64);
        metrics::counter!(m::INCREMENTS, "stream" => stream.clone(), "result" => "applied")
            .increment(outcome.applied);
        metrics::counter!(m::INCREMENTS, "stream" => stream, "result" => "already_applied")
            .increment(outcome.already_applied);
        tracing::debug!(stream = %fence.stream, %end, batches, writes = posts, already = outcome.already_applied, "batch applied");
    }

    /// Writes a batch's (b) ledger states; its counters and dirty marks are carried (or
    /// written beside, by [`Worker::write_batch`]).
    async fn write_ledger_states(
        &self,
        fence: &Fence,
        checkpoint: &Checkpoint,
        batch: &PendingBatch,
    ) -> Result<(), StoreError> {
        if batch.ledger.is_empty() {
            return Ok(());
        }
        // A batch left in flight is re-applied before the stream is read again, so before a
        // history gap can be recorded: its states are of this generation.
        let generation = checkpoint.ledger_generation();
        self.store
            .write_ledger(fence, &batch.ledger, &batch.end, generation)
            .await // (b)
    }

    /// Writes what is carried and moves the checkpoint to its end (the newest carried batch's
    /// own writes landed already): before the worker reads on caught up, pauses for a
    /// snapshot chunk or stops, and once the carry is old or full.
    pub(super) async fn flush(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        carrying: &mut Carrying,
    ) -> Result<(), StoreError> {
        if carrying.carry.is_open() {
            self.write_batch(fence, checkpoint, None, &mut carrying.carry)
                .await?;
        }
        carrying.closed();
        Ok(())
    }

    /// Re-applies the batch a stopped worker left in flight, with the counters it carried,
    /// exactly as planned.
    ///
    /// Only by the checkpoint's own epoch or a newer one: a successor's intent is the
    /// successor's to re-apply. The carry it names goes on in the successor's memory, and a
    /// predecessor that re-applied it would write that carry's first batches' counters once
    /// now and again when the successor writes the carry (a counter the successor has not
    /// written yet still accepts the predecessor's epoch). Found by the simulation.
    pub(super) async fn reapply(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: &PendingBatch,
    ) -> Result<(), StoreError> {
        if checkpoint.epoch > fence.epoch {
            return Err(StoreError::fenced(fence));
        }
        let mut carry = Carry::default();
        if let Some(id) = &batch.carry {
            // A few stored batches at a time, merged as they come.
            let mut after: Option<crate::core::event::Token> = None;
            loop {
                let page = self
                    .store
                    .load_carried(&fence.stream, id, after.as_ref(), &batch.end, CARRIED_PAGE)
                    .await?;
                let more = page.len() >= CARRIED_PAGE;
                for stored in page {
                    after = Some(stored.end.clone());
                    carry.push_stored(stored);
                }
                if !more {
                    break;
                }
            }
        }
        if carry.is_stored() {
            tracing::info!(stream = %fence.stream, end = %batch.end, carried = carry.batches(), "re-applying the counters carried up to the batch left in flight");
        }
        carry.push_pending(batch);
        self.write_batch(fence, checkpoint, Some(batch), &mut carry)
            .await
    }
}

/// Counter writes sent per command while a carry is written.
const FLUSH_SLICE: usize = 1000;

/// Stored batches read per call while a stopped worker's carry is rebuilt (each holds up to a
/// batch's counters, decoded).
const CARRIED_PAGE: usize = 4;

/// How far behind the stream (the batch's last event's cluster time, in seconds, against the
/// clock) the worker must be to carry counters: catching up a backlog, not keeping up with live
/// writes, whose readers expect counters within about a second.
const CARRY_BEHIND_SECS: i64 = 3;

/// How long counters may be carried: a counter shown to readers lags the stream by at most
/// this much more while the worker is behind (it lags by the backlog anyway).
pub(super) const CARRY_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The counters carried across batches, with the part of the memory budget they hold.
#[derive(Debug)]
pub(super) struct Carrying {
    pub(super) carry: Carry,
    held: Grant,
    /// When the carry's first batch was applied.
    since: Option<bson::DateTime>,
    /// Every carried batch's own writes (intent, ledger states) landed: the carry may be
    /// written. False from a batch's intent until its writes are acknowledged.
    pub(super) settled: bool,
}

impl Carrying {
    pub(super) fn new(budget: &Budget) -> Carrying {
        Carrying {
            carry: Carry::default(),
            held: budget.none(),
            since: None,
            settled: true,
        }
    }

    /// Whether the carry, its newest batch included, may stay carried: it is younger than
    /// [`CARRY_FOR`] and its share of the budget
    /// ([`cost::carry_share`]) holds what it holds. Takes what it holds now from what is free.
    fn has_room(&mut self, budget: &Budget, now: bson::DateTime) -> bool {
        self.since.get_or_insert(now);
        let young = !self.expired(now);
        let want = self.carry.charge();
        if want > self.held.bytes() {
            let room = cost::carry_share(budget.total()).saturating_sub(self.held.bytes());
            let more = want - self.held.bytes();
            if more <= room {
                self.held.merge(budget.take_free(more));
            }
        }
        young && self.held.bytes() >= want
    }

    /// Whether the carry is older than [`CARRY_FOR`] at `now`.
    pub(super) fn expired(&self, now: bson::DateTime) -> bool {
        self.since
            .is_some_and(|since| now >= crate::core::time::later(since, CARRY_FOR))
    }

    /// The carry was written: it holds nothing.
    fn closed(&mut self) {
        self.held.shrink_to(0);
        self.since = None;
        self.settled = true;
    }
}

/// A batch as the session hands it over: its events, and the ledger entries read ahead for
/// them (see [`Prefetched`]).
pub(super) struct Batch {
    pub(super) events: Vec<ChangeEvent>,
    pub(super) prefetched: Option<Prefetched>,
}

/// A batch planned, its events dropped.
struct Planned {
    /// What the batch writes, up to its guard token (`None`: nothing planned).
    batch: Option<PendingBatch>,
    /// A stream-ending event, after the planned ones.
    ended: Option<StreamEnded>,
    report: BatchReport,
}

/// What is reported of a batch once it is written.
struct BatchReport {
    /// Events classified.
    events: usize,
    bad: usize,
    unattributable: usize,
    skipped: Vec<SkippedReport>,
}

impl BatchReport {
    fn of(plan: &BatchPlan, events: &[ChangeEvent], schema: &crate::core::schema::Schema) -> Self {
        BatchReport {
            events: plan.events,
            bad: plan.bad_events(),
            unattributable: plan.unattributable_events(),
            skipped: plan
                .skipped
                .iter()
                .map(|s| SkippedReport::of(s, events, schema))
                .collect(),
        }
    }
}

/// An event that was not counted, with its comment and post where the event names them (taken
/// before the events are dropped, logged after the batch's writes).
struct SkippedReport {
    token: crate::core::event::Token,
    comment: String,
    post: String,
    problem: crate::core::classify::Problem,
}

impl SkippedReport {
    fn of(
        skipped: &crate::core::batch::Skipped,
        events: &[ChangeEvent],
        schema: &crate::core::schema::Schema,
    ) -> SkippedReport {
        let event = events.iter().find(|e| e.token == skipped.token);
        let comment = event.and_then(|e| e.comment.as_ref());
        let comment = comment.map_or_else(|| "unknown".into(), |c| c.key.clone());
        let post = event
            .and_then(|e| {
                [
                    e.full_document.as_ref(),
                    e.pre_image.as_ref(),
                    Some(&e.document_key),
                ]
                .into_iter()
                .flatten()
                .find_map(|d| schema.post_in(d))
            })
            .map(|p| p.to_string())
            .unwrap_or_else(|| "unknown".into());
        SkippedReport {
            token: skipped.token.clone(),
            comment,
            post,
            problem: skipped.problem.clone(),
        }
    }

    fn log(&self, stream: &str) {
        let kind: &'static str = (&self.problem).into();
        tracing::warn!(%stream, comment = %self.comment, post = %self.post, token = %self.token,
            kind, problem = %self.problem,
            "event not counted; its known posts are marked dirty and recounted");
    }
}
