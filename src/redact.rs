//! Secrets that never show: one redaction for every shape of connection string, and a scrub
//! for URIs (and known secrets) found inside arbitrary text such as a driver's error.
//!
//! Why structural rather than "parse it with the driver": the URIs that leak are exactly the
//! ones the driver refuses (a password holding a raw `/`, `@` or `?`), so redaction cannot
//! depend on a URI being valid. The rule is conservative: credentials end at the *last* `@`
//! that is followed by something shaped like a host list, so a password holding `@`, `/`,
//! `:`, `?` or `#` is hidden whole; when no such `@` exists the whole URI is replaced.
//! Query options whose name suggests a secret (a password, a token, key material,
//! `authMechanismProperties`) keep their name and lose their value.
//!
//! Everything here is pure, except [`remember_secrets`], which records a configured URI's
//! secret values so that [`redact_text`] also removes them where they appear outside a URI.

use std::sync::Mutex;

/// What a connection string looks like, said without writing one (a URI-shaped example would
/// itself be redacted in the message).
pub const URI_SHAPE: &str = "expected mongodb:// or mongodb+srv:// then [user:password@]host[:port][,host…][/database][?options], with / @ : ? # % in the user or password percent-encoded";

/// What replaces a secret value.
pub const REDACTED: &str = "***";

/// What replaces a URI with no recognisable structure around its `@`.
pub const UNPARSEABLE: &str = "<unparseable URI redacted>";

/// Secrets shorter than this, or made of digits only, are not scrubbed from free text (they
/// would garble every line, and every number of a JSON log line; inside a URI they are still
/// hidden by structure).
const MIN_FREE_TEXT_SECRET: usize = 6;

/// Replaces a MongoDB URI's password and secret query options with `***` (the user name, the
/// hosts and the other options stay, so an operator still sees where counterd connects).
pub fn redact_uri(uri: &str) -> String {
    let Some((scheme, rest)) = uri.split_once("://") else {
        return redact_schemeless(uri);
    };
    match split_credentials(rest) {
        Credentials::None => format!("{scheme}://{}", redact_tail(rest)),
        Credentials::At(at) => {
            let (userinfo, hosts) = (redact_userinfo(&rest[..at]), redact_tail(&rest[at + 1..]));
            format!("{scheme}://{userinfo}@{hosts}")
        }
        Credentials::Unclear => UNPARSEABLE.to_string(),
    }
}

/// A value given where a URI was expected but without `scheme://`: shown when it is only a host
/// list (a common mistake worth seeing), hidden otherwise.
fn redact_schemeless(value: &str) -> String {
    if !value.is_empty() && value.chars().all(is_host_char) {
        value.to_string()
    } else {
        UNPARSEABLE.to_string()
    }
}

/// Where the credentials of `rest` (the URI after `://`) end.
#[derive(Debug, PartialEq, Eq)]
enum Credentials {
    /// No `@` at all: no credentials.
    None,
    /// The byte offset of the `@` that ends them.
    At(usize),
    /// An `@` but no host list after any: nothing can be shown safely.
    Unclear,
}

/// The last `@` followed by a host list that ends the URI or is followed by `/` or `?`.
fn split_credentials(rest: &str) -> Credentials {
    if !rest.contains('@') {
        return Credentials::None;
    }
    rest.match_indices('@')
        .rev()
        .map(|(i, _)| i)
        .find(|&i| {
            let hosts = &rest[i + 1..];
            let end = hosts.find(['/', '?']).unwrap_or(hosts.len());
            is_host_list(&hosts[..end]) && !in_secret_value(&rest[..i])
        })
        .map_or(Credentials::Unclear, Credentials::At)
}

/// Whether the end of `prefix` lies inside a secret option's value (`...?tlsCertificateKey
/// FilePassword=p@ss`): an `@` there belongs to the secret, not to the credentials.
fn in_secret_value(prefix: &str) -> bool {
    let Some(q) = prefix.find('?') else {
        return false;
    };
    split_options(&prefix[q + 1..])
        .into_iter()
        .rev()
        .find(|o| starts_an_option(o))
        .and_then(|o| o.trim_start_matches(['&', ';']).split_once('='))
        .is_some_and(|(name, _)| is_secret_option(name))
}

