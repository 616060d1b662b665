//! The reconciler: dirty set → count → fold → store.
//!
//! It recounts only dirty posts (oldest first), folds each true count in against a watermark so
//! that in-flight increments survive, and records the drift it corrected, with its sign. A full
//! sweep over `post_id` windows exists for recovery (history lost, unattributable events) and on
//! demand.

use std::sync::Arc;
use std::time::Duration;

use bson::DateTime;
use serde::Serialize;
use tokio::sync::watch;

use crate::batch::bucket_of;
use crate::event::PostId;
use crate::fold::{effective_watermark, fold, watermark_for, Fold};
use crate::store::{DirtyOrder, RunSummary, Store, StoreError, StoreResult};
use crate::telemetry as m;

/// The reconciler's knobs (from [`crate::config::Settings`]).
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
}

impl Default for ReconcileSettings {
    fn default() -> Self {
        ReconcileSettings {
            stream: "comments".into(),
            bucket_width_secs: 60,
            settle_secs: 30,
            max_posts: 1000,
            counts_per_second: 0,
            fold_retries: 5,
            sweep_window: 500,
            partition: None,
        }
    }
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
    /// Posts left dirty because a worker kept racing the fold.
    pub contended: Vec<String>,
}

/// Recounts posts and folds the truth into their counters.
pub struct Reconciler<S: Store + ?Sized> {
    store: Arc<S>,
    settings: ReconcileSettings,
}

/// Paces recount queries to `counts_per_second`.
struct Pace(Option<tokio::time::Interval>);

impl Pace {
    fn new(per_second: u32) -> Pace {
        Pace((per_second > 0).then(|| {
            let mut i = tokio::time::interval(Duration::from_secs_f64(1.0 / per_second as f64));
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        }))
    }
    async fn wait(&mut self) {
        if let Some(i) = self.0.as_mut() {
            i.tick().await;
        }
    }
}

impl<S: Store + ?Sized> Reconciler<S> {
    pub fn new(store: Arc<S>, settings: ReconcileSettings) -> Self {
        Reconciler { store, settings }
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
            .and_then(|c| c.token_time.into_iter().chain(c.caught_up_at).max())
            .map(|t| t.time as i64);
        Ok(watermark_for(
            now_secs,
            applied_until,
            self.settings.settle_secs,
            self.settings.bucket_width_secs,
        ))
    }

