//! `--counter NAME`: which counter definition a command reads (`get`, `dirty`, `verify`,
//! `reconcile`). One argument and one resolver, so every command names counters alike and
//! refuses an unknown name the same way, before anything is contacted.

use std::sync::Arc;

use crate::cli::exit::UsageError;
use crate::config::Settings;
use crate::core::definition::DEFAULT_COUNTER;
use crate::core::key::CounterIx;
use crate::store::mongo::MongoStore;
use crate::store::CounterViews;

/// The `--counter` flag.
#[derive(Debug, Clone, clap::Args)]
pub struct CounterArg {
    /// The counter definition (see `counterd config`); without it, `default`: the one of
    /// group_field and counters_collection.
    #[arg(long = "counter", value_name = "NAME")]
    pub given: Option<String>,
}

impl CounterArg {
    /// The name asked for (`default` when the flag is not given).
    pub fn name(&self) -> &str {
        self.given.as_deref().unwrap_or(DEFAULT_COUNTER)
    }

    /// The definition the flag names, with the settings of the source that holds it (see
    /// `config::sources`): the command reads that source's collections. Unknown names are
    /// usage errors listing the known ones.
    pub fn resolve(&self, settings: Settings) -> anyhow::Result<(Settings, CounterIx)> {
        match settings.source_of_counter(self.name())? {
            Some(found) => Ok(found),
            None => anyhow::bail!(UsageError(format!(
                "--counter {}: no such counter; configured: {}",
                self.name(),
                settings.counter_names()?.join(", ")
            ))),
        }
    }

    /// [`CounterArg::resolve`], then connects: the settings of the definition's source and the
    /// definition's view of the store (its counters, dirty set and count queries).
    pub async fn open(&self, settings: Settings) -> anyhow::Result<(Settings, Arc<MongoStore>)> {
        let (settings, counter) = self.resolve(settings)?;
        let store = crate::cli::connect(&settings).await?.for_counter(counter);
        Ok((settings, Arc::new(store)))
    }
}
