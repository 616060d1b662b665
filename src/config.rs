//! Settings: every one has a default and a line of documentation (see `counterd.example.toml`).
//! Precedence, lowest first: defaults, the TOML file (`--config`), `COUNTERD_*` environment
//! variables (the setting's name in upper case), then flags (`--set name=value` and the named
//! flags of `counterd`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::classify::Attribution;
use crate::snapshot::InitialSnapshot;

/// All of counterd's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// MongoDB connection string (credentials allowed; they are redacted in logs and `status`).
    pub mongodb_uri: String,
    /// Database holding `comments` and counterd's own collections.
    pub database: String,
    /// The collection of comment rows to count.
    pub comments_collection: String,
    /// The collection of counters that readers query (`count`, `base_count`, `live_delta`).
    pub counters_collection: String,
    /// Prefix of counterd's own bookkeeping collections (ledger, dirty set, checkpoints,
    /// leases, reconcile runs, sweep cursor).
    pub collection_prefix: String,
    /// Create the index `{count: -1}` on the counters collection (for top-N reads).
    pub count_index: bool,
    /// The field (a dotted path such as `meta.post` works) that names a comment's post.
    pub group_field: String,
    /// The field holding a comment's creation time; a row without a date there is filed under
    /// bucket 0 (below every watermark) and still counted.
    pub created_field: String,
    /// How a soft-deleted comment is recognised: present (the field is present and not null),
    /// true (the field is the boolean true), one_of (the field equals one of
    /// soft_delete_values), never (no soft deletes).
    pub soft_delete: SoftDeleteRule,
    /// The field the soft-delete rule reads.
    pub soft_delete_field: String,
    /// With soft_delete = "one_of": the values that mark a comment deleted (strings or whole
    /// numbers).
    pub soft_delete_values: Vec<SoftDeleteValue>,
    /// How long to look for a reachable server before failing.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Checkpoint and lease id of the stream.
    pub stream_name: String,
    /// Where before-states come from: auto, pre_image, ledger, best_effort.
    pub attribution: Attribution,
    /// Events per batch while caught up (low latency).
    pub batch_size: usize,
    /// Most events per batch while behind: batches grow to it while reads come back full (more
    /// repeats coalesce) and shrink back to `batch_size` once caught up.
    pub max_batch_size: usize,
    /// Longest time spent gathering one batch while events keep coming.
    #[serde(with = "humantime_serde")]
    pub max_batch_wait: Duration,
    /// Pause after a read that returned no events.
    #[serde(with = "humantime_serde")]
    pub idle_interval: Duration,
    /// How long the server may hold an empty getMore (maxAwaitTimeMS).
    #[serde(with = "humantime_serde")]
    pub max_await: Duration,
    /// Start position when there is no checkpoint (RFC 3339); empty: now.
    pub start_at: String,
    /// When the checkpoint fell off the oplog: fail, or resweep (start from now + full recount).
    pub on_history_lost: OnHistoryLost,
    /// A stream that has never applied anything first counts the rows that already exist
    /// (`auto`), or counts only what it sees change (`never`).
    pub initial_snapshot: InitialSnapshot,
    /// Rows the initial snapshot reads per second at most (0: unthrottled).
    pub snapshot_rows_per_second: u32,
    /// Rows per snapshot chunk (each chunk is recorded, so a restart resumes after the last).
    pub snapshot_chunk_rows: usize,
    /// Width of the creation-time buckets deltas are filed under.
    #[serde(with = "humantime_serde")]
    pub bucket_width: Duration,
    /// Time between reconcile runs (jittered).
    #[serde(with = "humantime_serde")]
    pub reconcile_interval: Duration,
    /// Jitter of the reconcile schedule, as a fraction of the interval (0.0 to 1.0).
    pub reconcile_jitter: f64,
    /// How far behind now (and behind the worker) the watermark stays.
    #[serde(with = "humantime_serde")]
    pub settle_time: Duration,
    /// Most dirty posts recounted per run.
    pub reconcile_max_posts: usize,
    /// Most recount queries per second (0: unlimited).
    pub reconcile_counts_per_second: u32,
    /// Posts per window of a full sweep.
    pub sweep_window: usize,
    /// Attempts to install one recount when a worker write races it.
    pub fold_retries: u32,
    /// On servers without snapshot reads, how long a recount waits for the worker to apply
    /// every change its count could have seen; a post not settled by then stays dirty.
    #[serde(with = "humantime_serde")]
    pub catch_up_timeout: Duration,
    /// How long one pass of the slow background sweep over every post should take (it finds
    /// drift no event points at, e.g. a hand-edited counter); 0s: no background sweep.
    #[serde(with = "humantime_serde")]
    pub background_sweep_pass: Duration,
    /// Address of the HTTP endpoints (/metrics, /healthz, /readyz).
    pub http_addr: String,
    /// `/readyz` is unready above this stream lag.
    #[serde(with = "humantime_serde")]
    pub ready_max_lag: Duration,
    /// `/readyz` is unready when the active stream's reads went unanswered this long, or a
    /// standby could not reach MongoDB this long (a paused or unreachable server).
    #[serde(with = "humantime_serde")]
    pub ready_max_stall: Duration,
    /// Log format: text or json.
    pub log_format: String,
    /// Log filter (tracing EnvFilter syntax), e.g. info or counterd=debug; RUST_LOG wins if set.
    pub log_level: String,
    /// Shortest backoff after a transient error.
    #[serde(with = "humantime_serde")]
    pub retry_min_delay: Duration,
    /// Longest a worker step (read a batch and write it) may take before it is abandoned as
    /// stuck and retried from the checkpoint (a paused or partitioned server).
    #[serde(with = "humantime_serde")]
    pub operation_timeout: Duration,
    /// Longest backoff after a transient error.
    #[serde(with = "humantime_serde")]
    pub retry_max_delay: Duration,
    /// How long a stream lease lasts without renewal.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// How often the lease holder renews (and standbys look).
    #[serde(with = "humantime_serde")]
    pub lease_renew: Duration,
    /// Split posts across this many streams by a hash of post_id, each with its own checkpoint,
    /// lease, ledger and dirty entries (1: no partitioning).
    pub partitions: u32,
    /// Most partitions one process works on at once (0: no limit), so replicas share the work.
    pub max_partitions_per_process: u32,
    /// This process's identity in leases; empty: hostname-pid.
    pub owner_id: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mongodb_uri: "mongodb://127.0.0.1:27017/?directConnection=true".into(),
            database: "app".into(),
            comments_collection: "comments".into(),
            counters_collection: "comment_counters".into(),
            collection_prefix: "counterd_".into(),
            count_index: true,
            group_field: "post_id".into(),
            created_field: "created_at".into(),
            soft_delete: SoftDeleteRule::Present,
            soft_delete_field: "deleted_at".into(),
            soft_delete_values: Vec::new(),
            connect_timeout: Duration::from_secs(5),
            stream_name: "comments".into(),
            attribution: Attribution::Auto,
            batch_size: 1000,
            max_batch_size: 10_000,
            max_batch_wait: Duration::from_millis(200),
            idle_interval: Duration::from_millis(100),
            max_await: Duration::from_millis(500),
            start_at: String::new(),
            on_history_lost: OnHistoryLost::Resweep,
            initial_snapshot: InitialSnapshot::Auto,
            snapshot_rows_per_second: 5000,
            snapshot_chunk_rows: 1000,
            bucket_width: Duration::from_secs(60),
            reconcile_interval: Duration::from_secs(10),
            reconcile_jitter: 0.2,
            settle_time: Duration::from_secs(30),
            reconcile_max_posts: 1000,
            reconcile_counts_per_second: 500,
            sweep_window: 500,
            fold_retries: 5,
            catch_up_timeout: Duration::from_secs(10),
            background_sweep_pass: Duration::from_secs(24 * 3600),
            http_addr: "127.0.0.1:9187".into(),
            ready_max_lag: Duration::from_secs(60),
            ready_max_stall: Duration::from_secs(30),
            log_format: "text".into(),
            log_level: "info".into(),
            retry_min_delay: Duration::from_millis(100),
            operation_timeout: Duration::from_secs(30),
            retry_max_delay: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(10),
            lease_renew: Duration::from_secs(2),
            partitions: 1,
            max_partitions_per_process: 0,
            owner_id: String::new(),
        }
    }
}

