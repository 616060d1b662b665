//! The `[[counters]]` settings: counter definitions written as TOML, checked and turned into
//! [`Definitions`] (the default one first, from today's `group_field` and
//! `counters_collection`).
//!
//! Every mistake is a configuration error naming the entry and the setting
//! (`counters[1].condition`), found when the file is loaded, never when the first event arrives:
//! a duplicate name, a group field that is not a usable path, a condition outside the subset the
//! classifier mirrors, a collection another counter or the source already uses.

use bson::{Bson, Document};
use serde::{Deserialize, Serialize};

use super::validate::{bad, collection_name_problem, in_entry, PATH_SHAPE};
use super::{ConfigError, Settings};
use crate::core::condition::Condition;
use crate::core::definition::{Definition, Definitions, Kind, DEFAULT_COUNTER, ROWS_SUFFIX};
use crate::core::schema::bad_path;

/// `kind` of a `[[counters]]` entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CounterKind {
    /// One per counted row.
    #[default]
    Count,
    /// The sum of `field` over the counted rows.
    Sum,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// One `[[counters]]` entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CounterSetting {
    /// Its name: `--counter NAME`, the `counter` label of metrics, a line of `status` (letters,
    /// digits, `_` and `-`; `default` is the definition of the settings above).
    pub name: String,
    /// The field (a dotted path) that groups rows: one counter per value.
    pub group_field: String,
    /// Only rows matching this filter count, in a subset of MongoDB's query language: equality,
    /// `$eq`, `$ne`, `$in`, `$exists`, `$gt`/`$gte`/`$lt`/`$lte` on numbers and dates
    /// (`condition = { approved = true }`, `condition = { score = { "$gte" = 3 } }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<toml::Table>,
    /// The collection its counters live in (not shared with another counter).
    pub collection: String,
    /// `count` (the default: one per row) or `sum` (the value of `field` per row).
    #[serde(default, skip_serializing_if = "is_default")]
    pub kind: CounterKind,
    /// The summed field of a `sum` (a dotted path): integers stay exact 64-bit integers, any
    /// double makes the sum a double; a missing field adds 0, a non-number adds 0 and is
    /// reported as a bad event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// A `sum` also keeps the number of rows it adds up in the same counter document
    /// (`rows.count` beside the sum's `count`): an average is two exact numbers in one read.
    #[serde(default, skip_serializing_if = "is_default")]
    pub with_count: bool,
}

impl Settings {
    /// The counter definitions: the default one (`group_field`, `counters_collection`) first,
    /// then every `[[counters]]` entry. `Err` names the entry and the setting that is wrong.
    pub fn definitions(&self) -> Result<Definitions, ConfigError> {
        let mut all = vec![self.first_definition()];
        for (i, entry) in self.counters.iter().enumerate() {
            let named = |e| in_entry("counters", i, e);
            let (definition, rows) = self.definition_of(entry, &all).map_err(named)?;
            all.push(definition);
            // The row count right after its sum: its counters share the sum's documents.
            all.extend(rows);
        }
        let first = all.remove(0);
        Ok(Definitions::new(first, all))
    }

    /// The definition of `group_field` and `counters_collection`, named `counter_name`: what
    /// a configuration meant before definitions existed.
    pub(super) fn first_definition(&self) -> Definition {
        Definition {
            name: self.counter_name.clone(),
            group: self.group_field.clone(),
            condition: Condition::default(),
            collection: self.counters_collection.clone(),
            kind: Kind::Count,
        }
    }

    /// The definition of a `[[counters]]` entry (after the definitions `before` it, the
    /// default first), and its sum's row count where it asks for one (`with_count`). `Err`
    /// names the setting that is wrong (the caller names the entry).
    fn definition_of(
        &self,
        entry: &CounterSetting,
        before: &[Definition],
    ) -> Result<(Definition, Option<Definition>), ConfigError> {
        self.check_entry_name(entry, before)?;
        if bad_path(&entry.group_field) {
            return Err(bad("group_field", &entry.group_field, PATH_SHAPE));
        }
        let condition = condition_of(entry)?;
        let kind = entry_kind(entry)?;
        if entry.with_count
            && self.counters.iter().any(|e| {
                e.name == format!("{}{ROWS_SUFFIX}", entry.name)
                    || e.name == format!("{}{ROWS_SUFFIX}", self.counter_name)
            })
        {
            return Err(bad(
                "name",
                &entry.name,
                format!("with_count names the sum's row count `{}{ROWS_SUFFIX}`, which another counter uses", entry.name),
            ));
        }
        self.check_entry_collection(entry, before)?;
        let definition = Definition {
            name: entry.name.clone(),
            group: entry.group_field.clone(),
            condition,
            collection: entry.collection.clone(),
            kind,
        };
        // The sum's row count: the same rows and documents, counted.
        let rows = entry.with_count.then(|| Definition {
            name: format!("{}{ROWS_SUFFIX}", entry.name),
            kind: Kind::Rows {
                of: entry.name.clone(),
            },
            ..definition.clone()
        });
        Ok((definition, rows))
    }

