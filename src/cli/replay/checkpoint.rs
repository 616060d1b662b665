//! The move itself: fence the stream, re-apply a batch left in flight, move the checkpoint,
//! record the deployment.

use std::sync::Arc;

use crate::cli::exit::CheckFailed;
use crate::config::Settings;
use crate::core::batch::PendingBatch;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;
use crate::store::{Fence, Position};
use crate::worker::{Worker, WorkerStatus};

/// Fences the stream at the lease's epoch, re-applies a batch left in flight, moves the
/// checkpoint and records the deployment. Returns the batch re-applied, if any.
pub(super) async fn move_stream(
    settings: &Settings,
    store: &Arc<MongoStore>,
    fence: &Fence,
    owner: &str,
    position: &Position,
) -> anyhow::Result<Option<PendingBatch>> {
    let context = |what: &str| format!("replay of stream `{}`: {what}", fence.stream);
    // From here the previous holder cannot write the checkpoint: its writes carry an older epoch.
    store
        .adopt_checkpoint(fence)
        .await
        .map_err(|e| anyhow::Error::from(e).context(context("fence the checkpoint")))?;
    let worker = Worker::new(
        store.clone(),
        crate::worker::WorkerSettings {
            stream: fence.stream.clone(),
            ..crate::worker::WorkerSettings::from(settings)
        },
        Arc::new(WorkerStatus::default()),
    );
    let resolved = worker.resolve_pending(fence).await.map_err(|e| {
        anyhow::Error::from(e).context(context("re-apply the batch left in flight"))
    })?;
    // A full lease for the move itself, and proof that nobody took the stream meanwhile.
    if !crate::cli::still_ours(store, settings, fence, owner).await? {
        anyhow::bail!(CheckFailed(format!(
            "{}: another worker took the lease while the batch left in flight was re-applied; nothing was moved, run replay again",
            context("lost the lease")
        )));
    }
    store
        .move_checkpoint(&fence.stream, position)
        .await
        .map_err(|e| anyhow::Error::from(e).context(context("move the checkpoint")))?;
    let here = store.deployment().await?;
    if !here.is_unknown() {
        store
            .record_deployment(fence, &here)
            .await
            .map_err(|e| anyhow::Error::from(e).context(context("record the deployment")))?;
    }
    Ok(resolved)
}