/// A configuration problem: names the setting, the value and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {message}")]
    File { path: String, message: String },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("unknown setting `{name}` (from {origin}); see counterd.example.toml for the list")]
    Unknown { name: String, origin: String },
    #[error("setting `{name}` (from {origin}) = {value:?}: {message}")]
    Invalid {
        name: String,
        origin: String,
        value: String,
        message: String,
    },
}

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

/// Whether `name` (after `COUNTERD_`, lower case) is what Kubernetes injects for a Service
/// named `counterd`: `COUNTERD_SERVICE_HOST`, `COUNTERD_SERVICE_PORT[_<name>]`,
/// `COUNTERD_PORT` and `COUNTERD_PORT_<port>_<proto>[_PROTO|_PORT|_ADDR]`.
pub fn is_service_link(name: &str) -> bool {
    if matches!(name, "port" | "service_host" | "service_port") || name.starts_with("service_port_")
    {
        return true;
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
    pub fn load_traced(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[Override],
    ) -> Result<Loaded, ConfigError> {
        let mut table = match toml::Value::try_from(Settings::default()) {
            Ok(toml::Value::Table(t)) => t,
            _ => unreachable!("settings serialize to a table"),
        };
        let mut origins: BTreeMap<String, String> = table
            .keys()
            .map(|k| (k.clone(), "default".to_string()))
            .collect();
        let mut ignored_env = Vec::new();
        if let Some(path) = file {
            let origin = format!("file {}", path.display());
            let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                path: path.display().to_string(),
                message: e.to_string(),
            })?;
            let parsed: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::Parse {
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
        }
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("COUNTERD_") && !k.starts_with("COUNTERD_TEST"))
            .collect();
        env.sort();
        for (key, raw) in env {
            let name = key["COUNTERD_".len()..].to_ascii_lowercase();
            let origin = format!("environment variable {key}");
            if !table.contains_key(&name) {
                if NOT_SETTINGS.contains(&name.as_str())
                    || name.starts_with("test_")
                    || name.starts_with("bench_")
                {
                    continue;
                }
                if is_service_link(&name) {
                    ignored_env.push(key);
                    continue;
                }
                return Err(ConfigError::Unknown { name, origin });
            }
            let value = typed_like(&table[&name], &raw, &name, &origin)?;
            origins.insert(name.clone(), origin);
            table.insert(name, value);
        }
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
        let settings: Settings =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::Parse {
                    path: "merged settings".into(),
                    message: e.to_string(),
                })?;
        settings.validate().map_err(|e| match e {
            // Name where the offending value came from, not just "settings".
            ConfigError::Invalid {
                name,
                value,
                message,
                ..
            } => ConfigError::Invalid {
                origin: origins
                    .get(&name)
                    .cloned()
                    .unwrap_or_else(|| "settings".into()),
                name,
                value,
                message,
            },
            other => other,
        })?;
        Ok(Loaded {
            settings,
            origins,
            ignored_env,
        })
    }

    /// Range checks that types alone cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name: &str, value: String, message: &str| ConfigError::Invalid {
            name: name.into(),
            origin: "settings".into(),
            value,
            message: message.into(),
        };
        for (name, value) in [
            ("comments_collection", &self.comments_collection),
            ("counters_collection", &self.counters_collection),
        ] {
            if let Some(problem) = collection_name_problem(value) {
                return Err(bad(name, value.clone(), problem));
            }
        }
        if !self.collection_prefix.is_empty() {
            if let Some(problem) = collection_name_problem(&self.collection_prefix) {
                return Err(bad(
                    "collection_prefix",
                    self.collection_prefix.clone(),
                    problem,
                ));
            }
        }
        if let Some((name, value)) = self.schema().problem() {
            return Err(bad(
                name,
                value,
                "expected a field name or a dotted path: not empty, no empty part, no part starting with `$`",
            ));
        }
        if self.soft_delete == SoftDeleteRule::OneOf && self.soft_delete_values.is_empty() {
            return Err(bad(
                "soft_delete_values",
                "[]".into(),
                "soft_delete = \"one_of\" needs at least one value",
            ));
        }
        if self.counters_collection == self.comments_collection {
            return Err(bad(
                "counters_collection",
                self.counters_collection.clone(),
                "must differ from comments_collection",
            ));
        }
        if !(1..=10_000).contains(&self.snapshot_chunk_rows) {
            return Err(bad(
                "snapshot_chunk_rows",
                self.snapshot_chunk_rows.to_string(),
                "expected 1 to 10000 rows",
            ));
        }
        if self.initial_snapshot == InitialSnapshot::Auto && !self.attribution.uses_ledger() {
            return Err(bad(
                "initial_snapshot",
                "auto".into(),
                "the initial snapshot keeps its counts honest through the comment ledger: use attribution = \"auto\" or \"ledger\", or set initial_snapshot = \"never\"",
            ));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(bad(
                "batch_size",
                self.batch_size.to_string(),
                "allowed: 1 to 100000",
            ));
        }
        if self.max_batch_size < self.batch_size || self.max_batch_size > 100_000 {
            return Err(bad(
                "max_batch_size",
                self.max_batch_size.to_string(),
                "expected at least batch_size and at most 100000",
            ));
        }
        if self.bucket_width < Duration::from_secs(1) || self.bucket_width.subsec_nanos() != 0 {
            return Err(bad(
                "bucket_width",
                humantime::format_duration(self.bucket_width).to_string(),
                "allowed: whole seconds, at least 1s",
            ));
        }
        if !(0.0..=1.0).contains(&self.reconcile_jitter) {
            return Err(bad(
                "reconcile_jitter",
                self.reconcile_jitter.to_string(),
                "allowed: 0.0 to 1.0",
            ));
        }
        if self.reconcile_max_posts == 0 {
            return Err(bad(
                "reconcile_max_posts",
                "0".into(),
                "allowed: at least 1",
            ));
        }
        if self.catch_up_timeout < Duration::from_millis(100) {
            return Err(bad(
                "catch_up_timeout",
                humantime::format_duration(self.catch_up_timeout).to_string(),
                "allowed: at least 100ms",
            ));
        }
        if self.sweep_window == 0 {
            return Err(bad("sweep_window", "0".into(), "allowed: at least 1"));
        }
        if !matches!(self.log_format.as_str(), "text" | "json") {
            return Err(bad(
                "log_format",
                self.log_format.clone(),
                "allowed: text, json",
            ));
        }
        if self.lease_renew >= self.lease_ttl {
            return Err(bad(
                "lease_renew",
                humantime::format_duration(self.lease_renew).to_string(),
                "must be shorter than lease_ttl",
            ));
        }
        if !(1..=256).contains(&self.partitions) {
            return Err(bad(
                "partitions",
                self.partitions.to_string(),
                "allowed: 1 to 256",
            ));
        }
        if self.http_addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad(
                "http_addr",
                self.http_addr.clone(),
                "expected host:port, e.g. 127.0.0.1:9187",
            ));
        }
        if !self.start_at.is_empty() && self.start_at_timestamp().is_none() {
            return Err(bad(
                "start_at",
                self.start_at.clone(),
                "expected an RFC 3339 time, e.g. 2026-01-31T12:00:00Z",
            ));
        }
        if !self.mongodb_uri.starts_with("mongodb://")
            && !self.mongodb_uri.starts_with("mongodb+srv://")
        {
            return Err(bad(
                "mongodb_uri",
                redact_uri(&self.mongodb_uri),
                "expected mongodb://… or mongodb+srv://…",
            ));
        }
        if let Err(e) = mongodb::options::ConnectionString::parse(&self.mongodb_uri) {
            // The driver's reason, without echoing the URI (it may hold a password).
            let reason = match e.kind.as_ref() {
                mongodb::error::ErrorKind::InvalidArgument { message, .. } => message.clone(),
                _ => e.to_string(),
            };
            let reason = reason.replace(&self.mongodb_uri, "<uri>");
            return Err(bad(
                "mongodb_uri",
                redact_uri(&self.mongodb_uri),
                &format!("not a valid connection string: {reason} (expected mongodb://[user:pass@]host[:port][,host…]/[?options])"),
            ));
        }
        if self.ready_max_stall < Duration::from_secs(1) {
            return Err(bad(
                "ready_max_stall",
                humantime::format_duration(self.ready_max_stall).to_string(),
                "allowed: at least 1s",
            ));
        }
        Ok(())
    }

    /// `start_at` as a cluster time.
    pub fn start_at_timestamp(&self) -> Option<bson::Timestamp> {
        parse_time(&self.start_at).map(|secs| bson::Timestamp {
            time: secs as u32,
            increment: 0,
        })
    }

    /// The application's schema: field names and the soft-delete rule.
    pub fn schema(&self) -> crate::schema::Schema {
        use crate::schema::SoftDelete;
        let field = self.soft_delete_field.clone();
        crate::schema::Schema {
            group: self.group_field.clone(),
            created: self.created_field.clone(),
            soft_delete: match self.soft_delete {
                SoftDeleteRule::Present => SoftDelete::Present { field },
                SoftDeleteRule::True => SoftDelete::True { field },
                SoftDeleteRule::OneOf => SoftDelete::OneOf {
                    field,
                    values: self
                        .soft_delete_values
                        .iter()
                        .map(SoftDeleteValue::to_bson)
                        .collect(),
                },
                SoftDeleteRule::Never => SoftDelete::Never,
            },
        }
    }

    /// counterd's own collections.
    pub fn collections(&self) -> crate::store::mongo::Collections {
        crate::store::mongo::Collections::new(&self.collection_prefix, &self.counters_collection)
    }

    pub fn bucket_width_secs(&self) -> i64 {
        self.bucket_width.as_secs() as i64
    }

    /// The settings as TOML with the URI's password redacted (for `status` and logs).
    pub fn redacted(&self) -> Settings {
        Settings {
            mongodb_uri: redact_uri(&self.mongodb_uri),
            ..self.clone()
        }
    }
}

