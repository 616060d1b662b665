//! Small deterministic cases that guard bugs found by the simulation (their minimal forms) and
//! elsewhere, on the same simulated store and actors.

mod lost_history;
mod recount;

use std::rc::Rc;
use std::sync::Arc;

use counterd::worker::WorkerSettings;

use crate::actors::{join_in_order, worker, Errors};
use crate::sim_store::{SimStore, State};

/// Runs one worker alone until it has caught up (a quiescent round).
pub async fn catch_up(store: &Arc<SimStore>, settings: WorkerSettings, epoch: i64) {
    {
        let mut s = store.lock();
        s.others_running = 0;
        s.workers_running = 1;
    }
    let errors: Errors = Rc::default();
    join_in_order(vec![worker(
        store.clone(),
        settings,
        epoch,
        true,
        0,
        epoch,
        errors.clone(),
    )])
    .await;
    store.lock().shutdown.clear();
    assert!(errors.borrow().is_empty(), "{:?}", errors.borrow());
}

/// Every counter whose displayed value differs from its post's truth, described.
pub fn off_truth(s: &State) -> Vec<String> {
    let truth = s.truth();
    s.counters()
        .into_iter()
        .filter_map(|(post, (base, _, live, _))| {
            let want = truth.get(&post).copied().unwrap_or(0);
            (base + live != want).then(|| format!("post {post}: {} != truth {want}", base + live))
        })
        .collect()
}
