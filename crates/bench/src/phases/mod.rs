//! The benchmark's phases, each on its own fresh database, in the order `main` runs them.

pub mod costs;
pub mod cpu;
pub mod definitions;
pub mod lag;
pub mod memory;
pub mod mixed;
pub mod oplog;
pub mod partitions;
pub mod reconcile;
pub mod rss;
pub mod throughput;
