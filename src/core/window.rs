//! Pure: a row-level recount settled against the stream ("the log wins"), for servers without
//! snapshot reads.
//!
//! # Why not a quiet window
//! The first rule for these servers was a quiet window: count, wait until the worker applied
//! everything the count could have seen, and refuse the count if *any* batch changed one of
//! the post's settled rows meanwhile. Its window was the seconds between the counter's first
//! read and the worker's catch-up (measured in whole batches, on a server clock with
//! one-second resolution), so a post that receives an old-row change every second or two —
//! the busiest posts, which most readers look at — never folded while the load went on.
//!
//! # The rule
//! The count's window is the count itself, made exact row by row:
//!
//! 1. Read the counter: its `applied_through` is `since`.
//! 2. Read the *ids* of the post's live rows below the watermark (the count's own filter).
//! 3. Wait until the worker has applied every event the read could have seen, then re-read the
//!    counter: its `applied_through` is `until`.
//! 4. The counter keeps a short log of the rows each batch changed for its post (the
//!    [`Touch`] entries, one per batch). The rows named in entries after `since` are the only
//!    rows that may have been different at any moment of the read than at `until`: a row no
//!    event touched in `(since, until]` was in the same state during the whole read (whether
//!    the server read it atomically or not), and every event the read could have seen is at
//!    or before `until`.
//! 5. Rows changed in the window take the stream's version — the ledger entry, which the
//!    worker writes with the same batch token — and every other row the read's version:
//!    `count = |read \ changed| + |{changed rows the ledger counts}|`.
//!
//! The result is exactly the count the counter should show at `until`. Nothing is refused
//! because a change was *near* the count; only an unknowable row refuses ([`Unsettled`]): the
//! log no longer reaching back to `since`, a batch with more changed rows than its entry
//! lists, a changed row without a ledger entry of that batch, or one changed again after
//! `until`. A lookup-based update (`updateLookup` may show a row later than its event) does
//! not refuse anything either: the ledger holds the same looked-up state the counter's
//! increments were computed from, so the two agree by construction.

use std::collections::{BTreeMap, HashMap};

use crate::core::event::{CommentId, Row};
use crate::core::key::GroupValue;

/// Entries the counter's log keeps (the newest; older ones are dropped). A recount refuses
/// when the log no longer reaches back to its first read, so this bounds the batches that may
/// touch one post while it is recounted (seconds of a hot post's batches).
pub const LOG_ENTRIES: usize = 64;

/// Rows one entry lists; a batch that changed more rows of one post is recorded as unlisted
/// (a recount spanning it refuses), so one entry stays small.
pub const LOG_COMMENTS: usize = 50;

/// One batch's record, in a counter's log, of the rows it changed for the counter's post.
#[derive(Clone, Debug, PartialEq)]
pub struct Touch {
    /// The batch's end token (the counter's `applied_through` after it).
    pub through: String,
    /// The rows the batch's events named for this post (before or after the event), net-zero
    /// changes and lookups included. `None`: too many to list, or an event without a row id.
    pub comments: Option<Vec<CommentId>>,
}

impl Touch {
    /// The entry a batch ending at `through` records for a post whose rows `comments` changed
    /// (`None`: some change had no row id). Lists of more than [`LOG_COMMENTS`] are not kept.
    pub fn new(through: &str, comments: Option<&[CommentId]>) -> Touch {
        Touch {
            through: through.to_string(),
            comments: comments
                .filter(|c| c.len() <= LOG_COMMENTS)
                .map(<[CommentId]>::to_vec),
        }
    }
}

/// A ledger entry as the recount reads it: the row's state and the batch that wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerAt {
    /// `None`: the row is gone.
    pub state: Option<Row>,
    /// The token of the batch that wrote the entry (`None`: written by the snapshot or a
    /// rebuild, not by a batch).
    pub through: Option<String>,
}

