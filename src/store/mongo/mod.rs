//! The store over MongoDB: the only module that builds MongoDB commands.
//!
//! Everything here is a plain conditional update (`filter` + `$inc`/`$set`/`$unset`/`$max`):
//! no transactions, no pipeline updates, so it runs on every MongoDB-compatible server,
//! including the fake one the tests fall back to.
//!
//! Here: connecting, ability detection, indexes and the [`MongoStore`] itself. Beside it:
//! `errors` (driver errors sorted by what the caller should do), `stream` (the change-stream
//! adapter and the server's cluster time), `pump` (the stream's reader, ahead of the worker),
//! `documents` (the stored documents, mostly serde-derived, their shapes pinned by tests), and
//! one file per store trait: `checkpoints`, `counters`, `ledger`, `dirty`, `truth`, `leases`,
//! `run_history`.

mod cause;
mod checkpoints;
mod counters;
mod dirty;
mod documents;
mod errors;
mod leases;
mod ledger;
mod observe;
mod preflight;
mod pump;
mod run_history;
mod stream;
mod truth;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{
    self, doc, rawdoc, Bson, DateTime, Document, RawArrayBuf, RawBson, RawDocumentBuf, Timestamp,
};
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::error::{Error as DriverError, ErrorKind};
use mongodb::options::{
    ClientOptions, FullDocumentBeforeChangeType, FullDocumentType, ReadPreference,
    SelectionCriteria,
};
use mongodb::{Client, Collection, Database};

use super::*;

use self::documents::*;
use self::errors::*;
use self::observe::Observe;
use crate::core::batch::{CounterDelta, CounterWrite, DirtyMark};
use crate::core::definition::stored_name;
use crate::core::event::{CommentId, LedgerUpdate, Row, Token};
use crate::core::fold::{CounterState, Fold};
use crate::core::key::{CounterIx, GroupValue};
use crate::core::schema::{Schema, SoftDelete};
use crate::core::time::{later, BucketStart};
use crate::core::window::{Touch, LOG_ENTRIES};

/// Field names of counterd's own ledger and pending-batch documents (not the application's:
/// those come from the [`Schema`]).
const LEDGER_POST: &str = "post_id";
const LEDGER_CREATED: &str = "created_at";
/// A ledger entry's verdicts per counter definition beyond the default.
const LEDGER_MEMBERS: &str = "members";

/// The names of counterd's own collections: a prefix (default `counterd_`) for its bookkeeping,
/// and the counters collection that readers query (default `comment_counters`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collections {
    pub counters: String,
    pub ledger: String,
    pub dirty: String,
    pub checkpoints: String,
    /// Batches whose counters a worker carries (see [`crate::core::carry`]), one document each,
    /// until the carry is written.
    pub carried: String,
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
            carried: format!("{prefix}carried"),
            leases: format!("{prefix}leases"),
            runs: format!("{prefix}reconcile_runs"),
            sweeps: format!("{prefix}sweeps"),
        }
    }

    /// The dirty set of the counter definition `counter`, named `name`: definition 0 keeps
    /// `<prefix>dirty` (so an existing database works unchanged), every other
    /// `<prefix>dirty_<name>` (see [`stored_name`]).
    pub fn dirty_of(&self, counter: CounterIx, name: &str) -> String {
        match stored_name(counter, name) {
            None => self.dirty.clone(),
            Some(name) => format!("{}_{name}", self.dirty),
        }
    }

    /// The ledger collection of a stream: partitions (`<base>/pNofM`) keep their own.
    pub fn ledger_of(&self, stream: &str) -> String {
        match stream.split_once('/') {
            Some((_, partition)) => format!("{}_{partition}", self.ledger),
            None => self.ledger.clone(),
        }
    }
}

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

/// The MongoDB implementation of [`Store`].
#[derive(Clone)]
pub struct MongoStore {
    /// Whether snapshot reads at a cluster time really work here (probed once, on first use).
    snapshot_reads: Arc<tokio::sync::OnceCell<bool>>,
    db: Database,
    comments: Collection<Document>,
    names: Collections,
    schema: Schema,
    /// The counter definition this handle serves (see [`CounterViews`]).
    counter: CounterIx,
}

/// Where one counter definition keeps its counters and dirty entries, and which rows it counts.
pub(super) struct Place<'a> {
    /// Its counters collection.
    pub counters: &'a str,
    /// Its dirty set's collection.
    pub dirty: String,
    /// The field that groups its rows.
    pub group: &'a str,
    /// What its rows must satisfy beyond being live (`None`: nothing).
    pub condition: Option<&'a crate::core::condition::Condition>,
    /// The field a sum adds up (`None`: a count).
    pub sum: Option<&'a str>,
    /// Where its counter's fields live in the counter document: `""`, or `"rows."` for a
    /// sum's row count (`with_count`), which shares the sum's documents.
    pub prefix: &'static str,
}

