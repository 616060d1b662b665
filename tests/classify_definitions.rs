//! Classification per counter definition: one event becomes deltas for every definition, and
//! those deltas are exactly what the definitions' count queries would see change.
//!
//! The truth here is not the classifier's own reading of a row: it is each definition's count
//! query ([`Definition::filter`], the group field equal to the key and the condition, which the
//! reconciler sends to the server) evaluated clause by clause with [`Condition`], whose agreement
//! with the server is `tests/condition_server.rs`'s job. So "the condition evaluated by the
//! classifier agrees with the count query built from the same condition" is checked on every
//! generated row, beside "every delta is `counts_after - counts_before`" per definition.

#[path = "support/update_description.rs"]
mod update_description;

use std::collections::BTreeMap;

use bson::{doc, Bson, DateTime, Document, Timestamp};
use counterd::core::batch::{plan_batch, BatchPlan};
use counterd::core::classify::{classify, Attribution, Before, Classification};
use counterd::core::condition::Condition;
use counterd::core::definition::{amount_of, Definition, Kind};
use counterd::core::event::{ChangeEvent, LedgerView};
use counterd::core::key::GroupValue;
use counterd::core::key::{CounterIx, CounterKey};
use counterd::core::num::Num;
use counterd::core::schema::Schema;
use proptest::prelude::*;
use proptest::sample::select;
use update_description::diff;

/// The default definition (posts) and four more: approved comments per post, comments per
/// author, well-scored comments with an accepted status per thread (a dotted group field), and
/// the sum of the scores of approved comments per author (integers, doubles and a string).
fn schema() -> Schema {
    let definition = |name: &str, group: &str, condition: Document| Definition {
        name: name.into(),
        group: group.into(),
        condition: Condition::parse(&condition).unwrap(),
        collection: format!("{name}_counters"),
        kind: Kind::Count,
    };
    let score_sum = Definition {
        kind: Kind::Sum {
            field: "score".into(),
        },
        ..definition("score_sum", "author_id", doc! {"approved": true})
    };
    Schema::default().with_more(vec![
        definition("approved", "post_id", doc! {"approved": true}),
        definition("per_author", "author_id", doc! {}),
        definition(
            "scored_thread",
            "thread.id",
            doc! {"score": {"$gte": 3}, "status": {"$in": ["ok", "new"]}},
        ),
        score_sum,
    ])
}

/// Every definition's group field, the default's first.
fn groups(schema: &Schema) -> Vec<&str> {
    std::iter::once(schema.group())
        .chain(schema.definitions.extra().iter().map(|d| d.group.as_str()))
        .collect()
}

/// The keys any generated row can count under.
fn universe() -> Vec<GroupValue> {
    vec![
        GroupValue::Int(1),
        GroupValue::Int(2),
        GroupValue::Str("a".into()),
        GroupValue::Str("ann".into()),
        GroupValue::Str("bob".into()),
        GroupValue::Int(7),
    ]
}

/// Whether a count query (a filter of clauses joined by `$and`) selects `doc`.
fn query_selects(filter: &Document, doc: &Document) -> bool {
    filter
        .iter()
        .all(|(key, value)| match (key.as_str(), value) {
            ("$and", Bson::Array(all)) => all.iter().all(|clause| match clause {
                Bson::Document(clause) => query_selects(clause, doc),
                _ => false,
            }),
            _ => {
                let mut clause = Document::new();
                clause.insert(key.clone(), value.clone());
                Condition::parse(&clause).unwrap().matches(doc)
            }
        })
}

/// What every count query says about the row `doc` (`None`: no row): 1 (a sum: its field's
/// value, as `$sum` reads it) where a definition's query for a key selects it and the row is
/// not soft-deleted.
fn counts(schema: &Schema, doc: Option<&Document>) -> BTreeMap<CounterKey, Num> {
    let mut out = BTreeMap::new();
    let Some(doc) = doc else { return out };
    let deleted = schema.read_existing_row(doc).deleted;
    let default = Definition {
        name: "default".into(),
        group: schema.group().to_string(),
        condition: Condition::default(),
        collection: "comment_counters".into(),
        kind: Kind::Count,
    };
    let definitions = std::iter::once(&default).chain(schema.definitions.extra());
    for (i, definition) in definitions.enumerate() {
        for key in universe() {
            if !deleted && query_selects(&definition.filter(&key), doc) {
                let amount = match definition.kind.field() {
                    None => Num::ONE,
                    Some(field) => amount_of(Schema::get(doc, field)).0,
                };
                out.insert(
                    CounterKey {
                        counter: CounterIx(i),
                        group: key,
                    },
                    amount,
                );
            }
        }
    }
    out
}

