//! Time conversions and bucket arithmetic in one place. counterd keeps times as whole seconds
//! since the epoch (`i64`) wherever it computes with them; these helpers convert from the bson
//! types the stream and the store hand over, and file seconds under creation-time buckets.

use bson::{DateTime, Timestamp};

/// Seconds since the epoch at which a creation-time bucket starts.
pub type BucketStart = i64;

/// Seconds since the epoch of a date (floored).
pub fn secs(at: DateTime) -> i64 {
    at.timestamp_millis().div_euclid(1000)
}

/// The date `span` after `at` (a lease's expiry, when the next snapshot chunk is due).
pub fn later(at: DateTime, span: std::time::Duration) -> DateTime {
    DateTime::from_millis(at.timestamp_millis() + span.as_millis() as i64)
}

/// The cluster time at the start of `at`'s second (clamped into a cluster time's range): a
/// stream position taken from a date.
pub fn cluster_second(at: DateTime) -> Timestamp {
    let time = secs(at).clamp(0, u32::MAX as i64) as u32;
    Timestamp { time, increment: 0 }
}

/// Whole seconds since the epoch as RFC 3339 (UTC, `Z`), for messages; the number itself
/// where it is out of range.
pub fn seconds_rfc3339(secs: i64) -> String {
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| secs.to_string())
}

/// The start of the bucket of width `width_secs` that holds the second `at`.
pub fn bucket_start(at: i64, width_secs: i64) -> BucketStart {
    at.div_euclid(width_secs) * width_secs
}

/// Files a row's creation time under the start of its bucket. Rows without a `created_at` date
/// go to bucket 0, below every watermark, matching the reconciler's count (`created_at` not
/// `>= W`).
pub fn bucket_of(created_at: Option<DateTime>, width_secs: i64) -> BucketStart {
    created_at.map_or(0, |t| bucket_start(secs(t), width_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_floor_also_before_the_epoch() {
        assert_eq!(bucket_start(119, 60), 60);
        assert_eq!(bucket_start(-1, 60), -60);
        assert_eq!(secs(DateTime::from_millis(-1)), -1);
        assert_eq!(bucket_of(Some(DateTime::from_millis(61_500)), 60), 60);
        assert_eq!(bucket_of(None, 60), 0);
    }
}
