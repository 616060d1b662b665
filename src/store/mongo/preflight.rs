//! The replies `counterd doctor` (and `run`'s start-up) judge: the one place its I/O happens.
//! Every command is read-only; each failure is kept as text for the check that reads it.

use super::*;
use crate::doctor::{Replies, Reply, RoundTrip};

impl MongoStore {
    /// Asks the server everything [`crate::doctor::check_all`] reads; `sample` rows of the
    /// comments collection, newest `_id` first.
    pub async fn preflight(&self, sample: usize) -> Replies {
        let text = |e: DriverError| reply_error(&e);
        let command = |c: Document| async { self.db.run_command(c).await.map_err(text) };
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
            .map_err(text);
        let connection_status: Reply =
            command(doc! {"connectionStatus": 1, "showPrivileges": true}).await;
        let indexes = self.index_specs().await;
        let collection = self.comments_entry().await;
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

    /// The comments collection's indexes, each as `{key, name, partialFilterExpression}`.
    async fn index_specs(&self) -> Result<Vec<Document>, String> {
        let text = |e: DriverError| reply_error(&e);
        match self.comments.list_indexes().await {
            Ok(cursor) => cursor
                .try_collect::<Vec<_>>()
                .await
                .map(|models| {
                    models
                        .into_iter()
                        .map(|m| {
                            let mut spec = doc! {"key": m.keys};
                            if let Some(o) = m.options {
                                if let Some(name) = o.name {
                                    spec.insert("name", name);
                                }
                                if let Some(p) = o.partial_filter_expression {
                                    spec.insert("partialFilterExpression", p);
                                }
                            }
                            spec
                        })
                        .collect()
                })
                .map_err(text),
            Err(e) => Err(text(e)),
        }
    }

    /// The newest `sample` rows of the comments collection (by `_id`).
    async fn newest_rows(&self, sample: usize) -> Result<Vec<Document>, String> {
        let text = |e: DriverError| reply_error(&e);
        match self
            .comments
            .find(doc! {})
            .sort(doc! {"_id": -1})
            .limit(sample as i64)
            .await
        {
            Ok(cursor) => cursor.try_collect().await.map_err(text),
            Err(e) => Err(text(e)),
        }
    }

    /// Whether the source collection (`comments`, or a `[[sources]]` entry's) exists now.
    pub async fn comments_exist(&self) -> StoreResult<bool> {
        let reply = self
            .db
            .run_command(doc! {
                "listCollections": 1,
                "filter": {"name": self.comments.name()},
                "nameOnly": true,
            })
            .observed("list the source collection")
            .await?;
        // By name: a server may answer with more than the filter asks (the test server lists
        // every collection).
        let name = self.comments.name();
        Ok(reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .is_some_and(|batch| {
                batch
                    .iter()
                    .filter_map(Bson::as_document)
                    .any(|entry| entry.get_str("name") == Ok(name))
            }))
    }

    /// The comments collection's `listCollections` entry (`None`: it does not exist).
    async fn comments_entry(&self) -> Result<Option<Document>, String> {
        let reply = self
            .db
            .run_command(doc! {
                "listCollections": 1,
                "filter": {"name": self.comments.name()},
            })
            .await
            .map_err(|e| reply_error(&e))?;
        Ok(reply
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_array("firstBatch").ok())
            .and_then(|b| b.first())
            .and_then(Bson::as_document)
            .cloned())
    }
}

/// A refused command as the server put it (`CommandNotFound (59): no such command: ...`),
/// anything else as the store describes driver errors.
fn reply_error(e: &DriverError) -> String {
    match e.kind.as_ref() {
        ErrorKind::Command(c) => format!("{} ({}): {}", c.code_name, c.code, c.message),
        _ => short(e),
    }
}
