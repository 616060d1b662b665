//! Pure: splitting posts across N streams by a stable hash of `post_id`, and what each
//! partition keeps of the comment ledger.
//!
//! Each partition has its own stream name (and so its own checkpoint, lease, ledger and dirty
//! entries); its worker reads every change event and applies, for every counter definition, the
//! part of each change that belongs to the rows it owns ([`Partition::own_transition`]): the
//! before-state taken back where that row is in one of its posts, the after-state added where
//! that one is. A definition grouped by the post keeps the counters of its posts; one grouped
//! by another field (per author) has counters that several partitions write, each guarded by
//! its own position in the counter document (its writer slot, see `crate::store::Fence`).
//!
//! **The ledger is divided too**: a partition keeps entries only for the comments in its own
//! posts, so N partitions write about one ledger entry per event in total, not N. A partition
//! needs nothing more: a row in another partition's post adds nothing to its counts, whatever
//! its state, so "not here" is all it must know of it ([`Partition::own_view`]). A comment
//! moving between posts of two partitions is written by both: the one it leaves records "not
//! here" (an entry without a row), the one it joins records the row
//! ([`Partition::own_writes`]).
//!
//! This needs a *complete* ledger (the initial snapshot's, see [`crate::core::batch::Coverage`]),
//! where a comment without an entry is known not to count. Without one (`initial_snapshot =
//! "never"`, or after lost history) a comment without an entry is *unknown*, and a partition
//! cannot tell another partition's comment from one it never saw: each partition then keeps an
//! entry for every comment, as an undivided ledger does, and writes N entries per event.
//!
//! Why an entry naming another partition's post is read as "not here" rather than trusted:
//! the partition stopped following that comment when it left, so the entry is stale (a soft
//! delete made meanwhile is missing). Deriving the comment's state from it when it moves back
//! would count a deleted row. Without a row of its own, the partition takes the state the event
//! shows (the `updateLookup` document, possibly later than the event: the transitions still
//! telescope through its own entries), or, with none, keeps "not here" until the next event.

use crate::core::event::{LedgerUpdate, LedgerView, Row};
use crate::core::key::GroupValue;

/// One partition of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

impl Partition {
    /// Whether this partition owns `post`.
    pub fn owns(&self, post: &GroupValue) -> bool {
        self.count <= 1 || post.stable_hash() % self.count as u64 == self.index as u64
    }

    /// Whether `state` is a row this partition follows ([`Partition::applies_row`]): one in
    /// its posts, or (partition 0) a row without a post.
    pub fn owns_row(&self, state: Option<&Row>) -> bool {
        state.is_some_and(|row| self.applies_row(row))
    }

    /// This partition's view of the ledger entries it read: a row in another partition's post
    /// (an entry written before the ledger was divided; a row without a post outside
    /// partition 0) becomes "not here", exactly like the entry this partition writes when a comment leaves it.
    pub fn own_view(&self, ledger: &mut LedgerView) {
        for state in ledger.values_mut() {
            if !self.owns_row(state.as_ref()) {
                *state = None;
            }
        }
    }

    /// The ledger writes this partition makes for a batch whose final states are `updates`,
    /// given its view of the entries before the batch (`before`, see [`Partition::own_view`]):
    /// a comment now in one of its posts gets its row; one that was (a row in `before`) and is
    /// no longer gets "not here"; any other comment is another partition's, and is not written.
    pub fn own_writes(&self, updates: Vec<LedgerUpdate>, before: &LedgerView) -> Vec<LedgerUpdate> {
        updates
            .into_iter()
            .filter_map(|update| {
                if self.owns_row(update.state.as_ref()) {
                    return Some(update);
                }
                let was_here = before
                    .get(&update.comment.key)
                    .is_some_and(|state| self.owns_row(state.as_ref()));
                was_here.then_some(LedgerUpdate {
                    comment: update.comment,
                    state: None,
                })
            })
            .collect()
    }

