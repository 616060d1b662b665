//! `counterd-testdb`: a throwaway MongoDB for counterd's integration tests and benchmark (tooling
//! of the workspace, not part of the product; the product's `counterd demo` has its own minimal
//! launcher, src/cli/demo/database.rs), in this order of preference:
//! 1. `COUNTERD_TEST_MONGODB_URI` if set;
//! 2. `mongod` on PATH: a single-node replica set in a temp dir on a free port;
//! 3. the fake server `mongo-java-server` (with its oplog), started by `testdb/start` of a
//!    checkout, which fetches it through Maven on first use. Where that checkout is comes from
//!    `COUNTERD_TESTDB_DIR` (set by `scripts/demo`, and by `.cargo/config.toml` for `cargo test`
//!    and `cargo run`): never from where the binary was built, so a released binary has no
//!    path of the build machine in it.
//!
//! A started server lives as long as the [`TestServer`] value; the fake also exits by itself
//! when this process dies (it watches its standard input), so a crashed test leaves nothing.
//!
//! The fake's launcher (`testdb/FakeMongo.java`) serves every filter that pins `_id` by plain
//! equality (`{_id: v, ...}`, `{_id: {$eq: v}, ...}`, also inside `$and`) from the `_id` index and
//! applies the rest of the filter to the one document found, as MongoDB does; the stock server
//! scans the whole collection for any filter beyond exactly `{_id}`. [`FAKE_ID_INDEX_VAR`]`=0`
//! turns that off (`tests/testdb_index.rs` compares the two).
//!
//! [`proxy::FaultProxy`] stands between a client and a server to inject network faults (resets,
//! lost replies, latency, stalls) at chosen requests.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::doc;

pub mod proxy;
pub use proxy::{FaultProxy, FaultStats, Target};

/// Which kind of server a [`TestServer`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerKind {
    External,
    Mongod,
    Fake,
}

