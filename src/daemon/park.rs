//! Parking: a condition that no retry mends (refused credentials or privileges, the stream
//! ended by a drop or rename, history lost under `on_history_lost = "fail"`, a source
//! collection gone) stops *that stream*, not the process (`on_fatal = "park"`, the default).
//!
//! A restart would meet the same wall, and a container that stops takes its pod out of
//! service (a sidecar: the whole application's pod), and its standbys in turn. So the process
//! stays up (`/healthz` 200), the stream is *parked*: `/readyz` answers 503 naming it and why,
//! `counterd_parked{stream,reason}` is 1, and one ERROR line says what happened and what to do.
//!
//! The parked stream holds nothing that blocks recovery: its lease is released (`lease::hold`
//! releases it when the work fails) and it does not seek it again until its re-check says to,
//! so `counterd replay` needs no `--force`, and a standby with working credentials takes the
//! stream over. A standby that meets the same wall parks as well; every replica then waits.
//!
//! The re-check, by reason:
//! - `credentials`, `source_missing`: with backoff (from `retry_min_delay` up to
//!   `park_recheck_interval`), re-reading `mongodb_uri_file` and reconnecting, or looking for
//!   the collection; then the stream tries again (and parks again, silently, if the wall is
//!   still there);
//! - `stream_ended`, `history_lost`: nothing mends them but an operator's `counterd replay`, so
//!   the stream watches its checkpoint (about every `lease_renew`) and tries again once the
//!   position moved.
//!
//! A stream is no longer parked once its change stream opens again, or it stands by for a
//! healthy holder (see [`crate::status::WorkerStatus::resumed`]).

use std::sync::Arc;
use std::time::Duration;

use super::DaemonError;
use crate::clock::SystemClock;
use crate::config::Settings;
use crate::core::time::seconds_rfc3339;
use crate::lease::LeaseError;
use crate::redact::redact_uri;
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::status::ParkReason;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::StoreResult;
use crate::worker::WorkerError;

/// Why `error` parks a stream (`None`: it stops the process, as every error did before).
pub(super) fn reason_for(error: &DaemonError) -> Option<ParkReason> {
    match error {
        DaemonError::Worker(WorkerError::StreamEnded(_)) => Some(ParkReason::StreamEnded),
        DaemonError::Worker(WorkerError::HistoryLost { .. }) => Some(ParkReason::HistoryLost),
        DaemonError::SourceMissing { .. } => Some(ParkReason::SourceMissing),
        // A database error that refuses the credentials, wherever it arose.
        DaemonError::Startup(s)
        | DaemonError::Worker(WorkerError::Startup(s) | WorkerError::Store(s))
        | DaemonError::Lease(
            LeaseError::TakeOver { source: s, .. } | LeaseError::Acquire { source: s, .. },
        ) if s.is_refused_credentials() => Some(ParkReason::Credentials),
        _ => None,
    }
}

