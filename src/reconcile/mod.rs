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
//!
//! Where it lives: `mod.rs` the settings, the report and the reconciler (dirty and single-post
//! runs) plus the reconcile loop; `sweep.rs` the full and background sweeps (and the ledger
//! rebuild after lost history); `run.rs` one run's work: recount, fold, install, record.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

mod run;
pub mod schedule;
mod sweep;

pub use sweep::{adopt_new_definitions, run_requested_sweeps, sweep_all};

use run::Run;

use crate::clock::{Clock, SystemClock};
use crate::core::definition::stored_name;
use crate::core::fold::{watermark_for, RunKind};
use crate::core::key::CounterIx;
use crate::core::key::GroupValue;
use crate::recount::{CatchUp, FoundBehind, Pace, Recounter};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::{DirtyOrder, RunSummary, Store, StoreError, StoreResult};
use crate::telemetry as m;

/// The reconciler's knobs: built from the configuration by [`crate::daemon`], whose `Default`
/// is the configuration's defaults.
#[derive(Clone, Debug)]
pub struct ReconcileSettings {
    /// The stream whose checkpoint bounds the watermark.
    pub stream: String,
    /// The counter definition whose counters this reconciler folds: its store view (counters
    /// collection, dirty set, the rows it counts) is made from it ([`CounterViews`]).
    pub counter: CounterIx,
    /// That definition's name: the `counter` label of the reconciler's metrics, and the key
    /// of its background sweep's cursor beside the stream's.
    pub counter_name: String,
    pub bucket_width_secs: i64,
    pub settle_secs: i64,
    pub max_posts: usize,
    /// Recount queries per second; 0: unlimited.
    pub counts_per_second: u32,
    pub fold_retries: u32,
    pub sweep_window: usize,
    /// Recount only the posts of this partition (`None`: all posts).
    pub partition: Option<crate::core::partition::Partition>,
    /// Posts read before one shared wait for the worker (row-level recounts).
    pub group_size: usize,
    /// How long a row-level recount waits for the worker, and how often it looks.
    pub catch_up: CatchUp,
    /// Row ids a group's row-level recount may hold at once (this stream's share of the memory
    /// budget).
    pub recount_rows: usize,
    /// How long one pass of the background sweep over every post should take (`None`: no
    /// background sweep).
    pub background_pass: Option<Duration>,
    /// How often the reconcile loop runs (paces the background sweep).
    pub interval: Duration,
}

impl ReconcileSettings {
    /// The same settings for the counter definition `counter`, named `name`.
    pub fn for_counter(self, counter: CounterIx, name: &str) -> Self {
        ReconcileSettings {
            counter,
            counter_name: name.to_string(),
            ..self
        }
    }

    /// The definition's name in what it stores (see [`stored_name`]): `None` for definition 0.
    pub(super) fn stored_name(&self) -> Option<&str> {
        stored_name(self.counter, &self.counter_name)
    }

    /// Where its background sweep keeps its place: the stream's name for definition 0 (as
    /// before definitions existed), `<stream>#<name>` for the others.
    pub fn sweep_key(&self) -> String {
        match self.stored_name() {
            None => self.stream.clone(),
            Some(name) => format!("{}#{name}", self.stream),
        }
    }
}

