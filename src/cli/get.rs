//! `counterd get POST`: one counter beside the truth.

use std::process::ExitCode;

use crate::cli::exit::UsageError;
use crate::cli::{observe, print_json, rfc3339};
use crate::config::Settings;
use crate::core::key::GroupValue;
use crate::outln;
use crate::store::prelude::*;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The post: int:5, str:abc, oid:<hex>, or plain (a number is an int, 24 hex digits an
    /// oid, unless only the string of those characters has rows or a counter; refused when both
    /// have).
    pub post: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub counter: crate::cli::counter::CounterArg,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let (settings, store) = args.counter.open(settings).await?;
    // A sum's numbers are in its field's units (the true value is the `$sum` of the rows).
    let summed = settings
        .definitions()?
        .get(store.viewed_counter())
        .and_then(|d| d.kind.field().map(String::from));
    let post = resolve_post(store.as_ref(), &args.post).await?;
    let observation = observe(&settings, &store, std::slice::from_ref(&post))
        .await?
        .pop()
        .expect("one observation per post");
    let counter = store.read_counter(&post).await?.unwrap_or_default();
    let dirty = store
        .dirty_list(None, crate::store::DirtyOrder::Oldest, usize::MAX)
        .await?
        .into_iter()
        .any(|d| d.post == post);
    // A batch whose dirty mark for this post is still being written: dirty all the same.
    let marking = !dirty
        && crate::cli::marks_in_flight(&settings, &store)
            .await?
            .contains(&post);
    let dirty = dirty || marking;
    let snapshotting = crate::cli::snapshot_running(&settings, &store).await?;
    let state = &counter.state;
    let value = serde_json::json!({
        "post": post.to_string(),
        "displayed": observation.displayed,
        "true_count": observation.truth,
        "difference": observation.mismatch().unwrap_or_default(),
        "sum_of": summed,
        "in_flight": observation.truth.is_none() && !snapshotting,
        "snapshot_running": snapshotting,
        "dirty": dirty,
        "dirty_mark_in_flight": marking,
        "count": counter.count,
        "base_count": state.base_count,
        "base_watermark": state.base_watermark,
        "base_watermark_time": crate::cli::output::rfc3339(bson::DateTime::from_millis(state.base_watermark.saturating_mul(1000))),
        "live_delta": state.live_delta,
        "buckets": state.buckets.iter().map(|(k, v)| (k.to_string(), *v)).collect::<std::collections::BTreeMap<_, _>>(),
        "applied_through": counter.applied_through,
        // A counter several partitions write: the other partitions' positions (partition 0's
        // is `applied_through`).
        "applied_through_of_partitions": counter
            .writers
            .iter()
            .map(|(n, w)| (format!("p{n}"), w.applied_through.clone()))
            .collect::<std::collections::BTreeMap<_, _>>(),
        "last_drift": counter.last_drift,
        "reconciled_at": counter.reconciled_at.map(rfc3339),
    });
    let code = exit_code(
        observation.mismatch().is_some(),
        observation.truth.is_none() && snapshotting,
    );
    if args.json {
        print_json(&value)?;
        return Ok(code);
    }
    outln!("post            {post}");
    if let Some(field) = &summed {
        outln!("sum of          `{field}` (every number below is in its units; the true sum is the rows' $sum)");
    }
    outln!(
        "displayed       {}   (count; base {} + live {})",
        counter.shown(),
        state.base_count,
        state.live_delta
    );
    // A sum's truth is the `$sum` of its rows' field, not a number of rows.
    let truth_label = summed.as_ref().map_or("true count", |_| "true sum  ");
    match (observation.truth, observation.mismatch()) {
        (None, _) if snapshotting => outln!(
            "{truth_label}      not compared: the initial snapshot is still counting the rows that existed before the stream's start (see `counterd status`)"
        ),
        (None, _) => outln!(
            "{truth_label}      in flight: a change to this post is not applied yet; ask again in a moment"
        ),
        (Some(truth), None) => outln!("{truth_label}      {truth}"),
        (Some(truth), Some(difference)) => outln!(
            "{truth_label}      {truth}   (differs by {difference:+}: drift the reconciler will correct{})",
            if dirty { "; the post is dirty" } else { " when it next recounts this post" }
        ),
    }
    if marking {
        outln!("dirty           yes (its mark is being written with the batch in flight)");
    } else if dirty {
        outln!("dirty           yes (waiting for a recount)");
    }
    outln!("base watermark  {}", state.base_watermark);
    let buckets = state.buckets.iter().map(|(k, v)| format!("{k}:{v:+}"));
    let buckets = buckets.collect::<Vec<_>>().join(" ");
    outln!(
        "buckets         {}",
        if buckets.is_empty() { "none" } else { &buckets }
    );
    let through = counter.applied_through.as_deref().unwrap_or("-");
    outln!("applied through {through}");
    for (n, w) in &counter.writers {
        let through = w.applied_through.as_deref().unwrap_or("-");
        outln!("  by p{n}        {through}");
    }
    let at = counter.reconciled_at.map(rfc3339).unwrap_or_default();
    let drift = counter
        .last_drift
        .map_or("-".into(), |d| format!("{d:+} at {at}"));
    outln!("last drift      {drift}");
    Ok(code)
}