    /// Recounts up to `max_posts` dirty posts, oldest first; clears each entry only if its
    /// version did not move meanwhile.
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
        let mut run = Run::new("dirty", watermark, self.settings.counts_per_second);
        for entry in dirty {
            if let Some(done) = self
                .reconcile_post(&entry.post, watermark, &mut run)
                .await?
            {
                if done {
                    self.store.clear_dirty(&entry.post, entry.version).await?;
                }
            }
        }
        self.finish(run).await
    }

    /// Recounts one post (the `reconcile --post` path); clears its dirty entry if unchanged.
    pub async fn run_post(&self, post: &PostId, now_secs: i64) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let version = self
            .store
            .dirty_list(None, DirtyOrder::Oldest, usize::MAX)
            .await?
            .into_iter()
            .find(|d| d.post == *post)
            .map(|d| d.version);
        let mut run = Run::new("post", watermark, 0);
        if self.reconcile_post(post, watermark, &mut run).await? == Some(true) {
            if let Some(v) = version {
                self.store.clear_dirty(post, v).await?;
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
        shutdown: Option<watch::Receiver<bool>>,
    ) -> StoreResult<RunReport> {
        self.sweep_posts(now_secs, false, progress, shutdown).await
    }

    /// The sweep behind both: `after_gap` folds each post above every row and bucket it has
    /// (a full recount), because after lost history no bucket can be trusted: a row dated
    /// above the watermark may have had its events in the gap.
    async fn sweep_posts(
        &self,
        now_secs: i64,
        after_gap: bool,
        mut progress: impl FnMut(u64) + Send,
        shutdown: Option<watch::Receiver<bool>>,
    ) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let kind = if after_gap { "gap_sweep" } else { "sweep" };
        let mut run = Run::new(kind, watermark, self.settings.counts_per_second);
        run.full_recount = after_gap;
        let mut after: Option<PostId> = None;
        loop {
            if shutdown.as_ref().is_some_and(|s| *s.borrow()) {
                return self.finish(run).await;
            }
            let window = self
                .store
                .posts_after(after.as_ref(), self.settings.sweep_window)
                .await?;
            let Some(last) = window.last().cloned() else {
                break;
            };
            let owned = window
                .iter()
                .filter(|p| self.settings.partition.is_none_or(|part| part.owns(p)));
            for post in owned {
                self.reconcile_post(post, watermark, &mut run).await?;
            }
            metrics::counter!(m::SWEEP_PROGRESS).increment(window.len() as u64);
            progress(run.summary.posts);
            after = Some(last);
        }
        self.store
            .set_sweep_requested(&self.settings.stream, false)
            .await?;
        self.finish(run).await
    }

    /// Runs the full sweep that a lost history requested, once the watermark has passed the end
    /// of the recorded gap: rows created in the gap sit above an earlier watermark, where a fold
    /// keeps buckets (empty for them, their events were never seen) and would not count them.
    /// Returns `None` when no sweep is requested or it must wait for the settle time.
    pub async fn run_requested_sweep(
        &self,
        now_secs: i64,
        shutdown: Option<watch::Receiver<bool>>,
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
            .map(|g| g.to.timestamp_millis().div_euclid(1000))
            .max();
        let watermark = self.watermark(now_secs).await?;
        if gap_end.is_some_and(|end| watermark <= end) {
            tracing::info!(
                watermark,
                gap_end,
                "requested sweep waits until the watermark passes the gap"
            );
            return Ok(None);
        }
        tracing::warn!(
            "running the requested full sweep (history was lost or events were unattributable)"
        );
        let report = self
            .sweep_posts(
                now_secs,
                !checkpoint.gaps.is_empty(),
                |done| tracing::info!(posts = done, "sweep progress"),
                shutdown,
            )
            .await?;
        Ok(Some(report))
    }

    /// Counts and folds one post. `Some(true)`: installed (or nothing to change);
    /// `Some(false)`: the worker kept racing, try next run; `None` never (reserved).
    async fn reconcile_post(
        &self,
        post: &PostId,
        proposed: i64,
        run: &mut Run,
    ) -> StoreResult<Option<bool>> {
        for _ in 0..self.settings.fold_retries.max(1) {
            let counter = self.store.read_counter(post).await?;
            let state = counter
                .as_ref()
                .map(|c| c.state.clone())
                .unwrap_or_default();
            let mut proposed = proposed;
            if run.full_recount {
                let width = self.settings.bucket_width_secs;
                let latest_row = self.store.latest_created(post).await?;
                let latest_bucket = state.buckets.keys().next_back().copied();
                for start in latest_row
                    .map(|t| bucket_of(Some(DateTime::from_millis(t * 1000)), width))
                    .into_iter()
                    .chain(latest_bucket)
                {
                    proposed = proposed.max(start + width);
                }
            }
            let watermark = effective_watermark(&state, proposed);
            run.pace.wait().await;
            let count = self.store.count_live_below(post, watermark).await?;
            run.summary.counts += 1;
            let folded = fold(&state, watermark, count);
            if counter.is_none() && folded.right == 0 {
                run.summary.posts += 1; // no rows, no counter: nothing to keep
                return Ok(Some(true));
            }
            if counter.is_some() && is_noop(&state, &folded) {
                run.summary.posts += 1;
                return Ok(Some(true));
            }
            if self
                .store
                .install_fold(post, counter.as_ref(), &folded, DateTime::now())
                .await?
            {
                run.record(post, &folded);
                return Ok(Some(true));
            }
        }
        tracing::info!(%post, "recount raced the worker on every attempt; the post stays dirty");
        run.contended.push(post.to_string());
        Ok(Some(false))
    }

    async fn finish(&self, run: Run) -> StoreResult<RunReport> {
        let Run {
            mut summary,
            corrections,
            contended,
            ..
        } = run;
        summary.finished_at = Some(DateTime::now());
        metrics::counter!(m::RECONCILE_RUNS, "kind" => summary.kind.clone()).increment(1);
        tracing::info!(
            kind = %summary.kind, posts = summary.posts, counts = summary.counts,
            corrected = summary.corrected, total_abs_drift = summary.total_abs_drift,
            max_abs_drift = summary.max_abs_drift, high = summary.drift_high, low = summary.drift_low,
            "reconcile run finished"
        );
        self.store.record_run(&summary).await?;
        let backlog = self.store.dirty_summary().await?;
        metrics::gauge!(m::DIRTY_BACKLOG_SIZE).set(backlog.size as f64);
        let oldest_age = backlog
            .oldest
            .map(|t| (DateTime::now().timestamp_millis() - t.timestamp_millis()) as f64 / 1000.0)
            .unwrap_or(0.0);
        metrics::gauge!(m::DIRTY_BACKLOG_OLDEST_AGE).set(oldest_age.max(0.0));
        Ok(RunReport {
            summary,
            corrections,
            contended,
        })
    }
}