/// One corrected counter: what it displayed and what is true.
#[serde_with::serde_as]
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Correction {
    #[serde_as(as = "serde_with::DisplayFromStr")]
    pub post: GroupValue,
    pub wrong: crate::core::num::Num,
    pub right: crate::core::num::Num,
    /// `wrong - right`: positive ran high, negative ran low (a sum's field units).
    pub drift: crate::core::num::Num,
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

impl<S: Store> Reconciler<S> {
    /// A reconciler of `settings.counter` over `store` (any view of it: the reconciler makes
    /// its own definition's view).
    pub fn new(store: Arc<S>, settings: ReconcileSettings) -> Self {
        Self::with_clock(store, settings, Arc::new(SystemClock))
    }

    /// The same reconciler pausing on (and reading time from) `clock`.
    pub fn with_clock(store: Arc<S>, settings: ReconcileSettings, clock: Arc<dyn Clock>) -> Self {
        let store = if store.viewed_counter() == settings.counter {
            store
        } else {
            Arc::new(store.for_counter(settings.counter))
        };
        let recounter = Recounter::new(
            store.clone(),
            clock.clone(),
            settings.stream.clone(),
            settings.bucket_width_secs,
            settings.catch_up.clone(),
        )
        .holding_at_most(settings.recount_rows);
        Reconciler {
            store,
            settings,
            clock,
            recounter,
        }
    }
}

impl<S: Store + ?Sized> Reconciler<S> {
    /// The settings it runs with (its stream and counter definition).
    pub fn settings(&self) -> &ReconcileSettings {
        &self.settings
    }

    /// The watermark for a run now: a bucket boundary older than the settle time and than the
    /// worker's newest applied event.
    pub async fn watermark(&self, now_secs: i64) -> StoreResult<i64> {
        // Everything before the newest applied event, or before the last time the stream was
        // found drained, whichever is later, has been applied; for a counter several
        // partitions write, by every one of them (the earliest of their positions).
        let checkpoints = self.recounter.writer_checkpoints().await?;
        let applied_until = checkpoints
            .iter()
            .filter_map(|c| crate::recount::applied_before(c.as_ref()?))
            .map(|t| t.time as i64)
            .min();
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
        self.run_dirty_in_pass(now_secs, &mut FoundBehind::new())
            .await
    }

    /// [`Reconciler::run_dirty`] in a pass that found the streams of `found_behind` behind.
    async fn run_dirty_in_pass(
        &self,
        now_secs: i64,
        found_behind: &mut FoundBehind,
    ) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let dirty = self
            .store
            .dirty_list(
                Some(&self.settings.stream),
                DirtyOrder::Oldest,
                self.settings.max_posts,
            )
            .await?;
        let mut run = Run::new(&self.settings, RunKind::Dirty, watermark);
        let passed = async {
            for (i, group) in dirty.chunks(self.settings.group_size.max(1)).enumerate() {
                // A worker catching up a backlog has not reached the changes a count would
                // see: its posts are left, uncounted, for a later run (they stay dirty, with
                // their age), rather than counted and found in flight. Decided per stream, not
                // per post: the count's wait is for the whole stream's position, and the worker
                // marks a post dirty only once it applies the change, so a post's dirty mark
                // never shows the changes still ahead of the worker.
                if self.recounter.worker_behind(found_behind).await? {
                    let left = dirty.len() - i * self.settings.group_size.max(1);
                    run.summary.deferred += left as u64;
                    metrics::counter!(m::RECOUNTS_DEFERRED, "stream" => self.settings.stream.clone())
                        .increment(left as u64);
                    break;
                }
                let posts: Vec<GroupValue> = group.iter().map(|e| e.post.clone()).collect();
                let outcomes = self
                    .reconcile_posts(&posts, watermark, false, &mut run)
                    .await?;
                for (entry, outcome) in group.iter().zip(outcomes) {
                    let Outcome::Folded { watermark } = outcome else {
                        continue;
                    };
                    run.folded_dirty(entry, self.clock.now());
                    let covered = entry.newest_bucket.is_none_or(|b| b < watermark);
                    if !covered {
                        run.summary.waiting += 1;
                    }
                    // Cleared only if no mark came since it was listed; otherwise its age
                    // restarts here: this fold covered everything older.
                    if !(covered && self.store.clear_dirty(&entry.post, entry.version).await?) {
                        self.store
                            .requeue_dirty(&entry.post, self.clock.now())
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
    pub async fn run_post(&self, post: &GroupValue, now_secs: i64) -> StoreResult<RunReport> {
        let watermark = self.watermark(now_secs).await?;
        let entry = self
            .store
            .dirty_list(None, DirtyOrder::Oldest, usize::MAX)
            .await?
            .into_iter()
            .find(|d| d.post == *post);
        let mut run = Run::new(&self.settings, RunKind::Post, watermark);
        run.pace = Pace::new(0); // one post, asked for by hand: not paced
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
}

/// One reconcile pass over one stream's definitions (`reconcilers`, one per definition, the
/// default first): the sweep of a definition added since the initial snapshot (see
/// [`adopt_new_definitions`]; `since`: when this process began on the stream), a requested full
/// sweep, then every definition's dirty posts, then a step of each one's background sweep, a
/// whole window of it when the dirty posts left most of the interval unused
/// ([`schedule::has_spare_time`]). Returns the report of every run it made. The definitions
/// run one after another, so one stream's recounts never run side by side (their share of the
/// memory budget is the stream's), and a sweep request is cleared only once every one swept.
///
/// A stream whose worker is found catching up stays so for the rest of the pass
/// ([`FoundBehind`]): every later step that would count defers at once instead of waiting for
/// the worker again, so a pass waits at most one `catch_up.timeout` per stream, however many
/// definitions it has. A stream found caught up is asked again before each later step.
pub async fn run_pass<S: Store + ?Sized>(
    reconcilers: &[Reconciler<S>],
    now: i64,
    since: bson::DateTime,
    shutdown: Option<Shutdown>,
) -> StoreResult<Vec<RunReport>> {
    let Some(first) = reconcilers.first() else {
        return Ok(Vec::new());
    };
    let started = first.clock.now();
    let found_behind = &mut FoundBehind::new();
    let mut reports =
        adopt_new_definitions(reconcilers, now, since, shutdown.clone(), found_behind).await?;
    reports
        .extend(sweep::requested_sweeps_in_pass(reconcilers, now, shutdown, found_behind).await?);
    for reconciler in reconcilers {
        reports.push(reconciler.run_dirty_in_pass(now, found_behind).await?);
    }
    let spare = schedule::has_spare_time(
        elapsed_since(first.clock.as_ref(), started),
        first.settings.interval,
    );
    for reconciler in reconcilers {
        reports.extend(
            reconciler
                .background_step_in_pass(now, spare, found_behind)
                .await?,
        );
    }
    Ok(reports)
}

fn elapsed_since(clock: &dyn Clock, started: bson::DateTime) -> Duration {
    let millis = clock.now().timestamp_millis() - started.timestamp_millis();
    Duration::from_millis(millis.max(0) as u64)
}

/// Runs [`run_pass`] every `interval` (jittered by `jitter`, a fraction), counted from the
/// start of the previous pass ([`schedule::next_pass_delay`]), until shutdown. A pass that
/// fails on a transient error is retried at the next one.
pub async fn run_loop<S: Store + ?Sized>(
    reconcilers: Vec<Reconciler<S>>,
    interval: Duration,
    jitter: f64,
    shutdown: Shutdown,
    since: bson::DateTime,
) -> Result<(), StoreError> {
    use rand::Rng;
    let Some(reconciler) = reconcilers.first() else {
        return Ok(());
    };
    let clock = reconciler.clock.clone();
    let mut elapsed = Duration::ZERO;
    loop {
        let spread = interval.as_secs_f64() * jitter;
        let delay = schedule::next_pass_delay(
            interval,
            rand::rng().random_range(-spread..=spread),
            elapsed,
        );
        if sleep_or_shutdown(clock.as_ref(), delay, &shutdown).await {
            return Ok(());
        }
        let started = clock.now();
        let now = crate::core::time::secs(started);
        match run_pass(&reconcilers, now, since, Some(shutdown.clone())).await {
            Ok(_) => {}
            Err(e) if e.is_transient() => {
                metrics::counter!(m::RETRIES, "op" => "reconcile").increment(1);
                tracing::warn!(stream = %reconciler.settings.stream, error = %e, "reconcile pass failed; retrying next interval");
            }
            Err(e) => return Err(e),
        }
        elapsed = elapsed_since(clock.as_ref(), started);
    }
}