/// Characters of a host list: names, IPv4/IPv6 addresses, ports, commas between hosts, and
/// percent-encoded Unix socket paths.
fn is_host_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | ',' | '[' | ']' | '%')
}

/// Whether `s` looks like a host list: it starts like a host (a name, an address or `[` of an
/// IPv6 address) and holds only host characters.
fn is_host_list(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '[' || c == '%')
        && s.chars().all(is_host_char)
}

/// `user:password` as `user:***`; a user alone stays; anything ambiguous (a raw `@` in what
/// would be the user) is hidden whole.
fn redact_userinfo(userinfo: &str) -> String {
    // A user name never holds these raw; when it seems to, the structure is not what it seems.
    let plain = |user: &str| !user.contains(['@', '/', '?', '#', '&', ';', '=', ' ']);
    match userinfo.split_once(':') {
        Some((user, _)) if plain(user) => format!("{user}:{REDACTED}"),
        None if plain(userinfo) => userinfo.to_string(),
        _ => REDACTED.to_string(),
    }
}

/// The hosts, path and options after the credentials, with secret options' values hidden.
fn redact_tail(tail: &str) -> String {
    let Some(q) = tail.find('?') else {
        return tail.to_string();
    };
    let mut out = String::from(&tail[..=q]);
    let mut options = split_options(&tail[q + 1..]).into_iter().peekable();
    while let Some(option) = options.next() {
        let body = option.trim_start_matches(['&', ';']);
        out.push_str(&option[..option.len() - body.len()]);
        match body.split_once('=') {
            Some((name, _)) if is_secret_option(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
                // A raw `&` or `;` inside the secret: what follows up to the next `name=` is
                // part of it.
                while options.peek().is_some_and(|next| !starts_an_option(next)) {
                    options.next();
                }
            }
            _ => out.push_str(body),
        }
    }
    out
}

/// The options with the separator before each (`&`, or `;` as older drivers allowed), so that
/// joining them gives the query back.
fn split_options(query: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, _) in query.match_indices(['&', ';']) {
        parts.push(&query[start..i]);
        start = i;
    }
    parts.push(&query[start..]);
    parts
}

