//! The change stream and where the server stands: what [`ChangeStreams`] opens and reads.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bson::{Document, Timestamp};
use serde::Serialize;

use super::error::StoreResult;
use crate::core::cost::ReadLimit;
use crate::core::event::{ChangeEvent, CommentId, EventError, Token};

/// The change stream and where the server stands.
#[async_trait]
pub trait ChangeStreams: Send + Sync {
    async fn open_stream(&self, options: StreamOptions) -> StoreResult<Box<dyn EventSource>>;

    /// Where the server stands now, in cluster time (see [`ServerNow`]).
    async fn read_position(&self) -> StoreResult<ServerNow>;

    /// The rows of `comments` as they are now, read with the schema's row projection, by
    /// comment key (a comment that is gone is absent): what `updateLookup` would have sent with
    /// their update events, read in one batched read (see [`crate::core::lookup`]).
    async fn look_up(&self, comments: &[CommentId]) -> StoreResult<HashMap<String, Document>>;
}

/// Where the server stands, as two cluster times: `upper` is after every write acknowledged
/// before the reading (a count taken before it can have seen nothing later), and every write
/// before `lower` was acknowledged before the reading (a change stream read issued after it
/// and found empty has delivered all of them). With the server's `operationTime` both are
/// exact; from a clock they are a second apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerNow {
    pub lower: Timestamp,
    pub upper: Timestamp,
}

/// How to position a new change stream.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamStart {
    After(Token),
    AtTime(Timestamp),
    Now,
}

/// Options for opening the change stream.
#[derive(Clone, Debug)]
pub struct StreamOptions {
    pub start: StreamStart,
    /// Ask for `fullDocumentBeforeChange` (servers with pre-images only).
    pub pre_images: bool,
    /// Extra `$match` stages (partitioning).
    pub pipeline: Vec<Document>,
    /// How long the server may hold an empty getMore.
    pub max_await: Duration,
}

/// Events read in one go, plus where the stream now stands.
#[derive(Clone, Debug, Default)]
pub struct RawBatch {
    /// The events, in the stream's order, each parsed where the source read it (the MongoDB
    /// store's straight from the raw BSON its server sent), or why it could not be: the worker
    /// counts, logs and skips such an event.
    pub events: Vec<Result<ChangeEvent, EventError>>,
    /// What each event is charged against the memory budget
    /// ([`crate::core::cost::event_cost`] of its encoded size), in the order of `events`.
    pub costs: Vec<usize>,
    /// The post-batch resume token, where the server sends one (checkpoint it on idle streams).
    pub post_batch_token: Option<Token>,
}

impl RawBatch {
    /// The sum of the events' charges.
    pub fn bytes(&self) -> usize {
        self.costs.iter().sum()
    }
}

/// An open change stream.
#[async_trait]
pub trait EventSource: Send {
    /// Reads events that are ready, within `limit` (by count and by their charge against the
    /// memory budget), returning early when none are ready (an empty batch) or once
    /// `max_wait` has passed with some events in hand. An event that does not fit is the
    /// first of the next read.
    async fn read(&mut self, limit: ReadLimit, max_wait: Duration) -> StoreResult<RawBatch>;

    /// Reads up to `max` events, limited by count only (tools and tests).
    async fn next_batch(&mut self, max: usize, max_wait: Duration) -> StoreResult<RawBatch> {
        self.read(ReadLimit::events(max), max_wait).await
    }
}

/// What the server can do (detected once).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerAbilities {
    pub version: String,
    pub wire_version: i32,
    /// The server answers `hello`, as real servers do (the fake answers `isMaster` only); they
    /// also send update descriptions and post-batch tokens.
    pub hello: bool,
    pub sessions: bool,
    pub pre_images: bool,
    pub snapshot_reads: bool,
}
