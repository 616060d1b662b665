//! Pure: the numbers a counter holds, with MongoDB's numeric rules.
//!
//! A `count` definition only ever adds whole rows, so its amounts are 64-bit integers. A `sum`
//! definition adds a field's values, which may be integers or doubles, and the counter
//! document must hold what MongoDB itself would hold after the same `$inc`s, and what a `$sum`
//! recount returns: integers stay exact as 64-bit integers, and any double makes the result a
//! double. [`Num`] is that value: `Int` until a double is involved, `Double` from then on.
//!
//! Overflow of 64-bit integers is never wrapped. [`Num::checked_add`] and
//! [`Num::checked_sub`] report it (the classifier turns it into a bad event); the operators
//! (`+`, `-`, `Sum`) promote to a double instead, as `$sum` does, so coalescing never wraps a
//! counter even where nobody asked first.

use std::cmp::Ordering;
use std::fmt;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use bson::Bson;
use serde::{Deserialize, Serialize};

/// A counter's number: an exact 64-bit integer, or a double once any double was added.
/// Serialized as the bare number; read back as an integer where it is one, else a double.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Num {
    Int(i64),
    Double(f64),
}

impl Default for Num {
    fn default() -> Num {
        Num::ZERO
    }
}

impl Num {
    pub const ZERO: Num = Num::Int(0);
    pub const ONE: Num = Num::Int(1);

    /// The number a BSON value is, as `$sum` sees numbers: 32- and 64-bit integers and finite
    /// doubles (`None`: not a number, or a NaN or an infinity, which no counter can hold).
    /// Decimal128 is not read (`$sum` would add it; see the operator notes).
    pub fn from_bson(value: &Bson) -> Option<Num> {
        match value {
            Bson::Int32(i) => Some(Num::Int(*i as i64)),
            Bson::Int64(i) => Some(Num::Int(*i)),
            Bson::Double(d) if d.is_finite() => Some(Num::Double(*d)),
            _ => None,
        }
    }

    /// The value as stored: an Int64 or a Double.
    pub fn to_bson(self) -> Bson {
        match self {
            Num::Int(i) => Bson::Int64(i),
            Num::Double(d) => Bson::Double(d),
        }
    }

    /// `self + other` by MongoDB's rules; `None` when two integers overflow 64 bits.
    pub fn checked_add(self, other: Num) -> Option<Num> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.checked_add(b).map(Num::Int),
            (a, b) => Some(Num::Double(a.as_f64() + b.as_f64())),
        }
    }

    /// `self - other` by MongoDB's rules; `None` when two integers overflow 64 bits.
    pub fn checked_sub(self, other: Num) -> Option<Num> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.checked_sub(b).map(Num::Int),
            (a, b) => Some(Num::Double(a.as_f64() - b.as_f64())),
        }
    }

    /// The value as a double (exact for integers up to 2^53).
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Double(d) => d,
        }
    }

    /// The value as an integer: exact for `Int`, rounded toward zero (and saturated) for a
    /// double. Where a count is expected (counts never hold doubles).
    pub fn as_i64(self) -> i64 {
        match self {
            Num::Int(i) => i,
            Num::Double(d) => d as i64,
        }
    }

    pub fn is_zero(self) -> bool {
        self == 0
    }

    /// Whether two values of one counter differ by more than a double's rounding: exact
    /// between integers; between doubles (sums added in another order round differently)
    /// a relative 1e-9. What a drift report and a comparison with the truth go by.
    pub fn differs(self, other: Num) -> bool {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a != b,
            (a, b) => {
                let (a, b) = (a.as_f64(), b.as_f64());
                (a - b).abs() > 1e-9 * a.abs().max(b.abs()).max(1.0)
            }
        }
    }

    pub fn is_double(self) -> bool {
        matches!(self, Num::Double(_))
    }

    /// The absolute value (an integer's saturates at `i64::MAX`).
    pub fn abs(self) -> Num {
        match self {
            Num::Int(i) => Num::Int(i.saturating_abs()),
            Num::Double(d) => Num::Double(d.abs()),
        }
    }
}

impl From<Num> for Bson {
    fn from(n: Num) -> Bson {
        n.to_bson()
    }
}

impl From<i64> for Num {
    fn from(i: i64) -> Num {
        Num::Int(i)
    }
}

