//! The change stream's `$project` (`Schema::stream_projection`): over every real-shaped and
//! fake-server fixture in `fixtures/events/`, an event projected as the server would project it
//! classifies exactly as the whole event does, and carries none of the application's other
//! fields; the test server evaluates the stage the same way on live events.
//!
//! The server's evaluation is modelled by a small evaluator of the stage's own operators
//! (inclusion paths, `$arrayToObject`, `$filter`, `$objectToArray`, `$or`, `$in`, `$eq`,
//! `$indexOfBytes`, `$cond`, `$ifNull`), written from MongoDB's documented semantics.

mod support;

use std::path::{Path, PathBuf};

use bson::{doc, Bson, Document};
use counterd::core::classify::{classify, Attribution, Before};
use counterd::core::event::{ChangeEvent, Row};
use counterd::core::schema::{Schema, SoftDelete};

fn fixture_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/events");
    let mut files = Vec::new();
    for dir in [root.clone(), root.join("fake"), root.join("schema")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() > 30, "fixtures found: {}", files.len());
    files
}

fn load(path: &Path) -> Document {
    let text = std::fs::read_to_string(path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    match Bson::try_from(json).unwrap() {
        Bson::Document(d) => d,
        other => panic!("{}: {other:?}", path.display()),
    }
}

fn schemas() -> Vec<(&'static str, Schema)> {
    vec![
        ("default", Schema::default()),
        (
            "js",
            Schema {
                created: "createdAt".into(),
                soft_delete: SoftDelete::True {
                    field: "deleted".into(),
                },
                ..Schema::default().grouped_by("postId")
            },
        ),
        (
            "status",
            Schema {
                soft_delete: SoftDelete::OneOf {
                    field: "status".into(),
                    values: vec![Bson::String("removed".into()), Bson::String("spam".into())],
                },
                ..Schema::default()
            },
        ),
        (
            "nested",
            Schema {
                created: "meta.created".into(),
                ..Schema::default().grouped_by("meta.post")
            },
        ),
    ]
}

// ---------------------------------------------------------------------------------------------
// The evaluator

fn path_value<'a>(doc: &'a Document, path: &str) -> Option<&'a Bson> {
    Schema::get(doc, path)
}

/// Evaluates an expression against the event `root` with the variables `vars`.
fn eval(expr: &Bson, root: &Document, vars: &[(&str, Bson)]) -> Bson {
    match expr {
        Bson::String(s) if s.starts_with("$$") => {
            let (var, rest) = s[2..].split_once('.').unwrap_or((&s[2..], ""));
            let value = vars
                .iter()
                .rev()
                .find(|(name, _)| *name == var)
                .map(|(_, v)| v.clone())
                .unwrap_or(Bson::Null);
            if rest.is_empty() {
                value
            } else {
                value
                    .as_document()
                    .and_then(|d| path_value(d, rest).cloned())
                    .unwrap_or(Bson::Null)
            }
        }
        Bson::String(s) if s.starts_with('$') => {
            path_value(root, &s[1..]).cloned().unwrap_or(Bson::Null)
        }
        Bson::Array(items) => Bson::Array(items.iter().map(|i| eval(i, root, vars)).collect()),
        Bson::Document(d) if d.len() == 1 && d.keys().next().unwrap().starts_with('$') => {
            let (op, arg) = d.iter().next().unwrap();
            operator(op, arg, root, vars)
        }
        other => other.clone(),
    }
}

fn operator(op: &str, arg: &Bson, root: &Document, vars: &[(&str, Bson)]) -> Bson {
    let args = || match eval(arg, root, vars) {
        Bson::Array(a) => a,
        other => vec![other],
    };
    match op {
        "$objectToArray" => match eval(arg, root, vars) {
            Bson::Document(d) => Bson::Array(
                d.into_iter()
                    .map(|(k, v)| Bson::Document(doc! {"k": k, "v": v}))
                    .collect(),
            ),
            _ => Bson::Null,
        },
        "$arrayToObject" => match eval(arg, root, vars) {
            Bson::Array(pairs) => {
                let mut out = Document::new();
                for pair in pairs {
                    let pair = pair.as_document().unwrap();
                    out.insert(pair.get_str("k").unwrap(), pair.get("v").unwrap().clone());
                }
                Bson::Document(out)
            }
            _ => Bson::Null,
        },
        "$filter" => {
            let spec = arg.as_document().unwrap();
            let name = spec.get_str("as").unwrap();
            match eval(spec.get("input").unwrap(), root, vars) {
                Bson::Array(items) => Bson::Array(
                    items
                        .into_iter()
                        .filter(|item| {
                            let mut inner = vars.to_vec();
                            inner.push((name, item.clone()));
                            eval(spec.get("cond").unwrap(), root, &inner) == Bson::Boolean(true)
                        })
                        .collect(),
                ),
                _ => Bson::Null,
            }
        }
        "$cond" => {
            // Lazy: only the branch taken is evaluated.
            let parts = arg.as_array().unwrap();
            if eval(&parts[0], root, vars) == Bson::Boolean(true) {
                eval(&parts[1], root, vars)
            } else {
                eval(&parts[2], root, vars)
            }
        }
        "$ifNull" => {
            let a = args();
            if a[0] == Bson::Null {
                a[1].clone()
            } else {
                a[0].clone()
            }
        }
        "$or" => Bson::Boolean(args().iter().any(|a| *a == Bson::Boolean(true))),
        "$eq" => {
            let a = args();
            Bson::Boolean(a[0] == a[1])
        }
        "$in" => {
            let a = args();
            Bson::Boolean(a[1].as_array().unwrap().contains(&a[0]))
        }
        "$indexOfBytes" => {
            let a = args();
            match (&a[0], &a[1]) {
                (Bson::String(s), Bson::String(sub)) => {
                    Bson::Int32(s.find(sub.as_str()).map(|i| i as i32).unwrap_or(-1))
                }
                _ => Bson::Null,
            }
        }
        other => panic!("the evaluator does not know {other}"),
    }
}