/// A running test database.
pub struct TestServer {
    pub uri: String,
    pub kind: ServerKind,
    child: Option<Child>,
    /// Kept so the mongod data directory lives as long as the server.
    _dir: Option<tempfile::TempDir>,
    /// The fake only: whether it serves `_id`-equality filters from its `_id` index.
    fake_id_index: Option<bool>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The fake server's switch: `0` gives the stock query planner (filters beyond `_id` scan the
/// collection), `1` or unset the `_id`-index lookup for `_id`-equality filters. Read by
/// `testdb/FakeMongo.java`; named `COUNTERD_TEST…` so that counterd's settings ignore it.
pub const FAKE_ID_INDEX_VAR: &str = "COUNTERD_TESTDB_ID_INDEX";

/// What to do when no test server can be had here.
pub const NO_TEST_SERVER: &str = "no throwaway MongoDB can be started here: set COUNTERD_TEST_MONGODB_URI to a replica set you may write to, put `mongod` on PATH, or run from a checkout with scripts/demo (which sets COUNTERD_TESTDB_DIR to its testdb/ and installs Java and Maven for the fake server)";

/// Where the fake server's launcher lives: `COUNTERD_TESTDB_DIR` (a checkout's `testdb/`).
fn testdb_dir() -> Result<PathBuf, String> {
    let dir = std::env::var_os("COUNTERD_TESTDB_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| format!("COUNTERD_TESTDB_DIR is not set; {NO_TEST_SERVER}"))?;
    if !dir.join("start").is_file() {
        return Err(format!(
            "COUNTERD_TESTDB_DIR={} has no `start` script; {NO_TEST_SERVER}",
            dir.display()
        ));
    }
    Ok(dir)
}

/// Which kind of server [`TestServer::start`] would use here.
pub fn preferred_kind() -> ServerKind {
    if std::env::var("COUNTERD_TEST_MONGODB_URI").is_ok() {
        ServerKind::External
    } else if which("mongod") {
        ServerKind::Mongod
    } else {
        ServerKind::Fake
    }
}

impl TestServer {
    /// Starts (or finds) a server, printing which one to stderr.
    pub fn start() -> Result<TestServer, String> {
        if let Ok(uri) = std::env::var("COUNTERD_TEST_MONGODB_URI") {
            eprintln!(
                "test database: COUNTERD_TEST_MONGODB_URI ({})",
                redact_uri(&uri)
            );
            return Ok(TestServer {
                uri,
                kind: ServerKind::External,
                child: None,
                _dir: None,
                fake_id_index: None,
            });
        }
        if which("mongod") {
            return Self::start_mongod();
        }
        Self::start_fake()
    }

    /// The fake: `testdb/start` prints `LISTENING host:port` once bound. Its `_id`-index lookup
    /// is on unless this process's environment sets [`FAKE_ID_INDEX_VAR`]`=0`.
    pub fn start_fake() -> Result<TestServer, String> {
        Self::launch_fake(None)
    }

    /// The fake with its `_id`-index lookup on or off, whatever the environment says.
    pub fn start_fake_with_id_index(on: bool) -> Result<TestServer, String> {
        Self::launch_fake(Some(on))
    }

    fn launch_fake(id_index: Option<bool>) -> Result<TestServer, String> {
        let script = testdb_dir()?.join("start");
        let mut command = Command::new("bash");
        if let Some(on) = id_index {
            command.env(FAKE_ID_INDEX_VAR, if on { "1" } else { "0" });
        }
        let id_index = id_index.unwrap_or_else(|| {
            std::env::var(FAKE_ID_INDEX_VAR)
                .ok()
                .is_none_or(|v| v != "0")
        });
        let mut child = command
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}; {NO_TEST_SERVER}", script.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .map_err(|e| format!("fake server did not start: {e}"))?;
        let address = line
            .trim()
            .strip_prefix("LISTENING ")
            .ok_or_else(|| {
                format!(
                    "fake server did not start (it said {line:?}); are Java 17 and Maven installed? {NO_TEST_SERVER}"
                )
            })?
            .to_string();
        let uri = format!("mongodb://{address}/?directConnection=true");
        let planner = if id_index {
            "_id index for _id-equality filters"
        } else {
            "stock planner: COUNTERD_TESTDB_ID_INDEX=0"
        };
        eprintln!("test database: fake mongo-java-server (oplog on, wire 13, {planner}) at {uri}");
        Ok(TestServer {
            uri,
            kind: ServerKind::Fake,
            child: Some(child),
            _dir: None,
            fake_id_index: Some(id_index),
        })
    }

    /// A single-node replica set in a temp dir, initiated and waited on until primary.
    fn start_mongod() -> Result<TestServer, String> {
        let dir = tempfile::TempDir::new().map_err(|e| e.to_string())?;
        let port = free_port();
        let child = Command::new("mongod")
            .args(["--replSet", "rs0", "--bind_ip", "127.0.0.1", "--quiet"])
            .arg("--port")
            .arg(port.to_string())
            .arg("--dbpath")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start mongod: {e}"))?;
        let uri = format!("mongodb://127.0.0.1:{port}/?directConnection=true");
        let server = TestServer {
            uri: uri.clone(),
            kind: ServerKind::Mongod,
            child: Some(child),
            _dir: Some(dir),
            fake_id_index: None,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let client = mongodb::Client::with_uri_str(&uri)
                .await
                .map_err(|e| e.to_string())?;
            let admin = client.database("admin");
            let deadline = Instant::now() + Duration::from_secs(60);
            let config =
                doc! {"_id": "rs0", "members": [{"_id": 0, "host": format!("127.0.0.1:{port}")}]};
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
        })?;
        eprintln!("test database: throwaway mongod replica set at {uri}");
        Ok(server)
    }

    /// The fake only: whether it serves `_id`-equality filters from its `_id` index (see
    /// [`FAKE_ID_INDEX_VAR`]); `None` for other servers.
    pub fn fake_id_index(&self) -> Option<bool> {
        self.fake_id_index
    }

    /// The server's process id, when this process started it (to pause it in fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
        .unwrap_or(false)
}

/// `scheme://user:***@host...`: the password of a URI left out of what is printed (as
/// `counterd::config::redact_uri`; this crate does not depend on the product).
fn redact_uri(uri: &str) -> String {
    let Some(scheme_end) = uri.find("://") else {
        return uri.to_string();
    };
    let rest = &uri[scheme_end + 3..];
    let host_start = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..host_start].rfind('@') else {
        return uri.to_string();
    };
    let user = rest[..at].split(':').next().unwrap_or("");
    format!("{}://{}:***@{}", &uri[..scheme_end], user, &rest[at + 1..])
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(27117)
}
