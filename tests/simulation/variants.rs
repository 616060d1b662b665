//! The variants of the whole simulation, each over its first seeds (hot posts, several counters
//! and sums, transactions, pre-images, lost history): every seed must pass.

use crate::plan::Variant;
use crate::runner::{env_u64, expect_clean, run_seeds};

/// Hot posts: post 0 receives most inserts and most old-row changes, so its recounts nearly
/// always have rows changed inside their window; they must settle them exactly, on servers
/// that describe updates and on ones that only look rows up (like the fake test server).
#[test]
fn with_hot_posts() {
    expect_clean(
        Variant {
            hot: true,
            ..Variant::FAITHFUL
        },
        200,
    );
    expect_clean(
        Variant {
            hot: true,
            lookups: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Several counters from one stream: in every seed with one stream, comments per author and
/// approved comments per post beside the default per post, with writers approving,
/// unapproving, changing and removing authors besides moving, soft-deleting, undeleting and
/// hard-deleting rows. Every counter of every definition equals its truth at every caught-up
/// moment and after the final sweep, no fold of theirs corrects drift (none is injected
/// there), and every dirty set is empty at the end; the default definition keeps every check
/// it always had.
/// Sums beside counts: ratings per author (integers, halves, missing and string values) and
/// approved scores per post (halves), with value changes, moves, soft and hard deletes,
/// crashes and takeovers; every sum must equal its `$sum` truth at every caught-up point and
/// after the final sweep, with no fold of theirs correcting drift.
#[test]
fn with_sums() {
    let variant = Variant {
        definitions: true,
        sums: true,
        ..Variant::FAITHFUL
    };
    let seeds = env_u64("SIM_SUMS_SEEDS").unwrap_or(150);
    let (failures, stats, _) = run_seeds(0, seeds, variant, 3);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{variant:?}: seed {} failed: {}", first.seed, first.message);
    }
    for key in [
        "seeds with sums",
        "change rating of",
        "change score of",
        "fold of another definition installed",
        "probe checked a caught-up point while others run",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "never happened: {key} ({stats:?})"
        );
    }
}

/// Partitions beside every definition (issue 42, part B): 2 to 4 partitions divide the posts
/// while the per-author count and sums are written by every partition that owns one of the
/// author's rows (a definition grouped by another field than the partitions'), beside
/// `approved` per post; with moves between partitions, author changes, crashes, takeovers,
/// replays and faults: every counter of every definition exact at every caught-up point, and
/// every fold's correction one that was injected.
#[test]
fn with_partitioned_definitions() {
    let variant = Variant {
        definitions: true,
        sums: true,
        partitioned: true,
        ..Variant::FAITHFUL
    };
    let seeds = env_u64("SIM_PARTITIONED_SEEDS").unwrap_or(150);
    let (failures, stats, _) = run_seeds(0, seeds, variant, 3);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{variant:?}: seed {} failed: {}", first.seed, first.message);
    }
    for key in [
        "seeds with several counter definitions",
        "seeds with 2 streams",
        "seeds with 4 streams",
        "fold of another definition installed",
        "probe checked a caught-up point while others run",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "never happened: {key} ({stats:?})"
        );
    }
}

#[test]
fn with_several_counters() {
    let several = Variant {
        definitions: true,
        ..Variant::FAITHFUL
    };
    let (failures, stats, _) = run_seeds(0, 200, several, 3);
    if let Some(first) = failures.first() {
        for f in &failures {
            eprintln!("{}", f.report());
        }
        panic!("{several:?}: seed {} failed: {}", first.seed, first.message);
    }
    // The checks ran where they matter: the other definitions' folds, snapshots and
    // caught-up points with writers running.
    for key in [
        "seeds with several counter definitions",
        "fold of another definition installed",
        "dirty run of another definition",
        "snapshot done",
        "probe checked a caught-up point while others run",
    ] {
        assert!(
            stats.get(key).copied().unwrap_or(0) > 0,
            "never happened: {key} ({stats:?})"
        );
    }
    expect_clean(
        Variant {
            lookups: true,
            ..several
        },
        50,
    );
    expect_clean(
        Variant {
            pre_images: true,
            ..several
        },
        50,
    );
}

/// Writers sometimes write 2 to 4 comment changes (inserts, soft deletes, moves across posts)
/// in one transaction: counters stay exact, no fold invents drift, and no batch ends inside a
/// transaction (`State::check_batch_end`, at every intent and checkpoint).
#[test]
fn with_transactions() {
    expect_clean(
        Variant {
            transactions: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

/// Transactions on hot posts, on a server that describes no update (lookups only). Seed 102
/// once installed a fold that corrected post 0 by +1 and then by -1 with no drift injected of
/// that sign. Not a transaction bug (it failed the same with reads cut inside transactions):
/// a recount had read post 0's rows while the stream's first worker had not yet begun the
/// initial snapshot, and was folded after that worker took the whole snapshot, which claimed
/// a row inserted after the read (fixed in `counterd::recount::snapshot_moved`; the small
/// case is `a_recount_across_the_initial_snapshot_is_not_folded`). Replay:
/// `SIM_TRANSACTIONS=1 SIM_HOT=1 SIM_LOOKUPS=1 SIM_SEED=102 cargo test --test simulation -- --nocapture`.
#[test]
fn with_transactions_on_hot_posts_with_lookups() {
    expect_clean(
        Variant {
            transactions: true,
            hot: true,
            lookups: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Transactions and pre-images. Seed 52 (two partitions, one tiny budget) once stopped making
/// progress until the real clock's operation timeouts ended it (minutes per seed): a worker
/// holding a read ahead (a transaction taken whole) asked for room for a snapshot chunk
/// *waiting* (the "holding" flag was passed inverted), queued behind the other partition's wait
/// for its reply reserve, which needed the bytes the first worker would free only by writing
/// what it held. A read ahead that takes a transaction whole holds more than its grant, which
/// makes that state likely; with reads cut inside transactions seed 52 never reached it. Fixed in `counterd::budget::Budget::take_for`, which
/// decides from the grant held. Replay:
/// `SIM_TRANSACTIONS=1 SIM_PRE_IMAGES=1 SIM_SEED=52 SIM_TRACE=1 cargo test --test simulation -- --nocapture`.
#[test]
fn with_transactions_and_pre_images() {
    expect_clean(
        Variant {
            transactions: true,
            pre_images: true,
            ..Variant::FAITHFUL
        },
        100,
    );
}

#[test]
fn with_pre_images() {
    expect_clean(
        Variant {
            pre_images: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

#[test]
fn with_history_lost() {
    expect_clean(
        Variant {
            history_lost: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}

#[test]
fn with_history_lost_and_start_at() {
    expect_clean(
        Variant {
            history_lost: true,
            lost_start_time: true,
            ..Variant::FAITHFUL
        },
        300,
    );
}
