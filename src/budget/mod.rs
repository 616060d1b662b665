//! The memory budget: one number of bytes that every buffer of the process draws from.
//!
//! A sidecar lives under a container memory limit, and the day its buffers are fullest, catching
//! up after an outage, is the day it matters most that they fit: a worker that reads as much as
//! its batch size allows holds memory in proportion to the backlog's density of events, and is
//! OOM-killed, restarted from the same checkpoint and killed again. So what is held per event or
//! row is *charged* here before it is held, and a reader that finds the budget spent reads less
//! (a batch is cut by bytes as well as by count) or waits until a batch is written
//! (backpressure). Nothing is dropped and nothing is counted twice: what is not read now is read
//! later from the same stream.
//!
//! What a buffer costs is estimated, not measured per allocation: `cost` holds the pure
//! arithmetic (an event's charge from its encoded size, a snapshot row's, the budget derived
//! from a container's limit) with the constants the benchmark calibrated; `cgroup` reads the
//! container's limit. [`Budget`] is the shared account, [`Grant`] what one holder holds.
//!
//! One rule keeps it free of deadlock: *a task waits for budget only while it holds none*. A
//! holder always gets on without waiting (it writes its batch, which releases its grant), so a
//! waiter is never waiting for another waiter. A read made while holding (the read ahead, a
//! read that tops up a partial batch, a snapshot chunk between two batches) takes what is free
//! now, possibly nothing, and is cut to it.

pub mod cgroup;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::telemetry as m;

/// The process's memory budget: bytes that buffers hold, charged before they are held.
#[derive(Clone, Debug)]
pub struct Budget {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    total: usize,
    /// One permit per byte (capped at `Semaphore::MAX_PERMITS`, far above any budget).
    free: Semaphore,
    /// Whether the gauges are this budget's (the process's own; a budget made for a tool or
    /// a test is not exported).
    exported: bool,
    /// Tasks waiting in [`Budget::take_at_least`] now.
    waiting: AtomicUsize,
    /// Bytes held beyond the budget: one item larger than everything free (see
    /// [`Budget::take_at_least`]), so that a single oversized event never stalls the stream.
    overdraft: AtomicUsize,
}

