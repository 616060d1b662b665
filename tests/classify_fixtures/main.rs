//! Classification of real-shaped change events, loaded from `fixtures/events/` (MongoDB 6/7,
//! relaxed extended JSON) and `fixtures/events/fake/` (mongo-java-server's own shapes), and
//! batch planning over sequences of such events.
//!
//! Every case asserts the whole [`Classification`]: deltas (post, bucket time, amount), dirty
//! posts, the ledger's after-state, the source of the before-state and the problem reported.
//!
//! By subject: `shapes` (the fixture files and their parsing), one module per operation
//! (`inserts`, `updates`, `replaces`, `hard_deletes`, `unknown_and_ending`), `fake_server`,
//! `batches` and `schemas`; the loaders and the data the fixtures describe are here.

mod batches;
mod fake_server;
mod hard_deletes;
mod inserts;
mod replaces;
mod schemas;
mod shapes;
mod unknown_and_ending;
mod updates;

use std::path::PathBuf;

use bson::{oid::ObjectId, Bson, DateTime, Document};
use counterd::core::classify::{
    classify, After, Attribution, Before, Classification, Delta, Malformed, Problem, Source,
    Unattributable,
};
use counterd::core::event::{ChangeEvent, CommentId, Row};
use counterd::core::key::{CounterIx, CounterKey, GroupValue};
use counterd::core::num::Num;
use counterd::core::schema::Schema;

// ---------------------------------------------------------------------------------------------
// Fixture loading

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/events")
}

/// Reads `fixtures/events/<name>.json` (relaxed extended JSON) into a BSON document.
fn fixture(name: &str) -> Document {
    let path = fixtures_dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    match Bson::try_from(json) {
        Ok(Bson::Document(doc)) => doc,
        Ok(other) => panic!("{} is not a document: {other:?}", path.display()),
        Err(e) => panic!("{} is not extended JSON: {e}", path.display()),
    }
}

fn event(name: &str) -> ChangeEvent {
    ChangeEvent::parse(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn parse(doc: &Document) -> ChangeEvent {
    ChangeEvent::parse(doc).unwrap_or_else(|e| panic!("{e}: {doc}"))
}

fn run(name: &str, before: Before, attribution: Attribution) -> Classification {
    classify(&event(name), before, attribution, &Schema::default())
        .unwrap_or_else(|e| panic!("{name} under {attribution:?}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The data the fixtures describe

const ALL: [Attribution; 4] = [
    Attribution::Auto,
    Attribution::PreImage,
    Attribution::Ledger,
    Attribution::BestEffort,
];
/// Attributions that read the ledger.
const LEDGER_USERS: [Attribution; 2] = [Attribution::Auto, Attribution::Ledger];

/// The comment most real fixtures are about.
const C1: &str = "69579ac2a1b2c3d4e5f60718";
/// The soft-deleted comment of `insert_soft_deleted`.
const C2: &str = "69579b10a1b2c3d4e5f60719";

fn dt(text: &str) -> DateTime {
    DateTime::parse_rfc3339_str(text).unwrap()
}
/// `created_at` of C1.
fn c1() -> Option<DateTime> {
    Some(dt("2026-01-02T10:15:30.123Z"))
}
/// `created_at` of C2.
fn c2() -> Option<DateTime> {
    Some(dt("2026-01-02T10:16:48.456Z"))
}
/// `created_at` of the fake server's comment 1.
fn fc() -> Option<DateTime> {
    Some(dt("2026-12-01T12:00:00Z"))
}

fn post(name: &str) -> GroupValue {
    GroupValue::Str(name.to_string())
}
fn live(p: &str, created_at: Option<DateTime>) -> Row {
    Row::of(Some(post(p)), created_at, false)
}
fn dead(p: &str, created_at: Option<DateTime>) -> Row {
    Row::of(Some(post(p)), created_at, true)
}
/// A row that exists without a `post_id`: it does not count, but the ledger knows its fields.
fn unposted(created_at: Option<DateTime>, deleted: bool) -> Row {
    Row::of(None, created_at, deleted)
}
fn delta(p: &str, created_at: Option<DateTime>, amount: i64) -> Delta {
    Delta {
        key: CounterKey::new(CounterIx::DEFAULT, post(p)),
        created_at,
        amount: Num::Int(amount),
    }
}
fn posts(names: &[&str]) -> Vec<GroupValue> {
    names.iter().map(|n| post(n)).collect()
}
fn oid_key(hex: &str) -> String {
    CommentId::new(Bson::ObjectId(ObjectId::parse_str(hex).unwrap())).key
}
fn int_key(id: i32) -> String {
    CommentId::new(Bson::Int32(id)).key
}

fn outcome(
    deltas: Vec<Delta>,
    dirty: &[&str],
    after: After,
    source: Source,
    problem: Option<Problem>,
) -> Classification {
    Classification {
        deltas,
        dirty: posts(dirty)
            .into_iter()
            .map(|group| CounterKey::new(CounterIx::DEFAULT, group))
            .collect(),
        after,
        source,
        problem,
    }
}

fn unattributable(why: Unattributable) -> Option<Problem> {
    Some(Problem::Unattributable(why))
}
fn bad(how: Malformed) -> Option<Problem> {
    Some(Problem::Bad(how))
}
fn unsupported_post_type(kind: &str) -> Malformed {
    Malformed::UnsupportedPostType {
        field: "post_id".into(),
        kind: kind.into(),
    }
}

const DELETE_UNATTRIBUTABLE: Unattributable = Unattributable::DeleteOfUnknownRow;
const UPDATE_UNATTRIBUTABLE: Unattributable = Unattributable::UpdateWithoutPost;
const MOVE_UNATTRIBUTABLE: Unattributable = Unattributable::MoveFromUnknownPost;
