//! Time, passed in rather than read: the worker and the reconciler ask a [`Clock`] for "now" and
//! for their pauses, so the deterministic simulation can drive both (a simulated clock whose
//! pauses only yield to the other actors) while production uses [`SystemClock`].

use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;

/// The wall clock and the pauses of the worker and reconciler.
#[async_trait]
pub trait Clock: Send + Sync {
    /// The current wall-clock time.
    fn now(&self) -> DateTime;
    /// Waits for `delay` (the simulation's clock only yields).
    async fn sleep(&self, delay: Duration);
}

/// The process clock and tokio's timer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

#[async_trait]
impl Clock for SystemClock {
    fn now(&self) -> DateTime {
        DateTime::now()
    }
    async fn sleep(&self, delay: Duration) {
        tokio::time::sleep(delay).await
    }
}
