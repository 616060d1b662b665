//! `counterd run` as a real child process, for fault and high-availability tests.
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `counterd run`.
pub struct Daemon {
    pub child: Child,
    pub port: u16,
}

impl Daemon {
    /// Starts `counterd run` against `uri`/`database`, with short intervals for tests, and waits
    /// until its HTTP endpoint listens. A port that another test took between our probe and the
    /// daemon's bind makes it exit at once: then it is started again on another port.
    pub fn start(uri: &str, database: &str, owner: &str, extra: &[(&str, &str)]) -> Daemon {
        Self::start_logged(uri, database, owner, extra, None)
    }

    /// [`Daemon::start`] with its standard error written to `log` (to check what it said).
    pub fn start_logged(
        uri: &str,
        database: &str,
        owner: &str,
        extra: &[(&str, &str)],
        log: Option<&std::path::Path>,
    ) -> Daemon {
        Self::start_with(uri, database, owner, extra, log, None)
    }

    /// Starts `counterd run` with its standard error written to `log` and returns at once,
    /// without waiting for it to listen: for a run expected to stop during its start (which
    /// may come before its HTTP endpoint binds), whose exit the caller waits for.
    pub fn spawn_logged(
        uri: &str,
        database: &str,
        owner: &str,
        extra: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Daemon {
        let port = counterd_testdb::free_port();
        let child = Self::spawn(uri, database, owner, extra, port, Some(log), None);
        Daemon { child, port }
    }

    /// [`Daemon::start`] inside the cgroup whose `cgroup.procs` is `procs` (the child moves
    /// itself there before it executes `counterd`, so all of its memory is charged there).
    pub fn start_in_cgroup(
        uri: &str,
        database: &str,
        owner: &str,
        extra: &[(&str, &str)],
        procs: &std::path::Path,
    ) -> Daemon {
        Self::start_with(uri, database, owner, extra, None, Some(procs))
    }

    fn start_with(
        uri: &str,
        database: &str,
        owner: &str,
        extra: &[(&str, &str)],
        log: Option<&std::path::Path>,
        procs: Option<&std::path::Path>,
    ) -> Daemon {
        for _ in 0..10 {
            let port = counterd_testdb::free_port();
            let mut child = Self::spawn(uri, database, owner, extra, port, log, procs);
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // exited (port taken): try another port
                }
                let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                // Whoever answers must be this child: the port was only free a moment ago, and
                // another test's daemon or proxy may have bound it since (this child then
                // fails to listen and exits, and the loop tries another port).
                if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(100))
                    .is_ok()
                    && listens_on(child.id(), port)
                {
                    return Daemon { child, port };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("counterd run did not start listening after 10 attempts");
    }

    fn spawn(
        uri: &str,
        database: &str,
        owner: &str,
        extra: &[(&str, &str)],
        port: u16,
        log: Option<&std::path::Path>,
        procs: Option<&std::path::Path>,
    ) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_counterd"));
        cmd.arg("run")
            .env_remove("COUNTERD_CONFIG")
            .env("COUNTERD_MONGODB_URI", uri)
            .env("COUNTERD_DATABASE", database)
            .env("COUNTERD_HTTP_ADDR", format!("127.0.0.1:{port}"))
            .env("COUNTERD_OWNER_ID", owner)
            .env("COUNTERD_IDLE_INTERVAL", "30ms")
            .env("COUNTERD_MAX_AWAIT", "100ms")
            .env("COUNTERD_LEASE_TTL", "2s")
            .env("COUNTERD_LEASE_RENEW", "400ms")
            .env("COUNTERD_RECONCILE_INTERVAL", "1s")
            .env("COUNTERD_SETTLE_TIME", "2s")
            .env("COUNTERD_OPERATION_TIMEOUT", "3s")
            .env("COUNTERD_CONNECT_TIMEOUT", "2s")
            .env("COUNTERD_RETRY_MAX_DELAY", "500ms")
            .env("COUNTERD_LOG_LEVEL", "warn")
            .stdout(Stdio::null())
            .stderr(match (log, std::env::var("COUNTERD_TEST_LOG_DIR")) {
                (Some(path), _) => {
                    Stdio::from(std::fs::File::create(path).expect("create the log"))
                }
                // Keep each daemon's log apart when debugging a test.
                (None, Ok(dir)) => std::fs::File::create(format!("{dir}/{owner}-{port}.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::inherit()),
                (None, Err(_)) => Stdio::inherit(),
            });
        for (k, v) in extra {
            cmd.env(k, v);
        }
        // The URI read from a file: `mongodb_uri` must not be set beside it.
        if extra.iter().any(|(k, _)| *k == "COUNTERD_MONGODB_URI_FILE") {
            cmd.env_remove("COUNTERD_MONGODB_URI");
        }
        if let Some(procs) = procs {
            use std::os::unix::process::CommandExt;
            let procs = procs.to_path_buf();
            // SAFETY: between fork and exec the child only writes "0" (itself) to a file.
            unsafe {
                cmd.pre_exec(move || std::fs::write(&procs, b"0"));
            }
        }
        cmd.spawn().expect("start counterd run")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GET a path on the daemon's HTTP endpoint: (status code, body), or None if unreachable.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path).await
    }

    /// The histogram `counterd_drift_comments` of `/metrics` for the counter `counter`:
    /// (samples, sum); nothing when `/metrics` does not answer.
    pub async fn drift_reported(&self, counter: &str) -> (u64, f64) {
        let Some((200, text)) = self.get("/metrics").await else {
            return (0, 0.0);
        };
        let label = format!("counter=\"{counter}\"");
        let total = |name: &str| -> f64 {
            text.lines()
                .filter(|l| l.starts_with(name) && l.contains(&label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (
            total("counterd_drift_comments_count") as u64,
            total("counterd_drift_comments_sum"),
        )
    }

    /// Waits until `/readyz` answers with a body starting with `prefix` ("active" or "standby").
    pub async fn wait_role(&self, prefix: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some((200, body)) = self.get("/readyz").await {
                if body.starts_with(prefix) {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status();
    }

    pub fn kill9(mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(mut self) -> Option<i32> {
        self.signal("-TERM");
        self.child.wait().ok().and_then(|s| s.code())
    }
}

/// Whether process `pid` holds the socket listening on 127.0.0.1:`port` (Linux: the listening
/// socket's inode in `/proc/net/tcp`, among the process's open descriptors). Elsewhere, true.
fn listens_on(pid: u32, port: u16) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return true;
    };
    let local = format!("0100007F:{port:04X}");
    let inodes: Vec<String> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl, local_address, rem_address, st (0A: LISTEN), ..., inode (the tenth).
            (fields.len() > 9 && fields[1] == local && fields[3] == "0A")
                .then(|| format!("socket:[{}]", fields[9]))
        })
        .collect();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| inodes.iter().any(|i| target.as_os_str() == i.as_str()))
    })
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub use counterd_testdb::http::http_get;
