//! The seam between counterd's logic and its database: counters, the comment ledger, the dirty
//! set, checkpoints, leases, counts of the truth, and the change stream itself.
//!
//! One trait per concern, so each can be read (and implemented) on its own:
//! - [`ChangeStreams`]: open the change stream, read the server's cluster time;
//! - [`Checkpoints`]: each stream's position, pending batch, gaps, epoch and snapshot progress;
//! - [`Counters`]: the per-post counters (guarded increments, conditional fold installs);
//! - [`Ledger`]: the last known state of each comment;
//! - [`DirtySet`]: posts waiting for a recount;
//! - [`Truth`]: counts and reads of the application's `comments` collection;
//! - [`Leases`]: who may write for a stream;
//! - [`RunHistory`]: reconcile runs and the sweep cursor.
//!
//! [`Store`] is all of them at once. `worker` and `reconcile` speak only to these traits.
//! [`mongo`] is the one implementation that knows MongoDB's command shapes; `memory` (with the
//! `test-utils` feature) is its in-process twin, for the deterministic simulation and the
//! store contract that runs the same cases against both. `counting` (feature `test-utils`)
//! wraps any store to count its calls and write statements, for the benchmark and the tests.

#[cfg(feature = "test-utils")]
pub mod counting;
#[cfg(feature = "test-utils")]
pub mod memory;
pub mod mongo;

mod checkpoints;
mod counters;
mod dirty;
mod error;
mod leases;
mod ledger;
mod run_history;
mod stream;
mod truth;

pub use checkpoints::*;
pub use counters::*;
pub use dirty::*;
pub use error::{StoreError, StoreResult};
pub use leases::*;
pub use ledger::*;
pub use run_history::*;
pub use stream::*;
pub use truth::*;

use crate::core::batch::PendingBatch;
use crate::core::deployment::Deployment;
use crate::core::key::CounterIx;
use crate::core::window::LedgerAt;

/// A write or read for a counter definition the store does not know (its place is beyond the
/// schema's definitions): refused rather than written into another definition's collection,
/// where it would land under the same key and corrupt that counter.
pub fn unknown_counter(op: &'static str, counter: CounterIx) -> StoreError {
    StoreError::Fatal {
        op,
        message: format!(
            "counter definition #{} is not one of this store's definitions",
            counter.0
        ),
    }
}

/// One store, seen per counter definition. Every definition keeps its own counters collection
/// ([`crate::core::definition::Definition::collection`]) and its own dirty set, and counts its own
/// rows (its group field and condition): a *view* is the store as one definition sees it, so
/// the reconciler, `get`, `verify` and `dirty` run unchanged over any definition. The worker's
/// batch writes ([`Counters::apply_counters`], [`Counters::apply_snapshot_counters`],
/// [`DirtySet::mark_dirty`]) are routed per item by its `counter` whatever the view, since one
/// batch carries every definition's deltas; every other counter, dirty-set and truth call
/// reads the view's definition. Views share everything else (connection, tables, leases,
/// checkpoints, the ledger).
pub trait CounterViews {
    /// This store as definition `counter` sees it (a cheap handle on the same store).
    fn for_counter(&self, counter: CounterIx) -> Self
    where
        Self: Sized;

    /// The definition this handle serves ([`CounterIx::DEFAULT`] unless made by
    /// [`CounterViews::for_counter`]).
    fn viewed_counter(&self) -> CounterIx;

    /// Whether the viewed definition groups rows by another field than the post, the field
    /// partitions divide by: under partitions its counters have several writers, each with
    /// its own guard ([`Writer`]), and its recounts wait for every partition.
    fn viewed_shared(&self) -> bool;
}

/// Everything the worker writes and the reconciler reads and folds: every concern's trait at
/// once. Implemented for any type that implements them all, so `S: Store` bounds need nothing
/// more; callers holding a concrete store import [`prelude`] to call the methods.
pub trait Store:
    ChangeStreams
    + Checkpoints
    + Counters
    + Ledger
    + DirtySet
    + Truth
    + Leases
    + RunHistory
    + CounterViews
{
}

impl<T> Store for T where
    T: ChangeStreams
        + Checkpoints
        + Counters
        + Ledger
        + DirtySet
        + Truth
        + Leases
        + RunHistory
        + CounterViews
{
}

/// The store's traits, for callers that hold a concrete store (not an `S: Store` bound).
pub mod prelude {
    pub use super::{
        ChangeStreams, Checkpoints, CounterViews, Counters, DirtySet, Leases, Ledger, RunHistory,
        Store, Truth,
    };
}
