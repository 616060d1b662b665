//! The store over MongoDB: the only file that builds MongoDB commands.
//!
//! Everything here is a plain conditional update (`filter` + `$inc`/`$set`/`$unset`/`$max`):
//! no transactions, no pipeline updates, so it runs on every MongoDB-compatible server,
//! including the fake one the tests fall back to.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{self, doc, Bson, DateTime, Document, Timestamp};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};
use mongodb::options::{
    ClientOptions, FullDocumentBeforeChangeType, FullDocumentType, ReadPreference,
    SelectionCriteria,
};
use mongodb::{Client, Collection, Database};

use super::*;
use crate::batch::{CounterDelta, DirtyMark, LedgerUpdate};
use crate::event::{CommentId, PostId, Row, Token};
use crate::schema::{Schema, SoftDelete};

/// Field names of counterd's own ledger and pending-batch documents (not the application's:
/// those come from the [`Schema`]).
const LEDGER_POST: &str = "post_id";
const LEDGER_CREATED: &str = "created_at";
use crate::fold::{CounterState, Fold};

/// The names of counterd's own collections: a prefix (default `counterd_`) for its bookkeeping,
/// and the counters collection that readers query (default `comment_counters`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collections {
    pub counters: String,
    pub ledger: String,
    pub dirty: String,
    pub checkpoints: String,
    pub leases: String,
    pub runs: String,
    pub sweeps: String,
}

impl Collections {
    pub fn new(prefix: &str, counters: &str) -> Collections {
        Collections {
            counters: counters.to_string(),
            ledger: format!("{prefix}comment_state"),
            dirty: format!("{prefix}dirty"),
            checkpoints: format!("{prefix}checkpoints"),
            leases: format!("{prefix}leases"),
            runs: format!("{prefix}reconcile_runs"),
            sweeps: format!("{prefix}sweeps"),
        }
    }

    /// The ledger collection of a stream: partitions (`<base>/pNofM`) keep their own.
    fn ledger_of(&self, stream: &str) -> String {
        match stream.split_once('/') {
            Some((_, partition)) => format!("{}_{partition}", self.ledger),
            None => self.ledger.clone(),
        }
    }
}

impl Default for Collections {
    fn default() -> Self {
        Collections::new("counterd_", "comment_counters")
    }
}

/// Server error codes for "the resume point is no longer in the oplog".
const HISTORY_LOST_CODES: [i32; 3] = [286, 280, 260];
/// Server error codes worth a retry: no primary, shutting down, interrupted, network.
const TRANSIENT_CODES: [i32; 17] = [
    6, 7, 89, 91, 189, 262, 9001, 10107, 11600, 11601, 11602, 13435, 13436, 63, 150, 134, 133,
];
/// Duplicate key: a guarded upsert whose guard failed on an existing document.
const DUPLICATE_KEY: i32 = 11000;
/// A snapshot read older than the server keeps history for (`SnapshotTooOld`,
/// `SnapshotUnavailable`, `StaleClusterTime`-like refusals): fall back to the quiet window.
const SNAPSHOT_GONE: [i32; 3] = [239, 246, 209];

/// How to reach MongoDB.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub uri: String,
    pub database: String,
    pub comments: String,
    /// How long to look for a reachable server before giving up.
    pub connect_timeout: Duration,
    /// counterd's own collections.
    pub collections: Collections,
    /// The application's field names and soft-delete rule.
    pub schema: Schema,
}

/// Operations issued through one store, for tests and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Counter write statements (one per post per batch).
    pub counter_statements: u64,
    /// Recount queries against `comments`.
    pub count_queries: u64,
    /// Ledger write statements.
    pub ledger_statements: u64,
}

#[derive(Default)]
struct OpCounters {
    counter_statements: AtomicU64,
    count_queries: AtomicU64,
    ledger_statements: AtomicU64,
}

/// The MongoDB implementation of [`Store`].
#[derive(Clone)]
pub struct MongoStore {
    ops: Arc<OpCounters>,
    /// Whether snapshot reads at a cluster time really work here (probed once, on first use).
    snapshot_reads: Arc<tokio::sync::OnceCell<bool>>,
    db: Database,
    comments: Collection<Document>,
    names: Collections,
    schema: Schema,
    /// Host list for error messages (never the credentials).
    hosts: String,
}

impl MongoStore {
    /// Connects and checks that the server answers, with an error that names the host, what
    /// failed and what to check.
    pub async fn connect(options: &ConnectOptions) -> StoreResult<MongoStore> {
        let mut client_options =
            ClientOptions::parse(&options.uri)
                .await
                .map_err(|e| StoreError::Fatal {
                    op: "parse the MongoDB URI",
                    message: format!(
                        "{e} (check `mongodb_uri`: mongodb://[user:pass@]host:port/?options)"
                    ),
                })?;
        client_options.server_selection_timeout = Some(options.connect_timeout);
        client_options.connect_timeout = Some(options.connect_timeout);
        client_options.app_name = Some("counterd".to_string());
        // MongoDB command latency by command, for /metrics.
        client_options.command_event_handler = Some(mongodb::event::EventHandler::callback(
            |event: mongodb::event::command::CommandEvent| {
                use mongodb::event::command::CommandEvent;
                let (op, outcome, duration) = match event {
                    CommandEvent::Succeeded(e) => (e.command_name, "ok", e.duration),
                    CommandEvent::Failed(e) => (e.command_name, "error", e.duration),
                    _ => return,
                };
                metrics::histogram!(
                    crate::telemetry::MONGODB_OPERATION_DURATION,
                    "op" => op,
                    "outcome" => outcome
                )
                .record(duration.as_secs_f64());
            },
        ));
        let hosts = client_options
            .hosts
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let client = Client::with_options(client_options).map_err(|e| StoreError::Fatal {
            op: "create the MongoDB client",
            message: e.to_string(),
        })?;
        let db = client.database(&options.database);
        // `isMaster` rather than `hello`: some compatible servers only answer the former.
        db.run_command(doc! {"isMaster": 1})
            .await
            .map_err(|e| StoreError::Transient {
                op: "connect",
                message: format!(
                    "cannot reach MongoDB at {hosts} within {:?}: {} (check that the server is running, the host and port, credentials and TLS settings)",
                    options.connect_timeout,
                    short(&e)
                ),
            })?;
        let comments = db.collection(&options.comments);
        Ok(MongoStore {
            ops: Arc::default(),
            snapshot_reads: Arc::default(),
            db,
            comments,
            names: options.collections.clone(),
            schema: options.schema.clone(),
            hosts,
        })
    }

