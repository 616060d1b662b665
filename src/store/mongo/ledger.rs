//! [`Ledger`] over the ledger collection: per-comment states, guarded by token and generation.

use super::*;

#[async_trait]
impl Ledger for MongoStore {
    async fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, LedgerAt>> {
        let ledger = self.coll(&self.names.ledger_of(stream));
        let at = |entry: Document| {
            // Written before the latest history gap: unknown.
            (entry_generation(&entry) >= generation).then(|| LedgerAt {
                state: row_from_ledger(&entry, self.schema.definitions.extra()),
                through: entry
                    .get_str("applied_through")
                    .ok()
                    .filter(|t| !t.is_empty())
                    .map(String::from),
            })
        };
        self.by_ids("read the ledger", comments, |ids| ledger.find(ids), at)
            .await
    }

    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()> {
        let now = DateTime::now();
        let op = "write the comment ledger";
        // Raw from the start: one statement per event, the worker's most numerous write.
        let statement = |u: &LedgerUpdate| {
            let id = raw_value(op, u.comment.value.clone())?;
            let filter = guarded_raw(id, "applied_through", through.as_str(), "epoch", fence);
            let update = match &u.state {
                Some(row) => {
                    let (mut set, unset) =
                        ledger_row_update(op, row, self.schema.definitions.extra())?;
                    set.append("applied_through", through.as_str());
                    set.append("epoch", fence.epoch);
                    set.append("generation", generation as i64);
                    rawdoc! {"$set": set, "$unset": unset}
                }
                None => rawdoc! {
                    "$set": {"exists": false, "live": false, "applied_through": through.as_str(), "epoch": fence.epoch, "gone_at": now, "generation": generation as i64},
                    "$unset": {LEDGER_POST: "", LEDGER_CREATED: "", "deleted": "", LEDGER_MEMBERS: ""},
                },
            };
            Ok(rawdoc! {"q": filter, "u": update, "upsert": true})
        };
        self.update_many_statements(op, &self.names.ledger_of(&fence.stream), updates, statement)
            .await?;
        Ok(())
    }

    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()> {
        let op = "rebuild the comment ledger";
        let statement = |(comment, row): &(CommentId, Row)| {
            let (mut set, mut unset) = ledger_row_update(op, row, self.schema.definitions.extra())?;
            set.append("generation", generation as i64);
            // Any write of the worker replaces a rebuilt entry.
            unset.append("applied_through", "");
            Ok(rawdoc! {
                // No entry, or one from before the gap: a duplicate key otherwise (skipped).
                "q": {"_id": raw_value(op, comment.value.clone())?, "generation": {"$not": {"$gte": generation as i64}}},
                "u": {"$set": set, "$unset": unset},
                "upsert": true,
            })
        };
        self.update_many_statements(op, &self.names.ledger_of(stream), rows, statement)
            .await?;
        Ok(())
    }

    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()> {
        // A claim without a row claims nothing.
        let claims: Vec<(&CommentId, &Row)> = claims
            .iter()
            .filter_map(|c| Some((&c.comment, c.state.as_ref()?)))
            .collect();
        let op = "claim ledger entries for the snapshot";
        let statement = |(comment, row): &(&CommentId, &Row)| {
            let (mut set, _) = ledger_row_update(op, row, self.schema.definitions.extra())?;
            set.append("epoch", fence.epoch);
            set.append("generation", generation as i64);
            set.append("claimed_by_snapshot", true);
            // Only where no entry exists: `$setOnInsert` leaves any state the stream wrote.
            Ok(rawdoc! {
                "q": {"_id": raw_value(op, comment.value.clone())?},
                "u": {"$setOnInsert": set},
                "upsert": true,
            })
        };
        self.update_many_statements(op, &self.names.ledger_of(&fence.stream), &claims, statement)
            .await?;
        Ok(())
    }
}
