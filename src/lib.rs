//! counterd keeps per-post comment counters in MongoDB honest.
//!
//! The data flows top to bottom through these modules:
//! stream ([`event`]) → classify ([`classify`]) → coalesce ([`batch`]) → apply and mark dirty
//! ([`worker`] over the [`store`] seam) → reconcile ([`reconcile`], arithmetic in [`fold`]).

pub mod batch;
pub mod classify;
pub mod cli;
pub mod clock;
pub mod config;
pub mod event;
pub mod fold;
pub mod http;
pub mod lease;
pub mod partition;
pub mod reconcile;
pub mod recount;
pub mod schema;
pub mod store;
pub mod telemetry;
pub mod testdb;
pub mod worker;
