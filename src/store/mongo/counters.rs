//! [`Counters`] over the counters collection: guarded increments and conditional fold installs.

use super::*;
use crate::core::definition::ROWS_FIELD;
use crate::core::num::Num;

/// Posts strictly after `after` in BSON order, across type brackets (`$gt` alone stays within
/// one type).
pub(super) fn after_filter(field: &str, after: Option<&GroupValue>) -> Document {
    match after {
        None => doc! {field: {"$type": ["int", "long", "double", "string", "objectId"]}},
        Some(post) => {
            // The type brackets of BSON sort order that post ids may have, after `post`'s.
            let later: &[&str] = match post {
                GroupValue::Int(_) => &["string", "objectId"],
                GroupValue::Str(_) => &["objectId"],
                GroupValue::Oid(_) => &[],
            };
            let types = later.iter().map(|t| doc! {field: {"$type": *t}});
            let or = std::iter::once(doc! {field: {"$gt": post.to_bson()}}).chain(types);
            doc! {"$or": or.collect::<Vec<_>>()}
        }
    }
}

#[async_trait]
impl Counters for MongoStore {
    async fn write_counters(
        &self,
        fence: &Fence,
        writes: &[CounterWrite],
    ) -> StoreResult<ApplyOutcome> {
        let op = "apply counter increments";
        // Raw from the start, like the ledger's statements: one per counter of every flush.
        let statement = |w: &&CounterWrite, p: &'static str, writer: Writer| {
            // The writer's own guard fields (see `Writer`).
            let g = |name: &str| format!("{p}{}{name}", writer.path());
            let (guard, through) = (g("applied_through"), w.through.as_str());
            let mut set = rawdoc! {&guard: through, epoch_field(writer): fence.epoch};
            let time = w.through_time.map_or(RawBson::Null, RawBson::Timestamp);
            set.append(g("applied_time"), time);
            for (bucket, batch) in &w.touched {
                set.append(g(&format!("touched.{bucket}")), batch.as_str());
            }
            let mut update = upsert(p, increments(p, w.delta, &w.buckets, writer), set);
            if !writer.shared {
                let log = w.log.iter().map(|touch| touch_to_raw(op, touch));
                let log = log.collect::<StoreResult<RawArrayBuf>>()?;
                // Each batch's entry in the counter's log; the oldest fall off.
                update.append(
                    "$push",
                    rawdoc! {format!("{p}recent"): {"$each": log, "$slice": -(LOG_ENTRIES as i64)}},
                );
            }
            let id = raw_value(op, w.key.group.to_bson())?;
            Ok(rawdoc! {
                "q": guarded_raw(id, &guard, through, &epoch_field(writer), fence),
                "u": update,
                "upsert": true,
            })
        };
        self.per_definition(op, fence, writes, |w| w.key.counter, statement)
            .await
    }

    async fn read_counter(&self, post: &GroupValue) -> StoreResult<Option<CounterDoc>> {
        let place = self.here("read a counter")?;
        let found = self
            .coll(place.counters)
            .find_one(doc! {"_id": post.to_bson()})
            .observed("read a counter")
            .await?;
        found
            .map(|d| counter_from_doc(&counter_part(d, place.prefix)))
            .transpose()
    }

    async fn install_fold(
        &self,
        post: &GroupValue,
        expected: Option<&CounterDoc>,
        fold: &Fold,
        now: DateTime,
    ) -> StoreResult<bool> {
        let place = self.here("install a recount")?;
        let p = place.prefix;
        let f = |name: &str| format!("{p}{name}");
        let counters = self.coll(place.counters);
        let Some(expected) = expected else {
            let kept = fold.kept.iter().map(|(k, v)| (k.to_string(), v.to_bson()));
            let fields = doc! {
                "base_count": fold.base_count,
                "base_watermark": fold.watermark,
                "live_delta": fold.live_delta,
                "count": fold.base_count + fold.live_delta,
                "live_by_bucket": kept.collect::<Document>(),
                "applied_through": "",
                "folds": 1_i64,
                "last_drift": fold.drift,
                "reconciled_at": now,
            };
            let mut new = doc! {"_id": post.to_bson()};
            match p {
                "" => new.extend(fields),
                _ => new.extend(doc! {ROWS_FIELD: fields}),
            }
            let inserted = counters
                .insert_one(new)
                .unless_duplicate("create a counter");
            return Ok(inserted.await?.is_some());
        };
        let applied = match &expected.applied_through {
            Some(t) => Bson::from(t.as_str()),
            None => Bson::Document(doc! {"$exists": false}),
        };
        let folds = match expected.folds {
            0 => not_gte(1_i64),
            n => doc! {"$eq": n},
        };
        let filter = doc! {
            "_id": post.to_bson(),
            f("applied_through"): applied,
            // Also pin the numbers read, so a hand edit (or another reconciler) between read and
            // write is not overwritten with stale arithmetic. A zero may be a field not written
            // yet (a sum's document whose row count was never written).
            f("live_delta"): pinned(expected.state.live_delta),
            // Every writer of a counter several partitions write moves this (see `Writer`).
            f(SHARED_WRITES_FIELD): pinned(Num::Int(expected.shared_writes)),
            f("base_count"): pinned(expected.state.base_count),
            f("folds"): folds,
        };
        let mut set = Document::new();
        set.insert(f("base_count"), fold.base_count);
        set.insert(f("base_watermark"), fold.watermark);
        set.insert(f("live_delta"), fold.live_delta);
        set.insert(f("count"), fold.base_count + fold.live_delta);
        set.insert(f("last_drift"), fold.drift);
        set.insert(f("reconciled_at"), now);
        let mut update = doc! {"$set": set, "$inc": {f("folds"): 1_i64}};
        let mut unset = Document::new();
        for bucket in &fold.dropped {
            unset.insert(f(&format!("live_by_bucket.{bucket}")), "");
        }
        // Touches below the watermark are covered by this recount; later ones are compared
        // against the `applied_through` the next recount reads.
        for bucket in expected.touched.keys().filter(|b| **b < fold.watermark) {
            unset.insert(f(&format!("touched.{bucket}")), "");
        }
        for (slot, position) in &expected.writers {
            for bucket in position.touched.keys().filter(|b| **b < fold.watermark) {
                unset.insert(f(&format!("{WRITERS_FIELD}.p{slot}.touched.{bucket}")), "");
            }
        }
        if !unset.is_empty() {
            update.insert("$unset", unset);
        }
        let result = counters
            .update_one(filter, update)
            .observed("install a recount")
            .await?;
        Ok(result.matched_count == 1)
    }

    async fn posts_after(
        &self,
        after: Option<&GroupValue>,
        limit: usize,
    ) -> StoreResult<Vec<GroupValue>> {
        let place = self.here("list posts")?;
        let pipeline = vec![
            doc! {"$match": after_filter(place.group, after)},
            doc! {"$group": {"_id": format!("${}", place.group)}},
            doc! {"$sort": {"_id": 1}},
            doc! {"$limit": limit as i64},
        ];
        let from_comments: Vec<Document> = self
            .comments
            .aggregate(pipeline)
            .collected("list posts")
            .await?;
        let from_counters: Vec<Document> = self
            .coll(place.counters)
            .find(after_filter("_id", after))
            .projection(doc! {"_id": 1})
            .sort(doc! {"_id": 1})
            .limit(limit.min(i64::MAX as usize) as i64)
            .collected("list counters")
            .await?;
        let mut posts = posts_in(from_comments.iter().chain(&from_counters), "_id");
        posts.truncate(limit);
        Ok(posts)
    }

    async fn sample_posts(&self, n: usize) -> StoreResult<Vec<GroupValue>> {
        let sample = |field: String| {
            vec![
                doc! {"$sample": {"size": n as i64}},
                doc! {"$project": {"_id": 0, "post": format!("${field}")}},
            ]
        };
        let place = self.here("sample counters")?;
        let mut docs: Vec<Document> = self
            .coll(place.counters)
            .aggregate(sample("_id".into()))
            .collected("sample counters")
            .await?;
        // Comments too: a post with rows but no counter is as wrong as a counter that is off.
        let from_comments: Vec<Document> = self
            .comments
            .aggregate(sample(place.group.to_string()))
            .collected("sample comments")
            .await?;
        docs.extend(from_comments);
        Ok(posts_in(&docs, "post"))
    }

    async fn apply_snapshot_counters(
        &self,
        fence: &Fence,
        chunk: u64,
        writes: &[CounterDelta],
    ) -> StoreResult<ApplyOutcome> {
        let op = "add snapshot counts";
        let statement = |w: &&CounterDelta, p: &'static str, writer: Writer| {
            let done = format!("{p}{}snapshot_chunk", writer.path());
            let set = rawdoc! {&done: chunk as i64, epoch_field(writer): fence.epoch};
            let id = raw_value(op, w.key.group.to_bson())?;
            Ok(rawdoc! {
                "q": guarded_raw(id, &done, chunk as i64, &epoch_field(writer), fence),
                "u": upsert(p, increments(p, w.delta, &w.buckets, writer), set),
                "upsert": true,
            })
        };
        self.per_definition(op, fence, writes, |w| w.key.counter, statement)
            .await
    }
}

