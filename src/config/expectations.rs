//! What these settings expect of the server, for the preflight's checks ([`crate::doctor`]):
//! the collections counterd owns, the schema, whether pre-images are used. Derived here, beside
//! the settings, so that the doctor's pure checks read the expectations alone and never the
//! settings.

use super::Settings;
use crate::doctor::Expectations;

impl From<&Settings> for Expectations {
    fn from(settings: &Settings) -> Self {
        Expectations {
            database: settings.database.clone(),
            comments: settings.comments_collection.clone(),
            schema: settings.schema(),
            own_collections: settings
                .own_collections()
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
            uses_pre_images: settings.attribution.uses_pre_images(),
            // Quiet-window recounts take positions from this clock when the server reports none
            // (docs/guarantees.md); a second is well inside a settle_time.
            max_clock_skew_ms: 1000,
        }
    }
}

impl Settings {
    /// Every collection this source writes, each once, with what it holds in a few words: the
    /// readers' counters of every definition first, then their dirty sets, the ledger of every
    /// stream and the bookkeeping. The doctor's role grants exactly these; `counterd config
    /// --collections` lists them for every source.
    pub fn own_collections(&self) -> Vec<(String, String)> {
        let names = self.collections();
        let definitions = self.schema().definitions;
        let counters = definitions.iter().map(|(_, d)| {
            let holds = format!("counters of `{}` (what readers query)", d.name);
            (d.collection.clone(), holds)
        });
        let dirty = definitions.iter().map(|(ix, d)| {
            let holds = format!("dirty set of `{}` (posts waiting for a recount)", d.name);
            (names.dirty_of(ix, &d.name), holds)
        });
        let ledgers = self.streams().into_iter().map(|(stream, _)| {
            let holds = format!("comment ledger of stream `{stream}` (one entry per row)");
            (names.ledger_of(&stream), holds)
        });
        let bookkeeping = [
            (
                &names.checkpoints,
                "stream checkpoints and the initial snapshot's state",
            ),
            (&names.carried, "batches carried while catching up"),
            (&names.leases, "leases (which process works on a stream)"),
            (&names.runs, "reconcile run reports"),
            (&names.sweeps, "full-sweep progress and adoption markers"),
        ]
        .map(|(name, holds)| (name.clone(), holds.to_string()));
        let mut own: Vec<(String, String)> = Vec::new();
        for (name, holds) in counters.chain(dirty).chain(ledgers).chain(bookkeeping) {
            if !own.iter().any(|(n, _)| *n == name) {
                own.push((name, holds));
            }
        }
        own
    }
}
