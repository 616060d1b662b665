//! Pure: counter definitions, the data that says which counters exist.
//!
//! Applications keep several counts over the same rows: comments per post, per author, only the
//! approved ones. Each used to need its own counterd, with its own change stream, ledger and
//! snapshot reading the same events. A *definition* makes a counter data instead: a name, the
//! field that groups rows (a dotted path), an optional condition on the row (the subset of
//! MongoDB's query language in [`crate::core::condition`], evaluated identically by the classifier and
//! by the count queries), and the collection its counters live in. One stream and one ledger
//! serve every definition of a source collection; the code does not grow per definition.
//!
//! The *default* definition is today's settings (`group_field`, `counters_collection`, no
//! condition), named [`DEFAULT_COUNTER`], always first: an existing configuration and an existing
//! database mean exactly what they meant before definitions existed. `[[counters]]` entries come
//! after it, in the order they are written.
//!
//! A row counts for a definition when it exists, is not soft-deleted (the schema's rule, shared by
//! every definition), holds a usable key in the definition's group field, and satisfies its
//! condition. That is [`Member::counts`], and [`Definition::member`] reads it from a document.

use std::fmt;

use bson::{doc, Bson, Document};

use crate::core::condition::Condition;
use crate::core::key::{value_at, CounterIx, GroupValue, Member};
use crate::core::num::Num;

/// The name of the definition built from today's settings (`group_field`,
/// `counters_collection`): what `--counter` means when it is not given.
pub const DEFAULT_COUNTER: &str = "default";

/// A counter definition (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Definition {
    /// Its name: the `--counter` argument, the `counter` label of metrics, a line of `status`.
    pub name: String,
    /// Dotted path of the field that groups rows (`post_id`, `author_id`, `meta.thread`).
    pub group: String,
    /// What a row must satisfy to count (empty: every live row counts).
    pub condition: Condition,
    /// The collection its counters live in (one document per group value).
    pub collection: String,
    /// What a counted row adds: 1 (a count) or its field's value (a sum).
    pub kind: Kind,
}

/// What a row that counts adds to its counter; its name ("count", "sum", "rows") is what
/// `status --json`, `config --json` and `counterd_definition_info` show.
#[derive(Clone, Debug, Default, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Kind {
    /// 1 per row (`kind = "count"`, the default).
    #[default]
    Count,
    /// The value of `field` (a dotted path), by MongoDB's numeric rules ([`Num`]): a missing
    /// or null field adds 0, as `$sum` does; any other non-number adds 0 and is reported.
    Sum { field: String },
    /// The rows a sum adds up (`with_count = true` on the sum `of`): a count with the sum's
    /// group and condition whose counter lives in the sum's counter document, under
    /// [`ROWS_FIELD`] (`{_id, count: <sum>, rows: {count: <rows>, ...}}`), so that an average
    /// is two exact numbers in one read. Everything else about it is a count's.
    Rows { of: String },
}

/// The sub-document of a sum's counter document that holds its row count (`with_count`).
pub const ROWS_FIELD: &str = "rows";

/// The suffix of the name of a sum's row count (`rating_sum` → `rating_sum_rows`): its
/// `--counter` name, metric label and dirty set.
pub const ROWS_SUFFIX: &str = "_rows";

impl Kind {
    /// The summed field, for a sum.
    pub fn field(&self) -> Option<&str> {
        match self {
            Kind::Count | Kind::Rows { .. } => None,
            Kind::Sum { field } => Some(field),
        }
    }

    /// Where the counter's fields live in its document: at the top (`""`), or under
    /// [`ROWS_FIELD`] for a sum's row count (`"rows."`).
    pub fn field_prefix(&self) -> &'static str {
        match self {
            Kind::Rows { .. } => "rows.",
            Kind::Count | Kind::Sum { .. } => "",
        }
    }
}

/// What a summed field's value adds (see [`Kind::Sum`]), and the BSON type of a value that is
/// not a number.
pub fn amount_of(value: Option<&Bson>) -> (Num, Option<String>) {
    match value {
        None | Some(Bson::Null) => (Num::ZERO, None),
        Some(v) => match Num::from_bson(v) {
            Some(n) => (n, None),
            None => (Num::ZERO, Some(format!("{:?}", v.element_type()))),
        },
    }
}

impl Definition {
    /// What the row document `doc` is to this definition. The document may be a projection
    /// (an event's `fullDocument` after the stream's `$project`): it must keep every field the
    /// definition reads ([`Definition::read_paths`]).
    pub fn member(&self, doc: &Document) -> Member {
        let (amount, not_a_number) = match self.kind.field() {
            None => (Num::ONE, None),
            Some(field) => amount_of(value_at(doc, field)),
        };
        Member {
            group: value_at(doc, &self.group).and_then(GroupValue::from_bson),
            matches: self.condition.matches(doc),
            amount,
            not_a_number,
        }
    }

    /// The dotted paths this definition reads in a row: its group field, its condition's and
    /// a sum's field.
    pub fn read_paths(&self) -> Vec<&str> {
        let mut paths = vec![self.group.as_str()];
        for path in self.condition.paths().into_iter().chain(self.kind.field()) {
            if !paths.contains(&path) {
                paths.push(path);
            }
        }
        paths
    }

