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
        .with_writer(RedactingStderr);
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

/// Standard error for log lines, each line's URIs and known secrets redacted before it is
/// written (a last guard: an error logged with a driver's text that quotes a URI). The
/// subscriber formats an event whole and writes it through one writer, so one writer is one
/// line.
struct RedactingStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for RedactingStderr {
    type Writer = RedactedLine;

    fn make_writer(&'a self) -> Self::Writer {
        RedactedLine(Vec::new())
    }
}

/// One log line, written redacted when dropped.
struct RedactedLine(Vec<u8>);

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
        let line = crate::config::redact_text(&String::from_utf8_lossy(&self.0));
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}
