//! What the process itself costs: CPU time (user + system, `getrusage`) and peak resident memory
//! (`VmHWM`), plus the percentile of a latency sample and the median of repeated runs.

use std::time::Duration;

/// CPU time this process has used so far, user and system together (every thread: the worker,
/// the driver, the runtime; the server is another process).
pub fn process_cpu() -> Duration {
    // SAFETY: `getrusage` only writes the struct it is given, which is zero-initialised and
    // large enough; RUSAGE_SELF is always valid.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Peak resident set size (VmHWM) of a process (`None`: this one), in kB.
pub fn vm_hwm_kb(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU time another process has used so far, user and system together (`/proc/<pid>/stat`,
/// fields 14 and 15, in clock ticks).
pub fn child_cpu(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    // Fields 14 and 15 of the line are the 12th and 13th after the name (state is the 1st).
    let total = ticks(11)? + ticks(12)?;
    // SAFETY: sysconf only reads a configuration value.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_sec > 0).then(|| Duration::from_secs_f64(total as f64 / per_sec as f64))
}

/// The `q` quantile of sorted values (nearest rank).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median of `values` (any order): [`percentile`] 0.5 of them sorted, the lower middle of an
/// even count.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    percentile(&sorted, 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(process_cpu() > before);
    }

    #[test]
    fn child_cpu_reads_a_process_of_its_own() {
        let mut busy = std::process::Command::new("sh")
            .args([
                "-c",
                "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5",
            ])
            .spawn()
            .unwrap();
        let pid = busy.id();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut seen = Duration::ZERO;
        while seen.is_zero() && std::time::Instant::now() < deadline {
            seen = child_cpu(pid).unwrap_or_default();
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = busy.kill();
        let _ = busy.wait();
        assert!(seen > Duration::ZERO, "the busy child used some CPU");
        assert_eq!(child_cpu(u32::MAX), None, "no such process");
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 0.5), 2.0);
        assert_eq!(percentile(&v, 0.99), 4.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn median_is_the_middle_of_any_order() {
        assert_eq!(median(&[12.65, 10.28, 11.92]), 11.92);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
    }
}
