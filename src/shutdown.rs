//! Asking long-running tasks to stop: a [`ShutdownTrigger`] requests it once, every clone of
//! its [`Shutdown`] sees it. The worker, the reconcile loop, the lease and the HTTP endpoints
//! check it between steps and in their pauses ([`sleep_or_shutdown`]), so a stop never cuts a
//! write in half.

use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;

/// The requesting side (clones share it). Dropping every clone ends every listener's [`Shutdown::wait`] too (nobody is
/// left to ask), though [`Shutdown::requested`] stays false.
#[derive(Clone, Debug)]
pub struct ShutdownTrigger(watch::Sender<bool>);

/// The listening side, cheap to clone: one per task that must stop.
#[derive(Clone, Debug)]
pub struct Shutdown(watch::Receiver<bool>);

impl ShutdownTrigger {
    /// Asks every [`Shutdown`] of this pair to stop (idempotent).
    pub fn request(&self) {
        self.0.send_replace(true);
    }
}

impl Shutdown {
    /// A trigger and its first listener.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger(tx), Shutdown(rx))
    }

    /// Whether a stop was requested.
    pub fn requested(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until a stop is requested or the trigger is gone.
    pub async fn wait(&self) {
        let _ = self.0.clone().wait_for(|stop| *stop).await;
    }

    /// A stop of its own that this one also requests: for a supervisor that stops its tasks on
    /// the first fatal error of any of them as well as when asked from outside. The forwarding
    /// ends when the returned [`Linked`] is dropped.
    pub fn linked(&self) -> (ShutdownTrigger, Shutdown, Linked) {
        let (trigger, listener) = Shutdown::new();
        let outside = self.clone();
        let forward = tokio::spawn({
            let trigger = trigger.clone();
            async move {
                outside.wait().await;
                trigger.request();
            }
        });
        (trigger, listener, Linked(forward.abort_handle()))
    }
}

/// Keeps a [`Shutdown::linked`] stop listening to the outside one; dropping it stops that.
#[derive(Debug)]
pub struct Linked(tokio::task::AbortHandle);

impl Drop for Linked {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A bare `watch` receiver (true: stop), as the tests and the benchmark still hand one over.
impl From<watch::Receiver<bool>> for Shutdown {
    fn from(rx: watch::Receiver<bool>) -> Self {
        Shutdown(rx)
    }
}

/// Sleeps on `clock`, or returns true early when a stop is requested.
pub async fn sleep_or_shutdown(clock: &dyn Clock, delay: Duration, shutdown: &Shutdown) -> bool {
    if shutdown.requested() {
        return true;
    }
    tokio::select! {
        _ = clock.sleep(delay) => false,
        _ = shutdown.wait() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_linked_stop_hears_the_outside_one_until_dropped_and_its_own_trigger_always() {
        let (outside, listening) = Shutdown::new();
        let (own, linked, guard) = listening.linked();
        own.request();
        assert!(
            linked.requested() && !listening.requested(),
            "its own request stays inside"
        );

        let (_, linked, guard2) = listening.linked();
        outside.request();
        linked.wait().await;
        assert!(linked.requested());
        drop((guard, guard2));

        let (outside, listening) = Shutdown::new();
        let (_, linked, guard) = listening.linked();
        drop(guard);
        tokio::task::yield_now().await;
        outside.request();
        tokio::task::yield_now().await;
        assert!(!linked.requested(), "dropped: no longer forwarded");
    }

    #[tokio::test]
    async fn a_request_reaches_every_listener_and_ends_their_pauses() {
        let (trigger, shutdown) = Shutdown::new();
        let other = shutdown.clone();
        assert!(!shutdown.requested());
        let clock = crate::clock::SystemClock;
        let pause = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { sleep_or_shutdown(&clock, Duration::from_secs(3600), &shutdown).await }
        });
        trigger.request();
        assert!(pause.await.unwrap(), "the pause ended early");
        assert!(shutdown.requested() && other.requested());
        other.wait().await;
    }
}
