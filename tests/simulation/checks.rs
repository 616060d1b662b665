//! The checks: at caught-up points (also sampled at store-call boundaries by the probe), at round
//! boundaries, after the final reconcile and after the final sweep.

use bson::Timestamp;
use counterd::core::key::GroupValue;

use crate::seed::Sim;
use crate::sim_store::{Broken, State};

/// The checks that hold wherever every stream's worker has caught up (nothing in flight, no
/// event left to count) and no history was lost: the increments applied equal the truth per
/// post and creation bucket (no event was applied twice or never), and every post displays
/// its truth plus exactly the drift injected into it by hand and not yet corrected by a fold (a
/// reconcile that installed a recount which had seen an event in flight shows up here as drift
/// nobody injected). Returns whether the point was checked.
pub fn check_when_caught_up(
    s: &State,
    streams: &[String],
    start_at: Option<Timestamp>,
) -> Result<bool, String> {
    if s.has_gaps() || !s.caught_up(streams, start_at) {
        return Ok(false);
    }
    let by_bucket = s.truth_by_bucket();
    let mut keys: Vec<&(GroupValue, i64)> = by_bucket.keys().chain(s.shadow.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let want = by_bucket.get(key).copied().unwrap_or(0);
        let got = s.shadow.get(key).copied().unwrap_or(0);
        if want != got {
            return Err(format!(
                "post {} bucket {}: the increments applied sum to {got}, the truth is {want} (an event was applied twice or never)",
                key.0, key.1
            ));
        }
    }
    let truth = s.truth();
    let displayed = s.displayed();
    let mut posts: Vec<&GroupValue> = truth
        .keys()
        .chain(displayed.keys())
        .chain(s.injected.keys())
        .chain(s.corrected.keys())
        .collect();
    posts.sort();
    posts.dedup();
    for post in posts {
        let shown = displayed.get(post).copied().unwrap_or(0);
        let want = truth.get(post).copied().unwrap_or(0);
        let injected = s.injected.get(post).copied().unwrap_or_default();
        let corrected = s.corrected.get(post).copied().unwrap_or_default();
        if shown - want != injected.net - corrected.net {
            return Err(format!(
                "post {post} displays {shown}, its truth is {want} (off by {:+}), but the drift injected by hand and not yet corrected is {:+} (injected {injected:?}, corrected {corrected:?}): a fold invented drift, or an event was counted twice or never",
                shown - want,
                injected.net - corrected.net
            ));
        }
    }
    check_other_definitions(s, "at a caught-up point")?;
    Ok(true)
}

/// Every counter of every definition beyond the default displays exactly its truth (nothing is
/// injected into them) and its `count` field agrees.
pub fn check_other_definitions(s: &State, when: &str) -> Result<(), String> {
    for counter in s.memory.counter_ixs().into_iter().skip(1) {
        let truth = s.truth_of(counter);
        let displayed = s.displayed_of(counter);
        let mut groups: Vec<&GroupValue> = truth.keys().chain(displayed.keys()).collect();
        groups.sort();
        groups.dedup();
        for group in groups {
            let want = truth.get(group).copied().unwrap_or_default();
            let (shown, count) = displayed.get(group).copied().unwrap_or_default();
            if shown.differs(want) || count.differs(shown) {
                return Err(format!(
                    "definition #{} ({}), group {group} {when}: displays {shown} (count {count}), its truth is {want}",
                    counter.0,
                    s.memory.definitions[counter.0].name
                ));
            }
        }
    }
    Ok(())
}

impl Sim {
    /// Checks that hold at every round boundary.
    pub fn check_invariants(&self) -> Result<(), String> {
        let s = self.store.lock();
        for (post, count, parts) in s.counts() {
            if count != parts {
                return Err(format!(
                    "counter {post}: count {count} != base_count + live_delta {parts}"
                ));
            }
        }
        if self.plan.variant.broken != Broken::SeedFold {
            for (post, (_, _, live, buckets)) in s.counters() {
                let sum: i64 = buckets.values().sum();
                if sum != live {
                    return Err(format!(
                        "counter {post}: live_delta {live} != sum of its buckets {sum} ({buckets:?})"
                    ));
                }
            }
        }
        for counter in s.memory.counter_ixs().into_iter().skip(1) {
            for (group, c) in &s.memory.tables(counter).counters {
                let sum: counterd::core::num::Num = c.state.buckets.values().sum();
                if c.count.differs(c.state.displayed())
                    || (sum.differs(c.state.live_delta) && !self.seed_fold())
                {
                    return Err(format!(
                        "definition #{} counter {group}: count {}, base_count {} + live_delta {}, buckets {:?}",
                        counter.0, c.count, c.state.base_count, c.state.live_delta, c.state.buckets
                    ));
                }
            }
        }
        for (stream, _) in self.plan.streams() {
            let Some(c) = s.checkpoint_view(&stream) else {
                continue;
            };
            if let (Some(p), Some(h)) = (&c.pending, &c.high_water) {
                if p.end > *h {
                    return Err(format!(
                        "{stream}: pending batch {} above the high water {h}",
                        p.end
                    ));
                }
            }
            if c.pending.is_some() && c.high_water.is_none() {
                return Err(format!("{stream}: pending batch without a high water"));
            }
        }
        Ok(())
    }

