//! A driver error as one sentence an operator can act on: which host, and why (connection
//! refused, no answer, the name does not resolve, the TLS handshake failed and why, the login
//! refused, a privilege missing). Never the driver's debug text (`labels: {...}`, `Kind(...)`,
//! the topology dump of a server selection): that stays in the error's source, for `--verbose`.
//!
//! The driver gives a failed server selection as one message that embeds each server's error
//! as text, so the reasons are read from that text; everything below the driver-facing
//! [`sentence`] is pure string work, tested on the driver's real messages.

use mongodb::error::{Error as DriverError, ErrorKind, WriteFailure};

/// Longest stretch of a server's own message kept (a refused command may quote a whole
/// command document).
const MAX_MESSAGE: usize = 200;

/// The driver error as one credential-free sentence (the server's own words for a refused
/// command or login), without the driver's debug text: what errors and logs say of it.
pub(crate) fn sentence(e: &DriverError) -> String {
    match e.kind.as_ref() {
        ErrorKind::ServerSelection { message, .. } => selection_failure(message),
        ErrorKind::Command(c) => command_failure(c.code, &c.code_name, &c.message),
        ErrorKind::Authentication { message, .. } => login_refused(message),
        ErrorKind::Io(io) => plain_reason(&io.to_string()),
        ErrorKind::DnsResolve { message, .. } => {
            format!("the host name does not resolve: {}", clip(message))
        }
        ErrorKind::InvalidTlsConfig { message, .. } => {
            format!("the TLS settings cannot be used: {}", clip(message))
        }
        ErrorKind::Write(WriteFailure::WriteError(w)) => command_failure(
            w.code,
            w.code_name.as_deref().unwrap_or_default(),
            &w.message,
        ),
        ErrorKind::Write(WriteFailure::WriteConcernError(w)) => {
            format!(
                "write concern failed: {}",
                command_failure(w.code, &w.code_name, &w.message)
            )
        }
        ErrorKind::InvalidArgument { message, .. } => clip(message),
        _ => clip(first_line(&e.to_string())),
    }
}

/// A failed server selection: each server's reason (`db1:27017: connection refused`), or what
/// the selection lacked (a primary, a server matching the read preference).
pub(crate) fn selection_failure(message: &str) -> String {
    let servers = server_errors(message);
    if !servers.is_empty() {
        return servers
            .iter()
            .map(|(address, reason)| format!("{address}: {}", plain_reason(reason)))
            .collect::<Vec<_>>()
            .join("; ");
    }
    if message.contains("ReplicaSetNoPrimary") {
        return "no primary is available (the replica set is electing one, or has lost its majority)".into();
    }
    if message.contains("suitable for criteria") || message.contains("Servers: [ {") {
        return "no server answered as needed (a primary, or one matching the read preference)"
            .into();
    }
    "no server answered".into()
}

/// The `(address, error text)` of each server in a selection message's topology dump:
/// `{ Address: db1:27017, Type: Unknown, Error: Kind: I/O error: ..., labels: {...}, ... }`.
fn server_errors(message: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for server in message.split("Address: ").skip(1) {
        let address = server.split([',', ' ']).next().unwrap_or_default();
        let Some((_, error)) = server.split_once("Error: ") else {
            continue;
        };
        let error = error.strip_prefix("Kind: ").unwrap_or(error);
        let end = [", labels:", ", source:", " }"]
            .iter()
            .filter_map(|m| error.find(m))
            .min()
            .unwrap_or(error.len());
        found.push((address.to_string(), error[..end].to_string()));
    }
    found
}

