//! `counterd doctor`'s checks on real-shaped server replies (`fixtures/doctor/`, MongoDB 7):
//! what the fake test server cannot show (an authenticated user's privileges, pre-images,
//! snapshot reads, a standalone server, a mongos, an old version), each as the line it prints.

use std::path::PathBuf;

use bson::{doc, Bson, Document};
use counterd::config::Settings;
use counterd::doctor::{
    check_all, create_role_command, Expectations, Finding, Level, Replies, RoundTrip,
};

fn fixture(name: &str) -> Bson {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/doctor")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    Bson::try_from(json).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn doc_fixture(name: &str) -> Document {
    match fixture(name) {
        Bson::Document(d) => d,
        other => panic!("{name}: not a document: {other:?}"),
    }
}

fn docs_fixture(name: &str) -> Vec<Document> {
    match fixture(name) {
        Bson::Array(a) => a
            .into_iter()
            .map(|d| d.as_document().unwrap().clone())
            .collect(),
        other => panic!("{name}: not an array: {other:?}"),
    }
}

fn expect() -> Expectations {
    Expectations::from(&Settings::default())
}

/// A healthy MongoDB 7 replica set member: the least-privilege role, the recount index,
/// pre-images on, snapshot reads, good rows, clocks in step.
fn healthy() -> Replies {
    let is_master = doc_fixture("is_master_replica_set.json");
    let at = is_master
        .get_datetime("localTime")
        .unwrap()
        .timestamp_millis();
    Replies {
        build_info: Ok(doc_fixture("build_info_7.json")),
        is_master: Ok(is_master),
        round_trip: RoundTrip {
            sent_at_ms: at - 5,
            received_at_ms: at + 5,
        },
        change_stream: Ok(()),
        connection_status: Ok(doc_fixture("connection_status_least_privilege.json")),
        indexes: Ok(docs_fixture("list_indexes_recount.json")),
        collection: Ok(Some(doc_fixture("list_collections_pre_images.json"))),
        snapshot_reads: true,
        sample: Ok((0..10)
            .map(|i| doc! {"_id": i, "post_id": format!("p{}", i % 3), "created_at": bson::DateTime::now()})
            .collect()),
    }
}

fn finding<'a>(findings: &'a [Finding], check: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.check == check)
        .unwrap_or_else(|| panic!("no {check} finding in {findings:#?}"))
}

#[test]
fn a_healthy_replica_set_has_no_problem_and_no_warning() {
    let findings = check_all(&healthy(), &expect());
    for f in &findings {
        assert_eq!(f.level, Level::Ok, "{}", f.line());
    }
    assert_eq!(
        finding(&findings, "topology").message,
        "replica set rs0; change streams open"
    );
    assert!(finding(&findings, "privileges")
        .message
        .contains("counterd@admin holds every privilege"));
}

#[test]
fn privileges_from_connection_status() {
    let with = |file: &str| {
        let replies = Replies {
            connection_status: Ok(doc_fixture(file)),
            ..healthy()
        };
        finding(&check_all(&replies, &expect()), "privileges").clone()
    };
    // readWrite on the database covers everything (more than needed, not refused).
    assert_eq!(with("connection_status_read_write.json").level, Level::Ok);
    let read_only = with("connection_status_read_only.json");
    assert_eq!(read_only.level, Level::Problem, "{}", read_only.line());
    assert!(
        read_only
            .message
            .contains("insert,update,remove,createIndex on app.comment_counters")
            && !read_only.message.contains("on app.comments;"),
        "{}",
        read_only.message
    );
    let fix = read_only.fix.unwrap();
    assert!(
        fix.starts_with("db.getSiblingDB(\"admin\").grantPrivilegesToRole(\"counterd\""),
        "{fix}"
    );
    assert_eq!(with("connection_status_no_auth.json").level, Level::Skipped);
    // The role printed for the README is exactly what the check requires: a user holding it
    // (the least-privilege fixture was written from it) passes.
    let role = create_role_command(&expect());
    for collection in [
        "comments",
        "comment_counters",
        "counterd_comment_state",
        "counterd_sweeps",
    ] {
        assert!(
            role.contains(&format!("collection: \"{collection}\"")),
            "{role}"
        );
    }
}

