//! `plan_batch` over simulated histories preserves the per-post (and per-bucket) sums.

use bson::{doc, Bson, DateTime, Document};
use counterd::core::batch::{plan_batch, BatchPlan};
use counterd::core::classify::Attribution;
use counterd::core::event::{ChangeEvent, CommentId, LedgerView};
use counterd::core::key::GroupValue;
use counterd::core::num::Num;
use counterd::core::schema::Schema;
use proptest::prelude::*;
use proptest::sample::select;

use crate::{
    add_live, comment_strategy, created_strategy, diff, fake_event, fake_fragment, fake_spec,
    nonzero, post_strategy, real_event, Comment, Deleted, Tally, BASE_MS, WIDTH,
};

#[derive(Clone, Debug)]
pub enum Op {
    Insert(Comment),
    SoftDelete(i64),
    Undelete,
    SetDeletedNull,
    Move(GroupValue),
    SetCreated(Option<DateTime>),
    Body(String),
    Replace(Comment),
    Delete,
}

pub fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => comment_strategy().prop_map(Op::Insert),
        3 => (0..1000i64).prop_map(|s| Op::SoftDelete(BASE_MS + 90_000_000 + s * 1000)),
        2 => Just(Op::Undelete),
        1 => Just(Op::SetDeletedNull),
        2 => post_strategy().prop_map(Op::Move),
        1 => created_strategy().prop_map(Op::SetCreated),
        1 => "[a-z]{1,3}".prop_map(Op::Body),
        2 => comment_strategy().prop_map(Op::Replace),
        2 => Just(Op::Delete),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// A real server without pre-images; lookups may be late.
    RealLookup,
    /// A real server with pre-images that the `ledger` setting ignores; lookups may be late.
    RealLedgerIgnoringPreImages,
    /// A real server with pre-images used; lookups prompt.
    RealPreImage,
    /// The fake server; lookups may be late.
    Fake,
}

pub const COMMENTS: usize = 4;

/// One applied change, and the state of every comment right after it.
pub struct Step {
    comment: usize,
    op: &'static str,
    before: Option<Comment>,
    after: Option<Comment>,
    /// For updates: the update description.
    set: Document,
    removed: Vec<String>,
    snapshot: Vec<Option<Comment>>,
}

pub fn simulate(initial: &[Option<Comment>], ops: &[(usize, Op)]) -> Vec<Step> {
    let mut state = initial.to_vec();
    let mut steps = Vec::new();
    for (i, (comment, op)) in ops.iter().enumerate() {
        let comment = *comment;
        let before = state[comment].clone();
        let (kind, after) = match (op, &before) {
            (Op::Insert(c), None) => ("insert", Some(c.clone())),
            (Op::Insert(_), Some(_)) => continue,
            (_, None) => continue,
            (Op::Replace(c), Some(_)) => ("replace", Some(c.clone())),
            (Op::Delete, Some(_)) => ("delete", None),
            (op, Some(b)) => {
                let mut a = b.clone();
                match op {
                    Op::SoftDelete(ms) => a.deleted = Deleted::At(*ms),
                    Op::Undelete if b.deleted != Deleted::Absent => a.deleted = Deleted::Absent,
                    Op::SetDeletedNull if b.deleted != Deleted::Null => a.deleted = Deleted::Null,
                    Op::Move(p) if *p != b.post => a.post = p.clone(),
                    Op::SetCreated(c) if *c != b.created_at => a.created_at = *c,
                    Op::Body(text) => a.body = format!("{text}{i}"),
                    // A no-op update writes no oplog entry and emits no event.
                    _ => continue,
                }
                ("update", Some(a))
            }
        };
        let id = Bson::Int32(comment as i32);
        let (set, removed) = match (kind, &before, &after) {
            ("update", Some(b), Some(a)) => diff(&b.doc(&id), &a.doc(&id)),
            _ => (Document::new(), Vec::new()),
        };
        state[comment] = after.clone();
        steps.push(Step {
            comment,
            op: kind,
            before,
            after,
            set,
            removed,
            snapshot: state.clone(),
        });
    }
    steps
}

