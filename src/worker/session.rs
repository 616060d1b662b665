//! One stream session: open the stream at the checkpoint, then read, batch and apply until
//! shutdown or error; while behind, the next batch is read (and its ledger entries fetched)
//! while the current one is written.
//!
//! Every read is charged to the memory budget (`crate::budget`) before its events are held: a
//! read made while this session holds no events waits for room; the read ahead, a read that
//! tops a batch up and a snapshot chunk take what is free and are cut to it. A batch's share
//! is given back once it is written; the open stream holds a server reply's reserve.

use std::collections::VecDeque;

use bson::{DateTime, Timestamp};

use super::apply::{Batch, Carrying, Prefetched};
use super::{SessionError, Worker};
use crate::budget::Grant;
use crate::core::cost::{self, ReadLimit};
use crate::core::event::{ChangeEvent, Token};
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::{
    Checkpoint, EventSource, Fence, RawBatch, Store, StoreError, StreamOptions, StreamStart,
};
use crate::telemetry as m;

/// Idle reads between two records of the drained position while nothing is applied (with the
/// default idle interval, about once a second): the reconciler's row-level recount waits for
/// a drained position after its read.
const IDLE_READS_PER_DRAINED_RECORD: u32 = 10;

/// One open session's state: the worker's view of the checkpoint, the open stream, events read
/// but not yet applied, and the drained-position throttle.
struct Session {
    /// The stream's checkpoint as this worker last wrote or read it.
    checkpoint: Checkpoint,
    source: Box<dyn EventSource>,
    events: VecDeque<ChangeEvent>,
    /// What each of `events` is charged against the memory budget, in their order.
    costs: VecDeque<usize>,
    /// The budget held for `events` (the sum of `costs`).
    held: Grant,
    /// The last read returned nothing: the next read is preceded by a position reading, so
    /// that an empty answer proves every event before it applied.
    idle: bool,
    /// A batch was applied since the drained position was last recorded.
    applied_since_drained: bool,
    /// Empty reads since the drained position was last recorded.
    idle_reads: u32,
    /// Resumed after a token whose event had this cluster time: the first event read may not
    /// be older (checked once, then `None`). Catches a server that resumes "after" a token it
    /// never issued, where it reports no deployment identity.
    resumed_after: Option<Timestamp>,
    /// Events the next batch may hold (see [`next_batch_limit`]).
    batch_limit: usize,
    /// The last read came back full: the worker is behind, and reads ahead while it writes.
    behind: bool,
    /// The ledger entries of the events read ahead, fetched while the batch before them was
    /// written (see [`Prefetched`]).
    prefetched: Option<Prefetched>,
    /// Counters carried across batches while behind (see [`crate::core::carry`]).
    carrying: Carrying,
    /// When the next chunk of a running initial snapshot is due.
    next_chunk_at: DateTime,
}

/// How long a stop waits for the carried counters to be written.
const STOP_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// How many `max_batch_wait`s a read ahead (made while the worker is behind, during a batch's
/// writes) may gather events for.
const READ_AHEAD_WAITS: u32 = 5;

/// The batch limit after a read that asked for `asked` events and got `got`: a full read means
/// the worker is behind, so the next batch may be twice as large (up to `max`); a read that
/// came back less than half full means it has caught up, so it halves (down to `min`).
pub fn next_batch_limit(current: usize, asked: usize, got: usize, min: usize, max: usize) -> usize {
    let max = max.max(min);
    let next = if asked > 0 && got >= asked {
        current.saturating_mul(2)
    } else if got < asked / 2 {
        current / 2
    } else {
        current
    };
    next.clamp(min, max)
}

impl Session {
    /// Nothing read yet from `source`, opened at `checkpoint`'s position; a snapshot chunk is
    /// due `now`.
    fn new(
        settings: &super::WorkerSettings,
        checkpoint: Checkpoint,
        source: Box<dyn EventSource>,
        now: DateTime,
    ) -> Session {
        Session {
            events: VecDeque::new(),
            costs: VecDeque::new(),
            held: settings.budget.none(),
            // Not idle until a read comes back empty: an empty answer proves the stream drained
            // only after an empty one before it (see `Session::read`). The first read of a
            // stream just opened may answer nothing while events wait (the fake test server
            // did, loaded, after a reopen): trusted, it recorded "everything before now is
            // applied" in front of a whole backlog, and the reconciler counted it all in flight.
            idle: false,
            applied_since_drained: true,
            idle_reads: 0,
            resumed_after: checkpoint.token.as_ref().and(checkpoint.token_time),
            batch_limit: settings.batch_size,
            behind: false,
            prefetched: None,
            carrying: Carrying::new(&settings.budget),
            next_chunk_at: now,
            checkpoint,
            source,
        }
    }

