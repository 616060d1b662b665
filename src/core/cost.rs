//! Pure: what a buffer is charged, and the budget a process gets by default.
//!
//! An event read is held three times over before its batch's checkpoint: as the decoded
//! document, as the parsed event, and as its share of the batch's plan (counter increments,
//! the ledger entry it reads and the one it writes, its dirty mark, the intent that records the
//! plan, the statements that write it). The charge is therefore its encoded size times
//! [`DECODED_FACTOR`] (a decoded BSON document, with its map and strings, is several times its
//! encoded bytes) plus [`EVENT_STATE`], the per-event state that does not depend on the event's
//! size. Both were calibrated with the benchmark's memory phase (peak RSS against the number of
//! events in flight): RSS grows by about the charge per event, so a budget of B bytes keeps the
//! process within about its idle size plus B, whatever the backlog and whatever the
//! application's documents (the stream's `$project` keeps an event's size independent of them).

/// Bytes of decoded and parsed state per encoded byte of an event.
pub const DECODED_FACTOR: usize = 3;

/// counterd's own per-event state while its batch is in flight, beside the event itself.
pub const EVENT_STATE: usize = 2048;

/// A snapshot row or a recounted row (a comment id and what counting reads of it, read with
/// the schema's projection), decoded and held.
pub const ROW_COST: usize = 512;

/// The largest event the budget must hold at least one of: a projected event is a few hundred
/// bytes; its group value or shard key could be longer, up to this.
pub const LARGEST_EVENT: usize = 16 * 1024;

/// Events per server reply (the driver's `batchSize`). A reply is decoded whole by the driver
/// before counterd reads an event of it, so [`REPLY_RESERVE`] sets it aside. The stream is read
/// ahead of the worker (`store::mongo::pump`), so the round trip of the next reply is no longer
/// waited for between batches, and a smaller reply leaves room in the same reserve for the
/// events read ahead. Before the read ahead, 4 000 (with 2 MiB) took the benchmark's catch-up of
/// 100 000 events to 10.8-11.2 s, against 11.8-12.7 s with 1 000 and 1 MiB, and 12.2-12.6 s with
/// 1 000 and 2 MiB, 3 000 and 1 MiB, 8 000 and 4 MiB (whose reserve takes budget from the
/// batches and the carry); with it, 2 000 and a queue of the rest of the same 2 MiB were as
/// fast as or faster than 4 000 without (bench/RESULTS.md, 2026-12-05, afternoon).
pub const EVENTS_PER_REPLY: u32 = 2000;

/// What an open stream holds of the budget for as long as it is open: the reply the driver holds
/// while it decodes it (a reply of projected events, about 270 bytes each: its message and the
/// events taken out of it, twice what [`EVENTS_PER_REPLY`] of them take, about 1.1 MB) and the
/// events read ahead of the worker, still raw, in the stream's queue ([`STREAM_QUEUE`]).
pub const REPLY_RESERVE: usize = 2 * 1024 * 1024;

/// What the events a stream has taken from the driver and not yet handed to the worker may hold:
/// their encoded bytes and [`QUEUED_EVENT`] each (about 2 900 projected events), so that the
/// driver asks the server for the next reply while the worker still takes the last one's.
pub const STREAM_QUEUE: usize = 960 * 1024;

/// What an event waiting in a stream's queue holds beside its encoded bytes (its buffer's
/// header and allocation, and its slot in the queue).
pub const QUEUED_EVENT: usize = 64;

/// The budget without a container limit: fits the shipped manifests (limit 96 MiB, of which an
/// idle `counterd run` holds about 26).
pub const DEFAULT_BUDGET: usize = 16 * 1024 * 1024;

/// The part of a container's limit that is not the budget: the idle process (runtime, driver,
/// HTTP, allocator) and headroom for what is estimated rather than counted.
pub const OUTSIDE_BUDGET: u64 = 40 * 1024 * 1024;

/// The charge of an event whose encoded document has `encoded` bytes.
pub fn event_cost(encoded: usize) -> usize {
    encoded
        .saturating_mul(DECODED_FACTOR)
        .saturating_add(EVENT_STATE)
}

/// The charge of an event already decoded (the in-process stores): its encoded size is
/// computed by encoding it.
pub fn document_cost(doc: &bson::Document) -> usize {
    event_cost(bson::to_vec(doc).map_or(0, |bytes| bytes.len()))
}

/// The smallest budget for `streams` open streams (one per partition a process works on):
/// each stream's reply reserve, and room for one event of [`LARGEST_EVENT`] bytes. (Below it, a
/// worker could wait for room that never frees.)
pub fn min_budget(streams: usize) -> usize {
    streams.max(1) * REPLY_RESERVE + event_cost(LARGEST_EVENT)
}