impl Add for Num {
    type Output = Num;
    /// Adds by MongoDB's rules; an integer overflow becomes a double (as `$sum` does), never a
    /// wrapped integer.
    fn add(self, other: Num) -> Num {
        self.checked_add(other)
            .unwrap_or(Num::Double(self.as_f64() + other.as_f64()))
    }
}

impl Sub for Num {
    type Output = Num;
    fn sub(self, other: Num) -> Num {
        self.checked_sub(other)
            .unwrap_or(Num::Double(self.as_f64() - other.as_f64()))
    }
}

impl Neg for Num {
    type Output = Num;
    fn neg(self) -> Num {
        Num::ZERO - self
    }
}

impl AddAssign for Num {
    fn add_assign(&mut self, other: Num) {
        *self = *self + other;
    }
}

impl SubAssign for Num {
    fn sub_assign(&mut self, other: Num) {
        *self = *self - other;
    }
}

impl std::iter::Sum for Num {
    fn sum<I: Iterator<Item = Num>>(iter: I) -> Num {
        iter.fold(Num::ZERO, Add::add)
    }
}

impl<'a> std::iter::Sum<&'a Num> for Num {
    fn sum<I: Iterator<Item = &'a Num>>(iter: I) -> Num {
        iter.copied().sum()
    }
}

/// Equal kind and value: `Int(3)` is not `Double(3.0)` (a counter that turned into a double
/// is a different document). Doubles compare bit for bit, so equality is reflexive.
impl PartialEq for Num {
    fn eq(&self, other: &Num) -> bool {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a == b,
            (Num::Double(a), Num::Double(b)) => a.to_bits() == b.to_bits() || a == b,
            _ => false,
        }
    }
}

impl Eq for Num {}

/// By value: `Double(0.0) == 0` (for "no drift", "nothing left").
impl PartialEq<i64> for Num {
    fn eq(&self, other: &i64) -> bool {
        match self {
            Num::Int(i) => i == other,
            Num::Double(d) => *d == *other as f64,
        }
    }
}

impl PartialOrd<i64> for Num {
    fn partial_cmp(&self, other: &i64) -> Option<Ordering> {
        self.partial_cmp(&Num::Int(*other))
    }
}

