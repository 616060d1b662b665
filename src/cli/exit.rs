//! Exit codes, and the one place that maps a failure to its code (documented in docs/commands.md, "Exit codes"):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | ok |
//! | 1 | differs or refused: `verify`/`get` found a counter that differs from the truth, `doctor` found a problem, `replay`/`snapshot` refused while a worker holds the stream (without `--force`) |
//! | 2 | usage or configuration error (a bad flag or setting; nothing was contacted) |
//! | 3 | cannot reach or talk to MongoDB (unreachable, refused credentials or privileges, a malformed stored document) |
//! | 4 | the change stream ended (collection dropped or renamed) or history was lost |
//! | 5 | not yet verifiable: the initial snapshot is still running (or no worker has started the stream) |
//! | 6 | `counterd run` cannot listen on `http_addr` |
//! | 70 | internal error: anything unclassified (a bug; please report it) |

use crate::config::ConfigError;
use crate::core::classify::StreamEnded;
use crate::daemon::DaemonError;
use crate::lease::LeaseError;
use crate::store::StoreError;
use crate::worker::WorkerError;

pub const OK: u8 = 0;
/// A counter differs from the truth, a check failed, or the command was refused.
pub const CHECK_FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const MONGODB: u8 = 3;
pub const STREAM: u8 = 4;
/// Not yet verifiable: the initial snapshot is still counting (ask again once it is done).
pub const NOT_YET: u8 = 5;
/// `run` cannot listen on `http_addr` (the port is taken, or the address is not this host's).
pub const LISTEN: u8 = 6;
/// Anything unclassified: a bug (`EX_SOFTWARE` of sysexits.h).
pub const INTERNAL: u8 = 70;

/// A command was used wrongly (a flag value it cannot use): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A check the command makes failed (a mismatch, a refusal): exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailed(pub String);

/// The answer cannot be given yet (the initial snapshot is still running, or has not begun):
/// exit code 5, so a script can wait and ask again rather than read it as a mismatch.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotYet(pub String);

/// The exit code for a store error.
fn store_code(e: &StoreError) -> u8 {
    match e {
        StoreError::HistoryLost { .. } | StoreError::HistoryMismatch { .. } => STREAM,
        StoreError::Transient { .. }
        | StoreError::Fatal { .. }
        | StoreError::Malformed { .. }
        | StoreError::Fenced { .. }
        | StoreError::Driver { .. } => MONGODB,
    }
}

/// The exit code for a worker error.
fn worker_code(e: &WorkerError) -> u8 {
    match e {
        WorkerError::StreamEnded(_) | WorkerError::HistoryLost { .. } => STREAM,
        WorkerError::Startup(s) | WorkerError::Store(s) => store_code(s),
    }
}

/// The exit code when `counterd run` stopped. A panicked or cancelled stream is a bug (70).
fn daemon_code(e: &DaemonError) -> u8 {
    match e {
        DaemonError::Startup(s) => store_code(s),
        DaemonError::Listen { .. } => LISTEN,
        DaemonError::Worker(w) => worker_code(w),
        DaemonError::Lease(
            LeaseError::TakeOver { source, .. } | LeaseError::Acquire { source, .. },
        ) => store_code(source),
        DaemonError::Lease(LeaseError::Panicked { .. } | LeaseError::Cancelled { .. }) => INTERNAL,
        DaemonError::Config(_) => USAGE,
        DaemonError::SourceMissing { .. } => STREAM,
    }
}

/// The exit code for a failed command: the first cause in the chain that says what it is;
/// anything else is an internal error (70).
pub fn code_for(error: &anyhow::Error) -> u8 {
    error.chain().find_map(code_of).unwrap_or(INTERNAL)
}

