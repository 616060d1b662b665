//! The command line: one file per subcommand, each with its own arguments and output.

mod collections;
mod config;
mod counter;
mod demo;
mod dirty;
mod doctor;
pub mod exit;
mod get;
pub mod output;
mod reconcile;
mod replay;
mod run;
mod snapshot;
mod status;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::config::{ConfigError, Loaded, Override, Settings};
use crate::redact::redact_text;
use crate::store::mongo::MongoStore;

pub use output::{print_json, rfc3339};

/// counterd keeps per-post comment counters in MongoDB honest: it tails the `comments` change
/// stream into idempotent counter increments and recounts dirty posts in the background.
#[derive(Debug, Parser)]
#[command(name = "counterd", version, about, long_about = None)]
pub struct Cli {
    /// TOML settings file (see counterd.example.toml).
    #[arg(long, global = true, env = "COUNTERD_CONFIG")]
    pub config: Option<PathBuf>,
    /// MongoDB connection string (overrides mongodb_uri).
    #[arg(long, global = true)]
    pub mongodb_uri: Option<String>,
    /// Database holding `comments` (overrides database).
    #[arg(long, global = true)]
    pub database: Option<String>,
    /// Log JSON lines instead of human-readable text.
    #[arg(long, global = true)]
    pub log_json: bool,
    /// Log at debug level and print a failure's full text (the driver's own, secrets redacted)
    /// after its one-sentence cause.
    #[arg(long, short = 'v', global = true)]
    pub verbose: bool,
    /// Override any setting: --set name=value (repeatable).
    #[arg(long = "set", global = true, value_name = "NAME=VALUE")]
    pub set: Vec<String>,
    /// Work on one source only: a `[[sources]]` entry's name, or `stream_name` for the comments
    /// (`run` then runs that source's streams alone; `replay`, `snapshot` and `doctor` need it
    /// for another source than the comments; `status` shows every source without it;
    /// `--counter` finds its source by itself).
    #[arg(long, global = true, value_name = "NAME")]
    pub source: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the worker, the reconciler and the HTTP endpoints until SIGTERM or ctrl-c.
    Run(run::Args),
    /// Show the checkpoint (token and time), stream lag, dirty backlog and the last reconcile.
    Status(status::Args),
    /// List the dirty backlog: posts waiting for a recount.
    Dirty(dirty::Args),
    /// Recount now: the dirty posts once, one post, or a full sweep.
    Reconcile(reconcile::Args),
    /// Move the stream's checkpoint to a token or a time (events already applied are only
    /// re-marked dirty, never counted twice).
    Replay(replay::Args),
    /// Take (or finish) the initial snapshot of existing comments by hand, in the foreground
    /// (`run` takes it by itself on a new stream unless initial_snapshot = "never").
    Snapshot(snapshot::Args),
    /// Show one post's counter (displayed, base, live, buckets) beside its true count.
    Get(get::Args),
    /// Compare a sample of counters with the truth; exits 1 on any mismatch.
    Verify(verify::Args),
    /// Print the effective settings (password redacted) and where each came from; with
    /// --check, only validate them (nothing is contacted).
    Config(config::Args),
    /// Check the set-up before and after deploying: server version, replica set, privileges,
    /// the recount index, pre-images, snapshot reads, the configured fields in a sample of rows,
    /// clock skew. One line per finding with its fix; exits 1 on any problem.
    Doctor(doctor::Args),
    /// The demo: a throwaway database, the worker, a load generator and a live view.
    Demo(demo::Args),
}

