//! `--dry-run`: what the worker would do from the new position, read ahead; moves nothing.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::DateTime;

use crate::cli::print_json;
use crate::config::Settings;
use crate::outln;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{Checkpoint, Position, StreamOptions, StreamStart};

use super::lease::remaining;
use super::{describe, Args};

/// The move an operator asked for: `stream`'s checkpoint to `position`.
pub(super) struct Move<'a> {
    pub settings: &'a Settings,
    pub store: &'a Arc<MongoStore>,
    pub stream: &'a str,
    pub checkpoint: &'a Checkpoint,
    pub position: &'a Position,
}

/// What the read ahead found: events at or below the high water (`seen`, naming `posts`) and
/// beyond it (`new`).
struct Tally {
    seen: u64,
    new: u64,
    posts: BTreeSet<String>,
}

/// Reads ahead from the new position (bounded) to show what the worker would do; moves nothing.
pub(super) async fn dry_run(
    planned: Move<'_>,
    mut report: serde_json::Value,
    args: &Args,
) -> anyhow::Result<ExitCode> {
    let tally = read_ahead(&planned).await?;
    let holder = planned
        .store
        .read_lease(planned.stream)
        .await?
        .filter(|l| l.expires_at > DateTime::now());
    report["events_already_applied"] = tally.seen.into();
    report["events_not_yet_applied"] = tally.new.into();
    report["posts_to_mark_dirty_at_least"] = tally.posts.len().into();
    report["in_flight_batch"] = planned
        .checkpoint
        .pending
        .as_ref()
        .map(|p| serde_json::json!({"end": p.end.to_string(), "counters": p.counters.len()}))
        .unwrap_or(serde_json::Value::Null);
    report["lease_holder"] = holder
        .as_ref()
        .map(|l| serde_json::json!({"owner": l.owner, "epoch": l.epoch}))
        .unwrap_or(serde_json::Value::Null);
    if args.json {
        print_json(&report)?;
    } else {
        print_text(&planned, &report, &tally, holder.as_ref());
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads from the new position for up to 10 seconds (or a million events, or three idle
/// reads), telling the events the worker has applied from those it has not.
async fn read_ahead(planned: &Move<'_>) -> anyhow::Result<Tally> {
    let start = match planned.position {
        Position::Token(t) => StreamStart::After(t.clone()),
        Position::Time(t) => StreamStart::AtTime(*t),
        Position::Unset => StreamStart::Now,
    };
    let mut source = planned
        .store
        .open_stream(StreamOptions {
            start,
            pre_images: false,
            pipeline: vec![],
            max_await: Duration::from_millis(200),
        })
        .await?;
    let (mut seen, mut new, mut posts) = (0u64, 0u64, BTreeSet::new());
    let (schema, high_water) = (planned.settings.schema(), &planned.checkpoint.high_water);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut idle = 0;
    while Instant::now() < deadline && seen + new < 1_000_000 && idle < 3 {
        let batch = source.next_batch(1000, Duration::from_millis(200)).await?;
        if batch.events.is_empty() {
            idle += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        idle = 0;
        for event in batch.events.iter().flatten() {
            if high_water.as_ref().is_some_and(|h| event.token <= *h) {
                seen += 1;
                let keys = event.full_document.iter().chain([&event.document_key]);
                posts.extend(keys.filter_map(|key| schema.post_in(key).map(|p| p.to_string())));
            } else {
                new += 1;
            }
        }
    }
    Ok(Tally { seen, new, posts })
}

/// The dry run's report as text.
fn print_text(
    planned: &Move<'_>,
    report: &serde_json::Value,
    Tally { seen, new, posts }: &Tally,
    holder: Option<&crate::store::Lease>,
) {
    outln!(
        "dry run: would move `{}` from {} to {}",
        report["stream"].as_str().unwrap_or(""),
        report["from"].as_str().unwrap_or("the start"),
        describe(planned.position)
    );
    if let Some(p) = &planned.checkpoint.pending {
        outln!(
            "  a batch left in flight (through token {}, {} counter writes) would be re-applied first",
            p.end,
            p.counters.len()
        );
    }
    outln!("  {seen} events at or below the high water would be re-read: their posts (at least {}) are marked dirty and recounted, never counted twice", posts.len());
    outln!("  {new} events beyond the high water would be applied");
    if let Some(l) = holder {
        outln!(
            "  worker {} holds the stream (lease expires in {}): the move needs --force (fence it out) or --wait",
            l.owner,
            remaining(l)
        );
    }
    outln!("nothing was changed");
}
