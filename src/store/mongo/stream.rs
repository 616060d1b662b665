//! The change stream: resume tokens, the event source over `comments`, and where the server
//! stands in cluster time.

use super::pump::{Pump, Pumped};
use super::*;
use crate::core::cost::ReadLimit;
use crate::core::txn::{self, TxnKey};
use mongodb::bson::RawDocumentBuf;

pub(super) fn token_to_resume(token: &Token) -> StoreResult<ResumeToken> {
    bson::from_document(doc! {"_data": token.as_str()}).map_err(|e| StoreError::Malformed {
        what: "resume token",
        id: token.to_string(),
        detail: e.to_string(),
    })
}

pub(super) fn resume_to_token(token: &ResumeToken) -> Option<Token> {
    match bson::to_bson(token).ok()? {
        Bson::Document(d) => Token::from_resume_document(&d),
        _ => None,
    }
}

/// The open change stream over `comments`, read ahead by a [`Pump`].
///
/// On servers that send no post-batch resume token (the fake test server), the driver's own
/// resume token is empty once a batch is exhausted, so its automatic resume after a transient
/// error could restart "from now" and skip events. There the stream is closed whenever it runs
/// dry and reopened from the last event counterd itself saw.
///
/// Events are read as raw BSON, so that each one's encoded size, what it is charged against the
/// memory budget, is known without encoding it again. An event that does not fit a read's
/// limit is kept (`carried`) and returned first by the next read, unless it continues the
/// transaction of the event before it: a read ends only at a transaction's end, taking a
/// transaction larger than its limit whole (see `crate::core::txn`).
pub(super) struct MongoEvents {
    store: MongoStore,
    options: StreamOptions,
    /// The stream's reader, once opened (closed again when it runs dry or fails).
    pump: Option<Pump>,
    /// The last event taken from the pump (returned, or carried), the position to reopen
    /// after.
    last: Option<Token>,
    /// An event taken from the pump that did not fit the last read, with its charge.
    carried: Option<(Document, usize)>,
}

impl MongoEvents {
    /// Numbers a read that begins now, opening the stream (from the last event taken) if it is
    /// closed: every reply of a stream opened now is asked for after the read began.
    async fn begin_read(&mut self) -> StoreResult<u64> {
        if let Some(pump) = &mut self.pump {
            return Ok(pump.begin_read());
        }
        let mut options = self.options.clone();
        if let Some(last) = &self.last {
            options.start = StreamStart::After(last.clone());
        }
        let stream = self.store.watch(&options).await?;
        let pump = Pump::start(stream, positioned(&options), 1);
        self.pump = Some(pump);
        Ok(1)
    }
}

/// Whether a stream starts at a concrete position, so that it may be closed when it runs dry and
/// reopened from its last event: "now" again would skip what came in between.
fn positioned(options: &StreamOptions) -> bool {
    !matches!(options.start, StreamStart::Now)
}

/// A raw event decoded, with its charge against the memory budget.
///
/// Decoded by [`event_document`] rather than `RawDocumentBuf::to_document`, which is the
/// same document at about half the allocations: the stream's events are the worker's most
/// numerous documents, and decoding them was the largest single share of its CPU per event
/// (bench/RESULTS.md, 2026-12-06, speed targets).
fn decode(raw: RawDocumentBuf) -> StoreResult<(Document, usize)> {
    let cost = crate::core::cost::event_cost(raw.as_bytes().len());
    let doc = event_document(&raw).map_err(|e| StoreError::Malformed {
        what: "change event",
        id: "(undecodable)".into(),
        detail: e.to_string(),
    })?;
    Ok((doc, cost))
}

/// A change event as a document: every field, except an `updateDescription` without
/// `updatedFields` (the stream's `$project` gives every insert and delete, and every update
/// of the fake server, one of nulls; the event parser reads it as no description, exactly as
/// an absent one).
fn event_document(raw: &bson::RawDocument) -> bson::raw::Result<Document> {
    let mut doc = Document::new();
    for element in raw {
        let (key, value) = element?;
        if key == "updateDescription" && !describes_an_update(value) {
            continue;
        }
        doc.insert(key, bson_of(value)?);
    }
    Ok(doc)
}

