//! `counterd reconcile`: recount now: the dirty posts once, one post, or a full sweep.

use std::process::ExitCode;

use crate::cli::exit::NotYet;
use crate::cli::{connect, print_json};
use crate::config::{InitialSnapshot, Settings};
use crate::core::key::GroupValue;
use crate::outln;
use crate::reconcile::{ReconcileSettings, Reconciler, RunReport};
use crate::store::prelude::*;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// One run over the dirty posts (the default when nothing else is asked). `--once`,
    /// `--post` and `--sweep` are alternatives: two of them together are refused (exit 2).
    #[arg(long, conflicts_with_all = ["sweep", "post"])]
    pub once: bool,
    /// Recount just this post (int:5, str:abc, oid:<hex>, or plain).
    #[arg(long, value_name = "ID", conflicts_with = "sweep")]
    pub post: Option<String>,
    /// Recount every post, window by window, with progress.
    #[arg(long)]
    pub sweep: bool,
    /// List every correction {post, wrong, right}.
    #[arg(long)]
    pub verbose: bool,
    /// Print the run as JSON (summary and corrections).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub counter: crate::cli::counter::CounterArg,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let (settings, counter) = args.counter.resolve(settings)?;
    let store = connect(&settings).await?;
    refuse_before_the_initial_snapshot(&settings, store.as_ref()).await?;
    let now = chrono::Utc::now().timestamp();
    let quiet = args.json;
    if args.sweep && args.counter.given.is_none() {
        // Every definition of the source, the default first: the stream's sweep request is
        // cleared once all of them swept (see `reconcile::sweep_all`).
        let reconcilers: Vec<_> = settings
            .definitions()?
            .iter()
            .map(|(ix, d)| {
                let settings_for = ReconcileSettings::from(&settings).for_counter(ix, &d.name);
                Reconciler::new(store.clone(), settings_for)
            })
            .collect();
        let progress = |name: &str, done: u64| {
            if !quiet {
                eprintln!("sweep {name}: {done} posts recounted")
            }
        };
        let reports = crate::reconcile::sweep_all(&reconcilers, now, progress, None).await?;
        if let [report] = reports.as_slice() {
            print_report(report, args.verbose, args.json)?;
        } else if args.json {
            print_json(&reports)?;
        } else {
            for report in &reports {
                print_report(report, args.verbose, false)?;
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let settings_for = ReconcileSettings::from(&settings).for_counter(counter, args.counter.name());
    let reconciler = Reconciler::new(store, settings_for);
    let progress = |done| {
        if !quiet {
            eprintln!("sweep: {done} posts recounted")
        }
    };
    let report = if let Some(post) = &args.post {
        reconciler.run_post(&GroupValue::parse(post), now).await?
    } else if args.sweep {
        reconciler.sweep(now, progress, None).await?
    } else {
        reconciler.run_dirty(now).await?
    };
    print_report(&report, args.verbose, args.json)?;
    Ok(ExitCode::SUCCESS)
}

/// A stream no worker has started yet gets its counts from the initial snapshot of the first
/// `counterd run` (`initial_snapshot = "auto"`): a fold made now would be counted again by the
/// snapshot's claims. So nothing is reconciled until the stream has begun.
async fn refuse_before_the_initial_snapshot(
    settings: &Settings,
    store: &crate::store::mongo::MongoStore,
) -> anyhow::Result<()> {
    if settings.initial_snapshot != InitialSnapshot::Auto {
        return Ok(());
    }
    for (stream, _) in settings.streams() {
        let untouched = store
            .load_checkpoint(&stream)
            .await?
            .is_none_or(|c| c.untouched());
        if untouched {
            anyhow::bail!(NotYet(format!(
                "nothing reconciled: counterd has not started on stream '{stream}' yet, and the initial snapshot of its first `counterd run` counts every post (a recount now would be counted twice); start `counterd run`, or set initial_snapshot = \"never\" if counters are kept some other way"
            )));
        }
    }
    Ok(())
}

fn print_report(report: &RunReport, verbose: bool, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(report);
    }
    let s = &report.summary;
    if !s.counter.is_empty() && s.counter != crate::core::definition::DEFAULT_COUNTER {
        outln!("counter {}:", s.counter);
    }
    outln!(
        "{} run: {} posts recounted ({} count queries), {} corrected, total |drift| {} (max {}, high +{}, low {}), watermark {}",
        s.kind, s.posts, s.counts, s.corrected, s.total_abs_drift, s.max_abs_drift, s.drift_high, s.drift_low, s.watermark
    );
    if verbose {
        for c in &report.corrections {
            outln!(
                "  {}: was {}, now {} (drift {:+})",
                c.post,
                c.wrong,
                c.right,
                c.drift
            );
        }
    }
    if s.in_flight > 0 {
        outln!(
            "  {} post(s) left dirty: a change to them was in flight while they were counted, or the worker did not apply everything the count could have seen within catch_up_timeout (is `counterd run` running and caught up?); they are recounted later: {}",
            s.in_flight,
            report.contended.join(", ")
        );
    }
    if s.waiting_for_snapshot > 0 {
        outln!(
            "  {} post(s) not counted: the initial snapshot is still running, or claimed rows while they were counted (see `counterd status`); they are recounted once it is done",
            s.waiting_for_snapshot
        );
    }
    if s.waiting > 0 {
        outln!(
            "  {} post(s) folded but kept dirty until the watermark passes their newest change",
            s.waiting
        );
    }
    Ok(())
}
