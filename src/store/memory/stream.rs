//! [`ChangeStreams`]: the oplog of the application's writes, rendered as change events the way
//! a real server renders them when they are read, and the server's position.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, DateTime, Document, Timestamp};

use super::{Memory, MemoryStore};
use crate::core::cost::ReadLimit;
use crate::core::event::{ChangeEvent, CommentId, Token};
use crate::core::schema::Schema;
use crate::core::txn::TxnKey;
use crate::store::{
    ChangeStreams, EventSource, RawBatch, ServerNow, StoreError, StoreResult, StreamOptions,
    StreamStart,
};

/// One change in the oplog.
#[derive(Clone, Debug)]
pub struct OplogEntry {
    pub seq: u64,
    pub token: String,
    pub time: Timestamp,
    pub id: i64,
    pub kind: OpKind,
    /// The row just before the change (for `fullDocumentBeforeChange`).
    pub pre: Option<Document>,
    /// The pre-image expired (comes back null even when requested).
    pub pre_expired: bool,
    /// The multi-document transaction that wrote it (its events share one cluster time).
    pub txn: Option<OplogTxn>,
}

/// A transaction of the in-process oplog: a session and the transaction's number in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OplogTxn {
    /// Rendered as `lsid.id`, a UUID whose 16 bytes repeat this number's bytes.
    pub session: u64,
    pub number: i64,
}

impl OplogTxn {
    /// The `lsid` a real server puts into a transaction's events: the session's UUID and the
    /// SHA-256 of the user who opened it.
    pub fn lsid(&self) -> Document {
        let id = [self.session.to_be_bytes(), self.session.to_le_bytes()].concat();
        doc! {
            "id": Binary { subtype: BinarySubtype::Uuid, bytes: id },
            "uid": Binary { subtype: BinarySubtype::Generic, bytes: vec![0xE3; 32] },
        }
    }
}

/// An open transaction: every write until it commits is one of its events, at `time`.
#[derive(Clone, Copy, Debug)]
pub struct OpenTxn {
    pub txn: OplogTxn,
    pub time: Timestamp,
}

/// A change's kind; its name is the event's `operationType`.
#[derive(Clone, Debug, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum OpKind {
    Insert(Document),
    Update {
        updated: Document,
        removed: Vec<String>,
    },
    Replace(Document),
    Delete,
}

impl OpKind {
    pub fn name(&self) -> &'static str {
        self.into()
    }
}

/// The resume token `_data` of event `seq` (uppercase hex, like a real one; sorts in order).
pub fn event_token(seq: u64) -> String {
    format!("82{seq:016X}")
}

/// The post-batch token of a drained stream after event `seq`: after it, before the next event.
pub fn drained_token(seq: u64) -> String {
    format!("82{seq:016X}FF")
}

/// Where an open change stream stands in the oplog.
#[derive(Clone, Debug)]
pub struct Cursor {
    /// Index of the next entry to return.
    pub next: usize,
    pub pre_images: bool,
    /// Resumed after a token (or at a time) that is no longer in the oplog: the first read
    /// fails with code 286, like a real server.
    pub lost: Option<String>,
}

impl Cursor {
    /// The error of the first read after resuming where history is gone (once).
    pub fn history_lost(&mut self) -> Option<StoreError> {
        let token = self.lost.take()?;
        Some(StoreError::HistoryLost { code: 286, token })
    }
}

impl Memory {
    fn next_time(&mut self) -> Timestamp {
        let time = self.clock as u32;
        self.last_time = if time > self.last_time.time {
            Timestamp { time, increment: 1 }
        } else {
            Timestamp {
                time: self.last_time.time,
                increment: self.last_time.increment + 1,
            }
        };
        self.last_time
    }

    /// Appends the change event of a write at the clock (inside an open transaction: at the
    /// transaction's cluster time, as one of its events).
    pub(super) fn append(&mut self, id: i64, kind: OpKind, pre: Option<Document>) {
        let seq = self.oplog.len() as u64 + 1;
        let (time, txn) = match self.open_txn {
            Some(open) => (open.time, Some(open.txn)),
            None => (self.next_time(), None),
        };
        self.oplog.push(OplogEntry {
            seq,
            token: event_token(seq),
            time,
            id,
            kind,
            pre,
            pre_expired: false,
            txn,
        });
    }

    /// Starts a multi-document transaction: every write until [`Memory::commit_transaction`]
    /// is one of its events, all at one cluster time and with its `lsid` and `txnNumber`, like
    /// a real server's. Its events are visible together as long as the caller holds the lock
    /// from here to the commit (the simulation's writers do).
    pub fn begin_transaction(&mut self, txn: OplogTxn) {
        assert!(self.open_txn.is_none(), "one transaction at a time");
        let time = self.next_time();
        self.open_txn = Some(OpenTxn { txn, time });
    }

    /// Ends the open transaction.
    pub fn commit_transaction(&mut self) {
        self.open_txn = None;
    }

