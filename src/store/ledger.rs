//! The comment ledger: the last known state of each comment ([`Ledger`]).

use std::collections::HashMap;

use async_trait::async_trait;

use super::error::StoreResult;
use super::leases::Fence;
use crate::core::event::{CommentId, LedgerUpdate, LedgerView, Row, Token};
use crate::core::window::LedgerAt;

/// The comment ledger: the last known state of each comment, per stream.
#[async_trait]
pub trait Ledger: Send + Sync {
    /// Reads the ledger entries (of `stream`: each partition keeps its own) of these comments:
    /// key → state (`None`: gone; a row without a post exists but does not count). Absent:
    /// unknown. `generation` is the number of history gaps the stream has recorded: an entry
    /// written under an older generation describes the row as it was before events were lost,
    /// so it is left out (unknown) until the worker or the sweep after the gap rewrites it.
    /// [`Ledger::read_ledger_at`] without the tokens.
    async fn read_ledger(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<LedgerView> {
        let entries = self.read_ledger_at(stream, comments, generation).await?;
        Ok(entries
            .into_iter()
            .map(|(key, at)| (key, at.state))
            .collect())
    }

    /// [`Ledger::read_ledger`] with the token of the batch that wrote each entry (`None`:
    /// written by the snapshot or a rebuild): a row-level recount needs the entry as of the
    /// counter's position, not a later one (see [`crate::core::window`]).
    async fn read_ledger_at(
        &self,
        stream: &str,
        comments: &[CommentId],
        generation: u64,
    ) -> StoreResult<HashMap<String, LedgerAt>>;

    /// (b) Ledger states, each guarded per comment by `applied_through < through`, stamped
    /// with the stream's `generation` (see [`Ledger::read_ledger`]).
    async fn write_ledger(
        &self,
        fence: &Fence,
        updates: &[LedgerUpdate],
        through: &Token,
        generation: u64,
    ) -> StoreResult<()>;

    /// Writes ledger entries (of `stream`) rebuilt from rows read once every event before the
    /// read was applied: each only where the comment has no entry or one older than
    /// `generation`. An entry the worker wrote since the gap (it applied an event of the row)
    /// is never replaced, and the worker's later writes always replace a rebuilt one.
    async fn rebuild_ledger(
        &self,
        stream: &str,
        generation: u64,
        rows: &[(CommentId, Row)],
    ) -> StoreResult<()>;

    /// Writes each claim only where the ledger has no entry for its comment yet: a state the
    /// stream wrote is newer than anything the snapshot read.
    async fn claim_ledger(
        &self,
        fence: &Fence,
        claims: &[LedgerUpdate],
        generation: u64,
    ) -> StoreResult<()>;
}