/// A recounted row's id as a row-level recount holds it from its read until it settles (the
/// id's key text and value; see [`crate::core::window`]).
pub const ROW_ID_COST: usize = 128;

/// Whole rows (an id and what counting reads of it: [`ROW_COST`]) that fit where `ids` row ids
/// do: the ledger rebuild after lost history holds rows in the recounts' share. At least one.
pub fn rows_for_ids(ids: usize) -> usize {
    (ids.saturating_mul(ROW_ID_COST) / ROW_COST).max(1)
}

/// The part of a budget of `budget` bytes set aside for row-level recounts' reads: an eighth,
/// and never what the `streams` streams' minimum needs. A recount holds its reads while it
/// waits for the worker, so its share is set aside once rather than taken from what is free:
/// a worker waiting for room then never waits for a recount that waits for it.
pub fn recount_share(budget: usize, streams: usize) -> usize {
    (budget / 8).min(budget.saturating_sub(min_budget(streams)))
}

/// Row ids one stream's recounts may hold at once, from its part of [`recount_share`]. A post
/// with more live rows is recounted by count alone, which holds only when nothing changed its
/// rows meanwhile (see `crate::recount`).
pub fn recount_rows(budget: usize, streams: usize) -> usize {
    recount_share(budget, streams) / streams.max(1) / ROW_ID_COST
}

/// The budget for a container limit (`None`: no limit): what the limit leaves beside the idle
/// process, half of it so that estimates and allocator slack stay inside the limit, and never
/// less than the minimum for `streams` streams.
pub fn budget_for_limit(limit: Option<u64>, streams: usize) -> usize {
    let usable = |limit: u64| limit.saturating_sub(OUTSIDE_BUDGET) / 2;
    let budget = limit.map_or(DEFAULT_BUDGET, |l| usable(l).min(u32::MAX as u64) as usize);
    budget.max(min_budget(streams))
}

/// What the budget leaves to events in flight: the reply reserve is set aside.
pub fn for_events(budget: usize) -> usize {
    budget.saturating_sub(REPLY_RESERVE)
}

/// What one read of the stream may take: a quarter of what the budget leaves to events, so
/// that the batch being written, the next one, read ahead meanwhile, and the counters carried
/// across batches ([`carry_share`]) fit together.
pub fn read_share(budget: usize) -> usize {
    for_events(budget) / 4
}

/// What the counters carried across batches may hold (see `crate::core::carry`): half of what the
/// budget leaves to events. Carried counters cover more events per write the more of them are
/// held, while a batch's own size matters little to that once its counters are carried.
pub fn carry_share(budget: usize) -> usize {
    for_events(budget) / 2
}

/// One counter carried across batches, merged: its key, increments, buckets and dirty mark
/// (see `crate::core::carry`). Measured with a counting allocator: 20 000 carried counters of one
/// entry each held 368 B per counter in all (this, the entry and its id), charged 357.
pub const CARRIED_COUNTER: usize = 288;

/// One entry of a carried counter's log, beside the raw bytes of the row ids it lists.
pub const CARRIED_TOUCH: usize = 48;

/// The least a reader that holds nothing waits for: one event of a typical projected size
/// (a larger one is still read, see [`ReadLimit::at_least_one`]).
pub const MIN_READ: usize = 1024 * DECODED_FACTOR + EVENT_STATE;

/// Whether a read that returned `got` events costing `bytes` within `limit` was cut by the
/// bytes rather than by the count or by the events ready: less room was left than an average
/// event of it takes. Such a read counts as full: the worker is behind.
pub fn cut_by_bytes(limit: &ReadLimit, got: usize, bytes: usize) -> bool {
    got > 0 && got < limit.events && limit.bytes.saturating_sub(bytes) < bytes / got
}

/// How much one read of the change stream may return: events by count and by their charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimit {
    pub events: usize,
    /// The sum of the returned events' [`event_cost`]s at most.
    pub bytes: usize,
    /// Return the first event even when it alone is over `bytes` (a reader holding nothing
    /// else must always get on; see `crate::budget`).
    pub at_least_one: bool,
}

impl ReadLimit {
    /// A limit by count only.
    pub fn events(events: usize) -> ReadLimit {
        ReadLimit {
            events,
            bytes: usize::MAX,
            at_least_one: true,
        }
    }

