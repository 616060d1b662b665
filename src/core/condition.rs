//! Pure: a counter definition's condition on a row, a small subset of MongoDB's query language
//! that counterd evaluates itself *and* sends to the server, with one meaning in both places.
//!
//! Why a subset, and why so strict: a conditional counter ("only approved comments") is kept by
//! the classifier, which decides from an event's before- and after-state whether a row counts,
//! and corrected by the reconciler, whose recount asks the server `countDocuments(condition)`.
//! If the two disagreed on a single row shape, the reconciler would "correct" a counter the
//! worker keeps moving back: drift forever. So only operators whose semantics are small enough
//! to mirror exactly are accepted, and operands that open MongoDB's stranger corners (null, which
//! also matches a missing field and array elements without the field; documents and arrays as
//! values; NaN) are refused when the configuration is loaded, with the reason.
//!
//! Accepted: `{field: value}` (equality), `{field: {$eq | $ne: value}}`, `{field: {$in: [values]}}`,
//! `{field: {$exists: bool}}`, `{field: {$gt | $gte | $lt | $lte: number or date}}`; several
//! fields, and several operators on one field, all must hold. A value is a string, a boolean, a
//! number (Int32, Int64 or a finite Double; numbers compare by value, as in MongoDB) an
//! ObjectId or a date. Fields are dotted paths without numeric steps.
//!
//! Matching follows MongoDB: a path that meets an array looks into the array's documents; a
//! value that is an array matches when one of its elements does; `$gt` and friends compare only
//! within a type bracket (numbers with numbers, dates with dates); `$ne` and `$exists: false`
//! are the negations of `$eq` and `$exists: true`. `tests/condition_server.rs` holds this file
//! to the test server's own answers on thousands of random rows.

use std::cmp::Ordering;

use bson::{doc, Bson, Document};
use indexmap::IndexSet;

/// A condition that could not be accepted, with the reason and the part that was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConditionError {
    #[error("field path `{0}` is not usable: {1}")]
    Path(String, &'static str),
    #[error("operator `{op}` on `{field}` is not supported (supported: $eq, $ne, $in, $exists, $gt, $gte, $lt, $lte)")]
    Operator { field: String, op: String },
    #[error("`{field}`: {reason}")]
    Operand { field: String, reason: String },
}

/// One comparison on one field.
#[derive(Debug, Clone, PartialEq)]
pub enum Test {
    Eq(Bson),
    Ne(Bson),
    In(Vec<Bson>),
    Exists(bool),
    Gt(Bson),
    Gte(Bson),
    Lt(Bson),
    Lte(Bson),
}

/// Every clause must hold (an empty condition holds for every row).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Condition {
    clauses: Vec<(String, Test)>,
}

impl Condition {
    /// Reads a condition written as a MongoDB filter document, refusing what it cannot mirror.
    pub fn parse(filter: &Document) -> Result<Condition, ConditionError> {
        let mut clauses = Vec::new();
        for (field, spec) in filter {
            check_path(field)?;
            match spec {
                Bson::Document(ops) if ops.keys().any(|k| k.starts_with('$')) => {
                    for (op, operand) in ops {
                        clauses.push((field.clone(), test(field, op, operand)?));
                    }
                }
                value => clauses.push((field.clone(), Test::Eq(scalar(field, value)?))),
            }
        }
        Ok(Condition { clauses })
    }

    /// Whether the condition has no clause (every row qualifies).
    pub fn is_empty(&self) -> bool {
        self.clauses.is_empty()
    }

    /// The dotted paths the condition reads, in clause order, without repeats (what the stream's
    /// projection must keep for the classifier to evaluate it).
    pub fn paths(&self) -> IndexSet<&str> {
        self.clauses
            .iter()
            .map(|(field, _)| field.as_str())
            .collect()
    }

    /// Whether `row` satisfies the condition, exactly as the server's query would decide.
    pub fn matches(&self, row: &Document) -> bool {
        self.clauses.iter().all(|(field, test)| {
            let mut values = Vec::new();
            resolve(row, field, &mut values);
            holds(test, &values)
        })
    }