impl Cli {
    /// Records the secrets of every URI given on the command line or in the environment before
    /// anything can fail, so that no message (a refused setting, a TOML error quoting a line)
    /// shows them, even outside a URI.
    fn remember_secrets(&self) {
        let set = self.set.iter().filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            (name.trim() == "mongodb_uri").then(|| value.to_string())
        });
        let env = std::env::var("COUNTERD_MONGODB_URI").ok();
        for uri in self.mongodb_uri.iter().cloned().chain(set).chain(env) {
            crate::redact::remember_secrets(&uri);
        }
    }

    /// Settings with where each came from.
    pub fn load(&self) -> Result<Loaded, ConfigError> {
        let mut overrides = Vec::new();
        let named = |name: &str, flag: &str, value: &str| Override {
            name: name.into(),
            value: value.into(),
            origin: format!("flag {flag}"),
        };
        // Flags of one subcommand that override a setting (only `run` serves HTTP).
        let http_addr = match &self.command {
            Command::Run(args) => args.http_addr.as_deref(),
            _ => None,
        };
        for (name, flag, value) in [
            ("mongodb_uri", "--mongodb-uri", self.mongodb_uri.as_deref()),
            ("database", "--database", self.database.as_deref()),
            ("http_addr", "--http-addr", http_addr),
            ("log_format", "--log-json", self.log_json.then_some("json")),
            ("log_level", "--verbose", self.verbose.then_some("debug")),
        ] {
            overrides.extend(value.map(|v| named(name, flag, v)));
        }
        for pair in &self.set {
            let Some((name, value)) = pair.split_once('=') else {
                let message = "expected --set name=value";
                return Err(ConfigError::invalid(pair, "flag --set", pair, message));
            };
            overrides.push(named(name.trim(), "--set", value));
        }
        Settings::load_traced(self.config.as_deref(), std::env::vars(), &overrides)
    }
}

/// Runs the parsed command line.
pub async fn main(cli: Cli) -> ExitCode {
    cli.remember_secrets();
    let loaded = match cli.load() {
        Ok(l) => l,
        Err(e) => return refused(&format!("configuration error: {e}")),
    };
    let settings = match cli.source.as_ref().map(|s| loaded.settings.source_named(s)) {
        None => loaded.settings.clone(),
        Some(Ok(source)) => source,
        Some(Err(e)) => return refused(&e.to_string()),
    };
    crate::redact::remember_secrets(&settings.mongodb_uri);
    let json_logs = settings.log_format == "json";
    match &cli.command {
        // The demo's live view owns the screen: its log lines go to a file it names.
        Command::Demo(args) => {
            let path = args.log_path();
            if let Err(e) =
                crate::telemetry::init_logging_to_file(json_logs, &settings.log_level, &path)
            {
                let path = path.display();
                return refused(&format!("cannot write the demo's log to {path}: {e}"));
            }
        }
        _ => crate::telemetry::init_logging(json_logs, &settings.log_level),
    }
    for variable in &loaded.ignored_env {
        tracing::debug!(%variable, "ignoring a Kubernetes service-link variable (not a setting)");
    }
    let verbose = cli.verbose;
    let result = match cli.command {
        Command::Config(args) => config::run(loaded, args).await,
        Command::Run(args) => run::run(settings, args).await,
        Command::Status(args) => status::run(settings, args).await,
        Command::Dirty(args) => dirty::run(settings, args).await,
        Command::Reconcile(args) => reconcile::run(settings, args).await,
        Command::Replay(args) => replay::run(settings, args).await,
        Command::Snapshot(args) => snapshot::run(settings, args).await,
        Command::Get(args) => get::run(settings, args).await,
        Command::Verify(args) => verify::run(settings, args).await,
        Command::Doctor(args) => doctor::run(settings, args).await,
        Command::Demo(args) => demo::run(settings, args).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("counterd: {}", exit::describe(&e));
            if verbose {
                eprintln!("counterd: in full: {}", exit::describe_in_full(&e));
            }
            ExitCode::from(exit::code_for(&e))
        }
    }
}

/// Says why the command cannot start (secrets redacted) and ends it with the exit code of
/// configuration errors, as of usage errors.
fn refused(why: &str) -> ExitCode {
    eprintln!("counterd: {}", redact_text(why));
    ExitCode::from(exit::USAGE)
}