    /// The part of a count query that selects this definition's rows of `group`: the group
    /// field equal to the key and the condition (soft deletes and creation times are the
    /// schema's, added by the caller). Built from the same [`Condition`] the classifier
    /// evaluates, so a recount and the stream agree on every row.
    pub fn filter(&self, group: &GroupValue) -> Document {
        let own = doc! {self.group.clone(): group.to_bson()};
        if self.condition.is_empty() {
            return own;
        }
        doc! {"$and": [own, self.condition.to_filter()]}
    }
}

/// Every definition of a source collection, the default first.
#[derive(Clone, Debug, PartialEq)]
pub struct Definitions {
    list: Vec<Definition>,
}

impl Definitions {
    /// The definitions, the default first. Names and collections are checked by the
    /// configuration ([`crate::config`]); here they are taken as given.
    pub fn new(default: Definition, more: Vec<Definition>) -> Definitions {
        let mut list = vec![default];
        list.extend(more);
        Definitions { list }
    }

    /// The first definition: the source's own (`group_field`, `counters_collection`), whose
    /// group field is the schema's ([`crate::core::schema::Schema::group`]).
    pub fn first(&self) -> &Definition {
        &self.list[0]
    }

    /// The definition at `ix`.
    pub fn get(&self, ix: CounterIx) -> Option<&Definition> {
        self.list.get(ix.0)
    }

    /// The definition named `name`, with its place.
    pub fn by_name(&self, name: &str) -> Option<(CounterIx, &Definition)> {
        self.iter().find(|(_, d)| d.name == name)
    }

    /// Every definition with its place, the default first.
    pub fn iter(&self) -> impl Iterator<Item = (CounterIx, &Definition)> {
        self.list.iter().enumerate().map(|(i, d)| (CounterIx(i), d))
    }

    /// The definitions beyond the default (what `[[counters]]` added).
    pub fn extra(&self) -> &[Definition] {
        &self.list[1..]
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Always false: the default definition always exists.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The names, in order (for messages listing what `--counter` accepts).
    pub fn names(&self) -> Vec<&str> {
        self.list.iter().map(|d| d.name.as_str()).collect()
    }
}

/// Whether definition `counter` keeps the names and shapes counterd stored before definitions
/// existed, so that a deployment keeps its data: definition 0 does (its dirty set, sweep
/// cursor, run records and a batch intent's marks name no definition). The one place where
/// definition 0 differs from the others; see [`stored_name`].
pub fn keeps_historical_names(counter: CounterIx) -> bool {
    counter == CounterIx::DEFAULT
}

/// What tells definition `counter` (named `name`) apart in the names counterd stores: its
/// dirty set's collection, its background sweep's cursor, its run records. `None` for
/// definition 0 ([`keeps_historical_names`]), its name for every other.
pub fn stored_name(counter: CounterIx, name: &str) -> Option<&str> {
    (!keeps_historical_names(counter)).then_some(name)
}

impl fmt::Display for Definition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.name)?;
        match &self.kind {
            Kind::Count => {}
            Kind::Sum { field } => write!(f, "sum of `{field}` ")?,
            Kind::Rows { of } => write!(f, "the rows `{of}` adds up, ")?,
        }
        write!(f, "per `{}`", self.group)?;
        if !self.condition.is_empty() {
            write!(f, " where {}", self.condition.to_filter())?;
        }
        write!(f, ", in `{}`", self.collection)
    }
}

#[cfg(test)]
impl Definition {
    /// A count named `name`, grouped by `group`, of the rows that satisfy `condition`, in
    /// `<name>_counters`.
    pub(crate) fn count(name: &str, group: &str, condition: Document) -> Definition {
        Definition {
            name: name.into(),
            group: group.into(),
            condition: Condition::parse(&condition).unwrap(),
            collection: format!("{name}_counters"),
            kind: Kind::Count,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approved() -> Definition {
        Definition::count("approved", "post_id", doc! {"approved": true})
    }

    #[test]
    fn a_member_needs_a_group_the_condition_and_no_soft_delete() {
        let d = approved();
        let m = d.member(&doc! {"post_id": 8.0, "approved": true});
        assert_eq!(m.group, Some(GroupValue::Int(8)));
        assert_eq!(m.counts(false), Some(&GroupValue::Int(8)));
        assert_eq!(m.counts(true), None, "soft-deleted rows count nowhere");
        let m = d.member(&doc! {"post_id": 8, "approved": false});
        assert_eq!(m.counts(false), None);
        let m = d.member(&doc! {"approved": true});
        assert_eq!(m.counts(false), None, "no group, no counter");
    }

    #[test]
    fn the_filter_selects_the_group_and_the_condition() {
        let d = approved();
        assert_eq!(
            d.filter(&GroupValue::Int(3)),
            doc! {"$and": [{"post_id": 3_i64}, {"$and": [{"approved": {"$eq": true}}]}]}
        );
        let plain = Definition {
            condition: Condition::default(),
            ..approved()
        };
        assert_eq!(plain.filter(&GroupValue::Int(3)), doc! {"post_id": 3_i64});
    }

    #[test]
    fn definitions_are_found_by_name_and_place() {
        let default = Definition {
            collection: "comment_counters".into(),
            ..Definition::count(DEFAULT_COUNTER, "post_id", doc! {})
        };
        let all = Definitions::new(default.clone(), vec![approved()]);
        assert_eq!(&all.list[0], &default);
        assert_eq!(all.by_name("approved").map(|(i, _)| i), Some(CounterIx(1)));
        assert_eq!(all.names(), ["default", "approved"]);
        assert_eq!(all.extra(), [approved()]);
        assert_eq!(approved().read_paths(), ["post_id", "approved"]);
    }
}