    /// Takes the next batch (see [`take_batch`]), with its share of the budget, held until it
    /// is written, and the ledger entries read ahead for it.
    fn take_batch(&mut self) -> Taken {
        let events = take_batch(&mut self.events, self.checkpoint.high_water.as_ref());
        let batch_bytes: usize = self.costs.drain(..events.len()).sum();
        let grant = self.held.split(batch_bytes);
        let prefetched = self.prefetched.take();
        Taken {
            batch: Batch { events, prefetched },
            grant,
        }
    }
}

/// A batch taken from what was read, with its share of the memory budget.
struct Taken {
    batch: Batch,
    /// Held until the batch is written.
    grant: Grant,
}

/// Whether a stage that a stop may cut short went on, with what it found, or was stopped.
enum Flow<T> {
    Go(T),
    Stopped,
}

impl<S: Store + ?Sized> Worker<S> {
    /// One stream session: open from the checkpoint and apply batches until shutdown or error.
    ///
    /// The stages: [`Worker::resume`] (what a previous run left), [`Worker::open`], then per
    /// turn a snapshot chunk where one is due ([`Worker::snapshot_chunk`]) and one batch read
    /// and applied ([`Worker::step`], within the operation timeout).
    pub(super) async fn session(
        &self,
        fence: &Fence,
        shutdown: &Shutdown,
        backoff: &mut backon::ExponentialBackoff,
    ) -> Result<(), SessionError> {
        let (checkpoint, configured_start) = self.resume(fence).await?;
        let Some(_reply) = self.reserve_reply(shutdown).await else {
            return Ok(());
        };
        let source = self.open(fence, &checkpoint, configured_start).await?;
        let mut session = Session::new(&self.settings, checkpoint, source, self.clock.now());
        loop {
            if shutdown.requested() {
                self.stop(fence, &mut session).await;
                return Ok(());
            }
            let chunk = self.snapshot_chunk(fence, &mut session, shutdown);
            if let Flow::Stopped = chunk.await? {
                return Ok(());
            }
            let step = self.timed_step(fence, &mut session, shutdown);
            let idle = match step.await? {
                Flow::Go(idle) => idle,
                Flow::Stopped => return Ok(()),
            };
            *backoff = self.backoff();
            if idle
                && sleep_or_shutdown(self.clock.as_ref(), self.settings.idle_interval, shutdown)
                    .await
            {
                return Ok(());
            }
        }
    }

    /// What a previous run left: the checkpoint (a new one if there is none), its batch in
    /// flight re-applied, its deployment checked, the initial snapshot begun (and a chunk left
    /// in flight finished), and "now" pinned where nothing says where to start. Returns the
    /// checkpoint and the configured start, if it still applies.
    async fn resume(&self, fence: &Fence) -> Result<(Checkpoint, Option<Timestamp>), SessionError> {
        let mut checkpoint = self
            .store
            .load_checkpoint(&fence.stream)
            .await?
            .unwrap_or_else(|| Checkpoint {
                stream: fence.stream.clone(),
                epoch: fence.epoch,
                ..Checkpoint::default()
            });
        if let Some(batch) = checkpoint.pending.clone() {
            tracing::info!(stream = %fence.stream, end = %batch.end, posts = batch.counters.len(), "re-applying the batch a previous run left in flight");
            self.reapply(fence, &mut checkpoint, &batch).await?;
        }
        self.check_deployment(fence, &mut checkpoint).await?;
        // A configured start applies once: after a history gap it is lost too, so "now" then.
        let configured_start = self
            .settings
            .start_at
            .filter(|_| checkpoint.gaps.is_empty());
        // A stream that never applied anything first snapshots the rows that exist; a chunk a
        // previous run left in flight is finished before the stream is read.
        let snapshotter = self.snapshotter(fence);
        snapshotter
            .begin_if_new(&mut checkpoint, configured_start)
            .await?;
        if checkpoint
            .snapshot
            .as_ref()
            .is_some_and(|s| s.pending.is_some())
        {
            snapshotter.step(&mut checkpoint).await?;
        }
        if checkpoint.token.is_none()
            && checkpoint.start_time.is_none()
            && configured_start.is_none()
        {
            // "Now", pinned: whoever resumes this stream later starts here, not at its own now.
            let now = crate::core::time::cluster_second(self.clock.now());
            self.store.record_start(fence, now).await?;
            checkpoint.start_time = Some(now);
        }
        Ok((checkpoint, configured_start))
    }

