//! `counterd doctor`: the preflight, one line per check; exits 1 on any problem, 3 when the
//! server cannot be reached. The checks themselves are [`crate::doctor`]'s.

use std::process::ExitCode;

use crate::cli::{connect, print_json};
use crate::config::Settings;
use crate::doctor::{check_all, worst, Expectations, Level};
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

pub async fn run(settings: Settings, args: Args) -> anyhow::Result<ExitCode> {
    let store = connect(&settings).await?;
    let expect = Expectations::from(&settings);
    let findings = check_all(&store.preflight(args.sample).await, &expect);
    let count = |level| findings.iter().filter(|f| f.level == level).count();
    let (problems, warnings) = (count(Level::Problem), count(Level::Warning));
    if args.json {
        print_json(&serde_json::json!({
            "mongodb": crate::config::redact_uri(&settings.mongodb_uri),
            "database": settings.database,
            "problems": problems,
            "warnings": warnings,
            "findings": findings,
        }))?;
    } else {
        outln!(
            "counterd doctor: {} (database {})",
            crate::config::redact_uri(&settings.mongodb_uri),
            settings.database
        );
        for f in &findings {
            outln!("{}", f.line());
        }
        outln!("{problems} problems, {warnings} warnings");
    }
    Ok(if worst(&findings) == Level::Problem {
        crate::cli::exit::exit_code(crate::cli::exit::CHECK_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}