/// Whether an `updateDescription` value holds `updatedFields` as a document.
fn describes_an_update(value: bson::RawBsonRef<'_>) -> bool {
    value
        .as_document()
        .and_then(|d| d.get_document("updatedFields").ok())
        .is_some()
}

/// A raw value as [`Bson`], nested documents and arrays converted in place: bson's own
/// conversion copies every nested document into a buffer of its own before converting it.
fn bson_of(value: bson::RawBsonRef<'_>) -> bson::raw::Result<Bson> {
    Ok(match value {
        bson::RawBsonRef::Document(d) => {
            let mut doc = Document::new();
            for element in d {
                let (key, value) = element?;
                doc.insert(key, bson_of(value)?);
            }
            Bson::Document(doc)
        }
        bson::RawBsonRef::Array(a) => Bson::Array(
            a.into_iter()
                .map(|v| v.and_then(bson_of))
                .collect::<bson::raw::Result<_>>()?,
        ),
        other => Bson::try_from(other)?,
    })
}

#[async_trait]
impl EventSource for MongoEvents {
    async fn read(&mut self, limit: ReadLimit, max_wait: Duration) -> StoreResult<RawBatch> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + max_wait);
        let resumed_after = match &self.options.start {
            StreamStart::After(t) => Some(t.clone()),
            _ => None,
        };
        let (mut events, mut costs) = (Vec::new(), Vec::new());
        let mut bytes = 0;
        // The transaction of the last event taken: the read does not end inside one.
        let mut last_txn: Option<TxnKey> = None;
        if let Some((doc, cost)) = self.carried.take() {
            if !limit.fits(0, 0, cost) {
                self.carried = Some((doc, cost));
                return Ok(RawBatch::default());
            }
            bytes += cost;
            last_txn = TxnKey::of_event(&doc);
            events.push(doc);
            costs.push(cost);
        }
        let mut last_taken = None;
        let mut carry = None;
        let mut post_batch = None;
        let mut this_read = self.begin_read().await?;
        loop {
            let within =
                events.len() < limit.events && (events.is_empty() || started.elapsed() < max_wait);
            // Beyond its limit a read still looks at the next event while the last one taken
            // belongs to a transaction: it ends only at the transaction's end (`crate::core::txn`).
            let looks_further = txn::must_look_further(last_txn.as_ref());
            if !within && !looks_further {
                break;
            }
            let pump = self.pump.as_mut().expect("open while a read goes on");
            // With events in hand (and not inside a transaction) the read waits for more only
            // until `max_wait`.
            let next = if events.is_empty() || looks_further {
                pump.next().await
            } else {
                match tokio::time::timeout_at(deadline, pump.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            match next {
                Some(Pumped::Event { raw, .. }) => {
                    let (doc, cost) = match decode(raw) {
                        Ok(decoded) => decoded,
                        Err(e) => {
                            self.pump = None;
                            return Err(e);
                        }
                    };
                    last_taken = doc
                        .get_document("_id")
                        .ok()
                        .and_then(Token::from_resume_document)
                        .or(last_taken);
                    let next_txn = TxnKey::of_event(&doc);
                    let fits = within && limit.fits(events.len(), bytes, cost);
                    if !txn::takes_next(fits, last_txn.as_ref(), next_txn.as_ref()) {
                        carry = Some((doc, cost));
                        break;
                    }
                    bytes += cost;
                    last_txn = next_txn;
                    events.push(doc);
                    costs.push(cost);
                }
                // Nothing more ready: a transaction's events become visible together, so one
                // the read was in is complete.
                Some(Pumped::Dry(dry)) => {
                    post_batch = dry.post_batch.as_ref().and_then(resume_to_token);
                    if dry.ended {
                        self.pump = None;
                    }
                    if !events.is_empty() || dry.asked_by >= this_read {
                        break;
                    }
                    // An empty reply asked for before this read began answers an earlier
                    // question: ask again.
                    this_read = self.begin_read().await?;
                }
                Some(Pumped::Failed(e)) => {
                    self.pump = None;
                    return Err(stream_err(e, resumed_after.as_ref()));
                }
                None => {
                    self.pump = None;
                    return Err(StoreError::Transient {
                        op: "read the change stream",
                        message: "the stream's reader stopped".into(),
                    });
                }
            }
        }
        self.carried = carry;
        if let Some(last) = last_taken {
            self.last = Some(last);
        }
        Ok(RawBatch {
            events,
            costs,
            // Only a read that took everything up to an empty reply stands at its token.
            post_batch_token: post_batch.filter(|_| self.carried.is_none()),
        })
    }
}

