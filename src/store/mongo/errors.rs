//! Sorting driver errors into what the caller should do.

use super::*;

/// Server error codes for "the resume point is no longer in the oplog".
pub(super) const HISTORY_LOST_CODES: [i32; 3] = [286, 280, 260];

/// Server error codes worth a retry: no primary, shutting down, interrupted, network.
pub(super) const TRANSIENT_CODES: [i32; 17] = [
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11601, 11602, 13435, 13436, 63, 150, 134, 133,
];

/// Duplicate key: a guarded upsert whose guard failed on an existing document.
pub(super) const DUPLICATE_KEY: i32 = 11000;

/// A snapshot read older than the server keeps history for (`SnapshotTooOld`,
/// `SnapshotUnavailable`, `StaleClusterTime`-like refusals): fall back to the row-level recount.
pub(super) const SNAPSHOT_GONE: [i32; 3] = [239, 246, 209];

pub(super) use super::cause::sentence;
pub(super) use crate::store::error::error_code;

/// Server error codes that no retry mends when connecting: `Unauthorized` (13),
/// `AuthenticationFailed` (18), and Atlas's `AtlasError` for a refused login (8000).
const REFUSED_LOGIN_CODES: [i32; 3] = [13, 18, 8000];

/// Whether a failed first contact may succeed later (the server is down, starting, electing,
/// or the network lost a reply), rather than never (credentials refused, a bad option).
pub(super) fn unreachable_for_now(e: &DriverError) -> bool {
    match e.kind.as_ref() {
        ErrorKind::Authentication { .. } | ErrorKind::InvalidArgument { .. } => false,
        _ => !error_code(e).is_some_and(|c| REFUSED_LOGIN_CODES.contains(&c)),
    }
}

/// Sorts a driver error into what the caller should do.
pub(crate) fn map_err(op: &'static str, e: DriverError) -> StoreError {
    let transient_kind = matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    );
    let labelled = [
        "RetryableWriteError",
        "ResumableChangeStreamError",
        "TransientTransactionError",
    ]
    .iter()
    .any(|l| e.contains_label(l));
    let code = error_code(&e);
    let transient =
        transient_kind || labelled || code.is_some_and(|c| TRANSIENT_CODES.contains(&c));
    driver_error(op, transient, sentence(&e), e)
}

/// The driver's error `e` as `op`'s failure, with the one sentence that describes it (see
/// [`StoreError::Driver`]).
pub(super) fn driver_error(
    op: &'static str,
    transient: bool,
    detail: impl Into<String>,
    e: DriverError,
) -> StoreError {
    StoreError::Driver {
        op,
        transient,
        detail: detail.into(),
        source: Box::new(e),
    }
}

/// A change stream's error; history lost names the token the stream resumed after, if any.
pub(super) fn stream_err(e: DriverError, start: &StreamStart) -> StoreError {
    match error_code(&e) {
        Some(code) if HISTORY_LOST_CODES.contains(&code) => StoreError::HistoryLost {
            code,
            token: match start {
                StreamStart::After(token) => token.to_string(),
                _ => String::new(),
            },
        },
        Some(40573) => driver_error("open the change stream", false, "the server is a standalone: change streams need a replica set or a sharded cluster (start mongod with --replSet and run rs.initiate())", e),
        _ => map_err("read the change stream", e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_reply_at_first_contact_is_worth_waiting_for() {
        let reset = DriverError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(unreachable_for_now(&reset));
        assert!(map_err("create indexes", reset).is_transient());
    }
}
