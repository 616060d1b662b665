//! Logging: the `tracing` subscriber, human-readable or JSON lines.

/// Installs the `tracing` subscriber: human-readable by default, JSON lines with `json` (one
/// object per line, the event's fields at the top level beside `timestamp`, `level`, `target`
/// and `message`).
pub fn init_logging(json: bool, level: &str) {
    use std::io::IsTerminal;
    install(
        json,
        level,
        std::io::stderr().is_terminal(),
        std::io::stderr,
    );
}

/// [`init_logging`] into the file `path` (created or truncated) instead of standard error: for
/// `counterd demo`, whose live view owns the screen and would scroll away between two frames
/// under the reconciler's log lines.
pub fn init_logging_to_file(
    json: bool,
    level: &str,
    path: &std::path::Path,
) -> std::io::Result<()> {
    let file = std::sync::Arc::new(std::fs::File::create(path)?);
    install(json, level, false, move || {
        std::io::LineWriter::new(FileWriter(file.clone()))
    });
    Ok(())
}

/// A shared file handle as a writer (each log line is one `write` through the line writer).
struct FileWriter(std::sync::Arc<std::fs::File>);

impl std::io::Write for FileWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        (&*self.0).flush()
    }
}

fn install<W>(json: bool, level: &str, ansi: bool, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
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
