//! `counterd-testdb`: a throwaway MongoDB for counterd's integration tests and benchmark (tooling
//! of the workspace, not part of the product). It builds on the product's own launcher,
//! `counterd::local_server` (which `counterd demo` uses too), in its order of preference:
//! 1. `COUNTERD_TEST_MONGODB_URI` if set;
//! 2. `mongod` on PATH: a single-node replica set in a temp dir on a free port;
//! 3. the fake server `mongo-java-server` (with its oplog), started by `testdb/start` of a
//!    checkout, which fetches it through Maven on first use. Where that checkout is comes from
//!    `COUNTERD_TESTDB_DIR` (set by `scripts/demo`, and by `.cargo/config.toml` for `cargo test`
//!    and `cargo run`): never from where the binary was built, so a released binary has no
//!    path of the build machine in it.
//!
//! The dependency points from the tooling to the product, never back: the product does not
//! link this crate.
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

use counterd::local_server::LocalServer;
pub use counterd::local_server::{free_port, preferred_kind, ServerKind, NO_TEST_SERVER};

pub mod http;
pub mod proxy;
pub use proxy::{FaultProxy, FaultStats, Target};

/// A running test database: the product's throwaway-server launcher
/// ([`counterd::local_server`], which the demo uses too), plus what the tests need to know of
/// the fake.
pub struct TestServer {
    pub uri: String,
    pub kind: ServerKind,
    server: LocalServer,
    /// The fake only: whether it serves `_id`-equality filters from its `_id` index.
    fake_id_index: Option<bool>,
}

/// The fake server's switch: `0` gives the stock query planner (filters beyond `_id` scan the
/// collection), `1` or unset the `_id`-index lookup for `_id`-equality filters. Read by
/// `testdb/FakeMongo.java`; named `COUNTERD_TEST…` so that counterd's settings ignore it.
pub const FAKE_ID_INDEX_VAR: &str = "COUNTERD_TESTDB_ID_INDEX";

impl TestServer {
    /// Starts (or finds) a server, printing which one to stderr.
    pub fn start() -> Result<TestServer, String> {
        if preferred_kind() == ServerKind::Fake {
            return Self::start_fake();
        }
        Ok(Self::wrap(LocalServer::start()?, None))
    }

    /// The fake: its `_id`-index lookup is on unless this process's environment sets
    /// [`FAKE_ID_INDEX_VAR`]`=0`.
    pub fn start_fake() -> Result<TestServer, String> {
        Self::launch_fake(None)
    }

    /// The fake with its `_id`-index lookup on or off, whatever the environment says.
    pub fn start_fake_with_id_index(on: bool) -> Result<TestServer, String> {
        Self::launch_fake(Some(on))
    }

    fn launch_fake(id_index: Option<bool>) -> Result<TestServer, String> {
        let env: Vec<(&str, &str)> = id_index
            .map(|on| (FAKE_ID_INDEX_VAR, if on { "1" } else { "0" }))
            .into_iter()
            .collect();
        let id_index = id_index.unwrap_or_else(|| {
            std::env::var(FAKE_ID_INDEX_VAR)
                .ok()
                .is_none_or(|v| v != "0")
        });
        let server = LocalServer::start_fake(&env)?;
        let planner = if id_index {
            "_id index for _id-equality filters"
        } else {
            "stock planner: COUNTERD_TESTDB_ID_INDEX=0"
        };
        eprintln!(
            "test database: fake mongo-java-server (oplog on, wire 13, {planner}) at {}",
            server.uri
        );
        Ok(Self::wrap(server, Some(id_index)))
    }

    fn wrap(server: LocalServer, fake_id_index: Option<bool>) -> TestServer {
        TestServer {
            uri: server.uri.clone(),
            kind: server.kind,
            server,
            fake_id_index,
        }
    }

    /// The fake only: whether it serves `_id`-equality filters from its `_id` index (see
    /// [`FAKE_ID_INDEX_VAR`]); `None` for other servers.
    pub fn fake_id_index(&self) -> Option<bool> {
        self.fake_id_index
    }

    /// The server's process id, when this process started it (to pause it in fault tests).
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }
}