/// Connects to the configured database (one-shot commands fail fast with a clear error).
pub async fn connect(settings: &Settings) -> anyhow::Result<Arc<MongoStore>> {
    crate::doctor::tls::check_files(&settings.mongodb_uri).map_err(ConfigError::from)?;
    let store = MongoStore::connect(&settings.into()).await?;
    Ok(Arc::new(store))
}

/// The checkpoints of the configured streams (partitions) that have one.
async fn checkpoints(
    settings: &Settings,
    store: &MongoStore,
) -> crate::store::StoreResult<Vec<crate::store::Checkpoint>> {
    let mut found = Vec::new();
    for (stream, _) in settings.streams() {
        found.extend(crate::store::Checkpoints::load_checkpoint(store, &stream).await?);
    }
    Ok(found)
}

/// Whether the initial snapshot of any of the configured streams is still running (counts are
/// not comparable until it is done).
pub async fn snapshot_running(settings: &Settings, store: &MongoStore) -> anyhow::Result<bool> {
    let found = checkpoints(settings, store).await?;
    Ok(found.iter().any(crate::store::Checkpoint::snapshot_running))
}

/// Renews `fence`'s lease for `owner` for a full `lease_ttl`: false if another worker took the
/// stream meanwhile (a one-shot command that writes for a stream checks this before each write).
pub async fn still_ours(
    store: &MongoStore,
    settings: &Settings,
    fence: &crate::store::Fence,
    owner: &str,
) -> crate::store::StoreResult<bool> {
    crate::store::Leases::renew_lease(
        store,
        &fence.stream,
        owner,
        fence.epoch,
        settings.lease_ttl,
        bson::DateTime::now(),
    )
    .await
}

/// Posts whose dirty marks are still being written: a batch's counters, ledger entries and
/// dirty marks go out side by side (the checkpoint after all three), so a counter can already
/// show a batch's change while its post is not in the dirty set yet. Until the checkpoint moves,
/// the batch's intent (the checkpoint's `pending`) names those posts; reporting them keeps `get`,
/// `dirty` and `status` from calling a post clean that is about to be marked.
pub async fn marks_in_flight(
    settings: &Settings,
    store: &MongoStore,
) -> crate::store::StoreResult<std::collections::BTreeSet<crate::core::key::GroupValue>> {
    // The marks of the definition `store` is a view of.
    let counter = crate::store::CounterViews::viewed_counter(store);
    let pending = checkpoints(settings, store).await?.into_iter();
    Ok(pending
        .filter_map(|c| c.pending)
        .flat_map(|p| p.dirty)
        .filter(|m| m.key.counter == counter)
        .map(|m| m.key.group)
        .collect())
}

/// Each post's displayed value beside its true count, compared consistently with the stream of
/// the partition that owns it (a post with a change in flight has no `truth`).
pub async fn observe(
    settings: &Settings,
    store: &Arc<MongoStore>,
    posts: &[crate::core::key::GroupValue],
) -> anyhow::Result<Vec<crate::recount::Observation>> {
    let mut out = Vec::with_capacity(posts.len());
    for (stream, partition) in settings.streams() {
        let owned: Vec<_> = posts
            .iter()
            .filter(|p| partition.is_none_or(|part| part.owns(p)))
            .cloned()
            .collect();
        if owned.is_empty() {
            continue;
        }
        let recounter = crate::recount::Recounter::new(
            store.clone(),
            Arc::new(crate::clock::SystemClock),
            stream,
            settings.bucket_width_secs(),
            settings.into(),
        );
        out.extend(recounter.observe(&owned).await?);
    }
    out.sort_by(|a, b| a.post.cmp(&b.post));
    Ok(out)
}

/// Seconds since a date, for "age" columns.
pub fn age_secs(t: bson::DateTime) -> i64 {
    ((bson::DateTime::now().timestamp_millis() - t.timestamp_millis()) / 1000).max(0)
}
