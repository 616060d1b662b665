//! Why a store operation failed, sorted by what the caller should do about it.

/// Why a store operation failed, sorted by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Worth retrying: network trouble, no primary, an interrupted operation. (Its text does
    /// not say "transient": a caller that retries says so, and one that gave up must not.)
    #[error("database error during {op}: {message}")]
    Transient { op: &'static str, message: String },
    /// The resume token fell off the oplog (codes 286, 280, 260).
    #[error("change stream history lost (code {code}) while resuming after token {token}: the checkpoint is older than the oplog window")]
    HistoryLost { code: i32, token: String },
    /// The checkpoint cannot be resumed here although the server did not refuse it: it belongs
    /// to another deployment (a restored backup), or the stream answered with an event older
    /// than the checkpoint. Handled like [`StoreError::HistoryLost`].
    #[error("change stream history lost while resuming from {position}: {reason}")]
    HistoryMismatch { position: String, reason: String },
    /// Another worker holds a newer fencing epoch for this stream: step down.
    #[error(
        "fenced out of stream `{stream}`: another worker took over with a newer epoch than {epoch}"
    )]
    Fenced { stream: String, epoch: i64 },
    /// A stored document is not what counterd wrote (hand-edited or corrupted).
    #[error("malformed {what} document {id}: {detail}")]
    Malformed {
        what: &'static str,
        id: String,
        detail: String,
    },
    /// Anything else: stop with this message; the checkpoint has not moved.
    #[error("database error during {op}: {message}")]
    Fatal { op: &'static str, message: String },
    /// The driver failed: worth retrying when `transient` (as [`StoreError::Transient`]),
    /// otherwise as [`StoreError::Fatal`]. `detail` is a short, credential-free description
    /// for logs and messages; the driver's own error is kept whole as the source (its code,
    /// labels and chain).
    #[error("{}", driver_failure(op, detail))]
    Driver {
        op: &'static str,
        transient: bool,
        detail: String,
        #[source]
        source: Box<mongodb::error::Error>,
    },
}

/// A driver failure's text: the detail alone when it already says what failed (`cannot reach
/// MongoDB at ...`, `MongoDB at ... refused counterd`), else `database error during <op>`.
fn driver_failure(op: &str, detail: &str) -> String {
    if detail.starts_with("cannot reach MongoDB") || detail.starts_with("MongoDB at ") {
        detail.to_string()
    } else {
        format!("database error during {op}: {detail}")
    }
}

impl StoreError {
    /// A write refused because a successor holds the stream with a newer epoch than `fence`'s.
    pub fn fenced(fence: &super::Fence) -> StoreError {
        StoreError::Fenced {
            stream: fence.stream.clone(),
            epoch: fence.epoch,
        }
    }

    /// The error with every source below it, the driver's own text included, secrets
    /// redacted: for debug logs and `--verbose`, never for the one-sentence message.
    pub fn in_full(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        crate::redact::redact_text(&text)
    }

    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Transient { .. }
                | StoreError::Driver {
                    transient: true,
                    ..
                }
        )
    }

    /// MongoDB refused counterd's login or a command for want of a privilege (codes 13
    /// `Unauthorized`, 18 `AuthenticationFailed`, 8000 Atlas's refused login, 11
    /// `UserNotFound`, or the driver's own authentication failure): no retry mends it until
    /// someone fixes the credentials or grants the role.
    pub fn is_refused_credentials(&self) -> bool {
        let StoreError::Driver {
            transient: false,
            source,
            ..
        } = self
        else {
            return false;
        };
        use mongodb::error::ErrorKind;
        matches!(source.kind.as_ref(), ErrorKind::Authentication { .. })
            || error_code(source).is_some_and(|c| REFUSED_CODES.contains(&c))
    }

    /// The checkpoint's history is gone: the server refused it, or counterd found it belongs
    /// to another history. Both follow `on_history_lost`.
    pub fn is_history_lost(&self) -> bool {
        matches!(
            self,
            StoreError::HistoryLost { .. } | StoreError::HistoryMismatch { .. }
        )
    }
}

/// The server's code of a refused command or write (`None`: the driver failed otherwise).
pub(crate) fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

/// Server codes of a refused login or privilege: `Unauthorized` (13), `AuthenticationFailed`
/// (18), `UserNotFound` (11), Atlas's `AtlasError` for a refused login (8000).
pub const REFUSED_CODES: [i32; 4] = [13, 18, 11, 8000];

pub type StoreResult<T> = Result<T, StoreError>;
