//! Reaching MongoDB at startup: a sidecar may start before its database, so an unreachable
//! server is waited for (with backoff, logged each time) rather than a reason to exit.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use crate::clock::SystemClock;
use crate::config::Settings;
use crate::shutdown::{sleep_or_shutdown, Shutdown};
use crate::store::mongo::MongoStore;
use crate::store::StoreError;

/// Connects, retrying with backoff while the server is unreachable. `None`: shutdown was
/// requested first; an error: the server answered but cannot be used (a bad URI, credentials).
pub async fn connect_patiently(
    settings: &Settings,
    shutdown: &Shutdown,
) -> Result<Option<MongoStore>, StoreError> {
    let mut backoff = ExponentialBuilder::default()
        .with_jitter()
        .with_min_delay(settings.retry_min_delay)
        .with_max_delay(settings.retry_max_delay.max(Duration::from_millis(1)))
        .without_max_times()
        .build();
    loop {
        match MongoStore::connect(&settings.into()).await {
            Ok(store) => return Ok(Some(store)),
            Err(e) if e.is_transient() => {
                metrics::counter!(crate::telemetry::RETRIES, "op" => "connect").increment(1);
                let delay = backoff.next().unwrap_or(settings.retry_max_delay);
                tracing::warn!(error = %e, retry_in = %humantime::format_duration(delay), "MongoDB unreachable");
                if sleep_or_shutdown(&SystemClock, delay, shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e),
        }
    }
}
