//! Properties of the pure core: classification, batch planning, the reconcile fold, and that no
//! input document can make the event model or the classifier panic.

use std::collections::{BTreeMap, HashMap};

use bson::{doc, oid::ObjectId, Bson, DateTime, Document, Timestamp};
use counterd::core::batch::{bucket_of, plan_batch, BatchPlan};
use counterd::core::classify::{classify, After, Attribution, Before, Source};
use counterd::core::event::{ChangeEvent, CommentId, Row};
use counterd::core::fold::{effective_watermark, fold, watermark_for, CounterState};
use counterd::core::key::PostId;
use counterd::core::key::{CounterIx, CounterKey};
use counterd::core::num::Num;
use counterd::core::schema::Schema;
use proptest::prelude::*;
use proptest::sample::select;

const WIDTH: i64 = 60;
/// 2026-01-02T10:00:00Z in milliseconds.
const BASE_MS: i64 = 1_767_348_000_000;

// ---------------------------------------------------------------------------------------------
// Rows and their documents

fn post_strategy() -> impl Strategy<Value = PostId> {
    prop_oneof![
        Just(PostId::Str("p0".into())),
        Just(PostId::Str("p1".into())),
        Just(PostId::Int(7)),
    ]
}

/// Creation times in a few buckets, several per bucket, sometimes missing.
fn created_strategy() -> impl Strategy<Value = Option<DateTime>> {
    prop_oneof![
        1 => Just(None),
        6 => (0..4i64, 0..3i64).prop_map(|(m, s)| Some(DateTime::from_millis(
            BASE_MS + m * 60_000 + s * 20_000 + 7
        ))),
    ]
}

/// How a row's `deleted_at` is spelled: absent, `null` (both live) or a date (deleted).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Deleted {
    Absent,
    Null,
    At(i64),
}

impl Deleted {
    fn is_live(self) -> bool {
        !matches!(self, Deleted::At(_))
    }
    fn to_bson(self) -> Option<Bson> {
        match self {
            Deleted::Absent => None,
            Deleted::Null => Some(Bson::Null),
            Deleted::At(ms) => Some(Bson::DateTime(DateTime::from_millis(ms))),
        }
    }
}

fn deleted_strategy() -> impl Strategy<Value = Deleted> {
    prop_oneof![
        3 => Just(Deleted::Absent),
        1 => Just(Deleted::Null),
        3 => (0..1000i64).prop_map(|s| Deleted::At(BASE_MS + 86_400_000 + s * 1000)),
    ]
}

/// A comment row as the test knows it (the truth).
#[derive(Clone, Debug, PartialEq)]
struct Comment {
    post: PostId,
    created_at: Option<DateTime>,
    deleted: Deleted,
    body: String,
}

impl Comment {
    fn is_live(&self) -> bool {
        self.deleted.is_live()
    }
    fn row(&self) -> Row {
        Row {
            members: Vec::new(),
            post: Some(self.post.clone()),
            created_at: self.created_at,
            deleted: !self.is_live(),
        }
    }
    fn doc(&self, id: &Bson) -> Document {
        let mut d = doc! {"_id": id.clone(), "post_id": self.post.to_bson()};
        if let Some(c) = self.created_at {
            d.insert("created_at", c);
        }
        if let Some(v) = self.deleted.to_bson() {
            d.insert("deleted_at", v);
        }
        d.insert("body", self.body.clone());
        d
    }
}

fn comment_strategy() -> impl Strategy<Value = Comment> {
    (
        post_strategy(),
        created_strategy(),
        deleted_strategy(),
        "[a-z]{0,3}",
    )
        .prop_map(|(post, created_at, deleted, body)| Comment {
            post,
            created_at,
            deleted,
            body,
        })
}

