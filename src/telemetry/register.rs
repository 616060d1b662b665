//! Registration: the global recorder with counterd's buckets and the descriptions of every
//! name (see `metric_names!`), and a stream's series exported from the start.

use super::*;

/// Installs the global Prometheus recorder with counterd's buckets (once per process) and
/// registers the descriptions. Returns the handle `/metrics` renders.
pub fn install_recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new();
            for (name, values) in HISTOGRAMS {
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(name.into()), values)
                    .expect("histogram buckets are not empty");
            }
            let handle = builder
                .install_recorder()
                .expect("install the metrics recorder");
            describe();
            handle
        })
        .clone()
}

/// Exports a stream's series from the start (counters at 0, gauges at 0), so alerts see 0
/// rather than no data and a first increment shows up in `increase()`.
pub fn register_stream(stream: &str) {
    let stream = stream.to_string();
    for counter in [
        EVENTS_APPLIED,
        UPDATE_ROWS_READ,
        BAD_EVENTS,
        UNATTRIBUTABLE_EVENTS,
        BATCHES,
        POSTS_RECONCILED,
        HISTORY_LOST,
        SWEEP_POSTS,
        RECOUNTS_DEFERRED,
    ] {
        metrics::counter!(counter, "stream" => stream.clone()).absolute(0);
    }
    // By the run that counts (the two that run on their own; a sweep's appear when it runs).
    for counter in [RECOUNTS, RECOUNTS_IN_FLIGHT] {
        for kind in crate::core::fold::RunKind::EVERY_PASS {
            metrics::counter!(counter, "stream" => stream.clone(), "kind" => kind.label())
                .absolute(0);
        }
    }
    for result in ["applied", "already_applied"] {
        metrics::counter!(INCREMENTS, "stream" => stream.clone(), "result" => result).absolute(0);
    }
    for gauge in [
        WORKER_ACTIVE,
        BACKGROUND_SWEEP_POSTS_DONE,
        BACKGROUND_SWEEP_LAST_PASS,
    ] {
        metrics::gauge!(gauge, "stream" => stream.clone()).set(0.0);
    }
    for &reason in <crate::status::ParkReason as strum::VariantArray>::VARIANTS {
        metrics::gauge!(PARKED, "stream" => stream.clone(), "reason" => reason.label()).set(0.0);
    }
}

/// Exports what a counter definition's numbers are (`counterd_definition_info`, always 1), so
/// that a dashboard or an alert tells a sum, in its field's units, from a count.
pub fn register_definition(definition: &crate::core::definition::Definition) {
    let kind: &'static str = (&definition.kind).into();
    metrics::gauge!(
        DEFINITION_INFO,
        "counter" => definition.name.clone(),
        "kind" => kind,
        "field" => definition.kind.field().unwrap_or_default().to_string(),
        "collection" => definition.collection.clone(),
    )
    .set(1.0);
}

/// Exports a stream entering (`parked`) or leaving a park for `reason` as `counterd_parked`:
/// the [`crate::status::ParkExport`] the daemon hands its streams' statuses.
pub fn export_parked(stream: &str, reason: crate::status::ParkReason, parked: bool) {
    let value = if parked { 1.0 } else { 0.0 };
    metrics::gauge!(PARKED, "stream" => stream.to_string(), "reason" => reason.label()).set(value);
}
