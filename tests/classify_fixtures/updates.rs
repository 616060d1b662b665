//! Updates: soft delete, undelete, restamp, moves, `post_id` removed, with and without update
//! descriptions, lookups and pre-images.

use counterd::core::classify::{After, Attribution, Before, Classification, Source};

use crate::{
    c1, dead, delta, live, outcome, run, unattributable, unposted, ALL, LEDGER_USERS,
    MOVE_UNATTRIBUTABLE, UPDATE_UNATTRIBUTABLE,
};

#[test]
fn soft_delete_from_the_ledger() {
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "soft_delete",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
        // Replayed: the ledger already holds the deleted state.
        assert_eq!(
            run(
                "soft_delete",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
        // Ledger says the row did not count before (no row): nothing to subtract.
        assert_eq!(
            run("soft_delete", Before::Known(None), attribution),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
}

#[test]
fn soft_delete_best_effort() {
    let expected = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        After::Known(Some(dead("post-1", c1()))),
        Source::BestEffort,
        None,
    );
    // No ledger entry, or the ledger is not to be used.
    for (before, attribution) in [
        (Before::Unknown, Attribution::Auto),
        (Before::Unknown, Attribution::Ledger),
        (
            Before::Known(Some(live("post-1", c1()))),
            Attribution::PreImage,
        ),
        (
            Before::Known(Some(dead("post-1", c1()))),
            Attribution::BestEffort,
        ),
    ] {
        assert_eq!(
            run("soft_delete", before, attribution),
            expected,
            "{attribution:?}"
        );
    }
}

#[test]
fn undelete() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "undelete",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), 1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    assert_eq!(
        run("undelete", Before::Unknown, Attribution::Auto),
        outcome(
            vec![delta("post-1", c1(), 1)],
            &["post-1"],
            after,
            Source::BestEffort,
            None
        )
    );
}

#[test]
fn restamp_deleted_at() {
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "restamp_deleted_at",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
    // Best effort guesses a delete of a live row: a documented drift source (the post is dirty,
    // the reconciler corrects it).
    assert_eq!(
        run(
            "restamp_deleted_at",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(
            vec![delta("post-1", c1(), -1)],
            &["post-1"],
            after,
            Source::BestEffort,
            None
        )
    );
}

#[test]
fn move_post() {
    let after = After::Known(Some(live("post-2", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "move_post",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1), delta("post-2", c1(), 1)],
                &["post-1", "post-2"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
        // A soft-deleted row moved: counts nowhere before or after, both posts touched.
        assert_eq!(
            run(
                "move_post",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1", "post-2"],
                After::Known(Some(dead("post-2", c1()))),
                Source::Ledger,
                None
            ),
            "the after-state is derived at event time from the update description, not the lookup"
        );
    }
    assert_eq!(
        run("move_post", Before::Unknown, Attribution::Auto),
        outcome(
            vec![delta("post-2", c1(), 1)],
            &["post-2"],
            after,
            Source::BestEffort,
            unattributable(MOVE_UNATTRIBUTABLE)
        )
    );
}

#[test]
fn move_post_with_pre_image() {
    let exact = outcome(
        vec![delta("post-1", c1(), -1), delta("post-2", c1(), 1)],
        &["post-1", "post-2"],
        After::Known(Some(live("post-2", c1()))),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        assert_eq!(
            run("move_post_with_pre_image", Before::Unknown, attribution),
            exact
        );
        // The pre-image wins over a (stale) ledger entry.
        assert_eq!(
            run(
                "move_post_with_pre_image",
                Before::Known(Some(dead("post-3", None))),
                attribution
            ),
            exact
        );
    }
    // Ledger-only attribution ignores the pre-image.
    assert_eq!(
        run(
            "move_post_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Ledger
        ),
        Classification {
            source: Source::Ledger,
            ..exact
        }
    );
}

#[test]
fn update_body_only_changes_nothing() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_body_only",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
    }
    assert_eq!(
        run("update_body_only", Before::Unknown, Attribution::BestEffort),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn update_unset_post_id_best_effort_is_unattributable() {
    assert_eq!(
        run(
            "update_unset_post_id",
            Before::Unknown,
            Attribution::BestEffort
        ),
        outcome(
            vec![],
            &[],
            After::Known(Some(unposted(c1(), false))),
            Source::BestEffort,
            unattributable(UPDATE_UNATTRIBUTABLE)
        )
    );
}

/// The row loses its `post_id`: it stopped counting, but it still exists, and the ledger keeps
/// its other fields (a later update that gives it a post back is then derived exactly).
#[test]
fn update_unset_post_id_from_the_ledger() {
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_unset_post_id",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(Some(unposted(c1(), false))),
                Source::Ledger,
                None
            )
        );
    }
}