/// `updatedFields` and `removedFields` that turn `before` into `after`.
fn diff(before: &Document, after: &Document) -> (Document, Vec<String>) {
    let mut set = Document::new();
    for (k, v) in after {
        if k != "_id" && before.get(k) != Some(v) {
            set.insert(k.clone(), v.clone());
        }
    }
    let removed = before
        .keys()
        .filter(|k| !after.contains_key(k.as_str()))
        .cloned()
        .collect();
    (set, removed)
}

/// The fake server's update spec for that change (`$set`/`$unset`), never empty.
fn fake_spec(set: &Document, removed: &[String]) -> Document {
    let mut spec = Document::new();
    if !set.is_empty() {
        spec.insert("$set", set.clone());
    }
    if !removed.is_empty() {
        let unset: Document = removed
            .iter()
            .map(|k| (k.clone(), Bson::from("")))
            .collect();
        spec.insert("$unset", unset);
    }
    if spec.is_empty() {
        spec.insert("$set", doc! {"body": "unchanged"});
    }
    spec
}

/// The fragment the fake server returns as `fullDocument` when the row is gone.
fn fake_fragment(spec: &Document) -> Document {
    let mut fragment = Document::new();
    for part in ["$set", "$unset"] {
        if let Ok(fields) = spec.get_document(part) {
            for (k, v) in fields {
                fragment.insert(k.clone(), v.clone());
            }
        }
    }
    fragment
}

fn token(n: usize) -> String {
    format!("82{:08X}000000012B042C0100296E5A1004", 0x695B_7000 + n)
}

fn real_event(n: usize, op: &str, id: &Bson) -> Document {
    doc! {
        "_id": {"_data": token(n)},
        "operationType": op,
        "clusterTime": Timestamp { time: 0x695B_7000 + n as u32, increment: 1 },
        "wallTime": DateTime::from_millis((0x695B_7000 + n as i64) * 1000),
        "ns": {"db": "app", "coll": "comments"},
        "documentKey": {"_id": id.clone()},
    }
}

fn fake_event(n: usize, op: &str) -> Document {
    doc! {
        "_id": {"_data": format!("6b103333{n:08x}")},
        "operationType": op,
        "clusterTime": Timestamp { time: 1_796_223_795, increment: n as u32 },
    }
}

type Tally = BTreeMap<(PostId, i64), i64>;

fn add_live(tally: &mut Tally, comment: Option<&Comment>, sign: i64) {
    if let Some(c) = comment.filter(|c| c.is_live()) {
        *tally
            .entry((c.post.clone(), bucket_of(c.created_at, WIDTH)))
            .or_default() += sign;
    }
}

fn nonzero(mut tally: Tally) -> Tally {
    tally.retain(|_, v| *v != 0);
    tally
}

// ---------------------------------------------------------------------------------------------
// (a) One event, before-state known: deltas are live_after - live_before per post and bucket.

