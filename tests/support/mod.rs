//! The test-database harness shared by every integration test: one server per test binary
//! (see `counterd_testdb` for the order of preference), one fresh database per test.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use counterd::core::key::GroupValue;
use counterd::store::counting::CountingStore;
use counterd::store::mongo::{ConnectOptions, MongoStore};
use counterd::store::prelude::*;
use counterd::store::ServerAbilities;
use counterd::worker::{Worker, WorkerSettings, WorkerStatus};
use counterd_testdb::TestServer;
use mongodb::bson::{doc, Bson, Document};
use mongodb::{Collection, Database};
use tokio::sync::watch;

static SERVER: OnceLock<TestServer> = OnceLock::new();
static ABILITIES: OnceLock<ServerAbilities> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

/// The server of this test binary, started on first use.
pub fn server() -> &'static TestServer {
    SERVER.get_or_init(|| TestServer::start().unwrap_or_else(|e| panic!("no test database: {e}")))
}

/// One test's own database on the shared server.
pub struct TestDb {
    pub name: String,
    pub uri: String,
    pub store: Arc<MongoStore>,
    pub db: Database,
    pub comments: Collection<Document>,
    pub abilities: ServerAbilities,
    /// The application schema this test's rows use.
    pub schema: counterd::core::schema::Schema,
}

impl TestDb {
    pub async fn new(test: &str) -> TestDb {
        Self::with_schema(test, counterd::core::schema::Schema::default()).await
    }

    /// A test database whose comments use `schema`'s field names and soft-delete rule.
    pub async fn with_schema(test: &str, schema: counterd::core::schema::Schema) -> TestDb {
        Self::on_server(server(), test, schema).await
    }

    /// A test database on `server` instead of this binary's shared one (for tests that compare
    /// servers). The abilities are still the ones detected first in this binary.
    pub async fn on_server(
        server: &TestServer,
        test: &str,
        schema: counterd::core::schema::Schema,
    ) -> TestDb {
        let name = format!(
            "t{}_{}_{}",
            std::process::id() % 100_000,
            NEXT_DB.fetch_add(1, Ordering::SeqCst),
            test.chars()
                .filter(|c| c.is_ascii_alphanumeric())
                .take(30)
                .collect::<String>()
        );
        let store = MongoStore::connect(&ConnectOptions {
            uri: server.uri.clone(),
            database: name.clone(),
            comments: "comments".into(),
            connect_timeout: Duration::from_secs(10),
            collections: counterd::store::mongo::Collections::default(),
            schema: schema.clone(),
        })
        .await
        .expect("connect to the test database");
        store.ensure_indexes().await.expect("indexes");
        let abilities = match ABILITIES.get() {
            Some(a) => a.clone(),
            None => {
                let a = store.abilities().await.expect("abilities");
                eprintln!("test database abilities: {a:?}");
                ABILITIES.get_or_init(|| a).clone()
            }
        };
        let db = store.database().clone();
        let comments = db.collection("comments");
        // Create the collection so a change stream can be opened on it at once.
        comments
            .insert_one(doc! {"_id": "seed", "note": "not a comment"})
            .await
            .unwrap();
        comments.delete_one(doc! {"_id": "seed"}).await.unwrap();
        TestDb {
            uri: server.uri.clone(),
            name,
            store: Arc::new(store),
            db,
            comments,
            abilities,
            schema,
        }
    }

    /// True count of live rows per post, straight from `comments`.
    pub async fn truth(&self, post: &GroupValue) -> i64 {
        self.store.count_live(post).await.unwrap().as_i64()
    }

    /// `base_count + live_delta` of a post's counter (0 when absent).
    pub async fn displayed(&self, post: &GroupValue) -> i64 {
        self.store
            .read_counter(post)
            .await
            .unwrap()
            .map(|c| c.state.displayed().as_i64())
            .unwrap_or(0)
    }

    /// Posts whose counter differs from the truth: (post, displayed, truth).
    pub async fn mismatches(&self, posts: &[GroupValue]) -> Vec<(GroupValue, i64, i64)> {
        let mut out = Vec::new();
        for p in posts {
            let (d, t) = counterd::store::displayed_and_truth(self.store.as_ref(), p)
                .await
                .unwrap();
            if d.differs(t) {
                out.push((p.clone(), d.as_i64(), t.as_i64()));
            }
        }
        out
    }