/// The change event of `steps[i]`, with its lookup taken after `steps[lookup]`.
pub fn emit(steps: &[Step], i: usize, lookup: usize, mode: Mode) -> Document {
    let step = &steps[i];
    let id = Bson::Int32(step.comment as i32);
    let looked_up = steps[lookup].snapshot[step.comment].as_ref();
    if mode == Mode::Fake {
        let mut d = fake_event(
            i + 1,
            if step.op == "replace" {
                "update"
            } else {
                step.op
            },
        );
        match step.op {
            "insert" => {
                d.insert("fullDocument", step.after.as_ref().unwrap().doc(&id));
                d.insert("documentKey", doc! {"_id": id});
            }
            "update" => {
                let spec = fake_spec(&step.set, &step.removed);
                let full = match looked_up {
                    Some(c) => c.doc(&id),
                    None => fake_fragment(&spec),
                };
                d.insert("fullDocument", full);
                d.insert("documentKey", spec);
            }
            "replace" => {
                let full = looked_up.map(|c| c.doc(&id)).unwrap_or_default();
                d.insert("fullDocument", full);
                d.insert("documentKey", step.after.as_ref().unwrap().doc(&id));
            }
            _ => {
                d.insert("fullDocument", Bson::Null);
                d.insert("documentKey", doc! {"_id": id});
            }
        }
        return d;
    }
    let mut d = real_event(i + 1, step.op, &id);
    match step.op {
        "insert" | "replace" => {
            d.insert("fullDocument", step.after.as_ref().unwrap().doc(&id));
        }
        "update" => {
            d.insert(
                "fullDocument",
                looked_up.map_or(Bson::Null, |c| Bson::Document(c.doc(&id))),
            );
            d.insert(
                "updateDescription",
                doc! {
                    "updatedFields": step.set.clone(),
                    "removedFields": step.removed.clone(),
                    "truncatedArrays": [],
                },
            );
        }
        _ => {}
    }
    if mode != Mode::RealLookup && step.op != "insert" {
        let pre = step.before.as_ref().unwrap().doc(&id);
        d.insert("fullDocumentBeforeChange", pre);
    }
    d
}

pub fn check_plan(plan: &BatchPlan) -> Result<(), TestCaseError> {
    let mut seen = Vec::new();
    for c in &plan.counters {
        prop_assert!(
            !seen.contains(&c.key.group),
            "two writes for {:?}",
            c.key.group
        );
        seen.push(c.key.group.clone());
        prop_assert_eq!(c.buckets.values().sum::<Num>(), c.delta);
        prop_assert!(c.buckets.values().all(|v| !v.is_zero()));
        prop_assert!(c.buckets.keys().all(|b| c.touched.contains(b)));
        prop_assert!(!c.touched.is_empty(), "a write that touches nothing");
        let mark = plan.dirty.iter().find(|d| d.key.group == c.key.group);
        prop_assert!(mark.is_some(), "{:?} changed but not dirty", c.key.group);
        // The dirty mark's newest bucket covers every bucket the write touched, so the post
        // leaves the dirty set only after a fold above all of them.
        let newest = mark.map_or(i64::MIN, |m| m.newest_bucket);
        prop_assert!(
            c.touched.iter().all(|b| *b <= newest),
            "{:?} above its mark {}",
            c.touched,
            newest
        );
    }
    let mut dirty: Vec<_> = plan.dirty.iter().map(|d| d.key.group.clone()).collect();
    dirty.sort();
    dirty.dedup();
    prop_assert_eq!(dirty.len(), plan.dirty.len(), "dirty posts repeat");
    Ok(())
}