    /// Index of the first oplog entry after `token`.
    pub fn index_after(&self, token: &str) -> usize {
        self.oplog.partition_point(|e| e.token.as_str() <= token)
    }

    pub fn last_token(&self) -> Option<String> {
        self.oplog.last().map(|e| e.token.clone())
    }

    /// Opens a stream at `start`; a start the truncated oplog no longer holds is lost history.
    pub fn open_cursor(&self, options: &StreamOptions) -> StoreResult<Cursor> {
        if !options.pipeline.is_empty() {
            return Err(StoreError::Fatal {
                op: "open the change stream",
                message: "the in-process store does not evaluate stream pipelines".into(),
            });
        }
        let truncated = self.oplog_floor.checked_sub(1).map(|i| &self.oplog[i]);
        let (next, lost) = match &options.start {
            StreamStart::After(token) => {
                let lost = truncated
                    .filter(|t| t.token.as_str() > token.as_str())
                    .map(|_| token.to_string());
                (self.index_after(token.as_str()), lost)
            }
            StreamStart::AtTime(at) => {
                let lost = truncated.filter(|t| t.time >= *at).map(|_| String::new());
                (self.oplog.partition_point(|e| e.time < *at), lost)
            }
            StreamStart::Now => (self.oplog.len(), None),
        };
        Ok(Cursor {
            next: next.max(self.oplog_floor),
            pre_images: options.pre_images,
            lost,
        })
    }

    /// Events after the cursor still to read.
    pub fn available(&self, cursor: &Cursor) -> usize {
        self.oplog.len().saturating_sub(cursor.next)
    }

    /// Reads the next events (at least one must be available) within `limit`, moving the
    /// cursor past them. The result may be empty: the first event did not fit. Like the
    /// MongoDB store's, a read ends only at a transaction's end, going beyond its limit to
    /// finish one (see [`crate::core::txn`]); `whole_transactions: false` is the deliberately broken
    /// reader that cuts wherever the limit falls (the simulation must catch it).
    pub fn read_events(&self, cursor: &mut Cursor, limit: ReadLimit) -> RawBatch {
        self.read_events_cut(cursor, limit, true)
    }

    /// [`Memory::read_events`], optionally cutting inside transactions.
    pub fn read_events_cut(
        &self,
        cursor: &mut Cursor,
        limit: ReadLimit,
        whole_transactions: bool,
    ) -> RawBatch {
        let available = &self.oplog[cursor.next..];
        let (mut events, mut costs) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        let mut last_txn: Option<TxnKey> = None;
        for entry in available {
            let event = self.render(entry, cursor.pre_images);
            let cost = crate::core::cost::document_cost(&event);
            let txn = TxnKey::of_event(&event).filter(|_| whole_transactions);
            let fits = limit.fits(events.len(), bytes, cost);
            if !crate::core::txn::takes_next(fits, last_txn.as_ref(), txn.as_ref()) {
                break;
            }
            bytes += cost;
            last_txn = txn;
            events.push(ChangeEvent::from_document(event));
            costs.push(cost);
        }
        let n = events.len();
        let entries = &available[..n];
        cursor.next += n;
        let last = entries.last().map(|e| Token(e.token.clone()));
        RawBatch {
            events,
            costs,
            post_batch_token: last.filter(|_| self.post_batch_tokens),
        }
    }

    /// The answer of a drained stream: no events, and (where the server sends one) a
    /// post-batch token after the newest event.
    pub fn drained_batch(&self) -> RawBatch {
        let last = self.oplog.last().map_or(0, |e| e.seq);
        RawBatch {
            events: Vec::new(),
            costs: Vec::new(),
            post_batch_token: self.post_batch_tokens.then(|| Token(drained_token(last))),
        }
    }

    /// Exact, like an `operationTime`: just after the newest event, or the clock.
    pub fn read_position(&self) -> ServerNow {
        let after_last = Timestamp {
            time: self.last_time.time,
            increment: self.last_time.increment + 1,
        };
        let now = after_last.max(Timestamp {
            time: self.clock as u32,
            increment: 0,
        });
        ServerNow {
            lower: now,
            upper: now,
        }
    }

