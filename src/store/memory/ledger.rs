//! [`Ledger`]: the last known state of each comment, per stream.

use std::collections::HashMap;

use super::{fence_ok, not_gte, seam, upsert, Memory, MemoryStore};
use crate::core::event::{CommentId, Row, Token};
use crate::core::event::{LedgerUpdate, LedgerView};
use crate::core::window::LedgerAt;
use crate::store::Fence;

/// A stored ledger entry.
#[derive(Clone, Debug, Default)]
pub struct LedgerRec {
    /// The row's last known state (`None`: the comment is gone).
    pub state: Option<Row>,
    /// `None`: rebuilt by the sweep after lost history, or claimed by the snapshot (any worker
    /// write replaces it).
    pub applied_through: Option<String>,
    pub epoch: Option<i64>,
    /// The stream's history-gap count when written.
    pub generation: u64,
}

impl LedgerRec {
    /// An entry holding `state` (`None`: the comment is gone).
    fn new(
        state: Option<&Row>,
        applied_through: Option<String>,
        epoch: Option<i64>,
        generation: u64,
    ) -> LedgerRec {
        LedgerRec {
            state: state.cloned(),
            applied_through,
            epoch,
            generation,
        }
    }
}

/// A ledger entry's key: the stream's ledger collection (partitions, `<base>/pNofM`, keep their
/// own, named like the MongoDB store names them) and the comment's key.
fn ledger_key(stream: &str, comment: &CommentId) -> (String, String) {
    let collection = match stream.split_once('/') {
        Some((_, partition)) => format!("counterd_comment_state_{partition}"),
        None => "counterd_comment_state".to_string(),
    };
    (collection, comment.key.clone())
}

impl Memory {
    pub fn read_ledger(&self, stream: &str, comments: &[CommentId], generation: u64) -> LedgerView {
        self.read_ledger_at(stream, comments, generation)
            .into_iter()
            .map(|(comment, at)| (comment, at.state))
            .collect()
    }

    /// `read_ledger` with the token of the batch that wrote each entry.
    pub fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> HashMap<String, LedgerAt> {
        let current = |c: &CommentId| {
            let entry = self.ledger.get(&ledger_key(stream, c))?;
            let state = entry.state.clone();
            let through = entry.applied_through.clone().filter(|t| !t.is_empty());
            (entry.generation >= generation).then(|| (c.key.clone(), LedgerAt { state, through }))
        };
        comments.iter().filter_map(current).collect()
    }

    /// One statement of `write_ledger`: the state, if the entry's `applied_through` is below
    /// `through` and no newer epoch wrote it. Returns whether it was written.
    pub fn write_ledger_entry(
        &mut self,
        fence: &Fence,
        u: &LedgerUpdate,
        through: &Token,
        generation: u64,
    ) -> bool {
        let key = ledger_key(&fence.stream, &u.comment);
        let admits = |e: &LedgerRec| {
            not_gte(e.applied_through.as_deref(), through.as_str()) && fence_ok(e.epoch, fence)
        };
        let Some(entry) = upsert(&mut self.ledger, key, admits, LedgerRec::default) else {
            return false;
        };
        let (applied_through, epoch) = (Some(through.to_string()), Some(fence.epoch));
        *entry = LedgerRec::new(u.state.as_ref(), applied_through, epoch, generation);
        true
    }

    /// One statement of `rebuild_ledger`: the row, unless the entry is of `generation` already
    /// (the upsert's insert: a duplicate key). Returns whether it was written.
    pub fn rebuild_ledger_entry(
        &mut self,
        stream: &str,
        generation: u64,
        comment: &CommentId,
        row: &Row,
    ) -> bool {
        let key = ledger_key(stream, comment);
        let older = |e: &LedgerRec| e.generation < generation;
        let Some(entry) = upsert(&mut self.ledger, key, older, LedgerRec::default) else {
            return false;
        };
        *entry = LedgerRec::new(Some(row), None, entry.epoch, generation);
        true
    }

    /// One statement of `claim_ledger` (`$setOnInsert`): the claim, unless the comment has an
    /// entry already. Returns whether it was written.
    pub fn claim_ledger_entry(
        &mut self,
        fence: &Fence,
        claim: &LedgerUpdate,
        generation: u64,
    ) -> bool {
        let Some(row) = &claim.state else {
            return false;
        };
        let key = ledger_key(&fence.stream, &claim.comment);
        let entry = || LedgerRec::new(Some(row), None, Some(fence.epoch), generation);
        upsert(&mut self.ledger, key, |_| false, entry).is_some()
    }

    /// `write_ledger`: its statements, each on its own.
    pub fn write_ledger(
        &mut self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) {
        for u in updates {
            self.write_ledger_entry(fence, u, through, generation);
        }
    }

    /// `rebuild_ledger`: its statements, each on its own.
    pub fn rebuild_ledger(&mut self, stream: &str, generation: u64, rows: &[(CommentId, Row)]) {
        for (comment, row) in rows {
            self.rebuild_ledger_entry(stream, generation, comment, row);
        }
    }

    /// `claim_ledger`: its statements, each on its own.
    pub fn claim_ledger(&mut self, fence: &Fence, claims: &[LedgerUpdate], generation: u64) {
        for claim in claims {
            self.claim_ledger_entry(fence, claim, generation);
        }
    }
}

seam!(Ledger {
    ok fn read_ledger_at(stream: &str, comments: &[CommentId], generation: u64) -> HashMap<String, LedgerAt>;
    ok fn write_ledger(fence: &Fence, updates: &[LedgerUpdate], through: &Token, generation: u64) -> ();
    ok fn rebuild_ledger(stream: &str, generation: u64, rows: &[(CommentId, Row)]) -> ();
    ok fn claim_ledger(fence: &Fence, claims: &[LedgerUpdate], generation: u64) -> ();
});