/// The one ERROR line of a stream (or the streams of a source, `streams`) that parks: what
/// happened, in a sentence, and what to do. Pure; never the URI's password.
pub(super) fn advice(
    reason: ParkReason,
    error: &DaemonError,
    settings: &Settings,
    streams: &str,
) -> String {
    let source = match settings.counter_name.as_str() {
        crate::core::definition::DEFAULT_COUNTER => String::new(),
        _ => format!(" --source {}", settings.stream_name),
    };
    let collection = &settings.comments_collection;
    let again = humantime::format_duration(settings.park_recheck_interval);
    let cause = redacted(&error.to_string(), settings);
    let resume = "this process resumes by itself once the checkpoint moves, without a restart";
    match (reason, error) {
        (ParkReason::StreamEnded, DaemonError::Worker(WorkerError::StreamEnded(end))) => {
            let at = end
                .at
                .map(|t| format!(" at {}", seconds_rfc3339(t.time as i64)))
                .unwrap_or_default();
            format!(
                "stream {streams} parked (stream_ended): its change stream ended (event `{}`{at}): `{collection}` was dropped or renamed, or the stream invalidated; nothing after it is counted and nothing is guessed. To recover: restore or recreate `{collection}`, run `counterd{source} replay --from-time {}` ({resume}), then `counterd{source} reconcile --sweep` once to recount every post",
                end.operation,
                crate::core::classify::replay_from(&end.at)
            )
        }
        (ParkReason::HistoryLost, DaemonError::Worker(WorkerError::HistoryLost { source: lost })) => format!(
            "stream {streams} parked (history_lost): {} and on_history_lost = \"fail\": nothing was counted from this position. To recover: run `counterd{source} replay --from-time <RFC 3339 time this deployment's oplog still holds>` ({resume}), then `counterd{source} reconcile --sweep` once; or set on_history_lost = \"resweep\" and restart",
            redacted(&lost.to_string(), settings)
        ),
        (ParkReason::SourceMissing, _) => format!(
            "stream {streams} parked (source_missing): the collection `{collection}` does not exist, although counters were counted from it (dropped, renamed, or a misspelled collection setting). Restore or recreate `{collection}` (or correct the setting and restart); counterd looks again every {again} at most and resumes by itself"
        ),
        (ParkReason::Credentials, _) => {
            let place = match settings.mongodb_uri_file.as_str() {
                "" => format!("mongodb_uri ({})", redact_uri(&settings.mongodb_uri)),
                file => format!("the file {file} (mongodb_uri_file)"),
            };
            format!(
                "stream {streams} parked (credentials): MongoDB refused counterd's login or a command it needs: {cause}. Correct the credentials in {place} or grant the user counterd's roles (`counterd doctor` lists the privileges it needs); counterd tries again every {again} at most, reading the connection string again, and resumes by itself"
            )
        }
        _ => format!("stream {streams} parked ({}): {cause}", reason.label()),
    }
}

/// `text` without the URI's password, should a message quote the URI.
fn redacted(text: &str, settings: &Settings) -> String {
    text.replace(&settings.mongodb_uri, &redact_uri(&settings.mongodb_uri))
}

/// The position an operator's `counterd replay` moves: a change means "try again".
async fn position(store: &MongoStore, stream: &str) -> StoreResult<String> {
    let checkpoint = store.load_checkpoint(stream).await?.unwrap_or_default();
    Ok(format!(
        "{:?}|{:?}|{:?}",
        checkpoint.token, checkpoint.start_time, checkpoint.deployment
    ))
}

/// What a parked stream waits for before it tries again.
pub(super) struct Wait<'a> {
    pub reason: ParkReason,
    pub stream: &'a str,
    pub settings: &'a Settings,
    pub store: &'a Arc<MongoStore>,
}

/// Waits until the parked stream is worth trying again: `Some(store)` to try with (a new
/// connection after refused credentials), `None` on shutdown.
pub(super) async fn until_worth_trying(
    wait: Wait<'_>,
    backoff: &mut backon::ExponentialBackoff,
    shutdown: &Shutdown,
) -> Option<Arc<MongoStore>> {
    if wait.reason.mends_by_itself() {
        loop {
            let delay = backoff
                .next()
                .unwrap_or(wait.settings.park_recheck_interval);
            if sleep_or_shutdown(&SystemClock, delay, shutdown).await {
                return None;
            }
            if let Some(store) = recheck(&wait).await {
                return Some(store);
            }
        }
    }
    let poll = wait.settings.lease_renew.clamp(
        Duration::from_millis(100),
        wait.settings
            .park_recheck_interval
            .max(Duration::from_millis(100)),
    );
    // The checkpoint's position as it parked (`None`: unreadable; the next read sets it).
    let mut parked_at = position(wait.store, wait.stream).await.ok();
    loop {
        if sleep_or_shutdown(&SystemClock, poll, shutdown).await {
            return None;
        }
        match position(wait.store, wait.stream).await {
            Ok(now) if parked_at.as_ref().is_some_and(|p| *p != now) => {
                tracing::info!(stream = %wait.stream, "the parked stream's checkpoint moved: trying again");
                // On a new connection: nothing of the ended stream's (its cursors, a server's
                // memory of them) is carried over.
                return Some(reconnect(wait.settings).await.unwrap_or(wait.store.clone()));
            }
            Ok(now) => parked_at = Some(now),
            Err(e) => {
                tracing::debug!(stream = %wait.stream, error = %e, "parked: cannot read the checkpoint")
            }
        }
    }
}

