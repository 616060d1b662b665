//! The change stream: resume tokens, the event source over `comments`, and where the server
//! stands in cluster time.

use super::pump::{Pump, Pumped};
use super::*;
use crate::core::cost::ReadLimit;
use crate::core::event::{ChangeEvent, EventError, EventParts};
use crate::core::txn::{self, TxnKey};
use mongodb::bson::{RawBsonRef, RawDocument, RawDocumentBuf};

pub(super) fn token_to_resume(token: &Token) -> StoreResult<ResumeToken> {
    bson::from_document(doc! {"_data": token.as_str()}).map_err(|e| StoreError::Malformed {
        what: "resume token",
        id: token.to_string(),
        detail: e.to_string(),
    })
}

pub(super) fn resume_to_token(token: &ResumeToken) -> Option<Token> {
    Token::from_resume_document(&bson::to_document(token).ok()?)
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
    carried: Option<Decoded>,
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

    /// [`EventSource::read`], but for closing the stream when it fails.
    async fn take(&mut self, limit: ReadLimit, max_wait: Duration) -> StoreResult<RawBatch> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started + max_wait);
        let mut taken = Taken::default();
        if let Some(carried) = self.carried.take() {
            if !limit.fits(0, 0, carried.cost) {
                self.carried = Some(carried);
                return Ok(RawBatch::default());
            }
            taken.push(carried);
        }
        let mut carry = None;
        let mut post_batch = None;
        let mut this_read = self.begin_read().await?;
        loop {
            let within = taken.events.len() < limit.events
                && (taken.events.is_empty() || started.elapsed() < max_wait);
            // Beyond its limit a read still looks at the next event while the last one taken
            // belongs to a transaction: it ends only at the transaction's end (`crate::core::txn`).
            let looks_further = txn::must_look_further(taken.last_txn.as_ref());
            if !within && !looks_further {
                break;
            }
            let pump = self.pump.as_mut().expect("open while a read goes on");
            // With events in hand (and not inside a transaction) the read waits for more only
            // until `max_wait`.
            let next = if taken.events.is_empty() || looks_further {
                pump.next().await
            } else {
                match tokio::time::timeout_at(deadline, pump.next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            match next {
                Some(Pumped::Event { raw, .. }) => {
                    let decoded = decode(&raw)?;
                    let fits = within && limit.fits(taken.events.len(), taken.bytes, decoded.cost);
                    if !txn::takes_next(fits, taken.last_txn.as_ref(), decoded.txn.as_ref()) {
                        carry = Some(decoded);
                        break;
                    }
                    taken.push(decoded);
                }
                // Nothing more ready: a transaction's events become visible together, so one
                // the read was in is complete.
                Some(Pumped::Dry(dry)) => {
                    post_batch = dry.post_batch.as_ref().and_then(resume_to_token);
                    if dry.ended {
                        self.pump = None;
                    }
                    if !taken.events.is_empty() || dry.asked_by >= this_read {
                        break;
                    }
                    // An empty reply asked for before this read began answers an earlier
                    // question: ask again.
                    this_read = self.begin_read().await?;
                }
                Some(Pumped::Failed(e)) => return Err(stream_err(e, &self.options.start)),
                None => {
                    return Err(StoreError::Transient {
                        op: "read the change stream",
                        message: "the stream's reader stopped".into(),
                    })
                }
            }
        }
        // The position to reopen after: the last event taken (carried or returned) that
        // names one.
        let last = carry.as_ref().and_then(|c| c.token.clone());
        if let Some(last) = last.or(taken.last_token) {
            self.last = Some(last);
        }
        self.carried = carry;
        Ok(RawBatch {
            events: taken.events,
            costs: taken.costs,
            // Only a read that took everything up to an empty reply stands at its token.
            post_batch_token: post_batch.filter(|_| self.carried.is_none()),
        })
    }
}

/// Whether a stream starts at a concrete position, so that it may be closed when it runs dry and
/// reopened from its last event: "now" again would skip what came in between.
fn positioned(options: &StreamOptions) -> bool {
    !matches!(options.start, StreamStart::Now)
}

/// An event taken from the pump, parsed, with its charge against the memory budget and what
/// the reader needs of it whether or not it could be parsed: its token (the position to reopen
/// after) and its transaction.
struct Decoded {
    event: Result<ChangeEvent, EventError>,
    cost: usize,
    token: Option<Token>,
    txn: Option<TxnKey>,
}

