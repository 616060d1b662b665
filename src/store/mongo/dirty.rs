//! [`DirtySet`] over the dirty collection.

use super::*;

#[async_trait]
impl DirtySet for MongoStore {
    async fn mark_dirty(
        &self,
        fence: &Fence,
        marks: &[DirtyMark],
        now: DateTime,
    ) -> StoreResult<()> {
        let op = "mark posts dirty";
        // Raw from the start, like the counters' statements: one per post of every batch.
        let statement = |m: &&DirtyMark| {
            // Fenced like every worker write: an entry this stream marked under a newer
            // epoch refuses the write (the upsert then hits the `_id` and is dropped as a
            // duplicate). An entry of another stream (a changed partitioning) is taken over.
            let stream = fence.stream.as_str();
            Ok(rawdoc! {
                "q": {
                    "_id": raw_value(op, m.key.group.to_bson())?,
                    "$or": [
                        {"stream": {"$ne": stream}},
                        {"epoch": {"$not": {"$gt": fence.epoch}}},
                    ],
                },
                "u": {
                    "$inc": {"version": 1_i64},
                    "$set": {"last_dirty_at": now, "stream": stream, "epoch": fence.epoch},
                    "$max": {"newest_bucket": m.newest_bucket},
                    "$setOnInsert": {"first_dirty_at": now},
                },
                "upsert": true,
            })
        };
        let mut duplicates = 0;
        // Each definition's marks go to its own dirty set.
        for (_, place, marks) in self.placed(op, marks, |m| m.key.counter)? {
            duplicates += self
                .update_many_statements(op, &place.dirty, &marks, &statement)
                .await?;
        }
        if duplicates > 0 {
            // Two upserts raced on a new entry (another marker or a reconcile clear), or the
            // entry belongs to a newer epoch (this worker is fenced out): either way the entry
            // exists, so the post is dirty and nothing is lost.
            tracing::debug!(stream = %fence.stream, duplicates, "dirty marks not applied: raced, or fenced out by a newer epoch");
        }
        Ok(())
    }

    async fn dirty_list(
        &self,
        stream: Option<&str>,
        order: DirtyOrder,
        limit: usize,
    ) -> StoreResult<Vec<DirtyEntry>> {
        let filter = stream.map_or_else(Document::new, |s| doc! {"stream": s});
        let sort = match order {
            DirtyOrder::Oldest => doc! {"first_dirty_at": 1, "_id": 1},
            DirtyOrder::ByVersion => doc! {"version": -1, "_id": 1},
        };
        let docs: Vec<Document> = self
            .coll(&self.here("list dirty posts")?.dirty)
            .find(filter)
            .sort(sort)
            .limit(limit.min(i64::MAX as usize) as i64)
            .collected("list dirty posts")
            .await?;
        Ok(docs.iter().filter_map(dirty_from_doc).collect())
    }

    async fn dirty_summary(&self) -> StoreResult<DirtySummary> {
        let dirty = self.coll(&self.here("count dirty posts")?.dirty);
        let size = dirty
            .estimated_document_count()
            .observed("count dirty posts")
            .await?;
        let oldest = dirty
            .find_one(doc! {})
            .sort(doc! {"first_dirty_at": 1})
            .observed("find the oldest dirty post")
            .await?
            .and_then(|d| d.get_datetime("first_dirty_at").ok().copied());
        Ok(DirtySummary { size, oldest })
    }

    async fn clear_dirty(&self, post: &GroupValue, version: i64) -> StoreResult<bool> {
        let result = self
            .coll(&self.here("clear a dirty entry")?.dirty)
            .delete_one(doc! {"_id": post.to_bson(), "version": version})
            .observed("clear a dirty entry")
            .await?;
        Ok(result.deleted_count == 1)
    }

    async fn requeue_dirty(&self, post: &GroupValue, now: DateTime) -> StoreResult<bool> {
        let result = self
            .coll(&self.here("requeue a dirty entry")?.dirty)
            .update_one(
                doc! {"_id": post.to_bson()},
                doc! {"$max": {"first_dirty_at": now}},
            )
            .observed("requeue a dirty entry")
            .await?;
        Ok(result.matched_count == 1)
    }
}
