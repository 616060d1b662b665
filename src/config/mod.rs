//! Settings: every one has a default and a line of documentation (see `counterd.example.toml`).
//! Precedence, lowest first: defaults, the TOML file (`--config`), `COUNTERD_*` environment
//! variables (the setting's name in upper case), then flags (`--set name=value` and the named
//! flags of `counterd`).

mod counters;
mod expectations;
mod load;
mod sources;
pub(crate) mod validate;

/// The settings' own spelling of the one URI redaction (it lives in [`crate::redact`], below the
/// store, which redacts its errors with it).
pub use crate::redact::redact_uri;
pub use counters::{CounterKind, CounterSetting};
pub use load::{Loaded, Override};
pub use sources::SourceSetting;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::core::classify::Attribution;
use crate::core::definition::Definitions;

/// All of counterd's settings. Every duration is written as people write one (`500ms`, `30s`).
#[serde_with::apply(Duration => #[serde(with = "humantime_serde")])]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// MongoDB connection string (credentials allowed; they are redacted in logs and `status`).
    pub mongodb_uri: String,
    /// Path of a file holding the connection string (a mounted Secret), read at start and again
    /// each time a stream parked on refused credentials retries its login; trailing whitespace
    /// is ignored. Empty: use `mongodb_uri` (setting both is an error).
    pub mongodb_uri_file: String,
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
    pub max_batch_wait: Duration,
    /// Bytes that every buffer draws from (events in flight, read ahead, snapshot chunks,
    /// recounts, server replies); reading waits while it is spent. 0: derived from the
    /// container's memory limit (cgroup v2 or v1: half of what it leaves beside 40 MiB), else
    /// 16 MiB.
    pub memory_budget: u64,
    /// Pause after a read that returned no events.
    pub idle_interval: Duration,
    /// How long the server may hold an empty getMore (maxAwaitTimeMS).
    pub max_await: Duration,
    /// Start position when there is no checkpoint (RFC 3339); empty: now.
    pub start_at: String,
    /// When the checkpoint fell off the oplog: fail, or resweep (start from now + full recount).
    pub on_history_lost: OnHistoryLost,
    /// What `counterd run` does on a condition no retry mends (refused credentials or
    /// privileges, the stream ended by a drop or rename, history lost under `fail`, a source
    /// collection missing): park (that stream waits, re-checks by itself and resumes; the
    /// process stays up) or exit (the process stops with the condition's exit code).
    pub on_fatal: OnFatal,
    /// Longest pause between a parked stream's re-checks (credentials, the collection back,
    /// a checkpoint moved by `counterd replay`).
    pub park_recheck_interval: Duration,
    /// A stream that has never applied anything first counts the rows that already exist
    /// (`auto`), or counts only what it sees change (`never`).
    pub initial_snapshot: InitialSnapshot,
    /// Rows the initial snapshot reads per second at most (0: unthrottled).
    pub snapshot_rows_per_second: u32,
    /// Rows per snapshot chunk (each chunk is recorded, so a restart resumes after the last).
    pub snapshot_chunk_rows: usize,
    /// Width of the creation-time buckets deltas are filed under.
    pub bucket_width: Duration,
    /// Time between the starts of reconcile runs (jittered); a run longer than that is
    /// followed at once.
    pub reconcile_interval: Duration,
    /// Jitter of the reconcile schedule, as a fraction of the interval (0.0 to 1.0).
    pub reconcile_jitter: f64,
    /// How far behind now (and behind the worker) the watermark stays.
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
    pub catch_up_timeout: Duration,
    /// How long one pass of the slow background sweep over every post may take at most (it
    /// finds drift no event points at, e.g. a hand-edited counter); a reconcile run whose dirty
    /// posts left most of the interval unused also sweeps a whole `sweep_window` of posts;
    /// 0s: no background sweep.
    pub background_sweep_pass: Duration,
    /// Address of the HTTP endpoints (/metrics, /healthz, /readyz).
    pub http_addr: String,
    /// `/readyz` is unready above this stream lag.
    pub ready_max_lag: Duration,
    /// `/readyz` is unready when the active stream's reads went unanswered this long, or a
    /// standby could not reach MongoDB this long (a paused or unreachable server).
    pub ready_max_stall: Duration,
    /// Log format: text or json.
    pub log_format: String,
    /// Log filter (tracing EnvFilter syntax), e.g. info or counterd=debug; RUST_LOG wins if set.
    pub log_level: String,
    /// Shortest backoff after a transient error.
    pub retry_min_delay: Duration,
    /// Longest a worker step (read a batch and write it) may take before it is abandoned as
    /// stuck and retried from the checkpoint (a paused or partitioned server).
    pub operation_timeout: Duration,
    /// Longest backoff after a transient error.
    pub retry_max_delay: Duration,
    /// How long a stream lease lasts without renewal.
    pub lease_ttl: Duration,
    /// How often the lease holder renews (and standbys look).
    pub lease_renew: Duration,
    /// Split posts across this many streams by a hash of post_id, each with its own checkpoint,
    /// lease, ledger and dirty entries (1: no partitioning).
    pub partitions: u32,
    /// Most partitions one process works on at once (0: no limit), so replicas share the work.
    pub max_partitions_per_process: u32,
    /// This process's identity in leases; empty: hostname-pid.
    pub owner_id: String,
    /// More counters over the same rows and stream, beside the default one (`group_field` into
    /// `counters_collection`, named `default`): `[[counters]]` entries with a `name`, a
    /// `group_field`, an optional `condition` and a `collection`; `kind = "sum"` with a `field`
    /// adds up that field instead of counting rows (`with_count = true` keeps the row count
    /// beside it, in the same documents).
    pub counters: Vec<CounterSetting>,
    /// Counters over other collections than `comments_collection` (likes per post): `[[sources]]`
    /// entries with a `name`, a `collection`, a `group_field` and a `counters_collection`, each
    /// followed by its own stream in the same process (see [`Settings::sources`]).
    pub sources: Vec<SourceSetting>,
    /// The name of the counter of `group_field` and `counters_collection`: `default`, or a
    /// source's name in the settings [`Settings::sources`] derives. Not a setting of its own.
    #[serde(skip)]
    pub counter_name: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            mongodb_uri: "mongodb://127.0.0.1:27017/".into(),
            mongodb_uri_file: String::new(),
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
            memory_budget: 0,
            idle_interval: Duration::from_millis(100),
            max_await: Duration::from_millis(500),
            start_at: String::new(),
            on_history_lost: OnHistoryLost::Resweep,
            on_fatal: OnFatal::Park,
            park_recheck_interval: Duration::from_secs(30),
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
            counters: Vec::new(),
            sources: Vec::new(),
            counter_name: crate::core::definition::DEFAULT_COUNTER.into(),
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
    /// A certificate file named in `mongodb_uri` cannot be used (checked before connecting).
    #[error("mongodb_uri names a certificate counterd cannot use: {0}")]
    Tls(#[from] crate::doctor::tls::TlsFileError),
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

impl ConfigError {
    /// Setting `name` (given by `origin`) cannot be `value`: `message` says why.
    pub fn invalid(
        name: &str,
        origin: &str,
        value: impl ToString,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Invalid {
            name: name.into(),
            origin: origin.into(),
            value: value.to_string(),
            message: message.into(),
        }
    }
}

impl Settings {
    /// `start_at` as a cluster time.
    pub fn start_at_timestamp(&self) -> Option<bson::Timestamp> {
        parse_time(&self.start_at)
    }

    /// The application's schema: field names, the soft-delete rule, and the counter
    /// definitions (the default, then `[[counters]]`), so that every row read records what it
    /// is to each. `[[counters]]` that do not check out are left out here; loading the settings
    /// and `counterd run` refuse them first (see [`Settings::definitions`]).
    pub fn schema(&self) -> crate::core::schema::Schema {
        use crate::core::schema::SoftDelete;
        let field = self.soft_delete_field.clone();
        crate::core::schema::Schema {
            definitions: self
                .definitions()
                .unwrap_or_else(|_| Definitions::new(self.first_definition(), Vec::new())),
            created: self.created_field.clone(),
            soft_delete: match self.soft_delete {
                SoftDeleteRule::Present => SoftDelete::Present { field },
                SoftDeleteRule::True => SoftDelete::True { field },
                SoftDeleteRule::OneOf => SoftDelete::OneOf {
                    field,
                    values: self
                        .soft_delete_values
                        .iter()
                        .map(|v| bson::to_bson(v).expect("a whole number or a string"))
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

    /// The memory budget in bytes: `memory_budget`, or (0) derived from the container's
    /// memory limit.
    pub fn memory_budget_bytes(&self) -> usize {
        match self.memory_budget {
            0 => crate::core::cost::budget_for_limit(
                crate::budget::cgroup::memory_limit(),
                self.streams_per_process(),
            ),
            bytes => bytes.min(u32::MAX as u64) as usize,
        }
    }

    /// This source's streams: `stream_name` alone, or one per partition (with the partition).
    pub fn streams(&self) -> Vec<(String, Option<crate::core::partition::Partition>)> {
        crate::core::partition::stream_names(&self.stream_name, self.partitions)
    }

    /// The names of [`Settings::streams`].
    pub fn stream_names(&self) -> Vec<String> {
        self.streams().into_iter().map(|(name, _)| name).collect()
    }

    /// The most streams (partitions, of every source) one process works on at once.
    pub fn streams_per_process(&self) -> usize {
        let partitions = self.partitions.max(1);
        let own = (match self.max_partitions_per_process {
            0 => partitions,
            n => n.min(partitions),
        }) as usize;
        own * (1 + self.sources.len())
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

    /// The connection string as it is now: `mongodb_uri_file` read again (a rotated Secret),
    /// else `mongodb_uri`. An unreadable file or an unusable URI in it is an error naming the
    /// file; the caller keeps the URI it had.
    pub fn current_uri(&self) -> Result<String, ConfigError> {
        if self.mongodb_uri_file.is_empty() {
            return Ok(self.mongodb_uri.clone());
        }
        let invalid =
            |message: String| validate::bad("mongodb_uri_file", &self.mongodb_uri_file, message);
        let uri = read_uri_file(&self.mongodb_uri_file).map_err(invalid)?;
        let reread = Settings {
            mongodb_uri: uri.clone(),
            ..Settings::default()
        };
        reread.check_uri().map_err(|e| invalid(e.to_string()))?;
        Ok(uri)
    }
}

/// The connection string held in the file at `path` (a mounted Secret), trailing whitespace
/// and newline trimmed. The error names the file, never its content.
pub fn read_uri_file(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let reason = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            std::io::ErrorKind::InvalidData => "not UTF-8 text".to_string(),
            _ => e.kind().to_string(),
        };
        format!("cannot read the connection string from this file: {reason} (is the Secret mounted there, and readable by counterd's user?)")
    })?;
    let uri = text.trim_end().to_string();
    if uri.is_empty() {
        return Err("the file is empty: it must hold the connection string (mongodb://...)".into());
    }
    Ok(uri)
}

/// The password the shipped manifests carry as a placeholder: never a real one.
pub const PLACEHOLDER_PASSWORD: &str = "CHANGE_ME";

/// Whether `uri`'s password is the manifests' placeholder (`CHANGE_ME`, percent-encoded or not).
pub fn has_placeholder_password(uri: &str) -> bool {
    mongodb::options::ConnectionString::parse(uri)
        .ok()
        .and_then(|c| c.credential)
        .and_then(|c| c.password)
        .is_some_and(|p| p == PLACEHOLDER_PASSWORD)
}

/// Parses an RFC 3339 time into the cluster time of its second (the stream's positions).
pub fn parse_time(text: &str) -> Option<bson::Timestamp> {
    let secs = chrono::DateTime::parse_from_rfc3339(text).ok()?.timestamp();
    Some(bson::Timestamp {
        time: secs as u32,
        increment: 0,
    })
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

/// What `counterd run` does on a condition that no retry mends (see `crate::daemon::park`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnFatal {
    /// Park the stream: the process stays up, the stream re-checks and resumes by itself.
    #[default]
    Park,
    /// Stop the process with the condition's exit code.
    Exit,
}

/// The soft-delete rules (see [`crate::core::schema::SoftDelete`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SoftDeleteRule {
    Present,
    True,
    OneOf,
    Never,
}

/// A value that marks a comment deleted under `soft_delete = "one_of"` (untagged: in BSON, the
/// value itself, an Int64 or a string).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SoftDeleteValue {
    Int(i64),
    Str(String),
}

/// Whether a stream without a checkpoint first counts the rows that already exist (the
/// `initial_snapshot` setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum InitialSnapshot {
    /// Snapshot when the stream has never applied anything.
    #[default]
    Auto,
    /// Count only what the stream sees change (existing rows are counted by a `reconcile
    /// --sweep` only).
    Never,
}
