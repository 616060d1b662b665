//! Loading settings: defaults ← TOML file ← `COUNTERD_*` environment ← flags, each value's
//! origin kept for messages, every value type-checked against its default.

use std::collections::BTreeMap;
use std::path::Path;

use super::{ConfigError, Settings};

/// A value given on the command line: a named flag (`--mongodb-uri`) or `--set name=value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Override {
    pub name: String,
    pub value: String,
    /// How the operator gave it, for messages: `flag --mongodb-uri`, `flag --set`.
    pub origin: String,
}

/// Settings with where each value came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Loaded {
    pub settings: Settings,
    /// Setting name → `default`, `file <path>`, `environment variable COUNTERD_…`, `flag …`.
    pub origins: BTreeMap<String, String>,
    /// `COUNTERD_*` variables that are not settings but Kubernetes service links (a Service
    /// named `counterd` injects `COUNTERD_PORT=tcp://…`): ignored, logged at debug.
    pub ignored_env: Vec<String>,
}

/// `COUNTERD_*` variables that are not settings and not errors: the config path, the test and
/// benchmark knobs.
const NOT_SETTINGS: [&str; 4] = ["config", "testdb_dir", "kill_iterations", "test_threads"];

/// Whether `name` (after `COUNTERD_`, lower case) with `value` is what Kubernetes injects for a
/// Service named `counterd` or `counterd-<x>` (service links are on by default, and the
/// sidecar leaves them to the application): `[<X>_]SERVICE_HOST`, `[<X>_]SERVICE_PORT[_<name>]`,
/// `[<X>_]PORT=tcp://…` and `[<X>_]PORT_<port>_<proto>[_PROTO|_PORT|_ADDR]`. Refusing them would
/// stop counterd at start (exit 2) in a namespace that merely has such a Service.
pub fn is_service_link(name: &str, value: &str) -> bool {
    // The name whole, then what follows each `_`: a Service's name may have several words.
    let mut suffixes = std::iter::successors(Some(name), |s| Some(s.split_once('_')?.1));
    suffixes.any(|suffix| is_link_suffix(suffix, value))
}

/// One service-link variable without its Service's name (see [`is_service_link`]). A bare
/// `PORT` counts only with a `tcp://`-style value, so a setting misspelt as `…_PORT` still
/// fails as unknown.
fn is_link_suffix(name: &str, value: &str) -> bool {
    if matches!(name, "service_host" | "service_port") || name.starts_with("service_port_") {
        return true;
    }
    if name == "port" {
        return ["tcp://", "udp://", "sctp://"]
            .iter()
            .any(|scheme| value.starts_with(scheme));
    }
    let Some(rest) = name.strip_prefix("port_") else {
        return false;
    };
    let mut parts = rest.split('_');
    let port = parts.next().unwrap_or("");
    let proto = parts.next().unwrap_or("");
    let tail: Vec<&str> = parts.collect();
    !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && matches!(proto, "tcp" | "udp" | "sctp")
        && matches!(tail.as_slice(), [] | ["proto"] | ["port"] | ["addr"])
}

impl Settings {
    /// Loads defaults ← file ← `COUNTERD_*` environment ← flag overrides (`name=value`).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[(String, String)],
    ) -> Result<Settings, ConfigError> {
        let overrides: Vec<Override> = overrides
            .iter()
            .map(|(name, value)| Override {
                name: name.clone(),
                value: value.clone(),
                origin: "flag --set".into(),
            })
            .collect();
        Self::load_traced(file, env, &overrides).map(|l| l.settings)
    }

    /// [`Settings::load`], keeping where each value came from (`counterd config`).
    ///
    /// Layers, each over the one before: the defaults, the file, `COUNTERD_*` environment
    /// variables, flags; then the URI file, and the checks, whose errors name where the
    /// offending value came from.
    pub fn load_traced(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[Override],
    ) -> Result<Loaded, ConfigError> {
        let mut layers = Layers::defaults();
        if let Some(path) = file {
            layers.file(path)?;
        }
        layers.env(env)?;
        layers.overrides(overrides)?;
        layers.uri_file()?;
        let settings = settings_of(layers.table)?;
        settings.validate().map_err(|mut e| {
            // Name where the offending value came from, not just "settings"; `counters[1].
            // condition` came from wherever `counters` did.
            if let ConfigError::Invalid { name, origin, .. } = &mut e {
                let setting = name.split('[').next().unwrap_or(name);
                *origin = layers
                    .origins
                    .get(setting)
                    .cloned()
                    .unwrap_or_else(|| "settings".into());
            }
            e
        })?;
        Ok(Loaded {
            settings,
            origins: layers.origins,
            ignored_env: layers.ignored_env,
        })
    }
}

