//! The demo's live view: once a second, where the stream stands, then a few posts of every
//! counter definition, displayed against the truth. A sum kept `with_count` is shown as the
//! average it exists for: the sum over its row count, both read from one counter document,
//! against `$sum` over the number of live rows.

use std::sync::Arc;

use crate::config::Settings;
use crate::core::definition::{Definition, Definitions, Kind};
use crate::core::key::{CounterIx, GroupValue};
use crate::core::num::Num;
use crate::outln;
use crate::recount::Observation;
use crate::store::mongo::MongoStore;
use crate::store::prelude::*;

/// What every frame of the view reads.
pub(super) struct View<'a> {
    pub settings: &'a Settings,
    pub store: &'a Arc<MongoStore>,
    pub definitions: &'a Definitions,
    /// The posts shown.
    pub shown: Vec<GroupValue>,
}

impl View<'_> {
    /// The counters of every definition: counts line by line, a sum with its row count as an
    /// average, a row count already shown beside its sum skipped.
    pub(super) async fn show_counters(&self) -> anyhow::Result<()> {
        for (ix, definition) in self.definitions.iter() {
            match &definition.kind {
                Kind::Rows { of } if self.definitions.by_name(of).is_some() => {}
                Kind::Sum { .. } => match self.rows_of(definition) {
                    Some(rows) => self.show_average(ix, definition, rows).await?,
                    None => self.show_count(ix, definition).await?,
                },
                _ => self.show_count(ix, definition).await?,
            }
        }
        Ok(())
    }

    /// The row count kept beside the sum `sum` (`with_count`), if any.
    fn rows_of(&self, sum: &Definition) -> Option<CounterIx> {
        self.definitions
            .iter()
            .find(|(_, d)| matches!(&d.kind, Kind::Rows { of } if *of == sum.name))
            .map(|(ix, _)| ix)
    }

    async fn observe(&self, ix: CounterIx) -> anyhow::Result<Vec<Observation>> {
        let view = Arc::new(self.store.for_counter(ix));
        crate::cli::observe(self.settings, &view, &self.shown).await
    }

    async fn show_count(&self, ix: CounterIx, definition: &Definition) -> anyhow::Result<()> {
        outln!("  counter `{}` ({definition})", definition.name);
        for o in self.observe(ix).await? {
            let displayed = o.displayed.to_string();
            match o.truth {
                Some(truth) => outln!(
                    "    {}: displayed {displayed:>4}  true {:>4}{}",
                    o.post,
                    truth.to_string(),
                    drift_note(o.displayed, truth)
                ),
                None => outln!(
                    "    {}: displayed {displayed:>4}  (a change is in flight)",
                    o.post
                ),
            }
        }
        Ok(())
    }

    /// The average of each shown post: `count / rows.count` of the sum's counter document,
    /// against `$sum` of the field over the number of live rows.
    async fn show_average(
        &self,
        sum_ix: CounterIx,
        sum: &Definition,
        rows_ix: CounterIx,
    ) -> anyhow::Result<()> {
        let rows_name = &self.definitions.get(rows_ix).expect("a definition").name;
        outln!(
            "  average `{}` = sum / `{rows_name}` ({sum}, with its rows)",
            sum.name
        );
        let sums = self.observe(sum_ix).await?;
        let rows = self.observe(rows_ix).await?;
        for (s, r) in sums.iter().zip(&rows) {
            let shown = average(s.displayed, r.displayed);
            match (s.truth, r.truth) {
                (Some(sum), Some(rows)) => outln!(
                    "    {}: displayed {shown}  true {}{}",
                    s.post,
                    average(sum, rows),
                    drift_note(s.displayed, sum).max(drift_note(r.displayed, rows))
                ),
                _ => outln!("    {}: displayed {shown}  (a change is in flight)", s.post),
            }
        }
        Ok(())
    }
}

/// `sum / rows = average`, e.g. `17 / 5 = 3.40` (`-` without rows).
fn average(sum: Num, rows: Num) -> String {
    let value = if rows.is_zero() {
        "-".to_string()
    } else {
        format!("{:.2}", sum.as_f64() / rows.as_f64())
    };
    format!(
        "{:>4} / {:>3} = {value:>4}",
        sum.to_string(),
        rows.to_string()
    )
}

fn drift_note(displayed: Num, truth: Num) -> &'static str {
    if displayed.differs(truth) {
        "  (drift: to be corrected)"
    } else {
        ""
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_average_shows_both_numbers_and_their_quotient() {
        assert_eq!(average(Num::Int(17), Num::Int(5)), "  17 /   5 = 3.40");
        assert_eq!(average(Num::ZERO, Num::ZERO), "   0 /   0 =    -");
        assert_eq!(average(Num::Double(7.5), Num::Int(2)), " 7.5 /   2 = 3.75");
    }
}