#[async_trait]
impl ChangeStreams for MongoStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let stream = self.watch(&options).await?;
        // Opened before any read: none of its replies answers one yet.
        let pump = Pump::start(stream, positioned(&options), 0);
        Ok(Box::new(MongoEvents {
            store: self.clone(),
            options,
            pump: Some(pump),
            last: None,
            carried: None,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        let reply = self
            .db
            .run_command(doc! {"isMaster": 1})
            .observed("read the server's position")
            .await?;
        Ok(position_from_reply(&reply, DateTime::now()))
    }

    async fn look_up(&self, comments: &[CommentId]) -> StoreResult<HashMap<String, Document>> {
        let op = "read the rows the stream does not carry";
        let mut out = HashMap::with_capacity(comments.len());
        for chunk in comments.chunks(LOOK_UP_CHUNK) {
            let ids: Vec<Bson> = chunk.iter().map(|c| c.value.clone()).collect();
            // From the primary, like the lookup it replaces: a secondary may lag behind the
            // events just read.
            let mut cursor = self
                .comments
                .find(doc! {"_id": {"$in": ids}})
                .projection(self.schema.row_projection())
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .observed(op)
                .await?;
            while let Some(row) = cursor.try_next().await.map_err(|e| map_err(op, e))? {
                if let Some(id) = row.get("_id") {
                    out.insert(CommentId::new(id.clone()).key, row);
                }
            }
        }
        Ok(out)
    }
}

/// Ids per batched row read (the ledger reads take 5 000 per `$in` too): one command for a
/// batch of any size the budget allows.
const LOOK_UP_CHUNK: usize = 5000;

impl MongoStore {
    /// The stream's stages: the caller's (a partition's `$match` reads the full documents),
    /// then the schema's `$project`, so that events carry only what counterd reads.
    fn stream_pipeline(&self, options: &StreamOptions) -> Vec<Document> {
        let mut pipeline = options.pipeline.clone();
        pipeline.push(self.schema.stream_projection());
        pipeline
    }

    /// Opens a change stream on `comments`. With pre-images it asks for them and for
    /// `updateLookup` (a pre-image's after-state is derived from the description, and where it
    /// expired the lookup is the row to take); without, update events come without the row,
    /// and the worker reads the rows it cannot derive in one batched read per batch
    /// ([`crate::core::lookup`]) instead of the server looking up every updated row.
    pub(super) async fn watch(
        &self,
        options: &StreamOptions,
    ) -> StoreResult<ChangeStream<RawDocumentBuf>> {
        let mut watch = self
            .comments
            .watch()
            .pipeline(self.stream_pipeline(options))
            .max_await_time(options.max_await)
            // A reply is decoded whole by the driver: MongoDB caps one at 16 MB, the fake
            // server does not (it answered a 100 000-event backlog in one reply). The budget
            // sets this many projected events aside (`REPLY_RESERVE`).
            .batch_size(crate::core::cost::EVENTS_PER_REPLY)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary));
        if options.pre_images {
            watch = watch
                .full_document(FullDocumentType::UpdateLookup)
                .full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable);
        }
        let mut resumed_after = None;
        match &options.start {
            StreamStart::After(token) => {
                watch = watch.resume_after(token_to_resume(token)?);
                resumed_after = Some(token.clone());
            }
            StreamStart::AtTime(t) => watch = watch.start_at_operation_time(*t),
            StreamStart::Now => {}
        }
        Ok(watch
            .observed_raw("open the change stream")
            .await
            .map_err(|e| stream_err(e, resumed_after.as_ref()))?
            .with_type::<RawDocumentBuf>())
    }
}

