//! `counterd doctor`: the preflight an operator runs before and after deploying, and that
//! `counterd run` logs at start.
//!
//! Why a separate check at all: counterd's own start-up only fails on what stops it (no
//! server, a bad setting, no change stream). Other set-up faults degrade it silently: without an
//! index on the group and creation fields every recount scans `comments` on the primary; a
//! misspelled `group_field` makes every row "not a comment" and shows up only as an alert; a
//! missing privilege fails the first write of its kind, minutes later; a skewed clock weakens
//! the quiet-window recounts. Each of those is visible in one reply of the server, so the
//! doctor asks once and says what is wrong and how to fix it, one line per finding.
//!
//! The checks are pure: [`Replies`] (what the server answered, gathered in one place by
//! `MongoStore::preflight`) plus [`Expectations`] (what the settings need) give [`Finding`]s.
//! That keeps them testable on real-shaped replies (`fixtures/doctor/`) for what the fake test
//! server cannot show: authentication, pre-images, snapshot reads, a standalone server.

mod abilities;
mod index;
mod privileges;
mod sample;
mod server;
pub mod tls;

use bson::Document;

use crate::core::schema::Schema;

pub use abilities::pre_images_on;
pub use index::create_index_command;
pub use privileges::create_role_command;

/// How a finding weighs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, strum::IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Level {
    /// As counterd needs it.
    Ok,
    /// Worth knowing; nothing to fix (e.g. what an absent optional ability costs).
    Info,
    /// The check could not be made here; the message says why.
    Skipped,
    /// counterd works, at a cost the fix removes (`run` logs it as a warning).
    #[strum(serialize = "WARNING")]
    Warning,
    /// counterd will not work as configured (`doctor` exits 1).
    #[strum(serialize = "PROBLEM")]
    Problem,
}

impl Level {
    /// As the report prints it: the levels to act on in capitals.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// One line of the doctor's report.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// The check, one word: `server`, `topology`, `privileges`, `recount_index`,
    /// `pre_images`, `snapshot_reads`, `fields`, `clock`, `tls`.
    pub check: &'static str,
    pub level: Level,
    pub message: String,
    /// What to do about it (for warnings and problems).
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: &'static str, level: Level, message: String, fix: Option<String>) -> Finding {
        Finding {
            check,
            level,
            message,
            fix,
        }
    }
    pub fn ok(check: &'static str, message: impl Into<String>) -> Finding {
        Finding::new(check, Level::Ok, message.into(), None)
    }
    pub fn info(check: &'static str, message: impl Into<String>) -> Finding {
        Finding::new(check, Level::Info, message.into(), None)
    }
    pub fn skipped(check: &'static str, why: impl Into<String>) -> Finding {
        Finding::new(check, Level::Skipped, why.into(), None)
    }
    pub fn warning(
        check: &'static str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(check, Level::Warning, message.into(), Some(fix.into()))
    }
    pub fn problem(
        check: &'static str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(check, Level::Problem, message.into(), Some(fix.into()))
    }

    /// The report line: `PROBLEM recount_index: ... — fix: ...`.
    pub fn line(&self) -> String {
        let fix = self.fix.as_ref().map(|f| format!(" -- fix: {f}"));
        let (level, check, message) = (self.level.label(), self.check, &self.message);
        format!(
            "{level:<8} {check:<14} {message}{}",
            fix.unwrap_or_default()
        )
    }
}

/// A command's reply, or the server's error as text.
pub type Reply = Result<Document, String>;

/// Everything the checks read, as the server answered it.
#[derive(Clone, Debug)]
pub struct Replies {
    /// `buildInfo`.
    pub build_info: Reply,
    /// `isMaster` (every server answers it; `hello` where it exists has the same fields).
    pub is_master: Reply,
    /// This process's clock around `is_master`.
    pub round_trip: RoundTrip,
    /// Opening a change stream on the comments collection (and closing it at once).
    pub change_stream: Result<(), String>,
    /// `connectionStatus` with `showPrivileges: true`.
    pub connection_status: Reply,
    /// `listIndexes` of the comments collection: the index specifications.
    pub indexes: Result<Vec<Document>, String>,
    /// The `listCollections` entry of the comments collection (`None`: it does not exist).
    pub collection: Result<Option<Document>, String>,
    /// Whether reads at a cluster time really work (the store's probe).
    pub snapshot_reads: bool,
    /// The newest rows of the comments collection (by `_id`).
    pub sample: Result<Vec<Document>, String>,
}

/// This process's clock just before a command was sent and just after its reply came (ms
/// since the epoch): the server's clock read in between is compared with the midpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundTrip {
    pub sent_at_ms: i64,
    pub received_at_ms: i64,
}

/// What counterd, as configured, needs from the server.
#[derive(Clone, Debug)]
pub struct Expectations {
    pub database: String,
    pub comments: String,
    pub schema: Schema,
    /// Every collection counterd writes (counters, ledgers of every partition, dirty set,
    /// checkpoints, leases, runs, sweeps).
    pub own_collections: Vec<String>,
    /// Whether the attribution uses pre-images when present.
    pub uses_pre_images: bool,
    /// How far apart this process's clock and the server's may be before it matters.
    pub max_clock_skew_ms: i64,
}

/// Every check, in the order of the report.
pub fn check_all(replies: &Replies, expect: &Expectations) -> Vec<Finding> {
    let mut out = vec![server::version(&replies.build_info)];
    out.push(server::topology(&replies.is_master, &replies.change_stream));
    out.push(privileges::check(&replies.connection_status, expect));
    out.extend(index::check(&replies.indexes, &replies.collection, expect));
    out.push(abilities::pre_images(
        &replies.build_info,
        &replies.collection,
        expect,
    ));
    out.push(abilities::snapshot_reads(replies.snapshot_reads));
    out.extend(sample::check(&replies.sample, expect));
    out.push(server::clock(
        &replies.is_master,
        replies.round_trip,
        expect.max_clock_skew_ms,
    ));
    out
}

/// The worst level among the findings.
pub fn worst(findings: &[Finding]) -> Level {
    findings.iter().map(|f| f.level).max().unwrap_or(Level::Ok)
}

/// Logs the findings as `counterd run` does at start: problems at error, warnings at warn (a
/// missing recount index is one: never silent), the rest at info.
pub fn log(findings: &[Finding]) {
    for f in findings {
        let fix = f.fix.as_deref().unwrap_or("");
        match f.level {
            Level::Problem => tracing::error!(check = f.check, fix, "preflight: {}", f.message),
            Level::Warning => tracing::warn!(check = f.check, fix, "preflight: {}", f.message),
            _ => tracing::info!(
                check = f.check,
                level = f.level.label(),
                "preflight: {}",
                f.message
            ),
        }
    }
}

/// A mongosh expression for the configured database (`db.getSiblingDB("app")`).
fn db_expr(database: &str) -> String {
    format!("db.getSiblingDB({})", js_string(database))
}

/// A JavaScript string literal.
fn js_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}
