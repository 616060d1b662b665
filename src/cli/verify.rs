//! `counterd verify`: sample counters and compare them with the truth.

use std::process::ExitCode;

use crate::cli::{connect, print_json};
use crate::config::Settings;
use crate::store::{displayed_and_truth, Store};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many counters to sample.
    #[arg(long, default_value_t = 100)]
    pub sample: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let store = connect(&settings).await?;
    let posts = store.sample_posts(args.sample).await?;
    let mut mismatches = Vec::new();
    for post in &posts {
        let (displayed, truth) = displayed_and_truth(store.as_ref(), post).await?;
        if displayed != truth {
            mismatches.push(serde_json::json!({"post": post.to_string(), "displayed": displayed, "true_count": truth}));
        }
    }
    if args.json {
        print_json(&serde_json::json!({"sampled": posts.len(), "mismatches": mismatches}))?;
    } else {
        println!(
            "sampled {} counters: {} mismatch(es)",
            posts.len(),
            mismatches.len()
        );
        for m in &mismatches {
            println!(
                "  {}: displayed {}, true {}",
                m["post"].as_str().unwrap_or(""),
                m["displayed"],
                m["true_count"]
            );
        }
    }
    Ok(if mismatches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
