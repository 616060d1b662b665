//! The live state of one stream in this process, written by the worker, the lease loop and the
//! daemon's supervisor and read by `/readyz`, `/metrics`, `counterd demo` and the benchmark.
//!
//! Writers say what happened (`became_active`, `batch_applied`, `parked`, ...) rather than
//! storing fields, so the rules live here: what "became active" resets, which times a batch
//! moves. Times come from the caller's [`crate::clock::Clock`] (passed as `now`), so the
//! simulation's clock drives them too; ages are computed when asked. This module exports no
//! metric itself: telemetry reads it, and the daemon hands in how a park is exported
//! ([`WorkerStatus::exporting`]), so the arrow runs one way.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use bson::DateTime;

/// Exports that `stream` is (`true`) or is no longer (`false`) parked for `reason`.
pub type ParkExport = fn(stream: &str, reason: ParkReason, parked: bool);

/// Live state shared with `/readyz` and `status`.
#[derive(Debug, Default)]
pub struct WorkerStatus {
    /// The process has reached MongoDB (until then `/readyz` is unready, even on standby).
    connected: AtomicBool,
    stream_open: AtomicBool,
    active: AtomicBool,
    /// Seconds of lag behind the newest event (0 when caught up), as of the last batch.
    lag_secs: AtomicI64,
    events_applied: AtomicI64,
    /// Wall-clock time (Unix ms) this process became active on the stream (0: never).
    active_since_ms: AtomicI64,
    /// Cluster time (Unix seconds) before which every event is known applied: the later of the
    /// newest applied event and the last position the stream was found drained at (0: unknown).
    /// The stream lag is computed from it when `/metrics` or `/readyz` is asked.
    applied_until_secs: AtomicI64,
    /// Cluster time (Unix seconds) of the checkpointed position (0: unknown).
    checkpoint_secs: AtomicI64,
    /// Wall-clock time (Unix ms) of the last read the server answered or batch applied.
    progress_at_ms: AtomicI64,
    /// Wall-clock time (Unix ms) this process last reached MongoDB for this stream (a read,
    /// or a lease look on standby): a standby that cannot reach it cannot take over.
    reached_at_ms: AtomicI64,
    /// Why the stream is parked (`None`: it is not): set by the supervisor in `daemon`,
    /// cleared once the stream works again (see [`WorkerStatus::resumed`]).
    parked: Mutex<Option<Parked>>,
    /// How a park is exported (the daemon's `counterd_parked` gauge; none in tests).
    export_park: Option<ParkExport>,
}

/// Why a stream is parked: a condition no retry mends (see `crate::daemon`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::VariantArray, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ParkReason {
    /// MongoDB refused counterd's login or a command it needs (a privilege).
    Credentials,
    /// The change stream ended: the collection was dropped or renamed, or the stream
    /// invalidated.
    StreamEnded,
    /// The checkpoint fell off the oplog under `on_history_lost = "fail"`.
    HistoryLost,
    /// The source collection does not exist although counters were counted from it.
    SourceMissing,
}

impl ParkReason {
    /// The `reason` label of `counterd_parked`, and the word `/readyz` uses.
    pub fn label(self) -> &'static str {
        self.into()
    }

    /// Whether it can mend without an operator's `counterd replay` (a role granted, a
    /// password rotated, the collection back): re-checked with backoff. The others wait for
    /// the checkpoint to move.
    pub fn mends_by_itself(self) -> bool {
        matches!(self, ParkReason::Credentials | ParkReason::SourceMissing)
    }
}

/// A parked stream: its name and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    pub stream: String,
    pub reason: ParkReason,
}

