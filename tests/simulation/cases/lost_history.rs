//! After history was lost: the requested sweep, a no-op full recount's watermark, and events of
//! rows whose ledger entries are stale.

use std::sync::Arc;

use counterd::core::key::CounterIx;
use counterd::core::key::GroupValue;
use counterd::reconcile::{ReconcileSettings, Reconciler};
use counterd::store::prelude::*;
use counterd::store::Fence;

use crate::actors::{record_drained, sim_reconciler};
use crate::cases::{catch_up, off_truth};
use crate::plan::{Plan, Variant};
use crate::sim_store::SimStore;
use crate::{START_CLOCK, STREAM};

/// History was lost: the worker restarts from "now", records the gap and requests a sweep. A
/// sweep at the usual watermark (a settle time behind) would leave a row created just before
/// the restart, whose insert event was in the gap, above the watermark where only its (never
/// filed) bucket counts, then clear its request, and the post is not dirty: it was never
/// counted. The requested sweep must wait until the watermark has passed the gap.
#[test]
fn a_sweep_after_lost_history_counts_recent_rows() {
    let store = Arc::new(SimStore::new(1, 60, 1, START_CLOCK));
    let now = START_CLOCK + 3600;
    {
        let mut s = store.lock();
        s.clock = now - 5;
        let created = bson::DateTime::from_millis((now - 5) * 1000);
        s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": created});
        s.clock = now;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let fence = Fence {
            stream: STREAM.into(),
            epoch: 1,
        };
        store.adopt_checkpoint(&fence).await.unwrap();
        let gap = counterd::store::Gap {
            from: None,
            to: bson::DateTime::from_millis(now * 1000),
        };
        store.record_gap(&fence, &gap).await.unwrap();
        let settings = ReconcileSettings {
            bucket_width_secs: 60,
            settle_secs: 30,
            ..ReconcileSettings::default()
        };
        let reconciler = sim_reconciler(&store, settings);
        // Reconcile passes as `run_loop` runs them: now, and an hour later, writes long paused,
        // while the restarted worker keeps finding the stream drained.
        for at in [now, now + 3600] {
            store.lock().clock = at;
            record_drained(&store, &[STREAM.into()]).await.unwrap();
            reconciler.run_requested_sweep(at, None).await.unwrap();
            reconciler.run_dirty(at).await.unwrap();
        }
    });
    let s = store.lock();
    let displayed = s
        .counters()
        .get(&GroupValue::Int(0))
        .map_or(0, |(base, _, live, _)| base + live);
    assert_eq!(displayed, 1, "the row whose insert was lost is not counted");
}

/// After lost history the requested sweep recounts each post in full, above every row and
/// bucket it has. When that recount already matches the counter (here a lost delete of an old
/// row and a lost insert of a future-dated row cancel out) and no bucket is dropped, the fold
/// is skipped as a no-op, and the counter keeps its old, lower watermark although its base now
/// counts the future-dated row. The next ordinary fold, at a watermark below that row, counts
/// below its own watermark only and keeps the buckets above it, where the row never was: it
/// loses the row and reports a correction nobody needed (found as seeds 87 and 227 of
/// `with_history_lost`, where a bucket above a counter's watermark missed a live row).
#[test]
fn a_noop_full_recount_keeps_its_watermark() {
    let width = 60;
    let store = Arc::new(SimStore::new(1, width, 1, START_CLOCK));
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = width;
    plan.settle = 0;
    let settings = plan.worker_settings(STREAM, None);
    let reconciler = sim_reconciler(&store, plan.reconcile_settings(STREAM, None, 100));
    let t = START_CLOCK + 3600;
    let at = |secs: i64| bson::DateTime::from_millis(secs * 1000);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let report = runtime.block_on(async {
        let set_clock = |secs: i64| store.lock().clock = secs;
        // An old row, counted, then folded into the base.
        set_clock(t - 600);
        store
            .lock()
            .insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": at(t - 600)});
        catch_up(&store, settings.clone(), 1).await;
        set_clock(t - 480);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        reconciler.sweep(t - 480, |_| {}, None).await.unwrap();
        // History lost: the old row deleted, a row dated 20 s ahead inserted, both unseen.
        set_clock(t - 100);
        {
            let mut s = store.lock();
            s.delete_row(1);
            s.insert_row(bson::doc! {"_id": 2_i64, "post_id": 0_i64, "created_at": at(t + 20)});
            s.oplog_floor = s.oplog.len();
        }
        set_clock(t - 50);
        catch_up(&store, settings.clone(), 2).await;
        // The requested sweep, once the watermark passed the gap: a full recount (above the
        // future-dated row) that matches the counter, so nothing is written.
        set_clock(t + 30);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        let swept = reconciler.run_requested_sweep(t + 30, None).await.unwrap();
        assert!(swept.is_some(), "the requested sweep ran");
        // A new comment dirties the post; the next fold is at watermark t.
        set_clock(t + 35);
        store
            .lock()
            .insert_row(bson::doc! {"_id": 3_i64, "post_id": 0_i64, "created_at": at(t + 35)});
        catch_up(&store, settings, 3).await;
        set_clock(t + 40);
        record_drained(&store, &[STREAM.into()]).await.unwrap();
        reconciler.run_dirty(t + 40).await.unwrap()
    });
    let s = store.lock();
    let displayed = s.displayed().get(&GroupValue::Int(0)).copied().unwrap_or(0);
    let truth = s.truth().get(&GroupValue::Int(0)).copied().unwrap_or(0);
    assert!(
        displayed == truth && report.corrections.is_empty(),
        "post 0 displays {displayed}, truth {truth}, after a fold that corrected {:?} (counter {:?})",
        report.corrections,
        s.counters().get(&GroupValue::Int(0))
    );
}

