//! [`Checkpoints`] over the checkpoint documents: every worker write carries the fencing epoch.

use super::*;

#[async_trait]
impl Checkpoints for MongoStore {
    async fn load_checkpoint(&self, stream: &str) -> StoreResult<Option<Checkpoint>> {
        let found = self
            .db
            .collection::<RawDocumentBuf>(&self.names.checkpoints)
            .find_one(doc! {"_id": stream})
            .observed("read the checkpoint")
            .await?;
        found.map(|d| checkpoint_from_raw(stream, &d)).transpose()
    }

    async fn record_intent(
        &self,
        fence: &Fence,
        batch: &PendingBatch,
        carried: Option<&PendingBatch>,
    ) -> StoreResult<()> {
        // Raw from serde to the wire: the intent is the largest thing a batch writes.
        if let Some(carried) = carried {
            // Its own document, written once (the checkpoint document does not grow with the
            // carry), under the carry's id; stored before the intent that names the carry, so
            // that a crash between the two leaves it for a batch that never was pending.
            // Fenced like every worker write: a predecessor that has not noticed it was
            // replaced must not overwrite its successor's copy of the same batch with its own
            // plan (made against a ledger the successor had moved on), so a copy of a newer
            // epoch is left alone (the upsert then collides with its `_id`).
            let op = "store a carried batch";
            let id = format!("{}|{}", fence.stream, carried.end);
            let carry = batch.carry.as_ref().unwrap_or(&carried.end);
            let stored = rawdoc! {
                "stream": fence.stream.as_str(),
                "carry": carry.as_str(),
                "end": carried.end.as_str(),
                "epoch": fence.epoch,
                "batch": pending_to_raw(carried)?,
            };
            let filter = rawdoc! {"_id": id, "epoch": {"$not": {"$gt": fence.epoch}}};
            let update = rawdoc! {"$set": stored};
            self.fenced_upsert(op, &self.names.carried, filter, update, fence)
                .await?;
        }
        let update = rawdoc! {
            "$max": {"high_water": batch.end.as_str()},
            "$set": {"pending": pending_to_raw(batch)?, "updated_at": DateTime::now()},
        };
        let filter = rawdoc! {"_id": fence.stream.as_str(), "epoch": fence.epoch};
        let op = "record the batch intent";
        self.fenced_upsert(op, &self.names.checkpoints, filter, update, fence)
            .await
    }

    async fn save_checkpoint(
        &self,
        fence: &Fence,
        token: &Token,
        token_time: Option<Timestamp>,
    ) -> StoreResult<()> {
        let mut set = doc! {"token": token.as_str(), "updated_at": DateTime::now()};
        if let Some(t) = token_time {
            set.insert("token_time", t);
        }
        let update =
            doc! {"$set": set, "$max": {"high_water": token.as_str()}, "$unset": {"pending": ""}};
        self.owned_checkpoint_update("save the checkpoint", fence, update)
            .await
    }

    async fn load_carried(
        &self,
        stream: &str,
        carry: &Token,
        after: Option<&Token>,
        through: &Token,
        limit: usize,
    ) -> StoreResult<Vec<PendingBatch>> {
        let op = "read the carried batches";
        let mut end = doc! {"$lte": through.as_str()};
        if let Some(after) = after {
            end.insert("$gt", after.as_str());
        }
        // In the order of their ends: the `_id`s are `<stream>|<end>`, one stream's share the
        // same prefix, so the `_id` index gives that order without sorting in memory.
        let limit = limit.clamp(1, i32::MAX as usize);
        let mut cursor = self
            .db
            .collection::<RawDocumentBuf>(&self.names.carried)
            .find(doc! {"stream": stream, "carry": carry.as_str(), "end": end})
            .sort(doc! {"_id": 1})
            .limit(limit as i64)
            .batch_size(limit as u32)
            .observed(op)
            .await?;
        let mut carried = Vec::new();
        while let Some(stored) = cursor.try_next().await.map_err(|e| map_err(op, e))? {
            let malformed = |detail: String| {
                StoreError::Malformed {
                what: "carried batch",
                id: stream.to_string(),
                detail: format!("{detail} (a stopped worker's carried counters; delete it from counterd's carried collection, then recount with `counterd reconcile --sweep`)"),
            }
            };
            let batch = stored
                .get_document("batch")
                .map_err(|e| malformed(e.to_string()))?;
            carried.push(pending_from_raw(batch).map_err(malformed)?);
        }
        Ok(carried)
    }

    async fn clear_carried(&self, fence: &Fence, carry: &Token) -> StoreResult<()> {
        // Fenced: a predecessor re-applying the same pending carry (its writes all refused)
        // must not delete the copies its successor still needs.
        let filter = doc! {
            "stream": fence.stream.as_str(),
            "carry": carry.as_str(),
            "epoch": {"$not": {"$gt": fence.epoch}},
        };
        self.db
            .collection::<Document>(&self.names.carried)
            .delete_many(filter)
            .observed("clear the carried batches")
            .await?;
        Ok(())
    }

    async fn move_checkpoint(&self, stream: &str, to: &Position) -> StoreResult<()> {
        let now = DateTime::now();
        let update = match to {
            Position::Token(t) => {
                doc! {"$set": {"token": t.as_str(), "updated_at": now}, "$unset": {"token_time": "", "start_time": ""}}
            }
            Position::Time(t) => {
                doc! {"$set": {"start_time": *t, "updated_at": now}, "$unset": {"token": "", "token_time": ""}}
            }
            Position::Unset => {
                doc! {"$unset": {"token": "", "token_time": "", "start_time": ""}, "$set": {"updated_at": now}}
            }
        };
        self.coll(&self.names.checkpoints)
            .update_one(doc! {"_id": stream}, update)
            .upsert(true)
            .observed("move the checkpoint")
            .await?;
        Ok(())
    }

