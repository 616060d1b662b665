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
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let filter = doc! {"_id": stream, "$or": [{"expires_at": {"$lt": now}}, {"owner": owner}]};
        let update =
            doc! {"$set": {"owner": owner, "expires_at": expires}, "$inc": {"epoch": 1_i64}};
        let result = self
            .coll(&self.names.leases)
            .find_one_and_update(filter, update)
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .observed_raw("acquire the lease")
            .await;
        match result {
            Ok(Some(d)) => Ok(Some(d.get_i64("epoch").unwrap_or(1))),
            Ok(None) => Ok(None),
            Err(e) if error_code(&e) == Some(DUPLICATE_KEY) => Ok(None),
            Err(e) => Err(map_err("acquire the lease", e)),
        }
    }

    async fn renew_lease(
        &self,
        stream: &str,
        owner: &str,
        epoch: i64,
        ttl: Duration,
        now: DateTime,
    ) -> StoreResult<bool> {
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let result = self
            .coll(&self.names.leases)
            .update_one(
                doc! {"_id": stream, "owner": owner, "epoch": epoch},
                doc! {"$set": {"expires_at": expires}},
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
        let expires = DateTime::from_millis(now.timestamp_millis() + ttl.as_millis() as i64);
        let found = self
            .coll(&self.names.leases)
            .find_one_and_update(
                doc! {"_id": stream},
                doc! {"$set": {"owner": owner, "expires_at": expires}, "$inc": {"epoch": 1_i64}},
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
