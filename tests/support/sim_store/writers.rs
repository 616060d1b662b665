//! The application's random writes to `comments` and an operator's hand edits of counters,
//! with the bookkeeping the simulation's checks read: live rows per (post, bucket), the drift
//! injected and corrected, and what every counter displays.

use std::collections::BTreeMap;

use bson::{doc, Bson, DateTime, Document};
use counterd::core::fold::Fold;
use counterd::core::key::CounterIx;
use counterd::core::key::GroupValue;
use counterd::core::num::Num;
use counterd::core::time::bucket_of;
use counterd::store::memory::{row_facts, OplogTxn, CREATED_FIELD, DELETED_FIELD, POST_FIELD};
use rand::Rng;

use super::State;

impl State {
    fn random_post(&mut self) -> i64 {
        if self.hot && self.rng.random_bool(0.7) {
            return 0;
        }
        self.rng.random_range(0..self.posts)
    }

    /// A row to change: often one of the oldest third (ids grow with time), whose events
    /// change settled buckets, the ones a recount below the watermark counts.
    fn random_row(&mut self) -> Option<i64> {
        let n = self.memory.comments.len();
        if n == 0 {
            return None;
        }
        if self.hot && self.rng.random_bool(0.7) {
            // One of the hot post's rows, often an old one.
            let hot: Vec<i64> = self
                .memory
                .comments
                .iter()
                .filter(|(_, row)| row.get(POST_FIELD) == Some(&Bson::Int64(0)))
                .map(|(id, _)| *id)
                .collect();
            if !hot.is_empty() {
                let i = if self.rng.random_bool(0.5) {
                    self.rng.random_range(0..hot.len().div_ceil(3))
                } else {
                    self.rng.random_range(0..hot.len())
                };
                return Some(hot[i]);
            }
        }
        let i = if self.rng.random_bool(0.4) {
            self.rng.random_range(0..n.div_ceil(3))
        } else {
            self.rng.random_range(0..n)
        };
        self.memory.comments.keys().nth(i).copied()
    }

    /// After the application changed row `id` (from `old`) and its event was appended: the
    /// live rows per bucket, and whether the event's pre-image will have expired when read.
    fn changed(&mut self, id: i64, old: Option<Document>) {
        self.generation += 1;
        if let Some(new) = self.memory.comments.get(&id).cloned() {
            self.count_row(&new, 1);
        }
        if let Some(old) = &old {
            self.count_row(old, -1);
        }
        let expired = self.rng.random_bool(self.pre_image_expiry);
        let event = self.memory.oplog.last_mut().expect("the write's event");
        event.pre_expired = expired;
    }

    fn count_row(&mut self, row: &Document, sign: i64) {
        if let Some((post, created, true)) = row_facts(row) {
            let key = (post, bucket_of(created, self.bucket_width));
            let n = self.live.entry(key.clone()).or_default();
            *n += sign;
            if *n == 0 {
                self.live.remove(&key);
            }
        }
    }

    fn new_row(&mut self, id: i64) -> Document {
        let post = self.random_post();
        let clock = self.memory.clock;
        let mut row = doc! {"_id": id, POST_FIELD: post};
        let created = match self.rng.random_range(0..20) {
            0 => None,                                            // no created_at
            1..=4 => Some(clock - self.rng.random_range(1..400)), // back-dated
            5 => Some(self.long_ago()),                           // an import of old rows
            6 => Some(clock + self.rng.random_range(1..30)),      // clock skew
            _ => Some(clock),
        };
        if let Some(secs) = created {
            row.insert(CREATED_FIELD, DateTime::from_millis(secs * 1000));
        }
        if self.rng.random_bool(0.08) {
            row.insert(DELETED_FIELD, DateTime::from_millis(clock * 1000));
        }
        row.insert("body", format!("b{}", self.rng.random_range(0..1000)));
        if self.memory.definitions.len() > 1 {
            // What the other counter definitions read (drawn only in seeds that keep them, so
            // the other seeds' writes stay what they were).
            if self.rng.random_bool(0.9) {
                let author = self.rng.random_range(0..3);
                row.insert("author_id", format!("a{author}"));
            }
            row.insert("approved", self.rng.random_bool(0.5));
        }
        if self.sums() {
            // Drawn only where sums are kept, so the other seeds' writes stay what they were.
            if let Some(rating) = self.rating() {
                row.insert("rating", rating);
            }
            row.insert("score", self.rng.random_range(-4..=10) as f64 / 2.0);
        }
        row
    }

