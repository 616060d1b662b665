//! The faults a soak injects, one per cycle, drawn at random: network faults from the proxy,
//! the server paused, `counterd run` killed or restarted, and an operator's one-shots.

use std::time::Duration;

use counterd_testdb::{FaultProxy, Target};
use rand::rngs::StdRng;
use rand::Rng;
use serde::Serialize;

/// One kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Replies lost after the server applied their requests.
    LostReplies,
    /// Requests whose connection is reset before the server sees them.
    ResetRequests,
    /// Every open connection reset.
    ResetAll,
    /// Latency on every request, for a while.
    Latency,
    /// All traffic held, for a while.
    Stall,
    /// The server process paused (SIGSTOP) and resumed (SIGCONT).
    ServerPaused,
    /// `counterd run` killed with SIGKILL and started again.
    Kill9,
    /// `counterd run` stopped with SIGTERM and started again.
    Restart,
    /// `counterd replay --from-time <20 s ago> --force` beside the running worker.
    Replay,
    /// `counterd reconcile --once` beside the running worker.
    Reconcile,
}

pub const KINDS: [Kind; 10] = [
    Kind::LostReplies,
    Kind::ResetRequests,
    Kind::ResetAll,
    Kind::Latency,
    Kind::Stall,
    Kind::ServerPaused,
    Kind::Kill9,
    Kind::Restart,
    Kind::Replay,
    Kind::Reconcile,
];

/// Requests a lost reply or a reset may hit: each step of a batch, of a recount, the lease.
const TARGETS: [(&str, &str); 11] = [
    ("getMore", ""),
    ("aggregate", "$changeStream"),
    ("find", "counterd_comment_state"),
    ("update", "comment_counters"),
    ("update", "counterd_comment_state"),
    ("update", "counterd_dirty"),
    ("update", "counterd_checkpoints"),
    ("findAndModify", "counterd_leases"),
    ("update", "reconciled_at"),
    ("find", "counterd_dirty"),
    ("", ""),
];

/// Requests of `counterd run`'s start-up: a restart may meet a lost reply to one of them (the
/// issue that ended the process before start-up retried).
const STARTUP: [(&str, &str); 4] = [
    ("createIndexes", ""),
    ("buildInfo", ""),
    ("findAndModify", "counterd_leases"),
    ("aggregate", "$changeStream"),
];

/// Half the time, a lost reply armed for a start-up step (before a restart); whether it was.
pub fn arm_startup(proxy: &FaultProxy, rng: &mut StdRng) -> bool {
    if !rng.random_bool(0.5) {
        return false;
    }
    let (command, text) = STARTUP[rng.random_range(0..STARTUP.len())];
    proxy.drop_replies(Target::command(command).containing(text), 1);
    true
}

/// A random request target.
pub fn target(rng: &mut StdRng) -> Target {
    let (command, text) = TARGETS[rng.random_range(0..TARGETS.len())];
    let target = if command.is_empty() {
        Target::any()
    } else {
        Target::command(command)
    };
    if text.is_empty() {
        target
    } else {
        target.containing(text)
    }
}

/// Arms a proxy fault of `kind` (the network kinds only); returns how long it lasts, for the
/// timed ones (latency, stall), after which [`FaultProxy::clear`] lifts it.
pub fn arm(proxy: &FaultProxy, kind: Kind, rng: &mut StdRng) -> Option<Duration> {
    match kind {
        Kind::LostReplies => {
            proxy.drop_replies(target(rng), rng.random_range(1..=3));
            None
        }
        Kind::ResetRequests => {
            proxy.reset_requests(target(rng), rng.random_range(1..=3));
            None
        }
        Kind::ResetAll => {
            proxy.reset_all();
            None
        }
        Kind::Latency => {
            proxy.set_latency(Duration::from_millis(rng.random_range(10..100)));
            Some(Duration::from_millis(rng.random_range(2000..6000)))
        }
        Kind::Stall => {
            let d = Duration::from_millis(rng.random_range(1000..8000));
            proxy.stall(d);
            Some(d)
        }
        _ => None,
    }
}
