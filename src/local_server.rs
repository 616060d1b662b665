//! A throwaway MongoDB on this machine, for `counterd demo` and for the workspace's test and
//! benchmark harness (`crates/testdb`, which builds on this module): one launcher, so the demo
//! and the tests start their servers the same way. In this order of preference:
//! 1. `COUNTERD_TEST_MONGODB_URI` if set (nothing is started);
//! 2. `mongod` on PATH: a single-node replica set in a fresh directory under the temp dir, on a
//!    free port, initiated and waited on until it is primary;
//! 3. the fake server mongo-java-server, through the launcher script `start` of a checkout's
//!    `testdb/`, named by `COUNTERD_TESTDB_DIR` (set by `scripts/demo` and, for `cargo test` and
//!    `cargo run`, by `.cargo/config.toml`): never a path of the build machine, so a released
//!    binary carries none.
//!
//! A started server lives as long as its [`LocalServer`]: dropping it stops the process and
//! removes the mongod data directory; the fake also exits by itself when this process dies (it
//! watches its standard input), so a crash leaves nothing behind.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bson::doc;

/// What to do when no throwaway database can be had here.
pub const NO_TEST_SERVER: &str = "no throwaway MongoDB can be started here: set COUNTERD_TEST_MONGODB_URI to a replica set you may write to, put `mongod` on PATH, or run from a checkout with scripts/demo (which sets COUNTERD_TESTDB_DIR to its testdb/ and installs Java and Maven for the fake server)";

/// Which kind of server a [`LocalServer`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    /// `COUNTERD_TEST_MONGODB_URI`: somebody else's server, not started here.
    External,
    Mongod,
    Fake,
}

/// A running (or found) throwaway database.
pub struct LocalServer {
    pub uri: String,
    pub kind: ServerKind,
    child: Option<Child>,
    /// The mongod data directory, removed when the server is stopped.
    dir: Option<PathBuf>,
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Which kind of server [`LocalServer::start`] would use here.
pub fn preferred_kind() -> ServerKind {
    if std::env::var("COUNTERD_TEST_MONGODB_URI").is_ok() {
        ServerKind::External
    } else if on_path("mongod") {
        ServerKind::Mongod
    } else {
        ServerKind::Fake
    }
}

impl LocalServer {
    /// Starts (or finds) a server in the order of preference, printing which one to stderr.
    /// Blocking.
    pub fn start() -> Result<LocalServer, String> {
        match preferred_kind() {
            ServerKind::External => {
                let uri = std::env::var("COUNTERD_TEST_MONGODB_URI").unwrap_or_default();
                eprintln!(
                    "test database: COUNTERD_TEST_MONGODB_URI ({})",
                    crate::redact::redact_uri(&uri)
                );
                Ok(LocalServer {
                    uri,
                    kind: ServerKind::External,
                    child: None,
                    dir: None,
                })
            }
            ServerKind::Mongod => Self::start_mongod(),
            ServerKind::Fake => Self::start_fake(&[]),
        }
    }

    /// The fake server, with `env` added to its launcher's environment: `testdb/start` prints
    /// `LISTENING host:port` once bound. Says nothing on success (the caller knows what it
    /// asked for).
    pub fn start_fake(env: &[(&str, &str)]) -> Result<LocalServer, String> {
        let dir = std::env::var_os("COUNTERD_TESTDB_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| format!("COUNTERD_TESTDB_DIR is not set; {NO_TEST_SERVER}"))?;
        let script = dir.join("start");
        if !script.is_file() {
            return Err(format!(
                "COUNTERD_TESTDB_DIR={} has no `start` script; {NO_TEST_SERVER}",
                dir.display()
            ));
        }
        let mut child = Command::new("bash")
            .arg(&script)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}; {NO_TEST_SERVER}", script.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        let read = BufReader::new(stdout).read_line(&mut line);
        let address = match (read, line.trim().strip_prefix("LISTENING ")) {
            (Ok(_), Some(address)) => address.to_string(),
            (read, _) => {
                let _ = child.kill();
                let _ = child.wait();
                let said = read.map_or_else(|e| e.to_string(), |_| format!("it said {line:?}"));
                return Err(format!(
                    "fake server did not start ({said}); are Java 17 and Maven installed? {NO_TEST_SERVER}"
                ));
            }
        };
        Ok(LocalServer {
            uri: format!("mongodb://{address}/?directConnection=true"),
            kind: ServerKind::Fake,
            child: Some(child),
            dir: None,
        })
    }

    /// A single-node replica set in a fresh directory, initiated and waited on until primary.
    pub fn start_mongod() -> Result<LocalServer, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let dir =
            std::env::temp_dir().join(format!("counterd-mongod-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let port = free_port();
        let mut server = LocalServer {
            uri: format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
            kind: ServerKind::Mongod,
            child: None,
            dir: Some(dir.clone()),
        };
        server.child = Some(
            Command::new("mongod")
                .args(["--replSet", "rs0", "--bind_ip", "127.0.0.1", "--quiet"])
                .arg("--port")
                .arg(port.to_string())
                .arg("--dbpath")
                .arg(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start mongod: {e}"))?,
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(initiate(&server.uri, port))?;
        eprintln!(
            "test database: throwaway mongod replica set at {}",
            server.uri
        );
        Ok(server)
    }

    /// The server's process id, when this process started it (to pause it in fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

/// Initiates the one-member replica set `rs0` and waits (up to 60 s) until it is primary.
async fn initiate(uri: &str, port: u16) -> Result<(), String> {
    let client = mongodb::Client::with_uri_str(uri)
        .await
        .map_err(|e| e.to_string())?;
    let admin = client.database("admin");
    let deadline = Instant::now() + Duration::from_secs(60);
    let config = doc! {"_id": "rs0", "members": [{"_id": 0, "host": format!("127.0.0.1:{port}")}]};
    loop {
        let _ = admin
            .run_command(doc! {"replSetInitiate": config.clone()})
            .await;
        if let Ok(reply) = admin.run_command(doc! {"hello": 1}).await {
            if reply.get_bool("isWritablePrimary").unwrap_or(false) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err("mongod did not become primary within 60 s".to_string());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `program` is an executable file on PATH.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_or(27117, |a| a.port())
}