    /// Operations issued so far through this store (and its clones).
    pub fn op_counts(&self) -> OpCounts {
        OpCounts {
            counter_statements: self.ops.counter_statements.load(Ordering::Relaxed),
            count_queries: self.ops.count_queries.load(Ordering::Relaxed),
            ledger_statements: self.ops.ledger_statements.load(Ordering::Relaxed),
        }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    fn coll(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// Creates the indexes counterd relies on (idempotent).
    pub async fn ensure_indexes(&self) -> StoreResult<()> {
        self.ensure_indexes_with(true).await
    }

    /// Creates the indexes counterd relies on, and `{count: -1}` on the counters for top-N
    /// reads when `count_index` (idempotent); then gives counters written before `count` was
    /// maintained their `count`, so that the worker's `$inc` of it starts from the right value.
    pub async fn ensure_indexes_with(&self, count_index: bool) -> StoreResult<()> {
        let mut commands = vec![
            doc! {"createIndexes": &self.names.dirty, "indexes": [{"key": {"first_dirty_at": 1}, "name": "first_dirty_at"}]},
            doc! {"createIndexes": &self.names.ledger, "indexes": [{"key": {"gone_at": 1}, "name": "gone_ttl", "expireAfterSeconds": 7 * 24 * 3600}]},
            doc! {"createIndexes": &self.names.runs, "indexes": [{"key": {"finished_at": 1}, "name": "runs_ttl", "expireAfterSeconds": 30 * 24 * 3600}]},
        ];
        if count_index {
            commands.push(doc! {"createIndexes": &self.names.counters, "indexes": [{"key": {"count": -1}, "name": "count_desc"}]});
        }
        for command in commands {
            self.db
                .run_command(command)
                .await
                .map_err(|e| map_err("create indexes", e))?;
        }
        self.backfill_count().await
    }

    /// Sets `count = base_count + live_delta` on counters that lack it, each conditioned on the
    /// numbers read (a worker or reconciler that moved it meanwhile wins, and the next start
    /// looks again).
    async fn backfill_count(&self) -> StoreResult<()> {
        let counters = self.coll(&self.names.counters);
        let mut missing = counters
            .find(doc! {"count": {"$exists": false}})
            .projection(doc! {"base_count": 1, "live_delta": 1})
            .await
            .map_err(|e| map_err("find counters without count", e))?;
        let mut filled = 0;
        while let Some(d) = missing
            .try_next()
            .await
            .map_err(|e| map_err("find counters without count", e))?
        {
            let int = |f: &str| {
                d.get(f)
                    .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
            };
            let (Some(id), base, live) = (d.get("_id"), int("base_count"), int("live_delta"))
            else {
                continue;
            };
            let mut filter = doc! {"_id": id.clone(), "count": {"$exists": false}};
            filter.insert("base_count", base.map_or(Bson::Null, Bson::Int64));
            filter.insert("live_delta", live.map_or(Bson::Null, Bson::Int64));
            let count = base.unwrap_or(0) + live.unwrap_or(0);
            counters
                .update_one(filter, doc! {"$set": {"count": count}})
                .await
                .map_err(|e| map_err("fill in a counter's count", e))?;
            filled += 1;
        }
        if filled > 0 {
            tracing::info!(
                counters = filled,
                "gave counters written by an older counterd their `count`"
            );
        }
        Ok(())
    }

    /// Detects what the server can do.
    pub async fn abilities(&self) -> StoreResult<ServerAbilities> {
        let is_master = self
            .db
            .run_command(doc! {"isMaster": 1})
            .await
            .map_err(|e| map_err("isMaster", e))?;
        let hello = self.db.run_command(doc! {"hello": 1}).await.is_ok();
        let build = self.db.run_command(doc! {"buildInfo": 1}).await.ok();
        let version = build
            .as_ref()
            .and_then(|b| b.get_str("version").ok())
            .unwrap_or("unknown")
            .to_string();
        let major: i32 = version
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        let wire_version = is_master.get_i32("maxWireVersion").unwrap_or(0);
        let replica_set =
            is_master.contains_key("setName") || is_master.get_str("msg") == Ok("isdbgrid");
        let sessions = is_master.contains_key("logicalSessionTimeoutMinutes");
        let pre_images = major >= 6 && hello && self.pre_images_enabled().await;
        Ok(ServerAbilities {
            version,
            wire_version,
            hello,
            sessions,
            pre_images,
            // Only real servers (which answer `hello`) send update descriptions and post-batch
            // tokens; the fake server answers `isMaster` only.
            update_description: hello,
            // Probed for real (see `snapshot_reads`): never assumed from the version.
            snapshot_reads: replica_set && self.snapshot_reads().await,
            post_batch_token: hello,
        })
    }

    /// Whether `changeStreamPreAndPostImages` is enabled on the comments collection.
    async fn pre_images_enabled(&self) -> bool {
        let Ok(mut cursor) = self
            .db
            .list_collections()
            .filter(doc! {"name": self.comments.name()})
            .await
        else {
            return false;
        };
        match cursor.try_next().await {
            Ok(Some(spec)) => spec
                .options
                .change_stream_pre_and_post_images
                .is_some_and(|o| o.enabled),
            _ => false,
        }
    }

    /// Runs one `update` command with many statements, `ordered: false`; returns
    /// (statements that wrote, statements rejected by a duplicate key).
    async fn update_many_statements(
        &self,
        op: &'static str,
        collection: &str,
        statements: Vec<Document>,
    ) -> StoreResult<(u64, u64)> {
        let mut wrote = 0;
        let mut duplicates = 0;
        // Servers cap a command at maxWriteBatchSize statements (1000 on old ones).
        for chunk in statements.chunks(1000) {
            let reply = self
                .db
                .run_command(
                    doc! {"update": collection, "updates": chunk.to_vec(), "ordered": false},
                )
                .await
                .map_err(|e| map_err(op, e))?;
            let errors = reply.get_array("writeErrors").cloned().unwrap_or_default();
            for error in &errors {
                let error = error.as_document().cloned().unwrap_or_default();
                let code = error.get_i32("code").unwrap_or(0);
                if code == DUPLICATE_KEY {
                    duplicates += 1;
                } else {
                    let message = format!(
                        "{} (code {code})",
                        error.get_str("errmsg").unwrap_or("write error")
                    );
                    return Err(if TRANSIENT_CODES.contains(&code) {
                        StoreError::Transient { op, message }
                    } else {
                        StoreError::Fatal { op, message }
                    });
                }
            }
            if let Ok(wce) = reply.get_document("writeConcernError") {
                return Err(StoreError::Transient {
                    op,
                    message: format!("write concern error: {wce}"),
                });
            }
            wrote += chunk.len() as u64 - errors.len() as u64;
        }
        Ok((wrote, duplicates))
    }
}

/// `field` is not `>= value`: matches a smaller value, a missing field, or another type.
fn not_gte(value: impl Into<Bson>) -> Document {
    doc! {"$not": {"$gte": value.into()}}
}

/// `epoch` is not newer than ours: the fencing condition carried by every worker write.
fn fenced(filter: &mut Document, fence: &Fence) {
    filter.insert("epoch", doc! {"$not": {"$gt": fence.epoch}});
}

fn to_date(secs: i64) -> DateTime {
    DateTime::from_millis(secs.saturating_mul(1000))
}

/// A short, credential-free description of a driver error.
fn short(e: &DriverError) -> String {
    match e.kind.as_ref() {
        ErrorKind::ServerSelection { message, .. } => {
            message.lines().next().unwrap_or(message).to_string()
        }
        _ => e.to_string(),
    }
}

fn error_code(e: &DriverError) -> Option<i32> {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => Some(w.code),
        _ => None,
    }
}

/// Sorts a driver error into what the caller should do.
pub(crate) fn map_err(op: &'static str, e: DriverError) -> StoreError {
    let transient_kind = matches!(
        e.kind.as_ref(),
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
    );
    let labelled = [
        "RetryableWriteError",
        "ResumableChangeStreamError",
        "TransientTransactionError",
    ]
    .iter()
    .any(|l| e.contains_label(l));
    let code = error_code(&e);
    if transient_kind || labelled || code.is_some_and(|c| TRANSIENT_CODES.contains(&c)) {
        StoreError::Transient {
            op,
            message: short(&e),
        }
    } else {
        StoreError::Fatal {
            op,
            message: short(&e),
        }
    }
}

fn token_to_resume(token: &Token) -> StoreResult<ResumeToken> {
    bson::from_document(doc! {"_data": token.as_str()}).map_err(|e| StoreError::Malformed {
        what: "resume token",
        id: token.to_string(),
        detail: e.to_string(),
    })
}

fn resume_to_token(token: &ResumeToken) -> Option<Token> {
    match bson::to_bson(token).ok()? {
        Bson::Document(d) => Token::from_resume_document(&d),
        _ => None,
    }
}

/// The open change stream over `comments`.
///
/// On servers that send no post-batch resume token (the fake test server), the driver's own
/// resume token is empty once a batch is exhausted, so its automatic resume after a transient
/// error could restart "from now" and skip events. There the stream is dropped whenever it runs
/// dry and reopened from the last event counterd itself saw.
struct MongoEvents {
    store: MongoStore,
    options: StreamOptions,
    stream: Option<ChangeStream<Document>>,
    /// The last event returned, the position to reopen after.
    last: Option<Token>,
}

impl MongoEvents {
    async fn open(&mut self) -> StoreResult<&mut ChangeStream<Document>> {
        if self.stream.is_none() {
            let mut options = self.options.clone();
            if let Some(last) = &self.last {
                options.start = StreamStart::After(last.clone());
            }
            self.stream = Some(self.store.watch(&options).await?);
        }
        Ok(self.stream.as_mut().expect("opened above"))
    }
}

#[async_trait]
impl EventSource for MongoEvents {
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch> {
        let started = Instant::now();
        let resumed_after = match &self.options.start {
            StreamStart::After(t) => Some(t.clone()),
            _ => None,
        };
        let mut events = Vec::new();
        let stream = self.open().await?;
        let mut exhausted = false;
        while events.len() < max && (events.is_empty() || started.elapsed() < max_wait) {
            match stream.next_if_any().await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => {
                    exhausted = true;
                    break;
                }
                Err(e) => {
                    self.stream = None;
                    return Err(stream_err(e, resumed_after.as_ref()));
                }
            }
        }
        let post_batch_token = stream.resume_token().as_ref().and_then(resume_to_token);
        if let Some(last) = events
            .last()
            .and_then(|e| e.get_document("_id").ok())
            .and_then(Token::from_resume_document)
        {
            self.last = Some(last);
        }
        // Reopen only from a concrete position: "now" again would skip what came in between.
        let positioned = self.last.is_some() || !matches!(self.options.start, StreamStart::Now);
        if exhausted && post_batch_token.is_none() && positioned {
            self.stream = None;
        }
        Ok(RawBatch {
            events,
            post_batch_token,
        })
    }
}

fn stream_err(e: DriverError, resumed_after: Option<&Token>) -> StoreError {
    match error_code(&e) {
        Some(code) if HISTORY_LOST_CODES.contains(&code) => StoreError::HistoryLost {
            code,
            token: resumed_after.map(|t| t.to_string()).unwrap_or_default(),
        },
        Some(40573) => StoreError::Fatal {
            op: "open the change stream",
            message: "the server is a standalone: change streams need a replica set or a sharded cluster (start mongod with --replSet and run rs.initiate())".into(),
        },
        _ => map_err("read the change stream", e),
    }
}