    /// The event document as a real server returns it when it is read now.
    fn render(&self, e: &OplogEntry, pre_images: bool) -> Document {
        let mut d = doc! {
            "_id": {"_data": &e.token},
            "operationType": e.kind.name(),
            "clusterTime": e.time,
            "wallTime": DateTime::from_millis(e.time.time as i64 * 1000),
            "ns": {"db": "app", "coll": "comments"},
            "documentKey": {"_id": e.id},
        };
        if let Some(txn) = &e.txn {
            d.insert("lsid", txn.lsid());
            d.insert("txnNumber", txn.number);
        }
        match &e.kind {
            OpKind::Insert(row) | OpKind::Replace(row) => {
                d.insert("fullDocument", row.clone());
            }
            OpKind::Update { updated, removed } => {
                // `$unset`'s names, as the fake test server spells the removed fields.
                let unset: Document = removed.iter().map(|f| (f.clone(), "".into())).collect();
                if self.update_descriptions {
                    d.insert(
                        "updateDescription",
                        doc! {"updatedFields": updated.clone(), "removedFields": removed.clone(), "truncatedArrays": []},
                    );
                } else {
                    // Like the fake test server: the update spec rides in `documentKey`.
                    d.insert(
                        "documentKey",
                        doc! {"_id": e.id, "$set": updated.clone(), "$unset": unset.clone()},
                    );
                }
                if pre_images {
                    // updateLookup (asked for with pre-images only, like the MongoDB store):
                    // the row as it is now, null when it is gone.
                    let now = self.comments.get(&e.id).cloned();
                    d.insert("fullDocument", now.map_or(Bson::Null, Bson::Document));
                } else if !self.update_descriptions {
                    // Without a lookup the fake test server sends the update's fields instead
                    // (`$set`'s values, `$unset`'s names): a fragment without `_id`.
                    let mut fragment = updated.clone();
                    fragment.extend(unset);
                    d.insert("fullDocument", fragment);
                }
            }
            OpKind::Delete => {}
        }
        if pre_images && self.pre_images_enabled && !matches!(e.kind, OpKind::Insert(_)) {
            let pre = match (&e.pre, e.pre_expired) {
                (Some(pre), false) => Bson::Document(pre.clone()),
                _ => Bson::Null,
            };
            d.insert("fullDocumentBeforeChange", pre);
        }
        d
    }

    /// The rows of `comments` as they are now, by comment key (gone ones absent): the batched
    /// read that replaces `updateLookup` (see `crate::core::lookup`).
    /// Like the MongoDB store's, a row comes with the schema's row projection: `_id` and the
    /// fields counterd reads (by their top-level field).
    pub fn look_up(&self, comments: &[CommentId]) -> HashMap<String, Document> {
        let schema = Schema::default().with_more(self.definitions[1..].to_vec());
        let projection = schema.row_projection();
        let fields: Vec<&str> = projection
            .keys()
            .filter_map(|p| p.split('.').next())
            .collect();
        comments
            .iter()
            .filter_map(|c| {
                let id = c.value.as_i64().or(c.value.as_i32().map(i64::from))?;
                let row = self.comments.get(&id)?;
                let projected: Document = row
                    .iter()
                    .filter(|(k, _)| fields.contains(&k.as_str()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                Some((c.key.clone(), projected))
            })
            .collect()
    }

    /// Every one of `streams` has nothing in flight and, resumed now, would count no event
    /// anew: the events after its resume position (a token, else a start time, else the
    /// worker's configured `start_at`) are all at or below its high water. Events truncated
    /// away count too: a worker whose resume position fell off the oplog has not caught up
    /// (it has yet to find its history lost).
    pub fn caught_up(&self, streams: &[String], start_at: Option<Timestamp>) -> bool {
        streams.iter().all(|stream| {
            let Some(c) = self.checkpoints.get(stream).map(|c| &c.doc) else {
                return self.oplog.is_empty();
            };
            let from = match (&c.token, c.start_time.or(start_at)) {
                (Some(token), _) => self.index_after(token.as_str()),
                (None, Some(at)) => self.oplog.partition_point(|e| e.time < at),
                (None, None) => self.oplog.len(),
            };
            let from = from.min(self.oplog.len());
            // A stream that has applied nothing yet, beside existing rows, is about to snapshot
            // them (with `initial_snapshot = never` the test writes none before it).
            let to_snapshot = c.untouched() && !self.comments.is_empty();
            // Tokens grow along the oplog: the last event after `from` is the newest.
            !c.snapshot_running()
                && !to_snapshot
                && c.pending.is_none()
                && (from == self.oplog.len()
                    || c.high_water.as_ref().is_some_and(|h| {
                        self.oplog
                            .last()
                            .is_some_and(|e| e.token.as_str() <= h.as_str())
                    }))
        })
    }
}

/// An open change stream over the oplog: each read returns what is there, up to `max`.
pub struct MemoryEvents {
    store: MemoryStore,
    cursor: Cursor,
}

#[async_trait]
impl EventSource for MemoryEvents {
    async fn read(&mut self, limit: ReadLimit, _max_wait: Duration) -> StoreResult<RawBatch> {
        if let Some(lost) = self.cursor.history_lost() {
            return Err(lost);
        }
        let m = self.store.lock();
        Ok(match m.available(&self.cursor).min(limit.events) {
            0 if limit.events == 0 => RawBatch::default(),
            0 => m.drained_batch(),
            n => m.read_events(&mut self.cursor, ReadLimit { events: n, ..limit }),
        })
    }
}

#[async_trait]
impl ChangeStreams for MemoryStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let cursor = self.lock().open_cursor(&options)?;
        Ok(Box::new(MemoryEvents {
            store: self.clone(),
            cursor,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        Ok(self.lock().read_position())
    }

    async fn look_up(&self, comments: &[CommentId]) -> StoreResult<HashMap<String, Document>> {
        Ok(self.lock().look_up(comments))
    }
}