/// Parses an RFC 3339 time into seconds since the epoch.
pub fn parse_time(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp())
}

/// Checks a file value's type against the default's, so the error names the setting.
fn check_one(
    name: &str,
    value: &toml::Value,
    shown: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let mut probe = match toml::Value::try_from(Settings::default()) {
        Ok(toml::Value::Table(t)) => t,
        _ => unreachable!(),
    };
    probe.insert(name.to_string(), value.clone());
    toml::Value::Table(probe)
        .try_into::<Settings>()
        .map(|_| ())
        .map_err(|e| ConfigError::Invalid {
            name: name.into(),
            origin: origin.into(),
            value: shown.to_string(),
            message: e.message().to_string(),
        })
}

/// Parses a raw string into the TOML type of the existing (default) value.
fn typed_like(
    existing: &toml::Value,
    raw: &str,
    name: &str,
    origin: &str,
) -> Result<toml::Value, ConfigError> {
    let invalid = |message: String| ConfigError::Invalid {
        name: name.into(),
        origin: origin.into(),
        value: raw.into(),
        message,
    };
    let value = match existing {
        toml::Value::Integer(_) => raw
            .trim()
            .parse::<i64>()
            .map(toml::Value::Integer)
            .map_err(|_| invalid("expected a whole number".into()))?,
        toml::Value::Float(_) => raw
            .trim()
            .parse::<f64>()
            .map(toml::Value::Float)
            .map_err(|_| invalid("expected a number".into()))?,
        toml::Value::Boolean(_) => raw
            .trim()
            .parse::<bool>()
            .map(toml::Value::Boolean)
            .map_err(|_| invalid("expected true or false".into()))?,
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

/// Replaces the password in a MongoDB URI with `***`.
pub fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://") else {
        return uri.to_string();
    };
    let rest = &uri[scheme_end + 3..];
    let host_start = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..host_start].rfind('@') else {
        return uri.to_string();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    format!("{}://{}:***@{}", &uri[..scheme_end], user, &rest[at + 1..])
}