    /// An open stream holds a server reply's worth of the budget (see `REPLY_RESERVE`).
    /// `None`: stopped while waiting for it.
    async fn reserve_reply(&self, shutdown: &Shutdown) -> Option<Grant> {
        tokio::select! {
            biased;
            grant = self.settings.budget.take_at_least(cost::REPLY_RESERVE, cost::REPLY_RESERVE) => Some(grant),
            _ = shutdown.wait() => None,
        }
    }

    /// Opens the stream where `checkpoint` (or the configured start) says, and reports the
    /// position a restart would resume from.
    async fn open(
        &self,
        fence: &Fence,
        checkpoint: &Checkpoint,
        configured_start: Option<Timestamp>,
    ) -> Result<Box<dyn EventSource>, SessionError> {
        let start = stream_start(checkpoint, configured_start);
        let source = self
            .store
            .open_stream(StreamOptions {
                start,
                pre_images: self.settings.pre_images,
                pipeline: self.settings.pipeline.clone(),
                max_await: self.settings.max_await,
            })
            .await?;
        self.status.stream_opened(self.clock.now());
        // The position a restart would resume from, known from the start (not only after the
        // first checkpoint written by this process).
        let resumes_from = crate::recount::applied_before(checkpoint)
            .or(checkpoint.start_time)
            .or(configured_start);
        self.report_checkpoint(&fence.stream, resumes_from);
        if let Some(t) = resumes_from {
            self.status.caught_up_to(t.time as i64);
        }
        let or_none = |t: &Option<Token>| t.as_ref().map_or("none".into(), Token::to_string);
        tracing::info!(stream = %fence.stream, token = %or_none(&checkpoint.token), high_water = %or_none(&checkpoint.high_water), "change stream open");
        Ok(source)
    }

    /// One chunk of the initial snapshot between two batches, where one is due; the next one
    /// is due after a pause for the rows this one read.
    async fn snapshot_chunk(
        &self,
        fence: &Fence,
        session: &mut Session,
        shutdown: &Shutdown,
    ) -> Result<Flow<()>, SessionError> {
        let checkpoint = &mut session.checkpoint;
        if !checkpoint.snapshot_running() || self.clock.now() < session.next_chunk_at {
            return Ok(Flow::Go(()));
        }
        // One chunk between two batches, at the configured rate, of as many rows as the
        // memory budget has room for (waiting for room only while this worker holds
        // no events: see `crate::budget`). Carried counters are written first: the
        // chunk's counts are added beside the stream's (see `crate::snapshot`).
        self.flush(fence, checkpoint, &mut session.carrying).await?;
        let want = self.settings.snapshot.chunk_rows * cost::ROW_COST;
        let rows = tokio::select! {
            biased;
            grant = self.settings.budget.take_for(&session.held, cost::ROW_COST, want) => grant,
            _ = shutdown.wait() => return Ok(Flow::Stopped),
        };
        let max_rows = rows.bytes() / cost::ROW_COST;
        let snapshotter = self.snapshotter(fence);
        let chunk = tokio::time::timeout(self.settings.operation_timeout, async {
            if max_rows == 0 {
                return Ok(crate::snapshot::Step::Idle);
            }
            snapshotter.step_within(checkpoint, max_rows).await
        });
        let step = tokio::select! {
            biased;
            result = chunk => result.map_err(|_| StoreError::Transient {
                op: "read and apply a snapshot chunk",
                message: format!("no answer within {:?} (operation_timeout)", self.settings.operation_timeout),
            })??,
            _ = shutdown.wait() => return Ok(Flow::Stopped),
        };
        if let crate::snapshot::Step::Chunk { rows } = step {
            let pause = self.settings.snapshot.pause_after(rows);
            session.next_chunk_at = crate::core::time::later(self.clock.now(), pause);
        }
        Ok(Flow::Go(()))
    }

