//! Everything the commands print goes through here: one JSON serializer for every `--json`
//! (RFC 3339 times, plain strings for tokens and ids, never Rust debug text or MongoDB's
//! extended JSON) and one writer for standard output that ends quietly on a broken pipe
//! (`counterd status --json | head -1`), so the command still exits with its own code.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use bson::DateTime;
use serde_json::Value;

/// Set once a write to standard output failed (the reader went away): later output is dropped.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes one line to standard output, any URI in it redacted (a last guard: commands print
/// URIs already redacted); after a broken pipe, writes nothing more.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    write_raw(&format!("{args}\n"));
}

/// Writes text to standard output without a newline (the demo's screen refresh), redacted and
/// quiet on a broken pipe like [`write_line`].
pub fn write_raw(text: &str) {
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let text = crate::redact::redact_text_uris(text);
    let mut out = std::io::stdout().lock();
    if out
        .write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// `println!` for command output: quiet on a broken pipe.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => { $crate::cli::output::write_line(format_args!($($arg)*)) };
}

/// A date as RFC 3339 (UTC, milliseconds when there are any).
pub fn rfc3339(t: DateTime) -> String {
    let ms = t.timestamp_millis();
    match chrono::DateTime::from_timestamp_millis(ms) {
        Some(d) => d.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
        None => ms.to_string(),
    }
}

/// Serializes any value for `--json`: through serde, then with MongoDB's extended-JSON shapes
/// (`{"$date": …}`, `{"$timestamp": …}`, `{"$oid": …}`, `{"$numberLong": …}`) replaced by plain
/// JSON: RFC 3339 strings, hex strings and numbers.
pub fn to_json(value: &impl serde::Serialize) -> anyhow::Result<Value> {
    Ok(plain(serde_json::to_value(value)?))
}

/// Prints a value as pretty JSON (see [`to_json`]).
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&to_json(value)?)?;
    write_line(format_args!("{text}"));
    Ok(())
}

fn plain(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            if map.len() == 1 {
                let (key, inner) = map.iter().next().expect("one entry");
                if let Some(v) = extended(key, inner) {
                    return v;
                }
            }
            Value::Object(map.into_iter().map(|(k, v)| (k, plain(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(plain).collect()),
        other => other,
    }
}

/// The plain value of one extended-JSON wrapper, if `key` is one.
fn extended(key: &str, inner: &Value) -> Option<Value> {
    let number = |v: &Value| -> Option<i64> {
        match v {
            Value::Number(n) => n.as_i64(),
            Value::String(s) => s.parse().ok(),
            Value::Object(m) => m.get("$numberLong").and_then(|n| n.as_str()?.parse().ok()),
            _ => None,
        }
    };
    let time = |ms: i64| Some(Value::String(rfc3339(DateTime::from_millis(ms))));
    match key {
        "$date" if inner.is_string() => Some(inner.clone()),
        "$date" => time(number(inner)?),
        "$timestamp" => time(inner.as_object()?.get("t")?.as_i64()? * 1000),
        "$oid" => Some(Value::String(inner.as_str()?.to_string())),
        "$numberLong" | "$numberInt" => Some(Value::from(number(inner)?)),
        "$numberDouble" => inner.as_str()?.parse::<f64>().ok().map(Value::from),
        _ => None,
    }
}

/// Problems with a `--json` document that scripts would trip over: extended-JSON wrappers,
/// Rust debug text, and time fields that are not RFC 3339 (for tests, so behind `test-utils`;
/// empty when clean).
#[cfg(any(test, feature = "test-utils"))]
pub fn json_problems(value: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    walk(value, "", &mut problems);
    problems
}

#[cfg(any(test, feature = "test-utils"))]
fn walk(value: &Value, path: &str, problems: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{path}.{k}");
                if k.starts_with('$') {
                    problems.push(format!("{here}: extended JSON"));
                }
                if k.ends_with("_at")
                    || k.ends_with("_time")
                    || matches!(k.as_str(), "time" | "oldest")
                {
                    match v {
                        Value::Null => {}
                        Value::String(s) if chrono::DateTime::parse_from_rfc3339(s).is_ok() => {}
                        other => problems.push(format!("{here}: not an RFC 3339 time: {other}")),
                    }
                }
                walk(v, &here, problems);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                walk(v, &format!("{path}[{i}]"), problems);
            }
        }
        Value::String(s) => {
            for debug in [
                "Timestamp {",
                "Token(",
                "Some(",
                "DateTime(",
                "Int(",
                "Str(",
                "Oid(",
            ] {
                if s.contains(debug) {
                    problems.push(format!("{path}: debug text {s:?}"));
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::Timestamp;

    #[test]
    fn extended_json_becomes_plain() {
        #[derive(serde::Serialize)]
        struct S {
            at: DateTime,
            cluster_time: Timestamp,
            id: bson::oid::ObjectId,
            n: Option<DateTime>,
        }
        let oid = bson::oid::ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap();
        let v = to_json(&S {
            at: DateTime::from_millis(1_700_000_000_123),
            cluster_time: Timestamp {
                time: 1_700_000_001,
                increment: 4,
            },
            id: oid,
            n: None,
        })
        .unwrap();
        assert_eq!(v["at"], "2023-11-14T22:13:20.123Z");
        assert_eq!(v["cluster_time"], "2023-11-14T22:13:21Z");
        assert_eq!(v["id"], "65a1b2c3d4e5f60718293a4b");
        assert!(v["n"].is_null());
        assert!(json_problems(&v).is_empty(), "{:?}", json_problems(&v));
        let bad = serde_json::json!({"x_at": {"$date": 5}, "t": "Token(\"00\")", "when_time": 5});
        assert_eq!(json_problems(&bad).len(), 4, "{:?}", json_problems(&bad));
    }

    #[test]
    fn a_closed_stdout_is_quiet() {
        STDOUT_CLOSED.store(true, Ordering::Relaxed);
        write_line(format_args!("dropped"));
        STDOUT_CLOSED.store(false, Ordering::Relaxed);
    }
}