/// What to do when the checkpoint has fallen off the oplog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnHistoryLost {
    /// Stop, exit non-zero, say what to do.
    Fail,
    /// Start from now, record the gap, and run a throttled full sweep.
    #[default]
    Resweep,
}

/// The soft-delete rules (see [`crate::schema::SoftDelete`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftDeleteRule {
    Present,
    True,
    OneOf,
    Never,
}

/// A value that marks a comment deleted under `soft_delete = "one_of"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SoftDeleteValue {
    Int(i64),
    Str(String),
}

impl SoftDeleteValue {
    fn to_bson(&self) -> bson::Bson {
        match self {
            SoftDeleteValue::Int(i) => bson::Bson::Int64(*i),
            SoftDeleteValue::Str(s) => bson::Bson::String(s.clone()),
        }
    }
}

/// Why `name` cannot be a collection name (`None`: it can).
fn collection_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.contains('$') || name.contains('\0') {
        Some("must not contain `$` or a NUL character")
    } else if name.starts_with("system.") {
        Some("must not start with `system.`")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ];
        let env = links.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let loaded = Settings::load_traced(None, env, &[]).unwrap();
        assert_eq!(loaded.ignored_env.len(), links.len());
        assert_eq!(loaded.settings, Settings::default());
        for near_miss in [
            "COUNTERD_PORTS",
            "COUNTERD_PORT_X_TCP",
            "COUNTERD_PORT_80_TCP_HOST",
        ] {
            let env = vec![(near_miss.to_string(), "1".to_string())];
            let e = Settings::load(None, env, &[]).unwrap_err().to_string();
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
        let env = vec![("COUNTERD_BATCH_SIZE".to_string(), "0".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(
            e.contains("(from environment variable COUNTERD_BATCH_SIZE)"),
            "{e}"
        );
        // A bad duration is quoted once.
        let env = vec![("COUNTERD_SETTLE_TIME".to_string(), "5parsecs".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(e.contains("= \"5parsecs\":") && !e.contains("\\\""), "{e}");
    }

    #[test]
    fn a_malformed_uri_is_a_configuration_error_without_the_password() {
        for uri in [
            "mongodb://alice:hunter2@db:notaport/",
            "mongodb://alice:hunter2@/",
            "mongodb://db/?replicaSet=rs0&w=bogus&nosuchoption=",
        ] {
            let env = vec![("COUNTERD_MONGODB_URI".to_string(), uri.to_string())];
            let e = Settings::load(None, env, &[]).unwrap_err().to_string();
            assert!(
                e.contains("mongodb_uri") && e.contains("not a valid connection string"),
                "{uri}: {e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
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
        let env = vec![("COUNTERD_BATCH_SIZE".to_string(), "lots".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(
            e.contains("batch_size") && e.contains("COUNTERD_BATCH_SIZE"),
            "{e}"
        );
        let env = vec![("COUNTERD_BATCH_SIZE".to_string(), "0".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(e.contains("batch_size") && e.contains("1 to 100000"), "{e}");
        let env = vec![("COUNTERD_BATCH_SIZ".to_string(), "5".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(
            e.contains("unknown setting `batch_siz`") && e.contains("COUNTERD_BATCH_SIZ"),
            "{e}"
        );
        let env = vec![("COUNTERD_ON_HISTORY_LOST".to_string(), "shrug".to_string())];
        let e = Settings::load(None, env, &[]).unwrap_err().to_string();
        assert!(e.contains("on_history_lost"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "batch_sise = 10\n").unwrap();
        let e = Settings::load(Some(&path), vec![], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown setting `batch_sise`"), "{e}");
        std::fs::write(&path, "reconcile_interval = \"soon\"\n").unwrap();
        let e = Settings::load(Some(&path), vec![], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("reconcile_interval"), "{e}");
    }
}