/// The posts that `field` of `docs` names, in order, each once.
fn posts_in<'a>(docs: impl IntoIterator<Item = &'a Document>, field: &str) -> Vec<GroupValue> {
    let posts = docs.into_iter().filter_map(|d| d.get(field));
    let mut posts: Vec<GroupValue> = posts.filter_map(GroupValue::from_bson).collect();
    posts.sort();
    posts.dedup();
    posts
}

impl MongoStore {
    /// Sends a batch's counter writes to their definitions' collections, one `update` command
    /// (or more, past the statement cap) per definition the batch touches.
    async fn per_definition<T, F>(
        &self,
        op: &'static str,
        fence: &Fence,
        writes: &[T],
        counter: impl Fn(&T) -> CounterIx,
        statement: F,
    ) -> StoreResult<ApplyOutcome>
    where
        T: Sync,
        F: Fn(&&T, &'static str, Writer) -> StoreResult<RawDocumentBuf> + Sync,
    {
        let mut outcome = ApplyOutcome::default();
        for (counter, place, writes) in self.placed(op, writes, counter)? {
            let writer = fence.writer(self.schema.shared(counter));
            let statement = |w: &&T| statement(w, place.prefix, writer);
            let already_applied = self
                .update_many_statements(op, place.counters, &writes, &statement)
                .await?;
            outcome.applied += writes.len() as u64 - already_applied;
            outcome.already_applied += already_applied;
        }
        Ok(outcome)
    }

    /// `items` grouped by their counter definition, in definition order, each group in the
    /// order given (the statements' order within a definition's collection is the batch's),
    /// with the definition's place. Every definition is looked up before anything is written:
    /// a write for an unknown one refuses the whole batch.
    pub(super) fn placed<'i, T>(
        &self,
        op: &'static str,
        items: &'i [T],
        counter: impl Fn(&T) -> CounterIx,
    ) -> StoreResult<Vec<(CounterIx, Place<'_>, Vec<&'i T>)>> {
        let mut groups: BTreeMap<CounterIx, Vec<&T>> = BTreeMap::new();
        for item in items {
            groups.entry(counter(item)).or_default().push(item);
        }
        let place = |(counter, items)| Ok((counter, self.place(op, counter)?, items));
        groups.into_iter().map(place).collect()
    }
}