#[derive(Clone, Copy, Debug)]
enum Kind {
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
            *got.entry((d.post.clone(), bucket_of(d.created_at, WIDTH))).or_default() += d.amount.as_i64();
        }
        prop_assert_eq!(nonzero(got.clone()), nonzero(truth.clone()));
        // Per post too (the design's statement).
        let per_post = |t: &Tally| {
            let mut m: BTreeMap<PostId, i64> = BTreeMap::new();
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

// ---------------------------------------------------------------------------------------------
// (b) plan_batch over simulated histories preserves the per-post (and per-bucket) sums.

#[derive(Clone, Debug)]
enum Op {
    Insert(Comment),
    SoftDelete(i64),
    Undelete,
    SetDeletedNull,
    Move(PostId),
    SetCreated(Option<DateTime>),
    Body(String),
    Replace(Comment),
    Delete,
}

fn op_strategy() -> impl Strategy<Value = Op> {
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
enum Mode {
    /// A real server without pre-images; lookups may be late.
    RealLookup,
    /// A real server with pre-images that the `ledger` setting ignores; lookups may be late.
    RealLedgerIgnoringPreImages,
    /// A real server with pre-images used; lookups prompt.
    RealPreImage,
    /// The fake server; lookups may be late.
    Fake,
}

const COMMENTS: usize = 4;

/// One applied change, and the state of every comment right after it.
struct Step {
    comment: usize,
    op: &'static str,
    before: Option<Comment>,
    after: Option<Comment>,
    /// For updates: the update description.
    set: Document,
    removed: Vec<String>,
    snapshot: Vec<Option<Comment>>,
}

fn simulate(initial: &[Option<Comment>], ops: &[(usize, Op)]) -> Vec<Step> {
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
fn emit(steps: &[Step], i: usize, lookup: usize, mode: Mode) -> Document {
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

fn check_plan(plan: &BatchPlan) -> Result<(), TestCaseError> {
    let mut seen = Vec::new();
    for c in &plan.counters {
        prop_assert!(!seen.contains(&c.post), "two writes for {:?}", c.post);
        seen.push(c.post.clone());
        prop_assert_eq!(c.buckets.values().sum::<Num>(), c.delta);
        prop_assert!(c.buckets.values().all(|v| !v.is_zero()));
        prop_assert!(c.buckets.keys().all(|b| c.touched.contains(b)));
        prop_assert!(!c.touched.is_empty(), "a write that touches nothing");
        let mark = plan.dirty.iter().find(|d| d.post == c.post);
        prop_assert!(mark.is_some(), "{:?} changed but not dirty", c.post);
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
    let mut dirty: Vec<_> = plan.dirty.iter().map(|d| d.post.clone()).collect();
    dirty.sort();
    dirty.dedup();
    prop_assert_eq!(dirty.len(), plan.dirty.len(), "dirty posts repeat");
    Ok(())
}

/// Plans `ops` (applied to `initial`) as events in batches cut at `cuts`, and checks the
/// counters written against the truth.
fn check_history(
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
    let mut ledger: HashMap<String, Option<Row>> = HashMap::new();
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
                *applied.entry((c.post.clone(), *bucket)).or_default() += amount.as_i64();
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

// ---------------------------------------------------------------------------------------------
// (b2) Applications' schemas: a renamed schema on renamed documents plans exactly what the
// default schema plans on the original ones.

/// The renamed application: `post_id` → `meta.postId` (nested), `created_at` → `createdAt`,
/// `deleted_at` → `deletedAt`.
fn renamed_schema() -> Schema {
    Schema {
        counters: Vec::new(),
        group: "meta.postId".into(),
        created: "createdAt".into(),
        soft_delete: counterd::core::schema::SoftDelete::Present {
            field: "deletedAt".into(),
        },
    }
}

fn rename_path(key: &str) -> String {
    match key {
        "post_id" => "meta.postId".into(),
        "created_at" => "createdAt".into(),
        "deleted_at" => "deletedAt".into(),
        other => other.into(),
    }
}

/// A row document with its fields renamed (nested where the new path is dotted).
fn rename_row(doc: &Document) -> Document {
    let mut out = Document::new();
    for (k, v) in doc {
        counterd::core::schema::set_path(&mut out, &rename_path(k), v.clone());
    }
    out
}

/// Field names renamed as flat (dotted) keys: updatedFields, `$set`, `$unset`.
fn rename_keys(doc: &Document) -> Document {
    doc.iter()
        .map(|(k, v)| (rename_path(k), v.clone()))
        .collect()
}

/// A change event with every field name of the row renamed, wherever the event carries it.
fn rename_event(event: &Document) -> Document {
    let mut e = event.clone();
    for field in ["fullDocument", "fullDocumentBeforeChange"] {
        if let Ok(d) = event.get_document(field) {
            let renamed = if d.contains_key("_id") {
                rename_row(d)
            } else {
                rename_keys(d) // the fake server's fragment of a gone row: flat keys
            };
            e.insert(field, renamed);
        }
    }
    if let Ok(key) = event.get_document("documentKey") {
        let mut renamed = Document::new();
        for (k, v) in key {
            match (k.as_str(), v) {
                ("$set" | "$unset", Bson::Document(d)) => {
                    renamed.insert(k.clone(), rename_keys(d));
                }
                _ => counterd::core::schema::set_path(&mut renamed, &rename_path(k), v.clone()),
            }
        }
        e.insert("documentKey", renamed);
    }
    if let Ok(desc) = event.get_document("updateDescription") {
        let mut desc = desc.clone();
        if let Ok(set) = desc.get_document("updatedFields") {
            let renamed = rename_keys(set);
            desc.insert("updatedFields", renamed);
        }
        if let Ok(removed) = desc.get_array("removedFields") {
            let renamed: Vec<Bson> = removed
                .iter()
                .map(|b| Bson::String(rename_path(b.as_str().unwrap_or_default())))
                .collect();
            desc.insert("removedFields", renamed);
        }
        e.insert("updateDescription", desc);
    }
    e
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_renamed_schema_plans_what_the_default_one_plans(
        initial in proptest::collection::vec(proptest::option::of(comment_strategy()), COMMENTS),
        known in proptest::collection::vec(any::<bool>(), COMMENTS),
        ops in proptest::collection::vec((0..COMMENTS, op_strategy()), 1..30),
        lags in proptest::collection::vec(0..4usize, 30),
        mode in select(vec![Mode::RealLookup, Mode::RealLedgerIgnoringPreImages, Mode::RealPreImage, Mode::Fake]),
        attribution in select(vec![Attribution::Auto, Attribution::Ledger, Attribution::PreImage, Attribution::BestEffort]),
    ) {
        let steps = simulate(&initial, &ops);
        let docs: Vec<Document> = (0..steps.len())
            .map(|i| emit(&steps, i, (i + lags[i]).min(steps.len() - 1), mode))
            .collect();
        let parse = |d: &Document| ChangeEvent::parse(d).unwrap();
        let events: Vec<ChangeEvent> = docs.iter().map(parse).collect();
        let renamed: Vec<ChangeEvent> = docs.iter().map(|d| parse(&rename_event(d))).collect();
        let mut ledger: HashMap<String, Option<Row>> = HashMap::new();
        for (i, c) in initial.iter().enumerate() {
            if known[i] {
                ledger.insert(CommentId::new(Bson::Int32(i as i32)).key, c.as_ref().map(Comment::row));
            }
        }
        let (default_plan, _) = plan_batch(&events, &ledger, attribution, &Schema::default(), WIDTH);
        let (renamed_plan, _) = plan_batch(&renamed, &ledger, attribution, &renamed_schema(), WIDTH);
        prop_assert_eq!(&renamed_plan.counters, &default_plan.counters);
        prop_assert_eq!(&renamed_plan.dirty, &default_plan.dirty);
        prop_assert_eq!(&renamed_plan.ledger, &default_plan.ledger);
        prop_assert_eq!(renamed_plan.events, default_plan.events);
        prop_assert_eq!(renamed_plan.skipped.len(), default_plan.skipped.len());
    }
}

// ---------------------------------------------------------------------------------------------
// (c) The reconcile fold.

/// A counter's number: a count's integer, or a sum's integer or double (halves, so that every
/// sum the property adds up is exact in a double too and may be compared exactly).
fn number(range: std::ops::RangeInclusive<i64>) -> impl Strategy<Value = Num> {
    (range, any::<bool>()).prop_map(|(n, double)| {
        if double {
            Num::Double(n as f64 / 2.0)
        } else {
            Num::Int(n)
        }
    })
}

fn counter_state() -> impl Strategy<Value = (CounterState, bool)> {
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

// ---------------------------------------------------------------------------------------------
// (d) Arbitrary documents never panic the event model, the classifier or the planner.

const KEYS: &[&str] = &[
    "_id",
    "_data",
    "operationType",
    "documentKey",
    "fullDocument",
    "fullDocumentBeforeChange",
    "updateDescription",
    "updatedFields",
    "removedFields",
    "post_id",
    "created_at",
    "deleted_at",
    "$set",
    "$unset",
    "clusterTime",
    "body",
];

const OPS: &[&str] = &[
    "insert",
    "update",
    "replace",
    "delete",
    "drop",
    "rename",
    "dropDatabase",
    "invalidate",
    "createIndexes",
    "futureOp",
    "",
];

fn key_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(KEYS).prop_map(String::from),
        1 => "[a-z$._]{0,4}",
    ]
}

fn leaf_strategy() -> impl Strategy<Value = Bson> {
    prop_oneof![
        "\\PC{0,6}".prop_map(Bson::String),
        select(OPS).prop_map(Bson::from),
        select(vec!["p1", "post-1", "deleted_at", "post_id", "82AB"]).prop_map(Bson::from),
        any::<i32>().prop_map(Bson::Int32),
        (-3..3i32).prop_map(Bson::Int32),
        any::<i64>().prop_map(Bson::Int64),
        any::<f64>().prop_map(Bson::Double),
        Just(Bson::Double(f64::NAN)),
        Just(Bson::Null),
        any::<bool>().prop_map(Bson::Boolean),
        any::<i64>().prop_map(|ms| Bson::DateTime(DateTime::from_millis(ms))),
        prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(-1i64), Just(0i64)]
            .prop_map(|ms| Bson::DateTime(DateTime::from_millis(ms))),
        (any::<u32>(), any::<u32>())
            .prop_map(|(time, increment)| Bson::Timestamp(Timestamp { time, increment })),
        any::<[u8; 12]>().prop_map(|b| Bson::ObjectId(ObjectId::from_bytes(b))),
    ]
}

fn bson_strategy() -> impl Strategy<Value = Bson> {
    leaf_strategy().prop_recursive(4, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Bson::Array),
            proptest::collection::vec((key_strategy(), inner), 0..6)
                .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
        ]
    })
}

/// A document that often looks like an event: a token, an operation, and arbitrary fields.
fn event_like() -> impl Strategy<Value = Document> {
    (
        proptest::option::weighted(
            0.9,
            prop_oneof![
                4 => "[0-9A-F]{1,12}".prop_map(Bson::String),
                1 => bson_strategy(),
            ],
        ),
        proptest::option::weighted(
            0.9,
            prop_oneof![
                4 => select(OPS).prop_map(Bson::from),
                1 => bson_strategy(),
            ],
        ),
        proptest::collection::vec((key_strategy(), bson_strategy()), 0..8),
    )
        .prop_map(|(data, op, fields)| {
            let mut d = Document::new();
            if let Some(data) = data {
                d.insert("_id", doc! {"_data": data});
            }
            if let Some(op) = op {
                d.insert("operationType", op);
            }
            for (k, v) in fields {
                d.insert(k, v);
            }
            d
        })
}

/// A fixture with random parts replaced, removed or added, at the top or one level down.
fn mutated_fixture() -> impl Strategy<Value = Document> {
    let fixtures = load_fixtures();
    (
        select(fixtures),
        proptest::collection::vec(
            (
                select(vec![
                    "",
                    "fullDocument",
                    "documentKey",
                    "updateDescription",
                    "fullDocumentBeforeChange",
                    "_id",
                ]),
                key_strategy(),
                proptest::option::weighted(0.8, bson_strategy()),
            ),
            1..4,
        ),
    )
        .prop_map(|(mut doc, edits)| {
            for (at, key, value) in edits {
                let target = if at.is_empty() {
                    Some(&mut doc)
                } else {
                    doc.get_document_mut(at).ok()
                };
                if let Some(target) = target {
                    match value {
                        Some(v) => {
                            target.insert(key, v);
                        }
                        None => {
                            target.remove(&key);
                        }
                    }
                }
            }
            doc
        })
}

fn load_fixtures() -> Vec<Document> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/events");
    let mut docs = Vec::new();
    for dir in [root.clone(), root.join("fake")] {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                let json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                match Bson::try_from(json).unwrap() {
                    Bson::Document(d) => docs.push(d),
                    other => panic!("{}: {other:?}", path.display()),
                }
            }
        }
    }
    docs.sort_by_key(|d| d.to_string());
    docs
}