/// A ledger entry's row: `None` when the comment is gone. An existing row without `post_id`
/// does not count; `live` says whether a row counts, `deleted` whether it is soft-deleted
/// (entries written before `deleted` existed always had a post, so `live` said it).
fn row_from_ledger(doc: &Document) -> Option<Row> {
    if !doc.get_bool("exists").unwrap_or(false) {
        return None;
    }
    let live = doc.get_bool("live").unwrap_or(false);
    Some(Row {
        post: doc.get(LEDGER_POST).and_then(PostId::from_bson),
        created_at: doc.get_datetime(LEDGER_CREATED).ok().copied(),
        deleted: doc.get_bool("deleted").unwrap_or(!live),
    })
}

fn counter_from_doc(doc: &Document) -> StoreResult<CounterDoc> {
    let int = |field: &str| -> StoreResult<i64> {
        match doc.get(field) {
            None | Some(Bson::Null) => Ok(0),
            Some(Bson::Int32(i)) => Ok(*i as i64),
            Some(Bson::Int64(i)) => Ok(*i),
            Some(Bson::Double(d)) if d.fract() == 0.0 => Ok(*d as i64),
            Some(other) => Err(StoreError::Malformed {
                what: "counter",
                id: format!("{:?}", doc.get("_id")),
                detail: format!("`{field}` is {other:?}, expected an integer"),
            }),
        }
    };
    let mut buckets = BTreeMap::new();
    if let Ok(map) = doc.get_document("live_by_bucket") {
        for (key, value) in map {
            let start: i64 = key.parse().map_err(|_| StoreError::Malformed {
                what: "counter",
                id: format!("{:?}", doc.get("_id")),
                detail: format!("bucket key `{key}` is not a number of seconds"),
            })?;
            let amount = match value {
                Bson::Int32(i) => *i as i64,
                Bson::Int64(i) => *i,
                Bson::Double(d) => *d as i64,
                _ => 0,
            };
            buckets.insert(start, amount);
        }
    }
    Ok(CounterDoc {
        post: doc.get("_id").and_then(PostId::from_bson),
        state: CounterState {
            base_count: int("base_count")?,
            base_watermark: match doc.get("base_watermark") {
                Some(Bson::DateTime(d)) => d.timestamp_millis().div_euclid(1000),
                _ => int("base_watermark")?,
            },
            live_delta: int("live_delta")?,
            buckets,
        },
        applied_through: doc.get_str("applied_through").ok().map(String::from),
        applied_time: doc.get_timestamp("applied_time").ok(),
        folds: int("folds")?,
        count: match doc.get("count") {
            None | Some(Bson::Null) => None,
            Some(_) => Some(int("count")?),
        },
        touched: match doc.get_document("touched") {
            Ok(map) => map
                .iter()
                .filter_map(|(k, v)| Some((k.parse().ok()?, v.as_str()?.to_string())))
                .collect(),
            Err(_) => BTreeMap::new(),
        },
        last_drift: doc
            .get("last_drift")
            .and_then(|b| b.as_i64().or(b.as_i32().map(i64::from))),
        reconciled_at: doc.get_datetime("reconciled_at").ok().copied(),
    })
}

fn checkpoint_from_doc(stream: &str, doc: &Document) -> StoreResult<Checkpoint> {
    let malformed = |detail: String| {
        StoreError::Malformed {
        what: "checkpoint",
        id: stream.to_string(),
        detail: format!("{detail} (fix or delete it in counterd's checkpoints collection, or run `counterd replay --from-time ...`)"),
    }
    };
    let token = match doc.get("token") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(s)) if !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit()) => {
            Some(Token(s.clone()))
        }
        Some(other) => {
            return Err(malformed(format!(
                "`token` is {other:?}, expected a resume token's hex `_data`"
            )))
        }
    };
    let high_water = match doc.get("high_water") {
        None | Some(Bson::Null) => None,
        Some(Bson::String(s)) => Some(Token(s.clone())),
        Some(other) => return Err(malformed(format!("`high_water` is {other:?}"))),
    };
    let epoch = match doc.get("epoch") {
        None => 0,
        Some(Bson::Int32(i)) => *i as i64,
        Some(Bson::Int64(i)) => *i,
        Some(other) => return Err(malformed(format!("`epoch` is {other:?}"))),
    };
    let gaps = doc
        .get_array("gaps")
        .map(|gaps| {
            gaps.iter()
                .filter_map(|g| g.as_document())
                .map(|g| Gap {
                    from: g.get_datetime("from").ok().copied(),
                    to: g.get_datetime("to").ok().copied().unwrap_or(DateTime::MIN),
                })
                .collect()
        })
        .unwrap_or_default();
    let pending = match doc.get("pending") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(p)) => Some(pending_from_doc(p).map_err(malformed)?),
        Some(other) => return Err(malformed(format!("`pending` is {other:?}"))),
    };
    let snapshot = match doc.get("snapshot") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(p)) => Some(snapshot_from_doc(p).map_err(malformed)?),
        Some(other) => return Err(malformed(format!("`snapshot` is {other:?}"))),
    };
    Ok(Checkpoint {
        snapshot,
        stream: stream.to_string(),
        pending,
        token,
        token_time: doc.get_timestamp("token_time").ok(),
        start_time: doc.get_timestamp("start_time").ok(),
        caught_up_at: doc.get_timestamp("caught_up_at").ok(),
        high_water,
        epoch,
        deployment: match doc.get("deployment") {
            None | Some(Bson::Null) => None,
            Some(Bson::Document(d)) => Some(Deployment::from_document(d)),
            Some(other) => return Err(malformed(format!("`deployment` is {other:?}"))),
        },
        updated_at: doc.get_datetime("updated_at").ok().copied(),
        gaps,
        sweep_requested: doc.get_bool("sweep_requested").unwrap_or(false),
    })
}

/// The history-gap generation a ledger entry was written under (entries written before
/// generations existed: 0).
fn entry_generation(doc: &Document) -> u64 {
    match doc.get("generation") {
        Some(Bson::Int64(g)) => (*g).max(0) as u64,
        Some(Bson::Int32(g)) => (*g).max(0) as u64,
        _ => 0,
    }
}

/// The `$set` of a ledger entry's row state (a row that exists; without a post it does not
/// count), and the fields to `$unset`.
fn ledger_row_update(row: &Row) -> (Document, Document) {
    let mut set = doc! {"live": row.is_live(), "deleted": row.deleted, "exists": true};
    let mut unset = doc! {"gone_at": ""};
    match &row.post {
        Some(post) => set.insert(LEDGER_POST, post.to_bson()),
        None => unset.insert(LEDGER_POST, ""),
    };
    match row.created_at {
        Some(t) => set.insert(LEDGER_CREATED, t),
        None => unset.insert(LEDGER_CREATED, ""),
    };
    (set, unset)
}

fn row_to_doc(row: &Row) -> Document {
    let mut d = doc! {"deleted": row.deleted};
    if let Some(post) = &row.post {
        d.insert("post", post.to_bson());
    }
    if let Some(t) = row.created_at {
        d.insert("created_at", t);
    }
    d
}

fn row_from_doc(d: &Document) -> Result<Row, String> {
    let post = match d.get("post") {
        None => None, // a row that exists without a post
        Some(p) => Some(PostId::from_bson(p).ok_or("pending ledger row with a malformed post")?),
    };
    Ok(Row {
        post,
        created_at: d.get_datetime("created_at").ok().copied(),
        deleted: d.get_bool("deleted").map_err(|e| e.to_string())?,
    })
}

/// The pending batch as stored in the checkpoint document.
fn pending_to_doc(batch: &PendingBatch) -> Document {
    let dirty: Vec<Bson> = batch
        .dirty
        .iter()
        .map(|d| Bson::Document(doc! {"post": d.post.to_bson(), "bucket": d.newest_bucket}))
        .collect();
    let mut d = doc! {
        "end": batch.end.as_str(),
        "counters": counters_to_bson(&batch.counters),
        "ledger": ledger_to_bson(&batch.ledger),
        "dirty": dirty,
    };
    if let Some(t) = batch.end_time {
        d.insert("end_time", t);
    }
    d
}

/// Planned counter increments as stored in an intent (a pending batch or snapshot chunk).
fn counters_to_bson(counters: &[CounterDelta]) -> Vec<Bson> {
    counters
        .iter()
        .map(|c| {
            let mut buckets = Document::new();
            for (k, v) in &c.buckets {
                buckets.insert(k.to_string(), *v);
            }
            let touched: Vec<i64> = c.touched.iter().copied().collect();
            Bson::Document(
                doc! {"post": c.post.to_bson(), "delta": c.delta, "buckets": buckets, "touched": touched},
            )
        })
        .collect()
}

/// Planned ledger states as stored in an intent.
fn ledger_to_bson(ledger: &[LedgerUpdate]) -> Vec<Bson> {
    ledger
        .iter()
        .map(|l| {
            Bson::Document(doc! {
                "comment": l.comment.value.clone(),
                "state": l.state.as_ref().map(|r| Bson::Document(row_to_doc(r))).unwrap_or(Bson::Null),
            })
        })
        .collect()
}

