//! Replaces: in place and onto another post.

use counterd::core::classify::{After, Attribution, Before, Source};

use crate::{c1, dead, delta, live, outcome, run, LEDGER_USERS};

#[test]
fn replace_in_place() {
    let after = After::Known(Some(live("post-1", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "replace",
                Before::Known(Some(live("post-1", c1()))),
                attribution
            ),
            outcome(vec![], &["post-1"], after.clone(), Source::Ledger, None)
        );
        // Replacing a soft-deleted row with one without deleted_at revives it.
        assert_eq!(
            run(
                "replace",
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
        run("replace", Before::Unknown, Attribution::BestEffort),
        outcome(vec![], &["post-1"], after, Source::BestEffort, None)
    );
}

#[test]
fn replace_move() {
    let after = After::Known(Some(live("post-2", c1())));
    for attribution in LEDGER_USERS {
        assert_eq!(
            run(
                "replace_move",
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
    }
    // Best effort: only the new post is known; it is dirtied, nothing is counted.
    assert_eq!(
        run("replace_move", Before::Unknown, Attribution::Auto),
        outcome(vec![], &["post-2"], after, Source::BestEffort, None)
    );
}
