//! Pure: multi-document transactions in the change stream, and where a read or a batch may end.
//!
//! # Why a batch never ends inside a transaction
//! Every event of one multi-document transaction carries the same `clusterTime` and the same
//! `lsid` + `txnNumber`, and all of them become visible at once, at commit. A stream position
//! *between* two of them is therefore not a cluster time: no snapshot read, no drained
//! position and no watermark describes "half of the transaction applied". The reconciler's
//! snapshot recount counts as of the cluster time of the counter's position
//! (`crate::recount`): at the time `T` of a transaction, that read sees the *whole*
//! transaction. A counter that had applied only its first half would be "corrected" by the
//! second half's changes, and then the worker would apply the second half too: counted twice.
//!
//! So the positions the reconciler folds against must sit at transaction ends. They all come
//! from batch ends (a counter's `applied_through` and `applied_time`, the checkpoint's token
//! and `token_time`) or from drained positions (a cluster time taken before a read that came
//! back empty, which no transaction straddles because a transaction is visible all at once).
//! Hence the one rule: **a batch ends only where [`may_end_between`] allows it**, and it
//! suffices to enforce it on the reads that fill batches ([`takes_next`], used by every
//! `EventSource`) because the worker forms a batch from whole reads (see
//! `crate::worker::session`).
//!
//! # Bounded, and what it costs
//! A read that reaches its limit (events, bytes of the memory budget, or time) inside a
//! transaction goes on to the transaction's end: a transaction is taken whole, even one larger
//! than the limit (the budget is then overdrawn by its excess, as for one oversized event).
//! MongoDB bounds a transaction (16 MB of oplog entries per `applyOps` before 4.2, and in
//! practice the transaction lifetime limit), and an application's transactions over comments
//! are a handful of rows; the alternative — ending the batch *before* the transaction — would
//! never make progress on a transaction larger than the limit.
//!
//! To see a transaction's end a read must look at the event after it: when the last event
//! taken belongs to a transaction, the read takes one more look at the stream even after its
//! limit; an event of another transaction (or of none) is kept for the next read, and "nothing
//! ready" means the transaction is complete (its events became visible together).
//!
//! # The one exception: the high water
//! A batch is also cut at the checkpoint's high water (events at or below it were applied
//! before, and are only marked dirty). A high water inside a transaction can only have been
//! written by a version before this rule, or stem from an operator's `replay` to a token inside
//! one; the cut there keeps exactly what the counters already hold, and every later batch ends
//! at a transaction end again.

use bson::Document;

/// The identity of one multi-document transaction: its session (`lsid`) and the transaction's
/// number within it (`txnNumber`). Events outside a transaction carry neither.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TxnKey {
    /// The `lsid` document (`{id: <UUID>, uid: <SHA-256 of the user>}`) encoded as BSON:
    /// compared byte for byte, so two sessions are one only when every part agrees.
    pub session: Vec<u8>,
    /// `txnNumber`: increases with every transaction of the session.
    pub number: i64,
}

impl TxnKey {
    /// Reads the transaction of a raw change event: `lsid` (a document) and `txnNumber` (an
    /// integer: `NumberLong` on real servers; an `int` is taken too). `None` when either is
    /// missing or malformed: the event is treated as outside any transaction, as every event
    /// of a server or a stream without transactions is.
    pub fn of_event(event: &Document) -> Option<TxnKey> {
        let lsid = event.get_document("lsid").ok()?;
        let number = event.get("txnNumber")?;
        let number = number.as_i64().or(number.as_i32().map(i64::from))?;
        let session = bson::to_vec(lsid).ok()?;
        Some(TxnKey { session, number })
    }
}

/// Whether a read or a batch may end between an event of transaction `before` and the next
/// event, of transaction `after` (`None`: outside any transaction): everywhere except between
/// two events of one transaction.
pub fn may_end_between(before: Option<&TxnKey>, after: Option<&TxnKey>) -> bool {
    !matches!((before, after), (Some(a), Some(b)) if a == b)
}

/// Whether a read takes the next event: while it is within its limit (`within_limit`: count,
/// bytes and time, as the reader measures them), and beyond it while the next event continues
/// the transaction of the last event taken. `last` is `None` before the first event.
pub fn takes_next(within_limit: bool, last: Option<&TxnKey>, next: Option<&TxnKey>) -> bool {
    within_limit || !may_end_between(last, next)
}

