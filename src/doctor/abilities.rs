//! Optional server abilities, and what their absence costs. Neither is required: counterd
//! works without both, at the costs named here.

use bson::Document;

use super::{Expectations, Finding, Reply};

/// Change-stream pre-images on the comments collection (MongoDB 6.0+,
/// `changeStreamPreAndPostImages`). Without them the before-state of an update or delete comes
/// from counterd's comment ledger (one small write per event) and, before the initial snapshot
/// has made the ledger complete, from best-effort rules the reconciler corrects.
pub fn pre_images(
    build_info: &Reply,
    collection: &Result<Option<Document>, String>,
    expect: &Expectations,
) -> Finding {
    const CHECK: &str = "pre_images";
    let cost = "attribution falls back to counterd's ledger (one small write per event; \
                exact once the initial snapshot is done)";
    if !expect.uses_pre_images {
        return Finding::info(CHECK, "not used (attribution does not read pre-images)");
    }
    let major = build_info
        .as_ref()
        .ok()
        .and_then(|b| b.get_str("version").ok())
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
        .unwrap_or(0);
    let info = |message: String| Finding::info(CHECK, message);
    let entry = match collection {
        Ok(Some(entry)) => entry,
        Ok(None) => {
            return info(format!(
                "the comments collection does not exist yet; {cost}"
            ))
        }
        Err(e) => return Finding::skipped(CHECK, format!("listCollections failed ({e})")),
    };
    match (pre_images_on(entry), major >= 6) {
        (true, true) => Finding::ok(CHECK, "on for the comments collection"),
        (true, false) => info(format!("the option is set but the server is older than 6.0; {cost}")),
        (false, true) => info(format!("off ({cost}); to turn them on: db.runCommand({{collMod: \"{}\", changeStreamPreAndPostImages: {{enabled: true}}}})", expect.comments)),
        (false, false) => info(format!("unavailable before MongoDB 6.0; {cost}")),
    }
}

/// Whether a collection's `listCollections` entry has `changeStreamPreAndPostImages` enabled:
/// the one reading of it, for this check and for the store's choice to read pre-images (so
/// the doctor's tests on real-shaped entries, `fixtures/doctor/`, cover both).
pub fn pre_images_on(entry: &Document) -> bool {
    let images = entry
        .get_document("options")
        .and_then(|o| o.get_document("changeStreamPreAndPostImages"));
    images.and_then(|p| p.get_bool("enabled")).unwrap_or(false)
}

/// Reads at a cluster time (`readConcern: snapshot` with `atClusterTime`), detected by a real
/// probe. Without them recounts use the quiet window: they wait for the worker to pass the
/// count's position, and a post whose old rows change without pause folds only in the pauses.
pub fn snapshot_reads(available: bool) -> Finding {
    const CHECK: &str = "snapshot_reads";
    if available {
        Finding::ok(
            CHECK,
            "available: recounts read at the counter's own cluster time",
        )
    } else {
        Finding::info(
            CHECK,
            "unavailable: recounts use the quiet window (they wait up to catch_up_timeout for the \
             worker, rely on the server's clock, and a post whose old rows change without pause \
             folds only in the pauses)",
        )
    }
}
