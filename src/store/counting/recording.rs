//! The worker's writes as it handed them to the store, kept so that the same writes can be
//! made again on their own: the benchmark's bulk baseline replays them one after another, with
//! nothing between them (no reads, no planning, no waiting for a concern running beside them),
//! to show what the server needs for exactly the statements the worker had to make.

use super::*;

/// One write call, as made (see [`CountingStore::recording`]).
#[derive(Clone, Debug)]
pub enum Write {
    Adopt {
        fence: Fence,
    },
    Intent {
        fence: Fence,
        batch: Box<PendingBatch>,
        carried: Option<Box<PendingBatch>>,
    },
    ClearCarried {
        fence: Fence,
        carry: Token,
    },
    Checkpoint {
        fence: Fence,
        token: Token,
        time: Option<Timestamp>,
    },
    Start {
        fence: Fence,
        at: Timestamp,
    },
    CaughtUp {
        fence: Fence,
        at: Timestamp,
    },
    Counters {
        fence: Fence,
        writes: Vec<CounterWrite>,
    },
    Ledger {
        fence: Fence,
        updates: Vec<LedgerUpdate>,
        through: Token,
        generation: u64,
    },
    Dirty {
        fence: Fence,
        marks: Vec<DirtyMark>,
        now: DateTime,
    },
}

impl Write {
    /// Makes the write again, through `store`.
    pub async fn replay<S: Store + ?Sized>(&self, store: &S) -> StoreResult<()> {
        match self {
            Write::Adopt { fence } => store.adopt_checkpoint(fence).await,
            Write::Intent {
                fence,
                batch,
                carried,
            } => store.record_intent(fence, batch, carried.as_deref()).await,
            Write::ClearCarried { fence, carry } => store.clear_carried(fence, carry).await,
            Write::Checkpoint { fence, token, time } => {
                store.save_checkpoint(fence, token, *time).await
            }
            Write::Start { fence, at } => store.record_start(fence, *at).await,
            Write::CaughtUp { fence, at } => store.record_caught_up(fence, *at).await,
            Write::Counters { fence, writes } => {
                store.write_counters(fence, writes).await.map(|_| ())
            }
            Write::Ledger {
                fence,
                updates,
                through,
                generation,
            } => {
                store
                    .write_ledger(fence, updates, through, *generation)
                    .await
            }
            Write::Dirty { fence, marks, now } => store.mark_dirty(fence, marks, *now).await,
        }
    }
}

/// Where a recording store keeps its writes (shared by its clones and views).
pub(super) type Recorder = Option<Arc<std::sync::Mutex<Vec<Write>>>>;
