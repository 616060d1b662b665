//! The replies `counterd doctor` (and `run`'s start-up) judge: the one place its I/O happens.
//! Every command is read-only; each failure is kept as text for the check that reads it.

use super::*;
use crate::doctor::{Replies, Reply, RoundTrip};

impl MongoStore {
    /// Asks the server everything [`crate::doctor::check_all`] reads; `sample` rows of the
    /// comments collection, newest `_id` first.
    pub async fn preflight(&self, sample: usize) -> Replies {
        let command = |c: Document| async { self.db.run_command(c).await.map_err(reply_error) };
        let build_info: Reply = command(doc! {"buildInfo": 1}).await;
        let sent_at_ms = DateTime::now().timestamp_millis();
        let is_master: Reply = command(doc! {"isMaster": 1}).await;
        let received_at_ms = DateTime::now().timestamp_millis();
        // Opening is the test; the stream is dropped (and its cursor killed) at once.
        let change_stream = self
            .comments
            .watch()
            .max_await_time(Duration::from_millis(1))
            .await
            .map(drop)
            .map_err(reply_error);
        let connection_status: Reply =
            command(doc! {"connectionStatus": 1, "showPrivileges": true}).await;
        let indexes = self.index_specs().await;
        let collection = self.comments_entry().await.map_err(reply_error);
        let snapshot_reads = self.snapshot_reads().await;
        let sample = self.newest_rows(sample).await;
        Replies {
            build_info,
            is_master,
            round_trip: RoundTrip {
                sent_at_ms,
                received_at_ms,
            },
            change_stream,
            connection_status,
            indexes,
            collection,
            snapshot_reads,
            sample,
        }
    }

    /// The comments collection's indexes, each as the server describes it (`key`, `name`,
    /// `partialFilterExpression`, ...), as the doctor reads them.
    async fn index_specs(&self) -> Result<Vec<Document>, String> {
        let cursor = self.comments.list_indexes().await.map_err(reply_error)?;
        let specs = cursor.with_type::<Document>().try_collect().await;
        specs.map_err(reply_error)
    }

    /// The newest `sample` rows of the comments collection (by `_id`).
    async fn newest_rows(&self, sample: usize) -> Result<Vec<Document>, String> {
        let newest = self.comments.find(doc! {}).sort(doc! {"_id": -1});
        let cursor = newest.limit(sample as i64).await.map_err(reply_error)?;
        cursor.try_collect().await.map_err(reply_error)
    }

    /// Whether the source collection (`comments`, or a `[[sources]]` entry's) exists now.
    pub async fn comments_exist(&self) -> StoreResult<bool> {
        let entry = self.comments_entry().observed("list the source collection");
        Ok(entry.await?.is_some())
    }

    /// The comments collection's `listCollections` entry (`None`: it does not exist), found by
    /// name: a server may answer with more than the filter asks (the test server lists every
    /// collection).
    pub(super) async fn comments_entry(&self) -> Result<Option<Document>, DriverError> {
        let name = self.comments.name();
        let command = doc! {"listCollections": 1, "filter": {"name": name}};
        let reply = self.db.run_command(command).await?;
        let mut entries = first_batch(&reply);
        Ok(entries
            .find(|entry| entry.get_str("name") == Ok(name))
            .cloned())
    }
}

/// A refused command as the server put it (`CommandNotFound (59): no such command: ...`),
/// anything else as the store describes driver errors.
fn reply_error(e: DriverError) -> String {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => format!("{} ({}): {}", c.code_name, c.code, c.message),
        _ => sentence(&e),
    }
}
