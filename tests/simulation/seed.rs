//! One seed: its set-up from the plan, its rounds, what happens between rounds, and its end (the
//! final reconcile and sweep).

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;

use counterd::budget::Budget;
use counterd::core::event::Token;
use counterd::reconcile::Reconciler;
use counterd::store::prelude::*;
use counterd::store::Position;
use counterd::worker::WorkerSettings;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::actors::{
    accounted, hand_edit, join_in_order, operator, reconciler, record_drained, requested_sweeps,
    worker, writer, Actor, Errors, Reported,
};
use crate::checks::check_when_caught_up;
use crate::plan::{Plan, Variant, TRANSACTION_SHARE};
use crate::runner::Summary;
use crate::sim_store::{Faults, Probe, SimStore, State};
use crate::START_CLOCK;

/// The simulation of one seed, past the set-up.
pub struct Sim {
    pub plan: Plan,
    pub store: Arc<SimStore>,
    /// The newest epoch of each stream.
    pub epochs: Vec<i64>,
    pub errors: Errors,
    /// The corrections every reconcile run reported, per post with sign (and those a failed
    /// run installed but could not report).
    pub reported: Reported,
}

impl Sim {
    pub fn stream_names(&self) -> Vec<String> {
        self.plan.streams().into_iter().map(|(s, _)| s).collect()
    }

