//! A store that counts what passes through it: [`CountingStore`] wraps any [`Store`], delegates
//! every call unchanged, and tallies per concern the calls made (each at least one round trip to
//! a server store) and the write statements they carry (one per document a bulk call writes).
//!
//! The benchmark measures counterd's server-independent costs with it (write statements per
//! event, round trips per 1 000 events) and the tests assert coalescing and recount budgets
//! through it, so the stores themselves keep no instrumentation.
//!
//! Here: the tallies and the wrapper, and the change stream's delegation; beside it, `writes`
//! (checkpoints, counters, ledger, dirty set), `reads` (truth, leases, run history) and
//! `recording` (the worker's writes kept to be replayed).

mod reads;
mod recording;
mod writes;

pub use recording::{Call, Write};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bson::{DateTime, Document, Timestamp};
use serde::Serialize;

use super::*;
use crate::core::batch::{CounterDelta, CounterWrite, DirtyMark};
use crate::core::cost::ReadLimit;
use crate::core::event::{CommentId, Row, Token};
use crate::core::event::{LedgerUpdate, LedgerView};
use crate::core::fold::Fold;
use crate::core::key::GroupValue;

/// The concerns of the store, one per trait (the change stream's reads count as [`Stream`]).
///
/// [`Stream`]: Concern::Stream
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, strum::VariantArray)]
#[serde(rename_all = "snake_case")]
pub enum Concern {
    Stream,
    Checkpoints,
    Counters,
    Ledger,
    Dirty,
    Truth,
    Leases,
    Runs,
}

impl Concern {
    pub const ALL: &'static [Concern] = <Concern as strum::VariantArray>::VARIANTS;
}

/// What one concern saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    /// Calls into the store (each at least one round trip to a server store).
    pub calls: u64,
    /// Write statements: documents written, one per entry of a bulk call.
    pub statements: u64,
    /// Wall time spent inside the calls, in microseconds (the server's and the driver's share
    /// of a phase; calls that overlap each count their own).
    pub micros: u64,
}

/// The tallies at one moment; subtract two with [`Counts::since`] to measure a phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub by_concern: HashMap<Concern, Tally>,
    /// Recount queries against `comments` (the reconciler's cost): counts below a watermark
    /// (direct or at a cluster time) and latest-row lookups.
    pub count_queries: u64,
    /// Posts those queries were about (a query over a group of posts counts each).
    pub posts_counted: u64,
}

impl Counts {
    pub fn of(&self, concern: Concern) -> Tally {
        self.by_concern.get(&concern).copied().unwrap_or_default()
    }

    /// Write statements of every concern.
    pub fn statements(&self) -> u64 {
        self.by_concern.values().map(|t| t.statements).sum()
    }

    /// Calls of every concern.
    pub fn calls(&self) -> u64 {
        self.by_concern.values().map(|t| t.calls).sum()
    }

    /// What happened after `earlier` was taken.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let by_concern = Concern::ALL
            .iter()
            .map(|&c| {
                let (now, then) = (self.of(c), earlier.of(c));
                let tally = Tally {
                    calls: now.calls - then.calls,
                    statements: now.statements - then.statements,
                    micros: now.micros - then.micros,
                };
                (c, tally)
            })
            .collect();
        Counts {
            by_concern,
            count_queries: self.count_queries - earlier.count_queries,
            posts_counted: self.posts_counted - earlier.posts_counted,
        }
    }
}

/// The tallies of a store, its clones and views, and the streams they open.
#[derive(Default)]
struct Tallies(Mutex<Counts>);

impl Tallies {
    fn lock(&self) -> MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one call of `concern` carrying `statements` writes, and the time it took.
    async fn timed<T>(
        &self,
        concern: Concern,
        statements: usize,
        call: impl std::future::Future<Output = T>,
    ) -> T {
        {
            let mut counts = self.lock();
            let tally = counts.by_concern.entry(concern).or_default();
            tally.calls += 1;
            tally.statements += statements as u64;
        }
        let started = Instant::now();
        let result = call.await;
        let micros = started.elapsed().as_micros() as u64;
        self.lock().by_concern.entry(concern).or_default().micros += micros;
        result
    }
}