    /// [`Worker::step`] within the operation timeout, or cut short by a stop. Returns whether
    /// the stream was idle.
    async fn timed_step(
        &self,
        fence: &Fence,
        session: &mut Session,
        shutdown: &Shutdown,
    ) -> Result<Flow<bool>, SessionError> {
        let step = tokio::time::timeout(self.settings.operation_timeout, self.step(fence, session));
        // `biased`: the branches are polled in this order, never in a random one, so a
        // stop requested while a step runs ends it at the same point every time (the
        // simulation replays a seed exactly).
        let idle = tokio::select! {
            biased;
            result = step => result.map_err(|_| StoreError::Transient {
                op: "read and apply a batch",
                message: format!("no answer within {:?} (operation_timeout); is the server paused or unreachable?", self.settings.operation_timeout),
            })??,
            // Abandoning a batch mid-way is safe: the checkpoint has not moved, and a
            // recorded intent is re-applied exactly, as planned, by the next session.
            // What is carried is still written when the batches it holds are settled.
            _ = shutdown.wait() => {
                self.stop(fence, session).await;
                return Ok(Flow::Stopped);
            }
        };
        Ok(Flow::Go(idle))
    }

    /// A stop: what is carried is written first, so that a stopped worker's counters show
    /// every batch it applied, if every carried batch's own writes are settled (a stop that
    /// abandoned a batch mid-way leaves it, as planned, to whoever resumes the stream), and
    /// within [`STOP_FLUSH`] (a stop is not held up by a slow server: the intent holds the
    /// carry, and the next start writes it).
    async fn stop(&self, fence: &Fence, session: &mut Session) {
        if !session.carrying.settled {
            return;
        }
        let limit = STOP_FLUSH.min(self.settings.operation_timeout);
        let flush = self.flush(fence, &mut session.checkpoint, &mut session.carrying);
        let outcome = tokio::time::timeout(limit, flush).await;
        if let Err(error) = outcome.unwrap_or_else(|_| {
            Err(StoreError::Transient {
                op: "write the carried counters",
                message: format!("no answer within {limit:?}"),
            })
        }) {
            tracing::warn!(stream = %fence.stream, %error, "stopping without writing the carried counters; the next start writes them from the intent");
        }
    }

    /// Reads and applies one batch. Returns true when the stream was idle.
    ///
    /// The stages: what is carried is written unless it may stay carried; the stream is read
    /// within the budget ([`Worker::read`]) unless a batch is already waiting; then the batch
    /// is applied (see [`Worker::apply`]), while behind with the next one read ahead
    /// ([`Worker::apply_reading_ahead`]).
    async fn step(&self, fence: &Fence, session: &mut Session) -> Result<bool, SessionError> {
        // Counters are carried only while more events are read and waiting (see
        // `crate::core::carry`): otherwise what is carried is written now, before the stream is read
        // on caught up (a read that waits for events holds nothing else; `crate::budget`).
        let carry_on = session.behind
            && !session.events.is_empty()
            && !session.checkpoint.snapshot_running()
            && !session.carrying.expired(self.clock.now());
        if !carry_on {
            self.flush(fence, &mut session.checkpoint, &mut session.carrying)
                .await?;
        }
        if self.wants_read(session) && self.read(fence, session).await? {
            return Ok(true);
        }
        session.idle = false;
        let taken = session.take_batch();
        if session.behind {
            self.apply_reading_ahead(fence, session, taken).await?;
        } else {
            let Taken { batch, grant } = taken;
            let (checkpoint, carrying) = (&mut session.checkpoint, &mut session.carrying);
            self.apply(fence, checkpoint, batch, carrying, false)
                .await?;
            drop(grant);
        }
        session.applied_since_drained = true;
        Ok(false)
    }

    /// Whether the next batch needs a read: it is not full by count, nor by bytes.
    fn wants_read(&self, session: &Session) -> bool {
        // Events read ahead that already fill a read's share of the budget are a whole batch:
        // a read topping them up would be cut to nothing and look like a caught-up stream
        // (which would halve the next batch and stop the read ahead and the carry).
        let full_by_bytes = !session.events.is_empty()
            && cost::read_share(self.budget_total()).saturating_sub(session.held.bytes())
                < cost::MIN_READ;
        session.events.len() < session.batch_limit && !full_by_bytes
    }

