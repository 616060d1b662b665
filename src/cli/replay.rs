//! `counterd replay`: move the stream's checkpoint to a token or a time. Events at or below the
//! high water were applied before, so re-reading them only marks their posts dirty (the
//! reconciler recounts them); nothing is counted twice.
//!
//! A move always takes effect or is refused with what to do:
//! - replay takes the stream's lease for the move (raising the fencing epoch) and stamps the
//!   checkpoint with it, so no worker can write the checkpoint back over the move. A worker
//!   holding the lease is refused (exit 1, with how long its lease has left), unless `--force`
//!   seizes the lease: the running worker is fenced out, steps down, and it or a standby
//!   resumes from the moved position once replay releases the lease. `--wait` waits for a
//!   stopped worker's lease to lapse instead.
//! - a batch left in flight (its intent recorded in the checkpoint) is re-applied exactly as
//!   planned first, as a worker does at session start, so no restart re-applies it later and
//!   resumes at its end, over the move.
//! - the checkpoint is stamped with the deployment replay talks to: the operator chose this
//!   position for it.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::DateTime;

use crate::cli::exit::{CheckFailed, UsageError};
use crate::cli::{connect, print_json};
use crate::config::{parse_time, Settings};
use crate::event::{ChangeEvent, Token};
use crate::outln;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{Checkpoint, Fence, Lease, Position, StreamOptions, StreamStart};
use crate::worker::{Worker, WorkerStatus};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("from").required(true).args(["from_token", "from_time"])))]
pub struct Args {
    /// Resume after this resume token (`_data` hex string, as `counterd status` shows it).
    #[arg(long, value_name = "TOKEN")]
    pub from_token: Option<String>,
    /// Start at this time (RFC 3339), e.g. 2026-01-31T12:00:00Z.
    #[arg(long, value_name = "TIME")]
    pub from_time: Option<String>,
    /// Show what would change (events to re-read, posts to re-mark) without moving anything.
    #[arg(long)]
    pub dry_run: bool,
    /// Move the checkpoint even while a worker holds the stream: the worker is fenced out (it
    /// steps down, and it or a standby resumes from the moved position).
    #[arg(long, conflicts_with = "wait")]
    pub force: bool,
    /// If a stopped worker's lease has not expired yet, wait for it to lapse instead of
    /// refusing (a running worker keeps renewing it: then replay still refuses).
    #[arg(long)]
    pub wait: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The smallest resume token: the fake test server's are 16 hex digits (8 bytes), MongoDB's
/// longer.
const MIN_TOKEN_HEX: usize = 16;

/// A resume token's `_data`: hex digits, whole bytes, at least 8 of them.
fn check_token_shape(t: &str) -> Result<Token, UsageError> {
    if t.len() < MIN_TOKEN_HEX
        || !t.len().is_multiple_of(2)
        || !t.chars().all(|c| c.is_ascii_hexdigit())
    {
        return Err(UsageError(format!(
            "--from-token {t:?}: expected the hex `_data` of a resume token (an even number of hex digits, at least {MIN_TOKEN_HEX}), as `counterd status` shows the checkpoint token; or use --from-time"
        )));
    }
    Ok(Token(t.to_string()))
}

/// Tokens of one deployment share their format: the first byte (on MongoDB the key-string
/// type of the cluster time, `82`) and, on the fake test server, the fixed length. Tokens of
/// different formats do not sort against each other, so the per-post guards would misjudge.
fn check_token_format(new: &Token, current: &Token) -> Result<(), UsageError> {
    let head = |t: &Token| t.as_str().get(..2).map(str::to_ascii_lowercase);
    let short = |t: &Token| t.as_str().len() == MIN_TOKEN_HEX;
    if head(new) != head(current) || short(new) != short(current) {
        return Err(UsageError(format!(
            "--from-token {new}: not a token of this stream's format (its checkpoint token is {current}); tokens of another format or deployment do not compare with the ones counterd stored"
        )));
    }
    Ok(())
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let position = match (&args.from_token, &args.from_time) {
        (Some(t), _) => Position::Token(check_token_shape(t)?),
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
    let stream = streams[0].clone();
    let checkpoint = store.load_checkpoint(&stream).await?.unwrap_or_default();
    if let (Position::Token(new), Some(current)) = (&position, &checkpoint.token) {
        check_token_format(new, current)?;
    }
    let mut report = serde_json::json!({
        "stream": stream,
        "streams": streams,
        "from": checkpoint.token.as_ref().map(|t| t.to_string()),
        "to": describe(&position),
        "high_water": checkpoint.high_water.as_ref().map(|t| t.to_string()),
        "dry_run": args.dry_run,
    });
    if args.dry_run {
        return dry_run(
            &settings,
            &store,
            &stream,
            &checkpoint,
            &position,
            report,
            &args,
        )
        .await;
    }

    // Take every stream's lease first (refusing, waiting or fencing), then move each.
    let owner = format!("counterd-replay@{}", crate::lease::default_owner());
    let mut taken: Vec<(Fence, Option<Lease>)> = Vec::new();
    for stream in &streams {
        match take_lease(&store, stream, &owner, &settings, &args).await {
            Ok(took) => taken.push(took),
            Err(e) => {
                release_all(&store, &owner, &taken).await;
                return Err(e);
            }
        }
    }
    let mut moved = Vec::new();
    let mut outcome = Ok(());
    for (fence, fenced) in &taken {
        match move_stream(&settings, &store, fence, &owner, &position).await {
            Ok(resolved) => moved.push((fence.stream.clone(), fenced.clone(), resolved)),
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    release_all(&store, &owner, &taken).await;
    outcome?;

    let fenced: Vec<&Lease> = moved.iter().filter_map(|(_, l, _)| l.as_ref()).collect();
    report["fenced"] = fenced
        .iter()
        .map(|l| serde_json::json!({"stream": l.stream, "owner": l.owner, "epoch": l.epoch}))
        .collect();
    report["resolved_in_flight"] = moved
        .iter()
        .filter_map(|(stream, _, r)| r.as_ref().map(|r| (stream, r)))
        .map(|(stream, r)| serde_json::json!({"stream": stream, "end": r.end, "counters": r.counters}))
        .collect();
    if args.json {
        print_json(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    for (stream, _, resolved) in &moved {
        if let Some(r) = resolved {
            outln!(
                "re-applied the batch left in flight on `{stream}` first (through token {}, {} counter writes), so no restart re-applies it over the move",
                r.end,
                r.counters
            );
        }
    }
    outln!("moved {} to {}", streams.join(", "), describe(&position));
    if fenced.is_empty() {
        outln!("the next `counterd run` resumes from there; events already applied are re-read and only mark their posts dirty");
    } else {
        for l in fenced {
            outln!(
                "fenced out worker {} (epoch {}) on `{}`: it steps down, and it (or a standby) resumes from the moved position within a few seconds",
                l.owner,
                l.epoch,
                l.stream
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What resolving a batch left in flight did, for the report.
struct Resolved {
    end: String,
    counters: usize,
}

/// Fences the stream at the lease's epoch, re-applies a batch left in flight, moves the
/// checkpoint and records the deployment. Returns the batch re-applied, if any.
async fn move_stream(
    settings: &Settings,
    store: &Arc<MongoStore>,
    fence: &Fence,
    owner: &str,
    position: &Position,
) -> anyhow::Result<Option<Resolved>> {
    let context = |what: &str| format!("replay of stream `{}`: {what}", fence.stream);
    // From here the previous holder cannot write the checkpoint: its writes carry an older epoch.
    store
        .adopt_checkpoint(fence)
        .await
        .map_err(|e| anyhow::Error::from(e).context(context("fence the checkpoint")))?;
    let worker = Worker::new(
        store.clone(),
        crate::worker::WorkerSettings {
            stream: fence.stream.clone(),
            ..crate::worker::WorkerSettings::from(settings)
        },
        Arc::new(WorkerStatus::default()),
    );
    let resolved = worker
        .resolve_pending(fence)
        .await
        .map_err(|e| anyhow::Error::from(e).context(context("re-apply the batch left in flight")))?
        .map(|b| Resolved {
            end: b.end.to_string(),
            counters: b.counters.len(),
        });
    // A full lease for the move itself, and proof that nobody took the stream meanwhile.
    let still_ours = store
        .renew_lease(
            &fence.stream,
            owner,
            fence.epoch,
            settings.lease_ttl,
            DateTime::now(),
        )
        .await?;
    if !still_ours {
        return Err(CheckFailed(format!(
            "{}: another worker took the lease while the batch left in flight was re-applied; nothing was moved, run replay again",
            context("lost the lease")
        ))
        .into());
    }
    store
        .move_checkpoint(&fence.stream, position)
        .await
        .map_err(|e| anyhow::Error::from(e).context(context("move the checkpoint")))?;
    let here = store.deployment().await?;
    if !here.is_unknown() {
        store
            .record_deployment(fence, &here)
            .await
            .map_err(|e| anyhow::Error::from(e).context(context("record the deployment")))?;
    }
    Ok(resolved)
}

/// Takes `stream`'s lease for the move: at once when free, after it lapses with `--wait`, by
/// seizing it with `--force`; else refused with who holds it, for how long, and what to do.
/// Returns the fence and the lease that was fenced out, if any.
async fn take_lease(
    store: &Arc<MongoStore>,
    stream: &str,
    owner: &str,
    settings: &Settings,
    args: &Args,
) -> anyhow::Result<(Fence, Option<Lease>)> {
    let ttl = settings.lease_ttl;
    let fence = |epoch| Fence {
        stream: stream.to_string(),
        epoch,
    };
    let held = |lease: Option<Lease>| lease.filter(|l| l.expires_at > DateTime::now());
    if let Some(l) = &held(store.read_lease(stream).await?) {
        if args.force {
            let epoch = store
                .seize_lease(stream, owner, ttl, DateTime::now())
                .await?;
            return Ok((fence(epoch), Some(l.clone())));
        }
        if !args.wait {
            return Err(CheckFailed(format!(
                "worker {} (epoch {}) holds stream `{stream}`; its lease expires in {} unless renewed. A running worker keeps renewing it: stop it first, or pass --force to fence it out (it steps down, and it or a standby resumes from the moved position). A worker that was killed stops renewing: pass --wait to wait for the lease to lapse (or --force)",
                l.owner,
                l.epoch,
                remaining(l)
            ))
            .into());
        }
        // --wait: until the observed expiry; a renewal meanwhile means the worker runs.
        let observed = l.expires_at;
        let until = Instant::now()
            + Duration::from_millis(
                (observed.timestamp_millis() - DateTime::now().timestamp_millis()).max(0) as u64,
            );
        if !args.json {
            outln!(
                "waiting {} for the lease of worker {} on `{stream}` to lapse",
                remaining(l),
                l.owner
            );
        }
        tokio::time::sleep_until((until + Duration::from_millis(100)).into()).await;
        if let Some(now) = &held(store.read_lease(stream).await?) {
            let renewed = now.owner == l.owner && now.epoch == l.epoch;
            return Err(CheckFailed(if renewed {
                format!(
                    "worker {} renewed its lease on `{stream}` while replay waited: it is running. Stop it first, or pass --force to fence it out",
                    now.owner
                )
            } else {
                format!(
                    "worker {} (epoch {}) took stream `{stream}` when the lease lapsed (a standby): stop it first, or pass --force to fence it out",
                    now.owner, now.epoch
                )
            })
            .into());
        }
    }
    match store.acquire_lease(stream, owner, ttl, DateTime::now()).await? {
        Some(epoch) => Ok((fence(epoch), None)),
        None => Err(CheckFailed(format!(
            "a worker took stream `{stream}` just now: run replay again (with --force to fence it out)"
        ))
        .into()),
    }
}

/// Gives back every lease replay took, so a standby (or the fenced worker) takes over at once.
async fn release_all(store: &Arc<MongoStore>, owner: &str, taken: &[(Fence, Option<Lease>)]) {
    for (fence, _) in taken {
        if let Err(e) = store.release_lease(&fence.stream, owner, fence.epoch).await {
            tracing::warn!(stream = %fence.stream, error = %e, "could not release the lease; it lapses by itself");
        }
    }
}

/// How long a lease has left, for people.
fn remaining(lease: &Lease) -> String {
    let ms = (lease.expires_at.timestamp_millis() - DateTime::now().timestamp_millis()).max(0);
    humantime::format_duration(Duration::from_secs((ms as u64).div_ceil(1000))).to_string()
}

/// Reads ahead from the new position (bounded) to show what the worker would do; moves nothing.
async fn dry_run(
    settings: &Settings,
    store: &Arc<MongoStore>,
    stream: &str,
    checkpoint: &Checkpoint,
    position: &Position,
    mut report: serde_json::Value,
    args: &Args,
) -> anyhow::Result<ExitCode> {
    let start = match position {
        Position::Token(t) => StreamStart::After(t.clone()),
        Position::Time(t) => StreamStart::AtTime(*t),
        Position::Unset => StreamStart::Now,
    };
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
    let holder = store
        .read_lease(stream)
        .await?
        .filter(|l| l.expires_at > DateTime::now());
    report["events_already_applied"] = seen.into();
    report["events_not_yet_applied"] = new.into();
    report["posts_to_mark_dirty_at_least"] = posts.len().into();
    report["in_flight_batch"] = checkpoint
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
        outln!(
            "dry run: would move `{}` from {} to {}",
            report["stream"].as_str().unwrap_or(""),
            report["from"].as_str().unwrap_or("the start"),
            describe(position)
        );
        if let Some(p) = &checkpoint.pending {
            outln!(
                "  a batch left in flight (through token {}, {} counter writes) would be re-applied first",
                p.end,
                p.counters.len()
            );
        }
        outln!("  {seen} events at or below the high water would be re-read: their posts (at least {}) are marked dirty and recounted, never counted twice", posts.len());
        outln!("  {new} events beyond the high water would be applied");
        if let Some(l) = &holder {
            outln!(
                "  worker {} holds the stream (lease expires in {}): the move needs --force (fence it out) or --wait",
                l.owner,
                remaining(l)
            );
        }
        outln!("nothing was changed");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_must_look_like_one() {
        for bad in [
            "",
            "00",
            "not-hex",
            "6b1157260000001",
            "6b11572600000 1f",
            "zz11572600000001",
        ] {
            assert!(check_token_shape(bad).is_err(), "{bad:?}");
        }
        for good in ["6b1157260000001f", "82695B6F99000000012B042C0100296E5A1004"] {
            assert!(check_token_shape(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn a_token_of_another_format_is_refused() {
        let fake = Token("6b1157260000001f".into());
        let real = Token("82695B6F99000000012B042C0100296E5A1004".into());
        assert!(check_token_format(&Token("6b11572000000001".into()), &fake).is_ok());
        assert!(check_token_format(&real, &fake).is_err());
        assert!(check_token_format(&fake, &real).is_err());
        assert!(check_token_format(&Token("82695b6f990000000a2b04".into()), &real).is_ok());
    }
}
