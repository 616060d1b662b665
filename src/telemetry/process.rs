//! What /proc says about this process (Linux; nothing elsewhere).

use super::{
    PROCESS_CPU, PROCESS_MAX_FDS, PROCESS_OPEN_FDS, PROCESS_RSS, PROCESS_START_TIME,
    PROCESS_THREADS, PROCESS_VIRTUAL,
};

/// The `process_*` values of this process, by metric name (NaN: not known here), read from
/// /proc/self; `None` where there is no /proc.
pub fn read() -> Option<[(&'static str, f64); 7]> {
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
    let text = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let start_time_seconds = status_value(&text("/proc/stat"), "btime") + field(22) / TICKS;
    let status = text("/proc/self/status");
    let status_kb = |key: &str| status_value(&status, key);
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(f64::NAN, |d| d.count() as f64);
    let max_fds = status_value(&text("/proc/self/limits"), "Max open files");
    Some([
        (PROCESS_CPU, (field(14) + field(15)) / TICKS),
        (PROCESS_RSS, status_kb("VmRSS") * 1024.0),
        (PROCESS_VIRTUAL, status_kb("VmSize") * 1024.0),
        (PROCESS_OPEN_FDS, open_fds),
        (PROCESS_MAX_FDS, max_fds),
        (PROCESS_START_TIME, start_time_seconds),
        (PROCESS_THREADS, status_kb("Threads")),
    ])
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
        let values = read().expect("/proc on Linux");
        let p = |name: &str| values.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(p(PROCESS_RSS) > 0.0 && p(PROCESS_OPEN_FDS) > 0.0 && p(PROCESS_THREADS) >= 1.0);
        assert!(p(PROCESS_START_TIME) > 1.0e9 && p(PROCESS_CPU) >= 0.0);
    }
}
