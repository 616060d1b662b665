//! The pure core: what counterd computes, with no I/O, no async and no clock. Everything here
//! is a function of its arguments, so the simulation and the property tests can drive it
//! exhaustively, and both stores (MongoDB and the in-process twin) are written against the
//! same types.
//!
//! Nothing in this folder imports from outside it (only `std` and the data crates: bson, serde,
//! smallvec, indexmap, xxhash). The layers above it, bottom up: the [`crate::store`] seam, the
//! settings ([`crate::config`]), the engine loops over the seam (worker, recount, reconcile,
//! snapshot, lease, budget), and the operator edges (daemon, http, telemetry, cli).
//!
//! One event's way through the core, top to bottom:
//! - [`event`]: the change-event model, parsed leniently; [`txn`]: where a transaction ends.
//! - [`key`]: the keys every seam speaks (the group value, the definition, both together).
//! - [`definition`] and [`condition`]: which counters exist and which rows they count;
//!   [`schema`]: the application's field names, the stream's `$project` and row reads.
//! - [`lookup`]: which rows a batch reads itself; [`classify`]: an event plus the row before it
//!   becomes signed deltas and ledger states.
//! - [`batch`]: coalescing into one write per counter, the batch's plan; [`carry`]: increments
//!   carried from batch to batch while behind; [`partition`]: splitting groups across streams.
//! - [`fold`]: installing a recount below a watermark, and the kinds of run that do;
//!   [`window`]: a row-level recount settled against the stream; [`time`]: seconds and
//!   creation-time buckets; [`num`]: the numbers a counter holds, with MongoDB's numeric rules.
//! - [`cost`]: what each buffer is charged against the memory budget.
//! - [`deployment`]: which deployment a checkpoint belongs to.

pub mod batch;
pub mod carry;
pub mod classify;
pub mod condition;
pub mod cost;
pub mod definition;
pub mod deployment;
pub mod event;
pub mod fold;
pub mod key;
pub mod lookup;
pub mod num;
pub mod partition;
pub mod schema;
pub mod time;
pub mod txn;
pub mod window;
