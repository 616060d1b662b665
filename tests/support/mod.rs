//! The test-database harness shared by every integration test: one server per test binary
//! (see `counterd_testdb` for the order of preference), one fresh database per test.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use counterd::core::key::PostId;
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
    pub async fn truth(&self, post: &PostId) -> i64 {
        self.store.count_live(post).await.unwrap().as_i64()
    }

    /// `base_count + live_delta` of a post's counter (0 when absent).
    pub async fn displayed(&self, post: &PostId) -> i64 {
        self.store
            .read_counter(post)
            .await
            .unwrap()
            .map(|c| c.state.displayed().as_i64())
            .unwrap_or(0)
    }

    /// Posts whose counter differs from the truth: (post, displayed, truth).
    pub async fn mismatches(&self, posts: &[PostId]) -> Vec<(PostId, i64, i64)> {
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
    pub async fn wait_exact(&self, posts: &[PostId], within: Duration) {
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

    pub async fn insert_comment(&self, id: impl Into<Bson>, post: &PostId, created_secs: i64) {
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