#[test]
fn partitions_need_their_own_ledgers() {
    let settings = Settings {
        partitions: 2,
        ..Settings::default()
    };
    let replies = healthy();
    let f = finding(
        &check_all(&replies, &Expectations::from(&settings)),
        "privileges",
    )
    .clone();
    assert_eq!(f.level, Level::Problem, "{}", f.line());
    assert!(
        f.message.contains("counterd_comment_state_p"),
        "{}",
        f.message
    );
}

#[test]
fn topology_standalone_and_mongos() {
    let standalone = Replies {
        is_master: Ok(doc_fixture("is_master_standalone.json")),
        change_stream: Err(std::fs::read_to_string(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/doctor/change_stream_error_standalone.txt"),
        )
        .unwrap()
        .trim()
        .to_string()),
        ..healthy()
    };
    let f = finding(&check_all(&standalone, &expect()), "topology").clone();
    assert_eq!(f.level, Level::Problem);
    assert!(f.fix.unwrap().contains("--replSet rs0"));
    let mongos = Replies {
        is_master: Ok(doc_fixture("is_master_mongos.json")),
        ..healthy()
    };
    let f = finding(&check_all(&mongos, &expect()), "topology").clone();
    assert_eq!(
        (f.level, f.message.as_str()),
        (Level::Ok, "sharded cluster (mongos); change streams open")
    );
}

#[test]
fn version_below_the_tested_one_is_a_warning() {
    let old = Replies {
        build_info: Ok(doc_fixture("build_info_4_4.json")),
        ..healthy()
    };
    let findings = check_all(&old, &expect());
    assert_eq!(finding(&findings, "server").level, Level::Warning);
    // 4.4 has no pre-images even with the option set.
    assert_eq!(finding(&findings, "pre_images").level, Level::Info);
}

#[test]
fn recount_index_shapes() {
    let with = |file: &str| {
        let replies = Replies {
            indexes: Ok(docs_fixture(file)),
            ..healthy()
        };
        finding(&check_all(&replies, &expect()), "recount_index").clone()
    };
    assert_eq!(with("list_indexes_recount.json").level, Level::Ok);
    // Led by the group field only (the partial index with both fields does not count).
    let f = with("list_indexes_group_only.json");
    assert_eq!(f.level, Level::Warning, "{}", f.line());
    assert!(f.message.contains("post_id_1"), "{}", f.message);
    let f = with("list_indexes_none.json");
    assert_eq!(f.level, Level::Warning);
    assert_eq!(
        f.fix.as_deref(),
        Some("db.getSiblingDB(\"app\").getCollection(\"comments\").createIndex({\"post_id\": 1, \"created_at\": 1})")
    );
}

#[test]
fn every_definitions_group_field_needs_its_recount_index_and_its_collections_privileges() {
    let settings: Settings = toml::from_str(
        "[[counters]]\nname = \"per_author\"\ngroup_field = \"author_id\"\ncollection = \"author_counters\"\n\n[[counters]]\nname = \"approved\"\ngroup_field = \"post_id\"\ncondition = { approved = true }\ncollection = \"approved_counters\"\n",
    )
    .unwrap();
    let expect = Expectations::from(&settings);
    for own in [
        "author_counters",
        "counterd_dirty_per_author",
        "approved_counters",
    ] {
        assert!(
            expect.own_collections.iter().any(|c| c == own),
            "{own}: {:?}",
            expect.own_collections
        );
    }
    // The healthy replies index post_id and created_at: the default's and `approved`'s group
    // field is served, `per_author`'s is not. One finding per distinct group field.
    let findings = check_all(&healthy(), &expect);
    let index: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.check == "recount_index")
        .collect();
    assert_eq!(index.len(), 2, "{index:#?}");
    assert_eq!(index[0].level, Level::Ok);
    assert_eq!(index[1].level, Level::Warning);
    assert_eq!(
        index[1].fix.as_deref(),
        Some("db.getSiblingDB(\"app\").getCollection(\"comments\").createIndex({\"author_id\": 1, \"created_at\": 1})")
    );
}