    /// The first error an actor reported, or the first failure the probe or the drift bounds
    /// found.
    pub fn take_errors(&self) -> Result<(), String> {
        let errors = std::mem::take(&mut *self.errors.borrow_mut());
        if let Some(e) = errors.first() {
            return Err(e.clone());
        }
        let failures = std::mem::take(&mut self.store.lock().probe_failures);
        match failures.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// One round: writers, an operator editing counters, reconcile passes and the streams'
    /// workers running interleaved. With `quiesce`, only the workers, without faults, until
    /// they have caught up.
    pub async fn round(&mut self, quiesce: bool) -> Result<(), String> {
        let plan = self.plan.clone();
        let streams = plan.streams();
        let (writers, ops, runs, edits, modes, delay) = {
            let mut s = self.store.lock();
            if quiesce {
                s.faults = Faults::none();
                s.read_budget = None;
                (0, 0, 0, 0, vec![1; streams.len()], 0)
            } else {
                s.faults = Faults {
                    rate: if s.rng.random_bool(0.7) {
                        plan.fault_rate
                    } else {
                        0.0
                    },
                    transient_share: plan.transient_share,
                    yield_rate: plan.yield_rate,
                    budget: 4,
                };
                s.read_budget = s.rng.random_bool(0.4).then(|| s.rng.random_range(1..=6));
                let writers = s.rng.random_range(0..=3);
                let ops = s.rng.random_range(1..=12);
                // Reconcile passes race the writers and workers in most rounds.
                let runs = if s.rng.random_bool(0.85) {
                    s.rng.random_range(1..=3)
                } else {
                    0
                };
                let edits = if plan.hand_edits && s.rng.random_bool(0.3) {
                    s.rng.random_range(1..=2)
                } else {
                    0
                };
                // Per stream: no worker, one, or a takeover (two).
                let modes: Vec<i64> = streams
                    .iter()
                    .map(|_| match s.rng.random_range(0..10) {
                        0 => 0,
                        1 if plan.takeovers => 2,
                        _ => 1,
                    })
                    .collect();
                let delay = s.rng.random_range(0..6);
                (writers, ops, runs, edits, modes, delay)
            }
        };
        let mut actors: Vec<Actor<'static>> = Vec::new();
        for _ in 0..writers {
            actors.push(writer(self.store.clone(), ops));
        }
        if runs > 0 {
            actors.push(reconciler(
                self.store.clone(),
                &plan,
                runs,
                self.errors.clone(),
                self.reported.clone(),
            ));
        }
        if edits > 0 {
            actors.push(operator(self.store.clone(), edits));
        }
        // Every worker start acquires the lease, which raises the epoch, and adopts the
        // checkpoint with it; in a takeover the previous worker keeps running meanwhile.
        for (((stream, partition), mode), epoch) in
            streams.iter().zip(&modes).zip(self.epochs.iter_mut())
        {
            let settings = plan.worker_settings(stream, *partition);
            if *mode == 2 {
                // The previous holder runs in another process, with that process's own
                // budget: sharing this one would hold two reply reserves for one stream,
                // which no process ever does, and leave a worker waiting for room that only
                // a stop frees (a wait the real clock's operation timeout then ends).
                let previous = WorkerSettings {
                    budget: Budget::new(plan.budget.total()),
                    ..settings.clone()
                };
                actors.push(worker(
                    self.store.clone(),
                    previous,
                    *epoch,
                    false,
                    0,
                    *epoch + 1,
                    self.errors.clone(),
                ));
            }
            if *mode >= 1 {
                *epoch += 1;
                actors.push(worker(
                    self.store.clone(),
                    settings,
                    *epoch,
                    true,
                    if *mode == 2 { delay } else { 0 },
                    *epoch,
                    self.errors.clone(),
                ));
            }
        }
        {
            let mut s = self.store.lock();
            s.others_running = writers + usize::from(runs > 0) + usize::from(edits > 0);
            s.workers_running = modes.iter().sum::<i64>() as usize;
            let mut order: Vec<usize> = (0..actors.len()).collect();
            order.shuffle(&mut s.rng);
            let mut slots: Vec<Option<Actor<'static>>> = actors.into_iter().map(Some).collect();
            actors = order.iter().map(|i| slots[*i].take().unwrap()).collect();
            let line = format!(
                "round: {writers} writers x {ops}, {runs} reconciles, {edits} hand edits, workers {modes:?}, epochs {:?}",
                self.epochs
            );
            s.note(line);
        }
        join_in_order(actors).await;
        {
            let mut s = self.store.lock();
            s.shutdown.clear();
            s.faults = Faults::none();
            if s.others_running != 0 || s.workers_running != 0 {
                return Err("an actor did not finish".into());
            }
        }
        // Every worker has stopped: whatever they held of the memory budget is given back.
        if self.plan.budget.in_use() != 0 {
            return Err(format!(
                "{} bytes of the memory budget still held after every worker stopped",
                self.plan.budget.in_use()
            ));
        }
        self.take_errors()?;
        self.check_invariants()?;
        // The round boundary is a point to check too, when the workers caught up.
        let mut s = self.store.lock();
        if check_when_caught_up(&s, &self.stream_names(), plan.start_at())? {
            s.stat("round ended caught up");
        }
        Ok(())
    }

    /// Between rounds: an operator moves the checkpoint back, or edits or deletes a counter by
    /// hand, or the oplog window moves on; then time passes.
    pub async fn between_rounds(&mut self) -> Result<(), String> {
        let (replay, truncate) = {
            let mut s = self.store.lock();
            let replay = self.plan.replays && s.rng.random_bool(0.2);
            let truncate = self.plan.truncation && s.rng.random_bool(0.2);
            (replay, truncate)
        };
        if replay {
            let streams = self.plan.streams();
            let (stream, position) = {
                let mut s = self.store.lock();
                let stream = streams[s.rng.random_range(0..streams.len())].0.clone();
                let checkpoint = s.checkpoint_view(&stream).and_then(|c| c.token);
                let end = match &checkpoint {
                    Some(t) => s.oplog.partition_point(|e| e.token.as_str() <= t.as_str()),
                    None => 0,
                };
                let floor = s.oplog_floor.min(end);
                if end > floor {
                    let i = s.rng.random_range(floor..end);
                    let entry = s.oplog[i].clone();
                    let position = match s.rng.random_range(0..8) {
                        5 | 6 => Position::Time(entry.time),
                        7 if self.plan.start_at_zero => Position::Unset,
                        _ => Position::Token(Token(entry.token.clone())),
                    };
                    s.note(format!("operator: replay {stream} from {position:?}"));
                    s.stat("operator replay");
                    (stream, Some(position))
                } else {
                    (stream, None)
                }
            };
            if let Some(position) = position {
                self.store
                    .move_checkpoint(&stream, &position)
                    .await
                    .map_err(|e| format!("move_checkpoint failed: {e}"))?;
            }
        }
        let mut s = self.store.lock();
        if self.plan.hand_edits && s.rng.random_bool(0.3) {
            // No worker runs now: a counter may be deleted too.
            hand_edit(&mut s, true);
        }
        if truncate {
            let len = s.oplog.len();
            let floor = s.oplog_floor;
            if len > floor {
                let new_floor = s.rng.random_range(floor..=len);
                s.oplog_floor = new_floor;
                s.note(format!("oplog truncated below index {new_floor}"));
                s.stat("oplog truncated");
                // A real oplog loses only history older than now: the clock moves past the
                // truncated writes (a worker restarting "now" must not land inside them).
                s.clock += 1;
            }
        }
        let step = s.rng.random_range(0..=3 * self.plan.bucket_width);
        s.clock += step;
        Ok(())
    }

    pub fn caught_up(&self) -> bool {
        self.store
            .lock()
            .caught_up(&self.stream_names(), self.plan.start_at())
    }

    /// Records for every stream that its worker found it drained now, as a drained worker that
    /// keeps running does (the harness stopped them, caught up, and nothing writes any more).
    pub async fn drained_now(&self) -> Result<(), String> {
        record_drained(&self.store, &self.stream_names())
            .await
            .map_err(|e| format!("record the drained position: {e}"))
    }

    /// The end of a seed: a final reconcile once writes have stopped for longer than the settle
    /// time and every row's bucket (clock skew included), after the sweep a lost history
    /// requested; then a full sweep, which finds the drift no dirty mark points at.
    pub async fn finish(&mut self) -> Result<(), String> {
        let now = {
            let mut s = self.store.lock();
            // Rows are created at most 29 s ahead of the clock.
            s.clock += 30 + self.plan.settle + 2 * self.plan.bucket_width + 1;
            let now = s.clock;
            s.note(format!("final reconcile @{now}"));
            now
        };
        self.drained_now().await?;
        let reconcilers: Vec<(String, Vec<Reconciler<SimStore>>)> = self
            .plan
            .streams()
            .into_iter()
            .map(|(stream, partition)| {
                let settings = self.plan.reconcile_settings(&stream, partition, 1 << 20);
                (stream, self.plan.reconcilers(&self.store, settings))
            })
            .collect();
        let (store, reported, errors) = (&self.store, &self.reported, &self.errors);
        for (stream, definitions) in &reconcilers {
            let what = format!("final requested sweep of {stream}");
            accounted(
                store,
                reported,
                errors,
                what,
                requested_sweeps(definitions, now),
            )
            .await;
            let reconciler = &definitions[0];
            let waiting = store
                .lock()
                .checkpoint_view(stream)
                .filter(|c| c.sweep_requested);
            if let Some(c) = waiting {
                let watermark = reconciler.watermark(now).await.map_err(|e| e.to_string())?;
                return Err(format!(
                    "{stream}: the sweep requested after lost history never runs once writes stop: the watermark {watermark} (capped by the checkpoint's event time {:?}) stays below the gap's end {:?}",
                    c.token_time.map(|t| t.time),
                    c.gaps.last().map(|g| g.to.timestamp_millis() / 1000)
                ));
            }
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let what = format!("final reconcile of {stream} ({counter})");
                accounted(store, reported, errors, what, async {
                    reconciler.run_dirty(now).await.map(Some)
                })
                .await;
            }
        }
        self.take_errors()?;
        self.check_final_reconcile()?;
        self.store.lock().note(format!("final sweep @{now}"));
        for (stream, definitions) in &reconcilers {
            for reconciler in definitions {
                let counter = &reconciler.settings().counter_name;
                let what = format!("final sweep of {stream} ({counter})");
                accounted(store, reported, errors, what, async {
                    reconciler.sweep(now, |_| {}, None).await.map(Some)
                })
                .await;
            }
        }
        self.take_errors()?;
        self.check_final()
    }

