//! Logging: the `tracing` subscriber, human-readable or JSON lines.

/// Installs the `tracing` subscriber: human-readable by default, JSON lines with `json` (one
/// object per line, the event's fields at the top level beside `timestamp`, `level`, `target`
/// and `message`).
pub fn init_logging(json: bool, level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}
