//! `counterd run`: the sidecar ([`crate::daemon`]) until SIGTERM or ctrl-c.

use std::process::ExitCode;

use crate::config::Settings;
use crate::daemon;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address of /metrics, /healthz, /readyz (overrides http_addr).
    #[arg(long)]
    pub http_addr: Option<String>,
}

pub async fn run(settings: Settings, _args: Args) -> anyhow::Result<ExitCode> {
    // The definitions are checked before anything is contacted (exit 2 naming the setting).
    settings.definitions()?;
    match daemon::run(settings, daemon::shutdown_on_signals()).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            let e = anyhow::Error::from(e);
            tracing::error!(error = %crate::cli::exit::describe(&e), "counterd stopped");
            tracing::debug!(error = %crate::cli::exit::describe_in_full(&e), "why counterd stopped, in full");
            Err(e)
        }
    }
}
