//! The `counterd run` under soak: a child process through the fault proxy, started, killed and
//! restarted at will, with its `/metrics`, `/readyz` and resident memory read from outside.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use counterd_testdb::http::http_get;

/// How `counterd run` is started: its binary, where it reaches MongoDB and which database.
pub struct Launch {
    pub binary: PathBuf,
    pub uri: String,
    pub database: String,
    pub log_dir: PathBuf,
}

/// One life of `counterd run`.
pub struct Counterd {
    child: Child,
    pub port: u16,
}

impl Launch {
    /// The `counterd` binary built beside this one (`cargo build` builds both).
    pub fn binary_beside_this_one() -> anyhow::Result<PathBuf> {
        let real = std::env::current_exe()?.with_file_name("counterd");
        if !real.is_file() {
            bail!(
                "the soak runs the real `counterd run`, but {} is not built: run `cargo build --bin counterd` (with the same profile) first",
                real.display()
            );
        }
        Ok(real)
    }

    /// Starts `counterd run` and waits until its HTTP endpoint listens.
    pub fn start(&self, life: usize) -> anyhow::Result<Counterd> {
        for _ in 0..10 {
            let port = counterd_testdb::free_port();
            let log = std::fs::File::create(self.log_dir.join(format!("counterd-{life}.log")))?;
            let mut child = Command::new(&self.binary)
                .arg("run")
                .env_remove("COUNTERD_CONFIG")
                .env("COUNTERD_MONGODB_URI", &self.uri)
                .env("COUNTERD_DATABASE", &self.database)
                .env("COUNTERD_HTTP_ADDR", format!("127.0.0.1:{port}"))
                .env("COUNTERD_OWNER_ID", format!("soak-{life}"))
                .env("COUNTERD_LEASE_TTL", "3s")
                .env("COUNTERD_LEASE_RENEW", "500ms")
                .env("COUNTERD_RECONCILE_INTERVAL", "2s")
                .env("COUNTERD_SETTLE_TIME", "3s")
                .env("COUNTERD_OPERATION_TIMEOUT", "4s")
                .env("COUNTERD_CONNECT_TIMEOUT", "3s")
                .env("COUNTERD_RETRY_MAX_DELAY", "1s")
                .env("COUNTERD_READY_MAX_STALL", "5s")
                .env("COUNTERD_IDLE_INTERVAL", "50ms")
                .env("COUNTERD_MAX_AWAIT", "200ms")
                .env("COUNTERD_LOG_LEVEL", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()?;
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if child.try_wait()?.is_some() {
                    break; // the port was taken meanwhile: another one
                }
                let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                if std::net::TcpStream::connect_timeout(&address, Duration::from_millis(100))
                    .is_ok()
                {
                    return Ok(Counterd { child, port });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        Err(anyhow!("counterd run did not start listening"))
    }

    /// A one-shot command (`reconcile --once`, `replay ...`) against the server directly
    /// (`uri`), returning its exit code and what it said.
    pub fn one_shot(&self, uri: &str, args: &[&str]) -> anyhow::Result<(i32, String)> {
        let out = Command::new(&self.binary)
            .args(args)
            .env_remove("COUNTERD_CONFIG")
            .env("COUNTERD_MONGODB_URI", uri)
            .env("COUNTERD_DATABASE", &self.database)
            .env("COUNTERD_SETTLE_TIME", "3s")
            .env("COUNTERD_CATCH_UP_TIMEOUT", "10s")
            .env("COUNTERD_LOG_LEVEL", "warn")
            .output()?;
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.code().unwrap_or(-1), said))
    }
}

impl Counterd {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running (a soak's counterd never stops by itself).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL, and wait for it to go.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status.code();
        }
        signal(self.pid(), "-TERM");
        self.child.wait().ok().and_then(|s| s.code())
    }

    /// Resident memory now, MB.
    pub fn rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb / 1024.0)
    }

    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path).await
    }
}

impl Drop for Counterd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kill <signal> <pid>`.
pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status();
}

/// The sum of a metric's samples whose line starts with `prefix`.
pub fn sample(scrape: &str, prefix: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
