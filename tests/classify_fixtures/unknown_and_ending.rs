//! Unknown operations (reported) and stream-ending ones (`drop`, `rename`, `invalidate`...).

use counterd::core::classify::{
    classify, After, Attribution, Before, Malformed, Source, StreamEnded,
};
use counterd::core::schema::Schema;

use crate::{bad, c1, event, live, outcome, run, ALL};

#[test]
fn unknown_operations_are_reported() {
    for attribution in ALL {
        assert_eq!(
            run("unknown_operation", Before::Unknown, attribution),
            outcome(
                vec![],
                &[],
                After::Unchanged,
                Source::BestEffort,
                bad(Malformed::UnknownOperation("createIndexes".into()))
            )
        );
    }
    // A future operation on a known comment dirties its post.
    assert_eq!(
        run(
            "unknown_operation_future_op",
            Before::Known(Some(live("post-1", c1()))),
            Attribution::Auto
        ),
        outcome(
            vec![],
            &["post-1"],
            After::Unchanged,
            Source::Ledger,
            bad(Malformed::UnknownOperation("futureOp".into()))
        )
    );
}

#[test]
fn stream_ending_events_stop_the_stream() {
    for (name, operation) in [
        ("drop", "drop"),
        ("rename", "rename"),
        ("invalidate", "invalidate"),
        ("drop_database", "dropDatabase"),
        ("fake/drop", "drop"),
    ] {
        let ev = event(name);
        for attribution in ALL {
            for before in [
                Before::Unknown,
                Before::Known(None),
                Before::Known(Some(live("post-1", c1()))),
            ] {
                assert_eq!(
                    classify(&ev, before, attribution, &Schema::default()),
                    Err(StreamEnded {
                        token: ev.token.clone(),
                        operation: operation.to_string(),
                        at: ev.cluster_time,
                    }),
                    "{name}"
                );
            }
        }
        let message = classify(&ev, Before::Unknown, Attribution::Auto, &Schema::default())
            .unwrap_err()
            .to_string();
        assert!(message.contains(operation), "{message}");
        if let Some(at) = ev.cluster_time {
            // The recovery names the second after the event to replay from.
            let from = chrono::DateTime::from_timestamp(at.time as i64 + 1, 0)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            assert!(
                message.contains(&format!("counterd replay --from-time {from}")),
                "{message}"
            );
        }
    }
}
