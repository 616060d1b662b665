//! Each component's settings from the configuration. The configuration's defaults
//! ([`Settings::default`]) are the only defaults: every component's `Default` is its mapping of
//! them, so a default changed in `config.rs` reaches the worker, the reconciler and the tests
//! alike.
//!
//! What only the running process knows (the stream or partition, whether the server keeps
//! pre-images, the lease owner) is filled in where it is known, in `daemon::streams`.

use std::time::Duration;

use crate::config::Settings;
use crate::core::schema::Schema;
use crate::http::ReadyBounds;
use crate::reconcile::ReconcileSettings;
use crate::recount::CatchUp;
use crate::snapshot::SnapshotSettings;
use crate::store::mongo::{Collections, ConnectOptions};
use crate::worker::WorkerSettings;

/// Posts a row-level recount reads before one shared wait for the worker.
const RECOUNT_GROUP_SIZE: usize = 500;

/// The configured stream, every post, and no pre-images: whether the server keeps them is
/// known only once connected (see `daemon::streams`).
impl From<&Settings> for WorkerSettings {
    fn from(settings: &Settings) -> Self {
        WorkerSettings {
            stream: settings.stream_name.clone(),
            batch_size: settings.batch_size,
            max_batch_size: settings.max_batch_size,
            max_batch_wait: settings.max_batch_wait,
            idle_interval: settings.idle_interval,
            max_await: settings.max_await,
            attribution: settings.attribution,
            bucket_width_secs: settings.bucket_width_secs(),
            on_history_lost: settings.on_history_lost,
            start_at: settings.start_at_timestamp(),
            pre_images: false,
            pipeline: Vec::new(),
            retry_min_delay: settings.retry_min_delay,
            retry_max_delay: settings.retry_max_delay,
            operation_timeout: settings.operation_timeout,
            partition: None,
            schema: settings.schema(),
            snapshot: settings.into(),
            budget: crate::budget::Budget::new(settings.memory_budget_bytes()),
        }
    }
}

impl From<&Settings> for SnapshotSettings {
    fn from(settings: &Settings) -> Self {
        SnapshotSettings {
            initial: settings.initial_snapshot,
            chunk_rows: settings.snapshot_chunk_rows,
            rows_per_second: settings.snapshot_rows_per_second,
        }
    }
}

/// The configured stream, every post, the counter of `group_field` (see
/// [`ReconcileSettings::for_counter`] for the others).
impl From<&Settings> for ReconcileSettings {
    fn from(settings: &Settings) -> Self {
        ReconcileSettings {
            stream: settings.stream_name.clone(),
            // The first definition, `counter_name`.
            counter: crate::core::key::CounterIx::default(),
            counter_name: settings.counter_name.clone(),
            bucket_width_secs: settings.bucket_width_secs(),
            settle_secs: settings.settle_time.as_secs() as i64,
            max_posts: settings.reconcile_max_posts,
            counts_per_second: settings.reconcile_counts_per_second,
            fold_retries: settings.fold_retries,
            sweep_window: settings.sweep_window,
            partition: None,
            group_size: RECOUNT_GROUP_SIZE,
            catch_up: settings.into(),
            recount_rows: crate::core::cost::recount_rows(
                settings.memory_budget_bytes(),
                settings.streams_per_process(),
            ),
            background_pass: (!settings.background_sweep_pass.is_zero())
                .then_some(settings.background_sweep_pass),
            interval: settings.reconcile_interval,
        }
    }
}

/// Waits up to `catch_up_timeout`, looking about as often as the worker reads when idle.
impl From<&Settings> for CatchUp {
    fn from(settings: &Settings) -> Self {
        CatchUp {
            timeout: settings.catch_up_timeout,
            poll: settings
                .idle_interval
                .clamp(Duration::from_millis(10), Duration::from_secs(1)),
            probe_without_worker: true,
        }
    }
}

impl From<&Settings> for ReadyBounds {
    fn from(settings: &Settings) -> Self {
        ReadyBounds {
            max_lag: settings.ready_max_lag,
            max_stall: settings.ready_max_stall,
        }
    }
}

impl From<&Settings> for ConnectOptions {
    fn from(settings: &Settings) -> Self {
        ConnectOptions {
            uri: settings.mongodb_uri.clone(),
            database: settings.database.clone(),
            comments: settings.comments_collection.clone(),
            connect_timeout: settings.connect_timeout,
            collections: settings.collections(),
            schema: settings.schema(),
        }
    }
}

/// Each component's defaults: the configuration's (`component => how it is made of them`).
macro_rules! defaults_from_settings {
    ($($component:ty => $make:path),*) => {$(
        impl Default for $component {
            fn default() -> Self {
                $make(&Settings::default())
            }
        }
    )*};
}

defaults_from_settings!(WorkerSettings => Self::from, SnapshotSettings => Self::from);
defaults_from_settings!(ReconcileSettings => Self::from, CatchUp => Self::from);
defaults_from_settings!(Schema => Settings::schema, Collections => Settings::collections);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn component_defaults_are_the_configurations() {
        let settings = Settings::default();
        let reconcile = ReconcileSettings::default();
        assert_eq!(
            reconcile.counts_per_second,
            settings.reconcile_counts_per_second
        );
        assert_eq!(reconcile.catch_up.timeout, settings.catch_up_timeout);
        let worker = WorkerSettings::default();
        assert_eq!(worker.batch_size, settings.batch_size);
        assert_eq!(
            worker.snapshot.rows_per_second,
            settings.snapshot_rows_per_second
        );
        assert!(!worker.pre_images);
        assert_eq!(Schema::default().group(), settings.group_field);
        assert_eq!(
            Collections::default().counters,
            settings.counters_collection
        );
    }
}
