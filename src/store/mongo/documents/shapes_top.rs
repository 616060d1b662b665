//! The stored shapes of the documents still read by hand at their top level, pinned the same
//! way: a counter document and a checkpoint document as counterd writes them, the older and
//! hand-edited variants that still read, and the malformed ones, whose errors name the field.

use super::shapes::at;
use super::*;
use crate::core::num::Num;

fn ts(time: u32) -> Timestamp {
    Timestamp { time, increment: 1 }
}

#[test]
fn a_counter_document_reads_as_stored() {
    let stored = doc! {
        "_id": 7_i64,
        "base_count": 10_i64,
        "base_watermark": 3600_i64,
        "live_delta": 2_i64,
        "live_by_bucket": {"7200": 2_i64},
        "applied_through": "82AB",
        "applied_time": ts(10),
        "folds": 1_i64,
        "count": 12_i64,
        "touched": {"7200": "82AB"},
        "recent": [{"t": "82AA", "c": [5_i32, "c9"]}, {"t": "82AB", "c": null}],
        "last_drift": -1_i64,
        "reconciled_at": at(5_000),
    };
    let counter = CounterDoc {
        post: Some(GroupValue::Int(7)),
        state: CounterState {
            base_count: Num::Int(10),
            base_watermark: 3600,
            live_delta: Num::Int(2),
            buckets: BTreeMap::from([(7200, Num::Int(2))]),
        },
        applied_through: Some("82AB".into()),
        applied_time: Some(ts(10)),
        touched: BTreeMap::from([(7200, "82AB".to_string())]),
        recent: vec![
            Touch::new("82AA", Some(&[5.into(), "c9".into()].map(CommentId::new))),
            Touch::new("82AB", None),
        ],
        folds: 1,
        count: Some(Num::Int(12)),
        last_drift: Some(Num::Int(-1)),
        reconciled_at: Some(at(5_000)),
        writers: BTreeMap::new(),
        shared_writes: 0,
    };
    assert_eq!(counter_from_doc(&stored).unwrap(), counter);
    // A counter several partitions write (per author while partitions divide by post):
    // partition 0 in the document's own fields, partition 2 under `writers.p2`.
    let mut shared = stored.clone();
    shared.remove("recent");
    shared.extend(doc! {
        "shared_writes": 5_i64,
        "writers": {"p2": {"applied_through": "82A0", "applied_time": ts(9), "epoch": 4_i64, "touched": {"0": "82A0"}}},
    });
    let read = counter_from_doc(&shared).unwrap();
    assert_eq!(read.shared_writes, 5);
    assert_eq!(read.applied_through.as_deref(), Some("82AB"));
    assert_eq!(
        read.writers,
        BTreeMap::from([(
            2,
            crate::store::WriterPosition {
                applied_through: Some("82A0".into()),
                applied_time: Some(ts(9)),
                touched: BTreeMap::from([(0, "82A0".to_string())]),
            }
        )])
    );
    // Written before `count`, with the watermark as a date and numbers edited into Int32s.
    let older = doc! {"_id": "p", "base_count": 4_i32, "base_watermark": at(7_200_500), "live_by_bucket": {"0": 1.0}};
    let read = counter_from_doc(&older).unwrap();
    assert_eq!(read.post, Some(GroupValue::Str("p".into())));
    assert_eq!(
        (read.state.base_count, read.state.base_watermark),
        (Num::Int(4), 7_200)
    );
    // A double stays a double: a sum's counter holds one once a double was added.
    assert_eq!(read.state.buckets, BTreeMap::from([(0, Num::Double(1.0))]));
    assert_eq!(
        (read.count, read.folds, read.shown()),
        (None, 0, Num::Int(4))
    );
    for (field, bad) in [
        ("base_count", doc! {"base_count": "x"}),
        ("count", doc! {"count": "1.5"}),
        ("live_delta", doc! {"live_delta": true}),
        ("bucket", doc! {"live_by_bucket": {"later": 1_i64}}),
    ] {
        let err = counter_from_doc(&bad).unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
}

#[test]
fn a_checkpoint_document_reads_as_stored() {
    let deployment = doc! {"replica_set": "rs0"};
    let stored = doc! {
        "_id": "s",
        "token": "82AB",
        "token_time": ts(10),
        "start_time": ts(5),
        "caught_up_at": ts(11),
        "high_water": "82AC",
        "epoch": 3_i64,
        "gaps": [{"from": at(1_000), "to": at(2_000)}, {"to": at(3_000)}],
        "deployment": deployment.clone(),
        "updated_at": at(4_000),
        "sweep_requested": true,
    };
    let checkpoint = Checkpoint {
        stream: "s".into(),
        token: Some(Token("82AB".into())),
        token_time: Some(ts(10)),
        start_time: Some(ts(5)),
        caught_up_at: Some(ts(11)),
        high_water: Some(Token("82AC".into())),
        pending: None,
        epoch: 3,
        deployment: Some(Deployment::from_document(&deployment)),
        updated_at: Some(at(4_000)),
        gaps: vec![
            Gap {
                from: Some(at(1_000)),
                to: at(2_000),
            },
            Gap {
                from: None,
                to: at(3_000),
            },
        ],
        sweep_requested: true,
        snapshot: None,
    };
    assert_eq!(checkpoint_from_doc("s", &stored).unwrap(), checkpoint);
    // A checkpoint `replay --from-time` left, with the epoch edited into an Int32.
    let older = doc! {"_id": "s", "start_time": ts(5), "epoch": 2_i32, "token": null};
    let read = checkpoint_from_doc("s", &older).unwrap();
    assert_eq!(
        (read.token, read.start_time, read.epoch),
        (None, Some(ts(5)), 2)
    );
    assert_eq!((read.gaps, read.sweep_requested), (vec![], false));
    for (field, bad) in [
        ("`token`", doc! {"token": "not hex"}),
        ("`epoch`", doc! {"epoch": 1.5}),
        ("`pending`", doc! {"pending": 3_i64}),
        ("`snapshot`", doc! {"snapshot": "running"}),
        ("`deployment`", doc! {"deployment": 1_i64}),
    ] {
        let err = checkpoint_from_doc("s", &bad).unwrap_err().to_string();
        assert!(err.contains(field) && err.contains("replay"), "{err}");
    }
}
