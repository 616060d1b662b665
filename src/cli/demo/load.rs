//! The demo's load generator and the drift it injects by hand, and the drift the reconciler
//! reported (read back from the stored reconcile runs) to compare with it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{doc, DateTime, Document};
use futures::TryStreamExt;
use mongodb::Collection;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::post;
use crate::core::num::Num;
use crate::shutdown::Shutdown;

/// Drift by sign: how many counters, and the sum of |drift| in their units (comments for a
/// count, rating points for the demo's sum), ran high and low.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct DriftTally {
    high_counters: u64,
    high_sum: Num,
    low_counters: u64,
    low_sum: Num,
}

impl DriftTally {
    fn add(&mut self, drift: i64) {
        if drift > 0 {
            self.high_counters += 1;
            self.high_sum += Num::Int(drift);
        } else if drift < 0 {
            self.low_counters += 1;
            self.low_sum += Num::Int(-drift);
        }
    }

    /// Whether two tallies agree (sums of doubles within rounding).
    pub(super) fn matches(&self, other: &DriftTally) -> bool {
        self.high_counters == other.high_counters
            && self.low_counters == other.low_counters
            && !self.high_sum.differs(other.high_sum)
            && !self.low_sum.differs(other.low_sum)
    }
}

impl std::fmt::Display for DriftTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "high {} counter(s) |{}|, low {} counter(s) |{}|",
            self.high_counters, self.high_sum, self.low_counters, self.low_sum
        )
    }
}

/// The corrections of every reconcile run (of every counter definition) since `since`, by sign.
pub(super) async fn reported_drift(
    db: &mongodb::Database,
    runs: &str,
    since: DateTime,
) -> anyhow::Result<DriftTally> {
    let mut tally = DriftTally::default();
    let mut runs = db
        .collection::<Document>(runs)
        .find(doc! {"started_at": {"$gte": since}})
        .await?;
    let count = |run: &Document, field: &str| run.get_i64(field).unwrap_or_default() as u64;
    let num = |run: &Document, field: &str| run.get(field).and_then(Num::from_bson);
    while let Some(run) = runs.try_next().await? {
        tally.high_counters += count(&run, "corrected_high");
        tally.high_sum += num(&run, "drift_high").unwrap_or_default();
        tally.low_counters += count(&run, "corrected_low");
        tally.low_sum -= num(&run, "drift_low").unwrap_or_default();
    }
    Ok(tally)
}

/// What the load generator writes and where it knocks counters off.
pub(super) struct Load {
    pub comments: Collection<Document>,
    pub schema: crate::core::schema::Schema,
    /// Counter collections it edits by hand now and then (the default's, the rating sum's).
    pub drift_targets: Vec<Collection<Document>>,
    pub posts: usize,
    pub rate: u32,
    pub drift_every: Duration,
    pub injected: Arc<Mutex<DriftTally>>,
}

/// A comment row of the demo: in the configured schema, approved or not, rated 1 to 5.
pub(super) fn comment(
    schema: &crate::core::schema::Schema,
    id: String,
    post_ix: usize,
    created: DateTime,
    rng: &mut StdRng,
) -> Document {
    let mut row = schema.row_document(id, &post(post_ix), created, false);
    row.insert("body", "hello");
    row.insert("approved", rng.random_bool(0.5));
    row.insert("rating", rng.random_range(1..=5_i32));
    row
}

impl Load {
    /// Inserts, approves and unapproves, re-rates, soft-deletes, undeletes and hard-deletes
    /// comments at `rate` per second, and every `drift_every` knocks a counter off by hand
    /// (the drift counterd exists to correct), until `stop`.
    pub(super) async fn run(self, stop: Shutdown) -> anyhow::Result<()> {
        let mut rng = StdRng::seed_from_u64(7);
        let mut ids: Vec<String> = Vec::new();
        let mut tick =
            tokio::time::interval(Duration::from_secs_f64(1.0 / self.rate.max(1) as f64));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last_drift = Instant::now();
        let mut edited = HashSet::new();
        let mut n = 0u64;
        while !stop.requested() {
            tick.tick().await;
            n += 1;
            if let Err(e) = self.write_one(&mut rng, &mut ids, n).await {
                tracing::warn!(error = %e, "load generator write failed");
            }
            if !self.drift_every.is_zero() && last_drift.elapsed() >= self.drift_every {
                last_drift = Instant::now();
                self.knock_off(&mut rng, &mut edited).await;
            }
        }
        Ok(())
    }

    /// One write: an insert (55 %), an approval change, a new rating, a soft delete or
    /// undelete, or a hard delete of an earlier comment.
    async fn write_one(
        &self,
        rng: &mut StdRng,
        ids: &mut Vec<String>,
        n: u64,
    ) -> mongodb::error::Result<()> {
        let roll = rng.random_range(0..100);
        if ids.is_empty() || roll < 55 {
            let id = format!("c-{n}");
            ids.push(id.clone());
            let created = chrono::Utc::now().timestamp() - rng.random_range(0..120);
            let post_ix = rng.random_range(0..self.posts);
            let row = comment(
                &self.schema,
                id,
                post_ix,
                DateTime::from_millis(created * 1000),
                rng,
            );
            return self.comments.insert_one(row).await.map(|_| ());
        }
        let id = ids[rng.random_range(0..ids.len())].clone();
        let update = match roll {
            // Approve or unapprove: moves the row in or out of the `approved` counter.
            55..=59 => Some(doc! {"$set": {"approved": rng.random_bool(0.5)}}),
            // A new rating: the post's sum moves by new - old, its row count stays.
            60..=64 => Some(doc! {"$set": {"rating": rng.random_range(1..=5_i32)}}),
            // None under soft_delete = "never".
            65..=79 => self.schema.soft_delete_update(DateTime::now()),
            80..=89 => self.schema.undelete_update(),
            _ => {
                ids.retain(|i| *i != id);
                self.comments.delete_one(doc! {"_id": &id}).await?;
                return Ok(());
            }
        };
        if let Some(update) = update {
            self.comments.update_one(doc! {"_id": &id}, update).await?;
        }
        Ok(())
    }

    /// Edits one counter's `base_count` (and `count`) by +3 or -2: exactly what a fold
    /// replaces with a recount, so the drift reported for it is exactly that amount. Each
    /// counter is edited at most once, so two edits of one counter cannot net out.
    async fn knock_off(&self, rng: &mut StdRng, edited: &mut HashSet<(usize, usize)>) {
        if self.drift_targets.is_empty() {
            return;
        }
        let amount: i64 = if rng.random_bool(0.5) { 3 } else { -2 };
        let target = rng.random_range(0..self.drift_targets.len());
        let post_ix = rng.random_range(0..self.posts);
        if !edited.insert((target, post_ix)) {
            return;
        }
        let result = self.drift_targets[target]
            .update_one(
                doc! {"_id": post(post_ix).to_bson()},
                doc! {"$inc": {"base_count": amount, "count": amount}},
            )
            .await;
        if result.is_ok_and(|r| r.modified_count == 1) {
            self.injected.lock().unwrap().add(amount);
        }
    }
}
