//! The event loads: which posts a backlog's comments belong to (Zipf(1.1) or uniform, seeded so
//! every run draws the same sequence), and what per-batch coalescing could make of them.

use anyhow::anyhow;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

use crate::plan::ZIPF_EXPONENT;

/// How posts of an event load are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Dist {
    Zipf,
    Uniform,
}

/// `n` post ids among `posts`, drawn by `dist` from `seed`.
pub fn draw_posts(dist: Dist, n: usize, posts: usize, seed: u64) -> anyhow::Result<Vec<i64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    Ok(match dist {
        Dist::Zipf => {
            let zipf = Zipf::new(posts as f64, ZIPF_EXPONENT).map_err(|e| anyhow!("zipf: {e}"))?;
            (0..n).map(|_| zipf.sample(&mut rng) as i64).collect()
        }
        Dist::Uniform => (0..n).map(|_| rng.random_range(1..=posts as i64)).collect(),
    })
}

/// Distinct values of `posts`.
pub fn distinct(posts: &[i64]) -> Vec<i64> {
    let mut p = posts.to_vec();
    p.sort_unstable();
    p.dedup();
    p
}

/// Counter writes per-batch coalescing issues for `posts` cut into windows of `window` events:
/// the sum of distinct posts per window.
pub fn windowed_distinct(posts: &[i64], window: usize) -> usize {
    posts
        .chunks(window.max(1))
        .map(|chunk| distinct(chunk).len())
        .sum()
}