    /// Whether a row's contributions (and its ledger entry) are this partition's: a row in one
    /// of its posts, and (partition 0) a row without a post, which counts in definitions
    /// grouped by other fields though in no post. Every state of a row is exactly one
    /// partition's.
    pub fn applies_row(&self, row: &Row) -> bool {
        match row.group() {
            Some(post) => self.owns(post),
            None => self.index == 0,
        }
    }

    /// What this partition applies of one row's change `before` → `after`, for every
    /// definition: the before-state's contributions taken back where that row is this
    /// partition's ([`Partition::applies_row`]), the after-state's added where that one is.
    /// Each state of a row belongs to exactly one partition, so the partitions' parts add up
    /// to the whole [`crate::core::classify::transition`], whatever the definitions group by: a move
    /// between two partitions' posts is the old contribution taken back by one and the new
    /// added by the other, as their ledger writes already are. Counters of a definition not
    /// grouped by the partitions' field are then written by several partitions, each under a
    /// guard of its own (its *writer slot*, see [`Partition::of_stream`] and
    /// `crate::store::Fence::writer`).
    pub fn own_transition(
        &self,
        before: Option<&Row>,
        after: Option<&Row>,
    ) -> Vec<crate::core::classify::Delta> {
        let before = before.filter(|r| self.applies_row(r));
        let after = after.filter(|r| self.applies_row(r));
        crate::core::classify::transition(before, after)
    }

    /// The stream name of this partition: `<base>/p<index>of<count>`.
    pub fn stream_name(&self, base: &str) -> String {
        format!("{base}/p{}of{}", self.index, self.count)
    }

    /// The partition a stream name names (`<base>/p<index>of<count>`, count > 1), if any: the
    /// stream's name is its identity in every store record (checkpoint, lease, ledger), so the
    /// store and the reconciler read a writer's partition from it.
    pub fn of_stream(stream: &str) -> Option<Partition> {
        let (_, tail) = stream.rsplit_once("/p")?;
        let (index, count) = tail.split_once("of")?;
        let p = Partition {
            index: index.parse().ok()?,
            count: count.parse().ok()?,
        };
        (p.count > 1
            && p.index < p.count
            && p.stream_name(&stream[..stream.len() - tail.len() - 2]) == stream)
            .then_some(p)
    }

    /// The names of every partition of `stream` (itself alone when it is not a partition's):
    /// the streams whose workers write a counter grouped by another field than the partitions'.
    pub fn siblings(stream: &str) -> Vec<String> {
        match Partition::of_stream(stream) {
            Some(p) => {
                let base = &stream[..stream.len() - p.stream_name("").len()];
                stream_names(base, p.count)
                    .into_iter()
                    .map(|(n, _)| n)
                    .collect()
            }
            None => vec![stream.to_string()],
        }
    }
}

