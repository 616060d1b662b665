//! counterd keeps per-post comment counters in MongoDB honest.
//!
//! The data flows top to bottom through these modules:
//! stream ([`event`], rows read through the application's [`schema`]) → classify ([`classify`])
//! → coalesce ([`batch`]) → apply and mark dirty ([`worker`] over the [`store`] seam) →
//! reconcile ([`reconcile`]: recounts consistent with the stream in [`recount`], arithmetic in
//! [`fold`]). Before its first batch, a new stream's worker counts the rows that already exist
//! ([`snapshot`]). Worker and reconciler read time from a [`clock::Clock`]; seconds and
//! creation-time buckets are computed in [`time`].
//!
//! The [`store`] seam is one small trait per concern (change streams, checkpoints, counters,
//! ledger, dirty set, truth counts, leases, run history; `store::Store` is all of them), with
//! the MongoDB implementation in [`store::mongo`], one file per concern, and (with the
//! `test-utils` feature, for tests only) its in-process twin `store::memory`, laid out the same.
//!
//! What the process holds is bounded by one memory budget ([`budget`]): every read of the
//! stream and every snapshot chunk is charged to it before it is held, and the stream's
//! `$project` ([`schema`]) keeps an event's size independent of the application's documents.
//!
//! [`daemon`] assembles the process from the configuration ([`config`]): per stream a lease
//! ([`lease`]), a worker and a reconcile loop, plus the [`http`] endpoints, all stopped through
//! one [`shutdown::Shutdown`]; each stream's live state ([`status`]) is what `/readyz` reads.
//! [`cli`] is the command-line edge over all of it.

pub mod batch;
pub mod budget;
pub mod carry;
pub mod classify;
pub mod cli;
pub mod clock;
pub mod condition;
pub mod config;
pub mod daemon;
pub mod definition;
pub mod deployment;
pub mod doctor;
pub mod event;
pub mod fold;
pub mod http;
pub mod lease;
pub mod local_server;
pub mod num;
pub mod partition;
pub mod reconcile;
pub mod recount;
pub mod schema;
pub mod shutdown;
pub mod snapshot;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod time;
pub mod txn;
pub mod worker;
