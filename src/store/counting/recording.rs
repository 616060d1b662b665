//! The worker's writes as it handed them to the store, kept so that the same writes can be
//! made again on their own: the benchmark's bulk baseline replays them one after another, with
//! nothing between them (no reads, no planning, no waiting for a concern running beside them),
//! to show what the server needs for exactly the statements the worker had to make.

use super::*;

/// One write call, as made (see [`CountingStore::recording`]): the fence it was made under,
/// and the call.
#[derive(Clone, Debug)]
pub struct Write {
    pub fence: Fence,
    pub call: Call,
}

/// A recorded write call's other arguments.
#[derive(Clone, Debug)]
pub enum Call {
    Adopt,
    Intent {
        batch: Box<PendingBatch>,
        carried: Option<Box<PendingBatch>>,
    },
    ClearCarried {
        carry: Token,
    },
    Checkpoint {
        token: Token,
        time: Option<Timestamp>,
    },
    Start {
        at: Timestamp,
    },
    CaughtUp {
        at: Timestamp,
    },
    Counters {
        writes: Vec<CounterWrite>,
    },
    Ledger {
        updates: Vec<LedgerUpdate>,
        through: Token,
        generation: u64,
    },
    Dirty {
        marks: Vec<DirtyMark>,
        now: DateTime,
    },
}

impl Write {
    /// Makes the write again, through `store`.
    pub async fn replay<S: Store + ?Sized>(&self, store: &S) -> StoreResult<()> {
        let fence = &self.fence;
        match &self.call {
            Call::Adopt => store.adopt_checkpoint(fence).await,
            Call::Intent { batch, carried } => {
                store.record_intent(fence, batch, carried.as_deref()).await
            }
            Call::ClearCarried { carry } => store.clear_carried(fence, carry).await,
            Call::Checkpoint { token, time } => store.save_checkpoint(fence, token, *time).await,
            Call::Start { at } => store.record_start(fence, *at).await,
            Call::CaughtUp { at } => store.record_caught_up(fence, *at).await,
            Call::Counters { writes } => store.write_counters(fence, writes).await.map(|_| ()),
            Call::Ledger {
                updates,
                through,
                generation,
            } => {
                store
                    .write_ledger(fence, updates, through, *generation)
                    .await
            }
            Call::Dirty { marks, now } => store.mark_dirty(fence, marks, *now).await,
        }
    }
}

/// Where a recording store keeps its writes (shared by its clones and views).
pub(super) type Recorder = Option<Arc<std::sync::Mutex<Vec<Write>>>>;