/// Why a row-level recount cannot be settled now (the post stays dirty; the next run tries
/// again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsettled {
    /// The counter's log no longer reaches back to the first read (more than
    /// [`LOG_ENTRIES`] batches touched the post meanwhile), or a batch after it left no entry.
    Truncated,
    /// A batch in the window changed rows of the post that its entry does not list.
    Unlisted,
    /// A row changed in the window has no ledger entry written by a batch.
    Unknown,
    /// The ledger entry of a changed row is older than the batch that last changed it: that
    /// batch's ledger writes have not landed yet.
    LedgerBehind,
    /// A changed row was changed again after the counter's position: its state there is no
    /// longer known.
    LedgerAhead,
}

/// Rows changed for the post in batches after `since` (all of the log when `since` is
/// `None`: there was no counter at the first read), each with the newest batch that changed
/// it. `until` is the counter's `applied_through` now: the log must end with its entry when the
/// counter moved, and reach back to `since`.
pub fn changed_since(
    log: &[Touch],
    since: Option<&str>,
    until: Option<&str>,
) -> Result<BTreeMap<String, (CommentId, String)>, Unsettled> {
    // The counter moved since the first read (`None` sorts first: no counter now never
    // moved; a counter now that was not there at the first read did).
    let moved = until > since;
    if moved && log.last().map(|t| t.through.as_str()) != until {
        return Err(Unsettled::Truncated);
    }
    let reaches_back = log.len() < LOG_ENTRIES
        || since.is_some_and(|s| log.first().is_some_and(|t| t.through.as_str() <= s));
    if !reaches_back {
        return Err(Unsettled::Truncated);
    }
    let mut changed = BTreeMap::new();
    for touch in log
        .iter()
        .filter(|t| since.is_none_or(|s| t.through.as_str() > s))
    {
        let comments = touch.comments.as_ref().ok_or(Unsettled::Unlisted)?;
        for c in comments {
            changed.insert(c.key.clone(), (c.clone(), touch.through.clone()));
        }
    }
    Ok(changed)
}

/// Whether `row` is one of `scope`'s rows: the count's own filter (`created_at` not `>= W`, so
/// a row without a creation date counts below any).
pub fn counts_below(row: &Row, scope: CountScope<'_>) -> bool {
    row.counted_in(scope.counter) == Some(scope.post)
        && row
            .created_at
            .is_none_or(|t| crate::core::time::secs(t) < scope.watermark)
}

/// What a recount counts: the rows that count in definition `counter`'s `post` below
/// `watermark` (seconds).
#[derive(Clone, Copy, Debug)]
pub struct CountScope<'a> {
    pub counter: crate::core::key::CounterIx,
    pub post: &'a GroupValue,
    pub watermark: i64,
}

/// The number of `scope`'s rows as of the counter's position `until`:
/// the rows `read` (ids of live rows below the watermark, read after `since`) that did not
/// change in the window, plus the changed rows whose ledger state counts. `ledger` holds the
/// entries of the changed rows.
pub fn count_as_of(
    read: &[CommentId],
    changed: &BTreeMap<String, (CommentId, String)>,
    ledger: &HashMap<String, LedgerAt>,
    scope: CountScope<'_>,
    until: &str,
) -> Result<i64, Unsettled> {
    let unchanged = read
        .iter()
        .filter(|c| !changed.contains_key(&c.key))
        .count() as i64;
    let mut from_ledger = 0;
    for (key, (_, last)) in changed {
        let entry = ledger.get(key).ok_or(Unsettled::Unknown)?;
        let through = entry.through.as_deref().ok_or(Unsettled::Unknown)?;
        if through < last.as_str() {
            return Err(Unsettled::LedgerBehind);
        }
        if through > until {
            return Err(Unsettled::LedgerAhead);
        }
        if entry
            .state
            .as_ref()
            .is_some_and(|row| counts_below(row, scope))
        {
            from_ledger += 1;
        }
    }
    Ok(unchanged + from_ledger)
}