/// One re-check of a condition that may mend by itself: the store to try again with, or
/// `None` (still there).
async fn recheck(wait: &Wait<'_>) -> Option<Arc<MongoStore>> {
    match wait.reason {
        ParkReason::Credentials => reconnect(wait.settings).await,
        _ => match wait.store.comments_exist().await {
            Ok(true) => {
                tracing::info!(stream = %wait.stream, collection = %wait.settings.comments_collection, "the parked stream's collection is back: trying again");
                Some(wait.store.clone())
            }
            Ok(false) => None,
            Err(e) => {
                tracing::debug!(stream = %wait.stream, error = %e, "parked: cannot look for the collection");
                None
            }
        },
    }
}

/// A new connection with the connection string as it is now (`mongodb_uri_file` read
/// again); `None` (said at info) when it cannot be made.
async fn reconnect(settings: &Settings) -> Option<Arc<MongoStore>> {
    let settings = Settings {
        mongodb_uri: current_uri(settings),
        ..settings.clone()
    };
    match MongoStore::connect(&(&settings).into()).await {
        Ok(store) => Some(Arc::new(store)),
        Err(e) => {
            tracing::info!(error = %redacted(&e.to_string(), &settings), "parked: cannot connect yet");
            None
        }
    }
}

/// The connection string as it is now (`mongodb_uri_file` read again); the one in use when
/// the file cannot be read or holds no usable URI (a Secret being rotated), with a warning.
pub(super) fn current_uri(settings: &Settings) -> String {
    match settings.current_uri() {
        Ok(uri) => uri,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the connection string again; keeping the one in use");
            settings.mongodb_uri.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::classify::StreamEnded;
    use crate::core::event::Token;
    use crate::store::StoreError;

    /// A database error that is not a refusal (a server error only the driver builds).
    fn other() -> StoreError {
        StoreError::Fatal {
            op: "connect",
            message: "x".into(),
        }
    }

    #[test]
    fn only_conditions_no_retry_mends_park() {
        let ended = DaemonError::Worker(WorkerError::StreamEnded(StreamEnded {
            token: Token("00".into()),
            operation: "rename".into(),
            at: Some(bson::Timestamp {
                time: 1_700_000_000,
                increment: 1,
            }),
        }));
        assert_eq!(reason_for(&ended), Some(ParkReason::StreamEnded));
        let lost = DaemonError::Worker(WorkerError::HistoryLost {
            source: StoreError::HistoryLost {
                code: 286,
                token: "00".into(),
            },
        });
        assert_eq!(reason_for(&lost), Some(ParkReason::HistoryLost));
        let missing = DaemonError::SourceMissing {
            stream: "likes".into(),
            collection: "likes".into(),
        };
        assert_eq!(reason_for(&missing), Some(ParkReason::SourceMissing));
        assert_eq!(reason_for(&DaemonError::Startup(other())), None);
        let settings = Settings {
            mongodb_uri: "mongodb://u:hunter2@db/".into(),
            ..Settings::default()
        };
        let said = advice(ParkReason::StreamEnded, &ended, &settings, "`comments`");
        assert!(
            said.contains("(event `rename` at 2023-11-14T22:13:20Z)")
                && said.contains("counterd replay --from-time 2023-11-14T22:13:21Z"),
            "{said}"
        );
        let source = Settings {
            counter_name: "likes".into(),
            stream_name: "likes".into(),
            comments_collection: "likes".into(),
            ..settings.clone()
        };
        let said = advice(ParkReason::SourceMissing, &missing, &source, "`likes`");
        assert!(said.contains("`likes` does not exist"), "{said}");
        let said = advice(ParkReason::HistoryLost, &lost, &source, "`likes`");
        assert!(said.contains("counterd --source likes replay"), "{said}");
        let said = advice(ParkReason::Credentials, &missing, &settings, "`comments`");
        assert!(
            said.contains("mongodb://u:***@db/") && !said.contains("hunter2"),
            "{said}"
        );
    }
}