fn difference(
    after: BTreeMap<CounterKey, Num>,
    before: BTreeMap<CounterKey, Num>,
) -> BTreeMap<CounterKey, Num> {
    let mut out = after;
    for (k, v) in before {
        *out.entry(k).or_default() -= v;
    }
    out.retain(|_, v| !v.is_zero());
    out
}

/// The same counters moved by the same amounts (a sum's integer and double spellings of one
/// value are equal: a counter that once held a double stays one, `$sum` may not).
fn same(a: &BTreeMap<CounterKey, Num>, b: &BTreeMap<CounterKey, Num>) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|((ka, va), (kb, vb))| ka == kb && !va.differs(*vb))
}

/// Whole-row amounts, as the named cases spell them.
fn ints(m: BTreeMap<CounterKey, Num>) -> BTreeMap<CounterKey, i64> {
    m.into_iter().map(|(k, v)| (k, v.as_i64())).collect()
}

fn summed(c: &Classification) -> BTreeMap<CounterKey, Num> {
    let mut out = BTreeMap::new();
    for d in &c.deltas {
        *out.entry(d.key.clone()).or_default() += d.amount;
    }
    out.retain(|_, v: &mut Num| !v.is_zero());
    out
}

fn planned(plan: &BatchPlan) -> BTreeMap<CounterKey, Num> {
    let mut out = BTreeMap::new();
    for c in &plan.counters {
        *out.entry(c.key.clone()).or_default() += c.delta;
    }
    out.retain(|_, v: &mut Num| !v.is_zero());
    out
}

// ---------------------------------------------------------------------------------------------
// Rows and events

/// A generated comment row: every field some definition reads, in shapes that do and do not
/// count (a double post id, a fractional one, a string score, an unknown status).
fn row_strategy() -> impl Strategy<Value = Document> {
    let post = select(vec![
        Some(Bson::Int32(1)),
        Some(Bson::Int64(2)),
        Some(Bson::Double(2.0)),
        Some(Bson::Double(2.5)),
        Some(Bson::String("a".into())),
        None,
    ]);
    let author = select(vec![
        Some(Bson::String("ann".into())),
        Some(Bson::String("bob".into())),
        Some(Bson::Int32(7)),
        None,
    ]);
    let approved = select(vec![
        Some(Bson::Boolean(true)),
        Some(Bson::Boolean(false)),
        Some(Bson::String("yes".into())),
        None,
    ]);
    let thread = select(vec![
        Some(Bson::Document(doc! {"id": 1})),
        Some(Bson::Document(doc! {"id": "a"})),
        Some(Bson::Int32(1)),
        None,
    ]);
    let score = select(vec![
        Some(Bson::Int32(1)),
        Some(Bson::Int32(3)),
        Some(Bson::Double(5.5)),
        Some(Bson::String("4".into())),
        None,
    ]);
    let status = select(vec![
        Some(Bson::String("ok".into())),
        Some(Bson::String("new".into())),
        Some(Bson::String("spam".into())),
        None,
    ]);
    let deleted = select(vec![
        None,
        Some(Bson::Null),
        Some(Bson::DateTime(DateTime::from_millis(1_767_348_000_000))),
    ]);
    let created = select(vec![0_i64, 60_000, 120_000]);
    (
        (post, author, approved, thread),
        (score, status, deleted, created),
    )
        .prop_map(
            |((post, author, approved, thread), (score, status, deleted, created))| {
                let mut d = doc! {"_id": 1, "created_at": DateTime::from_millis(1_767_000_000_000 + created)};
                for (name, value) in [
                    ("post_id", post),
                    ("author_id", author),
                    ("approved", approved),
                    ("thread", thread),
                    ("score", score),
                    ("status", status),
                    ("deleted_at", deleted),
                ] {
                    if let Some(v) = value {
                        d.insert(name, v);
                    }
                }
                d
            },
        )
}

fn token(n: usize) -> String {
    format!("82{:08X}000000012B042C0100296E5A1004", 0x695B_7000 + n)
}

fn event(n: usize, op: &str) -> Document {
    doc! {
        "_id": {"_data": token(n)},
        "operationType": op,
        "clusterTime": Timestamp { time: 0x695B_7000 + n as u32, increment: 1 },
        "ns": {"db": "app", "coll": "comments"},
        "documentKey": {"_id": 1},
    }
}

