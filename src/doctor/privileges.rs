//! The privileges counterd needs, as data, and whether the connected user holds them.
//!
//! Least privilege rather than `readWrite` on the application's database: counterd reads the
//! application's `comments` (find, change stream) and writes only its own collections. The list
//! is derived from the settings (collection names, partitions' ledgers), so the role printed by
//! [`create_role_command`] (and shown in README.md's production checklist, which a test compares) and the check below
//! cannot disagree with what counterd does.

use bson::{Bson, Document};

use super::{db_expr, js_string, Expectations, Finding, Reply};

/// Actions on one collection of the configured database (`""`: the database itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Privilege {
    pub collection: String,
    pub actions: Vec<&'static str>,
}

/// What counterd does with each collection:
/// - `comments`: `find` (recounts, the initial snapshot, sweeps, the doctor's sample),
///   `changeStream` (the worker), `listIndexes` (the doctor's recount-index check);
/// - the database: `listCollections` (whether pre-images are on);
/// - each of its own collections: `find`, `insert`, `update`, `remove` (dirty entries are
///   deleted when folded) and `createIndex` (TTL and `{count: -1}` indexes at start).
///
/// Optional, never required (a refusal reads as "not reported"): `replSetGetConfig` on the
/// cluster (a replica set's `replicaSetId`, which tells a set restored from a backup under the
/// old name apart; without it the name alone identifies the deployment), `find` on
/// `config.version` on a sharded cluster (its `clusterId`), `serverStatus` on a server without
/// replication. See `Checkpoints::deployment` in `store/mongo/checkpoints.rs`.
pub fn required_privileges(expect: &Expectations) -> Vec<Privilege> {
    let mut out = vec![
        Privilege {
            collection: expect.comments.clone(),
            actions: vec!["find", "changeStream", "listIndexes"],
        },
        Privilege {
            collection: String::new(),
            actions: vec!["listCollections"],
        },
    ];
    for own in &expect.own_collections {
        out.push(Privilege {
            collection: own.clone(),
            actions: vec!["find", "insert", "update", "remove", "createIndex"],
        });
    }
    out
}

/// The privileges as mongosh's `privileges: [...]` array, one per line.
fn privileges_js(database: &str, privileges: &[Privilege], indent: &str) -> String {
    let lines: Vec<String> = privileges
        .iter()
        .map(|p| {
            let actions: Vec<String> = p.actions.iter().map(|a| js_string(a)).collect();
            format!(
                "{indent}{{resource: {{db: {}, collection: {}}}, actions: [{}]}}",
                js_string(database),
                js_string(&p.collection),
                actions.join(", ")
            )
        })
        .collect();
    lines.join(",\n")
}

/// The mongosh command that creates counterd's role (in `admin`) for these settings.
pub fn create_role_command(expect: &Expectations) -> String {
    format!(
        "db.getSiblingDB(\"admin\").createRole({{\n  role: \"counterd\",\n  privileges: [\n{}\n  ],\n  roles: []\n}})",
        privileges_js(&expect.database, &required_privileges(expect), "    ")
    )
}

/// Whether a `connectionStatus` privilege's resource covers `collection` of `database`.
fn covers(resource: &Document, database: &str, collection: &str) -> bool {
    if resource.get_bool("anyResource") == Ok(true) {
        return true;
    }
    let (Ok(db), Ok(coll)) = (resource.get_str("db"), resource.get_str("collection")) else {
        return false;
    };
    let db_ok = db.is_empty() || db == database;
    // `collection: ""` covers every collection of the database but not the database itself;
    // database-level actions (listCollections) are granted on {db, collection: ""}.
    let coll_ok = coll == collection || (coll.is_empty() && !collection.starts_with("system."));
    db_ok && coll_ok
}

