//! Hard deletes: with a pre-image, from the ledger, and on a collection sharded on `post_id`.

use counterd::core::classify::{After, Attribution, Before, Classification, Source};

use crate::{
    c1, dead, delta, live, outcome, run, unattributable, ALL, DELETE_UNATTRIBUTABLE, LEDGER_USERS,
};

#[test]
fn hard_delete_with_pre_image() {
    let exact = outcome(
        vec![delta("post-1", c1(), -1)],
        &["post-1"],
        After::Known(None),
        Source::PreImage,
        None,
    );
    for attribution in [Attribution::Auto, Attribution::PreImage] {
        for before in [Before::Unknown, Before::Known(Some(dead("post-1", c1())))] {
            assert_eq!(
                run("hard_delete_with_pre_image", before, attribution),
                exact
            );
        }
    }
    assert_eq!(
        run(
            "hard_delete_with_pre_image",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Ledger
        ),
        Classification {
            source: Source::Ledger,
            ..exact
        }
    );
    for attribution in [Attribution::Ledger, Attribution::BestEffort] {
        assert_eq!(
            run("hard_delete_with_pre_image", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Known(None),
                Source::BestEffort,
                unattributable(DELETE_UNATTRIBUTABLE)
            )
        );
    }
}

#[test]
fn hard_delete_from_the_ledger() {
    for name in [
        "hard_delete_without_pre_image",
        "hard_delete_pre_image_expired",
    ] {
        for attribution in LEDGER_USERS {
            assert_eq!(
                run(name, Before::Known(Some(live("post-1", c1()))), attribution),
                outcome(
                    vec![delta("post-1", c1(), -1)],
                    &["post-1"],
                    After::Known(None),
                    Source::Ledger,
                    None
                ),
                "{name}"
            );
            assert_eq!(
                run(name, Before::Known(Some(dead("post-1", c1()))), attribution),
                outcome(
                    vec![],
                    &["post-1"],
                    After::Known(None),
                    Source::Ledger,
                    None
                )
            );
            // Already gone (replay).
            assert_eq!(
                run(name, Before::Known(None), attribution),
                outcome(vec![], &[], After::Known(None), Source::Ledger, None)
            );
        }
        // Nothing known and no shard key.
        for (before, attribution) in [
            (Before::Unknown, Attribution::Auto),
            (Before::Unknown, Attribution::Ledger),
            (
                Before::Known(Some(live("post-1", c1()))),
                Attribution::PreImage,
            ),
            (
                Before::Known(Some(live("post-1", c1()))),
                Attribution::BestEffort,
            ),
        ] {
            assert_eq!(
                run(name, before, attribution),
                outcome(
                    vec![],
                    &[],
                    After::Known(None),
                    Source::BestEffort,
                    unattributable(DELETE_UNATTRIBUTABLE)
                ),
                "{name} {attribution:?}"
            );
        }
    }
}

#[test]
fn hard_delete_sharded_on_post_id() {
    // Best effort: the shard key names the post; the row's bucket is unknown (bucket 0).
    for attribution in ALL {
        assert_eq!(
            run("hard_delete_sharded", Before::Unknown, attribution),
            outcome(
                vec![delta("post-1", None, -1)],
                &["post-1"],
                After::Known(None),
                Source::BestEffort,
                None
            )
        );
    }
    // The ledger is exact: a soft-deleted row's hard delete changes no count.
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "hard_delete_sharded",
                Before::Known(Some(dead("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![],
                &["post-1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
        assert_eq!(
            run(
                "hard_delete_sharded",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(
                vec![delta("post-1", c1(), -1)],
                &["post-1"],
                After::Known(None),
                Source::Ledger,
                None
            )
        );
    }
}
