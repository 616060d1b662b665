//! The reconciler: dirty set → consistent recount → fold → store.
//!
//! It recounts only dirty posts (oldest first), folds each true count in against a watermark so
//! that in-flight increments survive, and records the drift it corrected, with its sign. Every
//! count it installs is consistent with the events already folded into the counter
//! ([`crate::recount`]): a post whose settled rows changed while it was counted stays dirty and
//! is retried, so the reconciler never invents drift. A dirty post leaves the dirty set only once
//! a fold's watermark is above every change that dirtied it. A slow background sweep over all
//! posts finds drift that no event points at (a hand edit, a deleted counter); a windowed full
//! sweep exists for recovery (history lost) and on demand.

use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use serde::Serialize;

use crate::clock::{Clock, SystemClock};
use crate::event::PostId;
use crate::fold::{fold, watermark_for, Fold};
use crate::recount::{CatchUp, Consistent, Pace, Recount, Recounter, Request};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::{DirtyOrder, RunSummary, Store, StoreError, StoreResult};
use crate::telemetry as m;

/// The reconciler's knobs: built from the configuration by [`crate::daemon`], whose `Default`
/// is the configuration's defaults.
#[derive(Clone, Debug)]
pub struct ReconcileSettings {
    /// The stream whose checkpoint bounds the watermark.
    pub stream: String,
    pub bucket_width_secs: i64,
    pub settle_secs: i64,
    pub max_posts: usize,
    /// Recount queries per second; 0: unlimited.
    pub counts_per_second: u32,
    pub fold_retries: u32,
    pub sweep_window: usize,
    /// Recount only the posts of this partition (`None`: all posts).
    pub partition: Option<crate::partition::Partition>,
    /// Posts counted before one shared wait for the worker (quiet-window recounts).
    pub group_size: usize,
    /// How long a quiet-window recount waits for the worker, and how often it looks.
    pub catch_up: CatchUp,
    /// How long one pass of the background sweep over every post should take (`None`: no
    /// background sweep).
    pub background_pass: Option<Duration>,
    /// How often the reconcile loop runs (paces the background sweep).
    pub interval: Duration,
}

/// One corrected counter: what it displayed and what is true.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Correction {
    #[serde(serialize_with = "display")]
    pub post: PostId,
    pub wrong: i64,
    pub right: i64,
    /// `wrong - right`: positive ran high, negative ran low.
    pub drift: i64,
}

fn display<S: serde::Serializer>(post: &PostId, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(post)
}

/// The outcome of one run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RunReport {
    pub summary: RunSummary,
    /// Only the posts whose displayed value changed.
    pub corrections: Vec<Correction>,
    /// Posts left dirty because a change was in flight while they were counted, or the worker
    /// kept racing the install.
    pub contended: Vec<String>,
}

/// Recounts posts and folds the truth into their counters.
pub struct Reconciler<S: Store + ?Sized> {
    store: Arc<S>,
    settings: ReconcileSettings,
    clock: Arc<dyn Clock>,
    recounter: Recounter<S>,
}

/// What became of one post in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The recount was folded in (or there was nothing to change) at this watermark.
    Folded { watermark: i64 },
    /// A change was in flight, or the worker kept racing the install: try again later.
    NotNow,
}

impl<S: Store + ?Sized> Reconciler<S> {
    pub fn new(store: Arc<S>, settings: ReconcileSettings) -> Self {
        Self::with_clock(store, settings, Arc::new(SystemClock))
    }

    /// The same reconciler pausing on (and reading time from) `clock`.
    pub fn with_clock(store: Arc<S>, settings: ReconcileSettings, clock: Arc<dyn Clock>) -> Self {
        let recounter = Recounter::new(
            store.clone(),
            clock.clone(),
            settings.stream.clone(),
            settings.bucket_width_secs,
            settings.catch_up.clone(),
        );
        Reconciler {
            store,
            settings,
            clock,
            recounter,
        }
    }

