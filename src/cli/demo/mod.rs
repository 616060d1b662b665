//! `counterd demo`: the whole product in one command. Starts a throwaway database the way the
//! tests do, seeds posts, runs the worker and reconciler, drives a load generator (inserts,
//! approvals, new ratings, soft deletes, undeletes, hard deletes, and now and then a counter
//! knocked off by hand), and shows the counters over the same rows converging until ctrl-c or
//! `--duration`: comments per post, approved comments per post, and each post's average rating
//! (a `sum` of `rating` kept `with_count`: the sum and its number of rows in one document),
//! as `[[counters]]` definitions when the configuration has none. It prints the drift it
//! injected next to the drift the reconciler reported: they match, because a recount is never
//! installed while a change it could have seen is in flight (no false drift under load).
//!
//! Where it lives: `mod.rs` the database, counterd and the run's order; `load.rs` the load
//! generator and the drift; `view.rs` the live view.

mod load;
mod view;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::{DateTime, Document};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use crate::config::{CounterKind, CounterSetting, InitialSnapshot, Settings};
use crate::core::definition::{Definitions, Kind};
use crate::core::key::GroupValue;
use crate::daemon::{run_sources, shutdown_on_signals, statuses_for, DaemonError};
use crate::local_server::{LocalServer, ServerKind};
use crate::outln;
use crate::reconcile::{ReconcileSettings, Reconciler};
use crate::shutdown::Shutdown;
use crate::status::WorkerStatus;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{displayed_and_truth, SnapshotProgress, SnapshotState};
use load::{reported_drift, DriftTally, Load};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Stop after this long (e.g. 30s, 2m); default: until ctrl-c.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Number of posts.
    #[arg(long, default_value_t = 200)]
    pub posts: usize,
    /// Comments seeded before the worker starts.
    #[arg(long, default_value_t = 2000)]
    pub seed_comments: usize,
    /// Load generator operations per second.
    #[arg(long, default_value_t = 300)]
    pub rate: u32,
    /// Knock a random counter off by hand this often (0s: never).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub drift_every: Duration,
    /// Where counterd's log lines go while the demo runs (the live view owns the screen);
    /// default: counterd-demo-<pid>.log in the temporary directory.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<std::path::PathBuf>,
}

impl Args {
    /// The file the demo's log lines go to.
    pub fn log_path(&self) -> std::path::PathBuf {
        self.log_file.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("counterd-demo-{}.log", std::process::id()))
        })
    }
}

fn post(i: usize) -> GroupValue {
    GroupValue::Str(format!("post-{i:04}"))
}

/// The counter collection of the demo's average rating (a sum of `rating` per post).
const RATINGS: &str = "post_ratings";

/// counterd running inside the demo, as `counterd run` runs it.
struct Counterd {
    task: JoinHandle<Result<(), DaemonError>>,
    statuses: Vec<(String, Arc<WorkerStatus>)>,
    shutdown: Shutdown,
}

impl Counterd {
    fn start(settings: &Settings) -> anyhow::Result<Counterd> {
        let shutdown = shutdown_on_signals();
        let statuses = statuses_for(settings)?;
        let task = tokio::spawn(run_sources(
            settings.clone(),
            statuses.clone(),
            shutdown.clone(),
        ));
        Ok(Counterd {
            task,
            statuses,
            shutdown,
        })
    }

