//! The change stream: resume tokens, the event source over `comments`, and where the server
//! stands in cluster time.

use super::*;

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

/// The open change stream over `comments`.
///
/// On servers that send no post-batch resume token (the fake test server), the driver's own
/// resume token is empty once a batch is exhausted, so its automatic resume after a transient
/// error could restart "from now" and skip events. There the stream is dropped whenever it runs
/// dry and reopened from the last event counterd itself saw.
pub(super) struct MongoEvents {
    store: MongoStore,
    options: StreamOptions,
    stream: Option<ChangeStream<Document>>,
    /// The last event returned, the position to reopen after.
    last: Option<Token>,
}

impl MongoEvents {
    async fn open(&mut self) -> StoreResult<&mut ChangeStream<Document>> {
        if self.stream.is_none() {
            let mut options = self.options.clone();
            if let Some(last) = &self.last {
                options.start = StreamStart::After(last.clone());
            }
            self.stream = Some(self.store.watch(&options).await?);
        }
        Ok(self.stream.as_mut().expect("opened above"))
    }
}

#[async_trait]
impl EventSource for MongoEvents {
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch> {
        let started = Instant::now();
        let resumed_after = match &self.options.start {
            StreamStart::After(t) => Some(t.clone()),
            _ => None,
        };
        let mut events = Vec::new();
        let stream = self.open().await?;
        let mut exhausted = false;
        while events.len() < max && (events.is_empty() || started.elapsed() < max_wait) {
            match stream.next_if_any().await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => {
                    exhausted = true;
                    break;
                }
                Err(e) => {
                    self.stream = None;
                    return Err(stream_err(e, resumed_after.as_ref()));
                }
            }
        }
        let post_batch_token = stream.resume_token().as_ref().and_then(resume_to_token);
        if let Some(last) = events
            .last()
            .and_then(|e| e.get_document("_id").ok())
            .and_then(Token::from_resume_document)
        {
            self.last = Some(last);
        }
        // Reopen only from a concrete position: "now" again would skip what came in between.
        let positioned = self.last.is_some() || !matches!(self.options.start, StreamStart::Now);
        if exhausted && post_batch_token.is_none() && positioned {
            self.stream = None;
        }
        Ok(RawBatch {
            events,
            post_batch_token,
        })
    }
}

#[async_trait]
impl ChangeStreams for MongoStore {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>> {
        let stream = self.watch(&options).await?;
        Ok(Box::new(MongoEvents {
            store: self.clone(),
            options,
            stream: Some(stream),
            last: None,
        }))
    }

    async fn read_position(&self) -> StoreResult<ServerNow> {
        let reply = self
            .db
            .run_command(doc! {"isMaster": 1})
            .await
            .map_err(|e| map_err("read the server's position", e))?;
        Ok(position_from_reply(&reply, DateTime::now()))
    }
}

/// Events one server reply may hold. MongoDB caps a reply at 16 MB anyway; the fake test server
/// does not, and answered a 100 000-event backlog in one reply that the driver buffers whole.
/// At this size a reply stays a few megabytes and the worker's larger batches take a few
/// replies (one round trip each, overlapped with writing the previous batch while behind).
const EVENTS_PER_REPLY: u32 = 1000;

impl MongoStore {
    /// Opens a change stream on `comments` with `updateLookup` (and pre-images when asked).
    pub(super) async fn watch(
        &self,
        options: &StreamOptions,
    ) -> StoreResult<ChangeStream<Document>> {
        let mut watch = self
            .comments
            .watch()
            .pipeline(options.pipeline.clone())
            .full_document(FullDocumentType::UpdateLookup)
            .max_await_time(options.max_await)
            .batch_size(EVENTS_PER_REPLY)
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary));
        if options.pre_images {
            watch = watch.full_document_before_change(FullDocumentBeforeChangeType::WhenAvailable);
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
            .await
            .map_err(|e| stream_err(e, resumed_after.as_ref()))?
            .with_type::<Document>())
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
    let secs = crate::time::secs(now).clamp(0, u32::MAX as i64 - 1) as u32;
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
