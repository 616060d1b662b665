//! The live state of one stream in this process, written by the worker and the lease loop and
//! read by `/readyz`, `/metrics` and the demo. Times are recorded, ages computed when asked.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

use crate::telemetry as m;

/// Live state shared with `/readyz` and `status`.
#[derive(Debug, Default)]
pub struct WorkerStatus {
    /// The process has reached MongoDB (until then `/readyz` is unready, even on standby).
    pub connected: AtomicBool,
    pub stream_open: AtomicBool,
    pub active: AtomicBool,
    /// Seconds of lag behind the newest event (0 when caught up), as of the last batch.
    pub lag_secs: AtomicI64,
    pub events_applied: AtomicI64,
    /// Wall-clock time (Unix ms) this process became active on the stream (0: never).
    pub active_since_ms: AtomicI64,
    /// Cluster time (Unix seconds) before which every event is known applied: the later of the
    /// newest applied event and the last position the stream was found drained at (0: unknown).
    /// The stream lag is computed from it when `/metrics` or `/readyz` is asked.
    pub applied_until_secs: AtomicI64,
    /// Cluster time (Unix seconds) of the checkpointed position (0: unknown).
    pub checkpoint_secs: AtomicI64,
    /// Wall-clock time (Unix ms) of the last read the server answered or batch applied.
    pub progress_at_ms: AtomicI64,
    /// Wall-clock time (Unix ms) this process last reached MongoDB for this stream (a read,
    /// or a lease look on standby): a standby that cannot reach it cannot take over.
    pub reached_at_ms: AtomicI64,
    /// Why the stream is parked (`None`: it is not): set by the supervisor in `daemon`,
    /// cleared once the stream works again (see [`WorkerStatus::resumed`]).
    parked: Mutex<Option<Parked>>,
}

/// Why a stream is parked: a condition no retry mends (see `crate::daemon`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    pub const ALL: [ParkReason; 4] = [
        ParkReason::Credentials,
        ParkReason::StreamEnded,
        ParkReason::HistoryLost,
        ParkReason::SourceMissing,
    ];

    /// The `reason` label of `counterd_parked`, and the word `/readyz` uses.
    pub fn label(self) -> &'static str {
        match self {
            ParkReason::Credentials => "credentials",
            ParkReason::StreamEnded => "stream_ended",
            ParkReason::HistoryLost => "history_lost",
            ParkReason::SourceMissing => "source_missing",
        }
    }

    /// Whether it can mend without an operator's `counterd replay` (a role granted, a
    /// password rotated, the collection back): re-checked with backoff. The others wait for
    /// the checkpoint to move.
    pub fn mends_by_itself(self) -> bool {
        matches!(self, ParkReason::Credentials | ParkReason::SourceMissing)
    }
}

/// A parked stream: its name, why, and since when (Unix ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parked {
    pub stream: String,
    pub reason: ParkReason,
    pub since_ms: i64,
}

impl WorkerStatus {
    /// The worker or the lease loop heard from the server just now.
    pub fn reached(&self) {
        self.reached_at_ms
            .store(m::unix_now_ms(), Ordering::Relaxed);
    }

    /// Parks the stream for `reason` and exports it. True when it was not parked for that
    /// reason before (the caller then says so, once).
    pub fn park(&self, stream: &str, reason: ParkReason) -> bool {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = parked.as_ref() {
            if before.reason == reason {
                return false;
            }
            metrics::gauge!(m::PARKED, "stream" => before.stream.clone(), "reason" => before.reason.label()).set(0.0);
        }
        metrics::gauge!(m::PARKED, "stream" => stream.to_string(), "reason" => reason.label())
            .set(1.0);
        *parked = Some(Parked {
            stream: stream.to_string(),
            reason,
            since_ms: m::unix_now_ms(),
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
        metrics::gauge!(m::PARKED, "stream" => before.stream.clone(), "reason" => before.reason.label()).set(0.0);
        tracing::info!(stream = %before.stream, reason = before.reason.label(), "parked stream resumed");
        true
    }

    /// Why the stream is parked, if it is.
    pub fn parked(&self) -> Option<Parked> {
        self.parked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The stream made progress just now (a read answered, a batch applied).
    pub fn progressed(&self) {
        let now = m::unix_now_ms();
        self.progress_at_ms.store(now, Ordering::Relaxed);
        self.reached_at_ms.store(now, Ordering::Relaxed);
    }
}
