//! The `[[sources]]` settings: counters over another collection than `comments_collection`
//! (likes per post beside comments per post).
//!
//! A change stream and a ledger follow one collection, so a second source collection is a
//! second pipeline: its own stream, checkpoint, ledger, leases and dirty sets. Rather than
//! teach every component about several collections, a source is *settings*: [`Settings::sources`]
//! derives, for each `[[sources]]` entry, the settings of a configuration that had that
//! collection as its `comments_collection`, with its own `collection_prefix` (so its bookkeeping
//! never mixes with another source's) and its own stream name, and every other setting shared.
//! The daemon runs each derived configuration's streams in one process, under one memory
//! budget; the commands pick the source that holds the counter they are asked about. The code
//! does not grow per source: a source is data flowing through the same rooms.
//!
//! A source's first counter is named after the source (`--counter likes`); more counters over
//! its rows are its own `[[sources.counters]]` entries.

use serde::{Deserialize, Serialize};

use super::validate::{bad, collection_name_problem, in_entry};
use super::{ConfigError, CounterSetting, Settings, SoftDeleteRule, SoftDeleteValue};

/// One `[[sources]]` entry: another collection whose rows are counted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSetting {
    /// Its name: the name of its first counter (`--counter NAME`, the `counter` label of
    /// metrics), of its stream (the `stream` label, leases, checkpoints) and the part of
    /// counterd's own collection names that keeps its bookkeeping apart
    /// (`<collection_prefix><name>_…`).
    pub name: String,
    /// The collection of rows to count (as `comments_collection` is for the comments).
    pub collection: String,
    /// The field (a dotted path) that groups rows: one counter per value.
    pub group_field: String,
    /// The collection its first counter's documents live in.
    pub counters_collection: String,
    /// Field holding the row's creation time (default: the top-level `created_field`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_field: Option<String>,
    /// How a row is soft-deleted (default: the top-level `soft_delete`, `soft_delete_field` and
    /// `soft_delete_values`; `"never"` when the collection has no soft delete).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_delete: Option<SoftDeleteRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_delete_field: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft_delete_values: Option<Vec<SoftDeleteValue>>,
    /// More counters over this source's rows (as the top-level `[[counters]]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counters: Vec<CounterSetting>,
}

impl Settings {
    /// Every source of the configuration as settings of its own: these settings first (the
    /// comments), then one per `[[sources]]` entry (see the module documentation). Each has no
    /// sources of its own. `Err` names the entry and the setting that is wrong.
    pub fn sources(&self) -> Result<Vec<Settings>, ConfigError> {
        let mut all = vec![Settings {
            sources: Vec::new(),
            ..self.clone()
        }];
        for (i, entry) in self.sources.iter().enumerate() {
            // Its checks, and the source's own, named as its entry's.
            let named = |e| in_entry("sources", i, e);
            check_entry(entry, &all).map_err(named)?;
            let source = self.source_of(entry);
            source.validate_own().map_err(named)?;
            all.push(source);
        }
        check_namespace(&all)?;
        Ok(all)
    }

    /// The settings of source `entry`: its own where it has them, these otherwise.
    fn source_of(&self, entry: &SourceSetting) -> Settings {
        Settings {
            comments_collection: entry.collection.clone(),
            counters_collection: entry.counters_collection.clone(),
            group_field: entry.group_field.clone(),
            created_field: own_or(&entry.created_field, &self.created_field),
            soft_delete: own_or(&entry.soft_delete, &self.soft_delete),
            soft_delete_field: own_or(&entry.soft_delete_field, &self.soft_delete_field),
            soft_delete_values: own_or(&entry.soft_delete_values, &self.soft_delete_values),
            collection_prefix: format!("{}{}_", self.collection_prefix, entry.name),
            stream_name: entry.name.clone(),
            counter_name: entry.name.clone(),
            counters: entry.counters.clone(),
            sources: Vec::new(),
            ..self.clone()
        }
    }

