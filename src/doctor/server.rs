//! The server itself: its version, whether change streams are possible, and its clock.

use super::{Finding, Reply, RoundTrip};

/// The oldest MongoDB counterd is known to work with: change streams that start at an
/// operation time (4.0). Below [`TESTED`] it is untested: the test server reports 5.0, the
/// event fixtures are MongoDB 6 and 7's.
const OLDEST: (u32, u32) = (4, 0);
const TESTED: (u32, u32) = (5, 0);

/// `buildInfo.version` → major and minor.
fn parse_version(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    Some((major, minor))
}

/// The server answers, and its version is one counterd works with.
pub fn version(build_info: &Reply) -> Finding {
    const CHECK: &str = "server";
    let build = match build_info {
        Ok(b) => b,
        Err(e) => {
            return Finding::warning(
                CHECK,
                format!("the server answered, but not buildInfo ({e}): version unknown"),
                "check that the server is MongoDB 5.0 or newer",
            )
        }
    };
    let version = build.get_str("version").unwrap_or("unknown");
    match parse_version(version) {
        Some(v) if v < OLDEST => Finding::problem(
            CHECK,
            format!("MongoDB {version}: change streams that resume at a time need 4.0"),
            "upgrade MongoDB (counterd is tested with 5.0 and later)",
        ),
        Some(v) if v < TESTED => Finding::warning(
            CHECK,
            format!("MongoDB {version}: older than counterd is tested with (5.0)"),
            "upgrade MongoDB to 5.0 or newer (6.0 or newer for pre-images)",
        ),
        Some(_) => Finding::ok(CHECK, format!("reachable, MongoDB {version}")),
        None => Finding::warning(
            CHECK,
            format!("reachable, but its version {version:?} is not MongoDB's"),
            "check that the server is MongoDB 5.0 or newer",
        ),
    }
}

/// A replica set or a sharded cluster, where change streams open (checked by opening one).
pub fn topology(is_master: &Reply, change_stream: &Result<(), String>) -> Finding {
    const CHECK: &str = "topology";
    let reply = is_master.as_ref().ok();
    let set = reply.and_then(|r| r.get_str("setName").ok());
    let sharded = reply.and_then(|r| r.get_str("msg").ok()) == Some("isdbgrid");
    let shape = match (set, sharded) {
        (Some(name), _) => format!("replica set {name}"),
        (None, true) => "sharded cluster (mongos)".to_string(),
        (None, false) => "a server that reports no replica set".to_string(),
    };
    match change_stream {
        Ok(()) if set.is_none() && !sharded => Finding::ok(
            CHECK,
            format!("{shape}, but change streams open on it (a test server?)"),
        ),
        Ok(()) => Finding::ok(CHECK, format!("{shape}; change streams open")),
        Err(e) if set.is_none() && !sharded => Finding::problem(
            CHECK,
            format!("{shape}: change streams need a replica set or a sharded cluster ({e})"),
            "start mongod with --replSet rs0 and run rs.initiate() once (one member will do), \
             then list the members in mongodb_uri with ?replicaSet=rs0",
        ),
        Err(e) => Finding::problem(
            CHECK,
            format!("{shape}, but a change stream on the comments collection does not open: {e}"),
            "grant changeStream and find on the comments collection (see the privileges line)",
        ),
    }
}

/// This process's clock against the server's (`localTime` of `isMaster`), within the round
/// trip's uncertainty.
pub fn clock(is_master: &Reply, round_trip: RoundTrip, max_skew_ms: i64) -> Finding {
    let RoundTrip {
        sent_at_ms,
        received_at_ms,
    } = round_trip;
    const CHECK: &str = "clock";
    let Some(server) = is_master
        .as_ref()
        .ok()
        .and_then(|r| r.get_datetime("localTime").ok())
        .map(|t| t.timestamp_millis())
    else {
        return Finding::skipped(CHECK, "the server reports no localTime: skew not measured");
    };
    let midpoint = sent_at_ms + (received_at_ms - sent_at_ms) / 2;
    let uncertainty = (received_at_ms - sent_at_ms).max(0) / 2;
    let skew = server - midpoint;
    if skew.abs() - uncertainty > max_skew_ms {
        let direction = if skew > 0 { "behind" } else { "ahead of" };
        Finding::warning(
            CHECK,
            format!(
                "this clock is {} ms {direction} the server's (round trip {} ms); lease expiry, \
                 the snapshot's pinned start and quiet-window recounts assume they agree",
                skew.abs(),
                received_at_ms - sent_at_ms
            ),
            "synchronise both clocks (NTP, chrony)",
        )
    } else {
        Finding::ok(
            CHECK,
            format!(
                "within {} ms of the server's (skew {skew} ms, round trip {} ms)",
                max_skew_ms,
                received_at_ms - sent_at_ms
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Level;
    use bson::doc;

    #[test]
    fn versions() {
        assert_eq!(parse_version("7.0.4"), Some((7, 0)));
        assert_eq!(parse_version("4"), Some((4, 0)));
        let level = |v: &str| version(&Ok(doc! {"version": v})).level;
        assert_eq!(level("3.6.23"), Level::Problem);
        assert_eq!(level("4.4.29"), Level::Warning);
        assert_eq!(level("5.0.0"), Level::Ok);
        assert_eq!(level("8.0.1"), Level::Ok);
        assert_eq!(level("nope"), Level::Warning);
    }

    #[test]
    fn clock_skew_beyond_the_round_trip() {
        let at = |ms: i64| Ok(doc! {"localTime": bson::DateTime::from_millis(ms)});
        let rt = |sent_at_ms, received_at_ms| RoundTrip {
            sent_at_ms,
            received_at_ms,
        };
        assert_eq!(
            clock(&at(10_050), rt(10_000, 10_100), 1000).level,
            Level::Ok
        );
        let f = clock(&at(15_050), rt(10_000, 10_100), 1000);
        assert_eq!(f.level, Level::Warning);
        assert!(f.message.contains("5000 ms behind"), "{}", f.message);
        assert!(clock(&at(5_050), rt(10_000, 10_100), 1000)
            .message
            .contains("ahead of"));
        // A slow round trip widens the margin: 1.9 s off with a 2 s round trip is no finding.
        assert_eq!(
            clock(&at(12_900), rt(10_000, 12_000), 1000).level,
            Level::Ok
        );
        assert_eq!(clock(&Ok(doc! {}), rt(0, 1), 1000).level, Level::Skipped);
    }
}
