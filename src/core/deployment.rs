//! Which deployment a checkpoint belongs to.
//!
//! A resume token (or a pinned start time) means something only on the deployment whose oplog
//! it came from. A backup restored onto another deployment brings counterd's checkpoint along
//! with the application's rows; a real server refuses the old token (history lost, code 286 or
//! 280), but a server that treats tokens as time filters (the fake test server) resumes "after"
//! it and replays every restored row as new. So the worker records the deployment in the
//! checkpoint and, before resuming, compares it with what the server reports now: a checkpoint
//! of another deployment is lost history, handled by `on_history_lost` like error 286.
//!
//! What identifies a deployment, from what the server reports (pure; `store::mongo` runs the
//! commands):
//! - a replica set: its name (`setName` of `isMaster`) and, where `replSetGetConfig` is allowed,
//!   its `replicaSetId` (created by `rs.initiate()`, so a new replica set restored from a dump
//!   differs even under the same name). `electionId` and `topologyVersion.processId` are not
//!   used: they change on every election or restart of the same replica set.
//! - a sharded cluster (`msg: "isdbgrid"`): the `clusterId` of `config.version`.
//! - a server that reports neither (no replication, so no durable oplog: the in-memory fake
//!   test server): its process, as `serverStatus` reports it (host, pid, and the start time
//!   `localTime - uptimeMillis`). Its history does not survive a restart, so a restart is a new
//!   deployment. Such a server that kept its data over a restart would see a false "history
//!   lost": with `on_history_lost = "resweep"` that costs one full sweep, never a wrong count.
//!
//! Two identities are the same deployment unless a part known on both sides differs; a server
//! that reports nothing at all has no identity, and only the worker's second check applies
//! there (the first event after resuming may not be older than the checkpoint's own time).

use std::fmt;

use bson::{doc, Bson, DateTime, Document};
use serde::Serialize;

/// How far two readings of a server process's start time may differ and still be the same
/// process (`localTime` and `uptimeMillis` are read a few milliseconds apart).
const START_TOLERANCE_MS: i64 = 2_000;

/// What identifies a deployment (see the module documentation).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Deployment {
    /// The replica set's name (`setName`).
    pub replica_set: Option<String>,
    /// The replica set's `replicaSetId`, or a sharded cluster's `clusterId` (hex).
    pub id: Option<String>,
    /// The server process, for servers without replication (no durable oplog).
    pub process: Option<ServerProcess>,
}

/// A server process as `serverStatus` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerProcess {
    pub host: String,
    pub pid: i64,
    /// `localTime - uptimeMillis`, in Unix milliseconds.
    pub started_ms: i64,
}

impl Deployment {
    /// True when the server reported nothing that identifies it.
    pub fn is_unknown(&self) -> bool {
        self.replica_set.is_none() && self.id.is_none() && self.process.is_none()
    }

    /// Whether `self` knows a part that `recorded` lacks (worth recording again).
    pub fn adds_to(&self, recorded: &Deployment) -> bool {
        (self.replica_set.is_some() && recorded.replica_set.is_none())
            || (self.id.is_some() && recorded.id.is_none())
            || (self.process.is_some() && recorded.process.is_none())
    }

    /// Replicated (a replica set or a sharded cluster), as opposed to a lone process.
    fn replicated(&self) -> bool {
        self.replica_set.is_some() || self.id.is_some()
    }

