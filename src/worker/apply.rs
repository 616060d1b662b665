//! Applying one batch: classify and coalesce it against the ledger, record the intent, write
//! counters, ledger and dirty marks, then move the checkpoint.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use super::{SessionError, Worker};
use crate::batch::{plan_batch_covering, Coverage, LedgerUpdate};
use crate::event::{ChangeEvent, CommentId, Row};
use crate::store::{Checkpoint, Fence, PendingBatch, Store, StoreError, StoreResult};
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
    entries: HashMap<String, Option<Row>>,
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
    ) -> StoreResult<HashMap<String, Option<Row>>> {
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
            ledger.extend(self.store.read_ledger(stream, &missing, generation).await?);
        }
        Ok(ledger)
    }

    /// Classifies one batch and applies it (or, below the high water, only marks it dirty).
    /// Returns the ledger states it wrote. The events are dropped once planned: only the plan
    /// is held while it is written (memory per event in flight).
    pub(super) async fn apply(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        events: Vec<ChangeEvent>,
        prefetched: Option<Prefetched>,
    ) -> Result<Vec<LedgerUpdate>, SessionError> {
        let mut ledger = if self.settings.attribution.uses_ledger() {
            self.batch_ledger(&fence.stream, checkpoint, &events, prefetched)
                .await?
        } else {
            Default::default()
        };
        let complete = checkpoint.ledger_complete();
        // The ledger is divided between partitions only where it is complete: elsewhere a
        // comment without an entry is unknown, not "not here" (see `crate::partition`).
        let divided = self.settings.partition.filter(|_| complete);
        if let Some(partition) = divided {
            partition.own_view(&mut ledger);
        }
        let coverage = if complete {
            Coverage::Complete
        } else {
            Coverage::Partial
        };
        let (mut plan, ended) = plan_batch_covering(
            &events,
            &ledger,
            coverage,
            self.settings.attribution,
            &self.settings.schema,
            self.settings.bucket_width_secs,
        );
        if !self.settings.attribution.uses_ledger() {
            plan.ledger.clear();
        }
        if let Some(partition) = self.settings.partition {
            // Every partition classifies every event against its own ledger, and keeps its posts
            // and the ledger entries of its comments (see `crate::partition`).
            plan.counters.retain(|c| partition.owns(&c.post));
            plan.dirty.retain(|d| partition.owns(&d.post));
            if divided.is_some() {
                plan.ledger = partition.own_writes(plan.ledger, &ledger);
            }
            if partition.index != 0 {
                plan.skipped.clear(); // reported once, by partition 0
            }
        }
        let (bad, unattributable) = (plan.bad_events(), plan.unattributable_events());
        let skipped: Vec<SkippedReport> = plan
            .skipped
            .iter()
            .map(|s| SkippedReport::of(s, &events, &self.settings.schema))
            .collect();
        // The batch's guard token: its last event before any stream end.
        let last = plan
            .events
            .checked_sub(1)
            .map(|i| (events[i].token.clone(), events[i].cluster_time));
        drop((events, ledger));
        let mut written = Vec::new();
        if let Some((end, end_time)) = last {
            let batch = PendingBatch {
                end,
                end_time,
                counters: plan.counters,
                ledger: plan.ledger,
                dirty: plan.dirty,
            };
            let seen = checkpoint
                .high_water
                .as_ref()
                .is_some_and(|h| batch.end <= *h);
            let started = std::time::Instant::now();
            if seen {
                // Already applied before (an operator replay): recount, never count again.
                self.store
                    .mark_dirty(fence, &batch.dirty, self.clock.now())
                    .await?;
                self.store
                    .save_checkpoint(fence, &batch.end, batch.end_time)
                    .await?;
                checkpoint.token = Some(batch.end.clone());
                checkpoint.token_time = batch.end_time;
            } else {
                self.store.record_intent(fence, &batch).await?; // (0)
                checkpoint.high_water = Some(batch.end.clone());
                self.write_batch(fence, checkpoint, &batch).await?;
                metrics::counter!(m::UNATTRIBUTABLE_EVENTS, "stream" => fence.stream.clone())
                    .increment(unattributable as u64);
                written = batch.ledger;
            }
            let stream = fence.stream.clone();
            metrics::histogram!(m::BATCH_APPLY_DURATION, "stream" => stream.clone())
                .record(started.elapsed().as_secs_f64());
            metrics::histogram!(m::BATCH_SIZE, "stream" => stream.clone())
                .record(plan.events as f64);
            metrics::counter!(m::EVENTS_APPLIED, "stream" => stream.clone())
                .increment(plan.events as u64);
            metrics::counter!(m::BAD_EVENTS, "stream" => stream.clone()).increment(bad as u64);
            for report in &skipped {
                report.log(&fence.stream);
            }
            self.status
                .events_applied
                .fetch_add(plan.events as i64, Ordering::Relaxed);
            let now = crate::time::secs(self.clock.now());
            let lag = end_time.map(|t| (now - t.time as i64).max(0)).unwrap_or(0);
            self.status.lag_secs.store(lag, Ordering::Relaxed);
            self.status.progressed();
            if let Some(t) = end_time {
                self.status
                    .applied_until_secs
                    .fetch_max(t.time as i64, Ordering::Relaxed);
                metrics::gauge!(m::LAST_EVENT_TIMESTAMP, "stream" => stream).set(t.time as f64);
            }
            if let Some(t) = crate::recount::applied_before(checkpoint) {
                self.report_checkpoint(&fence.stream, t.time as i64);
            }
        }
        match ended {
            Some(end) => Err(SessionError::Ended(end)),
            None => Ok(written),
        }
    }

    /// Writes a planned batch: (a) counters, (b) ledger and (c) dirty marks together, then (d)
    /// the checkpoint.
    ///
    /// (a), (b) and (c) go out side by side (one round trip of latency instead of three): the
    /// batch's whole plan is recorded as the intent before any of them, and a crash anywhere is
    /// repaired by re-applying that plan, each write guarded by the batch's end token, so which
    /// of them landed first never matters. No reader depends on their order either: the
    /// reconciler trusts only positions at or below the checkpoint, which (d) moves after all
    /// three are acknowledged. The simulation interleaves and fails them one by one.
    pub(super) async fn write_batch(
        &self,
        fence: &Fence,
        checkpoint: &mut Checkpoint,
        batch: &PendingBatch,
    ) -> Result<(), StoreError> {
        // A batch left in flight is re-applied before the stream is read again, so before a
        // history gap can be recorded: its states are of this generation.
        let generation = checkpoint.ledger_generation();
        let counters =
            self.store
                .apply_counters(fence, &batch.counters, &batch.end, batch.end_time); // (a)
        let ledger = async {
            if batch.ledger.is_empty() {
                return Ok(());
            }
            self.store
                .write_ledger(fence, &batch.ledger, &batch.end, generation)
                .await
        }; // (b)
        let dirty = self.store.mark_dirty(fence, &batch.dirty, self.clock.now()); // (c)
        let (outcome, (), ()) = futures::try_join!(counters, ledger, dirty)?;
        self.store
            .save_checkpoint(fence, &batch.end, batch.end_time)
            .await?; // (d)
        checkpoint.token = Some(batch.end.clone());
        checkpoint.token_time = batch.end_time;
        checkpoint.pending = None;
        let stream = fence.stream.clone();
        metrics::counter!(m::BATCHES, "stream" => stream.clone()).increment(1);
        metrics::counter!(m::INCREMENTS, "stream" => stream.clone(), "result" => "applied")
            .increment(outcome.applied);
        metrics::counter!(m::INCREMENTS, "stream" => stream, "result" => "already_applied")
            .increment(outcome.already_applied);
        tracing::debug!(stream = %fence.stream, end = %batch.end, writes = batch.counters.len(), already = outcome.already_applied, "batch applied");
        Ok(())
    }
}

/// An event that was not counted, with its comment and post where the event names them (taken
/// before the events are dropped, logged after the batch's writes).
struct SkippedReport {
    token: crate::event::Token,
    comment: String,
    post: String,
    problem: crate::classify::Problem,
}

impl SkippedReport {
    fn of(
        skipped: &crate::batch::Skipped,
        events: &[ChangeEvent],
        schema: &crate::schema::Schema,
    ) -> SkippedReport {
        let event = events.iter().find(|e| e.token == skipped.token);
        let comment = event
            .and_then(|e| e.comment.as_ref())
            .map(|c| c.key.clone())
            .unwrap_or_else(|| "unknown".into());
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
        let kind = match &self.problem {
            crate::classify::Problem::Bad(_) => "bad",
            crate::classify::Problem::Unattributable(_) => "unattributable",
        };
        let SkippedReport {
            token,
            comment,
            post,
            problem,
        } = self;
        tracing::warn!(%stream, %comment, %post, %token, kind, %problem,
            "event not counted; its known posts are marked dirty and recounted");
    }
}
