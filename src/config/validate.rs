//! Range checks that types alone cannot express, each naming the setting and what is allowed.

use std::time::Duration;

use super::{ConfigError, InitialSnapshot, Settings, SoftDeleteRule};
use crate::redact::{redact_uri, URI_SHAPE};

/// What a field setting must look like.
pub(super) const PATH_SHAPE: &str =
    "expected a field name or a dotted path: not empty, no empty part, no part starting with `$`";

/// A setting's value is out of range: `message` says what is allowed.
pub(super) fn bad(name: &str, value: impl ToString, message: impl Into<String>) -> ConfigError {
    ConfigError::invalid(name, "settings", value, message)
}

/// An entry's problem named as its setting (`counters[1].name`, `sources[0].collection`): the
/// entry `i` of the list `list`.
pub(super) fn in_entry(list: &str, i: usize, mut e: ConfigError) -> ConfigError {
    if let ConfigError::Invalid { name, .. } = &mut e {
        *name = format!("{list}[{i}].{name}");
    }
    e
}

impl Settings {
    /// Range checks that types alone cannot express, for these settings and every source
    /// derived from them (`[[sources]]`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_own()?;
        self.sources().map(drop)
    }

    /// [`Settings::validate`] for these settings alone: names, sizes, the reconciler's and
    /// the process's settings, in this order (the first problem is the one reported).
    pub(super) fn validate_own(&self) -> Result<(), ConfigError> {
        self.check_names()?;
        self.check_sizes()?;
        self.check_reconcile()?;
        self.check_process()
    }

    /// Collection names, field names, definitions and the soft-delete rule.
    fn check_names(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("comments_collection", &self.comments_collection),
            ("counters_collection", &self.counters_collection),
        ] {
            if let Some(problem) = collection_name_problem(value) {
                return Err(bad(name, value, problem));
            }
        }
        if !self.collection_prefix.is_empty() {
            if let Some(problem) = collection_name_problem(&self.collection_prefix) {
                return Err(bad("collection_prefix", &self.collection_prefix, problem));
            }
        }
        if let Some((name, value)) = self.schema().problem() {
            return Err(bad(name, value, PATH_SHAPE));
        }
        self.definitions()?;
        if self.soft_delete == SoftDeleteRule::OneOf && self.soft_delete_values.is_empty() {
            return Err(bad(
                "soft_delete_values",
                "[]",
                "soft_delete = \"one_of\" needs at least one value",
            ));
        }
        if self.counters_collection == self.comments_collection {
            return Err(bad(
                "counters_collection",
                &self.counters_collection,
                "must differ from comments_collection",
            ));
        }
        Ok(())
    }

    /// Snapshot chunks, the memory budget, batches and buckets.
    fn check_sizes(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.snapshot_chunk_rows) {
            return Err(bad(
                "snapshot_chunk_rows",
                self.snapshot_chunk_rows,
                "expected 1 to 10000 rows",
            ));
        }
        if self.initial_snapshot == InitialSnapshot::Auto && !self.attribution.uses_ledger() {
            return Err(bad(
                "initial_snapshot",
                "auto",
                "the initial snapshot keeps its counts honest through the comment ledger: use attribution = \"auto\" or \"ledger\", or set initial_snapshot = \"never\"",
            ));
        }
        let least = crate::core::cost::min_budget(self.streams_per_process());
        if self.memory_budget != 0 && self.memory_budget < least as u64 {
            return Err(bad(
                "memory_budget",
                self.memory_budget,
                format!(
                    "too small to hold one event beside a server reply per stream ({} streams): at least {least} bytes (or 0: derived from the container's memory limit)",
                    self.streams_per_process()
                ),
            ));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(bad("batch_size", self.batch_size, "allowed: 1 to 100000"));
        }
        if self.max_batch_size < self.batch_size || self.max_batch_size > 100_000 {
            return Err(bad(
                "max_batch_size",
                self.max_batch_size,
                "expected at least batch_size and at most 100000",
            ));
        }
        if self.bucket_width < Duration::from_secs(1) || self.bucket_width.subsec_nanos() != 0 {
            return Err(bad(
                "bucket_width",
                humantime::format_duration(self.bucket_width),
                "allowed: whole seconds, at least 1s",
            ));
        }
        Ok(())
    }

    /// The reconciler's pace and sweep.
    fn check_reconcile(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.reconcile_jitter) {
            return Err(bad(
                "reconcile_jitter",
                self.reconcile_jitter,
                "allowed: 0.0 to 1.0",
            ));
        }
        if self.reconcile_max_posts == 0 {
            return Err(bad("reconcile_max_posts", "0", "allowed: at least 1"));
        }
        if self.catch_up_timeout < Duration::from_millis(100) {
            return Err(bad(
                "catch_up_timeout",
                humantime::format_duration(self.catch_up_timeout),
                "allowed: at least 100ms",
            ));
        }
        if self.sweep_window == 0 {
            return Err(bad("sweep_window", "0", "allowed: at least 1"));
        }
        Ok(())
    }

    /// Logs, leases, partitions, the HTTP address, the start, the URI and readiness.
    fn check_process(&self) -> Result<(), ConfigError> {
        if !matches!(self.log_format.as_str(), "text" | "json") {
            return Err(bad("log_format", &self.log_format, "allowed: text, json"));
        }
        if self.lease_renew >= self.lease_ttl {
            return Err(bad(
                "lease_renew",
                humantime::format_duration(self.lease_renew),
                "must be shorter than lease_ttl",
            ));
        }
        if !(1..=256).contains(&self.partitions) {
            return Err(bad("partitions", self.partitions, "allowed: 1 to 256"));
        }
        if self.http_addr.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad(
                "http_addr",
                &self.http_addr,
                "expected host:port, e.g. 127.0.0.1:9187",
            ));
        }
        if !self.start_at.is_empty() && self.start_at_timestamp().is_none() {
            return Err(bad(
                "start_at",
                &self.start_at,
                "expected an RFC 3339 time, e.g. 2026-01-31T12:00:00Z",
            ));
        }
        self.check_uri()?;
        if self.ready_max_stall < Duration::from_secs(1) {
            return Err(bad(
                "ready_max_stall",
                humantime::format_duration(self.ready_max_stall),
                "allowed: at least 1s",
            ));
        }
        Ok(())
    }

    /// `mongodb_uri` is a connection string counterd can use: its shape, what the driver
    /// parses, and not the manifests' placeholder password.
    pub(super) fn check_uri(&self) -> Result<(), ConfigError> {
        if !self.mongodb_uri.starts_with("mongodb://")
            && !self.mongodb_uri.starts_with("mongodb+srv://")
        {
            return Err(bad("mongodb_uri", redact_uri(&self.mongodb_uri), URI_SHAPE));
        }
        if let Err(e) = mongodb::options::ConnectionString::parse(&self.mongodb_uri) {
            // The driver's reason, without echoing the URI (it may hold a password).
            let reason = match e.kind.as_ref() {
                mongodb::error::ErrorKind::InvalidArgument { message, .. } => message.clone(),
                _ => e.to_string(),
            };
            let reason = if reason.contains("cert-key-password") {
                "tlsCertificateKeyFilePassword is not supported: counterd reads only an unencrypted client key (convert it with openssl pkcs8 -nocrypt and keep the file readable by counterd alone)".to_string()
            } else {
                reason
            };
            let reason = safe_reason(&reason, &self.mongodb_uri);
            return Err(bad(
                "mongodb_uri",
                redact_uri(&self.mongodb_uri),
                format!("not a valid connection string: {reason} ({URI_SHAPE})"),
            ));
        }
        if super::has_placeholder_password(&self.mongodb_uri) {
            return Err(bad(
                "mongodb_uri",
                redact_uri(&self.mongodb_uri),
                format!("the password is the shipped manifests' placeholder `{}`: create the Secret with the real connection string (kubectl create secret generic ..., see deploy/README.md) instead of applying the placeholder", super::PLACEHOLDER_PASSWORD),
            ));
        }
        Ok(())
    }
}

/// Why `name` cannot be a collection name (`None`: it can).
pub(super) fn collection_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("must not be empty")
    } else if name.contains('$') || name.contains('\0') {
        Some("must not contain `$` or a NUL character")
    } else if name.starts_with("system.") {
        Some("must not start with `system.`")
    } else {
        None
    }
}

/// The driver's reason for refusing a URI, without any part of its secrets: a URI it could not
/// split may be quoted in pieces (a fragment of the password read as a host or a port), and
/// then only the likely cause is said.
fn safe_reason(reason: &str, uri: &str) -> String {
    let reason = crate::redact::redact_text_for(&reason.replace(uri, "<uri>"), uri);
    if crate::redact::shows_part_of_secret(&reason, uri) {
        "it does not split into user:password@hosts (a character of the password that must be percent-encoded, such as / @ : ? # % or a space, is written as it is)".into()
    } else {
        reason
    }
}
