//! [`Leases`]: who may write for a stream.

use std::time::Duration;

use bson::DateTime;

use super::{seam, Memory, MemoryStore};
use crate::store::Lease;

impl Memory {
    pub fn read_lease(&self, stream: &str) -> Option<Lease> {
        self.leases.get(stream).cloned()
    }

    /// A takeover where the lease is free, expired or already `owner`'s; held by another
    /// owner, the upsert's insert hits its `_id` (a duplicate key): `None`.
    pub fn acquire_lease(
        &mut self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> Option<i64> {
        let lease = self.leases.get(stream);
        let held = lease.is_some_and(|l| l.expires_at >= now && l.owner != owner);
        (!held).then(|| self.seize_lease(stream, owner, ttl, now))
    }

    pub fn renew_lease(
        &mut self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> bool {
        match self.leases.get_mut(stream) {
            Some(l) if l.owner == owner && l.epoch == epoch => {
                l.expires_at = crate::core::time::later(now, ttl);
                true
            }
            _ => false,
        }
    }

    pub fn seize_lease(&mut self, stream: &str, owner: &str, ttl: Duration, now: DateTime) -> i64 {
        let epoch = self.leases.get(stream).map_or(0, |l| l.epoch) + 1;
        let lease = Lease {
            stream: stream.to_string(),
            owner: owner.to_string(),
            expires_at: crate::core::time::later(now, ttl),
            epoch,
        };
        self.leases.insert(stream.to_string(), lease);
        epoch
    }

    pub fn release_lease(&mut self, stream: &str, owner: &str, epoch: i64) {
        if let Some(l) = self.leases.get_mut(stream) {
            if l.owner == owner && l.epoch == epoch {
                l.expires_at = DateTime::from_millis(0);
            }
        }
    }
}

seam!(Leases {
    ok fn read_lease(stream: &str) -> Option<Lease>;
    ok fn acquire_lease(stream: &str, owner: &str, ttl: Duration, now: DateTime) -> Option<i64>;
    ok fn renew_lease(stream: &str, owner: &str, epoch: i64, ttl: Duration, now: DateTime) -> bool;
    ok fn seize_lease(stream: &str, owner: &str, ttl: Duration, now: DateTime) -> i64;
    ok fn release_lease(stream: &str, owner: &str, epoch: i64) -> ();
});
