//! `counterd replay`: move the stream's checkpoint to a token or a time. Events at or below the
//! high water were applied before, so re-reading them only marks their posts dirty (the
//! reconciler recounts them); nothing is counted twice.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::cli::exit::{CheckFailed, UsageError};
use crate::cli::{connect, print_json};
use crate::config::{parse_time, Settings};
use crate::event::{ChangeEvent, Token};
use crate::outln;
use crate::store::{Position, Store, StreamOptions, StreamStart};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["from_token", "from_time"])))]
pub struct Args {
    /// Resume after this resume token (`_data` hex string).
    #[arg(long, value_name = "TOKEN")]
    pub from_token: Option<String>,
    /// Start at this time (RFC 3339), e.g. 2026-01-31T12:00:00Z.
    #[arg(long, value_name = "TIME")]
    pub from_time: Option<String>,
    /// Show what would change (events to re-read, posts to re-mark) without moving anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Move the checkpoint even while a worker holds the stream.
    #[arg(long)]
    pub force: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let position = match (&args.from_token, &args.from_time) {
        (Some(t), _) => {
            if t.is_empty() || !t.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(UsageError(format!(
                    "--from-token {t:?}: expected the hex `_data` of a resume token"
                ))
                .into());
            }
            Position::Token(Token(t.clone()))
        }
        (None, Some(time)) => {
            let secs = parse_time(time).ok_or_else(|| {
                UsageError(format!(
                    "--from-time {time:?}: expected RFC 3339, e.g. 2026-01-31T12:00:00Z"
                ))
            })?;
            Position::Time(bson::Timestamp {
                time: secs as u32,
                increment: 0,
            })
        }
        (None, None) => unreachable!("clap requires one"),
    };
    let store = connect(&settings).await?;
    // Every stream of the configuration (one, or one per partition) moves together.
    let streams: Vec<String> =
        crate::partition::stream_names(&settings.stream_name, settings.partitions)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
    for stream in &streams {
        let lease = store.read_lease(stream).await?;
        let held = lease.filter(|l| l.expires_at > bson::DateTime::now());
        if let (Some(l), false) = (held, args.force || args.dry_run) {
            return Err(CheckFailed(format!(
                "worker {} (epoch {}) holds stream `{stream}`: stop it first, or pass --force (it would resume from its own position until restarted)",
                l.owner,
                l.epoch
            ))
            .into());
        }
    }
    let stream = streams[0].clone();
    let checkpoint = store.load_checkpoint(&stream).await?.unwrap_or_default();
    let start = match &position {
        Position::Token(t) => StreamStart::After(t.clone()),
        Position::Time(t) => StreamStart::AtTime(*t),
        Position::Unset => StreamStart::Now,
    };
    let mut report = serde_json::json!({
        "stream": stream,
        "from": checkpoint.token.as_ref().map(|t| t.to_string()),
        "to": describe(&position),
        "high_water": checkpoint.high_water.as_ref().map(|t| t.to_string()),
        "dry_run": args.dry_run,
    });
    if args.dry_run {
        // Read ahead from the new position (bounded) to show what the worker would do.
        let mut source = store
            .open_stream(StreamOptions {
                start,
                pre_images: false,
                pipeline: vec![],
                max_await: Duration::from_millis(200),
            })
            .await?;
        let (mut seen, mut new, mut posts) = (0u64, 0u64, BTreeSet::new());
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
            for doc in &batch.events {
                let Ok(event) = ChangeEvent::parse(doc) else {
                    continue;
                };
                if checkpoint
                    .high_water
                    .as_ref()
                    .is_some_and(|h| event.token <= *h)
                {
                    seen += 1;
                    for key in [event.full_document.as_ref(), Some(&event.document_key)]
                        .into_iter()
                        .flatten()
                    {
                        if let Some(post) = settings.schema().post_in(key) {
                            posts.insert(post.to_string());
                        }
                    }
                } else {
                    new += 1;
                }
            }
        }
        report["events_already_applied"] = seen.into();
        report["events_not_yet_applied"] = new.into();
        report["posts_to_mark_dirty_at_least"] = posts.len().into();
        if args.json {
            print_json(&report)?;
        } else {
            outln!(
                "dry run: would move `{}` from {} to {}",
                report["stream"].as_str().unwrap_or(""),
                report["from"].as_str().unwrap_or("the start"),
                describe(&position)
            );
            outln!("  {seen} events at or below the high water would be re-read: their posts (at least {}) are marked dirty and recounted, never counted twice", posts.len());
            outln!("  {new} events beyond the high water would be applied");
            outln!("nothing was changed");
        }
        return Ok(ExitCode::SUCCESS);
    }
    for stream in &streams {
        store.move_checkpoint(stream, &position).await?;
    }
    if args.json {
        print_json(&report)?;
    } else {
        outln!(
            "moved {} to {}; restart the worker to replay from there",
            streams.join(", "),
            describe(&position)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A position for people and scripts: `after token <hex>`, `at <RFC 3339>`, `unset`.
fn describe(position: &Position) -> String {
    match position {
        Position::Token(t) => format!("after token {t}"),
        Position::Time(t) => format!("at {}", crate::cli::output::cluster_time(*t)),
        Position::Unset => "unset (the configured start)".into(),
    }
}
