//! What /proc says about this process (Linux; nothing elsewhere).

/// What /proc says about this process.
#[derive(Clone, Copy, Debug)]
pub struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: f64,
    pub virtual_bytes: f64,
    pub open_fds: f64,
    pub max_fds: f64,
    pub start_time_seconds: f64,
    pub threads: f64,
}

impl ProcessStats {
    /// Reads /proc/self; `None` where there is no /proc.
    pub fn read() -> Option<ProcessStats> {
        // Kernel clock ticks as seen by user space (USER_HZ) are 100 on every Linux ABI.
        const TICKS: f64 = 100.0;
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> f64 {
            // `n` is the field number of proc(5) (1-based); `rest` starts at field 3.
            fields
                .get(n - 3)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(f64::NAN)
        };
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let cpu_seconds = (field(14) + field(15)) / TICKS;
        let start_time_seconds = status_value(&read("/proc/stat"), "btime") + field(22) / TICKS;
        let status = read("/proc/self/status");
        let status_kb = |key: &str| status_value(&status, key);
        let resident_bytes = status_kb("VmRSS") * 1024.0;
        let virtual_bytes = status_kb("VmSize") * 1024.0;
        let threads = status_kb("Threads");
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(f64::NAN, |d| d.count() as f64);
        Some(ProcessStats {
            cpu_seconds,
            resident_bytes,
            virtual_bytes,
            open_fds,
            max_fds: status_value(&read("/proc/self/limits"), "Max open files"),
            start_time_seconds,
            threads,
        })
    }
}

/// The first number after `key` (and a `:`) at the start of a line of a /proc file's `text`:
/// kB for `VmRSS` in /proc/self/status, the soft limit of `Max open files` in
/// /proc/self/limits, the boot time (Unix seconds) of `btime` in /proc/stat.
fn status_value(text: &str, key: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let v = l.strip_prefix(key)?.trim_start_matches(':').trim();
            v.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_stats_are_read_from_proc() {
        let p = ProcessStats::read().expect("/proc on Linux");
        assert!(p.resident_bytes > 0.0 && p.open_fds > 0.0 && p.threads >= 1.0);
        assert!(p.start_time_seconds > 1.0e9 && p.cpu_seconds >= 0.0);
    }
}
