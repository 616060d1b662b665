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
    refuse_unkept_counters(&settings)?;
    match daemon::run(settings, daemon::shutdown_on_signals()).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            let e = anyhow::Error::from(e);
            tracing::error!(error = %crate::cli::exit::describe(&e), "counterd stopped");
            Err(e)
        }
    }
}

/// `[[counters]]` beyond the default are checked, listed by `counterd config` and classified by
/// the pure core, but the worker does not keep them yet: refusing to start (exit 2, naming the
/// setting) is better than a sidecar that looks healthy while those counters never move.
fn refuse_unkept_counters(settings: &Settings) -> Result<(), crate::config::ConfigError> {
    let definitions = settings.definitions()?;
    match definitions.extra() {
        [] => Ok(()),
        extra => Err(crate::config::ConfigError::Invalid {
            name: "counters".into(),
            origin: "settings".into(),
            value: extra
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            message: "`counterd run` keeps only the default counter in this release; remove the [[counters]] entries to run".into(),
        }),
    }
}