/// By value across kinds (exact between integers).
impl PartialOrd for Num {
    fn partial_cmp(&self, other: &Num) -> Option<Ordering> {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => Some(a.cmp(b)),
            (a, b) => a.as_f64().partial_cmp(&b.as_f64()),
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self, f.sign_plus()) {
            (Num::Int(i), false) => write!(f, "{i}"),
            (Num::Int(i), true) => write!(f, "{i:+}"),
            (Num::Double(d), false) => write!(f, "{d:?}"),
            (Num::Double(d), true) => write!(f, "{d:+?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn integers_stay_exact_and_a_double_makes_a_double() {
        assert_eq!(Num::Int(2) + Num::Int(3), Num::Int(5));
        assert_eq!(Num::Int(2) + Num::Double(0.5), Num::Double(2.5));
        assert_eq!(Num::Double(2.5) - Num::Double(2.5), Num::Double(0.0));
        assert!((Num::Double(2.5) - Num::Double(2.5)).is_zero());
        // 2^53 + 1 is exact as an integer (a double would round it).
        let big = Num::Int((1 << 53) + 1);
        assert_eq!(big + Num::ZERO, Num::Int(9_007_199_254_740_993));
    }

    #[test]
    fn overflow_is_reported_or_promoted_never_wrapped() {
        assert_eq!(Num::Int(i64::MAX).checked_add(Num::ONE), None);
        assert_eq!(Num::Int(i64::MIN).checked_sub(Num::ONE), None);
        let promoted = Num::Int(i64::MAX) + Num::ONE;
        assert!(promoted.is_double());
        assert!(promoted.as_f64() > 9.2e18);
        assert!((Num::Int(i64::MIN) - Num::ONE).as_f64() < -9.2e18);
        assert_eq!(
            -Num::Int(i64::MIN),
            Num::Double(9_223_372_036_854_775_808.0)
        );
    }

    #[test]
    fn bson_numbers_read_as_sum_reads_them() {
        assert_eq!(Num::from_bson(&Bson::Int32(4)), Some(Num::Int(4)));
        assert_eq!(Num::from_bson(&Bson::Int64(-4)), Some(Num::Int(-4)));
        assert_eq!(Num::from_bson(&Bson::Double(1.5)), Some(Num::Double(1.5)));
        for not in [
            Bson::Double(f64::NAN),
            Bson::Double(f64::INFINITY),
            Bson::String("4".into()),
            Bson::Boolean(true),
            Bson::Null,
        ] {
            assert_eq!(Num::from_bson(&not), None, "{not:?}");
        }
        assert_eq!(Num::Int(3).to_bson(), Bson::Int64(3));
        assert_eq!(Num::Double(3.0).to_bson(), Bson::Double(3.0));
    }

    #[test]
    fn equality_keeps_the_kind_and_display_shows_it() {
        assert_ne!(Num::Int(3), Num::Double(3.0));
        assert_eq!(Num::Int(3), 3);
        assert_eq!(Num::Double(0.0), 0, "compared with an integer by value");
        assert!(Num::Double(-0.5) < 0);
        assert_eq!(Num::Double(f64::NAN), Num::Double(f64::NAN));
        assert_eq!(Num::Int(3).to_string(), "3");
        assert_eq!(Num::Double(3.0).to_string(), "3.0");
        assert_eq!(format!("{:+}", Num::Int(3)), "+3");
        assert_eq!(format!("{:+}", Num::Double(-2.5)), "-2.5");
        assert!(Num::Int(2) < Num::Double(2.5));
    }

    #[test]
    fn doubles_differ_only_beyond_their_rounding() {
        let a = Num::Double(0.1) + Num::Double(0.2);
        assert!(!a.differs(Num::Double(0.3)), "0.1 + 0.2 is 0.3 to a reader");
        assert!(a.differs(Num::Double(0.31)));
        assert!(Num::Int(3).differs(Num::Int(4)));
        assert!(!Num::Int(3).differs(Num::Double(3.0)));
    }

    #[test]
    fn serde_round_trips_through_bson() {
        for n in [Num::Int(7), Num::Double(-0.25)] {
            let b = bson::to_bson(&n).unwrap();
            assert_eq!(Num::from_bson(&b), Some(n));
            assert_eq!(bson::from_bson::<Num>(b).unwrap(), n);
        }
    }

    fn num() -> impl Strategy<Value = Num> {
        prop_oneof![
            any::<i32>().prop_map(|i| Num::Int(i as i64)),
            (-1000i32..1000).prop_map(|i| Num::Double(i as f64 / 4.0)),
        ]
    }

    proptest! {
        /// Folding any sequence of contributions in and out again telescopes to zero, with the
        /// kind MongoDB would leave: integers alone stay integers, a double anywhere makes one.
        #[test]
        fn adding_and_taking_back_telescopes(values in proptest::collection::vec(num(), 0..20)) {
            let total: Num = values.iter().sum();
            let back = values.iter().fold(total, |acc, v| acc - *v);
            prop_assert!(back.is_zero());
            prop_assert_eq!(total.is_double(), values.iter().any(|v| v.is_double()));
            prop_assert_eq!(back.is_double(), values.iter().any(|v| v.is_double()));
        }

        /// The operators and the checked forms agree wherever nothing overflows, and integer
        /// sums are exact whatever their order.
        #[test]
        fn integer_sums_are_exact_in_any_order(values in proptest::collection::vec(any::<i32>(), 0..30)) {
            let nums: Vec<Num> = values.iter().map(|v| Num::Int(*v as i64)).collect();
            let exact: i64 = values.iter().map(|v| *v as i64).sum();
            prop_assert_eq!(nums.iter().sum::<Num>(), Num::Int(exact));
            prop_assert_eq!(nums.iter().rev().sum::<Num>(), Num::Int(exact));
            let checked = nums.iter().try_fold(Num::ZERO, |a, b| a.checked_add(*b));
            prop_assert_eq!(checked, Some(Num::Int(exact)));
        }

        /// Checked arithmetic reports exactly the overflows of i64 and never wraps.
        #[test]
        fn checked_arithmetic_matches_i64(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(Num::Int(a).checked_add(Num::Int(b)), a.checked_add(b).map(Num::Int));
            prop_assert_eq!(Num::Int(a).checked_sub(Num::Int(b)), a.checked_sub(b).map(Num::Int));
            let sum = Num::Int(a) + Num::Int(b);
            match a.checked_add(b) {
                Some(s) => prop_assert_eq!(sum, Num::Int(s)),
                None => prop_assert!(sum.is_double()),
            }
        }
    }
}
