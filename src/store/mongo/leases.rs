//! [`Leases`] over the leases collection.

use super::*;

#[async_trait]
impl Leases for MongoStore {
    async fn read_lease(&self, stream: &str) -> StoreResult<Option<Lease>> {
        let found = self
            .coll(&self.names.leases)
            .find_one(doc! {"_id": stream})
            .observed("read the lease")
            .await?;
        Ok(found.map(|d| lease_from_doc(stream, &d)))
    }

    async fn acquire_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<Option<i64>> {
        let filter = doc! {"_id": stream, "$or": [{"expires_at": {"$lt": now}}, {"owner": owner}]};
        // A parked note (see `note_parked`) goes with the lease: whoever takes it tries again.
        let update = doc! {"$set": {"owner": owner, "expires_at": later(now, ttl)}, "$inc": {"epoch": 1_i64}, "$unset": {"parked": ""}};
        let result = self
            .coll(&self.names.leases)
            .find_one_and_update(filter, update)
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .unless_duplicate("acquire the lease")
            .await?;
        // A duplicate: another owner holds the lease unexpired (the upsert hit its `_id`).
        Ok(result.flatten().map(|d| d.get_i64("epoch").unwrap_or(1)))
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        let result = self
            .coll(&self.names.leases)
            .update_one(
                doc! {"_id": stream, "owner": owner, "epoch": epoch},
                doc! {"$set": {"expires_at": later(now, ttl)}},
            )
            .observed("renew the lease")
            .await?;
        Ok(result.matched_count == 1)
    }

    async fn seize_lease(
        &self,
        stream: &str,
        owner: &str,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<i64> {
        let found = self
            .coll(&self.names.leases)
            .find_one_and_update(
                doc! {"_id": stream},
                doc! {"$set": {"owner": owner, "expires_at": later(now, ttl)}, "$inc": {"epoch": 1_i64}, "$unset": {"parked": ""}},
            )
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .observed("seize the lease")
            .await?;
        Ok(found.and_then(|d| d.get_i64("epoch").ok()).unwrap_or(1))
    }

    async fn release_lease(&self, stream: &str, owner: &str, epoch: i64) -> StoreResult<()> {
        self.coll(&self.names.leases)
            .update_one(
                doc! {"_id": stream, "owner": owner, "epoch": epoch},
                doc! {"$set": {"expires_at": DateTime::from_millis(0)}},
            )
            .observed("release the lease")
            .await?;
        Ok(())
    }
}

/// Why a stream is parked, as its lease document keeps it for `counterd status` (which reads
/// no process's memory): set by the process that parked it, once it released the lease, and
/// removed by whoever takes the lease next (a retry, a standby, `counterd replay`).
impl MongoStore {
    /// Notes on `stream`'s lease that `owner` parked it for `reason` (best effort: a store
    /// that refused counterd's credentials may refuse this too).
    pub async fn note_parked(&self, stream: &str, owner: &str, reason: &str) -> StoreResult<()> {
        let note = doc! {"reason": reason, "owner": owner, "since": DateTime::now()};
        self.coll(&self.names.leases)
            .update_one(doc! {"_id": stream}, doc! {"$set": {"parked": note}})
            .observed("note the parked stream")
            .await?;
        Ok(())
    }

    /// The parked note on `stream`'s lease: (reason, owner, since), if there is one.
    pub async fn parked_note(
        &self,
        stream: &str,
    ) -> StoreResult<Option<(String, String, DateTime)>> {
        let found = self
            .coll(&self.names.leases)
            .find_one(doc! {"_id": stream})
            .observed("read the lease")
            .await?;
        Ok(found.and_then(|d| {
            let note = d.get_document("parked").ok()?;
            Some((
                note.get_str("reason").ok()?.to_string(),
                note.get_str("owner").unwrap_or("?").to_string(),
                note.get_datetime("since").ok().copied()?,
            ))
        }))
    }
}
