//! What these settings expect of the server, for the preflight's checks ([`crate::doctor`]):
//! the collections counterd owns, the schema, whether pre-images are used. Derived here, beside
//! the settings, so that the doctor's pure checks read the expectations alone and never the
//! settings.

use super::Settings;
use crate::doctor::Expectations;

impl From<&Settings> for Expectations {
    fn from(settings: &Settings) -> Self {
        let names = settings.collections();
        let mut own = vec![
            names.counters.clone(),
            names.dirty.clone(),
            names.checkpoints.clone(),
            names.carried.clone(),
            names.leases.clone(),
            names.runs.clone(),
            names.sweeps.clone(),
        ];
        for (stream, _) in settings.streams() {
            let ledger = names.ledger_of(&stream);
            if !own.contains(&ledger) {
                own.push(ledger);
            }
        }
        // Every definition's counters and dirty set (the default's are listed first).
        for (ix, definition) in settings.schema().definitions.iter() {
            for collection in [
                definition.collection.clone(),
                names.dirty_of(ix, &definition.name),
            ] {
                if !own.contains(&collection) {
                    own.push(collection);
                }
            }
        }
        Expectations {
            database: settings.database.clone(),
            comments: settings.comments_collection.clone(),
            schema: settings.schema(),
            own_collections: own,
            uses_pre_images: settings.attribution.uses_pre_images(),
            // Quiet-window recounts take positions from this clock when the server reports none
            // (docs/guarantees.md); a second is well inside a settle_time.
            max_clock_skew_ms: 1000,
        }
    }
}
