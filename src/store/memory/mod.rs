//! The in-process store: every concern of the seam kept in maps, with MongoDB's semantics
//! statement for statement, so that the deterministic simulation and the store contract can run
//! counterd's logic without a server. Compiled only with the `test-utils` feature.
//!
//! What "MongoDB's semantics" means here: guarded upserts whose failed guard is a duplicate key
//! ("already applied"), checkpoint updates filtered on the epoch whose failed upsert is
//! `Fenced`, the conditional fold install, `count_live_below` as "not `>=`", a negative `limit`
//! meaning one batch of `|limit|`. Like the fake test server it has no snapshot reads
//! (`count_live_below_at` is `None`); `read_position` is exact, like an `operationTime`.
//! `tests/store_contract.rs` runs the same cases against this store and MongoDB.
//!
//! Besides counterd's collections it holds the truth (`comments`) and an oplog whose change
//! events are shaped like the ones a real MongoDB 6/7 emits with `fullDocument: updateLookup`:
//! the looked-up document of an update is the row *as it is when the event is read* (null once
//! the row is gone), which is what makes recovery tricky.
//!
//! Two layers, so that a wrapper can step between statements:
//! - [`Memory`]: the tables and their operations, synchronous, one method per *statement*
//!   (`apply_counter` is one statement of `apply_counters`), so a fault-injecting wrapper can
//!   apply any subset of a multi-statement write, and yield between statements;
//! - [`MemoryStore`]: the seam's traits over a shared `Memory`, each call one lock.
//!
//! Time is the store's own clock (`Memory::clock`, seconds), moved by whoever drives the test.

mod checkpoints;
mod counters;
mod dirty;
mod leases;
mod ledger;
mod run_history;
mod stream;
mod truth;

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use bson::{DateTime, Document, Timestamp};
use rand::rngs::StdRng;
use rand::SeedableRng;

pub use self::checkpoints::CheckpointRec;
pub use self::counters::CounterRec;
pub use self::dirty::DirtyRec;
pub use self::ledger::LedgerRec;
pub use self::stream::{drained_token, Cursor, OpKind, OpenTxn, OplogEntry, OplogTxn};
pub use self::truth::row_facts;
use crate::core::definition::Definition;
use crate::core::key::{CounterIx, GroupValue};
use crate::core::schema::Schema;
use crate::store::{RunSummary, SweepCursor};

/// The application's fields: the in-process truth uses counterd's default schema.
pub const POST_FIELD: &str = "post_id";
pub const CREATED_FIELD: &str = "created_at";
pub const DELETED_FIELD: &str = "deleted_at";

/// A batch's counters and dirty marks stored under its carry's id (a document of the carried
/// collection): the carry, and the epoch of the worker that stored it.
#[derive(Clone, Debug, PartialEq)]
pub struct CarriedCopy {
    pub carry: String,
    pub epoch: i64,
    pub batch: crate::core::batch::PendingBatch,
}

/// Everything the store holds. Fields are public: the test that owns the store may read any
/// table, and edit one by hand the way an operator would in the shell.
pub struct Memory {
    /// The server's clock, in seconds (`updated_at`, the oplog's cluster times).
    pub clock: i64,
    /// The truth: comment rows by `_id`.
    pub comments: BTreeMap<i64, Document>,
    pub oplog: Vec<OplogEntry>,
    /// Entries below this index have been truncated away (the oplog window).
    pub oplog_floor: usize,
    /// The cluster time of the newest oplog entry.
    pub last_time: Timestamp,
    /// The multi-document transaction being written, if any (see `Memory::begin_transaction`).
    pub open_txn: Option<OpenTxn>,
    /// `changeStreamPreAndPostImages` enabled on the collection.
    pub pre_images_enabled: bool,
    /// Update events carry `updateDescription` (a real server); without it (some compatible
    /// servers) only the looked-up document tells what changed.
    pub update_descriptions: bool,
    /// Reads carry a post-batch resume token (a real server); some servers send none.
    pub post_batch_tokens: bool,
    /// Ledger entries by (collection, comment key): each partition keeps its own collection.
    pub ledger: BTreeMap<(String, String), LedgerRec>,
    /// The counter definitions, in order: the default schema's (every row of a post counts)
    /// and the worker's `Schema::counters` after it. Counts read rows through them.
    pub definitions: Vec<Definition>,
    /// Each definition's counters and dirty set, by its place, each its own "collections".
    pub tables: Vec<CounterTables>,
    pub checkpoints: BTreeMap<String, CheckpointRec>,
    /// Carried batches by stream and end (the carried collection).
    pub carried: BTreeMap<(String, String), CarriedCopy>,
    pub leases: BTreeMap<String, crate::store::Lease>,
    pub runs: Vec<RunSummary>,
    pub sweeps: BTreeMap<String, SweepCursor>,
    /// `$sample`'s randomness (seeded, so a test's sample replays).
    pub sample_rng: StdRng,
}

impl Memory {
    /// An empty store whose clock reads `clock` seconds.
    pub fn new(clock: i64) -> Memory {
        Memory {
            clock,
            comments: BTreeMap::new(),
            oplog: Vec::new(),
            oplog_floor: 0,
            last_time: Timestamp {
                time: 0,
                increment: 0,
            },
            open_txn: None,
            pre_images_enabled: false,
            update_descriptions: true,
            post_batch_tokens: true,
            ledger: BTreeMap::new(),
            definitions: vec![Schema::default().definitions.first().clone()],
            tables: vec![CounterTables::default()],
            checkpoints: BTreeMap::new(),
            carried: BTreeMap::new(),
            leases: BTreeMap::new(),
            runs: Vec::new(),
            sweeps: BTreeMap::new(),
            sample_rng: StdRng::seed_from_u64(0),
        }
    }

