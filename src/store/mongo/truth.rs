//! [`Truth`]: counts and reads of the application's `comments` collection.

use super::*;
use crate::core::num::Num;

#[async_trait]
impl Truth for MongoStore {
    async fn count_live_below(&self, post: &GroupValue, watermark: i64) -> StoreResult<Num> {
        self.tally(self.live_below(post, watermark)?).await
    }

    async fn live_ids_below(
        &self,
        post: &GroupValue,
        watermark: i64,
        at_most: usize,
    ) -> StoreResult<Option<Vec<CommentId>>> {
        let op = "read the ids of live comments";
        if self.here(op)?.sum.is_some() {
            return Ok(None); // a sum's recount is the server's `$sum` (see the trait)
        }
        let (filter, mut ids) = (self.live_below(post, watermark)?, Vec::new());
        let all = self.read_ids(op, filter, doc! {"_id": 1}, at_most, |_, id| {
            ids.push(id);
            true
        });
        Ok(all.await?.then_some(ids))
    }

    async fn live_ids_below_each(
        &self,
        wanted: &[(GroupValue, i64)],
        at_most: usize,
    ) -> StoreResult<Option<Vec<Vec<CommentId>>>> {
        let place: HashMap<&GroupValue, usize> = wanted
            .iter()
            .enumerate()
            .map(|(i, (p, _))| (p, i))
            .collect();
        let here = self.here("read the ids of live comments")?;
        if place.len() < wanted.len() || here.sum.is_some() {
            // A post asked twice: no single read can say which watermark a row was read for.
            return crate::store::live_ids_below_one_by_one(self, wanted, at_most).await;
        }
        let mut by_watermark: BTreeMap<i64, Vec<GroupValue>> = BTreeMap::new();
        for (post, watermark) in wanted {
            by_watermark
                .entry(*watermark)
                .or_default()
                .push(post.clone());
        }
        let branches = by_watermark
            .iter()
            .map(|(watermark, posts)| self.live_below_any(posts, *watermark))
            .collect::<StoreResult<Vec<Document>>>()?;
        let op = "read the ids of live comments of a group of posts";
        let mut reads = vec![Vec::new(); wanted.len()];
        let (filter, projection) = (doc! {"$or": branches}, doc! {"_id": 1, here.group: 1});
        let all = self.read_ids(op, filter, projection, at_most, |doc, id| {
            // The row's post as the worker reads it: the filter's `$in` matches by MongoDB's
            // equality, and the post read here is the one that equality names.
            let post = Schema::get(doc, here.group).and_then(GroupValue::from_bson);
            let i = post.and_then(|p| place.get(&p).copied());
            i.map(|i| reads[i].push(id)).is_some()
        });
        Ok(all.await?.then_some(reads))
    }

    async fn count_live_below_at(
        &self,
        post: &GroupValue,
        watermark: i64,
        at: Timestamp,
    ) -> StoreResult<Option<Num>> {
        if !self.snapshot_reads().await {
            return Ok(None);
        }
        let filter = self.live_below(post, watermark)?;
        match self.count_at(filter, at).await {
            Ok(n) => Ok(Some(n)),
            Err(e) if error_code(&e).is_some_and(|c| SNAPSHOT_GONE.contains(&c)) => {
                tracing::debug!(%post, at = ?at, "snapshot too old; falling back to the row-level recount");
                Ok(None)
            }
            Err(e) => Err(map_err("count live comments at a cluster time", e)),
        }
    }

    async fn latest_created(&self, post: &GroupValue) -> StoreResult<Option<i64>> {
        let group = self.here("find the latest comment")?.group;
        let latest = self
            .comments
            .find_one(doc! {group: post.to_bson(), &self.schema.created: {"$type": "date"}})
            .sort(doc! {&self.schema.created: -1})
            .projection(doc! {&self.schema.created: 1})
            .observed("find the latest comment")
            .await?;
        Ok(latest
            .and_then(|d| match Schema::get(&d, &self.schema.created) {
                Some(Bson::DateTime(t)) => Some(*t),
                _ => None,
            })
            .map(crate::core::time::secs))
    }

    async fn count_live(&self, post: &GroupValue) -> StoreResult<Num> {
        self.tally(self.live(post)?).await
    }

    async fn rows_of_post(&self, post: &GroupValue) -> StoreResult<Vec<(CommentId, Row)>> {
        let op = "read the rows of a post";
        let group = self.here(op)?.group;
        let found = self
            .comments
            .find(doc! {group: post.to_bson()})
            .projection(self.schema.row_projection())
            .observed(op)
            .await?;
        self.rows(op, found).await
    }

    async fn comments_extent(&self) -> StoreResult<CommentsExtent> {
        let comments = &self.comments;
        let last = comments
            .find_one(doc! {})
            .sort(doc! {"_id": -1})
            .projection(doc! {"_id": 1})
            .observed("find the last comment")
            .await?;
        let estimated_rows = comments
            .estimated_document_count()
            .observed("estimate the comments")
            .await?;
        Ok(CommentsExtent {
            last_id: last.and_then(|d| d.get("_id").cloned()).map(CommentId::new),
            estimated_rows,
        })
    }