/// Where a writer's epoch lives, and what its writes are fenced on: the document's `epoch` for
/// slot 0, its own under `writers.p<n>.` else, as a partition's lease epoch says nothing of
/// another's (one per document, shared by a sum and its row count, which the same batch writes).
fn epoch_field(writer: Writer) -> String {
    format!("{}epoch", writer.path())
}

/// The `$inc` of one counter write: `live_delta`, each bucket, and `count`, which moves with
/// `live_delta` in the same write so readers never see it apart from `base_count + live_delta`.
/// A sum's amounts go as doubles once they are: `$inc` of a double on an integer field makes
/// it a double, as `$sum` over the rows would. A shared counter's write also counts itself in
/// [`SHARED_WRITES_FIELD`]: every writer's write moves it, and the reconciler's install pins it.
fn increments(
    prefix: &str,
    delta: Num,
    buckets: &BTreeMap<BucketStart, Num>,
    writer: Writer,
) -> RawDocumentBuf {
    let mut inc = RawDocumentBuf::new();
    inc.append(format!("{prefix}live_delta"), raw_num(delta));
    inc.append(format!("{prefix}count"), raw_num(delta));
    for (bucket, amount) in buckets {
        inc.append(format!("{prefix}live_by_bucket.{bucket}"), raw_num(*amount));
    }
    if writer.shared {
        inc.append(format!("{prefix}{SHARED_WRITES_FIELD}"), 1_i64);
    }
    inc
}

/// The update of a counter write: `inc` and `set`, and a base of 0 when it makes the counter.
fn upsert(prefix: &str, inc: RawDocumentBuf, set: RawDocumentBuf) -> RawDocumentBuf {
    rawdoc! {
        "$inc": inc,
        "$set": set,
        "$setOnInsert": {
            format!("{prefix}base_count"): 0_i64,
            format!("{prefix}base_watermark"): 0_i64,
        },
    }
}

/// The filter value that pins a number read from a counter: equal to it, or (for a zero)
/// also absent, as a field no write has set yet reads as 0.
fn pinned(n: Num) -> Bson {
    if n.is_zero() {
        Bson::Document(doc! {"$in": [n.to_bson(), Bson::Null]})
    } else {
        n.to_bson()
    }
}

/// The part of a counter document that holds the counter of the place with `prefix`: the
/// whole document, or for a sum's row count its [`ROWS_FIELD`] (empty while none was
/// written, so that a document the sum made reads as a row count of nothing yet, never as
/// none: installing one would collide with the sum's document).
fn counter_part(doc: Document, prefix: &str) -> Document {
    if prefix.is_empty() {
        return doc;
    }
    let mut part = doc.get_document(ROWS_FIELD).cloned().unwrap_or_default();
    if let Some(id) = doc.get("_id") {
        part.insert("_id", id.clone());
    }
    part
}

/// A counter's number as stored: an Int64 or a Double.
pub(super) fn raw_num(n: Num) -> RawBson {
    match n {
        Num::Int(i) => RawBson::Int64(i),
        Num::Double(d) => RawBson::Double(d),
    }
}