/// Plans `ops` (applied to `initial`) as events in batches cut at `cuts`, and checks the
/// counters written against the truth.
pub fn check_history(
    initial: &[Option<Comment>],
    empty_ledger_entries: &[bool],
    ops: &[(usize, Op)],
    lags: &[usize],
    cuts: &[bool],
    mode: Mode,
    attribution: Attribution,
) -> Result<(), TestCaseError> {
    let steps = simulate(initial, ops);
    let events: Vec<ChangeEvent> = (0..steps.len())
        .map(|i| {
            let lookup = (i + lags[i]).min(steps.len() - 1);
            ChangeEvent::parse(&emit(&steps, i, lookup, mode)).unwrap()
        })
        .collect();

    // The ledger before the first batch: existing comments known; absent ones either
    // known-gone or without an entry.
    let mut ledger = LedgerView::default();
    for (i, c) in initial.iter().enumerate() {
        let key = CommentId::new(Bson::Int32(i as i32)).key;
        match c {
            Some(c) => {
                ledger.insert(key, Some(c.row()));
            }
            None if empty_ledger_entries[i] => {
                ledger.insert(key, None);
            }
            None => {}
        }
    }

    let mut applied = Tally::new();
    let mut start = 0;
    for end in 1..=events.len() {
        if end < events.len() && !cuts[end] {
            continue;
        }
        let (plan, ended) = plan_batch(
            &events[start..end],
            &ledger,
            attribution,
            &Schema::default(),
            WIDTH,
        );
        prop_assert!(ended.is_none());
        prop_assert_eq!(plan.events, end - start);
        prop_assert!(plan.skipped.is_empty(), "{:?}", plan.skipped);
        check_plan(&plan)?;
        for c in &plan.counters {
            for (bucket, amount) in &c.buckets {
                *applied.entry((c.key.group.clone(), *bucket)).or_default() += amount.as_i64();
            }
        }
        for update in plan.ledger {
            ledger.insert(update.comment.key, update.state);
        }
        start = end;
    }

    let mut truth = Tally::new();
    let last = steps
        .last()
        .map_or(initial.to_vec(), |s| s.snapshot.clone());
    for c in &last {
        add_live(&mut truth, c.as_ref(), 1);
    }
    for c in initial {
        add_live(&mut truth, c.as_ref(), -1);
    }
    prop_assert_eq!(nonzero(applied), nonzero(truth));
    // The ledger ends where the truth is, for every comment an event named.
    for step in &steps {
        let key = CommentId::new(Bson::Int32(step.comment as i32)).key;
        prop_assert_eq!(
            ledger.get(&key).cloned().flatten(),
            last[step.comment].as_ref().map(Comment::row),
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn plan_batch_preserves_per_post_sums(
        initial in proptest::collection::vec(proptest::option::of(comment_strategy()), COMMENTS),
        empty_ledger_entries in proptest::collection::vec(any::<bool>(), COMMENTS),
        ops in proptest::collection::vec((0..COMMENTS, op_strategy()), 1..40),
        lags in proptest::collection::vec(0..4usize, 40),
        cuts in proptest::collection::vec(proptest::bool::weighted(0.2), 40),
        mode in select(vec![Mode::RealLookup, Mode::RealLedgerIgnoringPreImages, Mode::RealPreImage, Mode::Fake]),
        auto in any::<bool>(),
    ) {
        let attribution = match (mode, auto) {
            (Mode::RealLedgerIgnoringPreImages, _) => Attribution::Ledger,
            (_, true) => Attribution::Auto,
            (Mode::RealPreImage, false) => Attribution::PreImage,
            _ => Attribution::Ledger,
        };
        check_history(&initial, &empty_ledger_entries, &ops, &lags, &cuts, mode, attribution)?;
    }
}

proptest! {
    // Pre-images mixed with late lookups: after-states are derived at event time, so the
    // transitions still telescope.
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn plan_batch_with_pre_images_and_late_lookups(
        initial in proptest::collection::vec(proptest::option::of(comment_strategy()), COMMENTS),
        ops in proptest::collection::vec((0..COMMENTS, op_strategy()), 1..40),
        lags in proptest::collection::vec(0..4usize, 40),
        cuts in proptest::collection::vec(proptest::bool::weighted(0.2), 40),
        auto in any::<bool>(),
    ) {
        let attribution = if auto { Attribution::Auto } else { Attribution::PreImage };
        check_history(&initial, &[false; COMMENTS], &ops, &lags, &cuts, Mode::RealPreImage, attribution)?;
    }
}