    /// Fails when counterd stopped (an error, or ctrl-c) before `what`; else waits a moment.
    async fn wait_for(&self, what: &str) -> anyhow::Result<()> {
        if self.task.is_finished() || self.shutdown.requested() {
            anyhow::bail!("counterd stopped before {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        Ok(())
    }
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let server = start_server().await?;
    // The log went to this file from the start (see `cli::main`): say where, before the view.
    outln!("counterd's log: {}", args.log_path().display());
    let settings = demo_settings(settings, &server.uri);
    let definitions = settings.definitions()?;
    let _metrics = crate::telemetry::install_recorder();
    let store = crate::cli::connect(&settings).await?;
    let db = store.database().clone();
    let comments = db.collection::<Document>(&settings.comments_collection);
    seed(&settings, &comments, &args).await?;
    create_recount_index(&settings, &definitions, &db).await?;
    // Start the stream in the next second: the fake server also delivers the current one.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let counterd = Counterd::start(&settings)?;
    count_the_seed(&settings, &store, &definitions, &counterd).await?;
    let tally_from = DateTime::now();
    let injected = Arc::new(Mutex::new(DriftTally::default()));
    let (load_stop, load_rx) = Shutdown::new();
    let load = Load {
        comments: comments.clone(),
        schema: settings.schema(),
        drift_targets: drift_targets(&settings, &definitions, &db),
        posts: args.posts,
        rate: args.rate,
        drift_every: args.drift_every,
        injected: injected.clone(),
    };
    let load = tokio::spawn(load.run(load_rx));
    let view = view::View {
        settings: &settings,
        store: &store,
        definitions: &definitions,
        shown: (0..5.min(args.posts)).map(post).collect(),
    };
    live(&view, &counterd, &args, &injected, tally_from).await?;
    load_stop.request();
    let _ = load.await;
    outln!("load stopped; waiting for every counter to converge ...");
    let posts: Vec<GroupValue> = (0..args.posts).map(post).collect();
    let exact = converge(&store, &definitions, &posts, &counterd.shutdown).await?;
    counterd.task.abort();
    let injected = injected.lock().unwrap().clone();
    let reported = reported_drift(&db, &settings.collections().runs, tally_from).await?;
    Ok(summary(&args, &definitions, exact, &injected, &reported))
}

async fn start_server() -> anyhow::Result<LocalServer> {
    let server = tokio::task::spawn_blocking(LocalServer::start)
        .await?
        .map_err(|message| crate::store::StoreError::Fatal {
            op: "start the demo's throwaway database",
            message,
        })?;
    if server.kind == ServerKind::Fake {
        eprintln!(
            "test database: fake mongo-java-server (oplog on) at {}",
            server.uri
        );
    }
    Ok(server)
}

/// The settings the demo runs with: the user's, on the throwaway database, with short
/// intervals so that corrections show within seconds.
fn demo_settings(settings: Settings, uri: &str) -> Settings {
    Settings {
        counters: demo_counters(&settings),
        mongodb_uri: uri.to_string(),
        database: "counterd_demo".into(),
        settle_time: Duration::from_secs(2),
        bucket_width: Duration::from_secs(5),
        reconcile_interval: Duration::from_secs(2),
        idle_interval: Duration::from_millis(50),
        lease_ttl: Duration::from_secs(5),
        lease_renew: Duration::from_secs(1),
        // A pass over every post every 20 s, so hand-made drift on a quiet post is found too.
        background_sweep_pass: Duration::from_secs(20),
        ..settings
    }
}

/// The configured `[[counters]]`, or when there are none, two over the same rows (see
/// docs/counters.md): approved comments per post, and the sum of ratings per post with its
/// number of rows, so that each post's average rating is one document's `count / rows.count`.
/// Settings that cannot take them (a counterd that refuses definitions beside partitions)
/// keep the default alone.
fn demo_counters(settings: &Settings) -> Vec<CounterSetting> {
    if !settings.counters.is_empty() {
        return settings.counters.clone();
    }
    let approved = toml::Table::from_iter([("approved".into(), toml::Value::Boolean(true))]);
    let added = vec![
        CounterSetting {
            name: "approved".into(),
            group_field: settings.group_field.clone(),
            condition: Some(approved),
            collection: "approved_comment_counters".into(),
            ..CounterSetting::default()
        },
        CounterSetting {
            name: "rating".into(),
            group_field: settings.group_field.clone(),
            collection: RATINGS.into(),
            kind: CounterKind::Sum,
            field: Some("rating".into()),
            with_count: true,
            ..CounterSetting::default()
        },
    ];
    let with_added = Settings {
        counters: added,
        ..settings.clone()
    };
    if with_added.definitions().is_ok() {
        with_added.counters
    } else {
        Vec::new()
    }
}

/// Comments that exist before counterd starts, in the configured schema (`group_field`,
/// `created_field`, `soft_delete`); the initial snapshot counts them.
async fn seed(
    settings: &Settings,
    comments: &mongodb::Collection<Document>,
    args: &Args,
) -> anyhow::Result<()> {
    outln!(
        "seeding {} comments over {} posts ...",
        args.seed_comments,
        args.posts
    );
    let mut rng = StdRng::seed_from_u64(42);
    let now = chrono::Utc::now().timestamp();
    let schema = settings.schema();
    let seed: Vec<_> = (0..args.seed_comments)
        .map(|i| {
            let created = DateTime::from_millis((now - rng.random_range(60..86_400)) * 1000);
            let post_ix = rng.random_range(0..args.posts);
            load::comment(&schema, format!("seed-{i}"), post_ix, created, &mut rng)
        })
        .collect();
    for chunk in seed.chunks(1000) {
        comments.insert_many(chunk.to_vec()).await?;
    }
    Ok(())
}

/// The recount index of the README's production checklist, created as an operator would
/// (counterd indexes only its own collections, and `run` warns at start without this one): the
/// group and creation fields, then the summed fields of the sums over the same group, so that
/// their `$sum` is read from the index too (what `counterd doctor` asks for).
async fn create_recount_index(
    settings: &Settings,
    definitions: &Definitions,
    db: &mongodb::Database,
) -> anyhow::Result<()> {
    let schema = settings.schema();
    let mut key = Document::new();
    key.insert(schema.group(), 1);
    key.insert(&schema.created, 1);
    let same_group = definitions
        .iter()
        .filter(|(_, d)| d.group == schema.group());
    for field in same_group.filter_map(|(_, d)| d.kind.field()) {
        key.insert(field, 1);
    }
    db.run_command(bson::doc! {
        "createIndexes": &settings.comments_collection,
        "indexes": [{"key": key, "name": "recount"}],
    })
    .await?;
    Ok(())
}

/// Waits for the stream to open and the seeded rows to be counted: by the initial snapshot
/// beside the running stream, or (without one) by a sweep of each definition. The load starts
/// after it, so that the first screen compares counters that exist.
async fn count_the_seed(
    settings: &Settings,
    store: &Arc<MongoStore>,
    definitions: &Definitions,
    counterd: &Counterd,
) -> anyhow::Result<()> {
    while !counterd.statuses.iter().all(|(_, s)| s.is_stream_open()) {
        counterd.wait_for("its stream opened").await?;
    }
    match finished_snapshot(settings, store, counterd).await? {
        Some(s) => outln!(
            "initial snapshot counted the {} seeded comments ({} counted by the definitions)",
            s.rows_scanned,
            s.rows_counted
        ),
        None => {
            let now = chrono::Utc::now().timestamp();
            for (ix, definition) in definitions.iter() {
                let settings = ReconcileSettings::from(settings).for_counter(ix, &definition.name);
                let reconciler = Reconciler::new(store.clone(), settings);
                let swept = reconciler.sweep(now, |_| {}, None).await?;
                outln!(
                    "initial sweep created {} `{}` counters",
                    swept.summary.corrected,
                    definition.name
                );
            }
        }
    }
    Ok(())
}

/// The initial snapshot once it is done (`None`: the settings run none).
async fn finished_snapshot(
    settings: &Settings,
    store: &Arc<MongoStore>,
    counterd: &Counterd,
) -> anyhow::Result<Option<SnapshotProgress>> {
    loop {
        let checkpoint = store.load_checkpoint(&settings.stream_name).await?;
        match checkpoint.and_then(|c| c.snapshot) {
            Some(s) if s.state == SnapshotState::Running => {}
            Some(s) => return Ok(Some(s)),
            None if settings.initial_snapshot == InitialSnapshot::Never => return Ok(None),
            None => {}
        }
        counterd.wait_for("its initial snapshot was done").await?;
    }
}

/// The counter collections the load knocks off by hand: the default's and the sums' (their
/// drift is reported in the field's units: rating points).
fn drift_targets(
    settings: &Settings,
    definitions: &Definitions,
    db: &mongodb::Database,
) -> Vec<mongodb::Collection<Document>> {
    let sums = definitions
        .iter()
        .filter(|(_, d)| matches!(d.kind, Kind::Sum { .. }))
        .map(|(_, d)| d.collection.as_str());
    std::iter::once(settings.counters_collection.as_str())
        .chain(sums)
        .map(|c| db.collection::<Document>(c))
        .collect()
}

/// The live view, once a second, until ctrl-c or `--duration`.
async fn live(
    view: &view::View<'_>,
    counterd: &Counterd,
    args: &Args,
    injected: &Mutex<DriftTally>,
    tally_from: DateTime,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_events = 0;
    let terminal = std::io::stdout().is_terminal();
    let db = view.store.database();
    loop {
        let stop = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            _ = counterd.shutdown.wait() => true,
        };
        if stop || args.duration.is_some_and(|d| started.elapsed() >= d) {
            return Ok(());
        }
        let events: i64 = counterd
            .statuses
            .iter()
            .map(|(_, s)| s.events_applied())
            .sum();
        if terminal {
            crate::cli::output::write_raw("\x1b[2J\x1b[H");
        }
        show_header(view.store, counterd, started, events - last_events).await?;
        last_events = events;
        view.show_counters().await?;
        let runs = &view.settings.collections().runs;
        let reported = reported_drift(db, runs, tally_from).await?;
        outln!(
            "  drift injected {}   reported {}",
            injected.lock().unwrap(),
            reported
        );
    }
}

/// The first line of a frame: time, rate, lag, the dirty backlog, the last reconcile run.
async fn show_header(
    store: &MongoStore,
    counterd: &Counterd,
    started: Instant,
    rate: i64,
) -> anyhow::Result<()> {
    let dirty = store.dirty_summary().await?;
    let last = store.last_run().await?;
    outln!(
        "counterd demo  t={:>4}s  events/s {:>5}  lag {}s  dirty {:>4}  last reconcile: {} corrected, |drift| {}",
        started.elapsed().as_secs(),
        rate,
        counterd.statuses.iter().map(|(_, s)| s.lag_secs()).max().unwrap_or(0),
        dirty.size,
        last.as_ref().map(|r| r.corrected).unwrap_or(0),
        last.as_ref().map(|r| r.total_abs_drift).unwrap_or_default(),
    );
    Ok(())
}

/// Waits up to a minute for every counter of every definition to equal the truth; whether
/// they all did.
async fn converge(
    store: &MongoStore,
    definitions: &Definitions,
    posts: &[GroupValue],
    shutdown: &Shutdown,
) -> anyhow::Result<bool> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut wrong = 0;
        for (ix, _) in definitions.iter() {
            let view = store.for_counter(ix);
            for p in posts {
                let (shown, truth) = displayed_and_truth(&view, p).await?;
                if shown.differs(truth) {
                    wrong += 1;
                }
            }
        }
        if wrong == 0 || Instant::now() > deadline || shutdown.requested() {
            return Ok(wrong == 0);
        }
        outln!("  {wrong} counters still converging");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The closing lines, and the exit code: success when every counter converged and the drift
/// reported is the drift injected.
fn summary(
    args: &Args,
    definitions: &Definitions,
    exact: bool,
    injected: &DriftTally,
    reported: &DriftTally,
) -> ExitCode {
    outln!("counterd's log is in {}", args.log_path().display());
    outln!("drift injected by hand:   {injected}");
    outln!("drift the reconciler reported: {reported}");
    let matched = injected.matches(reported);
    if matched {
        outln!("they match: every correction was real, none was missed");
    } else {
        outln!("they DIFFER: a correction was invented or missed");
    }
    if exact && matched {
        outln!(
            "converged: all {} counters of each of {} definitions ({}) equal the truth",
            args.posts,
            definitions.len(),
            definitions.names().join(", ")
        );
        return ExitCode::SUCCESS;
    }
    if !exact {
        outln!("NOT converged within 60 s");
    }
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_adds_an_average_rating_beside_the_counts_unless_counters_are_configured() {
        let settings = Settings::default();
        let added = demo_counters(&settings);
        let names: Vec<&str> = added.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["approved", "rating"]);
        assert!(added[1].with_count && added[1].field.as_deref() == Some("rating"));
        let definitions = Settings {
            counters: added.clone(),
            ..Settings::default()
        }
        .definitions()
        .unwrap();
        assert_eq!(
            definitions.names(),
            ["default", "approved", "rating", "rating_rows"]
        );
        let configured = Settings {
            counters: vec![added[0].clone()],
            ..Settings::default()
        };
        assert_eq!(demo_counters(&configured), vec![added[0].clone()]);
    }
}