/// The event of `before` → `after` (`None`: no row), its update looked up as `lookup`.
fn change(
    n: usize,
    before: Option<&Document>,
    after: Option<&Document>,
    lookup: Option<&Document>,
    pre_image: bool,
) -> ChangeEvent {
    let mut d = match (before, after) {
        (None, Some(after)) => {
            let mut d = event(n, "insert");
            d.insert("fullDocument", after.clone());
            d
        }
        (Some(_), None) | (None, None) => event(n, "delete"),
        (Some(before), Some(after)) => {
            let mut d = event(n, "update");
            let (set, removed) = diff(before, after);
            d.insert(
                "updateDescription",
                doc! {"updatedFields": set, "removedFields": removed, "truncatedArrays": []},
            );
            d.insert("fullDocument", lookup.unwrap_or(after).clone());
            d
        }
    };
    if let (Some(before), true) = (before, pre_image) {
        d.insert("fullDocumentBeforeChange", before.clone());
    }
    ChangeEvent::parse(&d).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Named cases: the transitions the issue lists

fn classify_change(before: &Document, after: &Document) -> BTreeMap<CounterKey, i64> {
    let schema = schema();
    let e = change(1, Some(before), Some(after), None, false);
    let ledger = Before::Known(Some(schema.read_existing_row(before)));
    ints(summed(
        &classify(&e, ledger, Attribution::Ledger, &schema).unwrap(),
    ))
}

fn key(counter: usize, group: GroupValue) -> CounterKey {
    CounterKey {
        counter: CounterIx(counter),
        group,
    }
}

fn base() -> Document {
    doc! {"_id": 1, "post_id": 1, "author_id": "ann", "approved": false, "thread": {"id": 1}, "score": 5, "status": "ok"}
}

#[test]
fn approving_a_row_moves_it_into_the_conditional_counter_only() {
    let mut approved = base();
    approved.insert("approved", true);
    // The approved count per post, and the approved scores per author (a sum: its value).
    let ann = || GroupValue::Str("ann".into());
    assert_eq!(
        classify_change(&base(), &approved),
        BTreeMap::from([(key(1, GroupValue::Int(1)), 1), (key(4, ann()), 5)])
    );
    assert_eq!(
        classify_change(&approved, &base()),
        BTreeMap::from([(key(1, GroupValue::Int(1)), -1), (key(4, ann()), -5)])
    );
}

#[test]
fn a_move_changes_the_per_post_counters_and_not_the_author_one() {
    let mut from = base();
    from.insert("approved", true);
    let mut to = from.clone();
    to.insert("post_id", 2.0);
    assert_eq!(
        classify_change(&from, &to),
        BTreeMap::from([
            (key(0, GroupValue::Int(1)), -1),
            (key(0, GroupValue::Int(2)), 1),
            (key(1, GroupValue::Int(1)), -1),
            (key(1, GroupValue::Int(2)), 1),
        ])
    );
}

#[test]
fn an_author_change_moves_the_row_between_authors() {
    let mut to = base();
    to.insert("author_id", "bob");
    assert_eq!(
        classify_change(&base(), &to),
        BTreeMap::from([
            (key(2, GroupValue::Str("ann".into())), -1),
            (key(2, GroupValue::Str("bob".into())), 1),
        ])
    );
}

#[test]
fn a_soft_delete_leaves_every_counter_it_counted_in() {
    let mut deleted = base();
    deleted.insert("deleted_at", DateTime::from_millis(1));
    assert_eq!(
        classify_change(&base(), &deleted),
        BTreeMap::from([
            (key(0, GroupValue::Int(1)), -1),
            (key(2, GroupValue::Str("ann".into())), -1),
            (key(3, GroupValue::Int(1)), -1),
        ])
    );
}

/// The sum per author of approved rows' scores, as one event moves it (key 4).
fn sum_moves(before: Option<&Document>, after: Option<&Document>) -> BTreeMap<CounterKey, Num> {
    let schema = schema();
    let e = change(1, before, after, None, false);
    let ledger = Before::Known(before.map(|d| schema.read_existing_row(d)));
    let c = classify(&e, ledger, Attribution::Ledger, &schema).unwrap();
    summed(&c)
        .into_iter()
        .filter(|(k, _)| k.counter == CounterIx(4))
        .collect()
}

fn approved_row(author: &str, score: Bson) -> Document {
    let mut d = base();
    d.insert("approved", true);
    d.insert("author_id", author);
    d.insert("score", score);
    d
}

#[test]
fn a_sum_moves_by_exactly_after_minus_before_in_every_transition() {
    let ann = || GroupValue::Str("ann".into());
    let bob = || GroupValue::Str("bob".into());
    let row = approved_row("ann", Bson::Int32(4));
    // Insert and hard delete: the value in, the value out.
    assert_eq!(
        sum_moves(None, Some(&row)),
        BTreeMap::from([(key(4, ann()), Num::Int(4))])
    );
    assert_eq!(
        sum_moves(Some(&row), None),
        BTreeMap::from([(key(4, ann()), Num::Int(-4))])
    );
    // A change of the value: the difference, exact as an integer.
    let raised = approved_row("ann", Bson::Int64(9));
    assert_eq!(
        sum_moves(Some(&row), Some(&raised)),
        BTreeMap::from([(key(4, ann()), Num::Int(5))])
    );
    // A double makes the delta a double.
    let half = approved_row("ann", Bson::Double(4.5));
    assert_eq!(
        sum_moves(Some(&row), Some(&half)),
        BTreeMap::from([(key(4, ann()), Num::Double(0.5))])
    );
    // A move between groups: out of one, into the other, each its whole value.
    let moved = approved_row("bob", Bson::Int64(9));
    assert_eq!(
        sum_moves(Some(&row), Some(&moved)),
        BTreeMap::from([(key(4, ann()), Num::Int(-4)), (key(4, bob()), Num::Int(9))])
    );
    // A soft delete takes the value out, an undelete puts it back.
    let mut deleted = row.clone();
    deleted.insert("deleted_at", DateTime::from_millis(1));
    assert_eq!(
        sum_moves(Some(&row), Some(&deleted)),
        BTreeMap::from([(key(4, ann()), Num::Int(-4))])
    );
    assert_eq!(
        sum_moves(Some(&deleted), Some(&row)),
        BTreeMap::from([(key(4, ann()), Num::Int(4))])
    );
    // Leaving the condition is a delete for the sum.
    let mut unapproved = row.clone();
    unapproved.insert("approved", false);
    assert_eq!(
        sum_moves(Some(&row), Some(&unapproved)),
        BTreeMap::from([(key(4, ann()), Num::Int(-4))])
    );
    // An edit of another field moves nothing.
    let mut edited = row.clone();
    edited.insert("body", "x");
    assert!(sum_moves(Some(&row), Some(&edited)).is_empty());
}

#[test]
fn a_value_that_is_not_a_number_adds_nothing_and_is_a_bad_event() {
    let schema = schema();
    let text = approved_row("ann", Bson::String("4".into()));
    let e = change(1, None, Some(&text), None, false);
    let c = classify(&e, Before::Known(None), Attribution::Ledger, &schema).unwrap();
    assert!(
        summed(&c).keys().all(|k| k.counter != CounterIx(4)),
        "{:?}",
        c.deltas
    );
    assert!(
        matches!(&c.problem, Some(counterd::core::classify::Problem::Bad(counterd::core::classify::Malformed::NotANumber { counter, .. })) if counter == "score_sum"),
        "{:?}",
        c.problem
    );
    // It still counts where counts count (the row exists and is live).
    assert_eq!(summed(&c).get(&key(0, GroupValue::Int(1))), Some(&Num::ONE));
    // Fixed later: the value goes in, and nothing comes out of the earlier 0.
    let fixed = approved_row("ann", Bson::Int32(4));
    let e = change(2, Some(&text), Some(&fixed), None, false);
    let ledger = Before::Known(Some(schema.read_existing_row(&text)));
    let c = classify(&e, ledger, Attribution::Ledger, &schema).unwrap();
    assert_eq!(
        summed(&c).get(&key(4, GroupValue::Str("ann".into()))),
        Some(&Num::Int(4))
    );
    assert_eq!(c.problem, None);
    // A missing value adds 0 silently, as `$sum` ignores it.
    let mut missing = fixed.clone();
    missing.remove("score");
    let e = change(3, None, Some(&missing), None, false);
    let c = classify(&e, Before::Known(None), Attribution::Ledger, &schema).unwrap();
    assert_eq!(c.problem, None);
}

#[test]
fn a_sum_that_would_overflow_is_reported_and_never_wrapped() {
    let schema = schema();
    let events: Vec<ChangeEvent> = (1..=2)
        .map(|n| {
            let mut row = approved_row("ann", Bson::Int64(i64::MAX));
            row.insert("_id", n as i32);
            let mut e = change(n, None, Some(&row), None, false);
            e.comment = Some(counterd::core::event::CommentId::new(Bson::Int32(n as i32)));
            e
        })
        .collect();
    let (plan, _) = plan_batch(
        &events,
        &LedgerView::default(),
        Attribution::Ledger,
        &schema,
        60,
    );
    let sum = plan
        .counters
        .iter()
        .find(|c| c.key.counter == CounterIx(4))
        .expect("the sum's write");
    assert!(
        sum.delta.is_double(),
        "promoted, not wrapped: {:?}",
        sum.delta
    );
    assert!(sum.delta.as_f64() > 1.8e19);
    assert_eq!(plan.bad_events(), 1, "{:?}", plan.skipped);
}

#[test]
fn a_condition_change_known_only_from_the_ledger_takes_the_looked_up_row() {
    // The ledger keeps whether the row matched, not the score it read: an update of the score
    // is classified against the `updateLookup` document, here already approved as well.
    let schema = schema();
    let mut low = base();
    low.insert("score", 1);
    let mut later = base();
    later.insert("approved", true);
    let e = change(1, Some(&low), Some(&base()), Some(&later), false);
    let ledger = Before::Known(Some(schema.read_existing_row(&low)));
    let c = classify(&e, ledger, Attribution::Ledger, &schema).unwrap();
    assert_eq!(
        ints(summed(&c)),
        BTreeMap::from([
            (key(1, GroupValue::Int(1)), 1),
            (key(3, GroupValue::Int(1)), 1),
            (key(4, GroupValue::Str("ann".into())), 5),
        ])
    );
    assert!(c.dirty.contains(&key(3, GroupValue::Int(1))));
}

#[test]
fn the_projection_keeps_every_field_a_definition_reads() {
    let paths = schema().read_paths();
    for path in [
        "post_id",
        "created_at",
        "deleted_at",
        "approved",
        "author_id",
        "thread.id",
        "score",
        "status",
    ] {
        assert!(paths.iter().any(|p| p == path), "{path} not in {paths:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Properties

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// One event with its before-state known (ledger or pre-image): per definition and key, the
    /// deltas are what the count queries see change, and every changed counter is dirty.
    #[test]
    fn one_event_moves_every_counter_as_its_count_query_moves(
        before in proptest::option::weighted(0.8, row_strategy()),
        after in proptest::option::weighted(0.8, row_strategy()),
        pre_image in any::<bool>(),
        attribution in select(vec![Attribution::Auto, Attribution::Ledger, Attribution::PreImage]),
    ) {
        // Pre-images only where there is a row before; "pre_image" attribution needs one.
        let pre_image = pre_image && before.is_some();
        let attribution = match attribution {
            Attribution::PreImage if !pre_image => Attribution::Ledger,
            other => other,
        };
        let after = if before.is_none() && after.is_none() { Some(base()) } else { after };
        let schema = schema();
        let e = change(1, before.as_ref(), after.as_ref(), None, pre_image);
        let ledger = Before::Known(before.as_ref().map(|d| schema.read_existing_row(d)));
        let c = classify(&e, ledger, attribution, &schema).unwrap();
        let truth = difference(counts(&schema, after.as_ref()), counts(&schema, before.as_ref()));
        let got = summed(&c);
        prop_assert!(same(&got, &truth), "{:?} != {:?}, groups {:?}", got, truth, groups(&schema));
        for changed in truth.keys() {
            prop_assert!(c.dirty.contains(changed), "{:?} not dirty: {:?}", changed, c.dirty);
        }
    }

    /// A comment's whole history in one batch, updates looked up at a later state as
    /// `updateLookup` does, before-states chained through the batch from an empty ledger: every
    /// definition's coalesced writes sum to what its count queries say of the final row.
    #[test]
    fn a_history_telescopes_in_every_definition(
        states in proptest::collection::vec(proptest::option::of(row_strategy()), 1..8),
        lateness in proptest::collection::vec(0..3usize, 8),
    ) {
        let schema = schema();
        let mut states = states;
        states.insert(0, None);
        let mut events = Vec::new();
        for i in 1..states.len() {
            if states[i - 1].is_none() && states[i].is_none() {
                continue;
            }
            // The lookup shows the row as it is some events later, while it still exists.
            let mut seen = i;
            while seen + 1 < states.len() && seen < i + lateness[i % 8] && states[seen + 1].is_some() {
                seen += 1;
            }
            events.push(change(i, states[i - 1].as_ref(), states[i].as_ref(), states[seen].as_ref(), false));
        }
        let (plan, end) = plan_batch(&events, &LedgerView::default(), Attribution::Ledger, &schema, 60);
        prop_assert!(end.is_none());
        let truth = difference(counts(&schema, states.last().unwrap().as_ref()), BTreeMap::new());
        let got = planned(&plan);
        prop_assert!(same(&got, &truth), "{:?} != {:?}", got, truth);
    }
}