    /// Waits until every post's counter equals the truth *and* the batch that made it so has
    /// landed whole, or panics with the mismatches.
    ///
    /// A batch's counters, ledger entries and dirty marks are written side by side and the
    /// checkpoint after all three, so a counter can be exact while its post's dirty mark is
    /// still on the wire. Reading the counters first and then finding no batch in flight (no
    /// checkpoint with a `pending` intent) proves the batch that made them exact is complete:
    /// its intent was recorded before its counter writes and is cleared only after its marks.
    pub async fn wait_exact(&self, posts: &[GroupValue], within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let bad = self.mismatches(posts).await;
            let in_flight = self.batches_in_flight().await;
            if bad.is_empty() && in_flight == 0 {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "counters not exact and settled after {within:?}: (post, displayed, truth) {bad:?}, batches in flight: {in_flight}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Streams (of any partition) with a batch whose intent is recorded and whose writes may
    /// not all have landed.
    pub async fn batches_in_flight(&self) -> u64 {
        self.db
            .collection::<Document>("counterd_checkpoints")
            .count_documents(doc! {"pending": {"$exists": true, "$ne": null}})
            .await
            .unwrap()
    }

    /// Waits until the worker of stream `comments` has checkpointed everything it applied and
    /// found the stream drained after it (no batch left in flight), so that stopping it now
    /// leaves nothing pending: a later one-shot command sees a quiet stream.
    pub async fn wait_drained(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let c = self.store.load_checkpoint("comments").await.unwrap();
            if let Some(c) = c {
                if c.pending.is_none() && c.caught_up_at.is_some() && c.caught_up_at >= c.token_time
                {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the worker did not drain within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the worker of stream `comments` has applied every write acknowledged before
    /// this call: see [`caught_up_on`].
    pub async fn wait_caught_up(&self, within: Duration) {
        caught_up_on(&self.store, "comments", within).await
    }

    /// `counterd` against this test's database: see [`counterd_at`].
    pub fn counterd(&self) -> std::process::Command {
        counterd_at(&self.uri, &self.name)
    }

    /// A one-shot `counterd` command against this test's database, with the settings file
    /// `config` (`COUNTERD_CONFIG`).
    pub fn counterd_with(&self, config: &str, args: &[&str]) -> std::process::Output {
        self.counterd()
            .args(args)
            .env("COUNTERD_CONFIG", config)
            .env("COUNTERD_CONNECT_TIMEOUT", "5s")
            .env("COUNTERD_LOG_LEVEL", "warn")
            .output()
            .unwrap()
    }

    pub fn worker_settings(&self) -> WorkerSettings {
        WorkerSettings {
            schema: self.schema.clone(),
            idle_interval: Duration::from_millis(30),
            max_batch_wait: Duration::from_millis(100),
            max_await: Duration::from_millis(100),
            retry_min_delay: Duration::from_millis(50),
            retry_max_delay: Duration::from_millis(500),
            ..WorkerSettings::default()
        }
    }

    /// This test's store, counted (calls and write statements), for tests that assert what
    /// the worker or the reconciler issued: hand it to [`TestDb::spawn_worker_on`].
    pub fn counted(&self) -> Arc<CountingStore<MongoStore>> {
        Arc::new(CountingStore::new(self.store.as_ref().clone()))
    }

    /// Starts a worker in the background and waits (up to 20 s) until its change stream is open
    /// or it has stopped, so that writes made next are seen even on a loaded machine.
    pub async fn spawn_worker(&self, settings: WorkerSettings) -> RunningWorker {
        self.spawn_worker_on(self.store.clone(), settings).await
    }

    /// [`TestDb::spawn_worker`] over another store (this test's, counted).
    pub async fn spawn_worker_on<S: Store + 'static>(
        &self,
        store: Arc<S>,
        settings: WorkerSettings,
    ) -> RunningWorker {
        let (stop, rx) = watch::channel(false);
        let status = Arc::new(WorkerStatus::default());
        let worker = Worker::new(store, settings, status.clone());
        let handle =
            tokio::spawn(async move { worker.run(0, rx).await.map_err(|e| e.to_string()) });
        let deadline = Instant::now() + Duration::from_secs(20);
        while !status.is_stream_open() && !handle.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the worker neither opened its stream nor stopped within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        RunningWorker {
            stop,
            handle,
            status,
        }
    }

    pub async fn insert_comment(&self, id: impl Into<Bson>, post: &GroupValue, created_secs: i64) {
        self.comments
            .insert_one(doc! {"_id": id.into(), "post_id": post.to_bson(), "created_at": mongodb::bson::DateTime::from_millis(created_secs * 1000), "body": "hi"})
            .await
            .unwrap();
    }

    /// Waits until the worker has applied `n` events in all.
    pub async fn wait_applied(&self, worker: &RunningWorker, n: i64, within: Duration) {
        let deadline = Instant::now() + within;
        while worker.status.events_applied() < n {
            assert!(
                Instant::now() < deadline,
                "worker applied {} of {n} events within {within:?}",
                worker.status.events_applied()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub struct RunningWorker {
    pub stop: watch::Sender<bool>,
    pub handle: tokio::task::JoinHandle<Result<(), String>>,
    pub status: Arc<WorkerStatus>,
}

impl RunningWorker {
    pub async fn shutdown(self) -> Result<(), String> {
        let _ = self.stop.send(true);
        self.handle.await.expect("worker task")
    }
}

/// Waits until the worker of `stream` (of the source `store` reads) has applied every write
/// acknowledged before this call: the stream was found drained at a position after them and no
/// batch is in flight. ([`TestDb::wait_drained`] waits for the last event the worker read
/// instead, for tests that stop it next.)
pub async fn caught_up_on(store: &MongoStore, stream: &str, within: Duration) {
    let after = store.read_position().await.unwrap().upper;
    let deadline = Instant::now() + within;
    loop {
        let c = store.load_checkpoint(stream).await.unwrap();
        if c.is_some_and(|c| c.pending.is_none() && c.caught_up_at.is_some_and(|at| at >= after)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the worker of {stream} did not catch up within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes the settings `text` (`[[counters]]`, `[[sources]]`, ...) to `counterd.toml` in `dir`;
/// its path, for `COUNTERD_CONFIG`.
pub fn settings_file(dir: &tempfile::TempDir, text: &str) -> String {
    let path = dir.path().join("counterd.toml");
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// The counter definitions of the settings `text`, as the schema of a test's own store (whose
/// views then count their truth).
pub fn schema_of(text: &str) -> counterd::core::schema::Schema {
    let settings: counterd::config::Settings = toml::from_str(text).unwrap();
    counterd::core::schema::Schema::default()
        .with_more(settings.definitions().unwrap().extra().to_vec())
}

/// The environment of a `counterd run` whose folds follow within seconds (one-second buckets, a
/// settle time of a second, a reconcile pass every 500 ms) and whose background sweep is off
/// (only dirty groups are folded); with the settings file `config`, if any.
pub fn quick_folds(config: Option<&str>) -> Vec<(&str, &str)> {
    let mut env = vec![
        ("COUNTERD_BUCKET_WIDTH", "1s"),
        ("COUNTERD_SETTLE_TIME", "1s"),
        ("COUNTERD_RECONCILE_INTERVAL", "500ms"),
        ("COUNTERD_BACKGROUND_SWEEP_PASS", "0s"),
    ];
    if let Some(path) = config {
        env.push(("COUNTERD_CONFIG", path));
    }
    env
}

/// The binary under test, against `database` on `uri`, without a settings file from the
/// caller's environment: the start of every one-shot command a test runs (it adds its
/// arguments and settings).
pub fn counterd_at(uri: &str, database: &str) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_counterd"));
    command
        .env("COUNTERD_MONGODB_URI", uri)
        .env("COUNTERD_DATABASE", database)
        .env_remove("COUNTERD_CONFIG");
    command
}

/// Polls `check` every 100 ms until it holds, or panics naming `what` once `within` has passed.
pub async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What a one-shot command printed: its standard output, then its standard error.
pub fn output_text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `secs` (Unix time) as the RFC 3339 time the commands take and print, in whole seconds.
pub fn rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .unwrap()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The tests' posts: `post-0`, `post-1`, ... (string ids, as the pages show them).
pub fn post(i: usize) -> GroupValue {
    GroupValue::Str(format!("post-{i}"))
}

/// Prints why a test is skipped (so a skip is never silent).
pub fn skip(test: &str, reason: &str) {
    eprintln!("SKIPPED {test}: {reason}");
}

/// Waits until the wall clock (which the fake server's cluster time follows, in whole seconds)
/// is in a later second than now: a stream started after this sees none of the writes made
/// before it, even on a server whose "start now" includes the current second's events.
pub async fn next_second() {
    let now = now_secs();
    while now_secs() <= now {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn now_secs() -> i64 {
    chrono::Utc::now().timestamp()
}
