//! `counterd verify`: sample counters and compare them with the truth.

use std::process::ExitCode;

use crate::cli::{observe, print_json};
use crate::config::Settings;
use crate::outln;
use crate::store::prelude::*;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many counters to sample.
    #[arg(long, default_value_t = 100)]
    pub sample: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub counter: crate::cli::counter::CounterArg,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let (settings, store) = args.counter.open(settings).await?;
    let posts = store.sample_posts(args.sample).await?;
    if crate::cli::snapshot_running(&settings, &store).await? {
        return Err(crate::cli::exit::NotYet("not verified: the initial snapshot is still counting the rows that existed before the stream's start; counters are comparable once it is done (see `counterd status`)".into()).into());
    }
    let observations = observe(&settings, &store, &posts).await?;
    let mut mismatches = Vec::new();
    let mut in_flight = Vec::new();
    for o in &observations {
        if o.count_broken() {
            // Readers see `count`: it must equal `base_count + live_delta`.
            mismatches.push(serde_json::json!({"post": o.post.to_string(), "displayed": o.displayed, "count": o.count, "problem": "count differs from base_count + live_delta"}));
            continue;
        }
        match (o.truth, o.mismatch()) {
            (None, _) => in_flight.push(o.post.to_string()),
            (Some(truth), Some(_)) => mismatches.push(serde_json::json!({"post": o.post.to_string(), "displayed": o.displayed, "true_count": truth})),
            (Some(_), None) => {}
        }
    }
    if args.json {
        print_json(
            &serde_json::json!({"sampled": posts.len(), "mismatches": mismatches, "in_flight": in_flight}),
        )?;
    } else {
        outln!(
            "sampled {} counters: {} mismatch(es), {} with a change in flight (not compared)",
            posts.len(),
            mismatches.len(),
            in_flight.len()
        );
        for m in &mismatches {
            match m.get("problem") {
                Some(problem) => outln!(
                    "  {}: count {}, base_count + live_delta {}: {}",
                    m["post"].as_str().unwrap_or(""),
                    m["count"],
                    m["displayed"],
                    problem.as_str().unwrap_or("")
                ),
                None => outln!(
                    "  {}: displayed {}, true {}",
                    m["post"].as_str().unwrap_or(""),
                    m["displayed"],
                    m["true_count"]
                ),
            }
        }
    }
    Ok(if mismatches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::cli::exit::CHECK_FAILED)
    })
}