/// The readings of [`WorkerStatus`]'s atomics: one getter per field (`name: field -> type`,
/// or `field -> type` when they share the name), each a relaxed load.
macro_rules! readings {
    ($($(#[$doc:meta])* $name:ident $(: $field:ident)? -> $ty:ty;)*) => {
        $($(#[$doc])* pub fn $name(&self) -> $ty {
            readings!(@field self $name $($field)?).load(Ordering::Relaxed)
        })*
    };
    (@field $self:ident $name:ident) => { $self.$name };
    (@field $self:ident $name:ident $field:ident) => { $self.$field };
}

impl WorkerStatus {
    /// A status whose parks are exported by `export` (the daemon passes the telemetry's).
    pub fn exporting(export: ParkExport) -> Self {
        WorkerStatus {
            export_park: Some(export),
            ..WorkerStatus::default()
        }
    }

    // --- events

    /// The process reached MongoDB and prepared it (start-up done).
    pub fn connected(&self) {
        self.connected.store(true, Ordering::Relaxed);
    }

    /// The lease was won at `now`: active, with nothing known yet about this run's progress
    /// (ages count from `now` until the worker reports).
    pub fn became_active(&self, now: DateTime) {
        let now_ms = now.timestamp_millis();
        self.active_since_ms.store(now_ms, Ordering::Relaxed);
        self.progress_at_ms.store(0, Ordering::Relaxed);
        self.applied_until_secs.store(0, Ordering::Relaxed);
        self.checkpoint_secs.store(0, Ordering::Relaxed);
        self.reached_at_ms.store(now_ms, Ordering::Relaxed);
        self.active.store(true, Ordering::Relaxed);
    }

    /// The active work ended (lease lost, fenced, failed or shut down): standing by, the
    /// stream no longer open here.
    pub fn became_standby(&self) {
        self.active.store(false, Ordering::Relaxed);
        self.stream_open.store(false, Ordering::Relaxed);
    }

    /// On standby, the lease was looked at and another worker holds it: a healthy standby,
    /// so no longer parked.
    pub fn saw_holder(&self, now: DateTime) {
        self.reached(now);
        self.resumed();
    }

    /// The change stream opened at `now`: working again (no longer parked).
    pub fn stream_opened(&self, now: DateTime) {
        self.stream_open.store(true, Ordering::Relaxed);
        self.resumed();
        self.progressed(now);
    }

    /// The change stream closed (an error to retry, or the session ended).
    pub fn stream_closed(&self) {
        self.stream_open.store(false, Ordering::Relaxed);
    }

    /// A read the server answered at `now` (a batch applied counts too, see
    /// [`WorkerStatus::batch_applied`]).
    pub fn progressed(&self, now: DateTime) {
        let now_ms = now.timestamp_millis();
        self.progress_at_ms.store(now_ms, Ordering::Relaxed);
        self.reached_at_ms.store(now_ms, Ordering::Relaxed);
    }

    /// A read found nothing pending: no lag.
    pub fn drained(&self) {
        self.lag_secs.store(0, Ordering::Relaxed);
    }

    /// Every event before cluster time `secs` is known applied (a resume position, a drained
    /// stream): the lag is measured from the latest such time.
    pub fn caught_up_to(&self, secs: i64) {
        self.applied_until_secs.fetch_max(secs, Ordering::Relaxed);
    }

    /// A batch of `events` was applied at `now`, its newest event at cluster time `newest`
    /// (seconds; `None`: the batch held no timed event).
    pub fn batch_applied(&self, events: usize, newest: Option<i64>, now: DateTime) {
        self.events_applied
            .fetch_add(events as i64, Ordering::Relaxed);
        let now_secs = crate::core::time::secs(now);
        let lag = newest.map(|t| (now_secs - t).max(0)).unwrap_or(0);
        self.lag_secs.store(lag, Ordering::Relaxed);
        self.progressed(now);
        if let Some(t) = newest {
            self.caught_up_to(t);
        }
    }

    /// The checkpoint moved to cluster time `secs`.
    pub fn checkpointed(&self, secs: i64) {
        self.checkpoint_secs.store(secs, Ordering::Relaxed);
    }

    /// The worker or the lease loop heard from the server at `now`.
    pub fn reached(&self, now: DateTime) {
        self.reached_at_ms
            .store(now.timestamp_millis(), Ordering::Relaxed);
    }

    /// The stream parked for `reason`, and the park is exported. True when it was not parked
    /// for that reason before (the caller then says so, once).
    pub fn parked(&self, stream: &str, reason: ParkReason) -> bool {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = parked.as_ref() {
            if before.reason == reason {
                return false;
            }
            self.export(&before.stream, before.reason, false);
        }
        self.export(stream, reason, true);
        *parked = Some(Parked {
            stream: stream.to_string(),
            reason,
        });
        true
    }

    /// The stream works again (its change stream opened, or it stands by for a healthy
    /// holder): no longer parked. True when it was.
    pub fn resumed(&self) -> bool {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        let Some(before) = parked.take() else {
            return false;
        };
        self.export(&before.stream, before.reason, false);
        tracing::info!(stream = %before.stream, reason = before.reason.label(), "parked stream resumed");
        true
    }

    fn export(&self, stream: &str, reason: ParkReason, parked: bool) {
        if let Some(export) = self.export_park {
            export(stream, reason, parked);
        }
    }

    // --- readings

    readings! {
        /// Whether the process has reached MongoDB (start-up done).
        is_connected: connected -> bool;
        /// Whether this process holds the stream's lease and runs its worker.
        is_active: active -> bool;
        /// Whether the change stream is open here.
        is_stream_open: stream_open -> bool;
        /// Seconds of lag behind the newest event as of the last batch (0 when caught up).
        lag_secs -> i64;
        /// Events applied by this process since it started.
        events_applied -> i64;
        /// Unix ms this process last became active (0: never).
        active_since_ms -> i64;
        /// Cluster seconds before which every event is known applied (0: unknown).
        applied_until_secs -> i64;
        /// Cluster seconds of the checkpointed position (0: unknown).
        checkpoint_secs -> i64;
        /// Unix ms of the last answered read or applied batch (0: none yet in this run).
        progress_at_ms -> i64;
        /// Unix ms this process last reached MongoDB for this stream (0: never).
        reached_at_ms -> i64;
    }

    /// Why the stream is parked, if it is.
    pub fn why_parked(&self) -> Option<Parked> {
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
