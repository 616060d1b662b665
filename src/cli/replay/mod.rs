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
//!
//! Where it lives: `mod.rs` the arguments, their checks and the command; `lease.rs` taking and
//! giving back the streams' leases; `checkpoint.rs` the move itself; `dry_run.rs` what a move
//! would do, moving nothing.

use std::process::ExitCode;

use crate::cli::exit::UsageError;
use crate::cli::{connect, print_json};
use crate::config::{parse_time, Settings};
use crate::core::event::Token;
use crate::core::time::seconds_rfc3339;
use crate::outln;
use crate::store::prelude::*;
use crate::store::{Fence, Lease, Position};

mod checkpoint;
mod dry_run;
mod lease;

use checkpoint::move_stream;
use dry_run::dry_run;
use lease::{release_all, take_lease};

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
        (None, Some(time)) => Position::Time(parse_time(time).ok_or_else(|| {
            UsageError(format!(
                "--from-time {time:?}: expected RFC 3339, e.g. 2026-01-31T12:00:00Z"
            ))
        })?),
        (None, None) => unreachable!("clap requires one"),
    };
    let store = connect(&settings).await?;
    // Every stream of the configuration (one, or one per partition) moves together.
    let streams = settings.stream_names();
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
        let planned = dry_run::Move {
            settings: &settings,
            store: &store,
            stream: &stream,
            checkpoint: &checkpoint,
            position: &position,
        };
        return dry_run(planned, report, &args).await;
    }

    // Take every stream's lease first (refusing, waiting or fencing), then move each; the
    // leases taken are given back either way.
    let owner = format!("counterd-replay@{}", crate::lease::default_owner());
    let mut taken: Vec<(Fence, Option<Lease>)> = Vec::new();
    let moved = async {
        for stream in &streams {
            taken.push(take_lease(&store, stream, &owner, &settings, &args).await?);
        }
        let mut moved = Vec::new();
        for (fence, fenced) in &taken {
            let resolved = move_stream(&settings, &store, fence, &owner, &position).await?;
            moved.push((fence.stream.clone(), fenced.clone(), resolved));
        }
        anyhow::Ok(moved)
    };
    let moved = moved.await;
    release_all(&store, &owner, &taken).await;
    let moved = moved?;

    let fenced: Vec<&Lease> = moved.iter().filter_map(|(_, l, _)| l.as_ref()).collect();
    report["fenced"] = fenced
        .iter()
        .map(|l| serde_json::json!({"stream": l.stream, "owner": l.owner, "epoch": l.epoch}))
        .collect();
    report["resolved_in_flight"] = moved
        .iter()
        .filter_map(|(stream, _, r)| r.as_ref().map(|r| (stream, r)))
        .map(|(stream, r)| serde_json::json!({"stream": stream, "end": r.end, "counters": r.counters.len()}))
        .collect();
    if args.json {
        return print_json(&report).map(|_| ExitCode::SUCCESS);
    }
    for (stream, _, resolved) in &moved {
        if let Some(r) = resolved {
            outln!(
                "re-applied the batch left in flight on `{stream}` first (through token {}, {} counter writes), so no restart re-applies it over the move",
                r.end,
                r.counters.len()
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

/// A position for people and scripts: `after token <hex>`, `at <RFC 3339>`, `unset`.
fn describe(position: &Position) -> String {
    match position {
        Position::Token(t) => format!("after token {t}"),
        // Its seconds: the increment orders events within a second.
        Position::Time(t) => format!("at {}", seconds_rfc3339(t.time.into())),
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