/// A raw event parsed straight into a [`ChangeEvent`], with its charge against the memory
/// budget. A value that is not valid BSON fails the read; a well-formed event that is no
/// change event counterd can read (no token, no operation) is returned as such, for the
/// worker to skip.
///
/// Straight from the raw BSON: no document of the whole event is built, only of its rows and
/// its update description. The stream's events are the worker's most numerous values, and
/// decoding them (into a document, then taken apart) was the largest single share of its CPU
/// per event (bench/RESULTS.md, 2026-12-06).
fn decode(raw: &RawDocument) -> StoreResult<Decoded> {
    let cost = crate::core::cost::event_cost(raw.as_bytes().len());
    let parts = event_parts(raw).map_err(|e| StoreError::Malformed {
        what: "change event",
        id: "(undecodable)".into(),
        detail: e.to_string(),
    })?;
    let (token, txn) = (parts.token.clone(), parts.txn.clone());
    Ok(Decoded {
        event: ChangeEvent::from_parts(parts),
        cost,
        token,
        txn,
    })
}

/// What counterd reads of a change event, read from its raw BSON (as
/// [`ChangeEvent::from_document`] reads a document): the token, the operation, the cluster
/// time, the transaction, `documentKey`, the rows, and an `updateDescription` that holds
/// `updatedFields` (the stream's `$project` gives every insert and delete, and every update of
/// the fake server, one of nulls, which says nothing).
fn event_parts(raw: &RawDocument) -> bson::raw::Result<EventParts<'_>> {
    let mut parts = EventParts::default();
    let (mut lsid, mut number) = (None, None);
    for element in raw {
        let (key, value) = element?;
        match key {
            "_id" => {
                parts.token = value
                    .as_document()
                    .and_then(|d| d.get_str("_data").ok())
                    .map(|data| Token(data.to_owned()))
            }
            "operationType" => parts.operation_type = value.as_str(),
            "clusterTime" => parts.cluster_time = value.as_timestamp(),
            "documentKey" => parts.document_key = document_of(value)?,
            "fullDocument" => parts.full_document = document_of(value)?,
            "fullDocumentBeforeChange" => parts.pre_image = document_of(value)?,
            "updateDescription" if describes_an_update(value) => {
                parts.update_description = document_of(value)?
            }
            "updateDescription" => parts.update_description = None,
            "lsid" => lsid = value.as_document(),
            "txnNumber" => number = value.as_i64().or(value.as_i32().map(i64::from)),
            _ => {}
        }
    }
    // The session as its BSON bytes, as `TxnKey::of_event` encodes it.
    parts.txn = lsid.zip(number).map(|(lsid, number)| TxnKey {
        session: lsid.as_bytes().to_vec(),
        number,
    });
    Ok(parts)
}

/// Whether an `updateDescription` value holds `updatedFields` as a document.
fn describes_an_update(value: RawBsonRef<'_>) -> bool {
    value
        .as_document()
        .and_then(|d| d.get_document("updatedFields").ok())
        .is_some()
}

/// A raw value as a [`Document`], where it is one (`None` otherwise).
fn document_of(value: RawBsonRef<'_>) -> bson::raw::Result<Option<Document>> {
    match value {
        RawBsonRef::Document(d) => Ok(Some(document(d)?)),
        _ => Ok(None),
    }
}

/// A raw document as a [`Document`], nested documents and arrays converted in place: bson's
/// own conversion copies every nested document into a buffer of its own before converting it.
fn document(raw: &RawDocument) -> bson::raw::Result<Document> {
    let mut doc = Document::new();
    for element in raw {
        let (key, value) = element?;
        doc.insert(key, bson_of(value)?);
    }
    Ok(doc)
}

