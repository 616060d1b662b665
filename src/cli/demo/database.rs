//! The demo's throwaway database: the product's one launcher, kept minimal on purpose. The test
//! and benchmark harness (the `counterd-testdb` crate of the workspace) is not a dependency of
//! the product, so the demo starts its server itself, in the harness's order of preference:
//! 1. `COUNTERD_TEST_MONGODB_URI` if set;
//! 2. `mongod` on PATH: a single-node replica set in a fresh directory under the temp dir;
//! 3. the fake server, through the launcher script `start` of the checkout's `testdb/` named by
//!    `COUNTERD_TESTDB_DIR` (set by `scripts/demo`), never a path of the build machine.
//!
//! The server lives as long as the [`DemoDatabase`]; the fake also exits when this process dies
//! (it watches its standard input).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bson::doc;

/// What to do when no throwaway database can be had here.
pub const NO_TEST_SERVER: &str = "no throwaway MongoDB can be started here: set COUNTERD_TEST_MONGODB_URI to a replica set you may write to, put `mongod` on PATH, or run from a checkout with scripts/demo (which sets COUNTERD_TESTDB_DIR to its testdb/ and installs Java and Maven for the fake server)";

/// A running throwaway database.
pub struct DemoDatabase {
    pub uri: String,
    child: Option<Child>,
    /// The mongod data directory, removed when the server is stopped.
    dir: Option<PathBuf>,
}

impl Drop for DemoDatabase {
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

impl DemoDatabase {
    /// Starts (or finds) a server, printing which one to stderr. Blocking.
    pub fn start() -> Result<DemoDatabase, String> {
        if let Ok(uri) = std::env::var("COUNTERD_TEST_MONGODB_URI") {
            eprintln!(
                "test database: COUNTERD_TEST_MONGODB_URI ({})",
                crate::config::redact_uri(&uri)
            );
            return Ok(DemoDatabase {
                uri,
                child: None,
                dir: None,
            });
        }
        if which("mongod") {
            return start_mongod();
        }
        start_fake()
    }
}

/// The fake: `testdb/start` prints `LISTENING host:port` once bound.
fn start_fake() -> Result<DemoDatabase, String> {
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
    let Some(address) = line.trim().strip_prefix("LISTENING ") else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!(
            "fake server did not start (it said {line:?}); are Java 17 and Maven installed? {NO_TEST_SERVER}"
        ));
    };
    let uri = format!("mongodb://{address}/?directConnection=true");
    eprintln!("test database: fake mongo-java-server (oplog on) at {uri}");
    Ok(DemoDatabase {
        uri,
        child: Some(child),
        dir: None,
    })
}

/// A single-node replica set in a fresh directory, initiated and waited on until primary.
fn start_mongod() -> Result<DemoDatabase, String> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("counterd-demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(27117);
    let mut database = DemoDatabase {
        uri: format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
        child: None,
        dir: Some(dir.clone()),
    };
    let child = Command::new("mongod")
        .args(["--replSet", "rs0", "--bind_ip", "127.0.0.1", "--quiet"])
        .arg("--port")
        .arg(port.to_string())
        .arg("--dbpath")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start mongod: {e}"))?;
    database.child = Some(child);
    let uri = database.uri.clone();
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
    Ok(database)
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|p| p.join(program).is_file()))
        .unwrap_or(false)
}
