//! The actors of a round, futures polled in a seeded order on one thread: writers, reconcile
//! passes (with the accounting of the corrections they report), an operator editing counters by
//! hand, and the real worker of each stream.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;

use counterd::core::key::GroupValue;
use counterd::core::time::bucket_of;
use counterd::reconcile::{run_requested_sweeps, ReconcileSettings, Reconciler, RunReport};
use counterd::store::prelude::*;
use counterd::store::{Fence, StoreError, StoreResult};
use counterd::worker::{Worker, WorkerError, WorkerSettings, WorkerStatus};
use rand::Rng;

use crate::plan::Plan;
use crate::sim_store::{yield_now, SimStore, State, INJECTED};
use crate::CATCH_UP;

pub type Errors = Rc<RefCell<Vec<String>>>;
pub type Actor<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Polls every actor, in order, until all are done: the seeded interleaving (actors yield at
/// store calls) is the only source of concurrency.
pub async fn join_in_order(mut actors: Vec<Actor<'_>>) {
    let mut done = vec![false; actors.len()];
    std::future::poll_fn(|cx| {
        for (actor, done) in actors.iter_mut().zip(done.iter_mut()) {
            if !*done && actor.as_mut().poll(cx).is_ready() {
                *done = true;
            }
        }
        if done.iter().all(|d| *d) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await
}

/// A fault the simulation injected (workers it stops end with `Ok`, through their shutdown).
pub fn injected(e: &StoreError) -> bool {
    match e {
        StoreError::Transient { message, .. } | StoreError::Fatal { message, .. } => {
            message.starts_with(INJECTED)
        }
        _ => false,
    }
}

pub fn writer(store: Arc<SimStore>, ops: usize) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..ops {
            {
                let mut s = store.lock();
                let what = s.write_random();
                let line = format!("write @{}: {what}", s.clock);
                s.note(line);
            }
            store.maybe_yield().await;
        }
        store.lock().others_running -= 1;
    })
}

/// The corrections reconcile runs reported, per post with sign.
pub type Reported = Rc<RefCell<BTreeMap<GroupValue, i64>>>;

/// Runs one reconcile pass and keeps the corrections it reports. Only one reconcile runs at a
/// time, so the folds the store saw installed meanwhile are this run's: a run that completes
/// must report exactly those. A run that fails (an injected fault) returns no report, so the
/// folds it installed before failing are taken from the store instead (and counted).
pub async fn accounted(
    store: &SimStore,
    reported: &Reported,
    errors: &Errors,
    what: String,
    run: impl Future<Output = StoreResult<Option<RunReport>>>,
) {
    let start = store.lock().fold_log.len();
    let outcome = run.await;
    let mut s = store.lock();
    let installed = s.fold_log[start..].to_vec();
    let kept = match outcome {
        Ok(report) => {
            let Some(report) = report else {
                return;
            };
            if !report.summary.counter.is_empty() {
                // Another definition's run: nothing is injected into its counters, so a fold
                // that corrected drift there is caught where it is installed (`seam.rs`).
                s.stat(format!("{} run of another definition", report.summary.kind));
                s.note(format!(
                    "  {what}: corrections {:?}, in flight {}",
                    report.corrections, report.summary.in_flight
                ));
                return;
            }
            let mut got: Vec<(GroupValue, i64)> = report
                .corrections
                .iter()
                .map(|c| (c.post.clone(), c.drift.as_i64()))
                .collect();
            let mut want = installed;
            got.sort();
            want.sort();
            if got != want {
                errors.borrow_mut().push(format!(
                    "{what} reported the corrections {got:?}, but the folds it installed corrected {want:?}"
                ));
            }
            for (key, n) in [
                ("recount in flight", report.summary.in_flight),
                ("folded but still dirty", report.summary.waiting),
            ] {
                if n > 0 {
                    *s.stats.entry(key.into()).or_default() += n;
                }
            }
            if !got.is_empty() {
                s.stat(format!("{} run corrected drift", report.summary.kind));
            }
            s.note(format!(
                "  {what}: corrections {got:?}, in flight {}, contended {:?}",
                report.summary.in_flight, report.contended
            ));
            got
        }
        Err(e) => {
            if !injected(&e) {
                errors.borrow_mut().push(format!("{what} failed: {e}"));
            }
            if !installed.is_empty() {
                s.stat("corrections of a failed run (unreported)");
            }
            s.note(format!(
                "  {what} failed ({e}); it had corrected {installed:?}"
            ));
            installed
        }
    };
    let mut reported = reported.borrow_mut();
    for (post, drift) in kept {
        *reported.entry(post).or_default() += drift;
    }
}

