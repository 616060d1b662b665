//! Pure: splitting posts across N streams by a stable hash of `post_id`, and what each
//! partition keeps of the comment ledger.
//!
//! Each partition has its own stream name (and so its own checkpoint, lease, ledger and dirty
//! entries); its worker reads every change event and keeps only the deltas and dirty marks of
//! the posts it owns.
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

use std::collections::HashMap;

use crate::core::batch::LedgerUpdate;
use crate::core::event::Row;
use crate::core::key::PostId;

/// One partition of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub index: u32,
    pub count: u32,
}

impl Partition {
    /// Whether this partition owns `post`.
    pub fn owns(&self, post: &PostId) -> bool {
        self.count <= 1 || post.stable_hash() % self.count as u64 == self.index as u64
    }

    /// Whether `state` is a row in one of this partition's posts (a row without a post is in
    /// none).
    pub fn owns_row(&self, state: Option<&Row>) -> bool {
        state
            .and_then(|row| row.post.as_ref())
            .is_some_and(|post| self.owns(post))
    }

    /// This partition's view of the ledger entries it read: a row in another partition's post
    /// (an entry written before the ledger was divided, or a row without a post) becomes "not
    /// here", exactly like the entry this partition writes when a comment leaves it.
    pub fn own_view(&self, ledger: &mut HashMap<String, Option<Row>>) {
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
    pub fn own_writes(
        &self,
        updates: Vec<LedgerUpdate>,
        before: &HashMap<String, Option<Row>>,
    ) -> Vec<LedgerUpdate> {
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

    /// The stream name of this partition: `<base>/p<index>of<count>`.
    pub fn stream_name(&self, base: &str) -> String {
        format!("{base}/p{}of{}", self.index, self.count)
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

    #[test]
    fn every_post_has_exactly_one_owner() {
        for i in 0..2000 {
            let post = if i % 2 == 0 {
                PostId::Int(i)
            } else {
                PostId::Str(format!("post-{i}"))
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
            let post = PostId::Str(format!("post-{i}"));
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
    fn post_of(index: u32) -> PostId {
        (0..)
            .map(PostId::Int)
            .find(|p| Partition { index, count: 2 }.owns(p))
            .unwrap()
    }

    fn row(post: Option<PostId>, deleted: bool) -> Row {
        Row {
            members: Vec::new(),
            post,
            created_at: None,
            deleted,
        }
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
        let mut ledger = HashMap::from([
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
            ledger["no-post"], None,
            "a row without a post is in no partition"
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
                let mut view = HashMap::new();
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
                    let mut view = HashMap::from([(key("c"), before.clone())]);
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