/// A row the ledger knows without a post, updated while its pre-image has expired: the
/// after-state is derived from the ledger's fields and the update description at event time,
/// never taken from the later `updateLookup` document (which here shows the row back on
/// post-2, live, or soft-deleted again).
#[test]
fn update_of_an_unposted_row_without_pre_image_is_derived_from_the_ledger() {
    for attribution in LEDGER_USERS {
        // A soft delete: still not counted.
        assert_eq!(
            run(
                "update_unposted_pre_image_expired",
                Before::Known(Some(unposted(c1(), false))),
                attribution
            ),
            outcome(
                vec![],
                &[],
                After::Known(Some(unposted(c1(), true))),
                Source::Ledger,
                None
            )
        );
        // It gets a post: counted there, under its own creation time.
        assert_eq!(
            run(
                "update_set_post_id_pre_image_expired",
                Before::Known(Some(unposted(c1(), false))),
                attribution
            ),
            outcome(
                vec![delta("post-2", c1(), 1)],
                &["post-2"],
                After::Known(Some(live("post-2", c1()))),
                Source::Ledger,
                None
            )
        );
    }
}

#[test]
fn update_without_update_description() {
    // A server that sends no updateDescription, only the looked-up row.
    let after = After::Known(Some(dead("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_no_update_description_lookup",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::Ledger,
                None
            )
        );
    }
    // Best effort: the post is known, the change is not.
    assert_eq!(
        run(
            "update_no_update_description_lookup",
            Before::Unknown,
            Attribution::Auto
        ),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn update_whose_lookup_is_null() {
    // The row was deleted before the lookup, but the update description and a known
    // before-state still give the exact after-state at event time.
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "update_lookup_null",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(Some(dead("post-1", c1()))),
                Source::Ledger,
                None
            )
        );
        assert_eq!(
            run(
                "update_lookup_null",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1"],
                After::Known(Some(dead("post-1", c1()))),
                Source::Ledger,
                None
            )
        );
        // The ledger says the row does not exist: nothing to derive from, and no lookup.
        assert_eq!(
            run("update_lookup_null", Before::Known(None), attribution),
            outcome(vec![], &[], After::Unchanged, Source::Ledger, None)
        );
    }
    for attribution in ALL {
        assert_eq!(
            run("update_lookup_null", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Unchanged,
                Source::BestEffort,
                unattributable(UPDATE_UNATTRIBUTABLE)
            )
        );
    }
}

#[test]
fn update_with_pre_image() {
    let after = After::Known(Some(dead("post-1", c1())));
    let exact = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        after.clone(),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        for before in [
            Before::Unknown,
            Before::Known(Some(dead("post-1", c1()))),
            Before::Known(None),
        ] {
            assert_eq!(
                run("update_with_pre_image", before, attribution),
                exact,
                "{attribution:?}"
            );
        }
    }
    // Ledger-only: the (here: already applied) ledger entry decides.
    assert_eq!(
        run(
            "update_with_pre_image",
            Before::Known(Some(dead("post-1", c1()))),
            Attribution::Ledger
        ),
        outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
    );
    assert_eq!(
        run(
            "update_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::BestEffort
        ),
        Classification {
            source: Source::BestEffort,
            ..exact
        }
    );
}

#[test]
fn update_whose_pre_image_expired() {
    let after = After::Known(Some(dead("post-1", c1())));
    // Auto falls back to the ledger.
    assert_eq!(
        run(
            "update_pre_image_expired",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Auto
        ),
        outcome(
            vec![delta("post-1", c1(), -1)],
            &["post-1"],
            after.clone(),
            Source::Ledger,
            None
        )
    );
    // Pre-images only: falls back to best effort, ledger or not.
    for before in [Before::Unknown, Before::Known(Some(dead("post-1", c1())))] {
        assert_eq!(
            run("update_pre_image_expired", before, Attribution::PreImage),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                after.clone(),
                Source::BestEffort,
                None
            )
        );
    }
}