    /// The watermark for a run now: a bucket boundary older than the settle time and than the
    /// worker's newest applied event.
    pub async fn watermark(&self, now_secs: i64) -> StoreResult<i64> {
        // Everything before the newest applied event, or before the last time the stream was
        // found drained, whichever is later, has been applied.
        let applied_until = self
            .store
            .load_checkpoint(&self.settings.stream)
            .await?
            .and_then(|c| crate::recount::applied_before(&c))
            .map(|t| t.time as i64);
        Ok(watermark_for(
            now_secs,
            applied_until,
            self.settings.settle_secs,
            self.settings.bucket_width_secs,
        ))
    }

    /// Recounts up to `max_posts` dirty posts, oldest first. An entry is cleared (if its
    /// version did not move meanwhile) only when the fold's watermark is above the newest
    /// change that dirtied it; otherwise it is requeued and folded again in a later run.
    pub async fn run_dirty(&self, now_secs: i64) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let dirty = self
            .store
            .dirty_list(
                Some(&self.settings.stream),
                DirtyOrder::Oldest,
                self.settings.max_posts,
            )
            .await?;
        let mut run = Run::new(
            &self.settings.stream,
            "dirty",
            watermark,
            self.settings.counts_per_second,
        );
        let passed = async {
            for group in dirty.chunks(self.settings.group_size.max(1)) {
                let posts: Vec<PostId> = group.iter().map(|e| e.post.clone()).collect();
                let outcomes = self
                    .reconcile_posts(&posts, watermark, false, &mut run)
                    .await?;
                for (entry, outcome) in group.iter().zip(outcomes) {
                    let Outcome::Folded { watermark } = outcome else {
                        continue;
                    };
                    if entry.newest_bucket.is_none_or(|b| b < watermark) {
                        self.store.clear_dirty(&entry.post, entry.version).await?;
                    } else {
                        run.summary.waiting += 1;
                        self.store
                            .requeue_dirty(&entry.post, entry.version, self.clock.now())
                            .await?;
                    }
                }
            }
            Ok(())
        }
        .await;
        self.conclude(run, passed).await
    }

    /// Ends a run: records it (also when it failed midway, so the corrections it installed
    /// before the failure are in its summary for `status`), then returns its report or error.
    async fn conclude(&self, run: Run, passed: StoreResult<()>) -> StoreResult<RunReport> {
        match passed {
            Ok(()) => self.finish(run).await,
            Err(e) => {
                tracing::warn!(error = %e, kind = %run.summary.kind, posts = run.summary.posts,
                    corrected = run.summary.corrected, "reconcile run failed midway; its summary so far is recorded");
                if let Err(record) = self.finish(run).await {
                    tracing::debug!(error = %record, "could not record the failed run either");
                }
                Err(e)
            }
        }
    }

    /// Recounts one post (the `reconcile --post` path); clears its dirty entry if unchanged and
    /// covered.
    pub async fn run_post(&self, post: &PostId, now_secs: i64) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let entry = self
            .store
            .dirty_list(None, DirtyOrder::Oldest, usize::MAX)
            .await?
            .into_iter()
            .find(|d| d.post == *post);
        let mut run = Run::new(&self.settings.stream, "post", watermark, 0);
        let outcome = self
            .reconcile_posts(std::slice::from_ref(post), watermark, false, &mut run)
            .await?;
        if let (Some(Outcome::Folded { watermark }), Some(entry)) = (outcome.first(), entry) {
            if entry.newest_bucket.is_none_or(|b| b < *watermark) {
                self.store.clear_dirty(post, entry.version).await?;
            } else {
                run.summary.waiting += 1;
            }
        }
        self.finish(run).await
    }

    /// Recounts every post, window by window over `post_id`, paced; `progress` hears the
    /// number of posts done after each window. Clears a pending sweep request when complete.
    pub async fn sweep(
        &self,
        now_secs: i64,
        progress: impl FnMut(u64) + Send,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<RunReport> {
        self.sweep_posts(now_secs, None, progress, shutdown).await
    }

    /// The sweep behind both. After lost history (`after_gap`: the stream's ledger generation)
    /// it folds each post above every row and bucket it has (a full recount), because no
    /// bucket can be trusted: a row dated above the watermark may have had its events in the
    /// gap. It also rebuilds the ledger entries of each post's rows first: an entry from before
    /// the gap may show a row where it no longer is.
    async fn sweep_posts(
        &self,
        now_secs: i64,
        after_gap: Option<u64>,
        mut progress: impl FnMut(u64) + Send,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let kind = if after_gap.is_some() {
            "gap_sweep"
        } else {
            "sweep"
        };
        let mut run = Run::new(
            &self.settings.stream,
            kind,
            watermark,
            self.settings.counts_per_second,
        );
        // Every sweep also rebuilds the ledger entries of the rows it passes over: after a gap
        // they are stale, and a stream that never had them (started on existing rows without
        // a snapshot) needs them to attribute a later delete or move of an old comment. Not
        // while the initial snapshot runs: an entry written then would hide its row from it.
        let checkpoint = self.store.load_checkpoint(&self.settings.stream).await?;
        let rebuild = match (&checkpoint, after_gap) {
            (Some(c), _) if c.snapshot_running() => None,
            (_, Some(generation)) => Some(generation),
            (c, None) => Some(c.as_ref().map_or(0, |c| c.ledger_generation())),
        };
        let mut after: Option<PostId> = None;
        let mut complete = true;
        let passed = async {
            loop {
                if shutdown.as_ref().is_some_and(Shutdown::requested) {
                    return Ok(()); // interrupted: a requested sweep stays requested
                }
                let window = self
                    .store
                    .posts_after(after.as_ref(), self.settings.sweep_window)
                    .await?;
                let Some(last) = window.last().cloned() else {
                    break;
                };
                let owned: Vec<PostId> = window
                    .iter()
                    .filter(|p| self.settings.partition.is_none_or(|part| part.owns(p)))
                    .cloned()
                    .collect();
                for group in owned.chunks(self.settings.group_size.max(1)) {
                    if let Some(generation) = rebuild {
                        complete &= self.rebuild_ledger(group, generation).await?;
                    }
                    let outcomes = self
                        .reconcile_posts(group, watermark, after_gap.is_some(), &mut run)
                        .await?;
                    complete &= outcomes.iter().all(|o| *o != Outcome::NotNow);
                }
                metrics::counter!(m::SWEEP_POSTS, "stream" => self.settings.stream.clone())
                    .increment(window.len() as u64);
                progress(run.summary.posts);
                after = Some(last);
            }
            if complete || after_gap.is_none() {
                self.store
                    .set_sweep_requested(&self.settings.stream, false)
                    .await?;
            } else {
                tracing::warn!(
                    stream = %self.settings.stream,
                    in_flight = run.summary.in_flight,
                    "the sweep after lost history could not recount every post consistently; it runs again"
                );
            }
            Ok(())
        }
        .await;
        self.conclude(run, passed).await
    }

    /// Runs the full sweep that a lost history requested, once the watermark has passed the end
    /// of the recorded gap: rows created in the gap sit above an earlier watermark, where a fold
    /// keeps buckets (empty for them, their events were never seen) and would not count them.
    /// Returns `None` when no sweep is requested or it must wait for the settle time.
    pub async fn run_requested_sweep(
        &self,
        now_secs: i64,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<Option<RunReport>> {
        let Some(checkpoint) = self.store.load_checkpoint(&self.settings.stream).await? else {
            return Ok(None);
        };
        if !checkpoint.sweep_requested {
            return Ok(None);
        }
        let gap_end = checkpoint
            .gaps
            .iter()
            .map(|g| crate::time::secs(g.to))
            .max();
        let watermark = self.watermark(now_secs).await?;
        if gap_end.is_some_and(|end| watermark <= end) {
            tracing::info!(
                stream = %self.settings.stream,
                watermark,
                gap_end,
                "requested sweep waits until the watermark passes the gap"
            );
            return Ok(None);
        }
        tracing::warn!(
            stream = %self.settings.stream,
            "running the requested full sweep (history was lost or events were unattributable)"
        );
        let stream = self.settings.stream.clone();
        let progress = metrics::gauge!(m::FULL_SWEEP_PROGRESS, "stream" => stream.clone());
        let report = self
            .sweep_posts(
                now_secs,
                (!checkpoint.gaps.is_empty()).then(|| checkpoint.ledger_generation()),
                |done| {
                    progress.set(done as f64);
                    tracing::info!(%stream, posts = done, "sweep progress")
                },
                shutdown,
            )
            .await;
        progress.set(0.0);
        Ok(Some(report?))
    }

    /// One step of the slow background sweep: the next posts of its current pass over every
    /// post, as many as keep a pass near `background_pass` long (at least one, at most a
    /// window). Resumes where the last step (of any process) stopped. Finds drift that no event
    /// points at: a hand-edited counter of a post nobody comments on, a deleted counter.
    pub async fn background_step(&self, now_secs: i64) -> StoreResult<Option<RunReport>> {
        let Some(pass) = self.settings.background_pass else {
            return Ok(None);
        };
        let mut cursor = self
            .store
            .load_sweep_cursor(&self.settings.stream)
            .await?
            .unwrap_or_default();
        let estimate = cursor.last_pass_posts.max(cursor.posts_done).max(1);
        let steps_per_pass =
            (pass.as_secs_f64() / self.settings.interval.as_secs_f64().max(0.001)).max(1.0);
        let size = ((estimate as f64 / steps_per_pass).ceil() as usize)
            .clamp(1, self.settings.sweep_window);
        let watermark = self.watermark(now_secs).await?;
        let window = self.store.posts_after(cursor.after.as_ref(), size).await?;
        let mut run = Run::new(
            &self.settings.stream,
            "background",
            watermark,
            self.settings.counts_per_second,
        );
        if cursor.pass_started.is_none() {
            cursor.pass_started = Some(self.clock.now());
        }
        let owned: Vec<PostId> = window
            .iter()
            .filter(|p| self.settings.partition.is_none_or(|part| part.owns(p)))
            .cloned()
            .collect();
        self.reconcile_posts(&owned, watermark, false, &mut run)
            .await?;
        cursor.posts_done += window.len() as u64;
        match window.last() {
            Some(last) if window.len() == size => cursor.after = Some(last.clone()),
            _ => {
                // The pass is complete: start the next one from the first post.
                if cursor.posts_done > 0 {
                    tracing::info!(
                        stream = %self.settings.stream,
                        posts = cursor.posts_done,
                        passes = cursor.passes + 1,
                        "background sweep pass complete"
                    );
                }
                cursor.passes += 1;
                cursor.last_pass_posts = cursor.posts_done;
                cursor.posts_done = 0;
                cursor.after = None;
                cursor.pass_started = None;
            }
        }
        let stream = self.settings.stream.clone();
        metrics::gauge!(m::BACKGROUND_SWEEP_POSTS_DONE, "stream" => stream.clone())
            .set(cursor.posts_done as f64);
        metrics::gauge!(m::BACKGROUND_SWEEP_LAST_PASS, "stream" => stream)
            .set(cursor.last_pass_posts as f64);
        self.store
            .save_sweep_cursor(&self.settings.stream, &cursor)
            .await?;
        Ok(Some(self.finish(run).await?))
    }

    /// After lost history: rebuilds the ledger entries of these posts' rows, so that a later
    /// event of a row that changed in the gap is classified against the row as it is, not
    /// against an entry from before the gap (a row moved in the gap would be taken off its old
    /// post and never off its new one). The rows are read, then every event before the read
    /// must be applied (false if the worker did not catch up in time: the sweep runs again);
    /// only entries from before the gap are replaced, and the worker's later writes win.
    async fn rebuild_ledger(&self, posts: &[PostId], generation: u64) -> StoreResult<bool> {
        let mut rows = Vec::new();
        for post in posts {
            rows.extend(self.store.rows_of_post(post).await?);
        }
        let read_at = self.store.read_position().await?.upper;
        if !self.recounter.wait_until_applied(read_at).await? {
            return Ok(false);
        }
        self.store
            .rebuild_ledger(&self.settings.stream, generation, &rows)
            .await?;
        Ok(true)
    }

    /// Recounts a group of posts consistently with the stream and folds each recount in;
    /// returns what became of each.
    async fn reconcile_posts(
        &self,
        posts: &[PostId],
        proposed: i64,
        full: bool,
        run: &mut Run,
    ) -> StoreResult<Vec<Outcome>> {
        if posts.is_empty() {
            return Ok(Vec::new());
        }
        let requests: Vec<Request> = posts
            .iter()
            .map(|post| Request {
                post: post.clone(),
                watermark: proposed,
                full,
            })
            .collect();
        let recounts = self.recounter.recount(&requests, &mut run.pace).await;
        let recounts = recounts?;
        run.summary.counts += recounts.len() as u64;
        let mut outcomes = Vec::with_capacity(recounts.len());
        for recount in recounts {
            let outcome = match recount {
                Recount::SnapshotRunning => {
                    run.summary.waiting_for_snapshot += 1;
                    Outcome::NotNow
                }
                Recount::InFlight => {
                    run.summary.in_flight += 1;
                    metrics::counter!(m::RECOUNTS_IN_FLIGHT, "stream" => self.settings.stream.clone())
                        .increment(1);
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
                if let Some(post) = posts.get(outcomes.len()) {
                    run.contended.push(post.to_string());
                }
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Folds a consistent recount into the counter, conditioned on the counter unchanged since
    /// it was last read; when the worker moved it meanwhile, re-reads and folds again as long as
    /// the recount still holds (bounded).
    async fn install(&self, mut recount: Consistent, run: &mut Run) -> StoreResult<Outcome> {
        for _ in 0..self.settings.fold_retries.max(1) {
            let counter = recount.counter.clone();
            let state = counter
                .as_ref()
                .map(|c| c.state.clone())
                .unwrap_or_default();
            let folded = fold(&state, recount.watermark, recount.count);
            let done = Outcome::Folded {
                watermark: folded.watermark,
            };
            if counter.is_none() && folded.right == 0 {
                run.summary.posts += 1; // no rows, no counter: nothing to keep
                return Ok(done);
            }
            if counter.is_some() && is_noop(&state, &folded) {
                run.summary.posts += 1;
                return Ok(done);
            }
            if self
                .store
                .install_fold(&recount.post, counter.as_ref(), &folded, self.clock.now())
                .await?
            {
                run.record(&recount.post, &folded);
                return Ok(done);
            }
            let now = self.store.read_counter(&recount.post).await?;
            if !recount.holds_for(now.as_ref()) {
                run.summary.in_flight += 1;
                metrics::counter!(m::RECOUNTS_IN_FLIGHT, "stream" => self.settings.stream.clone())
                    .increment(1);
                return Ok(Outcome::NotNow);
            }
            recount.counter = now;
        }
        tracing::debug!(stream = %self.settings.stream, post = %recount.post, "the worker kept moving the counter; the post stays dirty");
        Ok(Outcome::NotNow)
    }

    async fn finish(&self, run: Run) -> StoreResult<RunReport> {
        let Run {
            stream,
            started,
            mut summary,
            corrections,
            contended,
            ..
        } = run;
        summary.finished_at = Some(self.clock.now());
        self.store.record_run(&summary).await?;
        let backlog = self.store.dirty_summary().await?;
        m::record_dirty(backlog.size, backlog.oldest);
        let kind = summary.kind.clone();
        metrics::counter!(m::RECONCILE_RUNS, "stream" => stream.clone(), "kind" => kind.clone())
            .increment(1);
        metrics::histogram!(m::RECONCILE_DURATION, "kind" => kind)
            .record(started.elapsed().as_secs_f64());
        metrics::gauge!(m::LAST_RECONCILE_TIMESTAMP, "stream" => stream.clone()).set(m::unix_now());
        // One line per run: at info when it corrected something, left posts in flight or was
        // asked for (a sweep, one post), with the biggest corrections; every correction is at
        // debug (`counter corrected`).
        let notable = summary.corrected > 0
            || summary.in_flight > 0
            || !matches!(summary.kind.as_str(), "dirty" | "background");
        let biggest = biggest_corrections(&corrections, 3);
        macro_rules! summary_line {
            ($level:ident) => {
                tracing::$level!(
                    %stream, kind = %summary.kind, posts = summary.posts, counts = summary.counts,
                    corrected = summary.corrected, total_abs_drift = summary.total_abs_drift,
                    max_abs_drift = summary.max_abs_drift, high = summary.drift_high, low = summary.drift_low,
                    in_flight = summary.in_flight, waiting = summary.waiting,
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
    sorted.sort_by_key(|c| std::cmp::Reverse(c.drift.abs()));
    sorted
        .iter()
        .take(n)
        .map(|c| format!("{}:{:+}", c.post, c.drift))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A fold that would write exactly what is there already.
fn is_noop(state: &crate::fold::CounterState, folded: &Fold) -> bool {
    folded.drift == 0
        && folded.watermark == state.base_watermark
        && folded.dropped.is_empty()
        && folded.base_count == state.base_count
        && folded.live_delta == state.live_delta
}

/// Bookkeeping of one run.
struct Run {
    /// The stream whose posts this run reconciles (the metrics' label).
    stream: String,
    started: std::time::Instant,
    summary: RunSummary,
    corrections: Vec<Correction>,
    contended: Vec<String>,
    pace: Pace,
}

impl Run {
    fn new(stream: &str, kind: &str, watermark: i64, counts_per_second: u32) -> Run {
        Run {
            stream: stream.to_string(),
            started: std::time::Instant::now(),
            summary: RunSummary {
                started_at: Some(DateTime::now()),
                kind: kind.into(),
                watermark,
                ..RunSummary::default()
            },
            corrections: Vec::new(),
            contended: Vec::new(),
            pace: Pace::new(counts_per_second),
        }
    }

    fn record(&mut self, post: &PostId, folded: &Fold) {
        self.summary.posts += 1;
        metrics::counter!(m::POSTS_RECONCILED, "stream" => self.stream.clone()).increment(1);
        if folded.drift == 0 {
            return;
        }
        let sign = if folded.drift > 0 { "high" } else { "low" };
        metrics::histogram!(m::DRIFT, "sign" => sign).record(folded.drift.unsigned_abs() as f64);
        self.summary.corrected += 1;
        self.summary.total_abs_drift += folded.drift.abs();
        self.summary.max_abs_drift = self.summary.max_abs_drift.max(folded.drift.abs());
        if folded.drift > 0 {
            self.summary.drift_high += folded.drift;
            self.summary.corrected_high += 1;
        } else {
            self.summary.drift_low += folded.drift;
            self.summary.corrected_low += 1;
        }
        tracing::debug!(stream = %self.stream, %post, wrong = folded.wrong, right = folded.right, drift = folded.drift, "counter corrected");
        self.corrections.push(Correction {
            post: post.clone(),
            wrong: folded.wrong,
            right: folded.right,
            drift: folded.drift,
        });
    }
}

/// Runs reconcile passes every `interval` (jittered by `jitter`, a fraction) until shutdown:
/// a requested full sweep first, then the dirty posts, then a step of the background sweep.
pub async fn run_loop<S: Store + ?Sized>(
    reconciler: Reconciler<S>,
    interval: Duration,
    jitter: f64,
    shutdown: Shutdown,
) -> Result<(), StoreError> {
    use rand::Rng;
    loop {
        let spread = interval.as_secs_f64() * jitter;
        let delay = interval.as_secs_f64() + rand::rng().random_range(-spread..=spread);
        let clock = reconciler.clock.clone();
        if sleep_or_shutdown(
            clock.as_ref(),
            Duration::from_secs_f64(delay.max(0.01)),
            &shutdown,
        )
        .await
        {
            return Ok(());
        }
        let now = crate::time::secs(clock.now());
        let pass = async {
            reconciler
                .run_requested_sweep(now, Some(shutdown.clone()))
                .await?;
            reconciler.run_dirty(now).await?;
            reconciler.background_step(now).await
        };
        match pass.await {
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "reconcile").increment(1);
                tracing::warn!(stream = %reconciler.settings.stream, error = %e, "reconcile pass failed; retrying next interval");
            }
            Err(e) => return Err(e),
        }
    }
}
