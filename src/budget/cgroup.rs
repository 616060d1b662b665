//! The container's memory limit, from the process's cgroup (v2, else v1): the default budget is
//! derived from it (see [`super::cost::budget_for_limit`]). Parsing is pure; [`memory_limit`]
//! reads the files.

use std::path::Path;

/// v1 reports "no limit" as a huge number (the page-rounded `i64::MAX`); anything above this
/// is no limit.
const V1_UNLIMITED_ABOVE: u64 = 1 << 60;

/// The memory limit of this process's cgroup, in bytes (`None`: none, or not readable).
pub fn memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_under(Path::new("/sys/fs/cgroup"), &own)
}

/// The limit found under the cgroup mount `root` for a process whose `/proc/self/cgroup` reads
/// `own`: v2's `memory.max` (cgroup2 mounted at `root`), else v1's `memory.limit_in_bytes`
/// (under `root/memory`), of the process's group and of every parent up to the mount: the
/// smallest counts (a container's limit may sit on a parent; inside a cgroup namespace the
/// group is `/`). A hybrid host mounts v2 elsewhere, without controllers: v1 is read there.
pub fn limit_under(root: &Path, own: &str) -> Option<u64> {
    let v2 = v2_path(own).and_then(|path| smallest_up(root, path, "memory.max", parse_v2));
    v2.or_else(|| {
        let path = v1_path(own).unwrap_or("/");
        smallest_up(
            &root.join("memory"),
            path,
            "memory.limit_in_bytes",
            parse_v1,
        )
    })
}

/// The smallest limit in `file` of the group `path` under `mount` and of its parents.
fn smallest_up(
    mount: &Path,
    path: &str,
    file: &str,
    parse: fn(&str) -> Option<u64>,
) -> Option<u64> {
    let group = mount.join(path.trim_start_matches('/'));
    group
        .ancestors()
        .take_while(|dir| dir.starts_with(mount))
        .filter_map(|dir| std::fs::read_to_string(dir.join(file)).ok())
        .filter_map(|text| parse(&text))
        .min()
}

/// The v2 group (`0::<path>`) of a `/proc/self/cgroup`.
fn v2_path(own: &str) -> Option<&str> {
    own.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The v1 memory controller's group (`<n>:memory:<path>`, possibly with other controllers)
/// in the text of `/proc/self/cgroup`.
pub fn v1_path(own: &str) -> Option<&str> {
    own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    })
}

/// `memory.max`: a number of bytes, or `max`.
pub fn parse_v2(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `memory.limit_in_bytes`: a number, huge for none.
pub fn parse_v1(text: &str) -> Option<u64> {
    text.trim()
        .parse()
        .ok()
        .filter(|&n: &u64| n < V1_UNLIMITED_ABOVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_files_parse() {
        assert_eq!(parse_v2("100663296\n"), Some(96 << 20));
        assert_eq!(parse_v2("max\n"), None);
        assert_eq!(parse_v1("9223372036854771712\n"), None);
        assert_eq!(parse_v1("104857600"), Some(100 << 20));
    }

    #[test]
    fn the_smallest_limit_of_the_group_and_its_parents_counts() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let group = root.join("kubepods/pod1/ctr");
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(root.join("kubepods/memory.max"), "max\n").unwrap();
        std::fs::write(root.join("kubepods/pod1/memory.max"), "100663296\n").unwrap();
        std::fs::write(group.join("memory.max"), "max\n").unwrap();
        assert_eq!(limit_under(root, "0::/kubepods/pod1/ctr\n"), Some(96 << 20));
        // Inside a cgroup namespace: the group is the root.
        std::fs::write(root.join("memory.max"), "50000000\n").unwrap();
        assert_eq!(limit_under(root, "0::/\n"), Some(50_000_000));
    }

    #[test]
    fn v1_reads_the_memory_controllers_group() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let group = root.join("memory/docker/abc");
        std::fs::create_dir_all(&group).unwrap();
        std::fs::write(group.join("memory.limit_in_bytes"), "67108864\n").unwrap();
        // A hybrid host: `0::/` names a v2 group without a memory controller.
        let own = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n";
        assert_eq!(limit_under(root, own), Some(64 << 20));
        std::fs::write(group.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        assert_eq!(limit_under(root, own), None);
        // A limit on a parent counts.
        std::fs::write(
            root.join("memory/docker/memory.limit_in_bytes"),
            "104857600\n",
        )
        .unwrap();
        assert_eq!(limit_under(root, own), Some(100 << 20));
    }
}