/// The settings as a table, layer over layer, with where each value came from.
struct Layers {
    table: toml::Table,
    origins: BTreeMap<String, String>,
    /// Environment variables left alone (container service links, see [`is_service_link`]).
    ignored_env: Vec<String>,
}

impl Layers {
    fn defaults() -> Layers {
        let table = default_table();
        let origins: BTreeMap<String, String> = table
            .keys()
            .map(|k| (k.clone(), "default".to_string()))
            .collect();
        Layers {
            table,
            origins,
            ignored_env: Vec::new(),
        }
    }

    /// The settings file's values.
    fn file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let Layers { table, origins, .. } = self;
        let origin = format!("file {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        let parsed: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        for (name, value) in parsed {
            if !table.contains_key(&name) {
                return Err(ConfigError::Unknown { name, origin });
            }
            let shown = match &value {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            check_one(&name, &value, &shown, &origin)?;
            origins.insert(name.clone(), origin.clone());
            table.insert(name, value);
        }
        Ok(())
    }

    /// `COUNTERD_*` environment variables, in name order.
    fn env(&mut self, env: impl IntoIterator<Item = (String, String)>) -> Result<(), ConfigError> {
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("COUNTERD_") && !k.starts_with("COUNTERD_TEST"))
            .collect();
        env.sort();
        let mut given = Vec::new();
        for (key, value) in env {
            let name = key["COUNTERD_".len()..].to_ascii_lowercase();
            if !self.table.contains_key(&name) {
                if NOT_SETTINGS.contains(&name.as_str())
                    || name.starts_with("test_")
                    || name.starts_with("bench_")
                {
                    continue;
                }
                if is_service_link(&name, &value) {
                    self.ignored_env.push(key);
                    continue;
                }
            }
            let origin = format!("environment variable {key}");
            given.push(Override {
                name,
                value,
                origin,
            });
        }
        // Typed, checked and recorded as flags are; an unknown name is refused likewise.
        self.overrides(&given)
    }

    /// Flags (`--set name=value` and the named ones), and the environment's values.
    fn overrides(&mut self, overrides: &[Override]) -> Result<(), ConfigError> {
        let Layers { table, origins, .. } = self;
        for o in overrides {
            let Some(existing) = table.get(&o.name) else {
                return Err(ConfigError::Unknown {
                    name: o.name.clone(),
                    origin: o.origin.clone(),
                });
            };
            let value = typed_like(existing, &o.value, &o.name, &o.origin)?;
            origins.insert(o.name.clone(), o.origin.clone());
            table.insert(o.name.clone(), value);
        }
        Ok(())
    }

    /// `mongodb_uri_file` given: the URI is read from that file into `mongodb_uri` (whose origin
    /// then names the file). Setting `mongodb_uri` as well is refused: which one wins would be a
    /// guess.
    fn uri_file(&mut self) -> Result<(), ConfigError> {
        let Layers { table, origins, .. } = self;
        let path = match table.get("mongodb_uri_file") {
            Some(toml::Value::String(p)) if !p.is_empty() => p.clone(),
            _ => return Ok(()),
        };
        let origin = origins
            .get("mongodb_uri_file")
            .cloned()
            .unwrap_or_else(|| "settings".into());
        let invalid = |message| ConfigError::invalid("mongodb_uri_file", &origin, &path, message);
        let uri_origin = origins.get("mongodb_uri").map_or("default", String::as_str);
        if uri_origin != "default" {
            let message =
                format!("mongodb_uri is set as well (from {uri_origin}): set only one of them");
            return Err(invalid(message));
        }
        let uri = super::read_uri_file(&path).map_err(invalid)?;
        table.insert("mongodb_uri".into(), toml::Value::String(uri));
        origins.insert(
            "mongodb_uri".into(),
            format!("file {path} (mongodb_uri_file, {origin})"),
        );
        Ok(())
    }
}