    /// The source named `name` (its stream name: `stream_name` for the comments), as settings
    /// of its own. A usage mistake lists the names there are.
    pub fn source_named(&self, name: &str) -> Result<Settings, ConfigError> {
        let sources = self.sources()?;
        let names: Vec<String> = sources.iter().map(|s| s.stream_name.clone()).collect();
        sources
            .into_iter()
            .find(|s| s.stream_name == name)
            .ok_or_else(|| {
                let message = format!("no such source; configured: {}", names.join(", "));
                ConfigError::invalid("--source", "flag --source", name, message)
            })
    }

    /// The source whose definitions include the counter `name`, with the counter's place.
    pub fn source_of_counter(
        &self,
        name: &str,
    ) -> Result<Option<(Settings, crate::core::key::CounterIx)>, ConfigError> {
        for source in self.sources()? {
            if let Some((ix, _)) = source.definitions()?.by_name(name) {
                return Ok(Some((source, ix)));
            }
        }
        Ok(None)
    }

    /// Every counter's name, across sources, in order (for messages).
    pub fn counter_names(&self) -> Result<Vec<String>, ConfigError> {
        let mut names = Vec::new();
        for source in self.sources()? {
            names.extend(source.definitions()?.names().into_iter().map(String::from));
        }
        Ok(names)
    }
}

/// A source's own value of a setting, or the shared one.
fn own_or<T: Clone>(own: &Option<T>, shared: &T) -> T {
    own.as_ref().unwrap_or(shared).clone()
}

/// The checks of a `[[sources]]` entry that its own settings cannot make: its name and
/// collections, and that no source before it (`all`) uses them.
fn check_entry(entry: &SourceSetting, all: &[Settings]) -> Result<(), ConfigError> {
    if !super::counters::valid_name(&entry.name) {
        return Err(bad(
            "name",
            &entry.name,
            "expected letters, digits, `_` or `-` (it names a counter, a stream and collections)",
        ));
    }
    for (field, value) in [
        ("collection", &entry.collection),
        ("counters_collection", &entry.counters_collection),
    ] {
        if let Some(problem) = collection_name_problem(value) {
            return Err(bad(field, value, problem));
        }
    }
    if all
        .iter()
        .any(|s| s.comments_collection == entry.collection)
    {
        return Err(bad(
                "collection",
                &entry.collection,
                "already counted: by comments_collection or another source (one source per collection; add counters to it instead)",
            ));
    }
    if all.iter().any(|s| s.stream_name == entry.name) {
        return Err(bad(
            "name",
            &entry.name,
            "already the name of another source's stream (stream_name or another source)",
        ));
    }
    Ok(())
}