    /// The entry's name: well formed, and no other counter's (`before`: the definitions
    /// before it).
    fn check_entry_name(
        &self,
        entry: &CounterSetting,
        before: &[Definition],
    ) -> Result<(), ConfigError> {
        if !valid_name(&entry.name) {
            return Err(bad(
                "name",
                &entry.name,
                "expected letters, digits, `_` or `-` (it is a metric label and a flag value)",
            ));
        }
        if entry.name == DEFAULT_COUNTER || before.iter().any(|d| d.name == entry.name) {
            return Err(bad(
                "name",
                &entry.name,
                format!(
                    "another counter is already named `{}` (`{DEFAULT_COUNTER}` is the one of group_field and counters_collection)",
                    entry.name
                ),
            ));
        }
        Ok(())
    }

    /// The entry's collection: a valid name, used by nothing else (`before`: the definitions
    /// before it).
    fn check_entry_collection(
        &self,
        entry: &CounterSetting,
        before: &[Definition],
    ) -> Result<(), ConfigError> {
        if let Some(problem) = collection_name_problem(&entry.collection) {
            return Err(bad("collection", &entry.collection, problem));
        }
        let taken = entry.collection == self.comments_collection
            || before.iter().any(|d| d.collection == entry.collection)
            || (!self.collection_prefix.is_empty()
                && entry.collection.starts_with(&self.collection_prefix));
        if taken {
            return Err(bad(
                "collection",
                &entry.collection,
                "already used: by comments_collection, counters_collection, another counter, or counterd's own collections (collection_prefix)",
            ));
        }
        Ok(())
    }
}

/// The entry's condition (none: every row counts).
fn condition_of(entry: &CounterSetting) -> Result<Condition, ConfigError> {
    let Some(table) = &entry.condition else {
        return Ok(Condition::default());
    };
    let shown = toml::Value::Table(table.clone()).to_string();
    let invalid = |message: String| bad("condition", &shown, message);
    let filter = to_document(table).map_err(invalid)?;
    Condition::parse(&filter).map_err(|e| invalid(e.to_string()))
}

/// The [`Kind`] an entry asks for; `Err` names the setting when `kind`, `field` and
/// `with_count` do not fit together.
fn entry_kind(entry: &CounterSetting) -> Result<Kind, ConfigError> {
    match (entry.kind, &entry.field) {
        (CounterKind::Count, None) if entry.with_count => Err(bad(
            "with_count",
            "true",
            "with_count needs kind = \"sum\" (a count already is the number of rows)",
        )),
        (CounterKind::Count, None) => Ok(Kind::Count),
        (CounterKind::Count, Some(field)) => Err(bad(
            "field",
            field,
            "a field is summed only with kind = \"sum\"",
        )),
        (CounterKind::Sum, None) => Err(bad(
            "field",
            "",
            "kind = \"sum\" needs the field to add up (field = \"rating\")",
        )),
        (CounterKind::Sum, Some(field)) if bad_path(field) => Err(bad("field", field, PATH_SHAPE)),
        (CounterKind::Sum, Some(field)) => Ok(Kind::Sum {
            field: field.clone(),
        }),
    }
}

pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A TOML table as the filter document it spells: strings, integers (Int64), floats, booleans,
/// dates (TOML offset date-times) and nested tables and arrays; `{ "$oid" = "<24 hex>" }` is an
/// ObjectId, as in extended JSON.
fn to_document(table: &toml::Table) -> Result<Document, String> {
    table
        .iter()
        .map(|(key, value)| Ok((key.clone(), to_bson(value)?)))
        .collect()
}