/// `get`'s exit code: 1 when the counter differs from the truth, 5 when it cannot be compared
/// until the initial snapshot is done, 0 otherwise (a change in flight is not a difference).
fn exit_code(differs: bool, waits_for_snapshot: bool) -> ExitCode {
    use crate::cli::exit::{CHECK_FAILED, NOT_YET};
    match (differs, waits_for_snapshot) {
        (true, _) => ExitCode::from(CHECK_FAILED),
        (false, true) => ExitCode::from(NOT_YET),
        (false, false) => ExitCode::SUCCESS,
    }
}

/// The readings of a post id as typed: `int:`, `str:` and `oid:` name one type; a plain id
/// that reads as a number (or as 24 hex digits) may also be the string of those characters.
pub fn readings(text: &str) -> Vec<GroupValue> {
    if ["int:", "str:", "oid:"].iter().any(|p| text.starts_with(p)) {
        return vec![GroupValue::parse(text)];
    }
    let first = GroupValue::parse(text);
    let string = GroupValue::Str(text.to_string());
    if first == string {
        vec![first]
    } else {
        vec![first, string]
    }
}

/// How a reading is written with its type prefix, for the refusal's suggestion.
fn typed(post: &GroupValue) -> String {
    match post {
        GroupValue::Int(i) => format!("int:{i}"),
        GroupValue::Str(s) => format!("str:{s}"),
        GroupValue::Oid(o) => format!("oid:{o}"),
    }
}

/// The post a typed id names. A plain id with two readings (`123`: the integer or the string)
/// is the one that has rows or a counter; when both have, it is refused (exit 2) naming both,
/// because the answer for the wrong one looks like a correct zero.
async fn resolve_post(
    store: &crate::store::mongo::MongoStore,
    text: &str,
) -> anyhow::Result<GroupValue> {
    let readings = readings(text);
    if readings.len() == 1 {
        return Ok(readings[0].clone());
    }
    let mut found = Vec::new();
    for post in &readings {
        if store.read_counter(post).await?.is_some() || store.count_live(post).await? > 0 {
            found.push(post.clone());
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Ok(readings[0].clone()),
        several => anyhow::bail!(UsageError(format!(
            "`{text}` names {} posts here: {}; say which one",
            several.len(),
            several
                .iter()
                .map(|p| format!("`counterd get {}`", typed(p)))
                .collect::<Vec<_>>()
                .join(" or ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_id_has_every_reading_its_characters_allow() {
        assert_eq!(
            readings("123"),
            [GroupValue::Int(123), GroupValue::Str("123".into())]
        );
        assert_eq!(readings("abc"), [GroupValue::Str("abc".into())]);
        assert_eq!(readings("str:123"), [GroupValue::Str("123".into())]);
        assert_eq!(readings("int:123"), [GroupValue::Int(123)]);
        let hex = "65f1c0f2a1b2c3d4e5f60718";
        assert_eq!(readings(hex).len(), 2);
        assert_eq!(typed(&readings(hex)[0]), format!("oid:{hex}"));
    }
}
