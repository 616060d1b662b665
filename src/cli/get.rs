//! `counterd get POST`: one counter beside the truth.

use std::process::ExitCode;

use crate::cli::{connect, print_json, rfc3339};
use crate::config::Settings;
use crate::event::PostId;
use crate::store::Store;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The post (int:5, str:abc, oid:<hex>, or plain: a number is an int, 24 hex digits an oid).
    pub post: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let store = connect(&settings).await?;
    let post = PostId::parse(&args.post);
    let counter = store.read_counter(&post).await?.unwrap_or_default();
    let truth = store.count_live(&post).await?;
    let state = &counter.state;
    let value = serde_json::json!({
        "post": post.to_string(),
        "displayed": state.displayed(),
        "true_count": truth,
        "difference": state.displayed() - truth,
        "base_count": state.base_count,
        "base_watermark": state.base_watermark,
        "live_delta": state.live_delta,
        "buckets": state.buckets.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        "applied_through": counter.applied_through,
        "last_drift": counter.last_drift,
        "reconciled_at": counter.reconciled_at.map(rfc3339),
    });
    if args.json {
        print_json(&value)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!("post            {post}");
    println!(
        "displayed       {}   (base {} + live {})",
        state.displayed(),
        state.base_count,
        state.live_delta
    );
    println!(
        "true count      {truth}{}",
        if truth == state.displayed() {
            ""
        } else {
            "   (differs: the post is or will be dirty)"
        }
    );
    println!("base watermark  {}", state.base_watermark);
    let buckets: Vec<String> = state
        .buckets
        .iter()
        .map(|(k, v)| format!("{k}:{v:+}"))
        .collect();
    println!(
        "buckets         {}",
        if buckets.is_empty() {
            "none".into()
        } else {
            buckets.join(" ")
        }
    );
    println!(
        "applied through {}",
        counter.applied_through.unwrap_or_else(|| "-".into())
    );
    println!(
        "last drift      {}",
        counter
            .last_drift
            .map(|d| format!(
                "{d:+} at {}",
                counter.reconciled_at.map(rfc3339).unwrap_or_default()
            ))
            .unwrap_or_else(|| "-".into())
    );
    Ok(ExitCode::SUCCESS)
}