fn to_bson(value: &toml::Value) -> Result<Bson, String> {
    Ok(match value {
        toml::Value::String(s) => Bson::String(s.clone()),
        toml::Value::Integer(i) => Bson::Int64(*i),
        toml::Value::Float(f) => Bson::Double(*f),
        toml::Value::Boolean(b) => Bson::Boolean(*b),
        toml::Value::Datetime(d) => {
            let text = d.to_string();
            let parsed = chrono::DateTime::parse_from_rfc3339(&text).map_err(|_| {
                format!(
                    "date {text}: expected a full date-time with an offset (2024-01-01T00:00:00Z)"
                )
            })?;
            Bson::DateTime(bson::DateTime::from_millis(parsed.timestamp_millis()))
        }
        toml::Value::Array(values) => {
            Bson::Array(values.iter().map(to_bson).collect::<Result<_, _>>()?)
        }
        toml::Value::Table(t) => match (t.len(), t.get("$oid")) {
            (1, Some(toml::Value::String(hex))) => bson::oid::ObjectId::parse_str(hex)
                .map(Bson::ObjectId)
                .map_err(|_| format!("`$oid` {hex:?}: expected 24 hex digits"))?,
            _ => Bson::Document(to_document(t)?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(counters: &str) -> Result<Definitions, ConfigError> {
        let settings: Settings = toml::from_str(counters).expect("parses");
        settings.definitions()
    }

    fn invalid_name(result: Result<Definitions, ConfigError>) -> String {
        match result {
            Err(ConfigError::Invalid { name, .. }) => name,
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn without_counters_the_settings_are_the_one_default_definition() {
        let all = Settings::default().definitions().unwrap();
        assert_eq!(all.len(), 1);
        let d = all.iter().next().unwrap().1;
        assert_eq!(
            (d.name.as_str(), d.group.as_str(), d.collection.as_str()),
            ("default", "post_id", "comment_counters")
        );
        assert!(d.condition.is_empty());
    }

    #[test]
    fn counters_follow_the_default_in_order_with_their_conditions() {
        let all = with(
            r#"
            [[counters]]
            name = "approved"
            group_field = "post_id"
            condition = { approved = true, score = { "$gte" = 3 }, at = { "$lt" = 2024-01-01T00:00:00Z } }
            collection = "approved_counters"

            [[counters]]
            name = "per_author"
            group_field = "author.id"
            collection = "author_counters"
            "#,
        )
        .unwrap();
        assert_eq!(all.names(), ["default", "approved", "per_author"]);
        let (_, approved) = all.by_name("approved").unwrap();
        assert!(approved.condition.matches(&bson::doc! {
            "approved": true, "score": 3, "at": bson::DateTime::from_millis(0)
        }));
        assert!(!approved
            .condition
            .matches(&bson::doc! {"approved": true, "score": 2}));
        assert_eq!(all.by_name("per_author").unwrap().1.group, "author.id");
    }

    #[test]
    fn bad_definitions_name_the_entry_and_the_setting() {
        // The second entry with one field (`key`) set to `value`, the others valid.
        let entry = |key: &str, value: &str| {
            let valid = [
                ("name", r#""b""#),
                ("group_field", r#""post_id""#),
                ("collection", r#""b_counters""#),
            ];
            let mut text = "[[counters]]\nname = \"a\"\ngroup_field = \"post_id\"\ncollection = \"a_counters\"\n[[counters]]\n".to_string();
            for (k, v) in valid.into_iter().filter(|(k, _)| *k != key) {
                text += &format!("{k} = {v}\n");
            }
            text + &format!("{key} = {value}\n")
        };
        let cases = [
            ("name", r#""a""#),
            ("name", r#""default""#),
            ("name", r#""b c""#),
            ("group_field", r#""a..b""#),
            ("group_field", r#""$x""#),
            ("condition", r#"{ "$or" = [] }"#),
            ("condition", r#"{ x = { "$regex" = "a" } }"#),
            ("condition", r#"{ x = { "$gt" = "a" } }"#),
            ("collection", r#""a_counters""#),
            ("collection", r#""comment_counters""#),
            ("collection", r#""comments""#),
            ("collection", r#""counterd_dirty""#),
            ("collection", r#""""#),
        ];
        for (setting, value) in cases {
            let text = entry(setting, value);
            let name = invalid_name(with(&text));
            assert_eq!(name, format!("counters[1].{setting}"), "{text}");
        }
    }

    #[test]
    fn a_sum_names_its_field_and_a_count_does_not() {
        let all = with(
            r#"
            [[counters]]
            name = "rating_sum"
            group_field = "product_id"
            kind = "sum"
            field = "review.rating"
            with_count = true
            collection = "product_ratings"
            "#,
        )
        .unwrap();
        let (ix, sum) = all.by_name("rating_sum").unwrap();
        assert_eq!(sum.kind.field(), Some("review.rating"));
        assert!(sum.read_paths().contains(&"review.rating"));
        // with_count: the sum's row count, right after it, in the same collection.
        let (rows_ix, rows) = all.by_name("rating_sum_rows").unwrap();
        assert_eq!(rows_ix.0, ix.0 + 1);
        assert_eq!(rows.collection, "product_ratings");
        assert_eq!(
            (rows.group.as_str(), rows.kind.field()),
            ("product_id", None)
        );
        assert_eq!(rows.kind.field_prefix(), "rows.");
        let entry = |kind: &str, field: &str, with_count: &str| {
            format!("[[counters]]\nname = \"s\"\ngroup_field = \"post_id\"\ncollection = \"s_counters\"\n{kind}\n{field}\n{with_count}\n")
        };
        let cases = [
            (entry("kind = \"sum\"", "", ""), "counters[0].field"),
            (
                entry("kind = \"sum\"", "field = \"a..b\"", ""),
                "counters[0].field",
            ),
            (entry("", "field = \"rating\"", ""), "counters[0].field"),
            (entry("", "", "with_count = true"), "counters[0].with_count"),
        ];
        for (text, setting) in cases {
            assert_eq!(invalid_name(with(&text)), setting, "{text}");
        }
        let unknown = entry("kind = \"average\"", "field = \"rating\"", "");
        assert!(
            toml::from_str::<Settings>(&unknown).is_err(),
            "an unknown kind is refused"
        );
    }

    #[test]
    fn dates_in_a_condition_stay_dates_through_the_loader() {
        let old = "[[counters]]\nname = \"old\"\ngroup_field = \"post_id\"\ncondition = { at = { \"$lt\" = 2024-01-01T00:00:00Z } }\ncollection = \"old_counters\"\n";
        let settings = Settings::from_file_text(old).unwrap();
        let all = settings.definitions().unwrap();
        let (_, old) = all.by_name("old").unwrap();
        assert!(old
            .condition
            .matches(&bson::doc! {"at": bson::DateTime::from_millis(0)}));
        assert!(!old
            .condition
            .matches(&bson::doc! {"at": "2020-01-01T00:00:00Z"}));
    }

    /// A counter grouped by another field than the post is written by several partitions,
    /// each under its own guard (see `crate::store::Writer`).
    #[test]
    fn counters_are_accepted_beside_partitions() {
        let text = "partitions = 2\n[[counters]]\nname = \"a\"\ngroup_field = \"author\"\ncollection = \"a_counters\"\n";
        let all = with(text).unwrap();
        assert_eq!(all.extra()[0].group, "author");
        // A source inherits `partitions`: its own counters are accepted beside them too.
        let text = "partitions = 2\n[[sources]]\nname = \"likes\"\ncollection = \"likes\"\ngroup_field = \"post_id\"\ncounters_collection = \"like_counters\"\n[[sources.counters]]\nname = \"likes_by_user\"\ngroup_field = \"user_id\"\ncollection = \"user_likes\"\n";
        let settings: Settings = toml::from_str(text).expect("parses");
        let sources = settings.sources().unwrap();
        assert_eq!(sources[1].partitions, 2);
        let likes = sources[1].definitions().unwrap();
        assert_eq!(likes.extra()[0].group, "user_id");
    }

    #[test]
    fn object_ids_are_written_as_in_extended_json() {
        let all = with(
            r#"
            [[counters]]
            name = "by_site"
            group_field = "post_id"
            condition = { site = { "$oid" = "0123456789abcdef01234567" } }
            collection = "site_counters"
            "#,
        )
        .unwrap();
        let oid = bson::oid::ObjectId::parse_str("0123456789abcdef01234567").unwrap();
        assert!(all.extra()[0].condition.matches(&bson::doc! {"site": oid}));
    }
}
