//! Who may write for a stream ([`Leases`]) and the fence every write carries.

use std::time::Duration;

use async_trait::async_trait;
use bson::DateTime;
use serde::Serialize;

use super::error::StoreResult;

/// Who may write for a stream.
#[async_trait]
pub trait Leases: Send + Sync {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>>;

    /// Takes the lease if it is free, expired, or already ours; returns the new epoch (always
    /// higher than any before), or `None` when another owner holds it.
    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>>;

    /// Extends our lease; false when it is no longer ours (a successor took over).
    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool>;

    /// Takes the lease whoever holds it, unexpired or not (an operator's `replay --force`):
    /// returns the new epoch, higher than any before, so the holder is fenced out.
    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64>;

    /// Gives the lease up at once (graceful shutdown), so a standby need not wait for expiry.
    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()>;
}

/// Who holds a stream: one active worker per stream, the others on standby.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Lease {
    pub stream: String,
    pub owner: String,
    pub expires_at: DateTime,
    /// Increases on every takeover; every worker write carries it in its filter.
    pub epoch: i64,
}

/// The right to write for one stream: every worker write carries this epoch in its filter, so a
/// worker that lost its lease cannot write even once after a successor took over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub stream: String,
    pub epoch: i64,
}

impl Fence {
    pub fn new(stream: impl Into<String>, epoch: i64) -> Fence {
        let stream = stream.into();
        Fence { stream, epoch }
    }

    /// The partition this fence writes for, read from its stream's name (`None`: an
    /// unpartitioned stream).
    pub fn partition(&self) -> Option<crate::core::partition::Partition> {
        crate::core::partition::Partition::of_stream(&self.stream)
    }

    /// Where this fence's writes to a counter of a definition keep their guard: `shared` when
    /// the definition groups by another field than the partitions' (see
    /// [`super::Writer`]).
    pub fn writer(&self, shared: bool) -> super::Writer {
        match self.partition().filter(|_| shared) {
            Some(p) => super::Writer {
                shared: true,
                slot: p.index,
            },
            None => super::Writer::default(),
        }
    }
}