    /// Whether a counter definition of this seed is a sum.
    fn sums(&self) -> bool {
        self.memory
            .definitions
            .iter()
            .any(|d| d.kind.field().is_some())
    }

    /// A rating as applications write them: mostly an integer, sometimes a half, missing (adds
    /// nothing) or a string (adds nothing and is a bad event).
    fn rating(&mut self) -> Option<Bson> {
        match self.rng.random_range(0..20) {
            0 => None,
            1 => Some(Bson::String("n/a".into())),
            2..=4 => Some(Bson::Double(self.rng.random_range(1..=10) as f64 / 2.0)),
            _ => Some(Bson::Int32(self.rng.random_range(1..=5))),
        }
    }

    /// A change of a summed value: a new rating (or none, or a string), a new score.
    fn sum_change(&mut self, id: i64) -> &'static str {
        if self.rng.random_bool(0.5) {
            let score = self.rng.random_range(-4..=10) as f64 / 2.0;
            self.update(id, doc! {"score": score}, &[]);
            self.stat("change score of");
            return "change score of";
        }
        match self.rating() {
            Some(rating) => {
                self.update(id, doc! {"rating": rating}, &[]);
                self.stat("change rating of");
                "change rating of"
            }
            None => {
                self.update(id, doc! {}, &["rating"]);
                "remove rating of"
            }
        }
    }

    /// A change to what only the other counter definitions read: approve, unapprove, another
    /// author, or no author (the row leaves that definition's counting).
    fn definition_change(&mut self, id: i64) -> &'static str {
        match self.rng.random_range(0..5) {
            0 => {
                self.update(id, doc! {"approved": true}, &[]);
                "approve"
            }
            1 => {
                self.update(id, doc! {"approved": false}, &[]);
                "unapprove"
            }
            2 => {
                self.update(id, doc! {}, &["approved"]);
                "remove approved of"
            }
            3 => {
                let author = format!("a{}", self.rng.random_range(0..3));
                self.update(id, doc! {"author_id": author}, &[]);
                "change author of"
            }
            _ => {
                self.update(id, doc! {}, &["author_id"]);
                "remove author_id of"
            }
        }
    }

    /// A creation time before the simulation began: below every watermark.
    fn long_ago(&mut self) -> i64 {
        self.start_clock - self.rng.random_range(0..3600)
    }

    /// `updateOne({_id}, {$set, $unset})`: no event when nothing changed, as on a real server.
    pub fn update(&mut self, id: i64, set: Document, unset: &[&str]) -> bool {
        let old = self.memory.comments.get(&id).cloned();
        let changed = self.memory.update(id, set, unset);
        if changed {
            self.changed(id, old);
        }
        changed
    }

    /// Inserts a row (and its insert event) at the simulated clock.
    pub fn insert_row(&mut self, row: Document) {
        let id = row.get_i64("_id").expect("an integer _id");
        let old = self.memory.comments.get(&id).cloned();
        self.memory.insert_row(row);
        self.changed(id, old);
    }

    /// `deleteOne({_id})` (and its delete event) at the simulated clock.
    pub fn delete_row(&mut self, id: i64) -> bool {
        let Some(old) = self.memory.delete_row(id) else {
            return false;
        };
        self.changed(id, Some(old));
        self.gone_ids.push(id);
        true
    }

    /// One random write by an application, at the simulated clock. Returns what it did.
    pub fn write_random(&mut self) -> String {
        self.memory.clock += self.rng.random_range(0..=2);
        if self.transactions > 0.0 && self.rng.random_bool(self.transactions) {
            return self.write_transaction();
        }
        let now_date = Bson::DateTime(self.memory.now());
        let roll = self.rng.random_range(0..100);
        let Some(id) = self.random_row().filter(|_| roll >= 25) else {
            // insert (a fresh id, or now and then a hard-deleted id again)
            let id = if !self.gone_ids.is_empty() && self.rng.random_bool(0.1) {
                let i = self.rng.random_range(0..self.gone_ids.len());
                self.gone_ids.swap_remove(i)
            } else {
                self.next_id += 1;
                self.next_id
            };
            let row = self.new_row(id);
            self.insert_row(row.clone());
            return format!("insert {row}");
        };
        let what = match roll {
            25..=41 => {
                self.update(id, doc! {DELETED_FIELD: now_date}, &[]);
                "soft delete"
            }
            42..=53 => {
                if self.rng.random_bool(0.5) {
                    self.update(id, doc! {}, &[DELETED_FIELD]);
                } else {
                    self.update(id, doc! {DELETED_FIELD: Bson::Null}, &[]);
                }
                "undelete"
            }
            54..=65 => {
                let post = self.random_post();
                match self.rng.random_range(0..8) {
                    0 | 1 => {
                        let deleted = if self.rng.random_bool(0.5) {
                            now_date
                        } else {
                            Bson::Null
                        };
                        self.update(id, doc! {POST_FIELD: post, DELETED_FIELD: deleted}, &[]);
                        "move and (un)delete"
                    }
                    // The row leaves counting altogether (and a later move brings it back).
                    2 if self.unset_post_ids => {
                        self.update(id, doc! {}, &[POST_FIELD]);
                        "remove post_id of"
                    }
                    _ => {
                        self.update(id, doc! {POST_FIELD: post}, &[]);
                        "move"
                    }
                }
            }
            66..=74 => {
                self.delete_row(id);
                "hard delete"
            }
            75..=88 if self.memory.definitions.len() > 1 && self.rng.random_bool(0.7) => {
                if self.sums() && self.rng.random_bool(0.5) {
                    self.sum_change(id)
                } else {
                    self.definition_change(id)
                }
            }
            75..=88 => {
                let body = format!("b{}", self.rng.random_range(0..1000));
                self.update(id, doc! {"body": body}, &[]);
                "edit"
            }
            89..=95 => {
                let old = self.memory.comments.get(&id).cloned();
                let mut row = self.new_row(id);
                if self.rng.random_bool(0.7) {
                    // Usually a replace keeps the creation time.
                    match old.as_ref().and_then(|o| o.get(CREATED_FIELD)) {
                        Some(c) => row.insert(CREATED_FIELD, c.clone()),
                        None => row.remove(CREATED_FIELD),
                    };
                }
                if self.memory.replace_row(id, row) {
                    self.changed(id, old);
                }
                "replace"
            }
            _ => {
                let secs = if self.rng.random_bool(0.3) {
                    self.long_ago()
                } else {
                    self.memory.clock - self.rng.random_range(0..300)
                };
                self.update(
                    id,
                    doc! {CREATED_FIELD: DateTime::from_millis(secs * 1000)},
                    &[],
                );
                "restamp created_at"
            }
        };
        format!("{what} {id}")
    }

    /// A multi-document transaction of 2 to 4 comment changes (inserts, soft deletes, moves
    /// across posts, now and then of one row twice): its events share one cluster time and one
    /// `lsid` + `txnNumber`, and are all in the oplog at once (the state's lock is held from
    /// its first write to its commit, so no actor reads half of it), as on a real server.
    fn write_transaction(&mut self) -> String {
        self.next_txn += 1;
        let txn = OplogTxn {
            session: self.rng.random_range(1..=3),
            number: self.next_txn,
        };
        self.memory.begin_transaction(txn);
        let mut what = Vec::new();
        for _ in 0..self.rng.random_range(2..=4) {
            let row = self.random_row().filter(|_| self.rng.random_bool(0.7));
            match (row, self.rng.random_range(0..2)) {
                (None, _) => {
                    self.next_id += 1;
                    let row = self.new_row(self.next_id);
                    self.insert_row(row);
                    what.push(format!("insert {}", self.next_id));
                }
                (Some(id), 0) => {
                    let now = Bson::DateTime(self.memory.now());
                    self.update(id, doc! {DELETED_FIELD: now}, &[]);
                    what.push(format!("soft delete {id}"));
                }
                (Some(id), _) => {
                    let post = self.random_post();
                    self.update(id, doc! {POST_FIELD: post}, &[]);
                    what.push(format!("move {id} to {post}"));
                }
            }
        }
        self.memory.commit_transaction();
        self.stat("transaction written");
        format!(
            "transaction {}/{}: {}",
            txn.session,
            txn.number,
            what.join(", ")
        )
    }

    // --- the truth and what the counters display ----------------------------------------------

    /// Live rows per (post, creation bucket).
    pub fn truth_by_bucket(&self) -> &BTreeMap<(GroupValue, i64), i64> {
        &self.live
    }

    /// The live rows per bucket counted from the rows themselves: equal to `truth_by_bucket`,
    /// or a write changed `comments` without the writers' bookkeeping.
    pub fn recount_truth(&self) -> BTreeMap<(GroupValue, i64), i64> {
        let mut out = BTreeMap::new();
        for row in self.memory.comments.values() {
            if let Some((post, created, true)) = row_facts(row) {
                *out.entry((post, bucket_of(created, self.bucket_width)))
                    .or_default() += 1;
            }
        }
        out
    }

    pub fn truth(&self) -> BTreeMap<GroupValue, i64> {
        let mut out = BTreeMap::new();
        for ((post, _), n) in &self.live {
            *out.entry(post.clone()).or_default() += n;
        }
        out
    }

    /// What every counter displays: `base_count + live_delta`.
    pub fn displayed(&self) -> BTreeMap<GroupValue, i64> {
        let counters = &self.memory.tables[0].counters;
        counters
            .iter()
            .map(|(p, c)| (p.clone(), c.state.displayed().as_i64()))
            .collect()
    }

    /// The true count of every group of counter definition `counter` with a row that counts
    /// there, from the rows themselves (its group field, its condition, the soft delete): the
    /// number of rows, or a sum's `$sum` of its field over them.
    pub fn truth_of(&self, counter: CounterIx) -> BTreeMap<GroupValue, Num> {
        let mut out: BTreeMap<GroupValue, Num> = BTreeMap::new();
        for row in self.memory.comments.values() {
            if let Some((group, _, true)) = self.memory.facts(counter, row) {
                *out.entry(group).or_default() += self.memory.amount(counter, row);
            }
        }
        out
    }

    /// What every counter of definition `counter` displays, and its `count` field.
    pub fn displayed_of(&self, counter: CounterIx) -> BTreeMap<GroupValue, (Num, Num)> {
        self.memory
            .tables(counter)
            .counters
            .iter()
            .map(|(p, c)| (p.clone(), (c.state.displayed(), c.count)))
            .collect()
    }

    /// Every counter's `count` beside its `base_count + live_delta`.
    pub fn counts(&self) -> Vec<(GroupValue, i64, i64)> {
        let counters = &self.memory.tables[0].counters;
        counters
            .iter()
            .map(|(p, c)| (p.clone(), c.count.as_i64(), c.state.displayed().as_i64()))
            .collect()
    }

    /// (base_count, base_watermark, live_delta, buckets) of every counter.
    pub fn counters(&self) -> BTreeMap<GroupValue, (i64, i64, i64, BTreeMap<i64, i64>)> {
        let counters = &self.memory.tables[0].counters;
        counters
            .iter()
            .map(|(p, c)| {
                let c = &c.state;
                let state = (
                    c.base_count.as_i64(),
                    c.base_watermark,
                    c.live_delta.as_i64(),
                    c.buckets.iter().map(|(b, a)| (*b, a.as_i64())).collect(),
                );
                (p.clone(), state)
            })
            .collect()
    }

    /// The buckets of a post's counter (`None`: no counter).
    pub fn counter_buckets(&self, post: &GroupValue) -> Option<Vec<i64>> {
        let counter = self.memory.tables[0].counters.get(post);
        counter.map(|c| c.state.buckets.keys().copied().collect())
    }

    /// An applied counter write, in the shadow of everything applied.
    pub(super) fn shadow_add(
        &mut self,
        counter: counterd::core::key::CounterIx,
        post: &GroupValue,
        buckets: &std::collections::BTreeMap<i64, Num>,
    ) {
        if counter != counterd::core::key::CounterIx::DEFAULT {
            return; // the other definitions are checked against the truth directly
        }
        for (bucket, amount) in buckets {
            *self.shadow.entry((post.clone(), *bucket)).or_default() += amount.as_i64();
        }
    }

    // --- the operator's hand edits ------------------------------------------------------------

    fn inject(&mut self, post: &GroupValue, amount: i64) {
        self.generation += 1;
        self.injected.entry(post.clone()).or_default().add(amount);
    }

    /// `$inc: {base_count: k}` on an existing counter.
    pub fn inject_base(&mut self, post: &GroupValue, k: i64) -> bool {
        let Some(c) = self.memory.tables[0].counters.get_mut(post) else {
            return false;
        };
        c.state.base_count += Num::Int(k);
        c.count += Num::Int(k);
        self.inject(post, k);
        self.note(format!("operator: {post} base_count {k:+}"));
        self.stat("operator edit base");
        true
    }

    /// `$inc: {live_delta: k, "live_by_bucket.<bucket>": k}` on an existing counter.
    pub fn inject_bucket(&mut self, post: &GroupValue, bucket: i64, k: i64) -> bool {
        let Some(c) = self.memory.tables[0].counters.get_mut(post) else {
            return false;
        };
        c.state.live_delta += Num::Int(k);
        c.count += Num::Int(k);
        *c.state.buckets.entry(bucket).or_default() += Num::Int(k);
        self.inject(post, k);
        *self
            .injected_buckets
            .entry((post.clone(), bucket))
            .or_default() += k;
        self.note(format!(
            "operator: {post} live_delta and bucket {bucket} {k:+}"
        ));
        self.stat("operator edit bucket");
        true
    }

    /// Deletes a counter document; returns what it displayed. Only while no batch of any
    /// stream is in flight for the post (a pending intent re-applied to the new, empty
    /// document would count its increments again: drift, but not the drift recorded here).
    pub fn delete_counter(&mut self, post: &GroupValue) -> Option<i64> {
        let carried = self.memory.carried.values();
        let in_flight = carried
            .into_iter()
            .any(|c| c.batch.counters.iter().any(|w| w.key.group == *post))
            || self.memory.checkpoints.values().any(|c| {
                let chunk = c.doc.snapshot.as_ref().and_then(|s| s.pending.as_ref());
                c.doc
                    .pending
                    .iter()
                    .any(|p| p.counters.iter().any(|w| w.key.group == *post))
                    || chunk.is_some_and(|p| p.counters.iter().any(|w| w.key.group == *post))
            });
        if in_flight {
            return None;
        }
        let displayed = self.memory.tables[0]
            .counters
            .remove(post)?
            .state
            .displayed()
            .as_i64();
        self.inject(post, -displayed);
        // Every bucket of a counter created anew lacks all that was applied to it before.
        self.injected_buckets.retain(|(p, _), _| p != post);
        let before: Vec<((GroupValue, i64), i64)> = self
            .shadow
            .range((post.clone(), i64::MIN)..=(post.clone(), i64::MAX))
            .map(|(k, v)| (k.clone(), -v))
            .collect();
        self.injected_buckets.extend(before);
        self.note(format!(
            "operator: deleted counter {post} (displayed {displayed})"
        ));
        self.stat("operator deleted counter");
        Some(displayed)
    }

    /// A fold was installed.
    pub(super) fn installed(&mut self, post: &GroupValue, fold: &Fold) {
        self.stat("fold installed");
        let racing = self.others_running > 0;
        if racing {
            self.stat("fold installed while others run");
        }
        if fold.drift != 0 {
            self.stat("fold corrected drift");
            if racing {
                self.stat("fold corrected drift while others run");
            }
        }
        self.record_correction(post, fold.drift.as_i64());
    }

    /// An installed fold corrected `drift` on `post`.
    fn record_correction(&mut self, post: &GroupValue, drift: i64) {
        if drift == 0 {
            return;
        }
        self.fold_log.push((post.clone(), drift));
        let corrected = {
            let c = self.corrected.entry(post.clone()).or_default();
            c.add(drift);
            *c
        };
        if self.drift_bounds && !self.memory.has_gaps() {
            let injected = self.injected.get(post).copied().unwrap_or_default();
            if corrected.high > injected.high || corrected.low < injected.low {
                let e = format!(
                    "a fold corrected post {post} by {drift:+}: corrections so far {corrected:?} exceed the drift injected {injected:?} (the reconciler invented drift)"
                );
                self.note(format!("  !! {e}"));
                self.probe_failures.push(e);
            }
        }
    }
}
