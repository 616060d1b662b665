//! [`RunHistory`](crate::store::RunHistory): reconcile runs and the sweep cursor.

use super::{seam, Memory, MemoryStore};
use crate::store::{RunSummary, SweepCursor};

impl Memory {
    pub fn record_run(&mut self, run: &RunSummary) {
        self.runs.push(run.clone());
    }

    /// The run that finished last (`sort({finished_at: -1})`: the newest of equals first).
    pub fn last_run(&self) -> Option<RunSummary> {
        self.runs
            .iter()
            .rev()
            .max_by_key(|r| r.finished_at)
            .cloned()
    }

    pub fn load_sweep_cursor(&self, stream: &str) -> Option<SweepCursor> {
        self.sweeps.get(stream).cloned()
    }

    pub fn save_sweep_cursor(&mut self, stream: &str, cursor: &SweepCursor) {
        self.sweeps.insert(stream.to_string(), cursor.clone());
    }
}

seam!(RunHistory {
    ok fn record_run(run: &RunSummary) -> ();
    ok fn last_run() -> Option<RunSummary>;
    ok fn load_sweep_cursor(stream: &str) -> Option<SweepCursor>;
    ok fn save_sweep_cursor(stream: &str, cursor: &SweepCursor) -> ();
});