impl Budget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Budget {
        Budget::build(total, false)
    }

    /// The process's budget of `total` bytes, exported as the gauges
    /// `counterd_memory_budget_bytes` and `counterd_memory_in_use_bytes`.
    pub fn exported(total: usize) -> Budget {
        let budget = Budget::build(total, true);
        metrics::gauge!(m::MEMORY_BUDGET).set(budget.total() as f64);
        budget.report();
        budget
    }

    fn build(total: usize, exported: bool) -> Budget {
        let total = total.min(u32::MAX as usize);
        Budget {
            inner: Arc::new(Inner {
                total,
                free: Semaphore::new(total),
                exported,
                waiting: AtomicUsize::new(0),
                overdraft: AtomicUsize::new(0),
            }),
        }
    }

    /// A budget so large that it never limits anything (tests and tools that do not care).
    pub fn unlimited() -> Budget {
        Budget::new(u32::MAX as usize)
    }

    pub fn total(&self) -> usize {
        self.inner.total
    }

    /// Bytes held now (the overdraft included).
    pub fn in_use(&self) -> usize {
        self.inner.total - self.inner.free.available_permits()
            + self.inner.overdraft.load(Ordering::Relaxed)
    }

    /// Tasks waiting for room now (backpressure; the simulation's statistics).
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Relaxed)
    }

    /// Bytes free now.
    pub fn free(&self) -> usize {
        self.inner.free.available_permits()
    }

    fn report(&self) {
        if self.inner.exported {
            metrics::gauge!(m::MEMORY_IN_USE).set(self.in_use() as f64);
        }
    }

    /// Holds `bytes` beyond the budget, without waiting: what a read that had to return one
    /// event larger than its grant holds above it.
    pub fn overdraw(&self, bytes: usize) -> Grant {
        self.inner.overdraft.fetch_add(bytes, Ordering::Relaxed);
        self.report();
        self.grant(0, bytes)
    }

    /// An empty grant, to merge others into.
    pub fn none(&self) -> Grant {
        self.grant(0, 0)
    }

    /// A grant of bytes already taken: `permits` from the budget, `overdraft` beyond it.
    fn grant(&self, permits: usize, overdraft: usize) -> Grant {
        Grant {
            budget: self.clone(),
            permits,
            overdraft,
        }
    }

    /// Takes up to `want` bytes of what is free now, without waiting (for a holder: see the
    /// module doc). The grant may be empty.
    pub fn take_free(&self, want: usize) -> Grant {
        loop {
            let n = want.min(self.free()).min(u32::MAX as usize);
            if n == 0 {
                return self.none();
            }
            if let Ok(permits) = self.inner.free.try_acquire_many(n as u32) {
                permits.forget();
                self.report();
                return self.grant(n, 0);
            }
        }
    }

    /// Takes room for a read by a task that holds `held` (what it has read and not yet
    /// written): holding nothing, at least `min` and up to `want` bytes, waiting for `min`
    /// ([`Budget::take_at_least`]); holding anything, up to `want` of what is free now, possibly
    /// nothing, without waiting ([`Budget::take_free`]). The module's one rule, decided from
    /// the grant itself: a task that waited while holding events could wait for room that
    /// only its own write would free (another task's wait, queued first, takes every byte
    /// given back meanwhile), and then neither ever gets on.
    pub async fn take_for(&self, held: &Grant, min: usize, want: usize) -> Grant {
        if held.bytes() > 0 {
            self.take_free(want)
        } else {
            self.take_at_least(min, want).await
        }
    }

    /// Takes at least `min` bytes (waiting until they are free) and up to `want` of what is
    /// free then: for a task that holds nothing. A `min` larger than the whole budget waits
    /// for the whole budget and overdraws the rest, so that one item larger than the budget
    /// is still read (at start, a budget too small for one event is refused as configuration).
    pub async fn take_at_least(&self, min: usize, want: usize) -> Grant {
        let from_budget = min.min(self.inner.total);
        let permits = match self.inner.free.try_acquire_many(from_budget as u32) {
            Ok(permits) => permits,
            Err(_) => {
                let _waiting = Waiting::enter(&self.inner.waiting);
                self.inner
                    .free
                    .acquire_many(from_budget as u32)
                    .await
                    .expect("the budget's semaphore is never closed")
            }
        };
        permits.forget();
        let overdraft = min - from_budget;
        self.inner.overdraft.fetch_add(overdraft, Ordering::Relaxed);
        let mut grant = self.grant(from_budget, overdraft);
        grant.merge(self.take_free(want.saturating_sub(min)));
        self.report();
        grant
    }
}

/// Counts a waiter for as long as it waits (also when its wait is dropped midway).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn enter(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Bytes one holder holds, given back when dropped.
#[derive(Debug)]
pub struct Grant {
    budget: Budget,
    permits: usize,
    overdraft: usize,
}