/// Whether a read that stopped taking events must still look at the stream for the next one:
/// the last event it took belongs to a transaction, which may go on.
pub fn must_look_further(last: Option<&TxnKey>) -> bool {
    last.is_some()
}

/// The boundaries inside `txns` where a batch could not end: indexes `i` (1..len) where the
/// events `i - 1` and `i` belong to one transaction. For checks and tests.
pub fn inner_boundaries(txns: &[Option<&TxnKey>]) -> Vec<usize> {
    (1..txns.len())
        .filter(|&i| !may_end_between(txns[i - 1], txns[i]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, spec::BinarySubtype, Binary};

    fn key(session: u8, number: i64) -> TxnKey {
        TxnKey {
            session: vec![session],
            number,
        }
    }

    fn lsid(byte: u8) -> Document {
        doc! {
            "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![byte; 16] },
            "uid": Binary { subtype: BinarySubtype::Generic, bytes: vec![7; 32] },
        }
    }

    #[test]
    fn a_transaction_is_read_from_lsid_and_txn_number() {
        let a = TxnKey::of_event(&doc! {"lsid": lsid(1), "txnNumber": 5_i64}).unwrap();
        assert_eq!(a.number, 5);
        let int = TxnKey::of_event(&doc! {"lsid": lsid(1), "txnNumber": 5_i32}).unwrap();
        assert_eq!(a, int, "an int txnNumber is the same number");
        let other_number = TxnKey::of_event(&doc! {"lsid": lsid(1), "txnNumber": 6_i64});
        let other_session = TxnKey::of_event(&doc! {"lsid": lsid(2), "txnNumber": 5_i64});
        assert_ne!(Some(a.clone()), other_number);
        assert_ne!(Some(a), other_session);
    }

    #[test]
    fn an_event_without_both_parts_is_outside_any_transaction() {
        for event in [
            doc! {},
            doc! {"lsid": lsid(1)},
            doc! {"txnNumber": 5_i64},
            doc! {"lsid": "x", "txnNumber": 5_i64},
            doc! {"lsid": lsid(1), "txnNumber": 5.0},
        ] {
            assert_eq!(TxnKey::of_event(&event), None, "{event}");
        }
    }

    #[test]
    fn only_two_events_of_one_transaction_hold_a_batch_together() {
        let (a, a2, b) = (key(1, 1), key(1, 2), key(2, 1));
        // Every combination of "none", one transaction, the next one of its session, another
        // session's: only (a, a) may not be split.
        let all = [None, Some(&a), Some(&a2), Some(&b)];
        for before in all {
            for after in all {
                let same = before.is_some() && before == after;
                assert_eq!(
                    may_end_between(before, after),
                    !same,
                    "{before:?} | {after:?}"
                );
            }
        }
    }

    #[test]
    fn a_read_goes_beyond_its_limit_only_to_finish_a_transaction() {
        let (a, b) = (key(1, 1), key(2, 1));
        for within in [true, false] {
            for (last, next) in [
                (None, None),
                (None, Some(&a)),
                (Some(&a), None),
                (Some(&a), Some(&b)),
                (Some(&a), Some(&a)),
            ] {
                let continues = last.is_some() && last == next;
                assert_eq!(
                    takes_next(within, last, next),
                    within || continues,
                    "{within} {last:?} {next:?}"
                );
            }
        }
        assert!(must_look_further(Some(&a)));
        assert!(!must_look_further(None));
    }

    #[test]
    fn the_boundaries_inside_transactions_are_found() {
        let (a, b) = (key(1, 1), key(2, 1));
        // events: x a a a y b b
        let txns = [None, Some(&a), Some(&a), Some(&a), None, Some(&b), Some(&b)];
        assert_eq!(inner_boundaries(&txns), [2, 3, 6]);
        // Two transactions back to back: the boundary between them is free.
        let back = [Some(&a), Some(&a), Some(&b), Some(&b)];
        assert_eq!(inner_boundaries(&back), [1, 3]);
        assert_eq!(inner_boundaries(&[]), Vec::<usize>::new());
        assert_eq!(inner_boundaries(&[None, None]), Vec::<usize>::new());
    }
}