    pub async fn run(&mut self) -> Result<Summary, String> {
        {
            // The application's history before counterd is deployed: the initial snapshot
            // counts it (or, without one, the stream from time 0 or the reconciler does).
            let mut s = self.store.lock();
            for _ in 0..self.plan.existing_writes {
                let what = s.write_random();
                let line = format!("write before deployment @{}: {what}", s.clock);
                s.note(line);
            }
        }
        if !self.plan.start_at_zero {
            // Starting "now": the first worker takes its position before anything is written.
            self.round(true).await?;
        }
        for _ in 0..self.plan.rounds {
            self.round(false).await?;
            self.between_rounds().await?;
        }
        // Quiesce: no more writes or faults; the worker catches up.
        for _ in 0..4 {
            if self.caught_up() {
                break;
            }
            self.round(true).await?;
        }
        if !self.caught_up() {
            let s = self.store.lock();
            let checkpoints: Vec<_> = self
                .plan
                .streams()
                .iter()
                .map(|(stream, _)| s.checkpoint_view(stream))
                .collect();
            return Err(format!(
                "the workers did not catch up: checkpoints {checkpoints:?}, last event {:?}",
                s.last_token()
            ));
        }
        self.check_caught_up()?;
        self.check_invariants()?;
        self.finish().await?;
        let s = self.store.lock();
        Ok(Summary {
            stats: s.stats.clone(),
            events: s.oplog.len(),
        })
    }
}

