//! `counterd config --collections`: every collection counterd writes for the current settings,
//! with what it holds, so that an uninstall (or a role, or a backup policy) names them all:
//! the counters and dirty set of every definition, the ledger of every stream, checkpoints,
//! carried batches, leases, reconcile runs and sweeps, for every source (whose bookkeeping
//! has its own prefix). Pure: computed from the settings, nothing is contacted.

use crate::config::{ConfigError, Settings};

/// One collection counterd writes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Owned {
    pub name: String,
    /// The source (stream name) it belongs to.
    pub source: String,
    /// What it holds, in a few words.
    pub holds: String,
}

/// Every collection counterd writes in `settings.database`, each once, the readers' counters
/// first within each source.
pub fn owned(settings: &Settings) -> Result<Vec<Owned>, ConfigError> {
    let mut out: Vec<Owned> = Vec::new();
    for source in settings.sources()? {
        for (name, holds) in source.own_collections() {
            if !out.iter().any(|o| o.name == name) {
                let source = source.stream_name.clone();
                out.push(Owned {
                    name,
                    source,
                    holds,
                });
            }
        }
    }
    Ok(out)
}

/// A mongosh line that drops every collection of `owned` in `database`.
pub fn drop_command(database: &str, owned: &[Owned]) -> String {
    let names: Vec<String> = owned.iter().map(|o| format!("{:?}", o.name)).collect();
    format!(
        "[{}].forEach(c => db.getSiblingDB({database:?}).getCollection(c).drop())",
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml: &str) -> Settings {
        Settings::from_file_text(toml).unwrap()
    }

    fn names(s: &Settings) -> Vec<String> {
        owned(s).unwrap().into_iter().map(|o| o.name).collect()
    }

    #[test]
    fn the_defaults_name_the_eight_collections() {
        assert_eq!(
            names(&Settings::default()),
            [
                "comment_counters",
                "counterd_dirty",
                "counterd_comment_state",
                "counterd_checkpoints",
                "counterd_carried",
                "counterd_leases",
                "counterd_reconcile_runs",
                "counterd_sweeps"
            ]
        );
    }

    #[test]
    fn definitions_sources_and_partitions_add_theirs() {
        let s = settings(
            r#"
[[counters]]
name = "approved"
group_field = "post_id"
condition = { approved = true }
collection = "approved_comment_counters"

[[sources]]
name = "likes"
collection = "likes"
group_field = "post_id"
counters_collection = "like_counters"
"#,
        );
        let all = names(&s);
        for name in [
            "approved_comment_counters",
            "counterd_dirty_approved",
            "like_counters",
            "counterd_likes_checkpoints",
        ] {
            assert!(all.contains(&name.to_string()), "{name} in {all:?}");
        }
        let p = settings("partitions = 2\n");
        assert!(
            names(&p).contains(&"counterd_comment_state_p1of2".to_string()),
            "{:?}",
            names(&p)
        );
    }

    /// The role the doctor checks covers exactly what this lists (a collection missing here
    /// would survive an uninstall; one missing there would be refused at run time).
    #[test]
    fn the_list_is_what_the_doctor_grants() {
        for s in [Settings::default(), settings("partitions = 3\n")] {
            for source in s.sources().unwrap() {
                let expect = crate::doctor::Expectations::from(&source);
                let listed = names(&source);
                for name in &expect.own_collections {
                    assert!(listed.contains(name), "{name} not listed: {listed:?}");
                }
                for name in &listed {
                    assert!(expect.own_collections.contains(name), "{name} not granted");
                }
            }
        }
    }

    #[test]
    fn the_drop_line_is_mongosh() {
        let line = drop_command("app", &owned(&Settings::default()).unwrap()[..2]);
        assert_eq!(
            line,
            r#"["comment_counters", "counterd_dirty"].forEach(c => db.getSiblingDB("app").getCollection(c).drop())"#
        );
    }
}