/// Counter names and collections are one namespace across sources: `--counter NAME`
/// finds one definition, and no two counters write one collection.
fn check_namespace(all: &[Settings]) -> Result<(), ConfigError> {
    let mut seen: Vec<(String, String)> = Vec::new();
    for source in all {
        for (_, d) in source.definitions()?.iter() {
            if seen.iter().any(|(name, _)| *name == d.name) {
                return Err(bad(
                    "sources",
                    &d.name,
                    "two counters share this name (a source's first counter is named after the source)",
                ));
            }
            // A sum's row count (`with_count`) lives in its sum's documents, by design.
            let shared = matches!(d.kind, crate::core::definition::Kind::Rows { .. });
            if (!shared && seen.iter().any(|(_, c)| *c == d.collection))
                || all.iter().any(|s| s.comments_collection == d.collection)
            {
                return Err(bad(
                    "sources",
                    &d.collection,
                    "this collection is used twice: by two counters, or as a counter collection and a source",
                ));
            }
            seen.push((d.name.clone(), d.collection.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(text: &str) -> Result<Vec<Settings>, ConfigError> {
        let settings: Settings = toml::from_str(text).expect("parses");
        settings.validate()?;
        settings.sources()
    }

    fn invalid(result: Result<Vec<Settings>, ConfigError>) -> (String, String) {
        match result {
            Err(ConfigError::Invalid { name, value, .. }) => (name, value),
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    const LIKES: &str = r#"
[[sources]]
name = "likes"
collection = "likes"
group_field = "post_id"
counters_collection = "like_counters"
soft_delete = "never"
[[sources.counters]]
name = "likes_by_user"
group_field = "user_id"
collection = "likes_by_user"
"#;

    #[test]
    fn a_source_is_the_settings_of_its_own_collection_with_its_own_bookkeeping() {
        let all = with(LIKES).unwrap();
        assert_eq!(all.len(), 2);
        let (comments, likes) = (&all[0], &all[1]);
        assert!(comments.sources.is_empty() && likes.sources.is_empty());
        assert_eq!(comments.comments_collection, "comments");
        assert_eq!(likes.comments_collection, "likes");
        assert_eq!(likes.counters_collection, "like_counters");
        assert_eq!(likes.stream_name, "likes");
        assert_eq!(likes.collection_prefix, "counterd_likes_");
        assert_eq!(likes.soft_delete, SoftDeleteRule::Never);
        assert_eq!(likes.created_field, comments.created_field, "inherited");
        assert_eq!(likes.reconcile_interval, comments.reconcile_interval);
        let names = likes.definitions().unwrap();
        assert_eq!(names.names(), ["likes", "likes_by_user"]);
        let settings: Settings = toml::from_str(LIKES).unwrap();
        assert_eq!(
            settings.counter_names().unwrap(),
            ["default", "likes", "likes_by_user"]
        );
        let (source, ix) = settings
            .source_of_counter("likes_by_user")
            .unwrap()
            .unwrap();
        assert_eq!((source.stream_name.as_str(), ix.0), ("likes", 1));
        assert!(settings.source_of_counter("nope").unwrap().is_none());
        assert_eq!(settings.source_named("likes").unwrap(), all[1]);
        assert_eq!(settings.source_named("comments").unwrap(), all[0]);
        assert!(settings.source_named("nope").is_err());
    }

    #[test]
    fn dates_in_a_source_counters_condition_stay_dates_through_the_loader() {
        let old = "[[sources.counters]]\nname = \"old\"\ngroup_field = \"post_id\"\ncondition = { at = { \"$lt\" = 2024-01-01T00:00:00Z } }\ncollection = \"old_likes\"\n";
        let settings = Settings::from_file_text(&format!("{LIKES}{old}")).unwrap();
        let likes = settings.source_named("likes").unwrap();
        let all = likes.definitions().unwrap();
        let (_, old) = all.by_name("old").unwrap();
        let then = bson::DateTime::from_millis(0);
        assert!(old.condition.matches(&bson::doc! {"at": then}));
        assert!(!old
            .condition
            .matches(&bson::doc! {"at": "2020-01-01T00:00:00Z"}));
    }

    #[test]
    fn a_source_counts_in_the_process_streams_and_budget() {
        let settings: Settings = toml::from_str(LIKES).unwrap();
        assert_eq!(settings.streams_per_process(), 2);
        assert_eq!(settings.sources().unwrap()[1].streams_per_process(), 1);
    }

    #[test]
    fn mistakes_name_the_entry_and_the_setting() {
        let entry = |name: &str, collection: &str, counters: &str| {
            format!(
                "[[sources]]\nname = \"{name}\"\ncollection = \"{collection}\"\ngroup_field = \"post_id\"\ncounters_collection = \"{counters}\"\n"
            )
        };
        for (name, collection, counters, setting) in [
            ("li kes", "likes", "lc", "name"),
            ("likes", "comments", "lc", "collection"),
            // The comments' stream is named comments.
            ("comments", "likes", "lc", "name"),
            ("likes", "li$kes", "lc", "collection"),
        ] {
            let text = entry(name, collection, counters);
            let got = invalid(with(&text)).0;
            assert_eq!(got, format!("sources[0].{setting}"), "{text}");
        }
        // Counter names and collections are one namespace: named as `sources`, with the value.
        for (name, counters, value) in [
            ("likes", "comment_counters", "comment_counters"),
            ("likes", "comments", "comments"),
            ("default", "lc", "default"),
        ] {
            let text = entry(name, "likes", counters);
            let got = invalid(with(&text));
            assert_eq!(got, ("sources".into(), value.into()), "{text}");
        }
        let two = format!(
            "{}{}",
            entry("likes", "likes", "lc"),
            entry("likes2", "likes", "lc2")
        );
        assert_eq!(invalid(with(&two)).0, "sources[1].collection");
        let bad_field = format!("{}created_field = \"$x\"\n", entry("likes", "likes", "lc"));
        assert_eq!(invalid(with(&bad_field)).0, "sources[0].created_field");
    }
}