impl CounterViews for MongoStore {
    fn for_counter(&self, counter: CounterIx) -> MongoStore {
        MongoStore {
            counter,
            ..self.clone()
        }
    }

    fn viewed_counter(&self) -> CounterIx {
        self.counter
    }

    fn viewed_shared(&self) -> bool {
        self.schema.shared(self.counter)
    }
}

/// Checks that the server at `hosts` answers within `connect_timeout`: an error says whether
/// it could not be reached (transient) or refused counterd.
async fn ping(db: &Database, hosts: &str, connect_timeout: Duration) -> StoreResult<()> {
    // `isMaster` rather than `hello`: some compatible servers only answer the former.
    db.run_command(doc! {"isMaster": 1}).await.map_err(|e| {
        let transient = unreachable_for_now(&e);
        let detail = if transient {
            format!(
                "cannot reach MongoDB at {hosts} within {}: {}",
                humantime::format_duration(connect_timeout),
                sentence(&e)
            )
        } else {
            format!("MongoDB at {hosts} refused counterd: {}", sentence(&e))
        };
        driver_error("connect", transient, detail, e)
    })?;
    Ok(())
}

impl MongoStore {
    /// Connects and checks that the server answers, with an error that names the host, what
    /// failed and what to check.
    pub async fn connect(options: &ConnectOptions) -> StoreResult<MongoStore> {
        crate::redact::remember_secrets(&options.uri);
        let mut client_options = ClientOptions::parse(&options.uri).await.map_err(|e| {
            let said = crate::redact::redact_text_for(&sentence(&e), &options.uri);
            let detail = format!("{said} (check `mongodb_uri`: {})", crate::redact::URI_SHAPE);
            driver_error("parse the MongoDB URI", false, detail, e)
        })?;
        client_options.server_selection_timeout = Some(options.connect_timeout);
        client_options.connect_timeout = Some(options.connect_timeout);
        client_options.app_name = Some("counterd".to_string());
        // No command monitor: latency is observed per store call (see `observe`), because the
        // driver copies every command and reply into a document for a monitor.
        let hosts: Vec<String> = client_options.hosts.iter().map(|h| h.to_string()).collect();
        let client = Client::with_options(client_options)
            .map_err(|e| driver_error("create the MongoDB client", false, sentence(&e), e))?;
        let db = client.database(&options.database);
        ping(&db, &hosts.join(","), options.connect_timeout).await?;
        let comments = db.collection(&options.comments);
        Ok(MongoStore {
            snapshot_reads: Arc::default(),
            db,
            comments,
            names: options.collections.clone(),
            schema: options.schema.clone(),
            counter: CounterIx::default(),
        })
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    fn coll(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// Where definition `counter` of the schema lives.
    pub(super) fn place(&self, op: &'static str, counter: CounterIx) -> StoreResult<Place<'_>> {
        let definition = self
            .schema
            .definitions
            .get(counter)
            .ok_or_else(|| unknown_counter(op, counter))?;
        Ok(Place {
            counters: &definition.collection,
            dirty: self.names.dirty_of(counter, &definition.name),
            group: &definition.group,
            condition: (!definition.condition.is_empty()).then_some(&definition.condition),
            sum: definition.kind.field(),
            prefix: definition.kind.field_prefix(),
        })
    }

    /// Where the definition this handle serves lives.
    pub(super) fn here(&self, op: &'static str) -> StoreResult<Place<'_>> {
        self.place(op, self.counter)
    }

    /// Every definition's place, the default first.
    fn places(&self) -> Vec<Place<'_>> {
        self.schema
            .definitions
            .iter()
            .filter_map(|(i, _)| self.place("list counter definitions", i).ok())
            .collect()
    }

    /// Creates the indexes counterd relies on (idempotent).
    pub async fn ensure_indexes(&self) -> StoreResult<()> {
        self.ensure_indexes_with(true).await
    }

    /// Creates the indexes counterd relies on, and `{count: -1}` on the counters for top-N
    /// reads when `count_index` (idempotent); then gives counters written before `count` was
    /// maintained their `count`, so that the worker's `$inc` of it starts from the right value.
    /// Every definition gets the same: its dirty set ordered by age, its counters by `count`.
    pub async fn ensure_indexes_with(&self, count_index: bool) -> StoreResult<()> {
        let mut commands = vec![
            doc! {"createIndexes": &self.names.ledger, "indexes": [{"key": {"gone_at": 1}, "name": "gone_ttl", "expireAfterSeconds": 7 * 24 * 3600}]},
            doc! {"createIndexes": &self.names.runs, "indexes": [{"key": {"finished_at": 1}, "name": "runs_ttl", "expireAfterSeconds": 30 * 24 * 3600}]},
        ];
        for place in self.places() {
            commands.push(doc! {"createIndexes": &place.dirty, "indexes": [{"key": {"first_dirty_at": 1}, "name": "first_dirty_at"}]});
            if count_index {
                // A sum's row count indexes its own `count` beside the sum's, by another name
                // (`rows.count`, `rows_count_desc`).
                let key = format!("{}count", place.prefix);
                let name = format!("{}count_desc", place.prefix.replace('.', "_"));
                commands.push(doc! {"createIndexes": place.counters, "indexes": [{"key": {key: -1}, "name": name}]});
            }
        }
        for command in commands {
            self.db
                .run_command(command)
                .observed("create indexes")
                .await?;
        }
        // Row counts of sums are newer than `count`: none lacks it.
        for place in self.places().into_iter().filter(|p| p.prefix.is_empty()) {
            self.backfill_count(place.counters).await?;
        }
        Ok(())
    }

    /// Sets `count = base_count + live_delta` on counters that lack it, each conditioned on the
    /// numbers read (a worker or reconciler that moved it meanwhile wins, and the next start
    /// looks again).
    async fn backfill_count(&self, collection: &str) -> StoreResult<()> {
        let counters = self.coll(collection);
        let mut missing = counters
            .find(doc! {"count": {"$exists": false}})
            .projection(doc! {"base_count": 1, "live_delta": 1})
            .observed("find counters without count")
            .await?;
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
                .observed("fill in a counter's count")
                .await?;
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
            .observed("isMaster")
            .await?;
        // A server that refuses `hello` or `buildInfo` lacks it; one whose reply was lost says
        // nothing either way, so the probe fails and is retried rather than taken as a "no".
        let hello = ask(&self.db, doc! {"hello": 1}, "hello").await?.is_some();
        let build = ask(&self.db, doc! {"buildInfo": 1}, "buildInfo").await?;
        let version = build.as_ref().and_then(|b| b.get_str("version").ok());
        let version = version.unwrap_or("unknown").to_string();
        let major = version
            .split('.')
            .next()
            .and_then(|m| m.parse::<i32>().ok());
        let major = major.unwrap_or(0);
        let wire_version = is_master.get_i32("maxWireVersion").unwrap_or(0);
        let replica_set =
            is_master.contains_key("setName") || is_master.get_str("msg") == Ok("isdbgrid");
        let sessions = is_master.contains_key("logicalSessionTimeoutMinutes");
        let pre_images = major >= 6 && hello && self.pre_images_enabled().await?;
        Ok(ServerAbilities {
            version,
            wire_version,
            hello,
            sessions,
            pre_images,
            // Probed for real (see `snapshot_reads`): never assumed from the version.
            snapshot_reads: replica_set && self.snapshot_reads().await,
        })
    }

    /// Whether `changeStreamPreAndPostImages` is enabled on the comments collection; a lost
    /// reply is an error (retried at start-up), never a "no".
    async fn pre_images_enabled(&self) -> StoreResult<bool> {
        let entry = answered(self.comments_entry().await, "list collections")?.flatten();
        Ok(entry.as_ref().is_some_and(crate::doctor::pre_images_on))
    }

    /// The documents `find` finds by `_id` among `ids`, read [`IDS_PER_READ`] ids per `$in`, each
    /// kept as `keep` makes it (`None`: left out) under its comment key.
    async fn by_ids<'a, T>(
        &self,
        op: &'static str,
        ids: &[CommentId],
        find: impl Fn(Document) -> mongodb::action::Find<'a, Document>,
        mut keep: impl FnMut(Document) -> Option<T>,
    ) -> StoreResult<HashMap<String, T>> {
        let mut out = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_READ) {
            let values: Vec<Bson> = chunk.iter().map(|c| c.value.clone()).collect();
            let mut cursor = find(doc! {"_id": {"$in": values}}).observed(op).await?;
            while let Some(found) = cursor.try_next().await.map_err(|e| map_err(op, e))? {
                let key = found.get("_id").map(|id| CommentId::new(id.clone()).key);
                if let Some((key, kept)) = key.zip(keep(found)) {
                    out.insert(key, kept);
                }
            }
        }
        Ok(out)
    }

    /// Runs `update` commands of many statements, `ordered: false`, one statement per item;
    /// returns the statements rejected by a duplicate key (every other write error fails the
    /// command, so the others wrote). Each command's statements are built just before it is
    /// sent, so a large batch never holds all of its statements at once; each is built straight
    /// as raw BSON, which skips building a document tree and encoding it.
    async fn update_many_statements<T, F>(
        &self,
        op: &'static str,
        collection: &str,
        items: &[T],
        statement: F,
    ) -> StoreResult<u64>
    where
        T: Sync,
        F: Fn(&T) -> StoreResult<RawDocumentBuf> + Sync,
    {
        let mut duplicates = 0;
        // Servers cap a command at maxWriteBatchSize statements (1000 on old ones).
        for items in items.chunks(1000) {
            // Each statement goes to raw BSON as soon as it is built: a thousand statements
            // as document trees held megabytes (see `budget::cost`), as bytes a few hundred KB.
            let chunk = items.iter().map(&statement);
            let chunk = chunk.collect::<StoreResult<RawArrayBuf>>()?;
            let reply = self
                .db
                .run_raw_command(rawdoc! {"update": collection, "updates": chunk, "ordered": false})
                .observed(op)
                .await?;
            duplicates += write_errors(op, &reply)?;
        }
        Ok(duplicates)
    }
}

/// Ids per batched read by `_id`: one command for a batch of any size the budget allows.
const IDS_PER_READ: usize = 5000;

/// A value as raw BSON, for statements built raw.
pub(super) fn raw_value(op: &'static str, value: Bson) -> StoreResult<RawBson> {
    RawBson::try_from(value).map_err(unencodable(op))
}

/// A value `op` could not encode as BSON: a bug, reported as fatal rather than a panic.
pub(super) fn unencodable<E: std::fmt::Display>(op: &'static str) -> impl Fn(E) -> StoreError {
    move |e| StoreError::Fatal {
        op,
        message: e.to_string(),
    }
}

/// The duplicate-key errors of a write command's reply (an upsert that raced, or hit an entry
/// of a newer epoch); any other write error, or a write concern error, is the command's error.
fn write_errors(op: &'static str, reply: &Document) -> StoreResult<u64> {
    let mut duplicates = 0;
    for error in reply.get_array("writeErrors").ok().into_iter().flatten() {
        let error = error.as_document().cloned().unwrap_or_default();
        let code = error.get_i32("code").unwrap_or(0);
        if code == DUPLICATE_KEY {
            duplicates += 1;
            continue;
        }
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
    if let Ok(wce) = reply.get_document("writeConcernError") {
        return Err(StoreError::Transient {
            op,
            message: format!("write concern error: {wce}"),
        });
    }
    Ok(duplicates)
}

/// A probe's or an optional reading's reply: `Some` when the server answered, `None` when it
/// refused the command (it lacks it, or does not allow it: not reported), an error when the
/// reply was lost to a transient fault (retried, never taken for a server that reports nothing).
fn answered<T>(reply: Result<T, DriverError>, op: &'static str) -> StoreResult<Option<T>> {
    match reply {
        Ok(reply) => Ok(Some(reply)),
        Err(e) => match map_err(op, e) {
            e if e.is_transient() => Err(e),
            _ => Ok(None),
        },
    }
}

/// An optional reading or a probe: `command`'s reply by [`answered`]'s rule.
async fn ask(db: &Database, command: Document, op: &'static str) -> StoreResult<Option<Document>> {
    answered(db.run_command(command).await, op)
}

/// The documents of a cursor command's reply (its `cursor.firstBatch`).
fn first_batch(reply: &Document) -> impl Iterator<Item = &Document> {
    let batch = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"));
    batch.into_iter().flatten().filter_map(Bson::as_document)
}

/// `field` is not `>= value`: matches a smaller value, a missing field, or another type.
fn not_gte(value: impl Into<Bson>) -> Document {
    doc! {"$not": {"$gte": value.into()}}
}

/// The filter of a guarded, fenced worker write, as raw BSON: the document `id` whose `guard`
/// is not `>= through` (as [`not_gte`]), and whose `epoch` field (the document's, or a
/// partition's own: see `Writer`) is not newer than ours: the fencing condition every worker
/// write carries.
fn guarded_raw(
    id: RawBson,
    guard: &str,
    through: impl Into<RawBson>,
    epoch: &str,
    fence: &Fence,
) -> RawDocumentBuf {
    rawdoc! {
        "_id": id,
        guard: {"$not": {"$gte": through.into()}},
        epoch: {"$not": {"$gt": fence.epoch}},
    }
}

fn to_date(secs: i64) -> DateTime {
    DateTime::from_millis(secs.saturating_mul(1000))
}
