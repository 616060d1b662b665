//! Network faults between `counterd` and the test server, made by the fault proxy of
//! `counterd_testdb` (lost replies after the server applied a request, connections reset
//! before it saw one, latency, stalls), at each step where one can land:
//! - `startup`: connect, server abilities, index creation, lease, first checkpoint read and
//!   first stream open of `counterd run`, and the errors no retry mends (a refused login, a
//!   refused command), which stop it at once;
//! - `batch`: each step of a batch (stream read, ledger read, counter, ledger and dirty writes,
//!   the intent and the checkpoint), plus latency and a stall under load;
//! - `background`: a recount (its dirty-set read, its count, its fold) and an initial
//!   snapshot's chunk (its read, its writes) inside `counterd run`;
//! - `oneshots`: `reconcile`, `snapshot` and `replay` run by hand.
//!
//! Every test asserts that the counters end exact (the reconciler is off unless the test is
//! about it, so it cannot hide a double count), that the process recovered by itself within a
//! bound, and what `/readyz` and `counterd_retries_total` said. Each test has its own database
//! and its own proxy in front of this binary's one server; the test's own reads go around the
//! proxy, so only counterd meets the faults. Waits poll a condition with a deadline.

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/daemon.rs"]
mod daemon;

mod background;
mod batch;
mod oneshots;
mod startup;

use std::future::Future;
use std::time::{Duration, Instant};

use counterd::core::key::GroupValue;
use counterd_testdb::{FaultProxy, Target};
use daemon::Daemon;
use support::{now_secs, post, TestDb};

/// How long a recovery may take on a loaded two-core machine: a few backoffs (at most 500 ms
/// each in these tests), an operation timeout (3 s) and a lease TTL (2 s), with room to spare.
const RECOVERY: Duration = Duration::from_secs(30);

/// The reconciler off: the worker alone must keep the counters exact.
const NO_RECONCILE: (&str, &str) = ("COUNTERD_RECONCILE_INTERVAL", "1h");

/// A test's database, with a fault proxy in front of the server.
pub struct Faulty {
    pub t: TestDb,
    pub proxy: FaultProxy,
    /// Comments inserted so far (their ids are `c<n>`).
    inserted: usize,
}

impl Faulty {
    pub async fn new(test: &str) -> Faulty {
        let t = TestDb::new(test).await;
        let proxy = FaultProxy::start(&t.uri).expect("start the fault proxy");
        Faulty {
            t,
            proxy,
            inserted: 0,
        }
    }

    /// `counterd run` through the proxy.
    pub fn daemon(&self, owner: &str, extra: &[(&str, &str)]) -> Daemon {
        Daemon::start(self.proxy.uri(), &self.t.name, owner, extra)
    }

    /// `counterd run` through the proxy, waited on until it is the active worker.
    pub async fn active_daemon(&self, owner: &str, extra: &[(&str, &str)]) -> Daemon {
        let d = self.daemon(owner, extra);
        assert!(
            d.wait_role("active", RECOVERY).await,
            "counterd became active: {:?}",
            d.get("/readyz").await
        );
        d
    }

    /// Inserts `n` comments spread over `posts()` (created an hour ago: settled).
    pub async fn insert(&mut self, n: usize) {
        for _ in 0..n {
            let i = self.inserted;
            self.t
                .insert_comment(format!("c{i}"), &post(i % POSTS), now_secs() - 3600)
                .await;
            self.inserted += 1;
        }
    }

    /// Soft-deletes comment `c<i>`.
    pub async fn soft_delete(&self, i: usize) {
        use mongodb::bson::{doc, DateTime};
        self.t
            .comments
            .update_one(
                doc! {"_id": format!("c{i}")},
                doc! {"$set": {"deleted_at": DateTime::now()}},
            )
            .await
            .unwrap();
    }

    /// Waits until every post's counter equals the truth.
    pub async fn wait_exact(&self) {
        self.t.wait_exact(&posts(), RECOVERY).await;
    }

    /// Arms `arm`, then makes `writes` changes so the faulted step runs, and waits until the
    /// fault has fired (writing a little more while it has not: the step may be between
    /// batches).
    pub async fn fire(&mut self, what: &str) {
        let deadline = Instant::now() + RECOVERY;
        loop {
            self.insert(3).await;
            if self.proxy.wait_fired(Duration::from_millis(500)).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the fault ({what}) never fired: {:?}",
                self.proxy.stats()
            );
        }
    }
}

pub const POSTS: usize = 4;

pub fn posts() -> Vec<GroupValue> {
    (0..POSTS).map(post).collect()
}

/// A target: requests of `command` whose bytes contain `text`.
pub fn on(command: &str, text: &str) -> Target {
    Target::command(command).containing(text)
}

/// The sum of a metric's samples whose line starts with `prefix` (a name, or a name and the
/// start of its labels: `counterd_retries_total{op="worker"`).
pub fn sample(scrape: &str, prefix: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Retries counted by the daemon for `op` so far.
pub async fn retries(d: &Daemon, op: &str) -> f64 {
    let scrape = d.get("/metrics").await.map(|r| r.1).unwrap_or_default();
    sample(&scrape, &format!("counterd_retries_total{{op=\"{op}\""))
}

/// Waits until `/metrics` counts at least one retry of `op`.
pub async fn wait_retried(d: &Daemon, op: &str) {
    let counted = wait_until(RECOVERY, || async { retries(d, op).await >= 1.0 }).await;
    assert!(
        counted,
        "counterd_retries_total{{op=\"{op}\"}} never counted the retry:\n{}",
        d.get("/metrics").await.map(|r| r.1).unwrap_or_default()
    );
}

/// Polls `condition` until it holds (true) or `within` has passed (false).
pub async fn wait_until<F, Fut>(within: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
