//! Counter definitions at the command line: `[[counters]]` entries are listed by `counterd
//! config`, a bad one is a configuration error (exit 2) naming the entry and the setting, and a
//! configuration without any is exactly today's single default counter. None of these contact
//! MongoDB but `status`, which lists every counter beside the stream it reads.

mod support;

use std::process::{Command, Output};

fn counterd(config: &str, args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counterd.toml");
    std::fs::write(&path, config).unwrap();
    Command::new(env!("CARGO_BIN_EXE_counterd"))
        .arg("--config")
        .arg(&path)
        .args(args)
        .env_remove("COUNTERD_CONFIG")
        .output()
        .unwrap()
}

const THREE: &str = r#"
database = "app"

[[counters]]
name = "approved"
group_field = "post_id"
condition = { approved = true }
collection = "approved_counters"

[[counters]]
name = "per_author"
group_field = "author.id"
collection = "author_counters"
"#;

#[test]
fn config_lists_every_definition_the_default_first() {
    let o = counterd(THREE, &["config"]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .collect();
    assert_eq!(listed.len(), 3, "{text}");
    assert!(
        listed[0].starts_with("default: per `post_id`") && listed[0].contains("comment_counters")
    );
    assert!(
        listed[1].starts_with("approved: per `post_id` where") && listed[1].contains("approved")
    );
    assert!(listed[2].starts_with("per_author: per `author.id`, in `author_counters`"));

    let o = counterd(THREE, &["config", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = json["definitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["default", "approved", "per_author"]);
    assert_eq!(
        json["definitions"][1]["condition"],
        serde_json::json!({"$and": [{"approved": {"$eq": true}}]})
    );
}

#[test]
fn an_old_configuration_is_the_single_default_counter() {
    let o = counterd(
        "group_field = \"meta.post\"\ncounters_collection = \"post_counts\"\n",
        &["config"],
    );
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    let listed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .collect();
    assert_eq!(
        listed,
        ["default: per `meta.post`, in `post_counts`"],
        "{text}"
    );
}

#[test]
fn a_bad_definition_exits_2_naming_the_entry_and_the_setting() {
    let second = |name: &str, group: &str, condition: &str, collection: &str| {
        format!(
            "{THREE}\n[[counters]]\nname = \"{name}\"\ngroup_field = \"{group}\"\n{condition}\ncollection = \"{collection}\"\n"
        )
    };
    for (config, setting) in [
        (second("approved", "post_id", "", "x"), "counters[2].name"),
        (second("x", "a..b", "", "x"), "counters[2].group_field"),
        (
            second("x", "post_id", "condition = { \"$or\" = [{ a = 1 }] }", "x"),
            "counters[2].condition",
        ),
        (
            second("x", "post_id", "", "approved_counters"),
            "counters[2].collection",
        ),
    ] {
        let o = counterd(&config, &["config", "--check"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{config}\n{err}");
        assert!(
            err.contains(setting) && err.contains("counterd.toml"),
            "{setting}: {err}"
        );
    }
}

#[test]
fn the_printed_configuration_reads_back_with_the_same_definitions() {
    let dated = format!(
        "{THREE}\n[[counters]]\nname = \"old\"\ngroup_field = \"post_id\"\ncondition = {{ at = {{ \"$lt\" = 2024-01-01T00:00:00Z }} }}\ncollection = \"old_counters\"\n"
    );
    let listed = |o: &Output| -> Vec<String> {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("#   ").map(String::from))
            .collect()
    };
    let first = counterd(&dated, &["config"]);
    assert!(first.status.success(), "{first:?}");
    let printed: String = String::from_utf8_lossy(&first.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{}\n", l.split("  #").next().unwrap()))
        .collect();
    let again = counterd(&printed, &["config"]);
    assert!(again.status.success(), "{printed}\n{again:?}");
    assert_eq!(listed(&again), listed(&first));
    assert!(
        listed(&first)[3].contains("DateTime"),
        "{:?}",
        listed(&first)
    );
}

#[test]
fn commands_name_their_counter_and_refuse_unknown_ones_before_contacting_anything() {
    // An unreachable server: a refusal must come before any connection is tried.
    let config =
        format!("mongodb_uri = \"mongodb://127.0.0.1:1/\"\nconnect_timeout = \"1s\"\n{THREE}");
    for command in [
        vec!["get", "1"],
        vec!["dirty"],
        vec!["verify"],
        vec!["reconcile", "--once"],
    ] {
        let mut args = command.clone();
        args.extend(["--counter", "nope"]);
        let o = counterd(&config, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{command:?}: {err}");
        assert!(
            err.contains("--counter nope") && err.contains("default, approved, per_author"),
            "{command:?}: {err}"
        );
        // A known counter goes on to contact the (unreachable) server: no usage error.
        let mut args = command.clone();
        args.extend(["--counter", "approved"]);
        let o = counterd(&config, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(2), "{command:?}: {err}");
        assert_ne!(o.status.code(), Some(0), "{command:?}: {err}");
    }
}

#[tokio::test]
async fn status_lists_every_counter_with_its_backlog() {
    let t = support::TestDb::new("status_counters").await;
    let config = format!(
        "mongodb_uri = \"{}\"\ndatabase = \"{}\"\n{THREE}",
        t.uri, t.name
    )
    .replace("database = \"app\"\n", "");
    let o = counterd(&config, &["status", "--json"]);
    assert!(o.status.success(), "{o:?}");
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let counters: Vec<(&str, &str, bool)> = json["counters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap(),
                c["collection"].as_str().unwrap(),
                c["kept"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        counters,
        [
            ("default", "comment_counters", true),
            ("approved", "approved_counters", true),
            ("per_author", "author_counters", true),
        ]
    );
    let o = counterd(&config, &["status"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("counter           default: per `post_id`, in `comment_counters`, 0 dirty\n")
            && text.contains(
                "counter           per_author: per `author.id`, in `author_counters`, 0 dirty\n"
            ),
        "{text}"
    );
}