impl Grant {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permits + self.overdraft
    }

    /// Adds `other`'s bytes to this grant.
    pub fn merge(&mut self, mut other: Grant) {
        self.permits += std::mem::take(&mut other.permits);
        self.overdraft += std::mem::take(&mut other.overdraft);
    }

    /// Splits `bytes` (at most all of them) off into a grant of their own.
    pub fn split(&mut self, bytes: usize) -> Grant {
        let from_overdraft = bytes.min(self.overdraft);
        let from_permits = (bytes - from_overdraft).min(self.permits);
        self.overdraft -= from_overdraft;
        self.permits -= from_permits;
        self.budget.grant(from_permits, from_overdraft)
    }

    /// Gives back everything above `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        if self.bytes() > bytes {
            drop(self.split(self.bytes() - bytes));
        }
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.permits == 0 && self.overdraft == 0 {
            return;
        }
        let inner = &self.budget.inner;
        inner.overdraft.fetch_sub(self.overdraft, Ordering::Relaxed);
        inner.free.add_permits(self.permits);
        self.budget.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn grants_are_given_back_when_dropped_split_or_shrunk() {
        let budget = Budget::new(1000);
        let mut a = budget.take_free(600);
        assert_eq!((a.bytes(), budget.in_use(), budget.free()), (600, 600, 400));
        let b = budget.take_free(600);
        assert_eq!(b.bytes(), 400, "only what is free");
        assert_eq!(
            budget.take_free(1).bytes(),
            0,
            "nothing free: an empty grant"
        );
        let part = a.split(100);
        assert_eq!((a.bytes(), part.bytes()), (500, 100));
        drop(part);
        assert_eq!(budget.free(), 100);
        a.shrink_to(50);
        assert_eq!(budget.free(), 550);
        drop((a, b));
        assert_eq!((budget.in_use(), budget.free()), (0, 1000));
    }

    #[tokio::test]
    async fn a_taker_holding_nothing_waits_until_its_minimum_is_free() {
        let budget = Budget::new(1000);
        let held = budget.take_free(900);
        let waiter = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.take_at_least(200, 800).await.bytes() })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "100 free, 200 needed: it waits");
        assert_eq!(budget.waiting(), 1);
        drop(held);
        assert_eq!(waiter.await.unwrap(), 800, "then takes up to what it wants");
        assert_eq!(budget.in_use(), 0);
    }

    /// Seed 52 of the simulation's transactions + pre-images variant (two partitions, one
    /// budget): a worker holding a read ahead (a transaction taken whole, so over its grant)
    /// asked for room for a snapshot chunk *waiting*, behind the other partition's wait for
    /// its reply reserve; that wait needed the bytes the first worker would give back only
    /// once it wrote what it held. Neither got on until the real clock's timeouts.
    #[tokio::test]
    async fn a_taker_holding_something_never_waits() {
        use futures::FutureExt;
        let budget = Budget::new(1000);
        let held = budget.take_free(900);
        // Another task waits for more than is free, and is given every byte freed meanwhile.
        let other = {
            let budget = budget.clone();
            tokio::spawn(async move { budget.take_at_least(500, 500).await.bytes() })
        };
        tokio::task::yield_now().await;
        assert_eq!((budget.waiting(), budget.free()), (1, 0));
        // Holding something: what is free now (nothing), at once.
        let got = budget.take_for(&held, 10, 100).now_or_never();
        assert_eq!(got.map(|g| g.bytes()), Some(0), "it must not wait");
        // Its write gives back what it held; the other task gets on.
        drop(held);
        assert_eq!(other.await.unwrap(), 500);
        // Holding nothing: it waits for its minimum, then takes up to what it wants.
        let none = budget.none();
        let mut taking = Box::pin(budget.take_for(&none, 10, 100));
        let blocker = budget.take_free(995);
        assert!(
            futures::poll!(taking.as_mut()).is_pending(),
            "5 free, 10 needed: it waits"
        );
        drop(blocker);
        assert_eq!(taking.await.bytes(), 100);
    }

    #[tokio::test]
    async fn one_item_larger_than_the_budget_overdraws_and_gives_it_back() {
        let budget = Budget::new(1000);
        let mut grant = budget.take_at_least(1500, 1500).await;
        assert_eq!((grant.bytes(), budget.in_use()), (1500, 1500));
        let part = grant.split(700);
        assert_eq!(part.bytes(), 700);
        drop(part);
        assert_eq!(budget.in_use(), 800);
        drop(grant);
        assert_eq!((budget.in_use(), budget.free()), (0, 1000));
    }
}
