//! Deliberately broken variants (`counterd`'s own code with one rule taken out, see
//! `sim_store::Broken`): the simulation must catch each within a few hundred seeds.

use crate::plan::Variant;
use crate::runner::expect_caught;
use crate::sim_store::Broken;

#[test]
fn removing_the_guard_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::NoGuard,
            ..Variant::FAITHFUL
        },
        200,
    );
}

#[test]
fn removing_the_recount_condition_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::UnconditionedRecount,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// The row-level recount with its window ignored (the counter's log names no changed row, so
/// every row keeps the state the recount read) installs counts that saw events the counter had
/// not applied, or missed ones it had: on hot posts the simulation catches it.
#[test]
fn ignoring_the_recount_window_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::WindowIgnored,
            hot: true,
            ..Variant::FAITHFUL
        },
        200,
    );
}

/// Reads (and so batches) cut inside multi-document transactions. On this store's row-level
/// recount that cannot miscount (see `State::check_batch_end` for why); the simulation catches
/// the broken invariant itself: a batch end between two events of one transaction.
#[test]
fn cutting_batches_inside_transactions_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::CutTransactions,
            transactions: true,
            ..Variant::FAITHFUL
        },
        50,
    );
}

#[test]
fn the_seed_fold_formula_is_caught() {
    expect_caught(
        Variant {
            broken: Broken::SeedFold,
            ..Variant::FAITHFUL
        },
        400,
    );
}