/// A connection-level reason in plain words: the cause first, then its detail when it adds
/// something (a TLS failure says which).
pub(crate) fn plain_reason(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let known: [(&[&str], &str); 8] = [
        (
            &["connection refused"],
            "connection refused (is the server running on that host and port?)",
        ),
        (
            &["timed out", "deadline has elapsed"],
            "no answer (timed out: a firewall, a wrong port, or a paused server)",
        ),
        (
            &[
                "failed to lookup address",
                "name or service not known",
                "no such host",
            ],
            "the host name does not resolve",
        ),
        (&["connection reset"], "the connection was reset"),
        (&["broken pipe"], "the connection was closed"),
        (
            &["unexpected end of file"],
            "the connection was closed during the handshake (does the server expect TLS, or not?)",
        ),
        (&["network is unreachable"], "the network is unreachable"),
        (&["no route to host"], "no route to the host"),
    ];
    if let Some(reason) = tls_reason(&lower) {
        return reason;
    }
    if lower.contains("authentication") || lower.contains("scram") {
        return login_refused(text);
    }
    known
        .iter()
        .find(|(needles, _)| needles.iter().any(|n| lower.contains(n)))
        .map(|(_, said)| said.to_string())
        .unwrap_or_else(|| clip(strip_io_noise(text)))
}

/// A TLS failure and what to do about it, if `lower` (lowercased) is one.
fn tls_reason(lower: &str) -> Option<String> {
    let causes = [
        ("unknownissuer", "the server's certificate is not signed by a CA counterd trusts: a private CA needs tlsCAFile=/path/to/ca.pem in mongodb_uri"),
        ("notvalidforname", "the server's certificate does not name the host in mongodb_uri"),
        ("expired", "the server's certificate has expired"),
        ("notvalidyet", "the server's certificate is not valid yet (check the clocks)"),
        ("badsignature", "the server's certificate has a bad signature"),
        ("certificaterequired", "the server requires a client certificate: set tlsCertificateKeyFile in mongodb_uri"),
        ("unknown ca", "the server does not trust counterd's client certificate"),
        ("bad certificate", "the server refused counterd's client certificate"),
        ("corrupt message", "the server did not answer in TLS (is TLS enabled on the server?)"),
        ("invalidcontenttype", "the server did not answer in TLS (is TLS enabled on the server?)"),
    ];
    let tls_words = ["certificate", "tls", "handshake", "invalidcontenttype"];
    if !tls_words.iter().any(|w| lower.contains(w)) {
        return None;
    }
    let why = causes
        .iter()
        .find(|(needle, _)| lower.contains(needle))
        .map(|(_, said)| said.to_string())
        .unwrap_or_else(|| clip(strip_io_noise(lower)));
    Some(format!("TLS handshake failed: {why}"))
}

/// A refused login, with what to check.
fn login_refused(message: &str) -> String {
    format!(
        "authentication refused ({}): check the credentials (user and password) in mongodb_uri, and authSource",
        clip(first_line(message)).trim_end_matches('.')
    )
}

/// A refused command or write: `Unauthorized` names the action and the namespace, others the
/// server's words and code.
pub(crate) fn command_failure(code: i32, code_name: &str, message: &str) -> String {
    if let Some(said) = unauthorized(message).filter(|_| code == 13) {
        return said;
    }
    if code == 18 {
        return login_refused(message);
    }
    let message = message.split(" {").next().unwrap_or(message);
    let name = Some(code_name).filter(|n| !n.is_empty());
    let name = name.map(|n| format!(" {n}")).unwrap_or_default();
    format!("{} (code {code}{name})", clip(message))
}

/// `not authorized on db to execute command { insert: "coll", ... }` as
/// `not authorized to run insert on db.coll`.
fn unauthorized(message: &str) -> Option<String> {
    let rest = message.strip_prefix("not authorized on ")?;
    let (db, command) = rest.split_once(" to execute command ")?;
    let body = command.trim_start_matches(['{', ' ']);
    let (action, target) = body.split_once(':')?;
    let target = target
        .trim_start()
        .split([',', ' ', '}'])
        .next()?
        .trim_matches('"');
    let on = if target.is_empty() || target == "1" {
        db.to_string()
    } else {
        format!("{db}.{target}")
    };
    Some(format!(
        "not authorized to run {action} on {on}: grant the user the role `counterd doctor` prints"
    ))
}

