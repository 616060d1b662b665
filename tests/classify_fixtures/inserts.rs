//! Inserts: live, soft-deleted, and with a `post_id` of an unsupported type.

use counterd::core::classify::{After, Before, Malformed, Source};
use counterd::core::event::Row;

use crate::{
    bad, c1, c2, dead, delta, event, live, oid_key, outcome, run, unsupported_post_type, ALL, C2,
};

#[test]
fn insert_live_counts_whatever_the_ledger_says() {
    for attribution in ALL {
        for before in [
            Before::Unknown,
            Before::Known(None),
            Before::Known(Some(live("post-1", c1()))),
            Before::Known(Some(dead("post-9", None))),
        ] {
            assert_eq!(
                run("insert_live", before.clone(), attribution),
                outcome(
                    vec![delta("post-1", c1(), 1)],
                    &["post-1"],
                    After::Known(Some(live("post-1", c1()))),
                    Source::Insert,
                    None,
                ),
                "{attribution:?} {before:?}"
            );
        }
    }
}

#[test]
fn insert_soft_deleted_counts_nothing_but_dirties() {
    for attribution in ALL {
        assert_eq!(
            run("insert_soft_deleted", Before::Unknown, attribution),
            outcome(
                vec![],
                &["post-1"],
                After::Known(Some(dead("post-1", c2()))),
                Source::Insert,
                None,
            )
        );
    }
    assert_eq!(
        event("insert_soft_deleted").comment.unwrap().key,
        oid_key(C2)
    );
}

#[test]
fn insert_with_bad_post_id_is_reported_not_counted() {
    for attribution in ALL {
        for (name, problem) in [
            (
                "insert_missing_post_id",
                Malformed::NoPost {
                    field: "post_id".into(),
                },
            ),
            ("insert_post_id_wrong_type", unsupported_post_type("Array")),
            ("insert_post_id_double", unsupported_post_type("Double")),
        ] {
            // The row exists but does not count: the ledger knows it, so a later fix of its
            // post id is counted exactly.
            let row = Row::of(None, c1(), false);
            assert_eq!(
                run(name, Before::Unknown, attribution),
                outcome(
                    vec![],
                    &[],
                    After::Known(Some(row)),
                    Source::Insert,
                    bad(problem)
                ),
                "{name} {attribution:?}"
            );
        }
    }
}