    /// Whether one more event costing `cost` fits after `taken` events costing `bytes`.
    pub fn fits(&self, taken: usize, bytes: usize, cost: usize) -> bool {
        taken < self.events
            && (bytes.saturating_add(cost) <= self.bytes || (taken == 0 && self.at_least_one))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_cut_by_count_and_by_bytes() {
        let limit = ReadLimit {
            events: 3,
            bytes: 100,
            at_least_one: false,
        };
        assert!(limit.fits(0, 0, 100));
        assert!(!limit.fits(0, 0, 101), "over the bytes");
        assert!(limit.fits(2, 60, 40));
        assert!(!limit.fits(3, 0, 1), "over the count");
        let first = ReadLimit {
            at_least_one: true,
            ..limit
        };
        assert!(first.fits(0, 0, 1000), "the first event always");
        assert!(!first.fits(1, 1000, 1), "but only the first");
        assert!(ReadLimit::events(5).fits(4, usize::MAX - 1, 10));
    }

    #[test]
    fn a_read_that_used_its_bytes_up_counts_as_cut() {
        let limit = ReadLimit {
            events: 100,
            bytes: 10_000,
            at_least_one: true,
        };
        for (taken, bytes, cut, why) in [
            (9, 9_900, true, "room for less than one more"),
            (5, 5_000, false, "room for five more: the stream ran dry"),
            (0, 0, false, "nothing read"),
            (100, 10_000, false, "full by count, not cut"),
        ] {
            assert_eq!(cut_by_bytes(&limit, taken, bytes), cut, "{why}");
        }
        assert_eq!(read_share(REPLY_RESERVE + 1000), 250);
        assert_eq!(carry_share(REPLY_RESERVE + 1000), 500);
    }

    #[test]
    fn an_event_costs_its_decoded_size_and_the_per_event_state() {
        assert_eq!(event_cost(0), EVENT_STATE);
        assert_eq!(event_cost(300), 300 * DECODED_FACTOR + EVENT_STATE);
        assert_eq!(event_cost(usize::MAX), usize::MAX, "saturates");
    }

    #[test]
    fn the_budget_follows_the_container_limit() {
        assert_eq!(budget_for_limit(None, 1), DEFAULT_BUDGET);
        // The shipped manifest's limit: (96 - 40) / 2 = 28 MiB.
        assert_eq!(budget_for_limit(Some(96 << 20), 1), 28 << 20);
        assert_eq!(
            budget_for_limit(Some(1 << 30), 1),
            ((1 << 30) - (40 << 20)) / 2
        );
        // A tiny limit still gets the minimum (the process may not fit, but then the kernel
        // says so, rather than a worker waiting for room that never frees).
        assert_eq!(budget_for_limit(Some(10 << 20), 1), min_budget(1));
        assert_eq!(budget_for_limit(None, 64), min_budget(64));
        assert!(DEFAULT_BUDGET >= min_budget(4));
        assert_eq!(min_budget(0), min_budget(1));
    }

    #[test]
    fn recounts_get_an_eighth_of_the_budget_but_never_the_streams_minimum() {
        assert_eq!(recount_share(DEFAULT_BUDGET, 1), DEFAULT_BUDGET / 8);
        assert_eq!(
            recount_rows(DEFAULT_BUDGET, 1),
            DEFAULT_BUDGET / 8 / ROW_ID_COST
        );
        assert_eq!(
            recount_rows(DEFAULT_BUDGET, 2),
            DEFAULT_BUDGET / 16 / ROW_ID_COST
        );
        assert_eq!(
            recount_share(min_budget(1), 1),
            0,
            "the minimum is the streams'"
        );
        assert_eq!(recount_share(min_budget(2) + 100, 2), 100);
        assert_eq!(recount_rows(0, 0), 0);
    }

    #[test]
    fn the_ledger_rebuild_holds_as_many_rows_as_the_recount_share_holds_ids() {
        // The default budget's share for one stream: 16 384 ids of 128 B, 4 096 rows of 512 B.
        let ids = recount_rows(DEFAULT_BUDGET, 1);
        assert_eq!(ids, 16_384);
        assert_eq!(rows_for_ids(ids), 4_096);
        assert_eq!(rows_for_ids(ids) * ROW_COST, ids * ROW_ID_COST);
        // A share too small for one row still reads one post at a time.
        assert_eq!(rows_for_ids(0), 1);
        assert_eq!(rows_for_ids(3), 1);
        assert_eq!(rows_for_ids(usize::MAX), usize::MAX / ROW_COST);
    }

    #[test]
    fn the_reply_reserve_is_set_aside() {
        assert_eq!(for_events(REPLY_RESERVE + 10), 10);
        assert_eq!(for_events(1), 0);
    }

    #[test]
    fn the_reply_reserve_holds_a_reply_being_decoded_and_the_queue() {
        // A projected event is about 270 bytes; a reply is held twice while it is decoded.
        let reply = EVENTS_PER_REPLY as usize * 270 * 2;
        assert!(
            reply + STREAM_QUEUE <= REPLY_RESERVE,
            "{reply} + {STREAM_QUEUE} > {REPLY_RESERVE}"
        );
    }
}
