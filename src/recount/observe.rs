//! A post's displayed value beside its true count, compared consistently with the stream.

use super::{Pace, Recount, Recounter, Request, EVERYTHING};
use crate::core::key::GroupValue;
use crate::core::num::Num;
use crate::store::{Store, StoreResult};

/// A post's displayed value beside its true count, compared only when both reflect the same
/// events: what `get`, `verify` and the tests report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    pub post: GroupValue,
    /// `base_count + live_delta` (0 without a counter).
    pub displayed: Num,
    /// The readers' `count` field (`None`: no counter, or one from before `count` existed).
    pub count: Option<Num>,
    /// Live rows (a sum's `$sum` over them), counted consistently with `displayed`; `None`: a
    /// change to the post was in flight (or the worker did not catch up in time), so no
    /// comparison is possible yet.
    pub truth: Option<Num>,
}

impl Observation {
    /// The readers' `count` disagrees with `base_count + live_delta` (a hand edit of one of
    /// them: counterd writes both in one single-document write).
    pub fn count_broken(&self) -> bool {
        self.count.is_some_and(|c| c.differs(self.displayed))
    }

    /// A real difference: both sides reflect the same events and disagree (a sum of doubles
    /// beyond rounding).
    pub fn mismatch(&self) -> Option<Num> {
        self.truth
            .filter(|t| t.differs(self.displayed))
            .map(|t| self.displayed - t)
    }
}

impl<S: Store + ?Sized> Recounter<S> {
    /// Compares each post's displayed value with its true count of every live row, consistently
    /// with the stream: a post with a change in flight is reported as such, never as a mismatch.
    pub async fn observe(&self, posts: &[GroupValue]) -> StoreResult<Vec<Observation>> {
        let requests = Request::each(posts, EVERYTHING, false);
        let recounts = self.recount(&requests, &mut Pace::new(0)).await?;
        let mut out = Vec::with_capacity(posts.len());
        for (post, recount) in posts.iter().zip(recounts) {
            let (counter, truth) = match recount {
                Recount::Consistent(c) => (c.counter, Some(c.count)),
                // Not compared: the counter as it is now.
                Recount::InFlight | Recount::SnapshotRunning => {
                    (self.store.read_counter(post).await?, None)
                }
            };
            out.push(Observation {
                post: post.clone(),
                displayed: counter.as_ref().map_or(Num::ZERO, |c| c.state.displayed()),
                count: counter.and_then(|c| c.count),
                truth,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_reports_a_mismatch_only_when_compared() {
        let o = |displayed: i64, truth: Option<i64>| Observation {
            post: GroupValue::Int(1),
            displayed: Num::Int(displayed),
            count: Some(Num::Int(displayed)),
            truth: truth.map(Num::Int),
        };
        assert_eq!(o(5, Some(5)).mismatch(), None);
        assert_eq!(o(8, Some(5)).mismatch(), Some(Num::Int(3)));
        assert_eq!(o(3, Some(5)).mismatch(), Some(Num::Int(-2)));
        assert_eq!(o(8, None).mismatch(), None, "in flight: not compared");
        assert!(!o(5, Some(5)).count_broken());
        let broken = Observation {
            count: Some(Num::Int(6)),
            ..o(5, Some(5))
        };
        assert!(broken.count_broken());
    }
}
