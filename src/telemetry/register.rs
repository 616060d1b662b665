//! Registration: the global recorder with counterd's buckets, the descriptions of every
//! name, and a stream's series exported from the start.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

use super::*;

/// Registers descriptions with the installed recorder (call once after installing it).
pub fn describe() {
    describe_worker();
    describe_position_and_lease();
    describe_reconciler();
    describe_recounts();
    describe_snapshot_and_database();
}

/// The worker: events, batches, the memory budget.
fn describe_worker() {
    describe_counter!(
        EVENTS_APPLIED,
        "Change events classified and applied by the worker, per stream."
    );
    describe_counter!(BAD_EVENTS, "Malformed events skipped (missing or wrongly typed post_id, unknown operation type); their posts were marked dirty where known.");
    describe_counter!(
        UNATTRIBUTABLE_EVENTS,
        "Events no delta could be attributed to; a sweep or the reconciler repairs them."
    );
    describe_counter!(
        INCREMENTS,
        "Counter increment statements issued, by result (applied, already_applied: a replay the guard rejected)."
    );
    describe_counter!(BATCHES, "Batches applied and checkpointed.");
    describe_histogram!(
        BATCH_APPLY_DURATION,
        Unit::Seconds,
        "Time to write one batch (intent, counters, ledger, dirty marks, checkpoint)."
    );
    describe_histogram!(BATCH_SIZE, "Events per applied batch.");
    describe_gauge!(
        MEMORY_BUDGET,
        Unit::Bytes,
        "The memory budget every buffer draws from (memory_budget, or derived from the container's limit)."
    );
    describe_gauge!(
        MEMORY_IN_USE,
        Unit::Bytes,
        "Bytes of the memory budget held now (events in flight, read ahead, snapshot chunks, recounts, server replies); reading waits when it reaches the budget."
    );
    describe_gauge!(
        DEFINITION_INFO,
        "Always 1, per counter definition: kind (count, sum, rows: a sum's row count), field (a sum's summed field) and collection. Join on counter to read a sum's drift in its field's units."
    );
    describe_gauge!(
        LAST_EVENT_TIMESTAMP,
        Unit::Seconds,
        "Cluster time (Unix seconds) of the newest event the worker applied."
    );
}

/// The stream's position and who holds it: checkpoint, lost history, parking, leases.
fn describe_position_and_lease() {
    describe_gauge!(
        CHECKPOINT_TIMESTAMP,
        Unit::Seconds,
        "Cluster time (Unix seconds) of the checkpointed stream position: every event before it is applied and a restart resumes there."
    );
    describe_counter!(
        HISTORY_LOST,
        "Times the checkpoint had fallen off the oplog."
    );
    describe_gauge!(
        PARKED,
        "1 while the stream is parked for `reason` (credentials, stream_ended, history_lost, source_missing): a condition no retry mends stopped it; the process stays up, re-checks by itself and resumes. 0 otherwise."
    );
    describe_gauge!(
        WORKER_ACTIVE,
        "1 when this process holds the stream's lease and applies its events, 0 on standby."
    );
    describe_gauge!(
        LEASE_RENEWED_TIMESTAMP,
        Unit::Seconds,
        "Wall-clock time (Unix seconds) this process last acquired or renewed the stream's lease."
    );
    describe_counter!(
        LEASE_TAKEOVERS,
        "Times this process acquired the stream's lease (each raises the fencing epoch)."
    );
}

/// The reconciler: runs, drift, the time from dirty to fold.
fn describe_reconciler() {
    describe_counter!(
        RECONCILE_RUNS,
        "Reconcile runs finished, by kind (dirty, background, sweep, gap_sweep, post)."
    );
    describe_histogram!(
        RECONCILE_DURATION,
        Unit::Seconds,
        "Duration of reconcile runs, by kind."
    );
    describe_gauge!(
        LAST_RECONCILE_TIMESTAMP,
        Unit::Seconds,
        "Wall-clock time (Unix seconds) of the last reconcile run that finished without error."
    );
    describe_counter!(
        UPDATE_ROWS_READ,
        "Rows of updated comments the worker read in its batched reads, per stream: the updates whose state it could not derive from its ledger and the update's description (what updateLookup used to send with every update event)."
    );
    describe_counter!(POSTS_RECONCILED, "Posts recounted and folded.");
    describe_histogram!(
        DRIFT,
        "Drift corrected per post (group), by sign (high: the counter ran above the truth, low: below) and counter: in rows for a count, in the summed field's units for a sum (see counterd_definition_info)."
    );
    describe_histogram!(
        DIRTY_TO_FOLD,
        Unit::Seconds,
        "Seconds from a post's dirty mark (or the last fold that covered it, for a post that stays dirty) to the next fold that covered its settled changes, per stream."
    );
}