/// `user@db` of every authenticated user in `authInfo`.
fn authenticated_users(auth: &Document) -> Vec<String> {
    let users = auth
        .get_array("authenticatedUsers")
        .map_or(&[][..], Vec::as_slice);
    let part = |user: &Document, key: &str| user.get_str(key).unwrap_or("?").to_string();
    users
        .iter()
        .filter_map(Bson::as_document)
        .map(|u| format!("{}@{}", part(u, "user"), part(u, "db")))
        .collect()
}

/// What [`required_privileges`] asks that the `granted` privileges (`authenticatedUserPrivileges`)
/// do not cover.
fn missing_privileges(granted: &[Bson], expect: &Expectations) -> Vec<Privilege> {
    let granted: Vec<(&Document, Vec<&str>)> = granted
        .iter()
        .filter_map(Bson::as_document)
        .filter_map(|p| {
            let resource = p.get_document("resource").ok()?;
            let actions = p
                .get_array("actions")
                .ok()?
                .iter()
                .filter_map(Bson::as_str)
                .collect();
            Some((resource, actions))
        })
        .collect();
    let mut missing = Vec::new();
    for need in required_privileges(expect) {
        let lacking: Vec<&'static str> = need
            .actions
            .iter()
            .copied()
            .filter(|action| {
                !granted.iter().any(|(resource, actions)| {
                    actions.contains(action) && covers(resource, &expect.database, &need.collection)
                })
            })
            .collect();
        if !lacking.is_empty() {
            missing.push(Privilege {
                collection: need.collection,
                actions: lacking,
            });
        }
    }
    missing
}

/// The user's privileges against [`required_privileges`].
pub fn check(connection_status: &Reply, expect: &Expectations) -> Finding {
    const CHECK: &str = "privileges";
    let skipped = |why: String| Finding::skipped(CHECK, why);
    let status = match connection_status {
        Ok(s) => s,
        Err(e) => return skipped(format!("the server does not answer connectionStatus ({e})")),
    };
    let auth = status.get_document("authInfo").cloned().unwrap_or_default();
    let users = authenticated_users(&auth).join(", ");
    if users.is_empty() {
        return skipped("no authenticated user (access control is off, or the URI has no credentials): every action is allowed".into());
    }
    let Ok(granted) = auth.get_array("authenticatedUserPrivileges") else {
        return skipped(format!(
            "authenticated as {users}, but the server lists no privileges"
        ));
    };
    let missing = missing_privileges(granted, expect);
    if missing.is_empty() {
        return Finding::ok(
            CHECK,
            format!("{users} holds every privilege counterd needs"),
        );
    }
    lacking(&users, &missing, expect)
}

/// The finding for `users` (`user@db, ...`) lacking the `missing` privileges, with the grant
/// that adds them.
fn lacking(users: &str, missing: &[Privilege], expect: &Expectations) -> Finding {
    const CHECK: &str = "privileges";
    let described: Vec<String> = missing
        .iter()
        .map(|p| {
            let on = if p.collection.is_empty() {
                format!("database {}", expect.database)
            } else {
                format!("{}.{}", expect.database, p.collection)
            };
            format!("{} on {on}", p.actions.join(","))
        })
        .collect();
    Finding::problem(
        CHECK,
        format!("{users} lacks {}", described.join("; ")),
        format!(
            "{}.grantPrivilegesToRole(\"counterd\", [{}]) (with the role of README.md's production checklist, step 1; {} names its database)",
            db_expr("admin"),
            privileges_js(&expect.database, missing, "").replace('\n', " "),
            js_string(&expect.database)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn resources() {
        let r = |db: &str, coll: &str| doc! {"db": db, "collection": coll};
        assert!(covers(&r("app", "comments"), "app", "comments"));
        assert!(covers(&r("app", ""), "app", "comments"));
        assert!(covers(&r("", ""), "app", "comments"));
        assert!(covers(&r("", "comments"), "app", "comments"));
        assert!(!covers(&r("other", ""), "app", "comments"));
        assert!(!covers(&r("app", "posts"), "app", "comments"));
        assert!(!covers(&doc! {"cluster": true}, "app", "comments"));
        assert!(covers(&doc! {"anyResource": true}, "app", "comments"));
    }
}