/// The sweep a lost history requested, of every definition of one stream (cleared once all
/// of them swept), as the daemon's reconcile loop runs it; the default definition's report
/// (the one [`accounted`] checks against the folds installed).
pub async fn requested_sweeps(
    definitions: &[Reconciler<SimStore>],
    now: i64,
) -> StoreResult<Option<RunReport>> {
    let reports = run_requested_sweeps(definitions, now, None).await?;
    Ok(reports.into_iter().find(|r| r.summary.counter.is_empty()))
}

/// `runs` reconcile passes, each of a stream chosen at random, as its replica's reconcile loop
/// runs them: a requested sweep first, then the dirty posts, then (usually) a step of the
/// background sweep. They start at a random point of the round and race the writers and
/// workers.
pub fn reconciler(
    store: Arc<SimStore>,
    plan: &Plan,
    runs: usize,
    errors: Errors,
    reported: Reported,
) -> Actor<'static> {
    let (max_posts, delay) = {
        let mut s = store.lock();
        (
            s.rng.random_range(1..=plan.posts as usize + 1),
            s.rng.random_range(0..8),
        )
    };
    let reconcilers: Vec<(String, Vec<Reconciler<SimStore>>)> = plan
        .streams()
        .into_iter()
        .map(|(stream, partition)| {
            let settings = plan.reconcile_settings(&stream, partition, max_posts);
            (stream, plan.reconcilers(&store, settings))
        })
        .collect();
    Box::pin(async move {
        for _ in 0..delay {
            yield_now().await;
        }
        for _ in 0..runs {
            let (now, which, background) = {
                let mut s = store.lock();
                let which = s.rng.random_range(0..reconcilers.len());
                let background = s.rng.random_bool(0.6);
                let now = s.clock;
                s.note(format!("reconcile {} @{now}", reconcilers[which].0));
                (now, which, background)
            };
            let (stream, definitions) = &reconcilers[which];
            let run = |what: &str| format!("{what} of {stream} @{now}");
            accounted(
                &store,
                &reported,
                &errors,
                run("requested sweep"),
                requested_sweeps(definitions, now),
            )
            .await;
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let run = |what: &str| format!("{what} of {stream} ({counter}) @{now}");
                accounted(&store, &reported, &errors, run("reconcile"), async {
                    reconciler.run_dirty(now).await.map(Some)
                })
                .await;
                if background {
                    accounted(
                        &store,
                        &reported,
                        &errors,
                        run("background step"),
                        reconciler.background_step(now, now % 2 == 0),
                    )
                    .await;
                }
            }
            store.maybe_yield().await;
        }
        store.lock().others_running -= 1;
    })
}

/// One hand edit of a counter by an operator: add `k != 0` to `base_count`, or to `live_delta`
/// together with one of its buckets at or below the clock's bucket, or (with `delete`) delete
/// the counter of a post that has live rows. The store records the drift each causes.
pub fn hand_edit(s: &mut State, delete: bool) {
    let posts: Vec<GroupValue> = s.displayed().into_keys().collect();
    if posts.is_empty() {
        return;
    }
    let post = posts[s.rng.random_range(0..posts.len())].clone();
    let k = [-3, -2, -1, 1, 2, 3][s.rng.random_range(0..6)];
    let now_bucket = bucket_of(Some(s.now()), s.bucket_width);
    let has_rows = s.truth().get(&post).is_some_and(|n| *n > 0);
    match s.rng.random_range(0..3) {
        1 => {
            let buckets: Vec<i64> = s
                .counter_buckets(&post)
                .unwrap_or_default()
                .into_iter()
                .filter(|b| *b <= now_bucket)
                .collect();
            if buckets.is_empty() {
                s.inject_base(&post, k);
            } else {
                let bucket = buckets[s.rng.random_range(0..buckets.len())];
                s.inject_bucket(&post, bucket, k);
            }
        }
        2 if delete && has_rows => {
            if s.delete_counter(&post).is_none() {
                s.inject_base(&post, k);
            }
        }
        _ => {
            s.inject_base(&post, k);
        }
    }
}

