//! [`CountingStore`]'s delegation of the concerns the worker writes: checkpoints, counters,
//! ledger and dirty set. Each call counts the statements it carries.

use super::*;

counted! {
    impl Checkpoints as Checkpoints {
        load_checkpoint(stream: &str) -> Option<Checkpoint>, 0;
        record_intent(fence: &Fence, batch: &PendingBatch, carried: Option<&PendingBatch>) -> (),
            1, records fence => Call::Intent {
                batch: Box::new(batch.clone()),
                carried: carried.cloned().map(Box::new),
            };
        load_carried(
            stream: &str,
            carry: &Token,
            after: Option<&Token>,
            through: &Token,
            limit: usize,
        ) -> Vec<PendingBatch>, 0;
        clear_carried(fence: &Fence, carry: &Token) -> (), 1,
            records fence => Call::ClearCarried { carry: carry.clone() };
        save_checkpoint(fence: &Fence, token: &Token, token_time: Option<Timestamp>) -> (), 1,
            records fence => Call::Checkpoint { token: token.clone(), time: token_time };
        move_checkpoint(stream: &str, to: &Position) -> (), 1;
        record_start(fence: &Fence, at: Timestamp) -> (), 1,
            records fence => Call::Start { at };
        record_caught_up(fence: &Fence, at: Timestamp) -> (), 1,
            records fence => Call::CaughtUp { at };
        record_gap(fence: &Fence, gap: &Gap) -> (), 1;
        deployment() -> Deployment, 0;
        record_deployment(fence: &Fence, deployment: &Deployment) -> (), 1;
        set_sweep_requested(stream: &str, requested: bool) -> (), 1;
        adopt_checkpoint(fence: &Fence) -> (), 1, records fence => Call::Adopt;
        save_snapshot(fence: &Fence, progress: &SnapshotProgress) -> (), 1;
    }
}

counted! {
    impl Counters as Counters {
        write_counters(fence: &Fence, writes: &[CounterWrite]) -> ApplyOutcome, writes.len(),
            records fence => Call::Counters { writes: writes.to_vec() };
        read_counter(post: &GroupValue) -> Option<CounterDoc>, 0;
        install_fold(
            post: &GroupValue,
            expected: Option<&CounterDoc>,
            fold: &Fold,
            now: DateTime,
        ) -> bool, 1;
        posts_after(after: Option<&GroupValue>, limit: usize) -> Vec<GroupValue>, 0;
        sample_posts(n: usize) -> Vec<GroupValue>, 0;
        apply_snapshot_counters(fence: &Fence, chunk: u64, writes: &[CounterDelta]) -> ApplyOutcome,
            writes.len();
    }
}

counted! {
    impl Ledger as Ledger {
        read_ledger(stream: &str, comments: &[CommentId], generation: u64)
            -> LedgerView, 0;
        read_ledger_at(stream: &str, comments: &[CommentId], generation: u64)
            -> HashMap<String, LedgerAt>, 0;
        write_ledger(fence: &Fence, updates: &[LedgerUpdate], through: &Token, generation: u64)
            -> (), updates.len(), records fence => Call::Ledger {
                updates: updates.to_vec(),
                through: through.clone(),
                generation,
            };
        rebuild_ledger(stream: &str, generation: u64, rows: &[(CommentId, Row)]) -> (), rows.len();
        claim_ledger(fence: &Fence, claims: &[LedgerUpdate], generation: u64) -> (), claims.len();
    }
}

counted! {
    impl DirtySet as Dirty {
        mark_dirty(fence: &Fence, marks: &[DirtyMark], now: DateTime) -> (), marks.len(),
            records fence => Call::Dirty { marks: marks.to_vec(), now };
        dirty_list(stream: Option<&str>, order: DirtyOrder, limit: usize) -> Vec<DirtyEntry>, 0;
        dirty_summary() -> DirtySummary, 0;
        clear_dirty(post: &GroupValue, version: i64) -> bool, 1;
        requeue_dirty(post: &GroupValue, now: DateTime) -> bool, 1;
    }
}