fn counters_from_doc(d: &Document) -> Result<Vec<CounterDelta>, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let mut counters = Vec::new();
    for c in d.get_array("counters").map_err(err)? {
        let c = c.as_document().ok_or("pending counter is not a document")?;
        let mut buckets = BTreeMap::new();
        for (k, v) in c.get_document("buckets").map_err(err)? {
            let amount = v
                .as_i64()
                .or(v.as_i32().map(i64::from))
                .ok_or("bucket amount")?;
            buckets.insert(k.parse().map_err(|_| "bucket key")?, amount);
        }
        // Batches recorded before `touched` existed touched exactly their non-zero buckets.
        let touched = match c.get_array("touched") {
            Ok(list) => list
                .iter()
                .map(|b| b.as_i64().ok_or("touched bucket"))
                .collect::<Result<_, _>>()?,
            Err(_) => buckets.keys().copied().collect(),
        };
        counters.push(CounterDelta {
            post: c
                .get("post")
                .and_then(PostId::from_bson)
                .ok_or("pending counter post")?,
            delta: c.get_i64("delta").map_err(err)?,
            buckets,
            touched,
        });
    }
    Ok(counters)
}

fn ledger_from_doc(d: &Document) -> Result<Vec<LedgerUpdate>, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let mut ledger = Vec::new();
    for l in d.get_array("ledger").map_err(err)? {
        let l = l
            .as_document()
            .ok_or("pending ledger entry is not a document")?;
        let state = match l.get("state") {
            Some(Bson::Document(r)) => Some(row_from_doc(r)?),
            _ => None,
        };
        ledger.push(LedgerUpdate {
            comment: CommentId::new(l.get("comment").cloned().ok_or("pending ledger comment")?),
            state,
        });
    }
    Ok(ledger)
}

fn pending_from_doc(d: &Document) -> Result<PendingBatch, String> {
    let err = |e: bson::document::ValueAccessError| format!("pending batch: {e}");
    let dirty = d
        .get_array("dirty")
        .map_err(err)?
        .iter()
        .map(|p| match p {
            Bson::Document(d) => Some(DirtyMark {
                post: d.get("post").and_then(PostId::from_bson)?,
                newest_bucket: d.get_i64("bucket").ok()?,
            }),
            // Recorded before marks carried a bucket: covered by any fold, as before.
            other => PostId::from_bson(other).map(|post| DirtyMark {
                post,
                newest_bucket: 0,
            }),
        })
        .map(|m| m.ok_or("pending dirty post"))
        .collect::<Result<_, _>>()?;
    Ok(PendingBatch {
        end: Token(d.get_str("end").map_err(err)?.to_string()),
        end_time: d.get_timestamp("end_time").ok(),
        counters: counters_from_doc(d)?,
        ledger: ledger_from_doc(d)?,
        dirty,
    })
}

/// The snapshot's progress as stored in the checkpoint document.
fn snapshot_to_doc(p: &SnapshotProgress) -> Document {
    let id = |c: &Option<CommentId>| c.as_ref().map(|c| c.value.clone()).unwrap_or(Bson::Null);
    let count = |n: u64| n as i64;
    doc! {
        "state": p.state.as_str(),
        "started_at": p.started_at,
        "finished_at": p.finished_at.map(Bson::DateTime).unwrap_or(Bson::Null),
        "last_id": id(&p.last_id),
        "cursor": id(&p.cursor),
        "chunks_done": count(p.chunks_done),
        "rows_scanned": count(p.rows_scanned),
        "rows_counted": count(p.rows_counted),
        "estimated_rows": count(p.estimated_rows),
        "chunks_resumed": count(p.chunks_resumed),
        "reading": p.reading.map(|n| Bson::Int64(n as i64)).unwrap_or(Bson::Null),
        "chunks_reread": count(p.chunks_reread),
        "pending": match &p.pending {
            None => Bson::Null,
            Some(c) => Bson::Document(doc! {
                "number": count(c.number),
                "last": id(&c.last),
                "rows": count(c.rows),
                "ledger": ledger_to_bson(&c.claims),
                "counters": counters_to_bson(&c.counters),
            }),
        },
    }
}

fn snapshot_from_doc(d: &Document) -> Result<SnapshotProgress, String> {
    let id = |v: Option<&Bson>| match v {
        None | Some(Bson::Null) => None,
        Some(v) => Some(CommentId::new(v.clone())),
    };
    let count = |d: &Document, field: &str| match d.get(field) {
        Some(Bson::Int64(n)) => (*n).max(0) as u64,
        Some(Bson::Int32(n)) => (*n).max(0) as u64,
        _ => 0,
    };
    let state = d.get_str("state").unwrap_or_default();
    let pending = match d.get("pending") {
        None | Some(Bson::Null) => None,
        Some(Bson::Document(c)) => Some(SnapshotChunk {
            number: count(c, "number"),
            last: id(c.get("last")),
            rows: count(c, "rows"),
            claims: ledger_from_doc(c)?,
            counters: counters_from_doc(c)?,
        }),
        Some(other) => return Err(format!("snapshot `pending` is {other:?}")),
    };
    Ok(SnapshotProgress {
        state: SnapshotState::parse(state)
            .ok_or_else(|| format!("snapshot `state` is {state:?}"))?,
        started_at: d
            .get_datetime("started_at")
            .copied()
            .map_err(|e| format!("snapshot: {e}"))?,
        finished_at: d.get_datetime("finished_at").ok().copied(),
        last_id: id(d.get("last_id")),
        cursor: id(d.get("cursor")),
        chunks_done: count(d, "chunks_done"),
        rows_scanned: count(d, "rows_scanned"),
        rows_counted: count(d, "rows_counted"),
        estimated_rows: count(d, "estimated_rows"),
        chunks_resumed: count(d, "chunks_resumed"),
        reading: d.get_i64("reading").ok().map(|n| n.max(0) as u64),
        chunks_reread: count(d, "chunks_reread"),
        pending,
    })
}

fn dirty_from_doc(doc: &Document) -> Option<DirtyEntry> {
    Some(DirtyEntry {
        post: doc.get("_id").and_then(PostId::from_bson)?,
        first_dirty_at: doc.get_datetime("first_dirty_at").ok().copied()?,
        last_dirty_at: doc.get_datetime("last_dirty_at").ok().copied()?,
        version: doc
            .get("version")
            .and_then(|v| v.as_i64().or(v.as_i32().map(i64::from)))
            .unwrap_or(0),
        newest_bucket: doc.get("newest_bucket").and_then(Bson::as_i64),
    })
}

/// Type brackets of BSON sort order that post ids may have, in order.
fn later_types(post: &PostId) -> Vec<&'static str> {
    match post {
        PostId::Int(_) => vec!["string", "objectId"],
        PostId::Str(_) => vec!["objectId"],
        PostId::Oid(_) => vec![],
    }
}

/// Posts strictly after `after` in BSON order, across type brackets (`$gt` alone stays within
/// one type).
fn after_filter(field: &str, after: Option<&PostId>) -> Document {
    match after {
        None => doc! {field: {"$type": ["int", "long", "string", "objectId"]}},
        Some(post) => {
            let mut or = vec![Bson::Document(doc! {field: {"$gt": post.to_bson()}})];
            for t in later_types(post) {
                or.push(Bson::Document(doc! {field: {"$type": t}}));
            }
            doc! {"$or": or}
        }
    }
}

