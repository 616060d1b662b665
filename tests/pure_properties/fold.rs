//! The reconcile fold.

use counterd::core::fold::{effective_watermark, fold, watermark_for, CounterState};
use counterd::core::num::Num;
use proptest::prelude::*;

use crate::WIDTH;

/// A counter's number: a count's integer, or a sum's integer or double (halves, so that every
/// sum the property adds up is exact in a double too and may be compared exactly).
pub fn number(range: std::ops::RangeInclusive<i64>) -> impl Strategy<Value = Num> {
    (range, any::<bool>()).prop_map(|(n, double)| {
        if double {
            Num::Double(n as f64 / 2.0)
        } else {
            Num::Int(n)
        }
    })
}

pub fn counter_state() -> impl Strategy<Value = (CounterState, bool)> {
    (
        number(-100..=100),
        0..10i64,
        proptest::collection::btree_map((0..20i64).prop_map(|b| b * WIDTH), number(-5..=5), 0..8),
        number(-20..=20),
        any::<bool>(),
    )
        .prop_map(|(base_count, wm, buckets, noise, consistent)| {
            let sum: Num = buckets.values().sum();
            let live_delta = if consistent { sum } else { sum + noise };
            (
                CounterState {
                    base_count,
                    base_watermark: wm * WIDTH,
                    live_delta,
                    buckets,
                },
                consistent,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn fold_arithmetic(
        (state, consistent) in counter_state(),
        proposed in (0..25i64).prop_map(|w| w * WIDTH),
        count in number(0..=200),
    ) {
        // Counts and sums fold by the same arithmetic; a double anywhere makes a double.
        let f = fold(&state, proposed, count);
        prop_assert_eq!(f.watermark, effective_watermark(&state, proposed));
        prop_assert!(f.watermark >= state.base_watermark, "watermark lowered");
        prop_assert!(f.watermark >= proposed);
        prop_assert_eq!(f.base_count, count);
        prop_assert_eq!(f.live_delta, f.kept.values().sum::<Num>());
        prop_assert_eq!(f.wrong, state.displayed());
        prop_assert_eq!(f.right, count + f.live_delta);
        prop_assert_eq!(f.drift, f.wrong - f.right);
        prop_assert!(f.kept.keys().all(|b| *b >= f.watermark));
        prop_assert!(f.dropped.iter().all(|b| *b < f.watermark));
        let mut all: Vec<i64> = f.kept.keys().copied().chain(f.dropped.iter().copied()).collect();
        all.sort();
        prop_assert_eq!(all, state.buckets.keys().copied().collect::<Vec<_>>());
        for (b, v) in &f.kept {
            prop_assert_eq!(state.buckets.get(b), Some(v));
        }
        let below: Num = state.buckets.iter().filter(|(b, _)| **b < f.watermark).map(|(_, v)| v).sum();
        if consistent {
            prop_assert!(!f.drift.differs(state.base_count + below - count));
        }
        // The shown value is a double exactly when a double took part.
        let doubles = state.base_count.is_double() || state.live_delta.is_double() || count.is_double()
            || state.buckets.values().any(|v| v.is_double());
        if !doubles {
            prop_assert!(!f.right.is_double() && !f.drift.is_double());
        }
        // Folding the result again with the same count finds no drift.
        let again = CounterState {
            base_count: f.base_count,
            base_watermark: f.watermark,
            live_delta: f.live_delta,
            buckets: f.kept.clone(),
        };
        let g = fold(&again, proposed, count);
        prop_assert_eq!(g.drift, 0);
        prop_assert!(g.drift.is_zero());
        prop_assert_eq!(g.watermark, f.watermark);
    }

    #[test]
    fn watermark_is_a_settled_bucket_boundary(
        now in 0..10_000_000i64,
        applied in proptest::option::of(0..10_000_000i64),
        settle in 0..600i64,
        width in 1..3600i64,
    ) {
        let w = watermark_for(now, applied, settle, width);
        prop_assert_eq!(w.rem_euclid(width), 0);
        let horizon = applied.map_or(now, |a| a.min(now)) - settle;
        prop_assert!(w <= horizon && horizon - w < width);
    }
}
