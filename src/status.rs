//! The live state of one stream in this process, written by the worker and the lease loop and
//! read by `/readyz`, `/metrics` and the demo. Times are recorded, ages computed when asked.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

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
}

impl WorkerStatus {
    /// The worker or the lease loop heard from the server just now.
    pub fn reached(&self) {
        self.reached_at_ms
            .store(m::unix_now_ms(), Ordering::Relaxed);
    }

    /// The stream made progress just now (a read answered, a batch applied).
    pub fn progressed(&self) {
        let now = m::unix_now_ms();
        self.progress_at_ms.store(now, Ordering::Relaxed);
        self.reached_at_ms.store(now, Ordering::Relaxed);
    }
}