/// The driver's wrapping (`I/O error: `, ` (os error 111)`) taken off an I/O reason.
fn strip_io_noise(text: &str) -> &str {
    let text = text.trim();
    let text = text.strip_prefix("I/O error: ").unwrap_or(text);
    text.split(" (os error").next().unwrap_or(text)
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// At most [`MAX_MESSAGE`] characters, and never the driver's labels.
fn clip(text: &str) -> String {
    let text = text.split(", labels:").next().unwrap_or(text).trim();
    match text.char_indices().nth(MAX_MESSAGE) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As the driver (3.9) says it for a port nothing listens on.
    const REFUSED: &str = "Server selection timeout: No available servers. Topology: { Type: Unknown, Servers: [ { Address: localhost:1, Type: Unknown, Error: Kind: I/O error: Connection refused (os error 111), labels: {\"RetryableError\", \"SystemOverloadedError\"}, source: None, server response: None } ] }";

    #[test]
    fn a_refused_connection_names_the_host_and_no_debug_text() {
        let said = selection_failure(REFUSED);
        assert!(
            said.starts_with("localhost:1: connection refused"),
            "{said}"
        );
        for debug in ["labels", "Kind", "Topology", "{", "os error"] {
            assert!(!said.contains(debug), "{debug}: {said}");
        }
    }

    #[test]
    fn each_server_of_several_is_named() {
        let two = "Server selection timeout: No available servers. Topology: { Type: ReplicaSetNoPrimary, Servers: [ { Address: db1:27017, Type: Unknown, Error: Kind: I/O error: timed out, labels: {}, source: None }, { Address: db2:27017, Type: Unknown, Error: Kind: I/O error: failed to lookup address information: Name or service not known, labels: {} } ] }";
        let said = selection_failure(two);
        assert!(said.contains("db1:27017: no answer (timed out"), "{said}");
        assert!(
            said.contains("db2:27017: the host name does not resolve"),
            "{said}"
        );
        let no_primary = "Server selection timeout: None of the available servers suitable for criteria Primary. Topology: { Type: ReplicaSetNoPrimary, Set Name: rs0, Servers: [] }";
        assert!(selection_failure(no_primary).starts_with("no primary is available"));
    }

    #[test]
    fn tls_failures_say_why_and_what_to_do() {
        let issuer = "Kind: I/O error: invalid peer certificate: UnknownIssuer, labels: {}";
        let said = plain_reason(issuer);
        assert!(
            said.starts_with("TLS handshake failed: ") && said.contains("tlsCAFile"),
            "{said}"
        );
        let name = plain_reason("invalid peer certificate: NotValidForName");
        assert!(name.contains("does not name the host"), "{name}");
        let plain_server = plain_reason("received corrupt message of type InvalidContentType");
        assert!(
            plain_server.contains("did not answer in TLS"),
            "{plain_server}"
        );
    }

    #[test]
    fn refused_commands_name_the_action_and_collection() {
        let said = command_failure(
            13,
            "Unauthorized",
            "not authorized on app to execute command { insert: \"comment_counters\", ordered: true, $db: \"app\" }",
        );
        assert_eq!(
            said,
            "not authorized to run insert on app.comment_counters: grant the user the role `counterd doctor` prints"
        );
        let login = command_failure(18, "AuthenticationFailed", "Authentication failed.");
        assert!(
            login.starts_with("authentication refused (Authentication failed)"),
            "{login}"
        );
        let other = command_failure(2, "BadValue", "unknown operator: $foo { filter: 1 }");
        assert_eq!(other, "unknown operator: $foo (code 2 BadValue)");
    }

    #[test]
    fn io_noise_is_stripped_and_long_text_clipped() {
        assert_eq!(
            plain_reason("I/O error: something odd (os error 99)"),
            "something odd"
        );
        let long = "x".repeat(500);
        assert_eq!(clip(&long).chars().count(), MAX_MESSAGE + 1);
    }

    #[test]
    fn driver_errors_become_one_sentence() {
        use std::io::ErrorKind;
        // Only I/O errors can be made outside the driver; the texts above cover the others.
        for (kind, start) in [
            (ErrorKind::ConnectionRefused, "connection refused"),
            (ErrorKind::ConnectionReset, "the connection was reset"),
        ] {
            let said = sentence(&DriverError::from(std::io::Error::from(kind)));
            assert!(said.starts_with(start), "{said}");
        }
    }
}