/// Recounts, sweeps and the dirty set.
fn describe_recounts() {
    describe_counter!(
        RECOUNTS_IN_FLIGHT,
        "Recounts not installed because a row changed while counted could not be settled against the stream (or the worker did not catch up in time); the post stays dirty and is retried."
    );
    describe_counter!(
        RECOUNTS,
        "Counts the reconciler made of dirty, swept or requested posts, per stream; counterd_recounts_in_flight_total over it is the share of counts that could not be folded."
    );
    describe_counter!(
        RECOUNTS_DEFERRED,
        "Dirty posts left uncounted for a later run because the worker was further behind the server than catch_up_timeout (catching up a backlog): a count would have seen changes it had not applied."
    );
    describe_counter!(SWEEP_POSTS, "Posts visited by full sweeps.");
    describe_gauge!(
        FULL_SWEEP_PROGRESS,
        "Posts recounted so far by the full sweep in progress (after lost history or on request); 0 when none runs."
    );
    describe_gauge!(
        BACKGROUND_SWEEP_POSTS_DONE,
        "Posts the background sweep has covered in its current pass over all posts."
    );
    describe_gauge!(
        BACKGROUND_SWEEP_LAST_PASS,
        "Posts the background sweep covered in its last complete pass (0 before the first)."
    );
    describe_gauge!(
        DIRTY_POSTS,
        "Groups waiting for a recount, per counter definition, as of this process's last reconcile run."
    );
}

/// The initial snapshot and the database calls.
fn describe_snapshot_and_database() {
    describe_counter!(
        SNAPSHOT_ROWS,
        "Rows of `comments` read by the initial snapshot (each chunk once; a chunk finished after a restart is not read again)."
    );
    describe_gauge!(
        SNAPSHOT_RUNNING,
        "1 while the initial snapshot is counting the rows that existed before the stream's start (folds wait until it is done), else 0."
    );
    describe_gauge!(
        SNAPSHOT_ROWS_SCANNED,
        "Rows the initial snapshot has scanned so far."
    );
    describe_gauge!(
        SNAPSHOT_ROWS_ESTIMATED,
        "The estimated size of `comments` when the initial snapshot began."
    );
    describe_gauge!(
        SNAPSHOT_SECONDS_LEFT,
        "Estimated seconds until the initial snapshot is done, at its configured rate (0 when none runs)."
    );
    describe_counter!(
        RETRIES,
        "Retries after transient database errors, by operation."
    );
    describe_histogram!(
        MONGODB_OPERATION_DURATION,
        Unit::Seconds,
        "MongoDB call latency, by counterd's operation (op) and outcome (ok, error)."
    );
}

/// Installs the global Prometheus recorder with counterd's buckets (once per process) and
/// registers the descriptions. Returns the handle `/metrics` renders.
pub fn install_recorder() -> metrics_exporter_prometheus::PrometheusHandle {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    static HANDLE: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets: [(&str, &[f64]); 6] = [
                (DRIFT, &DRIFT_BUCKETS),
                (DIRTY_TO_FOLD, &FOLD_WAIT_BUCKETS),
                (BATCH_APPLY_DURATION, &DURATION_BUCKETS),
                (MONGODB_OPERATION_DURATION, &DURATION_BUCKETS),
                (RECONCILE_DURATION, &RECONCILE_BUCKETS),
                (BATCH_SIZE, &SIZE_BUCKETS),
            ];
            let mut builder = PrometheusBuilder::new();
            for (name, values) in buckets {
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
        RECOUNTS_IN_FLIGHT,
        RECOUNTS,
        RECOUNTS_DEFERRED,
    ] {
        metrics::counter!(counter, "stream" => stream.clone()).absolute(0);
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
    use crate::core::definition::Kind;
    let kind = match definition.kind {
        Kind::Count => "count",
        Kind::Sum { .. } => "sum",
        Kind::Rows { .. } => "rows",
    };
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