    /// The clock as a date.
    pub fn now(&self) -> DateTime {
        DateTime::from_millis(self.clock * 1000)
    }

    /// Keeps counters for these definitions beyond the default too (what `[[counters]]`
    /// configures; the worker's schema must carry the same): each gets empty tables.
    pub fn define_counters(&mut self, more: Vec<Definition>) {
        self.definitions.truncate(1);
        self.definitions.extend(more);
        self.tables = vec![CounterTables::default(); self.definitions.len()];
    }

    /// Definition `counter`'s counters and dirty set, empty for no such definition (what a
    /// read of a collection that does not exist finds).
    pub fn tables(&self, counter: CounterIx) -> &CounterTables {
        static NONE: CounterTables = CounterTables {
            counters: BTreeMap::new(),
            dirty: BTreeMap::new(),
        };
        self.tables.get(counter.0).unwrap_or(&NONE)
    }

    /// Definition `counter`'s tables, to write (`None`: no such definition).
    pub fn tables_mut(&mut self, counter: CounterIx) -> Option<&mut CounterTables> {
        self.tables.get_mut(counter.0)
    }

    /// The definitions whose tables exist, the default first.
    pub fn counter_ixs(&self) -> Vec<CounterIx> {
        (0..self.tables.len()).map(CounterIx).collect()
    }
}

/// One definition's "collections": its counters and its dirty set.
#[derive(Clone, Debug, Default)]
pub struct CounterTables {
    pub counters: BTreeMap<GroupValue, CounterRec>,
    pub dirty: BTreeMap<GroupValue, DirtyRec>,
}

/// The in-process store behind the seam's traits. Clones share the same tables.
#[derive(Clone)]
pub struct MemoryStore {
    memory: Arc<Mutex<Memory>>,
    /// The counter definition this handle serves (see [`crate::store::CounterViews`]).
    counter: CounterIx,
}

impl crate::store::CounterViews for MemoryStore {
    fn for_counter(&self, counter: CounterIx) -> MemoryStore {
        MemoryStore {
            memory: self.memory.clone(),
            counter,
        }
    }

    fn viewed_counter(&self) -> CounterIx {
        self.counter
    }

    fn viewed_shared(&self) -> bool {
        self.lock().shared(self.counter)
    }
}

impl MemoryStore {
    pub fn new(clock: i64) -> MemoryStore {
        MemoryStore {
            memory: Arc::new(Mutex::new(Memory::new(clock))),
            counter: CounterIx(0),
        }
    }

    /// The tables (never held across an `.await`).
    pub fn lock(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `field` is not `>= value`, for an optional string field: the token guard's filter
/// (`applied_through: {$not: {$gte: through}}`).
pub fn not_gte(field: Option<&str>, value: &str) -> bool {
    field.is_none_or(|f| f < value)
}

/// Mongo's `limit(n)` as the MongoDB store sends it (`limit.min(i64::MAX) as i64`): 0 is no
/// limit, a negative limit is one batch of `|n|`.
fn mongo_limit(limit: usize) -> usize {
    match limit.min(i64::MAX as usize) as i64 {
        0 => usize::MAX,
        n => n.unsigned_abs() as usize,
    }
}

/// `update_one({_id: key, <filter>}, .., upsert: true)` on a table: the document to update,
/// made by `new` where there is none, or `None` where the one there fails the filter `admits`
/// (the upsert's insert hits its `_id`: a duplicate key).
fn upsert<K: Ord, V>(
    table: &mut BTreeMap<K, V>,
    key: K,
    admits: impl FnOnce(&V) -> bool,
    new: impl FnOnce() -> V,
) -> Option<&mut V> {
    match table.entry(key) {
        Entry::Occupied(doc) => admits(doc.get()).then(|| doc.into_mut()),
        Entry::Vacant(slot) => Some(slot.insert(new())),
    }
}

/// A document's `epoch` is not newer than the fence's: the worker's writes filter on this.
fn fence_ok(epoch: Option<i64>, fence: &crate::store::Fence) -> bool {
    epoch.is_none_or(|e| e <= fence.epoch)
}

/// Implements one of the seam's traits for [`MemoryStore`]: each method takes the lock and calls
/// the [`Memory`] method of the same name, whose result is the reply (`ok`: a plain value, the
/// call cannot fail; `try`: a `StoreResult`; `view`: a plain value of the handle's counter
/// definition, passed first).
macro_rules! seam {
    ($trait:ident { $($kind:ident fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)* }) => {
        #[async_trait::async_trait]
        impl crate::store::$trait for MemoryStore {
            $(
                async fn $name(&self, $($arg: $ty),*) -> crate::store::StoreResult<$ret> {
                    seam!(@$kind self . $name ($($arg),*))
                }
            )*
        }
    };
    (@view $store:ident . $name:ident ($($arg:ident),*)) => {
        Ok($store.lock().$name($store.counter, $($arg),*))
    };
    (@ok $store:ident . $name:ident ($($arg:ident),*)) => {
        Ok($store.lock().$name($($arg),*))
    };
    (@try $store:ident . $name:ident ($($arg:ident),*)) => {
        $store.lock().$name($($arg),*)
    };
}
use seam;