/// A sum's recount adds its field up: the index that serves it holds the field after the
/// group and the creation time; one without it is a warning whose fix adds it.
#[test]
fn a_sums_recount_index_holds_its_field() {
    let settings: Settings = toml::from_str(
        "[[counters]]\nname = \"score\"\ngroup_field = \"post_id\"\nkind = \"sum\"\nfield = \"score\"\nwith_count = true\ncollection = \"post_scores\"\n",
    )
    .unwrap();
    let expect = Expectations::from(&settings);
    // The healthy replies index (post_id, created_at): served, but the $sum reads every row.
    let findings = check_all(&healthy(), &expect);
    let index: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.check == "recount_index")
        .collect();
    assert_eq!(index.len(), 1, "one group field: {index:#?}");
    assert_eq!(index[0].level, Level::Warning, "{}", index[0].line());
    assert!(index[0].message.contains("score"), "{}", index[0].message);
    assert_eq!(
        index[0].fix.as_deref(),
        Some("db.getSiblingDB(\"app\").getCollection(\"comments\").createIndex({\"post_id\": 1, \"created_at\": 1, \"score\": 1})")
    );
    // With the field in the index: served.
    let replies = Replies {
        indexes: Ok(vec![
            bson::doc! {"v": 2, "name": "post_created_score", "key": {"post_id": 1, "created_at": 1, "score": 1}},
        ]),
        ..healthy()
    };
    let findings = check_all(&replies, &expect);
    let f = finding(&findings, "recount_index");
    assert_eq!(f.level, Level::Ok, "{}", f.line());
    assert!(f.message.contains("score"), "{}", f.message);
}

#[test]
fn pre_images_and_snapshot_reads_say_what_their_absence_costs() {
    let plain = Replies {
        collection: Ok(Some(doc_fixture("list_collections_plain.json"))),
        snapshot_reads: false,
        ..healthy()
    };
    let findings = check_all(&plain, &expect());
    let pre = finding(&findings, "pre_images");
    assert_eq!(pre.level, Level::Info);
    assert!(
        pre.message.contains("ledger") && pre.message.contains("collMod"),
        "{}",
        pre.message
    );
    let snap = finding(&findings, "snapshot_reads");
    assert_eq!(snap.level, Level::Info);
    assert!(snap.message.contains("quiet window"), "{}", snap.message);
}

#[test]
fn fields_in_the_sample() {
    let rows = |docs: Vec<Document>| Replies {
        sample: Ok(docs),
        ..healthy()
    };
    let now = bson::DateTime::now();
    // A misspelled group field: no row has it; the message lists the fields seen.
    let f = check_all(
        &rows(vec![doc! {"_id": 1, "postId": "a", "created_at": now}]),
        &expect(),
    );
    let group = f
        .iter()
        .find(|f| f.check == "fields" && f.level == Level::Problem)
        .unwrap();
    assert!(group.message.contains("postId"), "{}", group.message);
    // A double post id and a missing date: warnings with counts.
    let f = check_all(
        &rows(vec![
            doc! {"_id": 1, "post_id": 1.5, "created_at": now},
            doc! {"_id": 2, "post_id": "a"},
        ]),
        &expect(),
    );
    let lines: Vec<String> = f
        .iter()
        .filter(|f| f.check == "fields")
        .map(Finding::line)
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARNING") && l.contains("Double")),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("WARNING") && l.contains("1 of 2 sampled rows have no date")),
        "{lines:#?}"
    );
    // soft_delete = "true" with strings in the field.
    let settings = Settings {
        soft_delete: counterd::config::SoftDeleteRule::True,
        soft_delete_field: "deleted".into(),
        ..Settings::default()
    };
    let f = check_all(
        &rows(vec![
            doc! {"_id": 1, "post_id": "a", "created_at": now, "deleted": "yes"},
        ]),
        &Expectations::from(&settings),
    );
    assert!(
        f.iter()
            .any(|f| f.level == Level::Warning && f.message.contains("non-boolean")),
        "{f:#?}"
    );
    // No rows yet: skipped, with the reason.
    let f = check_all(&rows(vec![]), &expect());
    assert!(f
        .iter()
        .any(|f| f.check == "fields" && f.level == Level::Skipped));
}
