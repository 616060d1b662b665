//! When reconcile passes run and how much of the background sweep each one takes: pure
//! arithmetic, so that the scheduler's rules are tested without a clock.
//!
//! Two rules keep every counter within a few intervals of the truth while the load goes on:
//! - **Passes start at a fixed rate.** The next pass starts `interval` after the previous one
//!   *started*, not after it ended; a pass that took longer than the interval is followed at
//!   once. Sleeping a whole interval after a long pass would stretch the time a hot post waits
//!   for its next fold by the length of the pass, the very time that load makes long.
//! - **Spare time goes to the background sweep.** The background sweep's configured pass
//!   (`background_sweep_pass`, a day by default) is the slowest it may go. A pass whose dirty
//!   posts left most of the interval unused also sweeps a whole window of posts: drift that no
//!   event points at (a hand-edited counter of a post nobody comments on) is then found within a
//!   few intervals on a deployment of a few windows of posts, and the database never sees more
//!   than one window's recount per interval on a large one.

use std::time::Duration;

/// How long to wait before the next pass: `interval` (moved by `jitter`, seconds either way)
/// counted from the start of the pass that just took `elapsed`; at least a hundredth of a second,
/// so that a pass longer than its interval yields before the next one.
pub fn next_pass_delay(interval: Duration, jitter: f64, elapsed: Duration) -> Duration {
    let due = interval.as_secs_f64() + jitter - elapsed.as_secs_f64();
    Duration::from_secs_f64(due.max(0.01))
}

/// Whether the dirty posts of a pass, done after `elapsed`, left the background sweep time to
/// spare: less than half of the interval was used.
pub fn has_spare_time(elapsed: Duration, interval: Duration) -> bool {
    elapsed.as_secs_f64() * 2.0 < interval.as_secs_f64()
}

/// How many posts one step of the background sweep recounts: as many as keep a pass over
/// `posts` (the estimated number of posts) near `pass` long at one step per `interval` (at least
/// one), or a whole `window` when the step has time to spare; never more than a window.
pub fn background_step_size(
    posts: u64,
    pass: Duration,
    interval: Duration,
    window: usize,
    spare: bool,
) -> usize {
    let window = window.max(1);
    if spare {
        return window;
    }
    let steps_per_pass = (pass.as_secs_f64() / interval.as_secs_f64().max(0.001)).max(1.0);
    ((posts.max(1) as f64 / steps_per_pass).ceil() as usize).clamp(1, window)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn the_next_pass_is_due_an_interval_after_the_last_one_started() {
        assert_eq!(next_pass_delay(S(10), 0.0, S(0)), S(10));
        assert_eq!(next_pass_delay(S(10), 0.0, S(4)), S(6));
        assert_eq!(
            next_pass_delay(S(10), 1.5, S(4)),
            Duration::from_secs_f64(7.5)
        );
        assert_eq!(next_pass_delay(S(10), -2.0, S(4)), S(4));
    }

    #[test]
    fn a_pass_longer_than_its_interval_is_followed_at_once_but_yields() {
        for elapsed in [10, 11, 60, 3600] {
            let d = next_pass_delay(S(10), 0.0, S(elapsed));
            assert_eq!(d, Duration::from_millis(10), "after {elapsed} s");
        }
    }

    #[test]
    fn spare_time_is_less_than_half_the_interval_used() {
        assert!(has_spare_time(S(0), S(10)));
        assert!(has_spare_time(Duration::from_millis(4999), S(10)));
        assert!(!has_spare_time(S(5), S(10)));
        assert!(!has_spare_time(S(30), S(10)));
    }

    #[test]
    fn a_step_without_spare_time_keeps_the_configured_pace() {
        // 8 640 steps of 10 s in a day: 1 000 000 posts take 116 a step.
        assert_eq!(
            background_step_size(1_000_000, S(86_400), S(10), 500, false),
            116
        );
        // A small deployment still moves by one post a step.
        assert_eq!(background_step_size(500, S(86_400), S(10), 500, false), 1);
        assert_eq!(background_step_size(0, S(86_400), S(10), 500, false), 1);
        // A pass shorter than one interval: every post each step, capped by the window.
        assert_eq!(background_step_size(300, S(5), S(10), 500, false), 300);
        assert_eq!(background_step_size(100_000, S(5), S(10), 500, false), 500);
    }

    #[test]
    fn a_step_with_spare_time_takes_a_whole_window_and_never_more() {
        for posts in [0, 1, 499, 500, 10_000_000] {
            for pass in [S(1), S(600), S(86_400)] {
                let spare = background_step_size(posts, pass, S(10), 500, true);
                let paced = background_step_size(posts, pass, S(10), 500, false);
                assert_eq!(spare, 500);
                assert!(
                    (1..=spare).contains(&paced),
                    "{posts} posts, {pass:?}: {paced}"
                );
            }
        }
        assert_eq!(background_step_size(10, S(1), S(10), 0, true), 1);
    }
}