#[async_trait]
impl ChangeStreams for MongoStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let stream = self.watch(&options).await?;
        Ok(Box::new(MongoEvents {
            store: self.clone(),
            options,
            stream: Some(stream),
            last: None,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        let reply = self
            .db
            .run_command(doc! {"isMaster": 1})
            .await
            .map_err(|e| map_err("read the server's position", e))?;
        Ok(position_from_reply(&reply, DateTime::now()))
    }
}

#[async_trait]
impl Checkpoints for MongoStore {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        let found = self
            .coll(&self.names.checkpoints)
            .find_one(doc! {"_id": stream})
            .await
            .map_err(|e| map_err("read the checkpoint", e))?;
        found.map(|d| checkpoint_from_doc(stream, &d)).transpose()
    }

    async fn record_intent(&self, fence: &Fence, batch: &PendingBatch) -> StoreResult<()> {
        let update = doc! {
            "$max": {"high_water": batch.end.as_str()},
            "$set": {"pending": pending_to_doc(batch), "updated_at": DateTime::now()},
        };
        self.owned_checkpoint_update("record the batch intent", fence, update)
            .await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        let mut set = doc! {"token": token.as_str(), "updated_at": DateTime::now()};
        if let Some(t) = token_time {
            set.insert("token_time", t);
        }
        let update =
            doc! {"$set": set, "$max": {"high_water": token.as_str()}, "$unset": {"pending": ""}};
        self.owned_checkpoint_update("save the checkpoint", fence, update)
            .await
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        let now = DateTime::now();
        let update = match to {
            Position::Token(t) => {
                doc! {"$set": {"token": t.as_str(), "updated_at": now}, "$unset": {"token_time": "", "start_time": ""}}
            }
            Position::Time(t) => {
                doc! {"$set": {"start_time": *t, "updated_at": now}, "$unset": {"token": "", "token_time": ""}}
            }
            Position::Unset => {
                doc! {"$unset": {"token": "", "token_time": "", "start_time": ""}, "$set": {"updated_at": now}}
            }
        };
        self.coll(&self.names.checkpoints)
            .update_one(doc! {"_id": stream}, update)
            .upsert(true)
            .await
            .map_err(|e| map_err("move the checkpoint", e))?;
        Ok(())
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        let update = doc! {"$set": {"start_time": at, "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the start position", fence, update)
            .await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        let update = doc! {"$max": {"caught_up_at": at}};
        self.owned_checkpoint_update("record the drained position", fence, update)
            .await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        let mut gap_doc = doc! {"to": gap.to};
        if let Some(from) = gap.from {
            gap_doc.insert("from", from);
        }
        let restart = Timestamp {
            time: gap.to.timestamp_millis().div_euclid(1000) as u32,
            increment: 0,
        };
        let update = doc! {
            "$push": {"gaps": gap_doc},
            // The new stream starts exactly where the gap ends: nothing between is unaccounted.
            "$set": {"sweep_requested": true, "updated_at": DateTime::now(), "start_time": restart},
            "$unset": {"token": "", "token_time": ""},
        };
        self.owned_checkpoint_update("record the history gap", fence, update)
            .await
    }

    async fn deployment(&self) -> StoreResult<Deployment> {
        let admin = self.db.client().database("admin");
        // An optional reading: refused (not allowed, not supported) is "not reported", but a
        // transient failure is retried rather than taken for a server that reports nothing.
        async fn optional(
            op: &'static str,
            reply: Result<Document, DriverError>,
        ) -> StoreResult<Option<Document>> {
            match reply {
                Ok(d) => Ok(Some(d)),
                Err(e) => match map_err(op, e) {
                    t @ StoreError::Transient { .. } => Err(t),
                    _ => Ok(None),
                },
            }
        }
        let is_master = admin
            .run_command(doc! {"isMaster": 1})
            .await
            .map_err(|e| map_err("isMaster", e))?;
        let replica_set = is_master.contains_key("setName");
        let sharded = is_master.get_str("msg") == Ok("isdbgrid");
        let repl_config = if replica_set {
            optional(
                "replSetGetConfig",
                admin.run_command(doc! {"replSetGetConfig": 1}).await,
            )
            .await?
        } else {
            None
        };
        let cluster = if sharded {
            optional(
                "read config.version",
                self.db
                    .client()
                    .database("config")
                    .collection::<Document>("version")
                    .find_one(doc! {})
                    .await
                    .map(Option::unwrap_or_default),
            )
            .await?
        } else {
            None
        };
        let status = if replica_set || sharded {
            None
        } else {
            optional(
                "serverStatus",
                admin.run_command(doc! {"serverStatus": 1}).await,
            )
            .await?
        };
        Ok(Deployment::from_replies(
            &is_master,
            repl_config.as_ref(),
            cluster.as_ref(),
            status.as_ref(),
        ))
    }

    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        let update =
            doc! {"$set": {"deployment": deployment.to_document(), "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the deployment", fence, update)
            .await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.coll(&self.names.checkpoints)
            .update_one(
                doc! {"_id": stream},
                doc! {"$set": {"sweep_requested": requested}},
            )
            .upsert(true)
            .await
            .map_err(|e| map_err("flag the sweep", e))?;
        Ok(())
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        let filter = doc! {"_id": &fence.stream, "epoch": {"$not": {"$gt": fence.epoch}}};
        let update = doc! {"$set": {"epoch": fence.epoch, "updated_at": DateTime::now()}};
        self.checkpoint_update("adopt the checkpoint", fence, filter, update)
            .await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        let update =
            doc! {"$set": {"snapshot": snapshot_to_doc(progress), "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the snapshot's progress", fence, update)
            .await
    }
}

#[async_trait]
impl Counters for MongoStore {
    async fn apply_counters(
        &self,
        fence: &Fence,
        writes: &[CounterDelta],
        through: &Token,
        through_time: Option<Timestamp>,
    ) -> StoreResult<ApplyOutcome> {
        let statements = writes
            .iter()
            .map(|w| {
                let mut filter =
                    doc! {"_id": w.post.to_bson(), "applied_through": not_gte(through.as_str())};
                fenced(&mut filter, fence);
                // `count` moves with `live_delta` in the same write: readers never see it apart
                // from `base_count + live_delta`.
                let mut inc = doc! {"live_delta": w.delta, "count": w.delta};
                for (bucket, amount) in &w.buckets {
                    inc.insert(format!("live_by_bucket.{bucket}"), *amount);
                }
                let mut set = doc! {"applied_through": through.as_str(), "epoch": fence.epoch};
                match through_time {
                    Some(t) => set.insert("applied_time", t),
                    None => set.insert("applied_time", Bson::Null),
                };
                for bucket in &w.touched {
                    set.insert(format!("touched.{bucket}"), through.as_str());
                }
                doc! {
                    "q": filter,
                    "u": {
                        "$inc": inc,
                        "$set": set,
                        "$setOnInsert": {"base_count": 0_i64, "base_watermark": 0_i64},
                    },
                    "upsert": true,
                }
            })
            .collect();
        self.ops
            .counter_statements
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        let (applied, already_applied) = self
            .update_many_statements("apply counter increments", &self.names.counters, statements)
            .await?;
        Ok(ApplyOutcome {
            applied,
            already_applied,
        })
    }

    async fn read_counter(&self, post: &PostId) -> StoreResult<Option<CounterDoc>> {
        let found = self
            .coll(&self.names.counters)
            .find_one(doc! {"_id": post.to_bson()})
            .await
            .map_err(|e| map_err("read a counter", e))?;
        found.map(|d| counter_from_doc(&d)).transpose()
    }

    async fn install_fold(
        &self,
        post: &PostId,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        let counters = self.coll(&self.names.counters);
        let Some(expected) = expected else {
            let mut buckets = Document::new();
            for (k, v) in &fold.kept {
                buckets.insert(k.to_string(), *v);
            }
            let inserted = counters
                .insert_one(doc! {
                    "_id": post.to_bson(),
                    "base_count": fold.base_count,
                    "base_watermark": fold.watermark,
                    "live_delta": fold.live_delta,
                    "count": fold.base_count + fold.live_delta,
                    "live_by_bucket": buckets,
                    "applied_through": "",
                    "folds": 1_i64,
                    "last_drift": fold.drift,
                    "reconciled_at": now,
                })
                .await;
            return match inserted {
                Ok(_) => Ok(true),
                Err(e) if error_code(&e) == Some(DUPLICATE_KEY) => Ok(false),
                Err(e) => Err(map_err("create a counter", e)),
            };
        };
        let mut filter = doc! {"_id": post.to_bson()};
        match &expected.applied_through {
            Some(t) => filter.insert("applied_through", t.as_str()),
            None => filter.insert("applied_through", doc! {"$exists": false}),
        };
        // Also pin the numbers read, so a hand edit (or another reconciler) between read and
        // write is not overwritten with stale arithmetic.
        filter.insert("live_delta", expected.state.live_delta);
        filter.insert("base_count", expected.state.base_count);
        filter.insert(
            "folds",
            if expected.folds == 0 {
                not_gte(1_i64)
            } else {
                doc! {"$eq": expected.folds}
            },
        );
        let mut update = doc! {"$set": {
            "base_count": fold.base_count,
            "base_watermark": fold.watermark,
            "live_delta": fold.live_delta,
            "count": fold.base_count + fold.live_delta,
            "last_drift": fold.drift,
            "reconciled_at": now,
        }, "$inc": {"folds": 1_i64}};
        let mut unset = Document::new();
        for bucket in &fold.dropped {
            unset.insert(format!("live_by_bucket.{bucket}"), "");
        }
        // Touches below the watermark are covered by this recount; later ones are compared
        // against the `applied_through` the next recount reads.
        for bucket in expected.touched.keys().filter(|b| **b < fold.watermark) {
            unset.insert(format!("touched.{bucket}"), "");
        }
        if !unset.is_empty() {
            update.insert("$unset", unset);
        }
        let result = counters
            .update_one(filter, update)
            .await
            .map_err(|e| map_err("install a recount", e))?;
        Ok(result.matched_count == 1)
    }

    async fn posts_after(&self, after: Option<&PostId>, limit: usize) -> StoreResult<Vec<PostId>> {
        let pipeline = vec![
            doc! {"$match": after_filter(&self.schema.group, after)},
            doc! {"$group": {"_id": format!("${}", self.schema.group)}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$limit": limit as i64},
        ];
        let from_comments: Vec<Document> = self
            .comments
            .aggregate(pipeline)
            .await
            .map_err(|e| map_err("list posts", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("list posts", e))?;
        let from_counters: Vec<Document> = self
            .coll(&self.names.counters)
            .find(after_filter("_id", after))
            .projection(doc! {"_id": 1})
            .sort(doc! {"_id": 1})
            .limit(limit.min(i64::MAX as usize) as i64)
            .await
            .map_err(|e| map_err("list counters", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("list counters", e))?;
        let mut posts: Vec<PostId> = from_comments
            .iter()
            .chain(from_counters.iter())
            .filter_map(|d| d.get("_id").and_then(PostId::from_bson))
            .collect();
        posts.sort();
        posts.dedup();
        posts.truncate(limit);
        Ok(posts)
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<PostId>> {
        let sample = |field: String| {
            vec![
                doc! {"$sample": {"size": n as i64}},
                doc! {"$project": {"_id": 0, "post": format!("${field}")}},
            ]
        };
        let mut docs: Vec<Document> = self
            .coll(&self.names.counters)
            .aggregate(sample("_id".into()))
            .await
            .map_err(|e| map_err("sample counters", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("sample counters", e))?;
        // Comments too: a post with rows but no counter is as wrong as a counter that is off.
        let from_comments: Vec<Document> = self
            .comments
            .aggregate(sample(self.schema.group.clone()))
            .await
            .map_err(|e| map_err("sample comments", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("sample comments", e))?;
        docs.extend(from_comments);
        let mut posts: Vec<PostId> = docs
            .iter()
            .filter_map(|d| d.get("post").and_then(PostId::from_bson))
            .collect();
        posts.sort();
        posts.dedup();
        Ok(posts)
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        let statements = writes
            .iter()
            .map(|w| {
                let mut filter =
                    doc! {"_id": w.post.to_bson(), "snapshot_chunk": not_gte(chunk as i64)};
                fenced(&mut filter, fence);
                let mut inc = doc! {"live_delta": w.delta, "count": w.delta};
                for (bucket, amount) in &w.buckets {
                    inc.insert(format!("live_by_bucket.{bucket}"), *amount);
                }
                doc! {
                    "q": filter,
                    "u": {
                        "$inc": inc,
                        "$set": {"snapshot_chunk": chunk as i64, "epoch": fence.epoch},
                        "$setOnInsert": {"base_count": 0_i64, "base_watermark": 0_i64},
                    },
                    "upsert": true,
                }
            })
            .collect();
        let (applied, already_applied) = self
            .update_many_statements("add snapshot counts", &self.names.counters, statements)
            .await?;
        Ok(ApplyOutcome {
            applied,
            already_applied,
        })
    }
}

#[async_trait]
impl Ledger for MongoStore {
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, Option<Row>>> {
        let mut out = HashMap::new();
        for chunk in comments.chunks(5000) {
            let ids: Vec<Bson> = chunk.iter().map(|c| c.value.clone()).collect();
            let mut cursor = self
                .coll(&self.names.ledger_of(stream))
                .find(doc! {"_id": {"$in": ids}})
                .await
                .map_err(|e| map_err("read the ledger", e))?;
            while let Some(entry) = cursor
                .try_next()
                .await
                .map_err(|e| map_err("read the ledger", e))?
            {
                if entry_generation(&entry) < generation {
                    continue; // written before the latest history gap: unknown
                }
                if let Some(id) = entry.get("_id") {
                    out.insert(CommentId::new(id.clone()).key, row_from_ledger(&entry));
                }
            }
        }
        Ok(out)
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        let now = DateTime::now();
        let statements = updates
            .iter()
            .map(|u| {
                let mut filter = doc! {"_id": u.comment.value.clone(), "applied_through": not_gte(through.as_str())};
                fenced(&mut filter, fence);
                let update = match &u.state {
                    Some(row) => {
                        let (mut set, unset) = ledger_row_update(row);
                        set.insert("applied_through", through.as_str());
                        set.insert("epoch", fence.epoch);
                        set.insert("generation", generation as i64);
                        doc! {"$set": set, "$unset": unset}
                    }
                    None => doc! {
                        "$set": {"exists": false, "live": false, "applied_through": through.as_str(), "epoch": fence.epoch, "gone_at": now, "generation": generation as i64},
                        "$unset": {LEDGER_POST: "", LEDGER_CREATED: "", "deleted": ""},
                    },
                };
                doc! {"q": filter, "u": update, "upsert": true}
            })
            .collect();
        self.ops
            .ledger_statements
            .fetch_add(updates.len() as u64, Ordering::Relaxed);
        self.update_many_statements(
            "write the comment ledger",
            &self.names.ledger_of(&fence.stream),
            statements,
        )
        .await?;
        Ok(())
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        let statements = rows
            .iter()
            .map(|(comment, row)| {
                let (mut set, mut unset) = ledger_row_update(row);
                set.insert("generation", generation as i64);
                // Any write of the worker replaces a rebuilt entry.
                unset.insert("applied_through", "");
                doc! {
                    // No entry, or one from before the gap: a duplicate key otherwise (skipped).
                    "q": {"_id": comment.value.clone(), "generation": not_gte(generation as i64)},
                    "u": {"$set": set, "$unset": unset},
                    "upsert": true,
                }
            })
            .collect();
        self.ops
            .ledger_statements
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        self.update_many_statements(
            "rebuild the comment ledger",
            &self.names.ledger_of(stream),
            statements,
        )
        .await?;
        Ok(())
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        let statements = claims
            .iter()
            .filter_map(|c| {
                let row = c.state.as_ref()?;
                let (mut set, _) = ledger_row_update(row);
                set.insert("epoch", fence.epoch);
                set.insert("generation", generation as i64);
                set.insert("claimed_by_snapshot", true);
                // Only where no entry exists: `$setOnInsert` leaves any state the stream wrote.
                Some(doc! {
                    "q": {"_id": c.comment.value.clone()},
                    "u": {"$setOnInsert": set},
                    "upsert": true,
                })
            })
            .collect();
        self.update_many_statements(
            "claim ledger entries for the snapshot",
            &self.names.ledger_of(&fence.stream),
            statements,
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl DirtySet for MongoStore {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        let statements = marks
            .iter()
            .map(|m| {
                // Fenced like every worker write: an entry this stream marked under a newer
                // epoch refuses the write (the upsert then hits the `_id` and is dropped as a
                // duplicate). An entry of another stream (a changed partitioning) is taken over.
                let filter = doc! {
                    "_id": m.post.to_bson(),
                    "$or": [
                        {"stream": {"$ne": &fence.stream}},
                        {"epoch": {"$not": {"$gt": fence.epoch}}},
                    ],
                };
                doc! {
                    "q": filter,
                    "u": {
                        "$inc": {"version": 1_i64},
                        "$set": {"last_dirty_at": now, "stream": &fence.stream, "epoch": fence.epoch},
                        "$max": {"newest_bucket": m.newest_bucket},
                        "$setOnInsert": {"first_dirty_at": now},
                    },
                    "upsert": true,
                }
            })
            .collect();
        let (_, duplicates) = self
            .update_many_statements("mark posts dirty", &self.names.dirty, statements)
            .await?;
        if duplicates > 0 {
            // Two upserts raced on a new entry (another marker or a reconcile clear), or the
            // entry belongs to a newer epoch (this worker is fenced out): either way the entry
            // exists, so the post is dirty and nothing is lost.
            tracing::debug!(stream = %fence.stream, duplicates, "dirty marks not applied: raced, or fenced out by a newer epoch");
        }
        Ok(())
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        let filter = match stream {
            Some(s) => doc! {"stream": s},
            None => doc! {},
        };
        let sort = match order {
            DirtyOrder::Oldest => doc! {"first_dirty_at": 1, "_id": 1},
            DirtyOrder::ByVersion => doc! {"version": -1, "_id": 1},
        };
        let docs: Vec<Document> = self
            .coll(&self.names.dirty)
            .find(filter)
            .sort(sort)
            .limit(limit.min(i64::MAX as usize) as i64)
            .await
            .map_err(|e| map_err("list dirty posts", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("list dirty posts", e))?;
        Ok(docs.iter().filter_map(dirty_from_doc).collect())
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        let dirty = self.coll(&self.names.dirty);
        let size = dirty
            .estimated_document_count()
            .await
            .map_err(|e| map_err("count dirty posts", e))?;
        let oldest = dirty
            .find_one(doc! {})
            .sort(doc! {"first_dirty_at": 1})
            .await
            .map_err(|e| map_err("find the oldest dirty post", e))?
            .and_then(|d| d.get_datetime("first_dirty_at").ok().copied());
        Ok(DirtySummary { size, oldest })
    }

    async fn clear_dirty(&self, post: &PostId, version: i64) -> StoreResult<bool> {
        let result = self
            .coll(&self.names.dirty)
            .delete_one(doc! {"_id": post.to_bson(), "version": version})
            .await
            .map_err(|e| map_err("clear a dirty entry", e))?;
        Ok(result.deleted_count == 1)
    }

    async fn requeue_dirty(&self, post: &PostId, version: i64, now: DateTime) -> StoreResult<bool> {
        let result = self
            .coll(&self.names.dirty)
            .update_one(
                doc! {"_id": post.to_bson(), "version": version},
                doc! {"$set": {"first_dirty_at": now}},
            )
            .await
            .map_err(|e| map_err("requeue a dirty entry", e))?;
        Ok(result.matched_count == 1)
    }
}

#[async_trait]
impl Truth for MongoStore {
    async fn count_live_below(&self, post: &PostId, watermark: i64) -> StoreResult<i64> {
        self.ops.count_queries.fetch_add(1, Ordering::Relaxed);
        let n = self
            .comments
            .count_documents(self.live_below(post, watermark))
            .await
            .map_err(|e| map_err("count live comments", e))?;
        Ok(n as i64)
    }

    async fn count_live_below_at(
        &self,
        post: &PostId,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<i64>> {
        if !self.snapshot_reads().await {
            return Ok(None);
        }
        self.ops.count_queries.fetch_add(1, Ordering::Relaxed);
        let filter = self.live_below(post, watermark);
        match self.count_at(filter, at).await {
            Ok(n) => Ok(Some(n)),
            Err(e) if error_code(&e).is_some_and(|c| SNAPSHOT_GONE.contains(&c)) => {
                tracing::debug!(%post, at = ?at, "snapshot too old; falling back to the quiet window");
                Ok(None)
            }
            Err(e) => Err(map_err("count live comments at a cluster time", e)),
        }
    }

    async fn latest_created(&self, post: &PostId) -> StoreResult<Option<i64>> {
        self.ops.count_queries.fetch_add(1, Ordering::Relaxed);
        let latest = self
            .comments
            .find_one(
                doc! {&self.schema.group: post.to_bson(), &self.schema.created: {"$type": "date"}},
            )
            .sort(doc! {&self.schema.created: -1})
            .projection(doc! {&self.schema.created: 1})
            .await
            .map_err(|e| map_err("find the latest comment", e))?;
        Ok(latest
            .and_then(|d| match Schema::get(&d, &self.schema.created) {
                Some(Bson::DateTime(t)) => Some(*t),
                _ => None,
            })
            .map(|t| t.timestamp_millis().div_euclid(1000)))
    }

    async fn count_live(&self, post: &PostId) -> StoreResult<i64> {
        let n = self
            .comments
            .count_documents(self.live(post))
            .await
            .map_err(|e| map_err("count live comments", e))?;
        Ok(n as i64)
    }

    async fn rows_of_post(&self, post: &PostId) -> StoreResult<Vec<(CommentId, Row)>> {
        let mut cursor = self
            .comments
            .find(doc! {&self.schema.group: post.to_bson()})
            .await
            .map_err(|e| map_err("read the rows of a post", e))?;
        let mut rows = Vec::new();
        while let Some(doc) = cursor
            .try_next()
            .await
            .map_err(|e| map_err("read the rows of a post", e))?
        {
            if let Some(id) = doc.get("_id") {
                rows.push((
                    CommentId::new(id.clone()),
                    self.schema.read_existing_row(&doc),
                ));
            }
        }
        Ok(rows)
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        let comments = &self.comments;
        let last = comments
            .find_one(doc! {})
            .sort(doc! {"_id": -1})
            .projection(doc! {"_id": 1})
            .await
            .map_err(|e| map_err("find the last comment", e))?;
        let estimated_rows = comments
            .estimated_document_count()
            .await
            .map_err(|e| map_err("estimate the comments", e))?;
        Ok(CommentsExtent {
            last_id: last.and_then(|d| d.get("_id").cloned()).map(CommentId::new),
            estimated_rows,
        })
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        let mut range = doc! {"$lte": last.value.clone()};
        if let Some(after) = after {
            range.insert("$gt", after.value.clone());
        }
        let found: Vec<Document> = self
            .comments
            .find(doc! {"_id": range})
            .sort(doc! {"_id": 1})
            .limit(limit as i64)
            .await
            .map_err(|e| map_err("read a snapshot chunk", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("read a snapshot chunk", e))?;
        Ok(found
            .into_iter()
            .filter_map(|d| {
                let id = CommentId::new(d.get("_id")?.clone());
                Some((id, self.schema.read_existing_row(&d)))
            })
            .collect())
    }
}

#[async_trait]
impl Leases for MongoStore {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        let found = self
            .coll(&self.names.leases)
            .find_one(doc! {"_id": stream})
            .await
            .map_err(|e| map_err("read the lease", e))?;
        Ok(found.map(|d| Lease {
            stream: stream.to_string(),
            owner: d.get_str("owner").unwrap_or_default().to_string(),
            expires_at: d
                .get_datetime("expires_at")
                .ok()
                .copied()
                .unwrap_or(DateTime::MIN),
            epoch: d.get_i64("epoch").unwrap_or(0),
        }))
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let filter = doc! {"_id": stream, "$or": [{"expires_at": {"$lt": now}}, {"owner": owner}]};
        let update =
            doc! {"$set": {"owner": owner, "expires_at": expires}, "$inc": {"epoch": 1_i64}};
        let result = self
            .coll(&self.names.leases)
            .find_one_and_update(filter, update)
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .await;
        match result {
            Ok(Some(d)) => Ok(Some(d.get_i64("epoch").unwrap_or(1))),
            Ok(None) => Ok(None),
            Err(e) if error_code(&e) == Some(DUPLICATE_KEY) => Ok(None),
            Err(e) => Err(map_err("acquire the lease", e)),
        }
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let result = self
            .coll(&self.names.leases)
            .update_one(
                doc! {"_id": stream, "owner": owner, "epoch": epoch},
                doc! {"$set": {"expires_at": expires}},
            )
            .await
            .map_err(|e| map_err("renew the lease", e))?;
        Ok(result.matched_count == 1)
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let found = self
            .coll(&self.names.leases)
            .find_one_and_update(
                doc! {"_id": stream},
                doc! {"$set": {"owner": owner, "expires_at": expires}, "$inc": {"epoch": 1_i64}},
            )
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .map_err(|e| map_err("seize the lease", e))?;
        Ok(found.and_then(|d| d.get_i64("epoch").ok()).unwrap_or(1))
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.coll(&self.names.leases)
            .update_one(
                doc! {"_id": stream, "owner": owner, "epoch": epoch},
                doc! {"$set": {"expires_at": DateTime::from_millis(0)}},
            )
            .await
            .map_err(|e| map_err("release the lease", e))?;
        Ok(())
    }
}

#[async_trait]
impl RunHistory for MongoStore {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        let doc = bson::to_document(run).map_err(|e| StoreError::Fatal {
            op: "record a reconcile run",
            message: e.to_string(),
        })?;
        self.coll(&self.names.runs)
            .insert_one(doc)
            .await
            .map_err(|e| map_err("record a reconcile run", e))?;
        Ok(())
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        let found = self
            .coll(&self.names.runs)
            .find_one(doc! {})
            .sort(doc! {"finished_at": -1})
            .await
            .map_err(|e| map_err("read the last reconcile run", e))?;
        Ok(found.as_ref().map(run_from_doc))
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        let found = self
            .coll(&self.names.sweeps)
            .find_one(doc! {"_id": stream})
            .await
            .map_err(|e| map_err("read the sweep cursor", e))?;
        Ok(found.map(|d| SweepCursor {
            after: d.get("after").and_then(PostId::from_bson),
            pass_started: d.get_datetime("pass_started").ok().copied(),
            posts_done: d.get_i64("posts_done").unwrap_or_default() as u64,
            passes: d.get_i64("passes").unwrap_or_default() as u64,
            last_pass_posts: d.get_i64("last_pass_posts").unwrap_or_default() as u64,
        }))
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        let after = cursor.after.as_ref().map_or(Bson::Null, PostId::to_bson);
        let started = cursor.pass_started.map_or(Bson::Null, Bson::DateTime);
        self.coll(&self.names.sweeps)
            .update_one(
                doc! {"_id": stream},
                doc! {"$set": {
                    "after": after,
                    "pass_started": started,
                    "posts_done": cursor.posts_done as i64,
                    "passes": cursor.passes as i64,
                    "last_pass_posts": cursor.last_pass_posts as i64,
                    "updated_at": DateTime::now(),
                }},
            )
            .upsert(true)
            .await
            .map_err(|e| map_err("save the sweep cursor", e))?;
        Ok(())
    }
}

impl MongoStore {
    /// The rows of `post` that count: the group field names it and the soft-delete rule does
    /// not say the row is deleted (the schema's definition, as the worker applies it).
    fn live(&self, post: &PostId) -> Document {
        // Exactly the post ids the worker reads (`PostId::from_bson`): equality alone would
        // also match the double 8.0 for 8, and an array holding the value.
        let types = match post {
            PostId::Int(_) => vec!["int", "long"],
            PostId::Str(_) => vec!["string"],
            PostId::Oid(_) => vec!["objectId"],
        };
        let mut filter = doc! {&self.schema.group: {
            "$eq": post.to_bson(),
            "$type": types,
            "$not": {"$type": "array"},
        }};
        match &self.schema.soft_delete {
            SoftDelete::Present { field } => {
                filter.insert(field, Bson::Null);
            }
            SoftDelete::True { field } => {
                filter.insert(field, doc! {"$ne": true});
            }
            SoftDelete::OneOf { field, values } => {
                filter.insert(field, doc! {"$nin": values.clone()});
            }
            SoftDelete::Never => {}
        }
        filter
    }

    /// The rows of `post` that count and whose creation time is not `>= watermark`.
    fn live_below(&self, post: &PostId, watermark: i64) -> Document {
        let mut filter = self.live(post);
        filter.insert(&self.schema.created, not_gte(to_date(watermark)));
        filter
    }

    /// Whether reads at a cluster time really work, detected once: the server must send
    /// `operationTime`, answer a snapshot read at that time, and refuse one far in the future.
    /// The fake test server accepts `readConcern: snapshot` and ignores it, so accepting is
    /// not enough.
    async fn snapshot_reads(&self) -> bool {
        *self
            .snapshot_reads
            .get_or_init(|| async {
                let probe = async {
                    let reply = self.db.run_command(doc! {"ping": 1}).await.ok()?;
                    let now = reply.get_timestamp("operationTime").ok()?;
                    self.count_at(doc! {"_id": {"$exists": true}}, now)
                        .await
                        .ok()?;
                    let future = Timestamp {
                        time: now.time.saturating_add(24 * 3600),
                        increment: 0,
                    };
                    Some(self.count_at(doc! {}, future).await.is_err())
                };
                let works = probe.await.unwrap_or(false);
                tracing::info!(
                    snapshot_reads = works,
                    "detected whether the server offers snapshot reads at a cluster time"
                );
                works
            })
            .await
    }

    /// Counts `comments` matching `filter` as of cluster time `at`.
    async fn count_at(&self, filter: Document, at: Timestamp) -> Result<i64, DriverError> {
        let reply = self
            .db
            .run_command(doc! {
                "aggregate": self.comments.name(),
                "pipeline": [{"$match": filter}, {"$count": "n"}],
                "cursor": {},
                "readConcern": {"level": "snapshot", "atClusterTime": at},
            })
            .await?;
        let n = reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .and_then(|b| b.first())
            .and_then(Bson::as_document)
            .and_then(|d| d.get("n"))
            .and_then(|n| n.as_i64().or(n.as_i32().map(i64::from)))
            .unwrap_or(0);
        Ok(n)
    }

    /// Opens a change stream on `comments` with `updateLookup` (and pre-images when asked).
    async fn watch(&self, options: &StreamOptions) -> StoreResult<ChangeStream<Document>> {
        let mut watch = self
            .comments
            .watch()
            .pipeline(options.pipeline.clone())
            .full_document(FullDocumentType::UpdateLookup)
            .max_await_time(options.max_await)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary));
        if options.pre_images {
            watch = watch.full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable);
        }
        let mut resumed_after = None;
        match &options.start {
            StreamStart::After(token) => {
                watch = watch.resume_after(token_to_resume(token)?);
                resumed_after = Some(token.clone());
            }
            StreamStart::AtTime(t) => watch = watch.start_at_operation_time(*t),
            StreamStart::Now => {}
        }
        Ok(watch
            .await
            .map_err(|e| stream_err(e, resumed_after.as_ref()))?
            .with_type::<Document>())
    }

    /// A checkpoint write by the worker that owns the stream's current epoch.
    async fn owned_checkpoint_update(
        &self,
        op: &'static str,
        fence: &Fence,
        update: Document,
    ) -> StoreResult<()> {
        let filter = doc! {"_id": &fence.stream, "epoch": fence.epoch};
        self.checkpoint_update(op, fence, filter, update).await
    }

    /// A conditional upsert of the checkpoint; a duplicate key means another epoch owns it.
    async fn checkpoint_update(
        &self,
        op: &'static str,
        fence: &Fence,
        filter: Document,
        update: Document,
    ) -> StoreResult<()> {
        match self
            .coll(&self.names.checkpoints)
            .update_one(filter, update)
            .upsert(true)
            .await
        {
            Ok(_) => Ok(()),
            // The checkpoint exists with another epoch: a successor took the stream.
            Err(e) if error_code(&e) == Some(DUPLICATE_KEY) => Err(StoreError::Fenced {
                stream: fence.stream.clone(),
                epoch: fence.epoch,
            }),
            Err(e) => Err(map_err(op, e)),
        }
    }
}

/// Where the server stands, from the reply to a command: with an `operationTime` (a cluster
/// time) both bounds are just after it; without one, the server's `localTime` (else
/// `local_now`) brackets it by whole seconds. The clock fallback assumes that the server stamps
/// events with its wall clock (true of the fake test server, and of MongoDB while its clock
/// does not step back) and, for `local_now`, that this process's clock agrees with the
/// server's.
pub fn position_from_reply(reply: &Document, local_now: DateTime) -> ServerNow {
    if let Ok(t) = reply.get_timestamp("operationTime") {
        let after = Timestamp {
            time: t.time,
            increment: t.increment.saturating_add(1),
        };
        return ServerNow {
            lower: after,
            upper: after,
        };
    }
    let now = reply
        .get_datetime("localTime")
        .copied()
        .unwrap_or(local_now);
    let secs = crate::clock::secs(now).clamp(0, u32::MAX as i64 - 1) as u32;
    ServerNow {
        lower: Timestamp {
            time: secs,
            increment: 0,
        },
        upper: Timestamp {
            time: secs + 1,
            increment: 0,
        },
    }
}

/// A stored reconcile run.
fn run_from_doc(d: &Document) -> RunSummary {
    RunSummary {
        started_at: d.get_datetime("started_at").ok().copied(),
        finished_at: d.get_datetime("finished_at").ok().copied(),
        kind: d.get_str("kind").unwrap_or_default().to_string(),
        posts: d.get_i64("posts").unwrap_or_default() as u64,
        counts: d.get_i64("counts").unwrap_or_default() as u64,
        corrected: d.get_i64("corrected").unwrap_or_default() as u64,
        total_abs_drift: d.get_i64("total_abs_drift").unwrap_or_default(),
        max_abs_drift: d.get_i64("max_abs_drift").unwrap_or_default(),
        drift_high: d.get_i64("drift_high").unwrap_or_default(),
        drift_low: d.get_i64("drift_low").unwrap_or_default(),
        corrected_high: d.get_i64("corrected_high").unwrap_or_default() as u64,
        corrected_low: d.get_i64("corrected_low").unwrap_or_default() as u64,
        watermark: d.get_i64("watermark").unwrap_or_default(),
        in_flight: d.get_i64("in_flight").unwrap_or_default() as u64,
        waiting: d.get_i64("waiting").unwrap_or_default() as u64,
        snapshot_counts: d.get_i64("snapshot_counts").unwrap_or_default() as u64,
        waiting_for_snapshot: d.get_i64("waiting_for_snapshot").unwrap_or_default() as u64,
    }
}
impl MongoStore {
    /// The newest `limit` reconcile runs (of any process), newest first (`status`).
    pub async fn recent_runs(&self, limit: usize) -> StoreResult<Vec<RunSummary>> {
        let docs: Vec<Document> = self
            .coll(&self.names.runs)
            .find(doc! {})
            .sort(doc! {"finished_at": -1})
            .limit(limit.min(i64::MAX as usize) as i64)
            .await
            .map_err(|e| map_err("read recent reconcile runs", e))?
            .try_collect()
            .await
            .map_err(|e| map_err("read recent reconcile runs", e))?;
        Ok(docs.iter().map(run_from_doc).collect())
    }

    /// The newest reconcile run that corrected at least one counter (`status`).
    pub async fn last_correcting_run(&self) -> StoreResult<Option<RunSummary>> {
        let found = self
            .coll(&self.names.runs)
            .find_one(doc! {"corrected": {"$gt": 0_i64}})
            .sort(doc! {"finished_at": -1})
            .await
            .map_err(|e| map_err("read the last correcting reconcile run", e))?;
        Ok(found.as_ref().map(run_from_doc))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    #[test]
    fn a_reply_with_an_operation_time_gives_exact_bounds() {
        let reply = doc! {"ok": 1, "operationTime": ts(1_700_000_000, 7)};
        let now = position_from_reply(&reply, DateTime::from_millis(0));
        assert_eq!(now.lower, ts(1_700_000_000, 8));
        assert_eq!(now.upper, ts(1_700_000_000, 8));
    }

    #[test]
    fn a_reply_without_one_brackets_the_server_clock_by_whole_seconds() {
        // The fake server: no operationTime; its isMaster reports localTime.
        let reply = doc! {"ismaster": true, "localTime": DateTime::from_millis(1_700_000_000_900)};
        let now = position_from_reply(&reply, DateTime::from_millis(0));
        assert_eq!(
            now.lower,
            ts(1_700_000_000, 0),
            "every event before it is older than the reading"
        );
        assert_eq!(
            now.upper,
            ts(1_700_000_001, 0),
            "every event the reading could have seen is before it"
        );
        // Nor localTime: this process's clock.
        let bare = position_from_reply(&doc! {"ok": 1}, DateTime::from_millis(1_700_000_005_001));
        assert_eq!(
            (bare.lower, bare.upper),
            (ts(1_700_000_005, 0), ts(1_700_000_006, 0))
        );
    }
}