/// History was lost while comments moved: their ledger entries still describe them as they were
/// before the gap. The sweep after the gap recounts every post, but a later event of such a
/// comment used to be classified against its stale entry: with a complete update description
/// the after-state is derived from it, so a soft delete of a comment that now sits on post 1
/// was filed on post 0 (still its old post, now "deleted"), and post 1, never touched nor
/// dirty, kept counting it. Guessing instead (as if the ledger had no entry) is not enough: a
/// comment that moved to post 2 in the gap and then moves back to post 0 leaves post 2 unknown
/// and counting it; the sweep rebuilds the ledger entries of the rows it counts. (Found by
/// `with_history_lost_and_start_at`, `SIM_HISTORY_LOST=1 SIM_LOST_START_TIME=1 SIM_SEED=104`,
/// before the recount change.)
///
/// Run twice: with the recounts' whole share, the rebuild reads the group's rows at once; with
/// a share of no rows, it rebuilds each post's rows before it reads the next post's.
#[test]
fn events_after_lost_history_are_not_classified_against_stale_ledger_entries() {
    for recount_rows in [0, usize::MAX] {
        stale_ledger_entries_case(recount_rows);
    }
}

pub fn stale_ledger_entries_case(recount_rows: usize) {
    let store = Arc::new(SimStore::new(1, 10, 3, START_CLOCK));
    let mut plan = Plan::new(1, Variant::FAITHFUL);
    plan.bucket_width = 10;
    plan.settle = 5;
    plan.pre_images = false;
    plan.recount_rows = recount_rows;
    let settings = plan.worker_settings(STREAM, None);
    let reconciler = Reconciler::new(store.clone(), plan.reconcile_settings(STREAM, None, 100));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let created = bson::DateTime::from_millis(START_CLOCK * 1000);
        {
            let mut s = store.lock();
            s.insert_row(bson::doc! {"_id": 1_i64, "post_id": 0_i64, "created_at": created});
            s.insert_row(bson::doc! {"_id": 2_i64, "post_id": 0_i64, "created_at": created});
        }
        catch_up(&store, settings.clone(), 1).await;
        {
            // The comments move to posts 1 and 2, and the oplog loses the moves.
            let mut s = store.lock();
            s.clock += 100;
            s.update(1, bson::doc! {"post_id": 1_i64}, &[]);
            s.update(2, bson::doc! {"post_id": 2_i64}, &[]);
            s.oplog_floor = s.oplog.len();
            s.clock += 1; // the worker's "now" is after the lost writes
        }
        // The worker finds its history lost, records the gap and restarts from now.
        catch_up(&store, settings.clone(), 2).await;
        assert_eq!(store.lock().checkpoint_view(STREAM).unwrap().gaps.len(), 1);
        // Writes long paused: the requested sweep recounts every post.
        let now = settle(&store, 100).await;
        let swept = reconciler.run_requested_sweep(now, None).await.unwrap();
        assert!(swept.is_some(), "the sweep after lost history did not run");
        {
            let mut s = store.lock();
            s.clock += 1;
            let deleted = bson::DateTime::from_millis(s.clock * 1000);
            s.update(1, bson::doc! {"deleted_at": deleted}, &[]);
            s.update(2, bson::doc! {"post_id": 0_i64}, &[]);
        }
        catch_up(&store, settings, 3).await;
        let now = settle(&store, 100).await;
        reconciler.run_dirty(now).await.unwrap();
    });
    let s = store.lock();
    let wrong = off_truth(&s);
    assert!(wrong.is_empty(), "recount_rows {recount_rows}: {wrong:?}");
    let dirty = s.dirty_posts(CounterIx::DEFAULT);
    assert!(
        dirty.is_empty(),
        "recount_rows {recount_rows}: still dirty: {dirty:?}"
    );
}

/// Moves the clock on by `secs` with writes paused, and records for the stopped worker that it
/// is drained at the new position, as a running worker would.
pub async fn settle(store: &Arc<SimStore>, secs: i64) -> i64 {
    let now = {
        let mut s = store.lock();
        s.clock += secs;
        s.clock
    };
    record_drained(store, &[STREAM.into()]).await.unwrap();
    now
}