/// The merged table as settings (`[[counters]]` and `[[sources]]` read again, see
/// [`reread`]).
fn settings_of(table: toml::Table) -> Result<Settings, ConfigError> {
    let counters = table.get("counters").cloned();
    let sources = table.get("sources").cloned();
    let mut settings: Settings =
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse {
                path: "merged settings".into(),
                message: e.to_string(),
            })?;
    if let Some(counters) = counters {
        settings.counters = reread("counters", counters)?;
    }
    if let Some(sources) = sources {
        settings.sources = reread("sources", sources)?;
    }
    Ok(settings)
}

/// The `[[counters]]` (or `[[sources]]`) entries read again from their TOML text: a
/// `toml::Value` deserializes a date as its text, and a condition's
/// `{ "$lt" = 2024-01-01T00:00:00Z }` must stay a date.
fn reread<T: serde::de::DeserializeOwned>(
    key: &str,
    value: toml::Value,
) -> Result<Vec<T>, ConfigError> {
    #[derive(serde::Deserialize)]
    struct Entries<T> {
        entries: Vec<T>,
    }
    let table = toml::Table::from_iter([("entries".to_string(), value)]);
    let parse = |message: String| ConfigError::Parse {
        path: key.into(),
        message,
    };
    let text = toml::to_string(&table).map_err(|e| parse(e.to_string()))?;
    toml::from_str::<Entries<T>>(&text)
        .map(|e| e.entries)
        .map_err(|e| parse(e.to_string()))
}

/// The default settings as a TOML table.
fn default_table() -> toml::Table {
    match toml::Value::try_from(Settings::default()) {
        Ok(toml::Value::Table(t)) => t,
        _ => unreachable!("settings serialize to a table"),
    }
}

/// Checks a file value's type against the default's, so the error names the setting.
fn check_one(
    name: &str,
    value: &toml::Value,
    shown: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let mut probe = default_table();
    probe.insert(name.to_string(), value.clone());
    toml::Value::Table(probe)
        .try_into::<Settings>()
        .map(|_| ())
        .map_err(|e| ConfigError::invalid(name, origin, shown, e.message()))
}

/// Parses a raw string into the TOML type of the existing (default) value.
fn typed_like(
    existing: &toml::Value,
    raw: &str,
    name: &str,
    origin: &str,
) -> Result<toml::Value, ConfigError> {
    let invalid = |message: &str| ConfigError::invalid(name, origin, raw, message);
    let value = match existing {
        toml::Value::Integer(_) => raw
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| invalid("expected a whole number"))?,
        toml::Value::Float(_) => raw
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| invalid("expected a number"))?,
        toml::Value::Boolean(_) => raw
            .trim()
            .parse::<bool>()
            .map(toml::Value::Boolean)
            .map_err(|_| invalid("expected true or false"))?,
        // A list: TOML array syntax (`["removed", 3]`), or comma-separated words.
        toml::Value::Array(_) => match format!("v = {raw}").parse::<toml::Table>() {
            Ok(mut t) if t.get("v").is_some_and(toml::Value::is_array) => t.remove("v").unwrap(),
            _ => toml::Value::Array(
                raw.split(',')
                    .map(str::trim)
                    .filter(|w| !w.is_empty())
                    .map(|w| toml::Value::String(w.to_string()))
                    .collect(),
            ),
        },
        _ => toml::Value::String(raw.to_string()),
    };
    check_one(name, &value, raw, origin)?;
    Ok(value)
}

#[cfg(test)]
impl Settings {
    /// Settings loaded from a settings file holding `text` (the file's way in, where a
    /// condition's date stays a date), for tests.
    pub fn from_file_text(text: &str) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("counterd.toml");
        std::fs::write(&path, text).expect("write the settings file");
        Settings::load(Some(&path), Vec::new(), &[])
    }
}

#[cfg(test)]
mod tests {
    use super::super::redact_uri;
    use super::*;
    use std::time::Duration;

