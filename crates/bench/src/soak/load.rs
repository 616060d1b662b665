//! The soak's load: an application's writes to `comments`, a realistic mix over a few hundred
//! posts (a few of them hot): inserts (some back-dated), soft deletes and undeletes, moves to
//! another post and hard deletes. Writes go straight to the server, never through the proxy:
//! the faults are counterd's to meet.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bson::{doc, DateTime, Document};
use mongodb::Collection;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Posts the load writes to.
pub const POSTS: i64 = 300;

/// Writes made, and the switch that pauses them.
#[derive(Default)]
pub struct Load {
    pub writes: AtomicU64,
    pub failed: AtomicU64,
    pub paused: AtomicBool,
    pub stop: AtomicBool,
    /// Writers between their pause check and their write's acknowledgement: raised before the
    /// check, so once `paused` is set and this is 0, no write is in flight or still to come.
    in_flight: AtomicU64,
}

impl Load {
    /// Pauses the writers and waits until none is writing: every write made so far is
    /// acknowledged.
    pub async fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

/// A post: one in ten writes goes to one of five hot posts.
fn post(rng: &mut StdRng) -> i64 {
    if rng.random_range(0..10) == 0 {
        rng.random_range(0..5)
    } else {
        rng.random_range(0..POSTS)
    }
}

/// One writer, about `per_second` writes a second while not paused, until stopped.
pub async fn writer(comments: Collection<Document>, load: Arc<Load>, seed: u64, per_second: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut inserted = 0u64;
    let pause = Duration::from_micros(1_000_000 / per_second.max(1));
    while !load.stop.load(Ordering::Relaxed) {
        load.in_flight.fetch_add(1, Ordering::SeqCst);
        if load.paused.load(Ordering::SeqCst) {
            load.in_flight.fetch_sub(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let some = |rng: &mut StdRng| format!("w{seed}-{}", rng.random_range(0..inserted.max(1)));
        let now = chrono::Utc::now().timestamp();
        let result = match rng.random_range(0..20) {
            0..=9 => {
                // Mostly new, some back-dated by up to a day (an import, a clock skew).
                let age = if rng.random_range(0..10) == 0 {
                    rng.random_range(0..86_400)
                } else {
                    rng.random_range(0..5)
                };
                let id = format!("w{seed}-{inserted}");
                inserted += 1;
                comments
                    .insert_one(doc! {"_id": id, "post_id": post(&mut rng), "created_at": DateTime::from_millis((now - age) * 1000), "body": "soak"})
                    .await
                    .map(|_| ())
            }
            10..=13 => comments
                .update_one(
                    doc! {"_id": some(&mut rng)},
                    doc! {"$set": {"deleted_at": DateTime::now()}},
                )
                .await
                .map(|_| ()),
            14..=15 => comments
                .update_one(
                    doc! {"_id": some(&mut rng)},
                    doc! {"$unset": {"deleted_at": ""}},
                )
                .await
                .map(|_| ()),
            16..=17 => comments
                .update_one(
                    doc! {"_id": some(&mut rng)},
                    doc! {"$set": {"post_id": post(&mut rng)}},
                )
                .await
                .map(|_| ()),
            _ => comments
                .delete_one(doc! {"_id": some(&mut rng)})
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => load.writes.fetch_add(1, Ordering::SeqCst),
            Err(_) => load.failed.fetch_add(1, Ordering::SeqCst),
        };
        load.in_flight.fetch_sub(1, Ordering::SeqCst);
        tokio::time::sleep(pause).await;
    }
}
