//! Every driver call of the store is observed here: its latency goes into
//! `counterd_mongodb_operation_duration_seconds` by counterd's operation and outcome, and its
//! error is sorted into a [`StoreError`] (see `errors`).
//!
//! Why not the driver's command monitor (`command_event_handler`): the driver turns every
//! command and every reply into a `Document` tree before it calls the handler, whatever the
//! handler reads. During a catch-up the replies are the change stream's batches and the
//! commands are the bulk writes, so that copy was about half of counterd's CPU per event
//! (measured with `perf` on the benchmark's worker phase). Timing the store's own calls costs
//! a clock reading each and names the operation in counterd's words.
//!
//! Advancing a cursor (`try_next`, `try_collect`, the change stream's `next_if_any`) is not
//! observed: most advances return a buffered document without a round trip, so a sample per
//! advance would say nothing about the server. The command that opens a cursor is. The
//! stream's health is its lag (`counterd_stream_lag_seconds`).

use std::future::IntoFuture;
use std::time::Instant;

use futures::{TryStream, TryStreamExt};
use mongodb::error::Error as DriverError;

use super::errors::{error_code, map_err, DUPLICATE_KEY};
use crate::store::StoreResult;
use crate::telemetry as m;

/// A driver call (an action or a future) that can be awaited observed.
pub(crate) trait Observe<T>: IntoFuture<Output = Result<T, DriverError>> + Sized {
    /// Awaits the call, records its latency under `op` and maps its error.
    async fn observed(self, op: &'static str) -> StoreResult<T> {
        self.observed_raw(op).await.map_err(|e| map_err(op, e))
    }

    /// Like [`Observe::observed`] for a call that opens a cursor: reads the cursor to its end
    /// (the advances unobserved, see above), a failed advance mapped under `op` too.
    async fn collected<D>(self, op: &'static str) -> StoreResult<Vec<D>>
    where
        T: TryStream<Ok = D, Error = DriverError>,
    {
        let cursor = self.observed(op).await?;
        cursor.try_collect().await.map_err(|e| map_err(op, e))
    }

    /// Like [`Observe::observed`] for a guarded insert or upsert: a duplicate key (its guard
    /// failed on an existing document) is `Ok(None)`, for the caller to say what that means.
    async fn unless_duplicate(self, op: &'static str) -> StoreResult<Option<T>> {
        match self.observed_raw(op).await {
            Ok(reply) => Ok(Some(reply)),
            Err(e) if error_code(&e) == Some(DUPLICATE_KEY) => Ok(None),
            Err(e) => Err(map_err(op, e)),
        }
    }

    /// Like [`Observe::observed`], but hands the driver's error back unmapped (callers that
    /// read the error's code themselves).
    async fn observed_raw(self, op: &'static str) -> Result<T, DriverError> {
        let started = Instant::now();
        let result = self.into_future().await;
        let outcome = if result.is_ok() { "ok" } else { "error" };
        metrics::histogram!(m::MONGODB_OPERATION_DURATION, "op" => op, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        result
    }
}

impl<T, F: IntoFuture<Output = Result<T, DriverError>>> Observe<T> for F {}