    async fn record_start(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        let update = doc! {"$set": {"start_time": at, "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the start position", fence, update)
            .await
    }

    async fn record_caught_up(&self, fence: &Fence, at: Timestamp) -> StoreResult<()> {
        let update = doc! {"$max": {"caught_up_at": at}};
        self.owned_checkpoint_update("record the drained position", fence, update)
            .await
    }

    async fn record_gap(&self, fence: &Fence, gap: &Gap) -> StoreResult<()> {
        let mut gap_doc = doc! {"to": gap.to};
        if let Some(from) = gap.from {
            gap_doc.insert("from", from);
        }
        let restart = crate::core::time::cluster_second(gap.to);
        let update = doc! {
            "$push": {"gaps": gap_doc},
            // The new stream starts exactly where the gap ends: nothing between is unaccounted.
            "$set": {"sweep_requested": true, "updated_at": DateTime::now(), "start_time": restart},
            "$unset": {"token": "", "token_time": ""},
        };
        self.owned_checkpoint_update("record the history gap", fence, update)
            .await
    }

    async fn deployment(&self) -> StoreResult<Deployment> {
        let admin = self.db.client().database("admin");
        let is_master = admin
            .run_command(doc! {"isMaster": 1})
            .observed("isMaster")
            .await?;
        let replica_set = is_master.contains_key("setName");
        let sharded = is_master.get_str("msg") == Ok("isdbgrid");
        let repl_config = if replica_set {
            ask(&admin, doc! {"replSetGetConfig": 1}, "replSetGetConfig").await?
        } else {
            None
        };
        let cluster = if sharded {
            answered(
                self.db
                    .client()
                    .database("config")
                    .collection::<Document>("version")
                    .find_one(doc! {})
                    .await
                    .map(Option::unwrap_or_default),
                "read config.version",
            )?
        } else {
            None
        };
        let status = if replica_set || sharded {
            None
        } else {
            ask(&admin, doc! {"serverStatus": 1}, "serverStatus").await?
        };
        Ok(Deployment::from_replies(
            &is_master,
            repl_config.as_ref(),
            cluster.as_ref(),
            status.as_ref(),
        ))
    }

    async fn record_deployment(&self, fence: &Fence, deployment: &Deployment) -> StoreResult<()> {
        let update =
            doc! {"$set": {"deployment": deployment.to_document(), "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the deployment", fence, update)
            .await
    }

    async fn set_sweep_requested(&self, stream: &str, requested: bool) -> StoreResult<()> {
        self.coll(&self.names.checkpoints)
            .update_one(
                doc! {"_id": stream},
                doc! {"$set": {"sweep_requested": requested}},
            )
            .upsert(true)
            .observed("flag the sweep")
            .await?;
        Ok(())
    }

    async fn adopt_checkpoint(&self, fence: &Fence) -> StoreResult<()> {
        let filter = doc! {"_id": &fence.stream, "epoch": {"$not": {"$gt": fence.epoch}}};
        let update = doc! {"$set": {"epoch": fence.epoch, "updated_at": DateTime::now()}};
        self.checkpoint_update("adopt the checkpoint", fence, filter, update)
            .await
    }

    async fn save_snapshot(&self, fence: &Fence, progress: &SnapshotProgress) -> StoreResult<()> {
        let update =
            doc! {"$set": {"snapshot": snapshot_to_doc(progress)?, "updated_at": DateTime::now()}};
        self.owned_checkpoint_update("record the snapshot's progress", fence, update)
            .await
    }
}

impl MongoStore {
    /// A fenced upsert of one document, raw (the intent and a carried batch are the largest
    /// things a batch writes): a duplicate key means the filter's epoch condition failed on an
    /// existing document, so a successor took the stream (as in `checkpoint_update`).
    async fn fenced_upsert(
        &self,
        op: &'static str,
        collection: &str,
        filter: RawDocumentBuf,
        update: RawDocumentBuf,
        fence: &Fence,
    ) -> StoreResult<()> {
        let command = rawdoc! {
            "update": collection,
            "updates": [{"q": filter, "u": update, "upsert": true}],
        };
        let reply = self.db.run_raw_command(command).observed(op).await?;
        if write_errors(op, &reply)? > 0 {
            return Err(StoreError::fenced(fence));
        }
        Ok(())
    }

    /// A checkpoint write by the worker that owns the stream's current epoch.
    pub(super) async fn owned_checkpoint_update(
        &self,
        op: &'static str,
        fence: &Fence,
        update: Document,
    ) -> StoreResult<()> {
        let filter = doc! {"_id": &fence.stream, "epoch": fence.epoch};
        self.checkpoint_update(op, fence, filter, update).await
    }

    /// A conditional upsert of the checkpoint; a duplicate key means another epoch owns it.
    pub(super) async fn checkpoint_update(
        &self,
        op: &'static str,
        fence: &Fence,
        filter: Document,
        update: Document,
    ) -> StoreResult<()> {
        let updated = self
            .coll(&self.names.checkpoints)
            .update_one(filter, update)
            .upsert(true)
            .unless_duplicate(op)
            .await?;
        // A duplicate: the checkpoint exists with another epoch, a successor took the stream.
        updated.map(drop).ok_or_else(|| StoreError::fenced(fence))
    }
}