    /// Reads the stream within the memory budget, and takes what it read in. Returns true
    /// when nothing waits to be applied (the stream was idle; its position is checkpointed).
    async fn read(&self, fence: &Fence, session: &mut Session) -> Result<bool, SessionError> {
        // On an idle stream, note where the server stands before reading: an empty answer
        // then proves that every event before that position is applied.
        let before_read = if session.events.is_empty() && session.idle {
            Some(self.store.read_position().await?.lower)
        } else {
            None
        };
        let asked = session.batch_limit - session.events.len();
        // Holding nothing, the read waits for room in the budget; topping up a batch it
        // takes what is free.
        let holding = session.held.bytes() > 0;
        let want = cost::read_share(self.budget_total()).saturating_sub(session.held.bytes());
        let mut grant = self
            .settings
            .budget
            .take_for(&session.held, cost::MIN_READ, want)
            .await;
        let limit = ReadLimit {
            events: if grant.bytes() == 0 { 0 } else { asked },
            bytes: grant.bytes(),
            at_least_one: !holding,
        };
        let read = if limit.events == 0 {
            Read::default()
        } else {
            let raw = session
                .source
                .read(limit, self.settings.max_batch_wait)
                .await?;
            Read::parse(&fence.stream, &limit, asked, raw)
        };
        self.settle(&mut grant, &read);
        let (got, post_batch) = (read.got, read.post_batch_token.clone());
        self.take_in(session, read, grant)?;
        if !session.events.is_empty() {
            return Ok(false);
        }
        self.status.drained();
        let idle_before = std::mem::replace(&mut session.idle, true);
        let drained_at = before_read.filter(|_| idle_before && got == 0);
        self.checkpoint_idle(fence, session, post_batch, drained_at)
            .await?;
        Ok(true)
    }

    /// Behind: the next batch is read, and its ledger entries fetched, while this one is
    /// written. (Caught up, the next read waits for new events instead, and is preceded by a
    /// position reading.) A read may return more than asked (a transaction is taken whole),
    /// so what is held may be over the limit.
    async fn apply_reading_ahead(
        &self,
        fence: &Fence,
        session: &mut Session,
        taken: Taken,
    ) -> Result<(), SessionError> {
        let ahead = self.read_ahead_limit(session);
        let read_ahead = self.read_ahead(fence, session.source.as_mut(), &ahead);
        let may_carry = !session.checkpoint.snapshot_running();
        let (checkpoint, carrying) = (&mut session.checkpoint, &mut session.carrying);
        let applied = self.apply(fence, checkpoint, taken.batch, carrying, may_carry);
        let (applied, read) = tokio::join!(applied, read_ahead);
        drop(taken.grant);
        let written = applied?;
        let (read, ledger) = read?;
        let mut grant = ahead.grant;
        self.settle(&mut grant, &read);
        self.take_in(session, read, grant)?;
        session.prefetched = ledger.map(|mut ledger| {
            ledger.overlay(written);
            ledger
        });
        Ok(())
    }

    /// Sizes the read ahead: the events the next batch still wants, within what the budget
    /// has free now (the read ahead holds the batch being written: it is cut to what is free,
    /// or not made at all).
    fn read_ahead_limit(&self, session: &Session) -> ReadAhead {
        let asked = session.batch_limit.saturating_sub(session.events.len());
        // Only when the read ahead is the whole next batch, and no snapshot chunk can
        // claim entries between the two batches.
        let prefetch = session.events.is_empty()
            && self.settings.attribution.uses_ledger()
            && !session.checkpoint.snapshot_running();
        let generation = session.checkpoint.ledger_generation();
        let grant = self
            .settings
            .budget
            .take_free(cost::read_share(self.budget_total()));
        let limit = ReadLimit {
            events: if grant.bytes() == 0 { 0 } else { asked },
            bytes: grant.bytes(),
            at_least_one: false,
        };
        ReadAhead {
            grant,
            limit,
            asked,
            prefetch: prefetch.then_some(generation),
        }
    }

