//! The bench's harness: one database per phase on the test server, reached through a counting
//! store; a worker running in this process; and the measured replay of a backlog through it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use bson::{doc, DateTime, Document, Timestamp};
use counterd::store::counting::{CountingStore, Counts};
use counterd::store::mongo::{Collections, ConnectOptions, MongoStore};
use counterd::store::Store;
use counterd::worker::{Worker, WorkerSettings, WorkerStatus};
use counterd_testdb::{ServerKind, TestServer};
use mongodb::Collection;
use serde::Serialize;
use tokio::sync::watch;

use crate::measure::{process_cpu, vm_hwm_kb};
use crate::plan::Plan;

/// The store every phase uses: MongoDB, counted.
pub type Counted = CountingStore<MongoStore>;

/// The server and a name for this run's databases.
pub struct Bench {
    /// The test server. The fake one is replaced by a fresh one for every phase after the
    /// first: its oplog never shrinks (a full run leaves millions of entries, more than its
    /// JVM's default heap holds) and its change streams slow down as the oplog grows, so every
    /// phase starts from the same empty server instead of from the previous phases' history.
    server: tokio::sync::Mutex<(TestServer, bool)>,
    uri: std::sync::Mutex<String>,
    pub run_id: String,
}

impl Bench {
    pub fn new(server: TestServer, run_id: String) -> Bench {
        Bench {
            uri: std::sync::Mutex::new(server.uri.clone()),
            server: tokio::sync::Mutex::new((server, false)),
            run_id,
        }
    }

    /// The current server's connection string.
    pub fn uri(&self) -> String {
        self.uri.lock().expect("uri lock").clone()
    }

    /// A fresh database for `phase`, with counterd's indexes (on a fresh fake server).
    pub async fn store(&self, phase: &str) -> anyhow::Result<Arc<Counted>> {
        Ok(Arc::new(CountingStore::new(self.mongo_store(phase).await?)))
    }

    /// [`Bench::store`], keeping a copy of every write made through it
    /// ([`CountingStore::recording`]).
    pub async fn recording_store(&self, phase: &str) -> anyhow::Result<Arc<Counted>> {
        Ok(Arc::new(CountingStore::recording(
            self.mongo_store(phase).await?,
        )))
    }

    async fn mongo_store(&self, phase: &str) -> anyhow::Result<MongoStore> {
        self.mongo_store_with(phase, counterd::core::schema::Schema::default())
            .await
    }

    /// [`Bench::store`] keeping the counter definitions of `schema`.
    pub async fn store_with_schema(
        &self,
        phase: &str,
        schema: counterd::core::schema::Schema,
    ) -> anyhow::Result<Arc<Counted>> {
        Ok(Arc::new(CountingStore::new(
            self.mongo_store_with(phase, schema).await?,
        )))
    }

    async fn mongo_store_with(
        &self,
        phase: &str,
        schema: counterd::core::schema::Schema,
    ) -> anyhow::Result<MongoStore> {
        self.fresh_server().await?;
        let store = connect(&self.uri(), &self.db_name(phase), schema).await?;
        store.ensure_indexes().await?;
        Ok(store)
    }

    /// On the fake server, replaces a server that a phase has used by a fresh one, with the
    /// same `_id`-index switch.
    async fn fresh_server(&self) -> anyhow::Result<()> {
        let mut guard = self.server.lock().await;
        let (server, used) = &mut *guard;
        if server.kind != ServerKind::Fake || !std::mem::replace(used, true) {
            return Ok(());
        }
        let id_index = server.fake_id_index().unwrap_or(true);
        let fresh =
            tokio::task::spawn_blocking(move || TestServer::start_fake_with_id_index(id_index))
                .await?
                .map_err(|e| anyhow!("cannot start a fresh fake server: {e}"))?;
        *self.uri.lock().expect("uri lock") = fresh.uri.clone();
        *server = fresh; // the old one is stopped
        Ok(())
    }

    pub fn db_name(&self, phase: &str) -> String {
        format!("bench_{}_{phase}", self.run_id)
    }

    /// Drops a phase's database (the benchmark leaves nothing behind on a shared server).
    pub async fn drop_db(&self, store: &Counted) {
        let _ = store.inner().database().drop().await;
    }
}

async fn connect(
    uri: &str,
    database: &str,
    schema: counterd::core::schema::Schema,
) -> anyhow::Result<MongoStore> {
    Ok(MongoStore::connect(&ConnectOptions {
        uri: uri.to_string(),
        database: database.to_string(),
        comments: "comments".into(),
        connect_timeout: Duration::from_secs(10),
        collections: Collections::default(),
        schema,
    })
    .await?)
}

/// The `comments` collection of a phase's database.
pub fn comments(store: &Counted) -> Collection<Document> {
    store.inner().database().collection("comments")
}