/// Where the server stands, from the reply to a command: with an `operationTime` (a cluster
/// time) both bounds are just after it; without one, the server's `localTime` (else
/// `local_now`) brackets it by whole seconds. The clock fallback assumes that the server stamps
/// events with its wall clock (true of the fake test server, and of MongoDB while its clock
/// does not step back) and, for `local_now`, that this process's clock agrees with the
/// server's.
pub fn position_from_reply(reply: &Document, local_now: DateTime) -> ServerNow {
    if let Ok(t) = reply.get_timestamp("operationTime") {
        let after = Timestamp {
            time: t.time,
            increment: t.increment.saturating_add(1),
        };
        return ServerNow {
            lower: after,
            upper: after,
        };
    }
    let now = reply
        .get_datetime("localTime")
        .copied()
        .unwrap_or(local_now);
    let secs = crate::core::time::secs(now).clamp(0, u32::MAX as i64 - 1) as u32;
    ServerNow {
        lower: Timestamp {
            time: secs,
            increment: 0,
        },
        upper: Timestamp {
            time: secs + 1,
            increment: 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(time: u32, increment: u32) -> Timestamp {
        Timestamp { time, increment }
    }

    #[test]
    fn events_decode_as_bson_decodes_them_but_for_an_empty_description() {
        let insert = doc! {
            "_id": {"_data": "8263A1"},
            "operationType": "insert",
            "clusterTime": ts(1_700_000_000, 3),
            "documentKey": {"_id": 7_i64},
            "fullDocument": {"_id": 7_i64, "post_id": "p", "meta": {"tags": ["a", {"b": 1}], "n": Bson::Null}},
            "lsid": {"id": bson::Binary {subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16]}},
            "txnNumber": 4_i64,
            "updateDescription": {"updatedFields": Bson::Null, "removedFields": Bson::Null},
        };
        let raw = RawDocumentBuf::from_document(&insert).unwrap();
        let mut expected = insert.clone();
        expected.remove("updateDescription");
        assert_eq!(event_document(&raw).unwrap(), expected);
        let (decoded, cost) = decode(raw.clone()).unwrap();
        assert_eq!(decoded, expected);
        assert_eq!(cost, crate::core::cost::event_cost(raw.as_bytes().len()));
        // An update's description is kept whole, as bson decodes it.
        let update = doc! {
            "_id": {"_data": "8263A2"},
            "operationType": "update",
            "documentKey": {"_id": 7_i64},
            "updateDescription": {"updatedFields": {"deleted_at": DateTime::from_millis(5)}, "removedFields": ["x"]},
        };
        let raw = RawDocumentBuf::from_document(&update).unwrap();
        assert_eq!(event_document(&raw).unwrap(), raw.to_document().unwrap());
        assert_eq!(event_document(&raw).unwrap(), update);
    }

    #[test]
    fn a_reply_with_an_operation_time_gives_exact_bounds() {
        let reply = doc! {"ok": 1, "operationTime": ts(1_700_000_000, 7)};
        let now = position_from_reply(&reply, DateTime::from_millis(0));
        assert_eq!(now.lower, ts(1_700_000_000, 8));
        assert_eq!(now.upper, ts(1_700_000_000, 8));
    }

    #[test]
    fn a_reply_without_one_brackets_the_server_clock_by_whole_seconds() {
        // The fake server: no operationTime; its isMaster reports localTime.
        let reply = doc! {"ismaster": true, "localTime": DateTime::from_millis(1_700_000_000_900)};
        let now = position_from_reply(&reply, DateTime::from_millis(0));
        assert_eq!(
            now.lower,
            ts(1_700_000_000, 0),
            "every event before it is older than the reading"
        );
        assert_eq!(
            now.upper,
            ts(1_700_000_001, 0),
            "every event the reading could have seen is before it"
        );
        // Nor localTime: this process's clock.
        let bare = position_from_reply(&doc! {"ok": 1}, DateTime::from_millis(1_700_000_005_001));
        assert_eq!(
            (bare.lower, bare.upper),
            (ts(1_700_000_005, 0), ts(1_700_000_006, 0))
        );
    }
}