    /// The read ahead itself, with the ledger entries of what it read (of generation
    /// `ahead.prefetch`, where given).
    async fn read_ahead(
        &self,
        fence: &Fence,
        source: &mut dyn EventSource,
        ahead: &ReadAhead,
    ) -> Result<(Read, Option<Prefetched>), StoreError> {
        if ahead.limit.events == 0 {
            return Ok((Read::default(), None));
        }
        // The read runs while the batch is written, so it may take about as long: a
        // backlog is then read in full batches (coalescing needs them) rather than cut
        // at `max_batch_wait`, which bounds the latency of a caught-up worker's reads.
        let raw = source
            .read(ahead.limit, self.settings.max_batch_wait * READ_AHEAD_WAITS)
            .await?;
        let read = Read::parse(&fence.stream, &ahead.limit, ahead.asked, raw);
        let ledger = match ahead.prefetch {
            Some(generation) if !read.events.is_empty() => Some(
                self.prefetch_ledger(&fence.stream, generation, &read.events)
                    .await?,
            ),
            _ => None,
        };
        Ok((read, ledger))
    }

    fn budget_total(&self) -> usize {
        self.settings.budget.total()
    }

    /// Fits a read's grant to what it holds: gives back the rest, or (one event larger than
    /// the grant, read by a worker that held nothing) holds the excess beyond the budget.
    fn settle(&self, grant: &mut Grant, read: &Read) {
        let held: usize = read.costs.iter().sum();
        if held > grant.bytes() {
            grant.merge(self.settings.budget.overdraw(held - grant.bytes()));
        } else {
            grant.shrink_to(held);
        }
    }

    /// Takes a read in (its events, with the budget they hold), and sizes the next read by how
    /// full this one came back.
    fn take_in(&self, session: &mut Session, read: Read, grant: Grant) -> Result<(), SessionError> {
        self.status.progressed(self.clock.now());
        session.held.merge(grant);
        session.costs.extend(read.costs);
        session.behind = read.got >= read.asked;
        session.batch_limit = next_batch_limit(
            session.batch_limit,
            read.asked,
            read.got,
            self.settings.batch_size,
            self.settings.max_batch_size,
        );
        session.events.extend(read.events);
        if let (Some(first), Some(since)) = (session.events.front(), session.resumed_after) {
            session.resumed_after = None;
            if let Some(at) = first.cluster_time.filter(|at| *at < since) {
                return Err(StoreError::HistoryMismatch {
                    position: position_of(&session.checkpoint),
                    reason: format!("the first event after it ({} at {}) is older than the checkpoint's own event (at {}): this stream is not the history the checkpoint came from", first.token, rfc3339(at), rfc3339(since)),
                }
                .into());
            }
        }
        Ok(())
    }

    /// An idle stream still advances to the post-batch token, so a quiet collection's position
    /// never ages off the oplog.
    async fn checkpoint_idle(
        &self,
        fence: &Fence,
        session: &mut Session,
        post_batch: Option<Token>,
        drained_at: Option<Timestamp>,
    ) -> Result<(), SessionError> {
        let checkpoint = &mut session.checkpoint;
        let newer = |token: &Token| checkpoint.token.as_ref().is_none_or(|t| t < token);
        if let Some(token) = post_batch.filter(newer) {
            self.store.save_checkpoint(fence, &token, None).await?;
            checkpoint.token = Some(token.clone());
            checkpoint.high_water = checkpoint.high_water.take().max(Some(token));
        }
        // Drained: every event before `at` is applied. Recorded after every applied batch and
        // about once a second while idle, so the reconciler's watermark advances on a quiet
        // stream and its row-level recount sees the worker pass the position it waits for.
        if let Some(at) = drained_at {
            // Every event before `at` is applied: the lag is measured from here.
            self.status.caught_up_to(at.time as i64);
            session.idle_reads += 1;
            if session.applied_since_drained || session.idle_reads >= IDLE_READS_PER_DRAINED_RECORD
            {
                self.store.record_caught_up(fence, at).await?;
                checkpoint.caught_up_at = checkpoint.caught_up_at.max(Some(at));
                session.applied_since_drained = false;
                session.idle_reads = 0;
            }
        }
        self.report_checkpoint(&fence.stream, crate::recount::applied_before(checkpoint));
        Ok(())
    }
}

/// One read of the stream, parsed. The default is no read made (no room in the budget): it
/// neither grows nor shrinks the next read.
#[derive(Default)]
struct Read {
    /// Events asked for; a read cut by the budget's bytes counts as asked for what it got (it
    /// was full: the worker is behind).
    asked: usize,
    /// Documents returned (parsed or not).
    got: usize,
    events: Vec<ChangeEvent>,
    /// The charge of each of `events` (an unreadable event is not held, so not charged).
    costs: Vec<usize>,
    post_batch_token: Option<Token>,
}