    /// The broken variant whose folds leave `live_delta` apart from its buckets.
    pub fn seed_fold(&self) -> bool {
        self.plan.variant.broken == Broken::SeedFold
    }

    /// The checks once the workers have caught up after the last round, before the final
    /// reconcile: see [`check_when_caught_up`].
    pub fn check_caught_up(&self) -> Result<(), String> {
        let s = self.store.lock();
        if s.recount_truth() != *s.truth_by_bucket() {
            return Err(
                "the store's live rows per bucket drifted from its rows (harness bug)".into(),
            );
        }
        check_when_caught_up(&s, &self.stream_names(), self.plan.start_at()).map(|_| ())
    }

    /// After the final reconcile: no post is dirty, the caught-up checks hold, and every bucket
    /// at or above a counter's watermark (never folded) holds exactly its live rows, plus what
    /// the operator put there by hand.
    pub fn check_final_reconcile(&self) -> Result<(), String> {
        let s = self.store.lock();
        for counter in s.counter_ixs() {
            let dirty = s.dirty_posts(counter);
            if !dirty.is_empty() {
                return Err(format!(
                    "definition #{}: groups still dirty after the final reconcile: {dirty:?}",
                    counter.0
                ));
            }
        }
        check_when_caught_up(&s, &self.stream_names(), self.plan.start_at())?;
        if self.plan.variant.broken == Broken::None {
            let by_bucket = s.truth_by_bucket();
            // After lost history only the buckets a counter has are compared: a full recount
            // whose total already matched installs nothing and leaves the old watermark, below
            // rows its base now counts (see `a_noop_full_recount_keeps_its_watermark`).
            let gaps = s.has_gaps();
            for (post, (base, watermark, live, buckets)) in s.counters() {
                let above = |(p, b): &&(GroupValue, i64)| *p == post && *b >= watermark && !gaps;
                let mut keys: Vec<i64> = buckets
                    .keys()
                    .copied()
                    .filter(|b| *b >= watermark)
                    .collect();
                keys.extend(by_bucket.keys().filter(above).map(|(_, b)| *b));
                keys.extend(s.injected_buckets.keys().filter(above).map(|(_, b)| *b));
                keys.sort();
                keys.dedup();
                for bucket in keys {
                    let key = (post.clone(), bucket);
                    if gaps && s.injected_buckets.contains_key(&key) {
                        // What a deleted counter lacked is known from the increments applied,
                        // which after lost history are not the truth.
                        continue;
                    }
                    let truth = by_bucket.get(&key).copied().unwrap_or(0);
                    let edited = s.injected_buckets.get(&key).copied().unwrap_or(0);
                    let got = buckets.get(&bucket).copied().unwrap_or(0);
                    if got != truth + edited {
                        return Err(format!(
                            "post {post} bucket {bucket} (>= watermark {watermark}): {got} != truth {truth} + {edited} put there by hand (counter: base {base}, live {live}, buckets {buckets:?}; truth {:?})",
                            s.truth().get(&post)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// After the final sweep: every counter equals the truth, no post is dirty, and (no history
    /// lost) the corrections reported per post, with sign, are exactly the drift injected.
    pub fn check_final(&self) -> Result<(), String> {
        let s = self.store.lock();
        let truth = s.truth();
        let counters = s.counters();
        let mut posts: Vec<&GroupValue> = truth.keys().chain(counters.keys()).collect();
        posts.sort();
        posts.dedup();
        for post in posts {
            let want = truth.get(post).copied().unwrap_or(0);
            let got = counters.get(post).map_or(0, |(b, _, l, _)| b + l);
            if want != got {
                return Err(format!(
                    "post {post}: displayed {got} != truth {want} after the final sweep (counter {:?})",
                    counters.get(post)
                ));
            }
        }
        for counter in s.counter_ixs() {
            let dirty = s.dirty_posts(counter);
            if !dirty.is_empty() {
                return Err(format!(
                    "definition #{}: groups still dirty after the final sweep: {dirty:?}",
                    counter.0
                ));
            }
        }
        check_other_definitions(&s, "after the final sweep")?;
        if !s.has_gaps() {
            let reported = self.reported.borrow();
            let mut posts: Vec<&GroupValue> = reported.keys().chain(s.injected.keys()).collect();
            posts.sort();
            posts.dedup();
            for post in posts {
                let got = reported.get(post).copied().unwrap_or(0);
                let want = s.injected.get(post).map_or(0, |d| d.net);
                if got != want {
                    return Err(format!(
                        "post {post}: the reconcile runs reported corrections summing to {got:+}, but the drift injected by hand was {want:+}"
                    ));
                }
            }
        }
        Ok(())
    }
}
