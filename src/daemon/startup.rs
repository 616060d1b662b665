//! Start-up that rides through transient errors. A sidecar starts beside a database that may
//! itself be starting, electing a primary or upgrading (rolling upgrades step primaries down on
//! purpose), so every step before the first batch (connect, server abilities, indexes) is
//! retried with exponential, jittered backoff while its error is transient, each attempt bounded
//! by `operation_timeout` (a reply that never comes is a transient error, not a hang). Only an
//! error that no retry can mend (a bad URI, bad credentials, a refused command) ends the start,
//! with what failed and what to check. Meanwhile `/readyz` stays unready (the streams are not
//! `connected`) and `counterd_retries_total{op=<step>}` counts the attempts that failed.
//!
//! The lease and the first change stream are retried where they run, in [`crate::lease::hold`]
//! and [`crate::worker::Worker::run`], as they are for the rest of the process's life.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::clock::SystemClock;
use crate::config::Settings;
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::mongo::MongoStore;
use crate::store::{StoreError, StoreResult};

/// The start-up steps, as `counterd_retries_total`'s `op` label names them.
pub mod step {
    pub const CONNECT: &str = "connect";
    pub const CREATE_INDEXES: &str = "create_indexes";
    pub const SERVER_ABILITIES: &str = "server_abilities";
}

/// Connects, retrying while the server is unreachable. `None`: shutdown was requested first;
/// an error: the server answered but cannot be used (a bad URI, credentials).
pub async fn connect_patiently(
    settings: &Settings,
    shutdown: &Shutdown,
) -> Result<Option<MongoStore>, StoreError> {
    let options = settings.into();
    patiently(step::CONNECT, settings, shutdown, || {
        MongoStore::connect(&options)
    })
    .await
}

/// Runs `attempt` until it succeeds, fails with an error that is not transient, or shutdown is
/// requested (`Ok(None)`). Each attempt may take up to `operation_timeout`; the pause after a
/// failed one grows from `retry_min_delay` to `retry_max_delay`, with jitter, so that replicas
/// restarted together do not retry in step.
pub async fn patiently<T, F, Fut>(
    step: &'static str,
    settings: &Settings,
    shutdown: &Shutdown,
    mut attempt: F,
) -> Result<Option<T>, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    let mut backoff = backoff_up_to(settings, settings.retry_max_delay);
    // The connect step bounds itself (`connect_timeout` for server selection); the others get
    // the operation timeout, and never less than the connect timeout.
    let bound = settings.operation_timeout.max(settings.connect_timeout);
    loop {
        let outcome = tokio::select! {
            biased;
            _ = shutdown.wait() => return Ok(None),
            outcome = tokio::time::timeout(bound, attempt()) => outcome,
        };
        let error = match outcome {
            Ok(Ok(value)) => return Ok(Some(value)),
            Ok(Err(e)) if e.is_transient() => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => StoreError::Transient {
                op: step,
                message: format!(
                    "no answer within {} (operation_timeout); is the server paused or unreachable?",
                    humantime::format_duration(bound)
                ),
            },
        };
        metrics::counter!(crate::telemetry::RETRIES, "op" => step).increment(1);
        let delay = backoff.next().unwrap_or(settings.retry_max_delay);
        tracing::warn!(%step, error = %error, retry_in = %humantime::format_duration(delay),
            "start-up step failed with a transient error; retrying");
        tracing::debug!(%step, error = %error.in_full(), "the start-up step's error in full");
        if sleep_or_shutdown(&SystemClock, delay, shutdown).await {
            return Ok(None);
        }
    }
}

/// Pauses from `retry_min_delay` up to `max` (a start-up step's retries, a parked stream's
/// re-checks), jittered so replicas restarted or parked together do not knock in step.
pub(super) fn backoff_up_to(settings: &Settings, max: Duration) -> backon::ExponentialBackoff {
    let max = max.max(Duration::from_millis(1));
    ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(settings.retry_min_delay.min(max))
        .with_max_delay(max)
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn quick() -> Settings {
        Settings {
            retry_min_delay: Duration::from_millis(1),
            retry_max_delay: Duration::from_millis(5),
            operation_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(200),
            ..Settings::default()
        }
    }

    fn transient() -> StoreError {
        StoreError::Transient {
            op: "create indexes",
            message: "connection reset".into(),
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_the_step_succeeds() {
        let (_trigger, shutdown) = Shutdown::new();
        let tries = AtomicUsize::new(0);
        let got = patiently(step::CREATE_INDEXES, &quick(), &shutdown, || async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0..=2 => Err(transient()),
                n => Ok(n),
            }
        })
        .await
        .unwrap();
        assert_eq!(got, Some(3), "three failures, then the fourth attempt");
    }

    #[tokio::test]
    async fn an_error_no_retry_mends_ends_the_start_at_once() {
        let (_trigger, shutdown) = Shutdown::new();
        let tries = AtomicUsize::new(0);
        let err = patiently(step::CONNECT, &quick(), &shutdown, || async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(StoreError::Fatal {
                op: "connect",
                message: "Authentication failed".into(),
            })
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("Authentication failed"), "{err}");
        assert_eq!(tries.load(Ordering::SeqCst), 1, "not retried");
    }

    #[tokio::test]
    async fn a_step_that_never_answers_is_a_transient_error_and_shutdown_ends_the_wait() {
        let (trigger, shutdown) = Shutdown::new();
        let tries = AtomicUsize::new(0);
        let settings = quick();
        let waiting = patiently(step::SERVER_ABILITIES, &settings, &shutdown, || {
            tries.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<StoreResult<()>>()
        });
        let stop = async {
            while tries.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            trigger.request();
        };
        let (got, ()) = tokio::join!(waiting, stop);
        assert!(matches!(got, Ok(None)), "shutdown while retrying: {got:?}");
        assert!(
            tries.load(Ordering::SeqCst) >= 2,
            "a hung attempt was abandoned and retried"
        );
    }
}