/// The comment the benchmark writes for entry `id` of a load: the same rows whether they go to
/// MongoDB ([`load`]) or to the in-process store ([`replay_without_io`]), so both runs classify
/// the same events.
fn comment_row(id: usize, post: i64, created: DateTime) -> Document {
    doc! {"_id": id as i64, "post_id": post, "created_at": created, "body": "benchmark comment"}
}

/// Inserts one comment per entry of `posts` with a body of `body_bytes` bytes (the memory
/// phase: what the application stores beside the fields counterd reads); returns the seconds
/// taken.
pub async fn load_with_body(
    comments: &Collection<Document>,
    posts: &[i64],
    created: DateTime,
    body_bytes: usize,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    let body = "b".repeat(body_bytes);
    // About 2 MB per insert command.
    let per_command = (2_000_000 / body_bytes.max(100)).clamp(1, 1000);
    for (c, chunk) in posts.chunks(per_command).enumerate() {
        let docs: Vec<Document> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut row = comment_row(c * per_command + i, *p, created);
                row.insert("body", body.as_str());
                row
            })
            .collect();
        comments.insert_many(docs).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Inserts one comment (one change event) per entry of `posts`, in chunks of 1 000; returns
/// the seconds taken.
pub async fn load(
    comments: &Collection<Document>,
    posts: &[i64],
    created: DateTime,
) -> anyhow::Result<f64> {
    let started = Instant::now();
    for (c, chunk) in posts.chunks(1000).enumerate() {
        let docs: Vec<Document> = chunk
            .iter()
            .enumerate()
            .map(|(i, p)| comment_row(c * 1000 + i, *p, created))
            .collect();
        comments.insert_many(docs).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// A cluster time a moment before now: a stream started there replays what follows.
pub fn just_before_now() -> Timestamp {
    Timestamp {
        time: (chrono::Utc::now().timestamp() - 1) as u32,
        increment: 0,
    }
}

/// The worker measured: counterd's defaults (batches of `plan.batch_size` while caught up,
/// growing to `max_batch_size` while behind), applying the stream from `start` (the events
/// written for the benchmark); no initial snapshot, whose scan would be measured instead.
pub fn worker_settings(plan: &Plan, start: Timestamp) -> WorkerSettings {
    WorkerSettings {
        batch_size: plan.batch_size,
        start_at: Some(start),
        snapshot: no_snapshot(),
        ..WorkerSettings::default()
    }
}

fn no_snapshot() -> counterd::snapshot::SnapshotSettings {
    counterd::snapshot::SnapshotSettings {
        initial: counterd::config::InitialSnapshot::Never,
        ..Default::default()
    }
}

/// Generous bound for a phase that processes `n` events.
pub fn phase_timeout(n: usize) -> Duration {
    Duration::from_secs(300 + n as u64 / 50)
}

/// How often a wait polls the worker's status. Its wake-ups are CPU of this process, measured
/// with the worker's (`WorkerRun::cpu_secs`): at 2 ms (before 2026-12-06) they were 500 a
/// second beside a worker that needs 20-40 µs per event; at 10 ms a run's time is still
/// measured to within 0.1 % of the shortest full-mode run.
const POLL: Duration = Duration::from_millis(10);

/// A worker running in this process.
pub struct Running {
    pub stop: watch::Sender<bool>,
    pub handle: tokio::task::JoinHandle<Result<(), String>>,
    pub status: Arc<WorkerStatus>,
}

impl Running {
    pub fn spawn<S: Store + 'static>(store: Arc<S>, settings: WorkerSettings) -> Running {
        let (stop, rx) = watch::channel(false);
        let status = Arc::new(WorkerStatus::default());
        let worker = Worker::new(store, settings, status.clone());
        let handle =
            tokio::spawn(async move { worker.run(0, rx).await.map_err(|e| e.to_string()) });
        Running {
            stop,
            handle,
            status,
        }
    }

    pub fn applied(&self) -> i64 {
        self.status.events_applied()
    }

    /// Waits until the worker's stream is open (its start pinned, any initial snapshot done
    /// or under way).
    pub async fn wait_open(&mut self, within: Duration) -> anyhow::Result<()> {
        self.wait_until(
            within,
            |s| s.is_stream_open(),
            |_| "its stream to open".into(),
        )
        .await
    }

    /// Waits until `n` events are applied.
    pub async fn wait_applied(&mut self, n: i64, within: Duration) -> anyhow::Result<()> {
        self.wait_until(
            within,
            |s| s.events_applied() >= n,
            |s| format!("{n} events ({} applied)", s.events_applied()),
        )
        .await
    }

    /// Polls the worker's status until `done` holds; fails, naming what it waited for
    /// (`waited_for`, with the progress so far), if the worker stops or `within` passes.
    async fn wait_until(
        &mut self,
        within: Duration,
        done: impl Fn(&WorkerStatus) -> bool,
        waited_for: impl Fn(&WorkerStatus) -> String,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        while !done(&self.status) {
            if self.handle.is_finished() {
                let result = (&mut self.handle).await?;
                bail!(
                    "the worker stopped while waiting for {}: {result:?}",
                    waited_for(&self.status)
                );
            }
            if Instant::now() > deadline {
                bail!("waited {within:?} for {}", waited_for(&self.status));
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    pub async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        self.handle
            .await?
            .map_err(|e| anyhow!("the worker failed: {e}"))
    }
}

/// What applying a backlog cost: wall time, this process's CPU time, and the store's calls
/// and write statements.
#[derive(Debug, Serialize)]
pub struct WorkerRun {
    pub events: usize,
    pub secs: f64,
    /// User + system CPU of this process while the worker ran (the bench's own polling of the
    /// applied count, every [`POLL`], is included; it is small against the worker's).
    pub cpu_secs: f64,
    pub counts: Counts,
}

impl WorkerRun {
    pub fn rate(&self) -> f64 {
        self.events as f64 / self.secs
    }

    pub fn cpu_us_per_event(&self) -> f64 {
        self.cpu_secs * 1e6 / self.events as f64
    }

    /// Seconds spent inside store calls (every concern; calls that overlap each count their
    /// own).
    pub fn store_secs(&self) -> f64 {
        self.counts
            .by_concern
            .values()
            .map(|t| t.micros)
            .sum::<u64>() as f64
            / 1e6
    }

    /// CPU per event outside the store's calls: over the in-process store, whose calls are
    /// synchronous CPU work (no I/O, no `.await` inside), this is counterd's own work
    /// (classification, coalescing, planning, budget, runtime) without the stand-in server's.
    pub fn own_cpu_us_per_event(&self) -> f64 {
        (self.cpu_secs - self.store_secs()).max(0.0) * 1e6 / self.events as f64
    }

    /// Store calls (each at least one round trip) per 1 000 events.
    pub fn calls_per_1000(&self) -> f64 {
        self.counts.calls() as f64 * 1000.0 / self.events as f64
    }
}

/// Runs one worker over `store` until it has applied `n` events (written before, after the
/// settings' `start_at`), and measures it.
///
/// Generic over the store so the same measurement runs on a store that does no I/O
/// ([`replay_without_io`]).
pub async fn replay_through<S: Store + 'static>(
    store: Arc<CountingStore<S>>,
    settings: WorkerSettings,
    n: usize,
) -> anyhow::Result<WorkerRun> {
    let before = store.counts();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut worker = Running::spawn(store.clone(), settings);
    worker.wait_applied(n as i64, phase_timeout(n)).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu_secs = (process_cpu() - cpu_before).as_secs_f64();
    let counts = store.counts().since(&before);
    worker.shutdown().await?;
    Ok(WorkerRun {
        events: n,
        secs,
        cpu_secs,
        counts,
    })
}

/// The worker over the in-process store (`counterd::store::memory`), which does no I/O: one
/// comment inserted per entry of `posts`, then replayed and measured like [`replay_through`].
/// Its CPU per event is the lower bound of counterd's own cost (classification, coalescing,
/// planning, the runtime), without the driver's encoding or the server.
pub async fn replay_without_io(plan: &Plan, posts: &[i64]) -> anyhow::Result<WorkerRun> {
    let now = chrono::Utc::now().timestamp();
    let memory = counterd::store::memory::MemoryStore::new(now);
    {
        let mut tables = memory.lock();
        let created = tables.now();
        for (id, post) in posts.iter().enumerate() {
            tables.insert_row(comment_row(id, *post, created));
        }
    }
    let start = Timestamp {
        time: 0,
        increment: 0,
    };
    let store = Arc::new(CountingStore::new(memory));
    replay_through(store, worker_settings(plan, start), posts.len()).await
}

/// `--child-worker URI DATABASE START_SECS EVENTS`: a bare worker that replays `EVENTS` events
/// from `START_SECS`, prints its peak RSS and exits.
pub async fn child_worker(args: &[String]) -> anyhow::Result<()> {
    let [uri, database, start, events] = args else {
        bail!("--child-worker needs URI DATABASE START_SECS EVENTS");
    };
    let store = Arc::new(connect(uri, database, counterd::core::schema::Schema::default()).await?);
    let settings = WorkerSettings {
        start_at: Some(Timestamp {
            time: start.parse()?,
            increment: 0,
        }),
        snapshot: no_snapshot(),
        ..WorkerSettings::default()
    };
    let n: i64 = events.parse()?;
    let mut worker = Running::spawn(store, settings);
    worker.wait_applied(n, phase_timeout(n as usize)).await?;
    worker.shutdown().await?;
    println!("VMHWM_KB {}", vm_hwm_kb(None).unwrap_or(0));
    Ok(())
}
