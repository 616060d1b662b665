//! Exit codes, and the one place that maps a failure to its code (documented in docs/commands.md, "Exit codes"):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | ok |
//! | 1 | a mismatch was found or a check failed (`verify`, `replay` refused while a worker holds the stream, `reconcile` before the first run's initial snapshot) |
//! | 2 | usage or configuration error (a bad flag or setting; nothing was contacted) |
//! | 3 | cannot reach or talk to MongoDB (unreachable, refused, a malformed stored document) |
//! | 4 | stopped because the change stream ended (collection dropped or renamed) or history was lost |

use std::process::ExitCode;

use crate::classify::StreamEnded;
use crate::config::ConfigError;
use crate::daemon::DaemonError;
use crate::lease::LeaseError;
use crate::store::StoreError;
use crate::worker::WorkerError;

pub const OK: u8 = 0;
pub const CHECK_FAILED: u8 = 1;
pub const USAGE: u8 = 2;
pub const MONGODB: u8 = 3;
pub const STREAM: u8 = 4;

/// A command was used wrongly (a flag value it cannot use): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// A check the command makes failed (a mismatch, a refusal): exit code 1.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CheckFailed(pub String);

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

/// The exit code when `counterd run` stopped. A panicked or cancelled stream keeps the code it
/// always had (3), and a port that cannot be bound its 1.
fn daemon_code(e: &DaemonError) -> u8 {
    match e {
        DaemonError::Startup(s) => store_code(s),
        DaemonError::Listen { .. } => CHECK_FAILED,
        DaemonError::Worker(w) => worker_code(w),
        DaemonError::Lease(
            LeaseError::TakeOver { source, .. } | LeaseError::Acquire { source, .. },
        ) => store_code(source),
        DaemonError::Lease(LeaseError::Panicked { .. } | LeaseError::Cancelled { .. }) => MONGODB,
        DaemonError::Config(_) => USAGE,
    }
}

/// The exit code for a failed command: the first cause in the chain that says what it is;
/// anything else is a failed check (1).
pub fn code_for(error: &anyhow::Error) -> u8 {
    for cause in error.chain() {
        if cause.is::<ConfigError>() || cause.is::<UsageError>() {
            return USAGE;
        }
        if cause.is::<CheckFailed>() {
            return CHECK_FAILED;
        }
        if cause.is::<StreamEnded>() {
            return STREAM;
        }
        if let Some(e) = cause.downcast_ref::<DaemonError>() {
            return daemon_code(e);
        }
        if let Some(e) = cause.downcast_ref::<WorkerError>() {
            return worker_code(e);
        }
        if let Some(e) = cause.downcast_ref::<StoreError>() {
            return store_code(e);
        }
        if cause.is::<mongodb::error::Error>() {
            return MONGODB;
        }
    }
    CHECK_FAILED
}

/// A failure and its causes for the operator, joined by `: `, each said once: a cause whose
/// text is already shown (an error that prints its source) is skipped, and the chain ends at
/// the driver's own error, which the store error above it has already described briefly and
/// without credentials (the whole driver error stays available as a source to code).
pub fn describe(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let driver =
            cause.is::<mongodb::error::Error>() || cause.is::<Box<mongodb::error::Error>>(); // as `StoreError::Driver` keeps it
        if driver && !text.is_empty() {
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
    text
}

/// The exit code as a process exit code.
pub fn exit_code(code: u8) -> ExitCode {
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Token;

    fn code(e: impl Into<anyhow::Error>) -> u8 {
        code_for(&e.into())
    }

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
        assert_eq!(code(CheckFailed("mismatch".into())), 1);
        assert_eq!(code(anyhow::anyhow!("something else")), 1);
        assert_eq!(
            code(ConfigError::Unknown {
                name: "x".into(),
                origin: "flag --set".into()
            }),
            2
        );
        assert_eq!(code(UsageError("--from-token".into())), 2);
        assert_eq!(code(transient()), 3);
        assert_eq!(code(WorkerError::Startup(transient())), 3);
        assert_eq!(
            code(anyhow::Error::from(transient()).context("status: read the checkpoint")),
            3,
            "a cause further down the chain"
        );
        assert_eq!(code(lost()), 4);
        assert_eq!(code(WorkerError::HistoryLost { source: lost() }), 4);
        assert_eq!(code(WorkerError::StreamEnded(ended.clone())), 4);
        assert_eq!(code(ended), 4);
        let lost_again = anyhow::Error::from(WorkerError::HistoryLost { source: lost() });
        assert_eq!(
            describe(&lost_again).matches("history lost").count(),
            1,
            "a source its parent shows is not repeated"
        );
        assert_eq!(code(DaemonError::Startup(transient())), 3);
        assert_eq!(
            code(DaemonError::Worker(WorkerError::HistoryLost {
                source: lost()
            })),
            4
        );
        let panicked = LeaseError::Panicked {
            stream: "comments".into(),
            message: "boom".into(),
        };
        assert!(DaemonError::from(panicked)
            .to_string()
            .contains("panicked: boom"));
    }
}
