//! The sweeps over every post: the windowed full sweep (recovery and on demand) and the slow
//! background sweep, plus the ledger rebuild a sweep after lost history needs.

use super::run::Run;
use super::{Outcome, Reconciler, RunReport};
use crate::core::fold::RunKind;
use crate::core::key::GroupValue;
use crate::core::time::secs;
use crate::recount::FoundBehind;
use crate::shutdown::Shutdown;
use crate::store::{Store, StoreResult};
use crate::telemetry as m;

impl<S: Store + ?Sized> Reconciler<S> {
    /// Recounts every post of this definition, window by window over `post_id`, paced;
    /// `progress` hears the number of posts done after each window.
    ///
    /// A stream's sweep request is the whole stream's, every definition's: it is left as it
    /// is here, and [`sweep_all`] and [`run_requested_sweeps`] clear it once every definition
    /// of the stream has swept.
    pub async fn sweep(
        &self,
        now_secs: i64,
        progress: impl FnMut(u64) + Send,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<RunReport> {
        let swept = self.sweep_posts(now_secs, None, progress, shutdown).await;
        swept.map(|(report, _)| report)
    }

    /// Clears the stream's sweep request.
    async fn clear_sweep_request(&self) -> StoreResult<()> {
        self.store
            .set_sweep_requested(&self.settings.stream, false)
            .await
    }

    /// The sweep behind both. After lost history (`after_gap`: the stream's ledger generation)
    /// it folds each post above every row and bucket it has (a full recount), because no
    /// bucket can be trusted: a row dated above the watermark may have had its events in the
    /// gap. It also rebuilds the ledger entries of each post's rows first: an entry from before
    /// the gap may show a row where it no longer is. Also says whether the sweep did what a
    /// request asks (it was not interrupted and, after a gap, recounted every post), so the
    /// request may be cleared.
    async fn sweep_posts(
        &self,
        now_secs: i64,
        after_gap: Option<u64>,
        mut progress: impl FnMut(u64) + Send,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<(RunReport, bool)> {
        let watermark = self.watermark(now_secs).await?;
        let kind = match after_gap {
            Some(_) => RunKind::GapSweep,
            None => RunKind::Sweep,
        };
        let mut run = Run::new(&self.settings, kind, watermark);
        // A full recount of each post after lost history.
        let full = after_gap.is_some();
        let rebuild = self.rebuild_generation(after_gap).await?;
        let mut after: Option<GroupValue> = None;
        // Every post rebuilt (where the pass does) and recounted so far.
        let mut complete = true;
        let passed = async {
            loop {
                if shutdown.as_ref().is_some_and(Shutdown::requested) {
                    return Ok(false); // interrupted: a requested sweep stays requested
                }
                let window = self
                    .store
                    .posts_after(after.as_ref(), self.settings.sweep_window)
                    .await?;
                let Some(last) = window.last().cloned() else {
                    break;
                };
                let owned = self.owned(&window);
                for group in owned.chunks(self.settings.group_size.max(1)) {
                    if let Some(generation) = rebuild {
                        complete &= self.rebuild_ledger(group, generation).await?;
                    }
                    let outcomes = self.reconcile_posts(group, watermark, full, &mut run).await?;
                    complete &= outcomes.iter().all(|o| *o != Outcome::NotNow);
                }
                metrics::counter!(m::SWEEP_POSTS, "stream" => self.settings.stream.clone(), "counter" => self.settings.counter_name.clone())
                    .increment(window.len() as u64);
                progress(run.summary.posts);
                after = Some(last);
            }
            if full && !complete {
                tracing::warn!(
                    stream = %self.settings.stream,
                    counter = %self.settings.counter_name,
                    in_flight = run.summary.in_flight,
                    "the sweep after lost history could not recount every post consistently; it runs again"
                );
                return Ok(false);
            }
            Ok(true)
        }
        .await;
        let done = matches!(passed, Ok(true));
        Ok((self.conclude(run, passed.map(|_| ())).await?, done))
    }

    /// The posts of `window` this reconciler's partition owns.
    fn owned(&self, window: &[GroupValue]) -> Vec<GroupValue> {
        window
            .iter()
            .filter(|p| self.settings.partition.is_none_or(|part| part.owns(p)))
            .cloned()
            .collect()
    }

    /// The ledger generation a sweep rebuilds the entries of the rows it passes over in (`None`:
    /// none rebuilt). Every sweep rebuilds them: after a gap they are stale, and a stream that
    /// never had them (started on existing rows without a snapshot) needs them to attribute a
    /// later delete or move of an old comment. Not while the initial snapshot runs: an entry
    /// written then would hide its row from it.
    async fn rebuild_generation(&self, after_gap: Option<u64>) -> StoreResult<Option<u64>> {
        let checkpoint = self.store.load_checkpoint(&self.settings.stream).await?;
        Ok(match (&checkpoint, after_gap) {
            (Some(c), _) if c.snapshot_running() => None,
            (_, Some(generation)) => Some(generation),
            (c, None) => Some(c.as_ref().map_or(0, |c| c.ledger_generation())),
        })
    }

    /// Runs the full sweep that a lost history requested, once the watermark has passed the end
    /// of the recorded gap: rows created in the gap sit above an earlier watermark, where a fold
    /// keeps buckets (empty for them, their events were never seen) and would not count them.
    /// Returns `None` when no sweep is requested or it must wait for the settle time.
    ///
    /// This definition's sweep only; like [`Reconciler::sweep`], it leaves the request as it
    /// is. [`run_requested_sweeps`] runs every definition's of a stream and clears it.
    pub async fn run_requested_sweep(
        &self,
        now_secs: i64,
        shutdown: Option<Shutdown>,
    ) -> StoreResult<Option<RunReport>> {
        let swept = self
            .requested_sweep(now_secs, shutdown, &mut FoundBehind::new())
            .await?;
        Ok(swept.map(|(report, _)| report))
    }

    /// The requested sweep of this definition, if one is due, and whether it did what the
    /// request asks (see [`Reconciler::sweep_posts`]); the request is left as it is.
    async fn requested_sweep(
        &self,
        now_secs: i64,
        shutdown: Option<Shutdown>,
        found_behind: &mut FoundBehind,
    ) -> StoreResult<Option<(RunReport, bool)>> {
        let checkpoint = self.store.load_checkpoint(&self.settings.stream).await?;
        let Some(checkpoint) = checkpoint.filter(|c| c.sweep_requested) else {
            return Ok(None);
        };
        let gap_end = checkpoint.gaps.iter().map(|g| secs(g.to)).max();
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
        if self
            .deferred_while_catching_up("the requested full sweep", found_behind)
            .await?
        {
            return Ok(None);
        }
        tracing::warn!(
            stream = %self.settings.stream,
            counter = %self.settings.counter_name,
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

    /// Whether `what` (a sweep, or a step of one) waits for a later pass because the worker is
    /// catching up: it has not applied what these counts would see, so every one would be in
    /// flight, and a sweep after lost history would only run again. `found_behind`: the
    /// pass's streams found behind already ([`FoundBehind`]).
    async fn deferred_while_catching_up(
        &self,
        what: &str,
        found_behind: &mut FoundBehind,
    ) -> StoreResult<bool> {
        let behind = self.recounter.worker_behind(found_behind).await?;
        if behind {
            tracing::debug!(stream = %self.settings.stream, counter = %self.settings.counter_name,
                "the worker is catching up: {what} waits for a later pass");
        }
        Ok(behind)
    }

    /// One step of the slow background sweep: the next posts of its current pass over every
    /// post, as many as keep a pass near `background_pass` long, or a whole window when the
    /// pass has `spare` time (see [`super::schedule`]). Resumes where the last step (of any
    /// process) stopped. Finds drift that no event points at: a hand-edited counter of a post
    /// nobody comments on, a deleted counter.
    pub async fn background_step(
        &self,
        now_secs: i64,
        spare: bool,
    ) -> StoreResult<Option<RunReport>> {
        self.background_step_in_pass(now_secs, spare, &mut FoundBehind::new())
            .await
    }

    /// [`Reconciler::background_step`] in a pass that found the streams of `found_behind`
    /// behind.
    pub(super) async fn background_step_in_pass(
        &self,
        now_secs: i64,
        spare: bool,
        found_behind: &mut FoundBehind,
    ) -> StoreResult<Option<RunReport>> {
        let Some(pass) = self.settings.background_pass else {
            return Ok(None);
        };
        // The step is taken in a later pass (the cursor stays).
        if self
            .deferred_while_catching_up("the background sweep's step", found_behind)
            .await?
        {
            return Ok(None);
        }
        let key = self.settings.sweep_key();
        let stored = self.store.load_sweep_cursor(&key).await?;
        let mut cursor = stored.unwrap_or_default();
        let size = super::schedule::background_step_size(
            cursor.last_pass_posts.max(cursor.posts_done),
            pass,
            self.settings.interval,
            self.settings.sweep_window,
            spare,
        );
        let watermark = self.watermark(now_secs).await?;
        let window = self.store.posts_after(cursor.after.as_ref(), size).await?;
        let mut run = Run::new(&self.settings, RunKind::Background, watermark);
        cursor.pass_started.get_or_insert_with(|| self.clock.now());
        self.reconcile_posts(&self.owned(&window), watermark, false, &mut run)
            .await?;
        cursor.posts_done += window.len() as u64;
        match window.last() {
            Some(last) if window.len() == size => cursor.after = Some(last.clone()),
            _ => {
                // The pass is complete: start the next one from the first post.
                if cursor.posts_done > 0 {
                    tracing::info!(
                        stream = %self.settings.stream,
                        counter = %self.settings.counter_name,
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
        metrics::gauge!(m::BACKGROUND_SWEEP_POSTS_DONE, "stream" => self.settings.stream.clone(), "counter" => self.settings.counter_name.clone())
            .set(cursor.posts_done as f64);
        metrics::gauge!(m::BACKGROUND_SWEEP_LAST_PASS, "stream" => self.settings.stream.clone(), "counter" => self.settings.counter_name.clone())
            .set(cursor.last_pass_posts as f64);
        self.store.save_sweep_cursor(&key, &cursor).await?;
        Ok(Some(self.finish(run).await?))
    }

    /// After lost history: rebuilds the ledger entries of these posts' rows, so that a later
    /// event of a row that changed in the gap is classified against the row as it is, not
    /// against an entry from before the gap (a row moved in the gap would be taken off its old
    /// post and never off its new one). The rows are read, then every event before the read
    /// must be applied (false if the worker did not catch up in time: the sweep runs again);
    /// only entries from before the gap are replaced, and the worker's later writes win.
    ///
    /// The rows held at once are bounded by the recount share of the memory budget (the
    /// rebuild runs before the group's recounts, never beside them): whenever the rows read so
    /// far fill it, they are rebuilt (read, wait, write) before the next post is read. One
    /// post with more rows than the share is still read whole.
    async fn rebuild_ledger(&self, posts: &[GroupValue], generation: u64) -> StoreResult<bool> {
        let at_most = crate::core::cost::rows_for_ids(self.settings.recount_rows);
        let mut rows = Vec::new();
        for post in posts {
            rows.extend(self.store.rows_of_post(post).await?);
            if rows.len() >= at_most
                && !self
                    .rebuild_rows(std::mem::take(&mut rows), generation)
                    .await?
            {
                return Ok(false);
            }
        }
        Ok(rows.is_empty() || self.rebuild_rows(rows, generation).await?)
    }

    /// One part of [`Reconciler::rebuild_ledger`]: rows just read, written as ledger entries
    /// once every event before the read is applied.
    async fn rebuild_rows(
        &self,
        rows: Vec<(crate::core::event::CommentId, crate::core::event::Row)>,
        generation: u64,
    ) -> StoreResult<bool> {
        let read_at = self.store.read_position().await?.upper;
        if !self.recounter.wait_until_applied(read_at).await? {
            return Ok(false);
        }
        // Decided before the wait on a stream whose worker had not started: it may have begun
        // the initial snapshot meanwhile, and an entry written now would hide its row from it.
        let checkpoint = self.store.load_checkpoint(&self.settings.stream).await?;
        if checkpoint.is_some_and(|c| c.snapshot_running()) {
            return Ok(false);
        }
        self.store
            .rebuild_ledger(&self.settings.stream, generation, &rows)
            .await?;
        Ok(true)
    }
}

/// A full sweep of every definition of a stream (`reconcilers`, one per definition, the
/// default first), one after another: what `counterd reconcile --sweep` runs. The stream's sweep
/// request is cleared only once every definition's sweep completed, so a request after lost
/// history is never cleared while a definition still has counters from before the gap.
pub async fn sweep_all<S: Store + ?Sized>(
    reconcilers: &[Reconciler<S>],
    now_secs: i64,
    mut progress: impl FnMut(&str, u64) + Send,
    shutdown: Option<Shutdown>,
) -> StoreResult<Vec<RunReport>> {
    let mut reports = Vec::new();
    let mut passed = true;
    for reconciler in reconcilers {
        let name = reconciler.settings.counter_name.clone();
        let (report, done) = reconciler
            .sweep_posts(now_secs, None, |n| progress(&name, n), shutdown.clone())
            .await?;
        reports.push(report);
        passed &= done;
    }
    if let (Some(first), true) = (reconcilers.first(), passed) {
        first.clear_sweep_request().await?;
    }
    Ok(reports)
}

/// Adopts counter definitions added to a running deployment: a definition beyond the default
/// whose counters no initial snapshot counted gets one full sweep of its own (paced like any
/// sweep), after which it is kept like the others. Without it, a definition added later would
/// show no counter for a group until a change dirtied it, or the background sweep came by.
///
/// Whether a definition is adopted is a marker beside the background sweep's cursors
/// (`<stream>#<name>#adopted`, one completed pass). A definition needs no sweep when the stream's
/// initial snapshot began after `since` (when this process started working on the stream): that
/// snapshot counts every definition this process has. Otherwise the snapshot predates it (or
/// there was none) and it is swept, once the watermark has passed `since` (a fold trusts the
/// stream above its watermark, and events applied before `since` did not count for the
/// definition). While the stream has not started or its snapshot runs, adoption waits. A
/// deployment that had definitions before markers existed sweeps each of them once; a sweep cut
/// short (shutdown, restart) starts again. `found_behind`: the pass's streams found behind
/// ([`FoundBehind`]).
pub async fn adopt_new_definitions<S: Store + ?Sized>(
    reconcilers: &[Reconciler<S>],
    now_secs: i64,
    since: bson::DateTime,
    shutdown: Option<Shutdown>,
    found_behind: &mut FoundBehind,
) -> StoreResult<Vec<RunReport>> {
    let mut reports = Vec::new();
    for reconciler in reconcilers {
        // Definition 0 is counted from the stream's start, as before definitions existed
        // (and before markers did): it is never adopted.
        if reconciler.settings.stored_name().is_none() {
            continue;
        }
        let marker = format!("{}#adopted", reconciler.settings.sweep_key());
        let store = &reconciler.store;
        let adopted = store.load_sweep_cursor(&marker).await?;
        if adopted.is_some_and(|m| m.passes > 0) {
            continue;
        }
        let stream = &reconciler.settings.stream;
        let checkpoint = store.load_checkpoint(stream).await?;
        let Some(checkpoint) = checkpoint.filter(|c| !c.untouched() && !c.snapshot_running())
        else {
            continue;
        };
        let counted_by_snapshot = checkpoint
            .snapshot
            .as_ref()
            .is_some_and(|s| s.started_at >= since);
        if !counted_by_snapshot {
            // Events applied before this process took the stream did not count for the new
            // definition, and a fold trusts the stream for rows above its watermark: the sweep
            // waits until the watermark passes `since`, so every such row is recounted.
            if reconciler.watermark(now_secs).await? <= secs(since) {
                continue;
            }
            // The stream's worker is catching up: every definition's adoption waits.
            if reconciler
                .deferred_while_catching_up("adopting a new definition", found_behind)
                .await?
            {
                break;
            }
            tracing::info!(stream = %stream, counter = %reconciler.settings.counter_name,
                "adopting a counter definition the initial snapshot did not count: one full sweep");
            let (report, passed) = reconciler
                .sweep_posts(now_secs, None, |_| {}, shutdown.clone())
                .await?;
            reports.push(report);
            if !passed {
                continue;
            }
        }
        let done = crate::store::SweepCursor {
            passes: 1,
            ..Default::default()
        };
        store.save_sweep_cursor(&marker, &done).await?;
    }
    Ok(reports)
}

/// Runs the sweep a stream's lost history requested for every definition (each over its own
/// counters, one after the other) and clears the request only once every one of them did what
/// it asks: a request is the whole stream's, and a definition that could not recount every
/// group consistently runs again with the others.
pub async fn run_requested_sweeps<S: Store + ?Sized>(
    reconcilers: &[Reconciler<S>],
    now_secs: i64,
    shutdown: Option<Shutdown>,
) -> StoreResult<Vec<RunReport>> {
    requested_sweeps_in_pass(reconcilers, now_secs, shutdown, &mut FoundBehind::new()).await
}

/// [`run_requested_sweeps`] in a pass that found the streams of `found_behind` behind.
pub(super) async fn requested_sweeps_in_pass<S: Store + ?Sized>(
    reconcilers: &[Reconciler<S>],
    now_secs: i64,
    shutdown: Option<Shutdown>,
    found_behind: &mut FoundBehind,
) -> StoreResult<Vec<RunReport>> {
    let mut reports = Vec::new();
    let mut every_one_swept = !reconcilers.is_empty();
    for reconciler in reconcilers {
        match reconciler
            .requested_sweep(now_secs, shutdown.clone(), found_behind)
            .await?
        {
            Some((report, done)) => {
                reports.push(report);
                every_one_swept &= done;
            }
            // No request, or it waits (for the watermark to pass the gap, for the worker to
            // catch up): the stream's, so the others would wait too. A definition that did not
            // sweep keeps the request, even if one before it did.
            None => {
                every_one_swept = false;
                break;
            }
        }
    }
    if let (Some(first), true) = (reconcilers.first(), every_one_swept) {
        first.clear_sweep_request().await?;
    }
    Ok(reports)
}