/// Whether an option (with its leading separator) starts with `name=`.
fn starts_an_option(option: &str) -> bool {
    let body = option.trim_start_matches(['&', ';']);
    body.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// Whether a URI option's value is a secret: a password, a secret, a token, credentials, key
/// material (but not the *path* of a key file, which `doctor` reports), or the mechanism
/// properties that carry `AWS_SESSION_TOKEN`. Matched case-insensitively, percent-decoded.
pub fn is_secret_option(name: &str) -> bool {
    let name = percent_encoding::percent_decode_str(name)
        .decode_utf8_lossy()
        .to_ascii_lowercase();
    ["password", "secret", "token", "credential", "pwd"]
        .iter()
        .any(|w| name.contains(w))
        || name == "authmechanismproperties"
        || (name.contains("key") && !name.ends_with("file"))
}

/// Replaces every URI found in `text` (any `scheme://`) by its redacted form, and every
/// remembered secret (see [`remember_secrets`]) by `***`. For error texts and log lines that
/// may embed a connection string: a driver's error, a TOML error quoting a line, a message.
pub fn redact_text(text: &str) -> String {
    scrub(&redact_text_uris(text), &remembered())
}

/// [`redact_text`] plus the secrets of `uri` itself, without remembering them (for a message
/// about a URI that is not, or not yet, the configured one).
pub fn redact_text_for(text: &str, uri: &str) -> String {
    let mut secrets = secrets_of(uri);
    secrets.extend(remembered());
    scrub(&redact_text_uris(text), &secrets)
}

/// The URIs of `text` redacted, line by line (structure only: for command output, where
/// replacing a remembered secret could alter data, e.g. a number in a JSON document).
pub fn redact_text_uris(text: &str) -> String {
    if !text.contains("://") {
        return text.to_string();
    }
    let lines: Vec<String> = text.split('\n').map(redact_line).collect();
    lines.join("\n")
}

/// One line: each `scheme://` starts a URI that runs to the last `@` of the line that is
/// followed by a host (its credentials, however odd), then to the next blank or quote.
fn redact_line(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(sep) = rest.find("://") {
        let start = scheme_start(rest, sep);
        let end = uri_end(rest, sep + 3);
        out.push_str(&rest[..start]);
        if start == sep {
            // No scheme before `://`: not a URI; keep it and go on.
            out.push_str("://");
            rest = &rest[sep + 3..];
            continue;
        }
        out.push_str(&redact_uri(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// Where the scheme ending at `sep` begins (`sep` itself when there is none).
fn scheme_start(s: &str, sep: usize) -> usize {
    let scheme_len = s[..sep]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        .count();
    sep - scheme_len
}

/// Where the URI whose host list may start at `from` ends: past the last `@` of the text that
/// is followed by a host (credentials may hold blanks and quotes), then at the next blank or
/// quote.
fn uri_end(s: &str, from: usize) -> usize {
    let body = &s[from..];
    let after_credentials = body
        .match_indices('@')
        .rev()
        .map(|(i, _)| i + 1)
        .find(|&i| body[i..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '['))
        .unwrap_or(0);
    let tail = &body[after_credentials..];
    let end = tail
        .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>'))
        .unwrap_or(tail.len());
    from + after_credentials + end
}

/// `text` with every secret replaced by `***`, longest first (a secret that holds another).
fn scrub(text: &str, secrets: &[String]) -> String {
    let mut sorted: Vec<&String> = secrets.iter().filter(|s| scrubbable(s)).collect();
    sorted.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_string();
    for secret in sorted {
        // Every log line passes here: a secret it does not hold costs no new string.
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), REDACTED);
        }
    }
    out
}

/// Whether `text` shows a stretch (4 characters or more) of one of `uri`'s secrets that the
/// redacted URI does not show anyway: for a parser's message about a URI it could not split
/// (it may quote a fragment of the credentials as a host or a port).
pub fn shows_part_of_secret(text: &str, uri: &str) -> bool {
    let visible = redact_uri(uri);
    secrets_of(uri).iter().any(|secret| {
        let chars: Vec<char> = secret.chars().collect();
        chars.windows(4).any(|w| {
            let part: String = w.iter().collect();
            text.contains(&part) && !visible.contains(&part)
        })
    })
}

/// Whether a secret is distinctive enough to be replaced wherever it appears in text.
fn scrubbable(secret: &str) -> bool {
    secret.len() >= MIN_FREE_TEXT_SECRET && !secret.chars().all(|c| c.is_ascii_digit())
}

/// The secret values of a URI as they may appear in text: the password and each secret
/// option's value, as written and percent-decoded.
pub fn secrets_of(uri: &str) -> Vec<String> {
    let rest = uri.split_once("://").map_or(uri, |(_, r)| r);
    let mut raw = Vec::new();
    let tail = match split_credentials(rest) {
        Credentials::At(at) => {
            raw.extend(rest[..at].split_once(':').map(|(_user, password)| password));
            &rest[at + 1..]
        }
        _ => rest,
    };
    if let Some((_, query)) = tail.split_once('?') {
        for (name, value) in query.split(['&', ';']).filter_map(|o| o.split_once('=')) {
            if is_secret_option(name) {
                raw.push(value);
            }
        }
    }
    let mut secrets = Vec::new();
    for value in raw {
        let decoded = percent_encoding::percent_decode_str(value)
            .decode_utf8_lossy()
            .into_owned();
        if decoded != value {
            secrets.push(decoded);
        }
        secrets.push(value.to_string());
    }
    secrets
}

/// Secrets of the configured URIs, kept for the life of the process.
static SECRETS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Records the secrets of a URI counterd is configured with, so that [`redact_text`] removes
/// them wherever they appear (a driver message that quotes a password outside any URI).
/// Called where a URI enters the process: settings loaded, a URI file read, a connection made.
pub fn remember_secrets(uri: &str) {
    let mut known = SECRETS.lock().unwrap_or_else(|p| p.into_inner());
    for secret in secrets_of(uri) {
        if scrubbable(&secret) && !known.contains(&secret) {
            known.push(secret);
        }
    }
}

fn remembered() -> Vec<String> {
    SECRETS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

#[cfg(test)]
mod tests;