/// A fold that would write exactly what is there already.
fn is_noop(state: &crate::fold::CounterState, folded: &Fold) -> bool {
    folded.drift == 0
        && folded.dropped.is_empty()
        && folded.base_count == state.base_count
        && folded.live_delta == state.live_delta
}

/// Bookkeeping of one run.
struct Run {
    summary: RunSummary,
    /// Fold above every row and bucket of each post (the sweep after lost history).
    full_recount: bool,
    corrections: Vec<Correction>,
    contended: Vec<String>,
    pace: Pace,
}

impl Run {
    fn new(kind: &str, watermark: i64, counts_per_second: u32) -> Run {
        Run {
            full_recount: false,
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
        metrics::counter!(m::POSTS_RECONCILED).increment(1);
        if folded.drift == 0 {
            return;
        }
        let sign = if folded.drift > 0 { "high" } else { "low" };
        metrics::histogram!(m::COUNTER_DRIFT, "sign" => sign)
            .record(folded.drift.unsigned_abs() as f64);
        self.summary.corrected += 1;
        self.summary.total_abs_drift += folded.drift.abs();
        self.summary.max_abs_drift = self.summary.max_abs_drift.max(folded.drift.abs());
        if folded.drift > 0 {
            self.summary.drift_high += folded.drift;
        } else {
            self.summary.drift_low += folded.drift;
        }
        tracing::info!(%post, wrong = folded.wrong, right = folded.right, drift = folded.drift, "counter corrected");
        self.corrections.push(Correction {
            post: post.clone(),
            wrong: folded.wrong,
            right: folded.right,
            drift: folded.drift,
        });
    }
}

/// Runs reconcile passes every `interval` (jittered by `jitter`, a fraction) until shutdown:
/// a requested full sweep first, then the dirty posts.
pub async fn run_loop<S: Store + ?Sized>(
    reconciler: Reconciler<S>,
    interval: Duration,
    jitter: f64,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), StoreError> {
    use rand::Rng;
    loop {
        let spread = interval.as_secs_f64() * jitter;
        let delay = interval.as_secs_f64() + rand::rng().random_range(-spread..=spread);
        if crate::worker::sleep_or_shutdown(Duration::from_secs_f64(delay.max(0.01)), &mut shutdown)
            .await
        {
            return Ok(());
        }
        let now = chrono::Utc::now().timestamp();
        let pass = async {
            reconciler
                .run_requested_sweep(now, Some(shutdown.clone()))
                .await?;
            reconciler.run_dirty(now).await
        };
        match pass.await {
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "reconcile").increment(1);
                tracing::warn!(error = %e, "reconcile pass failed; retrying next interval");
            }
            Err(e) => return Err(e),
        }
    }
}
