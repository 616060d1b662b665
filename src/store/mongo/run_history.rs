//! [`RunHistory`]: reconcile runs and the sweep cursor.

use super::*;

#[async_trait]
impl RunHistory for MongoStore {
    async fn record_run(&self, run: &RunSummary) -> StoreResult<()> {
        let doc = to_stored("record a reconcile run", run)?;
        self.coll(&self.names.runs)
            .insert_one(doc)
            .observed("record a reconcile run")
            .await?;
        Ok(())
    }

    async fn last_run(&self) -> StoreResult<Option<RunSummary>> {
        let found = self
            .coll(&self.names.runs)
            .find_one(doc! {})
            .sort(doc! {"finished_at": -1})
            .observed("read the last reconcile run")
            .await?;
        found.map(run_from_doc).transpose()
    }

    async fn load_sweep_cursor(&self, stream: &str) -> StoreResult<Option<SweepCursor>> {
        let found = self
            .coll(&self.names.sweeps)
            .find_one(doc! {"_id": stream})
            .observed("read the sweep cursor")
            .await?;
        Ok(found.map(|d| sweep_from_doc(&d)))
    }

    async fn save_sweep_cursor(&self, stream: &str, cursor: &SweepCursor) -> StoreResult<()> {
        self.coll(&self.names.sweeps)
            .update_one(doc! {"_id": stream}, doc! {"$set": sweep_to_set(cursor)?})
            .upsert(true)
            .observed("save the sweep cursor")
            .await?;
        Ok(())
    }
}

impl MongoStore {
    /// The newest `limit` reconcile runs (of any process), newest first (`status`).
    pub async fn recent_runs(&self, limit: usize) -> StoreResult<Vec<RunSummary>> {
        let op = "read recent reconcile runs";
        let docs: Vec<Document> = self
            .coll(&self.names.runs)
            .find(doc! {})
            .sort(doc! {"finished_at": -1})
            .limit(limit.min(i64::MAX as usize) as i64)
            .collected(op)
            .await?;
        docs.into_iter().map(run_from_doc).collect()
    }

    /// The newest reconcile run that corrected at least one counter (`status`).
    pub async fn last_correcting_run(&self) -> StoreResult<Option<RunSummary>> {
        let found = self
            .coll(&self.names.runs)
            .find_one(doc! {"corrected": {"$gt": 0_i64}})
            .sort(doc! {"finished_at": -1})
            .observed("read the last correcting reconcile run")
            .await?;
        found.map(run_from_doc).transpose()
    }
}
