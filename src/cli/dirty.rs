//! `counterd dirty`: the backlog of posts waiting for a recount.

use std::process::ExitCode;

use crate::cli::{age_secs, print_json, rfc3339};
use crate::config::Settings;
use crate::outln;
use crate::store::prelude::*;
use crate::store::DirtyOrder;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many entries to list.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Order by version (most touched first) instead of oldest first.
    #[arg(long)]
    pub by_version: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub counter: crate::cli::counter::CounterArg,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let (settings, store) = args.counter.open(settings).await?;
    let order = if args.by_version {
        DirtyOrder::ByVersion
    } else {
        DirtyOrder::Oldest
    };
    let summary = store.dirty_summary().await?;
    let entries = store.dirty_list(None, order, args.limit).await?;
    // Posts a batch in flight is marking: not in the backlog yet, but not clean either.
    let marking = crate::cli::marks_in_flight(&settings, &store).await?;
    if args.json {
        print_json(
            &serde_json::json!({"size": summary.size, "oldest": summary.oldest.map(rfc3339), "entries": entries, "marks_in_flight": marking.iter().map(|p| p.to_string()).collect::<Vec<_>>()}),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    let oldest = summary
        .oldest
        .map(|t| format!(", oldest {} ago", age_text(age_secs(t))));
    let more = marking.len();
    let marking_note =
        (more > 0).then(|| format!("; {more} more being marked by the batch in flight"));
    outln!(
        "{} dirty posts{}{}",
        summary.size,
        oldest.unwrap_or_default(),
        marking_note.unwrap_or_default()
    );
    let row = |post: &str, version: &str, dirty_for: &str, marked: &str| {
        outln!("{post:<32} {version:>8} {dirty_for:>12} {marked:>12}")
    };
    if !entries.is_empty() {
        row("post", "version", "dirty for", "last marked");
    }
    for e in entries {
        let (post, version) = (e.post.to_string(), e.version.to_string());
        let marked = format!("{} ago", age_text(age_secs(e.last_dirty_at)));
        let dirty_for = age_text(age_secs(e.first_dirty_at));
        row(&post, &version, &dirty_for, &marked);
    }
    Ok(ExitCode::SUCCESS)
}

/// An age for people: `45s`, `12m 5s`, `3h 2m`, `2d 4h`.
pub fn age_text(secs: i64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ages_read_at_a_glance() {
        use super::age_text;
        assert_eq!(age_text(0), "0s");
        assert_eq!(age_text(725), "12m 5s");
        assert_eq!(age_text(3 * 3600 + 150), "3h 2m");
        assert_eq!(age_text(2 * 86_400 + 4 * 3600 + 9), "2d 4h");
    }
}