/// Sets `path` (dotted) of `out` to `value`, creating the documents on the way.
fn set(out: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            out.insert(path, value);
        }
        Some((head, rest)) => {
            if !matches!(out.get(head), Some(Bson::Document(_))) {
                out.insert(head, Document::new());
            }
            set(out.get_document_mut(head).unwrap(), rest, value);
        }
    }
}

/// Applies a `$project` stage as the server does: included paths are copied where present,
/// computed ones set to their value, null included.
fn project(stage: &Document, event: &Document) -> Document {
    let spec = stage.get_document("$project").unwrap();
    let mut out = Document::new();
    for (path, how) in spec {
        match how {
            Bson::Int32(1) => {
                // An inclusion below a value that is not a document (a null `fullDocument`)
                // keeps nothing.
                let (parent, _) = path.rsplit_once('.').unwrap_or(("", path));
                let parent_is_doc = parent.is_empty()
                    || matches!(path_value(event, parent), Some(Bson::Document(_)));
                if let Some(value) = path_value(event, path).filter(|_| parent_is_doc) {
                    set(&mut out, path, value.clone());
                }
            }
            Bson::Document(nested) if !nested.keys().any(|k| k.starts_with('$')) => {
                // A nested spec of computed fields: a document of their values.
                let mut inner = Document::new();
                for (field, expr) in nested {
                    inner.insert(field, eval(expr, event, &[]));
                }
                set(&mut out, path, Bson::Document(inner));
            }
            expr => set(&mut out, path, eval(expr, event, &[])),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The fixtures, whole and projected

fn befores() -> Vec<Before> {
    let row = |post: &str, deleted| {
        Row::of(
            Some(counterd::core::key::GroupValue::Str(post.into())),
            Some(bson::DateTime::parse_rfc3339_str("2026-01-02T10:15:30.123Z").unwrap()),
            deleted,
        )
    };
    vec![
        Before::Unknown,
        Before::Known(None),
        Before::Known(Some(row("post-1", false))),
        Before::Known(Some(row("post-1", true))),
        Before::Complete(Some(row("post-2", false))),
    ]
}

#[test]
fn every_fixture_classifies_the_same_projected() {
    let attributions = [
        Attribution::Auto,
        Attribution::PreImage,
        Attribution::Ledger,
        Attribution::BestEffort,
    ];
    let mut compared = 0;
    for file in fixture_files() {
        let whole = load(&file);
        for (name, schema) in schemas() {
            let projected = project(&schema.stream_projection(), &whole);
            let label = format!("{} under the {name} schema", file.display());
            let (a, b) = match (ChangeEvent::parse(&whole), ChangeEvent::parse(&projected)) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(a), Err(b)) => {
                    assert_eq!(a, b, "{label}");
                    continue;
                }
                (a, b) => panic!("{label}: whole {a:?}, projected {b:?}"),
            };
            assert_eq!(
                (&a.token, a.cluster_time, &a.comment, &a.document_key),
                (&b.token, b.cluster_time, &b.comment, &b.document_key),
                "{label}"
            );
            for attribution in attributions {
                for before in befores() {
                    let whole = classify(&a, before.clone(), attribution, &schema);
                    let projected = classify(&b, before.clone(), attribution, &schema);
                    assert_eq!(
                        format!("{whole:?}"),
                        format!("{projected:?}"),
                        "{label}, {attribution:?}, {before:?}"
                    );
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 1000, "{compared}");
}

/// The fields a projected event may hold: the event's metadata, `_id` and the schema's fields
/// of its documents, and in an update's description only keys bearing on the schema's fields.
#[test]
fn a_projected_event_carries_nothing_of_the_applications_other_fields() {
    for file in fixture_files() {
        let whole = load(&file);
        let schema = Schema::default();
        let projected = project(&schema.stream_projection(), &whole);
        for key in projected.keys() {
            assert!(
                [
                    "_id",
                    "operationType",
                    "clusterTime",
                    "documentKey",
                    "lsid",
                    "txnNumber",
                    "fullDocument",
                    "fullDocumentBeforeChange",
                    "updateDescription"
                ]
                .contains(&key.as_str()),
                "{}: {key}",
                file.display()
            );
        }
        for document in ["fullDocument", "fullDocumentBeforeChange"] {
            if let Ok(d) = projected.get_document(document) {
                for key in d.keys() {
                    assert!(
                        ["_id", "post_id", "created_at", "deleted_at"].contains(&key.as_str()),
                        "{}: {document}.{key}",
                        file.display()
                    );
                }
            }
        }
        if let Ok(updated) = projected.get_document("updateDescription.updatedFields") {
            assert!(!updated.contains_key("body"), "{}", file.display());
        }
        assert!(
            !projected.to_string().contains("Great post"),
            "{}: a body survived: {projected}",
            file.display()
        );
    }
}

#[test]
fn update_keys_are_kept_when_they_are_the_field_a_parent_or_a_part_of_it() {
    let schema = Schema {
        created: "created_at".into(),
        soft_delete: SoftDelete::Never,
        ..Schema::default().grouped_by("meta.post")
    };
    let event = doc! {
        "_id": {"_data": "01"}, "operationType": "update",
        "documentKey": {"_id": 1},
        "updateDescription": {
            "updatedFields": {
                "meta.post": "p2", "meta": {"post": "p3"}, "meta.post.x": 1, "meta.postx": 1,
                "metadata": 1, "body": "long", "créé": 1, "created_at_x": 1,
            },
            "removedFields": ["meta", "body", "meta.postx", "created_at"],
        },
    };
    let projected = project(&schema.stream_projection(), &event);
    let description = projected.get_document("updateDescription").unwrap();
    let kept: Vec<&String> = description
        .get_document("updatedFields")
        .unwrap()
        .keys()
        .collect();
    assert_eq!(kept, ["meta.post", "meta", "meta.post.x"]);
    assert_eq!(
        description.get_array("removedFields").unwrap(),
        &vec![Bson::from("meta"), Bson::from("created_at")]
    );
}

/// The test server evaluates the stage too: with it at the end of the pipeline, a live stream
/// of inserts, body edits, moves and soft deletes reaches counterd without the bodies, and the
/// worker counts it exactly (the suites that run the worker against the server rely on that).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_server_projects_live_events() {
    use counterd::store::{ChangeStreams, StreamOptions, StreamStart};
    let db = support::TestDb::new("projection").await;
    let store = db.store.clone();
    let schema = Schema::default();
    let start = store.read_position().await.unwrap().lower;
    let comments = db.comments.clone();
    let body = "x".repeat(4096);
    let now = bson::DateTime::now();
    comments
        .insert_one(doc! {"_id": 1, "post_id": "p1", "created_at": now, "body": &body})
        .await
        .unwrap();
    comments
        .update_one(doc! {"_id": 1}, doc! {"$set": {"body": "edited"}})
        .await
        .unwrap();
    comments
        .update_one(doc! {"_id": 1}, doc! {"$set": {"post_id": "p2"}})
        .await
        .unwrap();
    comments
        .update_one(doc! {"_id": 1}, doc! {"$set": {"deleted_at": now}})
        .await
        .unwrap();
    let mut source = store
        .open_stream(StreamOptions {
            start: StreamStart::AtTime(start),
            pre_images: false,
            pipeline: vec![],
            max_await: std::time::Duration::from_millis(200),
        })
        .await
        .unwrap();
    let mut events = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Each event with its charge against the budget, which is its encoded size's.
    let ours = |event: &ChangeEvent| {
        event
            .comment
            .as_ref()
            .is_some_and(|c| c.value == Bson::Int32(1))
            || event
                .full_document
                .as_ref()
                .is_some_and(|d| d.get("_id") == Some(&Bson::Int32(1)))
    };
    while events.len() < 4 && std::time::Instant::now() < deadline {
        let batch = source
            .next_batch(10, std::time::Duration::from_millis(200))
            .await
            .unwrap();
        let read = batch.events.into_iter().zip(batch.costs);
        events.extend(read.filter_map(|(e, cost)| Some((e.ok()?, cost)).filter(|(e, _)| ours(e))));
    }
    assert_eq!(events.len(), 4, "{events:?}");
    for (event, cost) in &events {
        let shown = format!("{event:?}");
        assert!(
            !shown.contains("xxxx") && *cost < counterd::core::cost::event_cost(1024),
            "the application's fields reached counterd (charged {cost} bytes): {shown}"
        );
        if let Some(full) = &event.full_document {
            assert!(!full.contains_key("body"), "{shown}");
        }
    }
    let inserted = events[0].0.clone();
    assert_eq!(
        inserted
            .full_document
            .as_ref()
            .and_then(|d| schema.post_in(d)),
        Some(counterd::core::key::GroupValue::Str("p1".into()))
    );
}
