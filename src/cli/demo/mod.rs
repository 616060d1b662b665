//! `counterd demo`: the whole product in one command. Starts a throwaway database the way the
//! tests do, seeds posts, runs the worker and reconciler, drives a load generator (inserts,
//! approvals, soft deletes, undeletes, hard deletes, and now and then a counter knocked off by
//! hand), and shows two counters over the same rows converging (comments per post, and approved
//! comments per post as a `[[counters]]` definition when the configuration has none), until
//! ctrl-c or `--duration`. It prints the drift it injected next to
//! the drift the reconciler reported: they match, because a recount is never installed while a
//! change it could have seen is in flight (no false drift under load).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, DateTime};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::config::InitialSnapshot;
use crate::config::Settings;
use crate::core::key::PostId;
use crate::daemon::{run_sources, shutdown_on_signals, statuses_for};
use crate::outln;
use crate::reconcile::{ReconcileSettings, Reconciler};
use crate::shutdown::Shutdown;
use crate::store::displayed_and_truth;
use crate::store::prelude::*;
use crate::store::SnapshotState;
use std::sync::Mutex;

use crate::local_server::{LocalServer, ServerKind};

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

fn post(i: usize) -> PostId {
    PostId::Str(format!("post-{i:04}"))
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
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
    // The log went to this file from the start (see `cli::main`): say where, before the view.
    outln!("counterd's log: {}", args.log_path().display());
    // A second counter over the same rows when none is configured: approved comments per
    // post, kept from the same stream (see `[[counters]]` in docs/counters.md).
    let counters = if settings.counters.is_empty() && settings.partitions <= 1 {
        let mut approved = toml::Table::new();
        approved.insert("approved".into(), toml::Value::Boolean(true));
        vec![crate::config::CounterSetting {
            name: "approved".into(),
            group_field: settings.group_field.clone(),
            condition: Some(approved),
            collection: "approved_comment_counters".into(),
            kind: Default::default(),
            field: None,
            with_count: false,
        }]
    } else {
        settings.counters.clone()
    };
    let settings = Settings {
        counters,
        mongodb_uri: server.uri.clone(),
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
    };
    let _metrics = crate::http::install_metrics();
    let store = crate::cli::connect(&settings).await?;
    let db = store.database().clone();
    let comments = db.collection::<bson::Document>(&settings.comments_collection);

    // Seed: comments that exist before counterd starts; a sweep creates their counters.
    outln!(
        "seeding {} comments over {} posts ...",
        args.seed_comments,
        args.posts
    );
    let mut rng = StdRng::seed_from_u64(42);
    let now = chrono::Utc::now().timestamp();
    // Rows in the configured schema (`group_field`, `created_field`, `soft_delete`).
    let schema = settings.schema();
    let seed: Vec<_> = (0..args.seed_comments)
        .map(|i| {
            let created = DateTime::from_millis((now - rng.random_range(60..86_400)) * 1000);
            let mut row = schema.row_document(
                format!("seed-{i}"),
                &post(rng.random_range(0..args.posts)),
                created,
                false,
            );
            row.insert("body", "hello");
            row.insert("approved", rng.random_bool(0.5));
            row
        })
        .collect();
    for chunk in seed.chunks(1000) {
        comments.insert_many(chunk.to_vec()).await?;
    }
    // The recount index of the README's production checklist, created as an operator would (counterd
    // indexes only its own collections, and `run` warns at start without this one).
    let mut key = bson::Document::new();
    key.insert(&schema.group, 1);
    key.insert(&schema.created, 1);
    db.run_command(bson::doc! {
        "createIndexes": &settings.comments_collection,
        "indexes": [{"key": key, "name": "recount"}],
    })
    .await?;
    // Start the stream in the next second: the fake server also delivers the current one.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // counterd itself, as `counterd run` runs it.
    let shutdown = shutdown_on_signals();
    let statuses = statuses_for(&settings)?;
    let counterd = tokio::spawn(run_sources(
        settings.clone(),
        statuses.clone(),
        shutdown.clone(),
    ));
    while !statuses.iter().all(|(_, s)| s.is_stream_open()) {
        if counterd.is_finished() || shutdown.requested() {
            anyhow::bail!("counterd stopped before its stream opened");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The seeded rows predate the stream. The worker's initial snapshot counts them beside the
    // running stream; the load starts once it is done, so that the first screen compares
    // counters that exist (without a snapshot, a sweep creates them).
    let definitions = settings.definitions()?;
    let snapshot = loop {
        let checkpoint = store.load_checkpoint(&settings.stream_name).await?;
        match checkpoint.and_then(|c| c.snapshot) {
            Some(s) if s.state == SnapshotState::Running => {}
            Some(s) => break Some(s),
            None if settings.initial_snapshot == InitialSnapshot::Never => break None,
            None => {}
        }
        if counterd.is_finished() || shutdown.requested() {
            anyhow::bail!("counterd stopped before its initial snapshot was done");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    match snapshot {
        Some(s) => outln!(
            "initial snapshot counted the {} seeded comments ({} counted by the definitions)",
            s.rows_scanned,
            s.rows_counted
        ),
        None => {
            for (ix, definition) in definitions.iter() {
                let settings = ReconcileSettings::from(&settings).for_counter(ix, &definition.name);
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
    let tally_from = DateTime::now();
    let injected = Arc::new(Mutex::new(DriftTally::default()));
    let (load_stop, load_rx) = Shutdown::new();
    let load = tokio::spawn(load_generator(
        comments.clone(),
        schema.clone(),
        settings.counters_collection.clone(),
        args.posts,
        args.rate,
        args.drift_every,
        injected.clone(),
        load_rx,
    ));

    let started = Instant::now();
    let mut last_events = 0;
    let terminal = std::io::stdout().is_terminal();
    loop {
        let stop = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            _ = shutdown.wait() => true,
        };
        if stop || args.duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let events: i64 = statuses.iter().map(|(_, s)| s.events_applied()).sum();
        let rate = events - last_events;
        last_events = events;
        let dirty = store.dirty_summary().await?;
        let last = store.last_run().await?;
        if terminal {
            crate::cli::output::write_raw("\x1b[2J\x1b[H");
        }
        outln!(
            "counterd demo  t={:>4}s  events/s {:>5}  lag {}s  dirty {:>4}  last reconcile: {} corrected, |drift| {}",
            started.elapsed().as_secs(),
            rate,
            statuses.iter().map(|(_, s)| s.lag_secs()).max().unwrap_or(0),
            dirty.size,
            last.as_ref().map(|r| r.corrected).unwrap_or(0),
            last.as_ref().map(|r| r.total_abs_drift).unwrap_or_default(),
        );
        let shown: Vec<PostId> = (0..5).map(post).collect();
        for (ix, definition) in definitions.iter() {
            outln!("  counter `{}` ({definition})", definition.name);
            let view = Arc::new(store.for_counter(ix));
            for o in crate::cli::observe(&settings, &view, &shown).await? {
                match o.truth {
                    Some(truth) => outln!(
                        "    {}: displayed {:>4}  true {truth:>4}{}",
                        o.post,
                        o.displayed,
                        if o.displayed == truth {
                            ""
                        } else {
                            "  (drift: to be corrected)"
                        }
                    ),
                    None => outln!(
                        "    {}: displayed {:>4}  (a change is in flight)",
                        o.post,
                        o.displayed
                    ),
                }
            }
        }
        let reported = reported_drift(&db, &settings.collections().runs, tally_from).await?;
        outln!(
            "  drift injected {}   reported {}",
            injected.lock().unwrap(),
            reported
        );
    }
    load_stop.request();
    let _ = load.await;
    outln!("load stopped; waiting for every counter to converge ...");
    let posts: Vec<PostId> = (0..args.posts).map(post).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let exact = loop {
        let mut wrong = 0;
        for (ix, _) in definitions.iter() {
            let view = store.for_counter(ix);
            for p in &posts {
                let (shown, truth) = displayed_and_truth(&view, p).await?;
                if shown != truth {
                    wrong += 1;
                }
            }
        }
        if wrong == 0 || Instant::now() > deadline || shutdown.requested() {
            break wrong == 0;
        }
        outln!("  {wrong} counters still converging");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    // Stop counterd if the signal did not already.
    counterd.abort();
    let injected = injected.lock().unwrap().clone();
    let reported = reported_drift(&db, &settings.collections().runs, tally_from).await?;
    outln!("counterd's log is in {}", args.log_path().display());
    outln!("drift injected by hand:   {injected}");
    outln!("drift the reconciler reported: {reported}");
    let matched = injected == reported;
    outln!(
        "{}",
        if matched {
            "they match: every correction was real, none was missed"
        } else {
            "they DIFFER: a correction was invented or missed"
        }
    );
    if exact && matched {
        outln!(
            "converged: all {} counters of each of {} definitions ({}) equal the true count",
            posts.len(),
            definitions.len(),
            definitions.names().join(", ")
        );
        Ok(ExitCode::SUCCESS)
    } else {
        if !exact {
            outln!("NOT converged within 60 s");
        }
        Ok(ExitCode::FAILURE)
    }
}

/// Drift by sign: how many posts, and the sum of |drift|, ran high and low.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct DriftTally {
    high_posts: u64,
    high_sum: i64,
    low_posts: u64,
    low_sum: i64,
}

impl DriftTally {
    fn add(&mut self, drift: i64) {
        if drift > 0 {
            self.high_posts += 1;
            self.high_sum += drift;
        } else if drift < 0 {
            self.low_posts += 1;
            self.low_sum += -drift;
        }
    }
}

impl std::fmt::Display for DriftTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "high {} post(s) |{}|, low {} post(s) |{}|",
            self.high_posts, self.high_sum, self.low_posts, self.low_sum
        )
    }
}

/// The corrections of every reconcile run since `since`, by sign.
async fn reported_drift(
    db: &mongodb::Database,
    runs: &str,
    since: DateTime,
) -> anyhow::Result<DriftTally> {
    let mut tally = DriftTally::default();
    let mut runs = db
        .collection::<bson::Document>(runs)
        .find(doc! {"started_at": {"$gte": since}})
        .await?;
    use futures::TryStreamExt;
    let int = |run: &bson::Document, field: &str| run.get_i64(field).unwrap_or_default();
    while let Some(run) = runs.try_next().await? {
        tally.high_posts += int(&run, "corrected_high") as u64;
        tally.high_sum += int(&run, "drift_high");
        tally.low_posts += int(&run, "corrected_low") as u64;
        tally.low_sum -= int(&run, "drift_low");
    }
    Ok(tally)
}

/// Inserts, soft-deletes, undeletes and hard-deletes comments at `rate` per second, and now and
/// then knocks a counter off by hand (the drift counterd exists to correct).
#[allow(clippy::too_many_arguments)]
async fn load_generator(
    comments: mongodb::Collection<bson::Document>,
    schema: crate::core::schema::Schema,
    counters: String,
    posts: usize,
    rate: u32,
    drift_every: Duration,
    injected: Arc<Mutex<DriftTally>>,
    stop: Shutdown,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(7);
    let mut ids: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(1) as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_drift = Instant::now();
    let mut edited_posts = std::collections::HashSet::new();
    let counters = comments
        .client()
        .database(comments.namespace().db.as_str())
        .collection::<bson::Document>(&counters);
    let mut n = 0u64;
    while !stop.requested() {
        tick.tick().await;
        n += 1;
        let roll = rng.random_range(0..100);
        let result = if ids.is_empty() || roll < 55 {
            let id = format!("c-{n}");
            ids.push(id.clone());
            let created = chrono::Utc::now().timestamp() - rng.random_range(0..120);
            let mut row = schema.row_document(
                id,
                &post(rng.random_range(0..posts)),
                DateTime::from_millis(created * 1000),
                false,
            );
            row.insert("approved", rng.random_bool(0.5));
            comments.insert_one(row).await.map(|_| ())
        } else {
            let id = ids[rng.random_range(0..ids.len())].clone();
            match roll {
                // Approve or unapprove: moves the row in or out of the `approved` counter.
                55..=64 => comments
                    .update_one(doc! {"_id": &id}, doc! {"$set": {"approved": roll < 60}})
                    .await
                    .map(|_| ()),
                65..=89 => {
                    let update = if roll < 80 {
                        schema.soft_delete_update(DateTime::now())
                    } else {
                        schema.undelete_update()
                    };
                    match update {
                        Some(update) => comments
                            .update_one(doc! {"_id": &id}, update)
                            .await
                            .map(|_| ()),
                        None => Ok(()), // soft_delete = "never"
                    }
                }
                _ => {
                    ids.retain(|i| *i != id);
                    comments.delete_one(doc! {"_id": &id}).await.map(|_| ())
                }
            }
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "load generator write failed");
        }
        if !drift_every.is_zero() && last_drift.elapsed() >= drift_every {
            last_drift = Instant::now();
            let amount = if rng.random_bool(0.5) { 3 } else { -2 };
            // Edit `base_count`: exactly what a fold replaces with a recount, so the drift
            // reported for the post is exactly `amount`; each
            // post is edited at most once, so two edits of one post cannot net out).
            let target = post(rng.random_range(0..posts));
            if edited_posts.insert(target.clone()) {
                let edited = counters
                    .update_one(
                        doc! {"_id": target.to_bson()},
                        doc! {"$inc": {"base_count": amount, "count": amount}},
                    )
                    .await;
                if edited.is_ok_and(|r| r.modified_count == 1) {
                    injected.lock().unwrap().add(amount);
                }
            }
        }
    }
    Ok(())
}
