//! Reading the change stream ahead of the worker.
//!
//! The driver asks the server for the next reply only once every event of the last one is
//! taken, and then waits for it. Read inline, each reply's round trip (and, on the fake test
//! server, its scan of the oplog) stands between two of the worker's batches whenever it takes
//! longer than writing one: catching up a backlog, one step in three waited about 150 ms for a
//! reply while its batch was written in 50 (bench/RESULTS.md, 2026-12-05, afternoon). The pump
//! is a task that owns the stream and moves each reply's events, still raw, into a queue bounded
//! in bytes (`crate::core::cost::STREAM_QUEUE`), so that the driver asks for the next reply
//! while the worker still takes the events of the last one (Debezium keeps the same queue
//! between its reader and its processing). The queue and the reply the driver holds are what an
//! open stream sets aside of the memory budget (`crate::core::cost::REPLY_RESERVE`).
//!
//! An empty reply ("dry") pauses the pump until a read asks again: an idle stream is not polled
//! in the background (the fake server ignores `maxAwaitTimeMS`). And an empty answer is one the
//! worker relies on: every event before a position it took just before the read is applied.
//! So a read takes an empty reply for its answer only if the reply was asked for after the
//! read began ([`Dry::asked_by`]); an older one is set aside and the server asked again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use mongodb::bson::RawDocumentBuf;
use mongodb::change_stream::event::ResumeToken;
use mongodb::change_stream::ChangeStream;
use mongodb::error::Error as DriverError;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::core::cost::{QUEUED_EVENT, STREAM_QUEUE};

/// What the pump hands over, in the stream's order.
pub(super) enum Pumped {
    /// An event, with the room it holds in the queue (given back when it is dropped).
    Event {
        raw: RawDocumentBuf,
        _room: OwnedSemaphorePermit,
    },
    /// The server's reply was empty.
    Dry(Dry),
    /// The stream failed; the pump stopped.
    Failed(DriverError),
}

/// An empty reply.
pub(super) struct Dry {
    /// The number of the read ([`Pump::begin_read`]) current when the reply was asked for:
    /// that read and later ones may take it for their answer.
    pub asked_by: u64,
    /// Where the stream stands (the server's post-batch resume token, where it sends one).
    pub post_batch: Option<ResumeToken>,
    /// The pump stopped and closed the stream (the server sends no post-batch token: see
    /// `MongoEvents`), so the next read opens another.
    pub ended: bool,
}

/// The consumer's end: the queue, and the means to number reads and to ask again.
pub(super) struct Pump {
    queue: mpsc::UnboundedReceiver<Pumped>,
    reads: Arc<AtomicU64>,
    demand: Arc<Notify>,
    /// A dry reply was taken and the server not asked again since.
    paused: bool,
    task: JoinHandle<()>,
}

impl Pump {
    /// Starts pumping `stream`. `positioned`: the stream started from a concrete position (not
    /// "now"), so it may be closed when it runs dry and reopened from its last event. `read`:
    /// the number of the read under way (0: none yet; a reply is an answer to the reads numbered
    /// up to the current number when it was asked for).
    pub(super) fn start(stream: ChangeStream<RawDocumentBuf>, positioned: bool, read: u64) -> Pump {
        let (sender, queue) = mpsc::unbounded_channel();
        let reads = Arc::new(AtomicU64::new(read));
        let demand = Arc::new(Notify::new());
        let producer = Producer {
            queue: sender,
            room: Room {
                queue: Arc::new(Semaphore::new(STREAM_QUEUE)),
                credit: None,
            },
            reads: reads.clone(),
            demand: demand.clone(),
        };
        let task = tokio::spawn(run(stream, producer, positioned));
        Pump {
            queue,
            reads,
            demand,
            paused: false,
            task,
        }
    }

    /// Numbers a read that begins now, and asks the server again if the pump is paused.
    pub(super) fn begin_read(&mut self) -> u64 {
        let read = self.reads.fetch_add(1, Ordering::SeqCst) + 1;
        self.ask();
        read
    }

    /// Asks the server again after a dry reply (nothing if the pump is not paused).
    fn ask(&mut self) {
        if std::mem::take(&mut self.paused) {
            self.demand.notify_one();
        }
    }

    /// The next thing the pump hands over. `None`: the pump is gone (it stopped after a dry
    /// reply that ended it, or its task ended otherwise).
    pub(super) async fn next(&mut self) -> Option<Pumped> {
        let next = self.queue.recv().await;
        if let Some(Pumped::Dry(dry)) = &next {
            self.paused = !dry.ended;
        }
        next
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The pump task's end: the queue, its room, and the consumer's read numbers and requests.
struct Producer {
    queue: mpsc::UnboundedSender<Pumped>,
    room: Room,
    reads: Arc<AtomicU64>,
    demand: Arc<Notify>,
}

/// The queue's room, taken by the pump a share at a time.
///
/// Each event holds its own bytes of the room until the worker has taken it. The pump takes
/// them from a credit, which it refills by [`ROOM_SHARE`] of the queue at a time: the worker
/// frees room an event at a time, and waiting for each event's bytes woke the pump's task once
/// per event taken from a full queue (while the worker catches up, the queue is full), each
/// time on the runtime's other thread, which then parked again.
struct Room {
    queue: Arc<Semaphore>,
    /// Bytes taken from the queue's room and not yet given to an event.
    credit: Option<OwnedSemaphorePermit>,
}

/// The share of the queue the pump's credit is refilled by: once per about 360 projected
/// events.
const ROOM_SHARE: usize = STREAM_QUEUE / 8;

impl Room {
    /// `bytes` of the queue's room (at most all of it), waiting until they are free. `None`:
    /// the queue was closed.
    async fn take(&mut self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let held = self.credit.as_ref().map_or(0, |c| c.num_permits());
        if held < bytes {
            // Never more than the queue holds, so that a refill can always be had.
            let refill = (bytes - held).max(ROOM_SHARE).min(STREAM_QUEUE - held);
            let more = self
                .queue
                .clone()
                .acquire_many_owned(refill as u32)
                .await
                .ok()?;
            match &mut self.credit {
                Some(credit) => credit.merge(more),
                None => self.credit = Some(more),
            }
        }
        let credit = self.credit.as_mut().expect("refilled above");
        if credit.num_permits() == bytes {
            return self.credit.take();
        }
        credit.split(bytes)
    }
}

/// The pump's task: takes events from the stream as long as the queue has room, stops at an
/// empty reply until asked again (or for good, see [`Dry::ended`]) and at an error.
async fn run(mut stream: ChangeStream<RawDocumentBuf>, mut to: Producer, mut positioned: bool) {
    loop {
        // Taken before the request: a reply asked for now answers this read and later ones.
        let asked_by = to.reads.load(Ordering::SeqCst);
        match stream.next_if_any().await {
            Ok(Some(raw)) => {
                positioned = true;
                let bytes = (raw.as_bytes().len() + QUEUED_EVENT).min(STREAM_QUEUE);
                let Some(room) = to.room.take(bytes).await else {
                    return;
                };
                if to.queue.send(Pumped::Event { raw, _room: room }).is_err() {
                    return;
                }
            }
            Ok(None) => {
                let post_batch = stream.resume_token();
                let ended = post_batch.is_none() && positioned;
                let dry = Dry {
                    asked_by,
                    post_batch,
                    ended,
                };
                if to.queue.send(Pumped::Dry(dry)).is_err() || ended {
                    return;
                }
                to.demand.notified().await;
            }
            Err(e) => {
                let _ = to.queue.send(Pumped::Failed(e));
                return;
            }
        }
    }
}
