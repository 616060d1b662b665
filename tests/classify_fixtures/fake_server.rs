//! The fake server's shapes (`fixtures/events/fake/`): updates without descriptions, classified
//! from their lookups, and rows that are gone.

use counterd::core::classify::{After, Attribution, Before, Source};

use crate::{
    dead, delta, fc, live, outcome, run, unattributable, ALL, DELETE_UNATTRIBUTABLE, LEDGER_USERS,
    MOVE_UNATTRIBUTABLE,
};

#[test]
fn fake_insert() {
    for attribution in ALL {
        assert_eq!(
            run("fake/insert", Before::Unknown, attribution),
            outcome(
                vec![delta("p1", fc(), 1)],
                &["p1"],
                After::Known(Some(live("p1", fc()))),
                Source::Insert,
                None
            )
        );
    }
}

#[test]
fn fake_updates_with_the_row_present() {
    let cases = [
        // (fixture, ledger before, deltas, dirty, after row)
        (
            "fake/update_set_deleted_at",
            live("p1", fc()),
            vec![delta("p1", fc(), -1)],
            vec!["p1"],
            dead("p1", fc()),
        ),
        (
            "fake/update_unset_deleted_at",
            dead("p1", fc()),
            vec![delta("p1", fc(), 1)],
            vec!["p1"],
            live("p1", fc()),
        ),
        (
            "fake/update_set_post_id",
            live("p1", fc()),
            vec![delta("p1", fc(), -1), delta("p2", fc(), 1)],
            vec!["p1", "p2"],
            live("p2", fc()),
        ),
        (
            "fake/replace",
            live("p1", fc()),
            vec![delta("p1", fc(), -1), delta("p2", fc(), 1)],
            vec!["p1", "p2"],
            live("p2", fc()),
        ),
    ];
    for (name, before, deltas, dirty, after) in cases {
        for attribution in LEDGER_USERS {
            assert_eq!(
                run(name, Before::Known(Some(before.clone())), attribution),
                outcome(
                    deltas.clone(),
                    &dirty,
                    After::Known(Some(after.clone())),
                    Source::Ledger,
                    None
                ),
                "{name}"
            );
        }
    }
}

#[test]
fn fake_updates_best_effort() {
    let cases = [
        (
            "fake/update_set_deleted_at",
            vec![delta("p1", fc(), -1)],
            vec!["p1"],
            dead("p1", fc()),
            None,
        ),
        (
            "fake/update_unset_deleted_at",
            vec![delta("p1", fc(), 1)],
            vec!["p1"],
            live("p1", fc()),
            None,
        ),
        (
            "fake/update_set_post_id",
            vec![delta("p2", fc(), 1)],
            vec!["p2"],
            live("p2", fc()),
            unattributable(MOVE_UNATTRIBUTABLE),
        ),
        // Replace reported as an update: no spec, only the post.
        ("fake/replace", vec![], vec!["p2"], live("p2", fc()), None),
    ];
    for (name, deltas, dirty, after, problem) in cases {
        assert_eq!(
            run(name, Before::Unknown, Attribution::BestEffort),
            outcome(
                deltas,
                &dirty,
                After::Known(Some(after)),
                Source::BestEffort,
                problem
            ),
            "{name}"
        );
    }
}

#[test]
fn fake_updates_whose_row_is_gone_say_nothing() {
    for name in [
        "fake/update_set_deleted_at_row_gone",
        "fake/update_unset_deleted_at_row_gone",
    ] {
        for attribution in ALL {
            for before in [
                Before::Unknown,
                Before::Known(None),
                Before::Known(Some(live("p1", fc()))),
            ] {
                assert_eq!(
                    run(name, before, attribution),
                    outcome(vec![], &[], After::Unchanged, Source::BestEffort, None),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn fake_replace_whose_row_is_gone() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "fake/replace_row_gone",
                Before::Known(Some(live("p1", fc()))),
                attribution
            ),
            outcome(vec![], &["p1"], After::Unchanged, Source::Ledger, None)
        );
    }
    // Best effort: the replacement in documentKey names the new post.
    assert_eq!(
        run(
            "fake/replace_row_gone",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(vec![], &["p2"], After::Unchanged, Source::BestEffort, None)
    );
}

#[test]
fn fake_delete() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "fake/delete",
                Before::Known(Some(live("p1", fc()))),
                attribution
            ),
            outcome(
                vec![delta("p1", fc(), -1)],
                &["p1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
    }
    assert_eq!(
        run("fake/delete", Before::Unknown, Attribution::Auto),
        outcome(
            vec![],
            &[],
            After::Known(None),
            Source::BestEffort,
            unattributable(DELETE_UNATTRIBUTABLE)
        )
    );
}