/// The code one cause says, if it says one.
fn code_of(cause: &(dyn std::error::Error + 'static)) -> Option<u8> {
    // The types are disjoint: at most one of these holds.
    let by_type = [
        (cause.is::<ConfigError>() || cause.is::<UsageError>(), USAGE),
        (cause.is::<CheckFailed>(), CHECK_FAILED),
        (cause.is::<NotYet>(), NOT_YET),
        (cause.is::<StreamEnded>(), STREAM),
        (cause.is::<mongodb::error::Error>(), MONGODB),
    ];
    let found = by_type
        .into_iter()
        .find_map(|(is, code)| is.then_some(code));
    found
        .or_else(|| cause.downcast_ref().map(daemon_code))
        .or_else(|| cause.downcast_ref().map(worker_code))
        .or_else(|| cause.downcast_ref().map(store_code))
}

/// A failure and its causes for the operator, joined by `: `, each said once: a cause whose
/// text is already shown (an error that prints its source) is skipped, and the chain ends at
/// the driver's own error, which the store error above it has already described in one
/// sentence (the whole driver error stays available as a source to code, and to
/// [`describe_in_full`]). Any URI or known secret in the text is redacted.
pub fn describe(error: &anyhow::Error) -> String {
    join_causes(error, false)
}

/// [`describe`] with the driver's own text too (`--verbose`), secrets redacted.
pub fn describe_in_full(error: &anyhow::Error) -> String {
    join_causes(error, true)
}

fn join_causes(error: &anyhow::Error, driver_text: bool) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let driver =
            cause.is::<mongodb::error::Error>() || cause.is::<Box<mongodb::error::Error>>(); // as `StoreError::Driver` keeps it
        if driver && !driver_text && !text.is_empty() {
            break;
        }
        let said = cause.to_string();
        if text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    crate::redact::redact_text(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::Token;

    #[test]
    fn every_failure_maps_to_its_documented_code() {
        let transient = || StoreError::Transient {
            op: "connect",
            message: "refused".into(),
        };
        let lost = || StoreError::HistoryLost {
            code: 286,
            token: "00".into(),
        };
        let ended = StreamEnded {
            token: Token("00".into()),
            operation: "drop".into(),
            at: None,
        };
        let listen = DaemonError::Listen {
            addr: "127.0.0.1:1".into(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let unknown = ConfigError::Unknown {
            name: "x".into(),
            origin: "flag --set".into(),
        };
        let panicked = || LeaseError::Panicked {
            stream: "comments".into(),
            message: "boom".into(),
        };
        let history_lost = || WorkerError::HistoryLost { source: lost() };
        let cases: Vec<(anyhow::Error, u8)> = vec![
            (CheckFailed("mismatch".into()).into(), 1),
            // Unclassified: a bug.
            (anyhow::anyhow!("something else"), 70),
            (NotYet("snapshot running".into()).into(), 5),
            (anyhow::Error::from(NotYet("x".into())).context("verify"), 5),
            (listen.into(), 6),
            (unknown.into(), 2),
            (UsageError("--from-token".into()).into(), 2),
            (transient().into(), 3),
            (WorkerError::Startup(transient()).into(), 3),
            // A cause further down the chain.
            (
                anyhow::Error::from(transient()).context("status: read the checkpoint"),
                3,
            ),
            (lost().into(), 4),
            (history_lost().into(), 4),
            (WorkerError::StreamEnded(ended.clone()).into(), 4),
            (ended.into(), 4),
            (DaemonError::Startup(transient()).into(), 3),
            (DaemonError::Worker(history_lost()).into(), 4),
            (DaemonError::from(panicked()).into(), 70),
        ];
        for (error, expected) in cases {
            assert_eq!(code_for(&error), expected, "{error:#}");
        }
        let lost_again = anyhow::Error::from(history_lost());
        assert_eq!(
            describe(&lost_again).matches("history lost").count(),
            1,
            "a source its parent shows is not repeated"
        );
        assert!(DaemonError::from(panicked())
            .to_string()
            .contains("panicked: boom"));
    }
}