    /// The condition as a filter for the server's count and find queries (one `$and` entry per
    /// clause, so that clauses on one field and the caller's own filter never collide).
    pub fn to_filter(&self) -> Document {
        if self.clauses.is_empty() {
            return Document::new();
        }
        let all: Vec<Bson> = self
            .clauses
            .iter()
            .map(|(field, test)| {
                let (op, operand) = match test {
                    Test::Eq(v) => ("$eq", v.clone()),
                    Test::Ne(v) => ("$ne", v.clone()),
                    Test::In(vs) => ("$in", Bson::Array(vs.clone())),
                    Test::Exists(b) => ("$exists", Bson::Boolean(*b)),
                    Test::Gt(v) => ("$gt", v.clone()),
                    Test::Gte(v) => ("$gte", v.clone()),
                    Test::Lt(v) => ("$lt", v.clone()),
                    Test::Lte(v) => ("$lte", v.clone()),
                };
                Bson::Document(doc! {field.clone(): {op: operand}})
            })
            .collect();
        doc! {"$and": all}
    }
}

fn check_path(path: &str) -> Result<(), ConditionError> {
    let refuse = |why| Err(ConditionError::Path(path.to_string(), why));
    if path.split('.').any(str::is_empty) {
        return refuse("an empty step");
    }
    if path.starts_with('$') || path.contains(".$") {
        return refuse(
            "a step starts with `$` (operators such as $or, $and and $not are not supported)",
        );
    }
    if path
        .split('.')
        .any(|s| s.bytes().all(|b| b.is_ascii_digit()))
    {
        return refuse("a numeric step (array positions mean something else to the server)");
    }
    Ok(())
}

fn test(field: &str, op: &str, operand: &Bson) -> Result<Test, ConditionError> {
    Ok(match op {
        "$eq" => Test::Eq(scalar(field, operand)?),
        "$ne" => Test::Ne(scalar(field, operand)?),
        "$in" => match operand {
            Bson::Array(values) => Test::In(
                values
                    .iter()
                    .map(|v| scalar(field, v))
                    .collect::<Result<_, _>>()?,
            ),
            _ => return Err(operand_error(field, "$in takes an array of values")),
        },
        "$exists" => match operand {
            Bson::Boolean(b) => Test::Exists(*b),
            _ => return Err(operand_error(field, "$exists takes true or false")),
        },
        "$gt" | "$gte" | "$lt" | "$lte" => {
            let bound = scalar(field, operand)?;
            if !matches!(
                bound,
                Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::DateTime(_)
            ) {
                return Err(operand_error(
                    field,
                    &format!("{op} compares numbers and dates only"),
                ));
            }
            match op {
                "$gt" => Test::Gt(bound),
                "$gte" => Test::Gte(bound),
                "$lt" => Test::Lt(bound),
                _ => Test::Lte(bound),
            }
        }
        _ => {
            return Err(ConditionError::Operator {
                field: field.to_string(),
                op: op.to_string(),
            })
        }
    })
}

