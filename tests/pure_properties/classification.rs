//! One event, before-state known: deltas are live_after - live_before per post and bucket.

use std::collections::BTreeMap;

use bson::{doc, oid::ObjectId, Bson};
use counterd::core::classify::{classify, After, Attribution, Before, Source};
use counterd::core::event::ChangeEvent;
use counterd::core::key::GroupValue;
use counterd::core::key::{CounterIx, CounterKey};
use counterd::core::schema::Schema;
use counterd::core::time::bucket_of;
use proptest::prelude::*;
use proptest::sample::select;

use crate::{
    add_live, comment_strategy, diff, fake_event, fake_spec, nonzero, real_event, Comment, Tally,
    WIDTH,
};

#[derive(Clone, Copy, Debug)]
pub enum Kind {
    Insert,
    UpdateReal,
    UpdateFake,
    Replace,
    Delete,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn classification_with_known_before_is_exact(
        kind in select(vec![Kind::Insert, Kind::UpdateReal, Kind::UpdateFake, Kind::Replace, Kind::Delete]),
        before in comment_strategy(),
        stale in proptest::option::of(comment_strategy()),
        after in comment_strategy(),
        with_pre_image in any::<bool>(),
        attribution_pick in 0..3usize,
    ) {
        let id = Bson::ObjectId(ObjectId::from_bytes([7; 12]));
        let (truth_before, truth_after, mut doc) = match kind {
            Kind::Insert => {
                let mut d = real_event(1, "insert", &id);
                d.insert("fullDocument", after.doc(&id));
                (None, Some(after.clone()), d)
            }
            Kind::UpdateReal => {
                let mut d = real_event(1, "update", &id);
                let (set, removed) = diff(&before.doc(&id), &after.doc(&id));
                d.insert("fullDocument", after.doc(&id));
                d.insert("updateDescription", doc! {
                    "updatedFields": set, "removedFields": removed, "truncatedArrays": [],
                });
                (Some(before.clone()), Some(after.clone()), d)
            }
            Kind::UpdateFake => {
                let mut d = fake_event(1, "update");
                let (set, removed) = diff(&before.doc(&id), &after.doc(&id));
                d.insert("fullDocument", after.doc(&id));
                d.insert("documentKey", fake_spec(&set, &removed));
                (Some(before.clone()), Some(after.clone()), d)
            }
            Kind::Replace => {
                let mut d = real_event(1, "replace", &id);
                d.insert("fullDocument", after.doc(&id));
                (Some(before.clone()), Some(after.clone()), d)
            }
            Kind::Delete => (Some(before.clone()), None, real_event(1, "delete", &id)),
        };
        let real = !matches!(kind, Kind::UpdateFake);
        let pre_image = with_pre_image && real && truth_before.is_some();
        if pre_image {
            doc.insert("fullDocumentBeforeChange", before.doc(&id));
        }
        let mut attributions = vec![Attribution::Auto, Attribution::Ledger];
        if pre_image {
            attributions.push(Attribution::PreImage);
        }
        let attribution = attributions[attribution_pick % attributions.len()];
        // An insert ignores the ledger: give it a stale entry to prove it.
        let ledger = match kind {
            Kind::Insert => Before::Known(stale.map(|c| c.row())),
            _ => Before::Known(truth_before.as_ref().map(Comment::row)),
        };

        let event = ChangeEvent::parse(&doc).unwrap();
        let c = classify(&event, ledger, attribution, &Schema::default()).unwrap();

        let mut truth = Tally::new();
        add_live(&mut truth, truth_after.as_ref(), 1);
        add_live(&mut truth, truth_before.as_ref(), -1);
        let mut got = Tally::new();
        for d in &c.deltas {
            *got.entry((d.key.group.clone(), bucket_of(d.created_at, WIDTH))).or_default() += d.amount.as_i64();
        }
        prop_assert_eq!(nonzero(got.clone()), nonzero(truth.clone()));
        // Per post too (the design's statement).
        let per_post = |t: &Tally| {
            let mut m: BTreeMap<GroupValue, i64> = BTreeMap::new();
            for ((p, _), v) in t {
                *m.entry(p.clone()).or_default() += v;
            }
            m.retain(|_, v| *v != 0);
            m
        };
        prop_assert_eq!(per_post(&got), per_post(&truth));
        // Every touched post is dirty.
        for touched in truth_before.iter().chain(truth_after.iter()) {
            prop_assert!(c.dirty.contains(&default_key(&touched.post)), "{:?} not dirty", touched.post);
        }
        for d in &c.deltas {
            prop_assert!(c.dirty.contains(&key_of(d)));
            prop_assert!(d.amount == 1 || d.amount == -1);
        }
        prop_assert_eq!(c.after, After::Known(truth_after.as_ref().map(Comment::row)));
        prop_assert_eq!(c.problem, None);
        let expected_source = match kind {
            Kind::Insert => Source::Insert,
            _ if pre_image && attribution != Attribution::Ledger => Source::PreImage,
            _ => Source::Ledger,
        };
        prop_assert_eq!(c.source, expected_source);
    }

    /// Best effort guesses, but its guesses are well-formed: unit amounts on dirty posts.
    #[test]
    fn best_effort_deltas_are_on_dirty_posts(
        kind in select(vec![Kind::Insert, Kind::UpdateReal, Kind::UpdateFake, Kind::Replace, Kind::Delete]),
        before in comment_strategy(),
        after in comment_strategy(),
        sharded in any::<bool>(),
    ) {
        let id = Bson::Int32(3);
        let (set, removed) = diff(&before.doc(&id), &after.doc(&id));
        let doc = match kind {
            Kind::Insert => {
                let mut d = real_event(1, "insert", &id);
                d.insert("fullDocument", after.doc(&id));
                d
            }
            Kind::UpdateReal => {
                let mut d = real_event(1, "update", &id);
                d.insert("fullDocument", after.doc(&id));
                d.insert("updateDescription", doc! {"updatedFields": set, "removedFields": removed});
                d
            }
            Kind::UpdateFake => {
                let mut d = fake_event(1, "update");
                d.insert("fullDocument", after.doc(&id));
                d.insert("documentKey", fake_spec(&set, &removed));
                d
            }
            Kind::Replace => {
                let mut d = real_event(1, "replace", &id);
                d.insert("fullDocument", after.doc(&id));
                d
            }
            Kind::Delete => {
                let mut d = real_event(1, "delete", &id);
                if sharded {
                    d.insert("documentKey", doc! {"post_id": before.post.to_bson(), "_id": id.clone()});
                }
                d
            }
        };
        let event = ChangeEvent::parse(&doc).unwrap();
        let c = classify(&event, Before::Unknown, Attribution::BestEffort, &Schema::default()).unwrap();
        prop_assert!(c.deltas.len() <= 2);
        for d in &c.deltas {
            prop_assert!(c.dirty.contains(&key_of(d)));
            prop_assert!(d.amount == 1 || d.amount == -1);
        }
        if matches!(kind, Kind::Insert) {
            prop_assert_eq!(c.source, Source::Insert);
        } else {
            prop_assert_eq!(c.source, Source::BestEffort);
        }
    }
}

/// The default definition's counter of `post`.
pub fn default_key(post: &GroupValue) -> CounterKey {
    CounterKey {
        counter: CounterIx::DEFAULT,
        group: post.clone(),
    }
}

/// The counter a delta changes.
pub fn key_of(d: &counterd::core::classify::Delta) -> CounterKey {
    d.key.clone()
}