fn befores() -> Vec<Before> {
    let row = |deleted| Row {
        members: Vec::new(),
        post: Some(PostId::Str("p1".into())),
        created_at: Some(DateTime::from_millis(BASE_MS)),
        deleted,
    };
    vec![
        Before::Unknown,
        Before::Known(None),
        Before::Known(Some(row(false))),
        Before::Known(Some(row(true))),
        Before::Known(Some(Row {
            members: Vec::new(),
            post: Some(PostId::Int(-1)),
            created_at: Some(DateTime::MIN),
            deleted: false,
        })),
        // A row that exists without a post.
        Before::Known(Some(Row {
            members: Vec::new(),
            post: None,
            created_at: Some(DateTime::from_millis(BASE_MS)),
            deleted: false,
        })),
    ]
}

const ALL: [Attribution; 4] = [
    Attribution::Auto,
    Attribution::PreImage,
    Attribution::Ledger,
    Attribution::BestEffort,
];

fn never_panics(docs: &[Document], ledger_pick: &[u8]) {
    let mut events = Vec::new();
    for doc in docs {
        let Ok(event) = ChangeEvent::parse(doc) else {
            continue;
        };
        for before in befores() {
            for attribution in ALL {
                let _ = classify(&event, before.clone(), attribution, &Schema::default());
            }
        }
        events.push(event);
    }
    // A ledger that knows some of the comments, in any state.
    let states = befores();
    let mut ledger = HashMap::new();
    for (event, pick) in events.iter().zip(ledger_pick) {
        if let (Some(comment), Before::Known(state)) =
            (&event.comment, &states[*pick as usize % states.len()])
        {
            ledger.insert(comment.key.clone(), state.clone());
        }
    }
    for attribution in ALL {
        for width in [1, 60, 3600] {
            let (plan, _) = plan_batch(&events, &ledger, attribution, &Schema::default(), width);
            for c in &plan.counters {
                assert_eq!(c.buckets.values().sum::<Num>(), c.delta);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn arbitrary_documents_never_panic(
        docs in proptest::collection::vec(event_like(), 1..6),
        ledger_pick in proptest::collection::vec(any::<u8>(), 6),
    ) {
        never_panics(&docs, &ledger_pick);
    }

    #[test]
    fn mutated_fixtures_never_panic(
        docs in proptest::collection::vec(mutated_fixture(), 1..6),
        ledger_pick in proptest::collection::vec(any::<u8>(), 6),
    ) {
        never_panics(&docs, &ledger_pick);
    }

    #[test]
    fn arbitrary_values_never_panic(value in bson_strategy()) {
        if let Bson::Document(doc) = &value {
            never_panics(std::slice::from_ref(doc), &[2]);
        }
        let _ = CommentId::new(value.clone());
        let _ = PostId::from_bson(&value);
        if let Bson::Document(doc) = value {
            let _ = Schema::default().read_row(&doc);
            let _ = Schema::default().read_looked_up_row(&doc);
        }
    }
}

/// The default definition's counter of `post`.
fn default_key(post: &PostId) -> CounterKey {
    CounterKey {
        counter: CounterIx::DEFAULT,
        group: post.clone(),
    }
}

/// The counter a delta changes.
fn key_of(d: &counterd::core::classify::Delta) -> CounterKey {
    CounterKey {
        counter: d.counter,
        group: d.post.clone(),
    }
}
