//! One run's work: each post recounted consistently with the stream, folded in, installed,
//! and recorded in the run's bookkeeping; the report it ends with.

use bson::DateTime;

use super::{Correction, Outcome, ReconcileSettings, Reconciler, RunReport};
use crate::core::fold::{fold, Fold, RunKind};
use crate::core::key::GroupValue;
use crate::recount::{Consistent, Pace, Recount, Request};
use crate::store::{DirtyEntry, RunSummary, Store, StoreResult};
use crate::telemetry as m;

impl<S: Store + ?Sized> Reconciler<S> {
    /// Recounts a group of posts consistently with the stream and folds each recount in;
    /// returns what became of each.
    pub(super) async fn reconcile_posts(
        &self,
        posts: &[GroupValue],
        proposed: i64,
        full: bool,
        run: &mut Run,
    ) -> StoreResult<Vec<Outcome>> {
        if posts.is_empty() {
            return Ok(Vec::new());
        }
        let requests = Request::each(posts, proposed, full);
        let recounts = self.recounter.recount(&requests, &mut run.pace).await?;
        run.summary.counts += recounts.len() as u64;
        metrics::counter!(m::RECOUNTS, "stream" => self.settings.stream.clone(), "kind" => run.kind.label())
            .increment(recounts.len() as u64);
        let mut outcomes = Vec::with_capacity(recounts.len());
        for (post, recount) in posts.iter().zip(recounts) {
            let outcome = match recount {
                Recount::SnapshotRunning => {
                    run.summary.waiting_for_snapshot += 1;
                    Outcome::NotNow
                }
                Recount::InFlight => {
                    self.note_in_flight(run);
                    Outcome::NotNow
                }
                Recount::Consistent(recount) => {
                    if recount.snapshot {
                        run.summary.snapshot_counts += 1;
                    }
                    self.install(*recount, run).await?
                }
            };
            if outcome == Outcome::NotNow {
                run.contended.push(post.to_string());
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// A recount that could not be installed (a change in flight): the post stays dirty.
    fn note_in_flight(&self, run: &mut Run) {
        run.summary.in_flight += 1;
        metrics::counter!(m::RECOUNTS_IN_FLIGHT, "stream" => self.settings.stream.clone(), "kind" => run.kind.label())
            .increment(1);
    }

    /// Folds a consistent recount into the counter, conditioned on the counter unchanged since
    /// it was last read; when the worker moved it meanwhile, re-reads and settles the recount
    /// against the new state, then folds again (bounded).
    async fn install(&self, mut recount: Consistent, run: &mut Run) -> StoreResult<Outcome> {
        for _ in 0..self.settings.fold_retries.max(1) {
            let counter = recount.counter.as_ref();
            let state = counter.map(|c| c.state.clone()).unwrap_or_default();
            let folded = fold(&state, recount.watermark, recount.count);
            let done = Outcome::Folded {
                watermark: folded.watermark,
            };
            let nothing_to_keep = counter.is_none() && folded.right == 0; // no rows, no counter
            if nothing_to_keep || (counter.is_some() && is_noop(&state, &folded)) {
                run.summary.posts += 1;
                return Ok(done);
            }
            if self
                .store
                .install_fold(&recount.post, counter, &folded, self.clock.now())
                .await?
            {
                run.record(&recount.post, &folded);
                return Ok(done);
            }
            let now = self.store.read_counter(&recount.post).await?;
            if !self.recounter.settle(&mut recount, now).await? {
                self.note_in_flight(run);
                return Ok(Outcome::NotNow);
            }
        }
        tracing::debug!(stream = %self.settings.stream, post = %recount.post, "the worker kept moving the counter; the post stays dirty");
        Ok(Outcome::NotNow)
    }

    pub(super) async fn finish(&self, run: Run) -> StoreResult<RunReport> {
        let Run {
            stream,
            counter,
            kind,
            started,
            mut summary,
            corrections,
            contended,
            ..
        } = run;
        summary.finished_at = Some(self.clock.now());
        self.store.record_run(&summary).await?;
        let backlog = self.store.dirty_summary().await?;
        m::record_dirty(backlog.size, backlog.oldest, &counter);
        metrics::counter!(m::RECONCILE_RUNS, "stream" => stream.clone(), "kind" => kind.label(), "counter" => counter.clone())
            .increment(1);
        metrics::histogram!(m::RECONCILE_DURATION, "kind" => kind.label())
            .record(started.elapsed().as_secs_f64());
        metrics::gauge!(m::LAST_RECONCILE_TIMESTAMP, "stream" => stream.clone()).set(m::unix_now());
        // One line per run: at info when it corrected something, left posts in flight or was
        // asked for (a sweep, one post), with the biggest corrections; every correction is at
        // debug (`counter corrected`).
        let notable = summary.corrected > 0
            || summary.in_flight > 0
            || summary.deferred > 0
            || !RunKind::EVERY_PASS.contains(&kind);
        let biggest = biggest_corrections(&corrections, 3);
        macro_rules! summary_line {
            ($level:ident) => {
                tracing::$level!(
                    %stream, %counter, kind = %summary.kind, posts = summary.posts, counts = summary.counts,
                    corrected = summary.corrected, total_abs_drift = %summary.total_abs_drift,
                    max_abs_drift = %summary.max_abs_drift, high = %summary.drift_high, low = %summary.drift_low,
                    in_flight = summary.in_flight, deferred = summary.deferred, waiting = summary.waiting,
                    dirty_backlog = backlog.size, %biggest,
                    seconds = started.elapsed().as_secs_f64(),
                    "reconcile run finished"
                )
            };
        }
        if notable {
            summary_line!(info);
        } else {
            summary_line!(debug);
        }
        Ok(RunReport {
            summary,
            corrections,
            contended,
        })
    }
}

/// The `n` largest corrections by |drift|, as `post:+drift` (empty when none).
fn biggest_corrections(corrections: &[Correction], n: usize) -> String {
    let mut sorted: Vec<&Correction> = corrections.iter().collect();
    sorted.sort_by(|a, b| {
        b.drift
            .abs()
            .partial_cmp(&a.drift.abs())
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    sorted
        .iter()
        .take(n)
        .map(|c| format!("{}:{:+}", c.post, c.drift))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A fold that would write exactly what is there already.
fn is_noop(state: &crate::core::fold::CounterState, folded: &Fold) -> bool {
    folded.drift == 0
        && folded.watermark == state.base_watermark
        && folded.dropped.is_empty()
        && folded.base_count == state.base_count
        && folded.live_delta == state.live_delta
}

/// Bookkeeping of one run.
pub(super) struct Run {
    /// The stream whose posts this run reconciles (the metrics' label).
    stream: String,
    /// The counter definition whose counters it folds (the metrics' `counter` label).
    counter: String,
    /// What it goes over (the record's `kind`, the metrics' `kind` label).
    kind: RunKind,
    started: std::time::Instant,
    pub(super) summary: RunSummary,
    corrections: Vec<Correction>,
    contended: Vec<String>,
    pub(super) pace: Pace,
}

impl Run {
    /// A run of `kind` at `watermark` for the settings' stream and counter, paced at their
    /// `counts_per_second`.
    pub(super) fn new(settings: &ReconcileSettings, kind: RunKind, watermark: i64) -> Run {
        Run {
            stream: settings.stream.clone(),
            started: std::time::Instant::now(),
            summary: RunSummary {
                // Stored only for definitions beyond the first: its run's record is the same
                // as before definitions existed.
                counter: settings.stored_name().unwrap_or_default().to_string(),
                started_at: Some(DateTime::now()),
                kind: kind.label().into(),
                watermark,
                ..RunSummary::default()
            },
            corrections: Vec::new(),
            contended: Vec::new(),
            pace: Pace::new(settings.counts_per_second),
            counter: settings.counter_name.clone(),
            kind,
        }
    }

    /// A fold covered the settled changes of a dirty entry: how long they waited.
    pub(super) fn folded_dirty(&mut self, entry: &DirtyEntry, now: DateTime) {
        let waited_ms = (now.timestamp_millis() - entry.first_dirty_at.timestamp_millis()).max(0);
        metrics::histogram!(m::DIRTY_TO_FOLD, "stream" => self.stream.clone(), "counter" => self.counter.clone())
            .record(waited_ms as f64 / 1000.0);
        let longest = &mut self.summary.longest_dirty_to_fold_secs;
        *longest = (*longest).max(Some(waited_ms / 1000));
    }

    fn record(&mut self, post: &GroupValue, folded: &Fold) {
        self.summary.posts += 1;
        metrics::counter!(m::POSTS_RECONCILED, "stream" => self.stream.clone(), "counter" => self.counter.clone())
            .increment(1);
        if !folded.wrong.differs(folded.right) {
            return; // none, or a sum's rounding
        }
        let sign = if folded.drift > 0 { "high" } else { "low" };
        let abs = folded.drift.abs();
        // Labelled by counter definition, so each counter's drift is its own series.
        metrics::histogram!(m::DRIFT, "sign" => sign, "counter" => self.counter.clone())
            .record(folded.drift.abs().as_f64());
        self.summary.corrected += 1;
        self.summary.total_abs_drift += abs;
        if abs > self.summary.max_abs_drift {
            self.summary.max_abs_drift = abs;
        }
        if folded.drift > 0 {
            self.summary.drift_high += folded.drift;
            self.summary.corrected_high += 1;
        } else {
            self.summary.drift_low += folded.drift;
            self.summary.corrected_low += 1;
        }
        tracing::debug!(stream = %self.stream, counter = %self.counter, %post, wrong = %folded.wrong, right = %folded.right, drift = %folded.drift, "counter corrected");
        self.corrections.push(Correction {
            post: post.clone(),
            wrong: folded.wrong,
            right: folded.right,
            drift: folded.drift,
        });
    }
}