/// The stream names of a configuration: the base name alone, or one per partition.
pub fn stream_names(base: &str, partitions: u32) -> Vec<(String, Option<Partition>)> {
    if partitions <= 1 {
        return vec![(base.to_string(), None)];
    }
    (0..partitions)
        .map(|index| {
            let p = Partition {
                index,
                count: partitions,
            };
            (p.stream_name(base), Some(p))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::{CounterIx, Member};
    use crate::core::num::Num;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn any_row() -> impl Strategy<Value = Row> {
        let post = proptest::option::weighted(0.9, (0..6i64).prop_map(GroupValue::Int));
        let author = proptest::option::weighted(
            0.9,
            (0..3i64).prop_map(|a| GroupValue::Str(format!("a{a}"))),
        );
        let rating = prop_oneof![
            (0..6i64).prop_map(Num::Int),
            (0..6i64).prop_map(|h| Num::Double(h as f64 / 2.0))
        ];
        (post, author, rating, any::<bool>(), any::<bool>(), 0..3i64).prop_map(
            |(post, author, rating, deleted, approved, created)| Row {
                created_at: Some(bson::DateTime::from_millis(created * 60_000)),
                deleted,
                members: vec![
                    Member::counting(post, true),
                    // A count per author, and a sum of ratings of approved rows per author.
                    Member::counting(author.clone(), true),
                    Member {
                        group: author,
                        matches: approved,
                        amount: rating,
                        not_a_number: None,
                    },
                ],
            },
        )
    }

    /// Deltas added up per (definition, group, creation time), zeros dropped.
    fn net(
        deltas: &[crate::core::classify::Delta],
    ) -> BTreeMap<(CounterIx, GroupValue, Option<bson::DateTime>), Num> {
        let mut out: BTreeMap<_, Num> = BTreeMap::new();
        for d in deltas {
            *out.entry((d.key.counter, d.key.group.clone(), d.created_at))
                .or_default() += d.amount;
        }
        out.retain(|_, v| !v.is_zero());
        out
    }

    proptest! {
        /// Whatever the rows' posts (moves between partitions included) and whatever each
        /// definition groups by, the partitions' own parts add up to the whole transition,
        /// for counts and sums alike.
        #[test]
        fn the_partitions_own_parts_add_up_to_the_whole_transition(
            before in proptest::option::of(any_row()),
            after in proptest::option::of(any_row()),
            count in 2u32..=4,
        ) {
            let whole = net(&crate::core::classify::transition(before.as_ref(), after.as_ref()));
            let mut parts = Vec::new();
            for index in 0..count {
                parts.extend(Partition { index, count }.own_transition(before.as_ref(), after.as_ref()));
            }
            let parts = net(&parts);
            prop_assert_eq!(parts.keys().collect::<Vec<_>>(), whole.keys().collect::<Vec<_>>());
            for (k, v) in &whole {
                prop_assert!(!parts[k].differs(*v), "{:?}: {:?} != {:?}", k, parts[k], v);
            }
        }
    }

    #[test]
    fn every_post_has_exactly_one_owner() {
        for i in 0..2000 {
            let post = if i % 2 == 0 {
                GroupValue::Int(i)
            } else {
                GroupValue::Str(format!("post-{i}"))
            };
            let owners = (0..4)
                .filter(|&index| Partition { index, count: 4 }.owns(&post))
                .count();
            assert_eq!(owners, 1, "{post}");
        }
    }

    #[test]
    fn the_split_is_roughly_even() {
        let mut counts = [0; 4];
        for i in 0..4000 {
            let post = GroupValue::Str(format!("post-{i}"));
            let owner = (0..4)
                .find(|&index| Partition { index, count: 4 }.owns(&post))
                .unwrap();
            counts[owner as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    /// A post of partition `index` of 2.
    fn post_of(index: u32) -> GroupValue {
        (0..)
            .map(GroupValue::Int)
            .find(|p| Partition { index, count: 2 }.owns(p))
            .unwrap()
    }

    fn row(post: Option<GroupValue>, deleted: bool) -> Row {
        Row::of(post, None, deleted)
    }

    /// The ledger key of comment `id`.
    fn key(id: &str) -> String {
        update(id, None).comment.key
    }

    fn update(key: &str, state: Option<Row>) -> LedgerUpdate {
        LedgerUpdate {
            comment: crate::core::event::CommentId::new(bson::Bson::String(key.into())),
            state,
        }
    }

    #[test]
    fn a_partition_sees_only_the_rows_of_its_posts() {
        let p = Partition { index: 0, count: 2 };
        let mine = Some(row(Some(post_of(0)), true));
        let mut ledger = LedgerView::from_iter([
            ("mine".to_string(), mine.clone()),
            ("theirs".to_string(), Some(row(Some(post_of(1)), false))),
            ("no-post".to_string(), Some(row(None, false))),
            ("gone".to_string(), None),
        ]);
        p.own_view(&mut ledger);
        assert_eq!(ledger["mine"], mine, "its own rows are kept whole");
        assert_eq!(
            ledger["theirs"], None,
            "another partition's row is not here"
        );
        assert_eq!(
            ledger["no-post"],
            Some(row(None, false)),
            "a row without a post is partition 0's"
        );
        assert_eq!(ledger["gone"], None);
        assert_eq!(
            ledger.len(),
            4,
            "an entry stays known: not here is not unknown"
        );
    }

    /// Every (before, after) pair of "absent, not here, mine, theirs, no post, gone": a partition
    /// writes exactly the comments that are or were in its posts, and never a row of another's.
    #[test]
    fn a_partition_writes_the_comments_it_holds_or_held() {
        let p = Partition { index: 0, count: 2 };
        let mine = || Some(row(Some(post_of(0)), false));
        let theirs = || Some(row(Some(post_of(1)), false));
        let befores: [(&str, Option<Option<Row>>); 4] = [
            ("absent", None),
            ("not here", Some(None)),
            ("mine", Some(mine())),
            ("mine, deleted", Some(Some(row(Some(post_of(0)), true)))),
        ];
        let afters: [(&str, Option<Row>); 4] = [
            ("mine", mine()),
            ("theirs", theirs()),
            ("no post", Some(row(None, false))),
            ("gone", None),
        ];
        for (before_name, before) in &befores {
            for (after_name, after) in &afters {
                let mut view = LedgerView::default();
                if let Some(state) = before {
                    view.insert(key("c"), state.clone());
                }
                let writes = p.own_writes(vec![update("c", after.clone())], &view);
                let was_mine = before.as_ref().is_some_and(|s| p.owns_row(s.as_ref()));
                let expected = if p.owns_row(after.as_ref()) {
                    vec![update("c", after.clone())]
                } else if was_mine {
                    vec![update("c", None)]
                } else {
                    vec![]
                };
                assert_eq!(writes, expected, "before {before_name}, after {after_name}");
                assert!(
                    writes
                        .iter()
                        .all(|w| w.state.is_none() || p.owns_row(w.state.as_ref())),
                    "never another partition's row"
                );
            }
        }
    }

    /// The two sides of a move between partitions together write the comment twice; every other
    /// change of a comment with a post is written once, by its owner.
    #[test]
    fn partitions_together_write_about_one_entry_per_change() {
        let parts = [0, 1].map(|index| Partition { index, count: 2 });
        let writes = |before: Option<Row>, after: Option<Row>| -> usize {
            parts
                .iter()
                .map(|p| {
                    let mut view = LedgerView::from_iter([(key("c"), before.clone())]);
                    p.own_view(&mut view);
                    p.own_writes(vec![update("c", after.clone())], &view).len()
                })
                .sum()
        };
        let (a, b) = (Some(post_of(0)), Some(post_of(1)));
        assert_eq!(writes(None, Some(row(a.clone(), false))), 1, "insert");
        assert_eq!(
            writes(Some(row(a.clone(), false)), Some(row(a.clone(), true))),
            1,
            "soft delete"
        );
        assert_eq!(writes(Some(row(a.clone(), true)), None), 1, "hard delete");
        assert_eq!(
            writes(Some(row(a.clone(), false)), Some(row(b, false))),
            2,
            "move between partitions"
        );
    }

    #[test]
    fn a_stream_name_says_its_partition_and_its_siblings() {
        let p = Partition { index: 2, count: 4 };
        assert_eq!(Partition::of_stream("likes/p2of4"), Some(p));
        assert_eq!(Partition::of_stream("a/b/p0of2").map(|p| p.index), Some(0));
        for plain in [
            "comments",
            "comments/p1of1",
            "comments/p3of2",
            "comments/pxof2",
            "p1of2",
        ] {
            assert_eq!(Partition::of_stream(plain), None, "{plain}");
        }
        assert_eq!(
            Partition::siblings("likes/p1of2"),
            ["likes/p0of2", "likes/p1of2"]
        );
        assert_eq!(Partition::siblings("comments"), ["comments"]);
    }

    #[test]
    fn names() {
        assert_eq!(
            stream_names("comments", 1),
            vec![("comments".to_string(), None)]
        );
        let names: Vec<_> = stream_names("comments", 2)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, vec!["comments/p0of2", "comments/p1of2"]);
    }
}