/// A raw value as [`Bson`] (see [`document`]).
fn bson_of(value: RawBsonRef<'_>) -> bson::raw::Result<Bson> {
    Ok(match value {
        RawBsonRef::Document(d) => Bson::Document(document(d)?),
        RawBsonRef::Array(a) => Bson::Array(
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
        // A failed read closes the stream: the next opens it again after the last event taken.
        let read = self.take(limit, max_wait).await;
        read.inspect_err(|_| self.pump = None)
    }
}

/// What a read has taken so far.
#[derive(Default)]
struct Taken {
    events: Vec<Result<ChangeEvent, EventError>>,
    costs: Vec<usize>,
    /// The token of the last event taken that names one.
    last_token: Option<Token>,
    bytes: usize,
    /// The transaction of the last event taken: the read does not end inside one.
    last_txn: Option<TxnKey>,
}

impl Taken {
    fn push(&mut self, decoded: Decoded) {
        self.last_txn = decoded.txn;
        if decoded.token.is_some() {
            self.last_token = decoded.token;
        }
        self.bytes += decoded.cost;
        self.costs.push(decoded.cost);
        self.events.push(decoded.event);
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
        // From the primary, like the lookup it replaces: a secondary may lag behind the events
        // just read.
        let primary = SelectionCriteria::ReadPreference(ReadPreference::Primary);
        let projection = self.schema.row_projection();
        let find = |ids| {
            let found = self.comments.find(ids).projection(projection.clone());
            found.selection_criteria(primary.clone())
        };
        self.by_ids(op, comments, find, Some).await
    }
}

impl MongoStore {
    /// Opens a change stream on `comments`. With pre-images it asks for them and for
    /// `updateLookup` (a pre-image's after-state is derived from the description, and where it
    /// expired the lookup is the row to take); without, update events come without the row,
    /// and the worker reads the rows it cannot derive in one batched read per batch
    /// ([`crate::core::lookup`]) instead of the server looking up every updated row.
    pub(super) async fn watch(
        &self,
        options: &StreamOptions,
    ) -> StoreResult<ChangeStream<RawDocumentBuf>> {
        // The stream's stages: the caller's (a partition's `$match` reads the full documents),
        // then the schema's `$project`, so that events carry only what counterd reads.
        let mut pipeline = options.pipeline.clone();
        pipeline.push(self.schema.stream_projection());
        let mut watch = self
            .comments
            .watch()
            .pipeline(pipeline)
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
        match &options.start {
            StreamStart::After(token) => watch = watch.resume_after(token_to_resume(token)?),
            StreamStart::AtTime(t) => watch = watch.start_at_operation_time(*t),
            StreamStart::Now => {}
        }
        Ok(watch
            .observed_raw("open the change stream")
            .await
            .map_err(|e| stream_err(e, &options.start))?
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

    /// The raw parse of `doc`'s encoding (whose charge is checked).
    fn raw_parse(doc: &Document) -> Result<ChangeEvent, EventError> {
        let raw = RawDocumentBuf::from_document(doc).unwrap();
        let decoded = decode(&raw).unwrap();
        assert_eq!(
            decoded.cost,
            crate::core::cost::event_cost(raw.as_bytes().len())
        );
        decoded.event
    }

    #[test]
    fn events_parse_from_raw_bson_as_from_a_document() {
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
        let update = doc! {
            "_id": {"_data": "8263A2"},
            "operationType": "update",
            "documentKey": {"_id": 7_i64},
            "updateDescription": {"updatedFields": {"deleted_at": DateTime::from_millis(5)}, "removedFields": ["x"]},
            "txnNumber": 3_i32,
        };
        // The fake server's update: the spec in `documentKey`, the description's nulls.
        let fake_update = doc! {
            "_id": {"_data": "8263A3"},
            "operationType": "update",
            "documentKey": {"_id": 8_i64, "$set": {"deleted_at": DateTime::from_millis(6)}, "$unset": {"x": ""}},
            "updateDescription": {"updatedFields": Bson::Null, "removedFields": Bson::Null},
            "lsid": "not a session",
            "txnNumber": 5_i64,
        };
        let unreadable = [
            doc! {"operationType": "insert", "documentKey": {"_id": 1}},
            doc! {"_id": {"_data": 5}, "operationType": "insert"},
            doc! {"_id": {"_data": "8263A4"}, "operationType": 1},
            doc! {"_id": {"_data": "8263A5"}, "operationType": "delete", "documentKey": 3},
        ];
        for event in [insert, update, fake_update].iter().chain(&unreadable) {
            assert_eq!(
                raw_parse(event),
                ChangeEvent::from_document(event.clone()),
                "{event}"
            );
        }
        let txn = raw_parse(&doc! {"_id": {"_data": "1"}, "operationType": "drop", "lsid": {"id": 1}, "txnNumber": 3_i32})
            .unwrap()
            .txn;
        assert_eq!(txn.map(|t| t.number), Some(3));
    }

    #[test]
    fn every_fixture_event_parses_from_raw_bson_as_from_a_document() {
        fn walk(dir: &std::path::Path, seen: &mut usize) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, seen);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let json: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
                let Ok(Bson::Document(doc)) = Bson::try_from(json) else {
                    continue;
                };
                let whole = ChangeEvent::from_document(doc.clone());
                assert_eq!(raw_parse(&doc), whole, "{}", path.display());
                *seen += 1;
            }
        }
        let mut seen = 0;
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/events"),
            &mut seen,
        );
        assert!(seen >= 30, "only {seen} fixture events");
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