/// An operator editing counters by hand while everything else runs.
pub fn operator(store: Arc<SimStore>, edits: usize) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..edits {
            let turns = store.lock().rng.random_range(0..12);
            for _ in 0..turns {
                yield_now().await;
            }
            // Not a delete: a worker that lost its lease may still be writing this round.
            hand_edit(&mut store.lock(), false);
        }
        store.lock().others_running -= 1;
    })
}

/// Records, for each stream, what its worker does when it finds the stream drained: every event
/// before the server's position now is applied. Only where nothing is in flight.
pub async fn record_drained(store: &SimStore, streams: &[String]) -> StoreResult<()> {
    let at = store.read_position().await?.lower;
    for stream in streams {
        let epoch = store.lock().checkpoint_view(stream).map_or(0, |c| c.epoch);
        let fence = Fence {
            stream: stream.clone(),
            epoch,
        };
        store.record_caught_up(&fence, at).await?;
    }
    Ok(())
}

/// A reconciler on the simulated clock, with the simulation's short wait for the worker.
pub fn sim_reconciler(store: &Arc<SimStore>, settings: ReconcileSettings) -> Reconciler<SimStore> {
    let settings = ReconcileSettings {
        catch_up: CATCH_UP,
        ..settings
    };
    Reconciler::with_clock(store.clone(), settings, store.clock())
}

/// One run of the real worker, from whatever the store holds, until it is stopped or crashed.
/// `adopt`: the worker took the lease with a new epoch and stamps the checkpoint with it first
/// (a worker that does not adopt is the previous holder, still running during a takeover);
/// `newest`: the newest epoch of the round (being fenced out by it is expected).
pub fn worker(
    store: Arc<SimStore>,
    settings: WorkerSettings,
    epoch: i64,
    adopt: bool,
    delay: usize,
    newest: i64,
    errors: Errors,
) -> Actor<'static> {
    Box::pin(async move {
        for _ in 0..delay {
            yield_now().await;
        }
        let stream = settings.stream.clone();
        store.lock().note(format!(
            "worker {stream} epoch {epoch} starts{}",
            if adopt { " (takeover)" } else { "" }
        ));
        let outcome = async {
            let fence = Fence {
                stream: stream.clone(),
                epoch,
            };
            if adopt {
                store
                    .adopt_checkpoint(&fence)
                    .await
                    .map_err(WorkerError::Store)?;
            }
            let (handle, shutdown) = store.for_worker();
            let w = Worker::new(
                Arc::new(handle),
                settings,
                Arc::new(WorkerStatus::default()),
            )
            .with_clock(store.clock());
            w.run(epoch, shutdown).await
        }
        .await;
        let verdict = match &outcome {
            Ok(()) => None,
            Err(WorkerError::Store(e) | WorkerError::Startup(e)) if injected(e) => None,
            Err(WorkerError::Store(StoreError::Fenced { .. })) if epoch < newest => None,
            Err(e) => Some(format!("worker {stream} epoch {epoch} stopped: {e}")),
        };
        {
            let mut s = store.lock();
            let line = match &outcome {
                Ok(()) => format!("worker {stream} epoch {epoch} stopped (shut down)"),
                Err(e) => format!("worker {stream} epoch {epoch} stopped: {e}"),
            };
            s.note(line);
            if matches!(outcome, Err(WorkerError::Store(StoreError::Fenced { .. }))) {
                s.stat("previous holder fenced out");
            }
            s.workers_running -= 1;
        }
        if let Some(v) = verdict {
            errors.borrow_mut().push(v);
        }
    })
}
