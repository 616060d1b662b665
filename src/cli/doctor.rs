//! `counterd doctor`: the preflight, one line per check; exits 1 on any problem, 2 when a
//! certificate file named in the URI cannot be used (nothing is contacted), 3 when the server
//! cannot be reached. `--json` always prints a report, a failure to connect included (as the
//! `server` finding), so a script reads one shape whatever happened. The checks themselves
//! are [`crate::doctor`]'s.

use std::process::ExitCode;

use crate::cli::exit::{code_for, describe, CHECK_FAILED, USAGE};
use crate::cli::{connect, print_json};
use crate::config::Settings;
use crate::doctor::tls::{self, TlsPlan};
use crate::doctor::{check_all, worst, Expectations, Finding, Level};
use crate::outln;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Rows of the comments collection to sample for the field check (newest first).
    #[arg(long, default_value_t = 100)]
    pub sample: usize,
    /// Print JSON instead of one line per check.
    #[arg(long)]
    pub json: bool,
}

/// The report, and the exit code it ends with.
struct Report {
    findings: Vec<Finding>,
    /// Set when the server was not (or could not be) asked: the code, and why in one sentence
    /// (also said on standard error, as every command says its failure).
    failed: Option<(u8, String)>,
}

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let report = gather(&settings, args.sample).await;
    print(&settings, &report, args.json)?;
    if let Some((_, error)) = &report.failed {
        eprintln!("counterd: {}", crate::redact::redact_text(error));
    }
    let code = match report.failed {
        Some((code, _)) => code,
        None if worst(&report.findings) == Level::Problem => CHECK_FAILED,
        None => 0,
    };
    Ok(ExitCode::from(code))
}

/// TLS first (without connecting), then the server's replies, or the failure to connect as
/// the `server` finding.
async fn gather(settings: &Settings, sample: usize) -> Report {
    let plan = TlsPlan::of(&settings.mongodb_uri).unwrap_or_default();
    let files = tls::read_files(&plan);
    let mut findings = tls::findings(&plan, &files);
    if let Err(e) = tls::judge(&plan, &files) {
        findings.push(Finding::skipped("server", format!("not contacted: {e}")));
        let failed = Some((USAGE, crate::config::ConfigError::from(e).to_string()));
        return Report { findings, failed };
    }
    let failed = match connect(settings).await {
        Ok(store) => {
            let expect = Expectations::from(settings);
            findings.extend(check_all(&store.preflight(sample).await, &expect));
            None
        }
        Err(e) => {
            findings.push(Finding::problem(
                "server",
                describe(&e),
                "check that the server runs and answers at the hosts in mongodb_uri, the credentials, and the TLS settings (`counterd doctor --verbose` shows the driver's own text)",
            ));
            tracing::debug!(error = %crate::cli::exit::describe_in_full(&e), "doctor: cannot connect");
            Some((code_for(&e), describe(&e)))
        }
    };
    Report { findings, failed }
}

fn print(settings: &Settings, report: &Report, json: bool) -> anyhow::Result<()> {
    let findings = &report.findings;
    let count = |level| findings.iter().filter(|f| f.level == level).count();
    let (problems, warnings) = (count(Level::Problem), count(Level::Warning));
    let mongodb = crate::redact::redact_uri(&settings.mongodb_uri);
    if json {
        return print_json(&serde_json::json!({
            "mongodb": mongodb,
            "database": settings.database,
            "connected": report.failed.is_none(),
            "problems": problems,
            "warnings": warnings,
            "findings": findings,
        }));
    }
    outln!(
        "counterd doctor: {mongodb} (database {})",
        settings.database
    );
    for f in findings {
        outln!("{}", f.line());
    }
    outln!("{problems} problems, {warnings} warnings");
    Ok(())
}