/// Any [`Store`], counted. Clones share their tallies.
#[derive(Clone)]
pub struct CountingStore<S> {
    inner: S,
    tallies: Arc<Tallies>,
    recorder: recording::Recorder,
}

impl<S> CountingStore<S> {
    pub fn new(inner: S) -> CountingStore<S> {
        CountingStore {
            inner,
            tallies: Arc::default(),
            recorder: None,
        }
    }

    /// Counts, and keeps a copy of every write the worker makes through it (intents,
    /// checkpoints, counters, ledger, dirty marks), to be replayed with [`Write::replay`].
    /// The copies cost memory and CPU: for a baseline run, not for one that is measured.
    pub fn recording(inner: S) -> CountingStore<S> {
        CountingStore {
            recorder: Some(Arc::default()),
            ..CountingStore::new(inner)
        }
    }

    /// The writes kept so far (see [`CountingStore::recording`]), oldest first; none when
    /// not recording.
    pub fn take_recorded(&self) -> Vec<Write> {
        self.recorder.as_ref().map_or_else(Vec::new, |r| {
            std::mem::take(&mut *r.lock().unwrap_or_else(|e| e.into_inner()))
        })
    }

    /// Keeps `write()` when recording (made only then).
    fn record(&self, write: impl FnOnce() -> Write) {
        if let Some(recorder) = &self.recorder {
            recorder
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(write());
        }
    }

    /// The store underneath (its calls are not counted).
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Everything counted so far through this store and its clones.
    pub fn counts(&self) -> Counts {
        self.tallies.lock().clone()
    }

    /// One recount query about `posts` posts.
    fn count_query_of(&self, posts: usize) {
        let mut counts = self.tallies.lock();
        counts.count_queries += 1;
        counts.posts_counted += posts as u64;
    }
}

/// Implements a store trait for [`CountingStore`] by delegating each listed method to the
/// store underneath, unchanged, timed as one call of `$concern` carrying `$statements` write
/// statements (an expression over the arguments). `records fence => call` keeps the write made
/// under the argument `fence` when recording; `queries` counts recount queries about that many
/// posts. Methods with logic of their own follow the list as ordinary items.
macro_rules! counted {
    (impl $trait:ident as $concern:ident {
        $($name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty, $statements:expr
            $(, records $fence:ident => $call:expr)? $(, queries $queries:expr)?;)*
    } $($extra:item)*) => {
        #[async_trait]
        impl<S: $trait> $trait for CountingStore<S> {
            $(async fn $name(&self, $($arg: $ty),*) -> StoreResult<$ret> {
                $(self.record(|| Write { fence: $fence.clone(), call: $call });)?
                $(self.count_query_of($queries);)?
                let call = self.inner.$name($($arg),*);
                self.tallies.timed(Concern::$concern, $statements, call).await
            })*
            $($extra)*
        }
    };
}
use counted;

/// A view counts into the same tallies as the store it was made from.
impl<S: CounterViews> CounterViews for CountingStore<S> {
    fn for_counter(&self, counter: crate::core::key::CounterIx) -> Self {
        CountingStore {
            inner: self.inner.for_counter(counter),
            tallies: self.tallies.clone(),
            recorder: self.recorder.clone(),
        }
    }

    fn viewed_counter(&self) -> crate::core::key::CounterIx {
        self.inner.viewed_counter()
    }

    fn viewed_shared(&self) -> bool {
        self.inner.viewed_shared()
    }
}

/// An open change stream whose reads are counted as [`Concern::Stream`] calls.
struct CountingEvents {
    inner: Box<dyn EventSource>,
    tallies: Arc<Tallies>,
}

#[async_trait]
impl EventSource for CountingEvents {
    async fn read(&mut self, limit: ReadLimit, max_wait: Duration) -> StoreResult<RawBatch> {
        let call = self.inner.read(limit, max_wait);
        self.tallies.timed(Concern::Stream, 0, call).await
    }
}

counted! {
    impl ChangeStreams as Stream {
        read_position() -> ServerNow, 0;
        look_up(comments: &[CommentId]) -> HashMap<String, Document>, 0;
    }

    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let call = self.inner.open_stream(options);
        let inner = self.tallies.timed(Concern::Stream, 0, call).await?;
        Ok(Box::new(CountingEvents {
            inner,
            tallies: self.tallies.clone(),
        }))
    }
}
