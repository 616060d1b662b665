//! Pure: splitting posts across N streams by a stable hash of `post_id`.
//!
//! Each partition has its own stream name (and so its own checkpoint, lease, ledger and dirty
//! entries); its worker reads every change event, classifies it against its own ledger, and keeps
//! only the deltas and dirty marks of the posts it owns. A comment moving between posts of two
//! partitions is therefore seen by both: each counts its own side of the move.

use crate::event::PostId;

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
