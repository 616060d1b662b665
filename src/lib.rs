//! counterd keeps counters over a MongoDB collection's rows exact: change stream → classify →
//! idempotent apply → dirty set → reconcile.
//!
//! # Layers, bottom up (an import only points down)
//! - [`core`]: pure, no I/O, no async: the event model, the keys, definitions and conditions,
//!   the schema mapping, classify, batch planning, carry, fold, the recount window, partitions,
//!   transactions, memory costs. Its own map says how one event flows through it.
//! - Leaves beside the core: [`clock`] (the time source, a [`clock::Clock`] that tests replace),
//!   [`redact`] (no secret in any output), [`shutdown`] (one [`shutdown::Shutdown`] stops every
//!   task), [`status`] (each stream's live state, what `/readyz` reads), [`telemetry`] (metric
//!   names and logging).
//! - [`store`]: the seam, one small trait per concern (change streams, checkpoints, counters,
//!   ledger, dirty set, truth counts, leases, run history; `store::Store` is all of them), with
//!   the MongoDB implementation in [`store::mongo`], one file per concern, and (with the
//!   `test-utils` feature, for tests only) its in-process twin `store::memory`, laid out the same.
//! - [`config`]: the settings, each with a default and a line of documentation.
//! - The engine, loops over the seam: [`worker`] (read, classify, apply and mark dirty, within the
//!   memory [`budget`]), [`snapshot`] (before its first batch, a new stream counts the rows that
//!   already exist), [`recount`] (counts consistent with the stream), [`reconcile`] (folds those
//!   counts into the counters), [`lease`] (one active worker per stream).
//! - The operator edges: [`doctor`] (the preflight's pure checks), [`daemon`] (the process
//!   assembled from the configuration: per stream a lease, a worker and a reconcile loop),
//!   [`http`] (`/metrics`, `/healthz`, `/readyz`), [`local_server`] (a throwaway server for the
//!   demo), and [`cli`], the command line over all of it.
//!
//! What the process holds is bounded by one memory budget ([`budget`]): every read of the
//! stream and every snapshot chunk is charged to it before it is held ([`core::cost`]), and the
//! stream's `$project` ([`core::schema`]) keeps an event's size independent of the
//! application's documents.

pub mod budget;
pub mod cli;
pub mod clock;
pub mod config;
pub mod core;
pub mod daemon;
pub mod doctor;
pub mod http;
pub mod lease;
pub mod local_server;
pub mod reconcile;
pub mod recount;
pub mod redact;
pub mod shutdown;
pub mod snapshot;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod worker;