    /// The error of settings loaded with one environment variable.
    fn env_error(name: &str, value: &str) -> String {
        let env = vec![(name.to_string(), value.to_string())];
        Settings::load(None, env, &[]).unwrap_err().to_string()
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_uri("mongodb://alice:s3cret@db1:27017,db2/?replicaSet=rs0"),
            "mongodb://alice:***@db1:27017,db2/?replicaSet=rs0"
        );
        assert_eq!(redact_uri("mongodb://db1:27017/"), "mongodb://db1:27017/");
    }

    #[test]
    fn kubernetes_service_links_are_ignored_other_unknown_names_are_errors() {
        let links = [
            ("COUNTERD_PORT", "tcp://10.0.0.1:9187"),
            ("COUNTERD_PORT_9187_TCP", "tcp://10.0.0.1:9187"),
            ("COUNTERD_PORT_9187_TCP_PROTO", "tcp"),
            ("COUNTERD_PORT_9187_TCP_PORT", "9187"),
            ("COUNTERD_PORT_9187_TCP_ADDR", "10.0.0.1"),
            ("COUNTERD_SERVICE_HOST", "10.0.0.1"),
            ("COUNTERD_SERVICE_PORT", "9187"),
            ("COUNTERD_SERVICE_PORT_HTTP", "9187"),
            // A Service named `counterd-metrics` in the same namespace.
            ("COUNTERD_METRICS_PORT", "tcp://10.0.0.2:9187"),
            ("COUNTERD_METRICS_PORT_9187_TCP_ADDR", "10.0.0.2"),
            ("COUNTERD_METRICS_SERVICE_HOST", "10.0.0.2"),
            ("COUNTERD_METRICS_SERVICE_PORT_HTTP", "9187"),
        ];
        let env = links.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let loaded = Settings::load_traced(None, env, &[]).unwrap();
        assert_eq!(loaded.ignored_env.len(), links.len());
        assert_eq!(loaded.settings, Settings::default());
        for near_miss in [
            "COUNTERD_PORTS",
            "COUNTERD_PORT_X_TCP",
            "COUNTERD_PORT_80_TCP_HOST",
            "COUNTERD_HTTP_PORT",
            "COUNTERD_METRICS_PORT_X_TCP",
        ] {
            let e = env_error(near_miss, "1");
            assert!(e.contains("unknown setting"), "{near_miss}: {e}");
        }
    }

    #[test]
    fn origins_are_tracked_and_named_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "batch_size = 10\n").unwrap();
        let env = vec![("COUNTERD_DATABASE".to_string(), "x".to_string())];
        let flags = vec![Override {
            name: "mongodb_uri".into(),
            value: "mongodb://db:27017/".into(),
            origin: "flag --mongodb-uri".into(),
        }];
        let l = Settings::load_traced(Some(&path), env, &flags).unwrap();
        assert_eq!(l.origins["batch_size"], format!("file {}", path.display()));
        assert_eq!(
            l.origins["database"],
            "environment variable COUNTERD_DATABASE"
        );
        assert_eq!(l.origins["mongodb_uri"], "flag --mongodb-uri");
        assert_eq!(l.origins["settle_time"], "default");
        // A range error names where the value came from, a flag as it was given.
        let e = Settings::load(None, vec![], &[("batch_size".into(), "0".into())])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("(from flag --set)") && !e.contains("--batch-size"),
            "{e}"
        );
        let e = env_error("COUNTERD_BATCH_SIZE", "0");
        assert!(
            e.contains("(from environment variable COUNTERD_BATCH_SIZE)"),
            "{e}"
        );
        // A bad duration is quoted once.
        let e = env_error("COUNTERD_SETTLE_TIME", "5parsecs");
        assert!(e.contains("= \"5parsecs\":") && !e.contains("\\\""), "{e}");
    }

    #[test]
    fn a_malformed_uri_is_a_configuration_error_without_the_password() {
        for uri in [
            "mongodb://alice:hunter2@db:notaport/",
            "mongodb://alice:hunter2@/",
            "mongodb://db/?replicaSet=rs0&w=bogus&nosuchoption=",
        ] {
            let e = env_error("COUNTERD_MONGODB_URI", uri);
            assert!(
                e.contains("mongodb_uri") && e.contains("not a valid connection string"),
                "{uri}: {e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn the_uri_comes_from_mongodb_uri_file_trimmed_and_never_beside_mongodb_uri() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("uri");
        std::fs::write(&path, "mongodb://alice:s3cret@db:27017/?replicaSet=rs0\n").unwrap();
        let file = path.display().to_string();
        let env = vec![("COUNTERD_MONGODB_URI_FILE".to_string(), file.clone())];
        let l = Settings::load_traced(None, env.clone(), &[]).unwrap();
        assert_eq!(
            l.settings.mongodb_uri,
            "mongodb://alice:s3cret@db:27017/?replicaSet=rs0"
        );
        assert!(l.origins["mongodb_uri"].contains(&file));
        // Re-read: a rotated Secret is seen without a restart.
        std::fs::write(&path, "mongodb://alice:n3w@db:27017/\n\n").unwrap();
        assert_eq!(
            l.settings.current_uri().unwrap(),
            "mongodb://alice:n3w@db:27017/"
        );
        // Both given: refused, naming both.
        let mut both = env.clone();
        both.push(("COUNTERD_MONGODB_URI".into(), "mongodb://db/".into()));
        let e = Settings::load(None, both, &[]).unwrap_err().to_string();
        assert!(
            e.contains("mongodb_uri_file") && e.contains("COUNTERD_MONGODB_URI"),
            "{e}"
        );
        // Unreadable: the path is named, nothing of the content.
        let missing = dir.path().join("nope").display().to_string();
        let e = env_error("COUNTERD_MONGODB_URI_FILE", &missing);
        assert!(e.contains(&missing) && e.contains("no such file"), "{e}");
        std::fs::write(&path, "mongodb://alice:hunter2@db:notaport/\n").unwrap();
        let e = env_error("COUNTERD_MONGODB_URI_FILE", &file);
        assert!(
            e.contains("not a valid connection string") && e.contains(&file),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        assert!(
            l.settings.current_uri().is_err(),
            "a bad rotation is refused"
        );
    }

    #[test]
    fn the_placeholder_password_is_refused() {
        for uri in [
            "mongodb://counterd:CHANGE_ME@db:27017/?authSource=admin",
            "mongodb://counterd:CHANGE%5FME@db:27017/",
        ] {
            let e = env_error("COUNTERD_MONGODB_URI", uri);
            assert!(
                e.contains("placeholder") && e.contains("create the Secret"),
                "{uri}: {e}"
            );
        }
        let env = vec![(
            "COUNTERD_MONGODB_URI".to_string(),
            "mongodb://counterd:CHANGE_ME_NOT@db/".to_string(),
        )];
        assert!(Settings::load(None, env, &[]).is_ok());
    }

    #[test]
    fn precedence_is_defaults_file_env_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "batch_size = 10\ndatabase = \"fromfile\"\nsettle_time = \"5s\"\n",
        )
        .unwrap();
        let env = vec![
            ("COUNTERD_BATCH_SIZE".to_string(), "20".to_string()),
            ("COUNTERD_SETTLE_TIME".to_string(), "7s".to_string()),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let flags = vec![("batch_size".to_string(), "30".to_string())];
        let s = Settings::load(Some(&path), env, &flags).unwrap();
        assert_eq!(s.batch_size, 30);
        assert_eq!(s.database, "fromfile");
        assert_eq!(s.settle_time, Duration::from_secs(7));
        assert_eq!(
            s.reconcile_max_posts,
            Settings::default().reconcile_max_posts
        );
    }

    #[test]
    fn bad_values_name_the_setting() {
        let e = env_error("COUNTERD_BATCH_SIZE", "lots");
        assert!(
            e.contains("batch_size") && e.contains("COUNTERD_BATCH_SIZE"),
            "{e}"
        );
        let e = env_error("COUNTERD_BATCH_SIZE", "0");
        assert!(e.contains("batch_size") && e.contains("1 to 100000"), "{e}");
        let e = env_error("COUNTERD_BATCH_SIZ", "5");
        assert!(
            e.contains("unknown setting `batch_siz`") && e.contains("COUNTERD_BATCH_SIZ"),
            "{e}"
        );
        let e = env_error("COUNTERD_ON_HISTORY_LOST", "shrug");
        assert!(e.contains("on_history_lost"), "{e}");
        let file_error = |text: &str| Settings::from_file_text(text).unwrap_err().to_string();
        let e = file_error("batch_sise = 10\n");
        assert!(e.contains("unknown setting `batch_sise`"), "{e}");
        let e = file_error("reconcile_interval = \"soon\"\n");
        assert!(e.contains("reconcile_interval"), "{e}");
    }
}