    async fn rows_after(
        &self,
        after: Option<&CommentId>,
        last: &CommentId,
        limit: usize,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        let mut range = doc! {"$lte": last.value.clone()};
        if let Some(after) = after {
            range.insert("$gt", after.value.clone());
        }
        let op = "read a snapshot chunk";
        let found = self
            .comments
            .find(doc! {"_id": range})
            .sort(doc! {"_id": 1})
            .limit(limit as i64)
            .projection(self.schema.row_projection())
            .observed(op)
            .await?;
        self.rows(op, found).await
    }
}

impl MongoStore {
    /// Reads the rows `filter` selects (their `projection`), handing each one's id to `hold`,
    /// which says whether it kept it; `false` once more than `at_most` are kept, without
    /// reading the rest (one more than allowed tells "too many").
    async fn read_ids(
        &self,
        op: &'static str,
        filter: Document,
        projection: Document,
        at_most: usize,
        mut hold: impl FnMut(&Document, CommentId) -> bool,
    ) -> StoreResult<bool> {
        let limit = i64::try_from(at_most).unwrap_or(i64::MAX - 1) + 1;
        let found = self.comments.find(filter).projection(projection);
        let found = found.limit(limit).batch_size(ID_READ_BATCH);
        let mut cursor = found.observed(op).await?;
        let mut held = 0;
        while let Some(doc) = cursor.try_next().await.map_err(|e| map_err(op, e))? {
            if held == at_most {
                return Ok(false);
            }
            let Some(id) = doc.get("_id") else { continue };
            held += usize::from(hold(&doc, CommentId::new(id.clone())));
        }
        Ok(true)
    }

    /// Rows read with the schema's row projection, each with its comment id, converted as the
    /// cursor yields them: the documents are never held as a list beside the rows (a snapshot
    /// chunk's charge to the memory budget is for its rows).
    async fn rows(
        &self,
        op: &'static str,
        found: mongodb::Cursor<Document>,
    ) -> StoreResult<Vec<(CommentId, Row)>> {
        let row = |d: Document| {
            let id = d.get("_id").cloned().map(CommentId::new);
            let row = id.map(|id| (id, self.schema.read_existing_row(&d)));
            futures::future::ready(Ok(row))
        };
        let rows = found.try_filter_map(row).try_collect().await;
        rows.map_err(|e| map_err(op, e))
    }

    /// The rows of `post` that count for the definition this handle serves: its group field
    /// names it, the soft-delete rule does not say the row is deleted (the schema's, as the
    /// worker applies it), and the definition's condition holds (the same [`Condition`] the
    /// classifier evaluates).
    ///
    /// [`Condition`]: crate::core::condition::Condition
    pub(super) fn live(&self, post: &GroupValue) -> StoreResult<Document> {
        self.counted_rows(doc! {"$eq": post.to_bson(), "$type": post_types(post).to_vec()})
    }

    /// The rows of any of `posts` that count and whose creation time is not `>= watermark`:
    /// [`MongoStore::live_below`] of each, at once (`$in` is `$eq` to each value; the types
    /// allowed are those of every post asked, and a row of one type matches only the values
    /// of its own, as MongoDB compares them).
    fn live_below_any(&self, posts: &[GroupValue], watermark: i64) -> StoreResult<Document> {
        let mut types: Vec<&str> = posts.iter().flat_map(post_types).copied().collect();
        types.sort_unstable();
        types.dedup();
        let values: Vec<Bson> = posts.iter().map(GroupValue::to_bson).collect();
        let mut filter = self.counted_rows(doc! {"$in": values, "$type": types})?;
        filter.insert(&self.schema.created, not_gte(to_date(watermark)));
        Ok(filter)
    }

    /// The rows whose group field matches `group` (never an array holding a match) that count
    /// for the viewed definition: the soft-delete rule's "not deleted" and its condition.
    fn counted_rows(&self, mut group: Document) -> StoreResult<Document> {
        let place = self.here("count live comments")?;
        group.insert("$not", doc! {"$type": "array"});
        let mut filter = doc! {place.group: group};
        match &self.schema.soft_delete {
            SoftDelete::Present { field } => {
                filter.insert(field, Bson::Null);
            }
            SoftDelete::True { field } => {
                filter.insert(field, doc! {"$ne": true});
            }
            SoftDelete::OneOf { field, values } => {
                filter.insert(field, doc! {"$nin": values.clone()});
            }
            SoftDelete::Never => {}
        }
        if let Some(condition) = place.condition {
            filter.insert("$and", vec![Bson::Document(condition.to_filter())]);
        }
        Ok(filter)
    }