fn operand_error(field: &str, reason: &str) -> ConditionError {
    ConditionError::Operand {
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

/// An operand counterd can compare exactly as the server does.
fn scalar(field: &str, value: &Bson) -> Result<Bson, ConditionError> {
    match value {
        Bson::String(_)
        | Bson::Boolean(_)
        | Bson::Int32(_)
        | Bson::Int64(_)
        | Bson::ObjectId(_)
        | Bson::DateTime(_) => Ok(value.clone()),
        Bson::Double(d) if d.is_finite() => Ok(value.clone()),
        Bson::Double(_) => Err(operand_error(field, "NaN and infinities are not supported")),
        Bson::Null => Err(operand_error(
            field,
            "null also matches rows without the field; say `$exists: false` or `$exists: true` instead",
        )),
        other => Err(operand_error(
            field,
            &format!(
                "values of type {:?} are not supported (strings, booleans, numbers, ObjectIds and dates are)",
                other.element_type()
            ),
        )),
    }
}

/// Collects the values at a dotted `path`, looking into the documents of arrays it meets on the
/// way (as the server does); nothing is collected for a missing field.
fn resolve<'a>(doc: &'a Document, path: &str, out: &mut Vec<&'a Bson>) {
    let (head, rest) = match path.split_once('.') {
        Some((head, rest)) => (head, Some(rest)),
        None => (path, None),
    };
    let Some(value) = doc.get(head) else { return };
    match rest {
        None => out.push(value),
        Some(rest) => match value {
            Bson::Document(inner) => resolve(inner, rest, out),
            Bson::Array(items) => {
                for item in items {
                    if let Bson::Document(inner) = item {
                        resolve(inner, rest, out);
                    }
                }
            }
            _ => {}
        },
    }
}

/// Whether `test` holds for the values found at its field.
fn holds(test: &Test, values: &[&Bson]) -> bool {
    // A value matches when it, or (for an array) one of its elements, satisfies `one`.
    let any = |one: &dyn Fn(&Bson) -> bool| {
        values.iter().any(|v| match v {
            Bson::Array(items) => items.iter().any(one),
            v => one(v),
        })
    };
    match test {
        Test::Eq(target) => any(&|v| equal(v, target)),
        Test::Ne(target) => !any(&|v| equal(v, target)),
        Test::In(targets) => any(&|v| targets.iter().any(|t| equal(v, t))),
        Test::Exists(wanted) => values.is_empty() != *wanted,
        Test::Gt(bound) => any(&|v| compare(v, bound) == Some(Ordering::Greater)),
        Test::Gte(bound) => {
            any(&|v| matches!(compare(v, bound), Some(Ordering::Greater | Ordering::Equal)))
        }
        Test::Lt(bound) => any(&|v| compare(v, bound) == Some(Ordering::Less)),
        Test::Lte(bound) => {
            any(&|v| matches!(compare(v, bound), Some(Ordering::Less | Ordering::Equal)))
        }
    }
}

/// Equality of a row's value with an operand: numbers by value, everything else by type and
/// content.
fn equal(value: &Bson, target: &Bson) -> bool {
    match compare(value, target) {
        Some(order) => order == Ordering::Equal,
        None => value == target,
    }
}

/// The order of two numbers or two dates; `None` across type brackets (the server never matches
/// a range across them) and for other types.
fn compare(a: &Bson, b: &Bson) -> Option<Ordering> {
    match (number(a)?, number(b)?) {
        (Number::Date(x), Number::Date(y)) => Some(x.cmp(&y)),
        (Number::Int(x), Number::Int(y)) => Some(x.cmp(&y)),
        (Number::Int(x), Number::Float(y)) => int_vs_float(x, y),
        (Number::Float(x), Number::Int(y)) => int_vs_float(y, x).map(Ordering::reverse),
        (Number::Float(x), Number::Float(y)) => x.partial_cmp(&y),
        _ => None,
    }
}

enum Number {
    Int(i64),
    Float(f64),
    Date(i64),
}

fn number(v: &Bson) -> Option<Number> {
    match v {
        Bson::Int32(i) => Some(Number::Int(*i as i64)),
        Bson::Int64(i) => Some(Number::Int(*i)),
        Bson::Double(d) => Some(Number::Float(*d)),
        Bson::DateTime(d) => Some(Number::Date(d.timestamp_millis())),
        _ => None,
    }
}

/// Exact order of an integer and a double (no rounding of large integers through f64).
fn int_vs_float(i: i64, f: f64) -> Option<Ordering> {
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if f.is_nan() {
        return None;
    }
    if f >= TWO_63 {
        return Some(Ordering::Less);
    }
    if f < -TWO_63 {
        return Some(Ordering::Greater);
    }
    let whole = f.trunc();
    match i.cmp(&(whole as i64)) {
        Ordering::Equal => 0.0_f64.partial_cmp(&(f - whole)),
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(filter: Document) -> Condition {
        Condition::parse(&filter).unwrap()
    }

    #[test]
    fn equality_inequality_and_membership_follow_the_server() {
        let approved = cond(doc! {"approved": true});
        assert!(approved.matches(&doc! {"approved": true}));
        assert!(!approved.matches(&doc! {"approved": false}));
        assert!(!approved.matches(&doc! {}));
        assert!(
            approved.matches(&doc! {"approved": [false, true]}),
            "an element matches"
        );
        let not_spam = cond(doc! {"kind": {"$ne": "spam"}});
        assert!(not_spam.matches(&doc! {}), "$ne holds for a missing field");
        assert!(
            !not_spam.matches(&doc! {"kind": ["a", "spam"]}),
            "no element may equal"
        );
        let some = cond(doc! {"status": {"$in": ["open", 3_i32]}});
        assert!(some.matches(&doc! {"status": 3.0}), "numbers by value");
        assert!(some.matches(&doc! {"status": 3_i64}));
        assert!(!some.matches(&doc! {"status": "3"}), "never across types");
    }

    #[test]
    fn ranges_stay_within_their_type_bracket() {
        let score = cond(doc! {"score": {"$gt": 2_i32, "$lte": 5.5}});
        assert!(score.matches(&doc! {"score": 3_i64}));
        assert!(score.matches(&doc! {"score": 5.5}));
        assert!(!score.matches(&doc! {"score": 2.0}));
        assert!(
            !score.matches(&doc! {"score": "4"}),
            "a string is no number"
        );
        assert!(!score.matches(&doc! {"score": bson::DateTime::from_millis(4)}));
        let recent = cond(doc! {"at": {"$gte": bson::DateTime::from_millis(1000)}});
        assert!(recent.matches(&doc! {"at": bson::DateTime::from_millis(1000)}));
        assert!(
            !recent.matches(&doc! {"at": 5000_i64}),
            "a number is no date"
        );
    }

    #[test]
    fn large_integers_compare_exactly_with_doubles() {
        let big = (1_i64 << 53) + 1;
        let c = cond(doc! {"n": {"$gt": (1_i64 << 53) as f64}});
        assert!(
            c.matches(&doc! {"n": big}),
            "2^53 + 1 > 2^53 although f64 rounds it"
        );
        assert!(!cond(doc! {"n": big as f64}).matches(&doc! {"n": big}));
        assert_eq!(int_vs_float(i64::MAX, 9.3e18), Some(Ordering::Less));
        assert_eq!(int_vs_float(-1, -0.5), Some(Ordering::Less));
        assert_eq!(int_vs_float(0, -0.5), Some(Ordering::Greater));
    }

    #[test]
    fn paths_look_into_documents_and_arrays_of_documents() {
        let c = cond(doc! {"meta.state": "ok"});
        assert!(c.matches(&doc! {"meta": {"state": "ok"}}));
        assert!(c.matches(&doc! {"meta": [{"state": "no"}, {"state": "ok"}]}));
        assert!(!c.matches(&doc! {"meta": "ok"}));
        let exists = cond(doc! {"meta.state": {"$exists": true}});
        assert!(!exists.matches(&doc! {"meta": [{"other": 1}]}));
        assert!(
            exists.matches(&doc! {"meta": {"state": []}}),
            "an empty array exists"
        );
        assert!(cond(doc! {"meta.state": {"$exists": false}}).matches(&doc! {"meta": 1}));
        // MongoDB finds no `state` in an empty array (the fake test server disagrees).
        assert!(cond(doc! {"meta.state": {"$exists": false}}).matches(&doc! {"meta": []}));
    }

    #[test]
    fn what_cannot_be_mirrored_is_refused_with_the_reason() {
        let refused = |f: Document| Condition::parse(&f).unwrap_err().to_string();
        assert!(refused(doc! {"a": null}).contains("$exists"));
        assert!(refused(doc! {"a": {"$in": [1, null]}}).contains("null"));
        assert!(refused(doc! {"a": {"$regex": "x"}}).contains("not supported"));
        assert!(refused(doc! {"$or": [{"a": 1}]}).contains("$or"));
        assert!(refused(doc! {"a.0": 1}).contains("numeric step"));
        assert!(refused(doc! {"a..b": 1}).contains("empty step"));
        assert!(refused(doc! {"a": {"$gt": "x"}}).contains("numbers and dates"));
        assert!(refused(doc! {"a": {"$exists": 1}}).contains("true or false"));
        assert!(refused(doc! {"a": [1, 2]}).contains("not supported"));
        assert!(refused(doc! {"a": f64::NAN}).contains("NaN"));
        // A plain sub-document without operators is a value, refused as one.
        assert!(refused(doc! {"a": {"b": 1}}).contains("not supported"));
    }

    #[test]
    fn the_filter_says_what_matches_says() {
        let c = cond(doc! {"a": 1_i32, "b": {"$gt": 2_i32, "$exists": true}});
        assert_eq!(
            c.to_filter(),
            doc! {"$and": [{"a": {"$eq": 1_i32}}, {"b": {"$gt": 2_i32}}, {"b": {"$exists": true}}]}
        );
        assert_eq!(Condition::default().to_filter(), Document::new());
        assert!(Condition::default().matches(&doc! {}));
    }
}