/// Sets a seed up: its plan, and a store configured for it.
pub fn set_up(seed: u64, variant: Variant, trace: bool) -> Sim {
    let plan = Plan::new(seed, variant);
    let store = SimStore::new(seed, plan.bucket_width, plan.posts, START_CLOCK);
    {
        let mut s = store.lock();
        s.broken = variant.broken;
        s.hot = variant.hot;
        if variant.transactions {
            s.transactions = TRANSACTION_SHARE;
        }
        s.pre_images_enabled = plan.pre_images;
        s.update_descriptions = plan.update_descriptions;
        s.post_batch_tokens = plan.post_batch_tokens;
        s.unset_post_ids = plan.unset_post_ids;
        s.pre_image_expiry = if plan.pre_image_expiry { 0.1 } else { 0.0 };
        s.read_max = plan.read_max;
        s.drained_answers = plan.drained_answers;
        s.trace_all = trace;
        s.drift_bounds = true;
        let streams: Vec<String> = plan.streams().into_iter().map(|(s, _)| s).collect();
        let start_at = plan.start_at();
        s.probe = Some(Probe {
            rate: plan.probe_rate,
            rng: StdRng::seed_from_u64(seed ^ 0x9B0B_E5EE_D000),
            check: Box::new(move |s: &State| check_when_caught_up(s, &streams, start_at)),
        });
        s.stat(format!("seeds with {} streams", plan.partitions));
        s.budget = Some(plan.budget.clone());
        s.snapshot_chunk_rows = plan.snapshot_chunk_rows;
        if plan.definitions {
            s.memory.define_counters(plan.extra());
            s.stat("seeds with several counter definitions");
        }
        if plan.sums {
            s.stat("seeds with sums");
        }
    }
    Sim {
        store: Arc::new(store),
        epochs: vec![0; plan.partitions as usize],
        plan,
        errors: Rc::new(RefCell::new(Vec::new())),
        reported: Rc::default(),
    }
}

/// Runs a seed on a single-threaded runtime; a panic in `src` is a failure of the seed.
pub fn execute(sim: &mut Sim) -> Result<Summary, String> {
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(sim.run())
    }));
    match result {
        Ok(outcome) => outcome,
        Err(panic) => Err(format!(
            "panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}