    /// The rows of `post` that count and whose creation time is not `>= watermark`.
    pub(super) fn live_below(&self, post: &GroupValue, watermark: i64) -> StoreResult<Document> {
        let mut filter = self.live(post)?;
        filter.insert(&self.schema.created, not_gte(to_date(watermark)));
        Ok(filter)
    }

    /// Whether reads at a cluster time really work, detected once: the server must send
    /// `operationTime`, answer a snapshot read at that time, and refuse one far in the future.
    /// The fake test server accepts `readConcern: snapshot` and ignores it, so accepting is
    /// not enough. A probe cut short by a transient error decides nothing (a lost reply to the
    /// far-future read is no refusal): the answer is "no" until a later probe decides.
    pub(super) async fn snapshot_reads(&self) -> bool {
        if let Some(works) = self.snapshot_reads.get() {
            return *works;
        }
        match self.probe_snapshot_reads().await {
            Some(works) => {
                let _ = self.snapshot_reads.set(works);
                tracing::debug!(
                    snapshot_reads = works,
                    "detected whether the server offers snapshot reads at a cluster time"
                );
                works
            }
            None => {
                tracing::warn!("could not tell whether the server offers snapshot reads (a transient error); recounting by the quiet window until a later probe tells");
                false
            }
        }
    }

    /// The snapshot-read probe: `Some` when the server's answers decide it, `None` when a
    /// transient error cut it short.
    async fn probe_snapshot_reads(&self) -> Option<bool> {
        let transient = |e: &DriverError| map_err("probe snapshot reads", e.clone()).is_transient();
        let reply = match self.db.run_command(doc! {"ping": 1}).await {
            Ok(reply) => reply,
            Err(e) if transient(&e) => return None,
            Err(_) => return Some(false),
        };
        let Ok(now) = reply.get_timestamp("operationTime") else {
            return Some(false);
        };
        match self.count_at(doc! {"_id": {"$exists": true}}, now).await {
            Ok(_) => {}
            Err(e) if transient(&e) => return None,
            Err(_) => return Some(false),
        }
        let future = Timestamp {
            time: now.time.saturating_add(24 * 3600),
            increment: 0,
        };
        match self.count_at(doc! {}, future).await {
            Ok(_) => Some(false),
            Err(e) if transient(&e) => None,
            Err(_) => Some(true),
        }
    }

    /// Counts `comments` matching `filter` as of cluster time `at`.
    pub(super) async fn count_at(
        &self,
        filter: Document,
        at: Timestamp,
    ) -> Result<Num, DriverError> {
        let reply = self
            .db
            .run_command(doc! {
                "aggregate": self.comments.name(),
                "pipeline": [{"$match": filter}, self.tally_stage()],
                "cursor": {},
                "readConcern": {"level": "snapshot", "atClusterTime": at},
            })
            .await?;
        let n = tallied(first_batch(&reply).next());
        Ok(n)
    }

    /// What the rows `filter` selects add up to for the viewed definition: their number, or
    /// a sum's `$sum` of its field (MongoDB's numeric rules: integers exact, a double makes a
    /// double, non-numbers ignored).
    pub(super) async fn tally(&self, filter: Document) -> StoreResult<Num> {
        let op = "count live comments";
        if self.here(op)?.sum.is_none() {
            let n = self.comments.count_documents(filter).observed(op).await?;
            return Ok(Num::Int(n as i64));
        }
        // One document at most: the `$group` of every matched row.
        let found: Vec<Document> = self
            .comments
            .aggregate(vec![doc! {"$match": filter}, self.tally_stage()])
            .collected("sum live comments")
            .await?;
        Ok(tallied(found.first()))
    }

    /// The `$group` stage that adds up the matched rows into `n`: 1 each, or a sum's field.
    fn tally_stage(&self) -> Document {
        let sum = self.here("sum live comments").ok().and_then(|p| p.sum);
        let each = sum.map_or(Bson::Int32(1), |field| Bson::String(format!("${field}")));
        doc! {"$group": {"_id": Bson::Null, "n": {"$sum": each}}}
    }
}

/// The `n` of a tally's reply (no document: no rows matched, 0).
fn tallied(reply: Option<&Document>) -> Num {
    reply
        .and_then(|d| d.get("n"))
        .and_then(Num::from_bson)
        .unwrap_or_default()
}

/// Rows per server reply of a recount's id reads: the driver decodes a reply whole, and a reply
/// left to the server's default (up to 16 MiB) would hold far more than the ids the recount
/// keeps.
const ID_READ_BATCH: u32 = 1000;

/// The BSON types a post id of this kind is stored as: exactly the post ids the worker reads
/// (`GroupValue::from_bson`): an integer matches the numbers equal to it (8, NumberLong(8), 8.0, as
/// MongoDB's equality does), never an array holding the value or the string "8".
fn post_types(post: &GroupValue) -> &'static [&'static str] {
    match post {
        GroupValue::Int(_) => &["int", "long", "double"],
        GroupValue::Str(_) => &["string"],
        GroupValue::Oid(_) => &["objectId"],
    }
}