    /// Whether `self` (recorded) and `other` (reported now) can be the same deployment: no part
    /// known on both sides differs. A replicated deployment is never a lone process.
    pub fn same_as(&self, other: &Deployment) -> bool {
        if self.is_unknown() || other.is_unknown() {
            return true;
        }
        if self.replicated() != other.replicated() {
            return false;
        }
        let differs =
            |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(a), Some(b)) if a != b);
        if differs(&self.replica_set, &other.replica_set) || differs(&self.id, &other.id) {
            return false;
        }
        match (&self.process, &other.process) {
            (Some(a), Some(b)) => {
                a.host == b.host
                    && a.pid == b.pid
                    && (a.started_ms - b.started_ms).abs() <= START_TOLERANCE_MS
            }
            _ => true,
        }
    }

    /// The identity from the server's replies: `isMaster`, `replSetGetConfig` (replica sets,
    /// where allowed), `config.version` (sharded clusters, where readable) and `serverStatus`
    /// (servers without replication, where allowed).
    pub fn from_replies(
        is_master: &Document,
        repl_config: Option<&Document>,
        cluster_version: Option<&Document>,
        server_status: Option<&Document>,
    ) -> Deployment {
        let replica_set = is_master.get_str("setName").ok().map(str::to_string);
        let sharded = is_master.get_str("msg") == Ok("isdbgrid");
        let id = if replica_set.is_some() {
            repl_config
                .and_then(|r| r.get_document("config").ok())
                .and_then(|c| c.get_document("settings").ok())
                .and_then(|s| s.get("replicaSetId"))
                .and_then(id_text)
        } else if sharded {
            cluster_version
                .and_then(|v| v.get("clusterId"))
                .and_then(id_text)
        } else {
            None
        };
        let process = server_status
            .filter(|_| replica_set.is_none() && !sharded)
            .and_then(process_of);
        Deployment {
            replica_set,
            id,
            process,
        }
    }

    /// As stored in the checkpoint document.
    pub fn to_document(&self) -> Document {
        let mut d = Document::new();
        if let Some(s) = &self.replica_set {
            d.insert("replica_set", s);
        }
        if let Some(id) = &self.id {
            d.insert("id", id);
        }
        if let Some(p) = &self.process {
            d.insert(
                "process",
                doc! {"host": &p.host, "pid": p.pid, "started_at": DateTime::from_millis(p.started_ms)},
            );
        }
        d
    }

    /// From the checkpoint document (unknown parts are left out, never guessed).
    pub fn from_document(d: &Document) -> Deployment {
        Deployment {
            replica_set: d.get_str("replica_set").ok().map(str::to_string),
            id: d.get_str("id").ok().map(str::to_string),
            process: d.get_document("process").ok().and_then(|p| {
                Some(ServerProcess {
                    host: p.get_str("host").ok()?.to_string(),
                    pid: int(p.get("pid")?)?,
                    started_ms: p.get_datetime("started_at").ok()?.timestamp_millis(),
                })
            }),
        }
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(s) = &self.replica_set {
            parts.push(format!("replica set `{s}`"));
        }
        if let Some(id) = &self.id {
            parts.push(format!("id {id}"));
        }
        if let Some(p) = &self.process {
            let started = DateTime::from_millis(p.started_ms)
                .try_to_rfc3339_string()
                .unwrap_or_else(|_| p.started_ms.to_string());
            parts.push(format!(
                "server process {} on {} started {started}",
                p.pid, p.host
            ));
        }
        if parts.is_empty() {
            f.write_str("unknown")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

fn int(b: &Bson) -> Option<i64> {
    b.as_i64().or(b.as_i32().map(i64::from))
}

fn id_text(b: &Bson) -> Option<String> {
    match b {
        Bson::ObjectId(o) => Some(o.to_hex()),
        Bson::String(s) => Some(s.clone()),
        _ => None,
    }
}

fn process_of(status: &Document) -> Option<ServerProcess> {
    let pid = int(status.get("pid")?)?;
    let uptime = int(status.get("uptimeMillis")?)?;
    let local = status.get_datetime("localTime").ok()?.timestamp_millis();
    Some(ServerProcess {
        host: status.get_str("host").unwrap_or("").to_string(),
        pid,
        started_ms: local - uptime,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;

    fn fake(pid: i32, started_ms: i64, uptime: i64) -> Deployment {
        let status = doc! {"host": "vm", "pid": pid, "uptimeMillis": uptime, "localTime": DateTime::from_millis(started_ms + uptime)};
        Deployment::from_replies(&doc! {"ismaster": true}, None, None, Some(&status))
    }

    fn replica_set(name: &str, id: Option<ObjectId>) -> Deployment {
        let config = id.map(|id| doc! {"config": {"settings": {"replicaSetId": id}}});
        Deployment::from_replies(
            &doc! {"ismaster": true, "setName": name},
            config.as_ref(),
            None,
            Some(
                &doc! {"host": "h", "pid": 1, "uptimeMillis": 5_i64, "localTime": DateTime::now()},
            ),
        )
    }

    #[test]
    fn a_lone_server_process_is_its_own_deployment() {
        let a = fake(100, 1_000_000, 5_000);
        assert_eq!(a.process.as_ref().unwrap().started_ms, 1_000_000);
        // The same process read later (uptime grew, a few ms of skew): the same.
        assert!(a.same_as(&fake(100, 1_000_003, 60_000)));
        // Restarted, or another server: a new deployment.
        assert!(!a.same_as(&fake(101, 1_000_000, 5_000)));
        assert!(!a.same_as(&fake(100, 9_000_000, 5_000)));
    }

    #[test]
    fn a_replica_set_is_its_name_and_id_never_its_process() {
        let id = ObjectId::new();
        let a = replica_set("rs0", Some(id));
        assert!(
            a.process.is_none(),
            "a member's restart is not a new deployment"
        );
        assert!(a.same_as(&replica_set("rs0", Some(id))));
        assert!(
            !a.same_as(&replica_set("rs0", Some(ObjectId::new()))),
            "a new replica set under the old name"
        );
        assert!(!a.same_as(&replica_set("rs1", Some(id))));
        // replSetGetConfig refused now (or then): compare what both sides know.
        assert!(a.same_as(&replica_set("rs0", None)));
        assert!(
            !a.same_as(&fake(1, 0, 1)),
            "a replica set is never a lone process"
        );
    }

    #[test]
    fn a_sharded_cluster_is_its_cluster_id() {
        let id = ObjectId::new();
        let mongos = |id: ObjectId| {
            Deployment::from_replies(
                &doc! {"ismaster": true, "msg": "isdbgrid"},
                None,
                Some(&doc! {"_id": 1, "clusterId": id}),
                None,
            )
        };
        assert_eq!(mongos(id).id, Some(id.to_hex()));
        assert!(mongos(id).same_as(&mongos(id)));
        assert!(!mongos(id).same_as(&mongos(ObjectId::new())));
    }

    #[test]
    fn nothing_reported_is_no_identity_and_matches_anything() {
        let none = Deployment::from_replies(&doc! {"ismaster": true}, None, None, None);
        assert!(none.is_unknown());
        assert!(none.same_as(&fake(1, 0, 1)) && fake(1, 0, 1).same_as(&none));
        assert_eq!(none.to_string(), "unknown");
    }

    #[test]
    fn stored_and_read_back_unchanged() {
        for d in [
            fake(7, 1_700_000_000_000, 10),
            replica_set("rs0", Some(ObjectId::new())),
        ] {
            assert_eq!(Deployment::from_document(&d.to_document()), d);
        }
    }
}