#[cfg(test)]
mod tests {
    use bson::{Bson, DateTime};

    use super::*;

    fn scope(watermark: i64) -> CountScope<'static> {
        static POST: GroupValue = P;
        CountScope {
            counter: crate::core::key::CounterIx(0),
            post: &POST,
            watermark,
        }
    }

    fn id(n: i32) -> CommentId {
        CommentId::new(Bson::Int32(n))
    }

    fn touch(through: &str, ids: &[i32]) -> Touch {
        Touch {
            through: through.into(),
            comments: Some(ids.iter().map(|n| id(*n)).collect()),
        }
    }

    fn row(post: i64, created: i64, deleted: bool) -> Row {
        Row::of(
            Some(GroupValue::Int(post)),
            Some(DateTime::from_millis(created * 1000)),
            deleted,
        )
    }

    fn at(state: Option<Row>, through: &str) -> LedgerAt {
        LedgerAt {
            state,
            through: Some(through.into()),
        }
    }

    const P: GroupValue = GroupValue::Int(1);

    #[test]
    fn only_batches_after_the_first_read_name_changed_rows_and_the_newest_wins() {
        let log = [touch("05", &[1]), touch("0a", &[2, 3]), touch("0c", &[3])];
        let changed = changed_since(&log, Some("05"), Some("0c")).unwrap();
        assert_eq!(changed.len(), 2, "row 1 changed before the first read");
        assert_eq!(changed[&id(2).key].1, "0a");
        assert_eq!(changed[&id(3).key].1, "0c", "the newest batch of a row");
        // Nothing moved: nothing changed.
        assert!(changed_since(&log, Some("0c"), Some("0c"))
            .unwrap()
            .is_empty());
        // No counter at the first read: the whole log.
        assert_eq!(changed_since(&log, None, Some("0c")).unwrap().len(), 3);
        // No counter at all.
        assert!(changed_since(&[], None, None).unwrap().is_empty());
    }

    #[test]
    fn a_log_that_no_longer_reaches_back_or_misses_the_last_batch_is_truncated() {
        let full: Vec<Touch> = (0..LOG_ENTRIES)
            .map(|i| touch(&format!("{:04x}", i + 16), &[1]))
            .collect();
        let last = full.last().unwrap().through.clone();
        let truncated: [(&[Touch], Option<&str>, &str); 4] = [
            // The oldest entry kept is after the first read: batches in between were dropped.
            (&full, Some("0001"), &last),
            (&full, None, &last),
            // The counter moved but its last batch left no entry (a worker without the log).
            (&[touch("05", &[1])], Some("03"), "07"),
            (&[], None, "07"),
        ];
        for (log, since, until) in truncated {
            let got = changed_since(log, since, Some(until));
            assert_eq!(got, Err(Unsettled::Truncated), "{since:?} to {until}");
        }
        // It reaches back to the first read: fine even when full.
        assert!(changed_since(&full, Some("0010"), Some(&last)).is_ok());
    }

    #[test]
    fn an_unlisted_batch_in_the_window_refuses_and_one_before_it_does_not() {
        let log = [
            Touch::new("05", None),
            touch("0a", &[2]),
            Touch::new("0c", None),
        ];
        assert_eq!(
            changed_since(&log, Some("0a"), Some("0c")),
            Err(Unsettled::Unlisted)
        );
        let log = [Touch::new("05", None), touch("0a", &[2])];
        assert!(changed_since(&log, Some("05"), Some("0a")).is_ok());
        // Too many rows in one batch: not listed.
        let many: Vec<CommentId> = (0..=LOG_COMMENTS as i32).map(id).collect();
        assert_eq!(Touch::new("0a", Some(&many)).comments, None);
        assert_eq!(
            Touch::new("0a", Some(&many[..LOG_COMMENTS]))
                .comments
                .map(|c| c.len()),
            Some(LOG_COMMENTS)
        );
    }

    #[test]
    fn rows_changed_in_the_window_take_the_ledgers_state() {
        // Read: rows 1, 2, 3 live below W. Row 2 was soft-deleted and row 4 undeleted in the
        // window (the read may have seen either state of each); row 3 was edited (still live).
        let read = [id(1), id(2), id(3)];
        let log = [touch("0a", &[2, 4]), touch("0c", &[3])];
        let changed = changed_since(&log, Some("05"), Some("0c")).unwrap();
        let ledger = HashMap::from([
            (id(2).key, at(Some(row(1, 10, true)), "0a")),
            (id(3).key, at(Some(row(1, 10, false)), "0c")),
            (id(4).key, at(Some(row(1, 10, false)), "0a")),
        ]);
        assert_eq!(
            count_as_of(&read, &changed, &ledger, scope(60), "0c"),
            Ok(3)
        );
        // The same with the read taken before row 2's delete and row 4's undelete: the same.
        let read = [id(1), id(3)];
        assert_eq!(
            count_as_of(&read, &changed, &ledger, scope(60), "0c"),
            Ok(3)
        );
    }

    #[test]
    fn moved_gone_and_unsettled_rows_count_by_the_ledger_rule() {
        let changed = changed_since(&[touch("0a", &[1, 2, 3])], Some("05"), Some("0a")).unwrap();
        let ledger = HashMap::from([
            (id(1).key, at(Some(row(2, 10, false)), "0a")), // moved to post 2
            (id(2).key, at(None, "0a")),                    // hard-deleted
            (id(3).key, at(Some(row(1, 90, false)), "0a")), // restamped above W
        ]);
        assert_eq!(
            count_as_of(&[id(1), id(2), id(3)], &changed, &ledger, scope(60), "0a"),
            Ok(0)
        );
        // Above every watermark it counts.
        assert_eq!(count_as_of(&[], &changed, &ledger, scope(120), "0a"), Ok(1));
    }

    #[test]
    fn an_unknown_late_or_early_ledger_entry_refuses() {
        let changed = changed_since(&[touch("0a", &[1])], Some("05"), Some("0a")).unwrap();
        let count = |ledger: &HashMap<String, LedgerAt>| {
            count_as_of(&[id(1)], &changed, ledger, scope(60), "0a")
        };
        assert_eq!(count(&HashMap::new()), Err(Unsettled::Unknown));
        let rebuilt = LedgerAt {
            state: Some(row(1, 10, false)),
            through: None,
        };
        for (entry, refused) in [
            (rebuilt, Unsettled::Unknown),
            (at(Some(row(1, 10, false)), "08"), Unsettled::LedgerBehind),
            (at(Some(row(1, 10, false)), "0b"), Unsettled::LedgerAhead),
        ] {
            let ledger = HashMap::from([(id(1).key, entry)]);
            assert_eq!(count(&ledger), Err(refused), "{ledger:?}");
        }
        // A later batch that touched the row for another post only is fine while it is not
        // after the counter's position.
        let changed = changed_since(&[touch("0a", &[1])], Some("05"), Some("0c")).err();
        assert_eq!(
            changed,
            Some(Unsettled::Truncated),
            "the log must end at 0c"
        );
    }

    #[test]
    fn the_filter_matches_the_counts_filter() {
        assert!(counts_below(&row(1, 59, false), scope(60)));
        assert!(!counts_below(&row(1, 60, false), scope(60)));
        assert!(!counts_below(&row(1, 10, true), scope(60)));
        assert!(!counts_below(&row(2, 10, false), scope(60)));
        let undated = Row {
            created_at: None,
            ..row(1, 0, false)
        };
        assert!(counts_below(&undated, scope(i64::MIN)));
        let millis = Row {
            created_at: Some(DateTime::from_millis(59_999)),
            ..row(1, 0, false)
        };
        assert!(counts_below(&millis, scope(60)));
    }
}
