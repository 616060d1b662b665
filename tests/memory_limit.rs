//! `counterd run` under a real memory limit: a cgroup the test creates (v2 where cgroup2 is
//! mounted at /sys/fs/cgroup with the memory controller, else v1's memory hierarchy), limited
//! like the shipped manifest (96 MiB), with `memory_budget` left at 0 so the budget is derived
//! from that limit. The process catches up a backlog of comments with 2 KB bodies, exactly,
//! without being killed. Where no cgroup can be created (no permission, no memory controller),
//! the test is skipped and says why.

mod support;

#[path = "support/daemon.rs"]
mod daemon;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bson::{doc, DateTime, Document};
use counterd::core::key::GroupValue;
use daemon::Daemon;
use support::TestDb;

/// The shipped manifests' memory limit (deploy/kubernetes/: the sizing line and resources).
const LIMIT: u64 = 96 * 1024 * 1024;
const EVENTS: usize = 20_000;
const POSTS: i64 = 500;

/// A memory cgroup of its own, removed when dropped.
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A child of this process's own memory cgroup, limited to `limit` bytes; `Err`: why not.
    fn create(limit: u64) -> Result<Cgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let name = format!("counterd-test-{}", std::process::id());
        let root = Path::new("/sys/fs/cgroup");
        let v2_root = root.join("cgroup.controllers");
        let (dir, v2) = if std::fs::read_to_string(&v2_root)
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
        {
            let path = own
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .ok_or("no cgroup v2 group in /proc/self/cgroup")?;
            (root.join(path.trim_start_matches('/')).join(&name), true)
        } else if root.join("memory").is_dir() {
            let path = counterd::budget::cgroup::v1_path(&own)
                .ok_or("no v1 memory group in /proc/self/cgroup")?;
            (
                root.join("memory")
                    .join(path.trim_start_matches('/'))
                    .join(&name),
                false,
            )
        } else {
            return Err("no cgroup memory controller mounted at /sys/fs/cgroup".into());
        };
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let cgroup = Cgroup { dir, v2 };
        let (file, value) = if v2 {
            ("memory.max", limit.to_string())
        } else {
            ("memory.limit_in_bytes", limit.to_string())
        };
        std::fs::write(cgroup.dir.join(file), value)
            .map_err(|e| format!("cannot limit {}: {e}", cgroup.dir.display()))?;
        if !cgroup.v2 {
            // No swap to escape to, where the kernel accounts it.
            let _ = std::fs::write(
                cgroup.dir.join("memory.memsw.limit_in_bytes"),
                limit.to_string(),
            );
        }
        Ok(cgroup)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// Times the group was OOM-killed (v2: `memory.events` oom_kill; v1: `memory.oom_control`).
    fn oom_kills(&self) -> u64 {
        let (file, key) = if self.v2 {
            ("memory.events", "oom_kill")
        } else {
            ("memory.oom_control", "oom_kill")
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
            })
            .unwrap_or(0)
    }

    /// The group's peak memory (v2: `memory.peak`, where the kernel has it; v1:
    /// `memory.max_usage_in_bytes`).
    fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its process has exited; removing it may take a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        while std::fs::remove_dir(&self.dir).is_err() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `counterd_<name>` from a /metrics body.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counterd_run_catches_up_a_backlog_under_the_manifests_memory_limit() {
    let cgroup = match Cgroup::create(LIMIT) {
        Ok(c) => c,
        Err(why) => {
            support::skip(
                "counterd_run_catches_up_a_backlog_under_the_manifests_memory_limit",
                &why,
            );
            return;
        }
    };
    let t = TestDb::new("memlimit").await;
    let start = chrono::Utc::now().timestamp() - 1;
    let body = "b".repeat(2048);
    let created = DateTime::now();
    for chunk in 0..EVENTS / 500 {
        let docs: Vec<Document> = (0..500)
            .map(|i| {
                let id = (chunk * 500 + i) as i64;
                doc! {"_id": id, "post_id": id % POSTS, "created_at": created, "body": &body}
            })
            .collect();
        t.comments.insert_many(docs).await.unwrap();
    }
    // A few soft deletes and moves in the backlog too.
    for id in (0..EVENTS as i64).step_by(97) {
        t.comments
            .update_one(doc! {"_id": id}, doc! {"$set": {"deleted_at": created}})
            .await
            .unwrap();
    }
    for id in (1..EVENTS as i64).step_by(89) {
        t.comments
            .update_one(
                doc! {"_id": id},
                doc! {"$set": {"post_id": (id + 1) % POSTS}},
            )
            .await
            .unwrap();
    }
    let start_at = chrono::DateTime::from_timestamp(start, 0)
        .unwrap()
        .to_rfc3339();
    let daemon = Daemon::start_in_cgroup(
        &t.uri,
        &t.name,
        "memlimit",
        &[
            ("COUNTERD_START_AT", start_at.as_str()),
            ("COUNTERD_INITIAL_SNAPSHOT", "never"),
            ("COUNTERD_MEMORY_BUDGET", "0"),
            // Batches of a few thousand events on a loaded machine: the harness's 3 s would
            // abandon and retry them.
            ("COUNTERD_OPERATION_TIMEOUT", "60s"),
        ],
        &cgroup.procs(),
    );
    let total = {
        let updates = EVENTS.div_ceil(97) + (EVENTS - 1).div_ceil(89);
        (EVENTS + updates) as f64
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut budget = None;
    loop {
        let body = daemon
            .get("/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default();
        budget = metric(&body, "counterd_memory_budget_bytes").or(budget);
        let applied = metric(&body, "counterd_events_applied_total").unwrap_or(0.0);
        if applied >= total {
            break;
        }
        assert!(
            cgroup.oom_kills() == 0,
            "counterd run was OOM-killed under {LIMIT} bytes after {applied} events"
        );
        assert!(
            Instant::now() < deadline,
            "{applied} of {total} events applied in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The budget came from the cgroup's limit: (96 MiB - 40 MiB) / 2.
    assert_eq!(
        budget,
        Some(counterd::core::cost::budget_for_limit(Some(LIMIT), 1) as f64),
        "memory_budget = 0 derives the budget from the container's limit"
    );
    let posts: Vec<GroupValue> = (0..POSTS).map(GroupValue::Int).collect();
    t.wait_exact(&posts, Duration::from_secs(60)).await;
    assert_eq!(cgroup.oom_kills(), 0, "never OOM-killed");
    eprintln!(
        "counterd run caught up {total} events under a {} MiB limit; the group's peak: {:?} MiB",
        LIMIT >> 20,
        cgroup.peak().map(|p| p >> 20)
    );
    let code = daemon.terminate();
    assert_eq!(code, Some(0), "a clean stop after the catch-up");
}
