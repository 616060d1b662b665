//! Logging: the `tracing` subscriber, human-readable or JSON lines.

/// Installs the `tracing` subscriber: human-readable by default, JSON lines with `json` (one
/// object per line, the event's fields at the top level beside `timestamp`, `level`, `target`
/// and `message`).
pub fn init_logging(json: bool, level: &str) {
    use std::io::IsTerminal;
    install(json, level, std::io::stderr().is_terminal(), Sink::Stderr);
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
    install(json, level, false, Sink::File(file));
    Ok(())
}

fn install(json: bool, level: &str, ansi: bool, sink: Sink) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(Redacting(sink));
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

/// Where log lines go: standard error, or a file (the demo's).
#[derive(Clone)]
enum Sink {
    Stderr,
    File(std::sync::Arc<std::fs::File>),
}

/// Log lines to a [`Sink`], each line's URIs and known secrets redacted before it is written
/// (a last guard: an error logged with a driver's text that quotes a URI). The subscriber
/// formats an event whole and writes it through one writer, so one writer is one line.
struct Redacting(Sink);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Redacting {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> Self::Writer {
        RedactedLine(Vec::new(), self.0.clone())
    }
}

/// One log line, written redacted when dropped.
struct RedactedLine(Vec<u8>, Sink);

impl std::io::Write for RedactedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        use std::io::Write;
        let line = crate::redact::redact_text(&String::from_utf8_lossy(&self.0));
        let _ = match &self.1 {
            Sink::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
            Sink::File(file) => (&**file).write_all(line.as_bytes()),
        };
    }
}