impl Read {
    /// Takes a read's events in: an unreadable event is counted and logged, never fatal.
    fn parse(stream: &str, limit: &ReadLimit, asked: usize, raw: RawBatch) -> Read {
        let got = raw.events.len();
        let asked = if cost::cut_by_bytes(limit, got, raw.bytes()) {
            got
        } else {
            asked
        };
        let mut read = Read {
            asked,
            got,
            events: Vec::with_capacity(got),
            costs: Vec::with_capacity(got),
            post_batch_token: raw.post_batch_token,
        };
        for (event, cost) in raw.events.into_iter().zip(raw.costs) {
            match event {
                Ok(event) => {
                    read.events.push(event);
                    read.costs.push(cost);
                }
                Err(e) => {
                    metrics::counter!(m::BAD_EVENTS, "stream" => stream.to_string()).increment(1);
                    tracing::warn!(%stream, error = %e, "skipping an unreadable change event");
                }
            }
        }
        read
    }
}

/// The checkpoint's position, for messages.
pub(super) fn position_of(checkpoint: &Checkpoint) -> String {
    match (&checkpoint.token, checkpoint.start_time) {
        (Some(token), _) => format!("token {token}"),
        (None, Some(at)) => format!("time {}", rfc3339(at)),
        (None, None) => "the start".into(),
    }
}

/// A cluster time as RFC 3339 (whole seconds).
fn rfc3339(at: Timestamp) -> String {
    crate::core::time::seconds_rfc3339(at.time.into())
}

/// What a read ahead may read, taken from the budget before the batch is written.
struct ReadAhead {
    grant: Grant,
    limit: ReadLimit,
    asked: usize,
    /// The ledger's generation, where the read's ledger entries are fetched with it.
    prefetch: Option<u64>,
}

/// Where the stream opens: after the checkpoint's token, else at its pinned start (or the
/// configured one), else now.
fn stream_start(checkpoint: &Checkpoint, configured_start: Option<Timestamp>) -> StreamStart {
    match (
        &checkpoint.token,
        checkpoint.start_time.or(configured_start),
    ) {
        (Some(token), _) => StreamStart::After(token.clone()),
        (None, Some(at)) => StreamStart::AtTime(at),
        (None, None) => StreamStart::Now,
    }
}

/// Takes the next batch from the buffer: everything read so far, cut at the high water so that
/// no batch holds events both at or below it and above it.
///
/// Why this never ends a batch inside a transaction: the buffer holds whole reads, and every
/// `EventSource` read ends only at a transaction's end (or where nothing more was ready, which
/// a transaction, visible all at once, cannot straddle): see [`crate::core::txn`]. So the one cut
/// made here is the high water's, itself a batch end (or a post-batch token of a drained read);
/// one inside a transaction can only come from a version before that rule or an operator's
/// replay to a token inside one, and cutting there keeps what the counters already hold.
fn take_batch(pending: &mut VecDeque<ChangeEvent>, high_water: Option<&Token>) -> Vec<ChangeEvent> {
    let below = high_water.map_or(0, |high| {
        pending.iter().take_while(|e| e.token <= *high).count()
    });
    // Nothing at or below the high water (or none): everything read is one batch.
    let end = if below == 0 { pending.len() } else { below };
    pending.drain(..end).collect()
}

#[cfg(test)]
mod tests {
    use super::next_batch_limit;

    #[test]
    fn batches_grow_while_behind_and_shrink_once_caught_up() {
        // Full reads double the limit, up to the maximum.
        assert_eq!(next_batch_limit(1000, 1000, 1000, 1000, 10_000), 2000);
        assert_eq!(next_batch_limit(8000, 8000, 8000, 1000, 10_000), 10_000);
        assert_eq!(
            next_batch_limit(10_000, 10_000, 10_000, 1000, 10_000),
            10_000
        );
        // A half-full read keeps it; a sparse one halves it, down to the minimum.
        assert_eq!(next_batch_limit(4000, 4000, 2500, 1000, 10_000), 4000);
        assert_eq!(next_batch_limit(4000, 4000, 10, 1000, 10_000), 2000);
        assert_eq!(next_batch_limit(1000, 1000, 0, 1000, 10_000), 1000);
        // A maximum below the minimum never shrinks the minimum.
        assert_eq!(next_batch_limit(1000, 1000, 1000, 1000, 10), 1000);
    }
}
