//! TLS as configured in `mongodb_uri`: on or off, which CA the driver will trust, and whether
//! the certificate files it names can be used.
//!
//! Why check the files ourselves: the driver (rustls) trusts only its built-in roots (webpki)
//! unless `tlsCAFile` names a CA, *skips* the certificates of a CA file it cannot parse (an
//! empty or garbage file leaves it trusting nothing, and every handshake then fails with
//! "UnknownIssuer"), and reads the files only when it first connects. So before connecting,
//! counterd reads each named file and says which one is unusable and why. The reading is the
//! only I/O here ([`read_files`]); the judging ([`judge`], [`findings`]) is pure.

use std::path::PathBuf;

use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::Finding;

/// What the URI asks of TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsPlan {
    /// `tls=true` (or `ssl=true`), or a `mongodb+srv://` URI (TLS by default).
    pub enabled: bool,
    /// `tlsCAFile`: the CA the server's certificate must chain to (else webpki's roots).
    pub ca_file: Option<PathBuf>,
    /// `tlsCertificateKeyFile`: counterd's client certificate and key, in one PEM file.
    pub cert_key_file: Option<PathBuf>,
    /// `tlsInsecure` / `tlsAllowInvalidCertificates`: certificates are not verified.
    pub insecure: bool,
}

impl TlsPlan {
    /// The plan of a URI, as the driver reads it (`None`: the driver cannot parse the URI; the
    /// settings' validation says why).
    pub fn of(uri: &str) -> Option<TlsPlan> {
        use mongodb::options::{ConnectionString, HostInfo, Tls};
        let parsed = ConnectionString::parse(uri).ok()?;
        let srv = matches!(parsed.host_info, HostInfo::DnsRecord(_));
        Some(match parsed.tls {
            Some(Tls::Enabled(o)) => TlsPlan {
                enabled: true,
                ca_file: o.ca_file_path,
                cert_key_file: o.cert_key_file_path,
                insecure: o.allow_invalid_certificates.unwrap_or(false),
            },
            Some(Tls::Disabled) => TlsPlan::default(),
            None => TlsPlan {
                enabled: srv,
                ..TlsPlan::default()
            },
        })
    }
}

/// The named files' contents, or why they could not be read.
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub ca: Option<Result<Vec<u8>, String>>,
    pub cert_key: Option<Result<Vec<u8>, String>>,
}

/// Reads the files the plan names (the one I/O of this module).
pub fn read_files(plan: &TlsPlan) -> TlsFiles {
    let read = |path: &PathBuf| std::fs::read(path).map_err(|e| io_reason(&e));
    TlsFiles {
        ca: plan.ca_file.as_ref().map(read),
        cert_key: plan.cert_key_file.as_ref().map(read),
    }
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file (is the volume mounted?)".into(),
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (counterd's user cannot read it)".into()
        }
        _ => e.to_string(),
    }
}

/// A certificate file counterd cannot use: which setting, which file, why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting} {path}: {reason}")]
pub struct TlsFileError {
    pub setting: &'static str,
    pub path: String,
    pub reason: String,
}

/// How many certificates a CA file holds, or why it holds none the driver can use (it is
/// empty, a section is malformed, or none is a certificate).
pub fn check_ca(bytes: &[u8]) -> Result<usize, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("the file is empty".into());
    }
    let certs: Vec<_> = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not valid PEM: {e}"))?;
    match certs.len() {
        0 => Err("no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)".into()),
        n => Ok(n),
    }
}

/// Whether a client certificate file holds a certificate and an unencrypted private key.
pub fn check_cert_key(bytes: &[u8]) -> Result<(), String> {
    if check_ca(bytes).is_err() {
        return Err(
            "no PEM certificate in it (the file holds the client certificate and its key)".into(),
        );
    }
    if contains_label(bytes, "ENCRYPTED PRIVATE KEY") {
        return Err("its private key is encrypted, which counterd's driver cannot read: store the key unencrypted (openssl pkcs8 -nocrypt) in a file only counterd can read".into());
    }
    PrivateKeyDer::from_pem_slice(bytes)
        .map(drop)
        .map_err(|e| match e {
            pem::Error::NoItemsFound => "no PEM private key in it (expected -----BEGIN PRIVATE KEY----- after the certificate)".into(),
            other => format!("its private key is not valid PEM: {other}"),
        })
}

fn contains_label(bytes: &[u8], label: &str) -> bool {
    let begin = format!("-----BEGIN {label}-----");
    bytes.windows(begin.len()).any(|w| w == begin.as_bytes())
}

/// The first file of the plan counterd cannot use, if any.
pub fn judge(plan: &TlsPlan, files: &TlsFiles) -> Result<(), TlsFileError> {
    let fail = |setting, path: &Option<PathBuf>, reason: String| TlsFileError {
        setting,
        path: shown(path),
        reason,
    };
    if let Some(ca) = &files.ca {
        ca.as_deref()
            .map_err(String::clone)
            .and_then(check_ca)
            .map_err(|r| fail("tlsCAFile", &plan.ca_file, r))?;
    }
    if let Some(pair) = &files.cert_key {
        pair.as_deref()
            .map_err(String::clone)
            .and_then(check_cert_key)
            .map_err(|r| fail("tlsCertificateKeyFile", &plan.cert_key_file, r))?;
    }
    Ok(())
}

/// Checks the certificate files a URI names before anything connects (the I/O and the
/// judging together, for `connect`).
pub fn check_files(uri: &str) -> Result<(), TlsFileError> {
    match TlsPlan::of(uri) {
        Some(plan) => judge(&plan, &read_files(&plan)),
        None => Ok(()),
    }
}

/// TLS in a few words, for `run`'s "connected" log line: `off`, `on (CA: webpki roots)` or
/// `on (CA: /etc/counterd/ca.pem)`.
pub fn summary(plan: &TlsPlan) -> String {
    match (&plan.enabled, &plan.ca_file) {
        (false, _) => "off".into(),
        (true, None) => "on (CA: the driver's built-in webpki roots)".into(),
        (true, Some(ca)) => format!("on (CA: {})", ca.display()),
    }
}

/// The doctor's `tls` findings: on or off, the CA in use, the client certificate, and any
/// file that cannot be used.
pub fn findings(plan: &TlsPlan, files: &TlsFiles) -> Vec<Finding> {
    if !plan.enabled {
        return vec![Finding::info(
            "tls",
            "TLS off (tls=true in mongodb_uri turns it on; mongodb+srv:// has it on by default)",
        )];
    }
    let mut out = vec![ca_finding(plan, files)];
    if plan.cert_key_file.is_some() {
        out.push(match judge(plan, &TlsFiles { ca: None, ..files.clone() }) {
            Ok(()) => Finding::ok("tls", format!("client certificate {}", shown(&plan.cert_key_file))),
            Err(e) => Finding::problem("tls", format!("TLS client certificate unusable: {e}"), "point tlsCertificateKeyFile at a readable PEM file holding the certificate and its unencrypted key"),
        });
    }
    if plan.insecure {
        out.push(Finding::warning(
            "tls",
            "the server's certificate is not verified (tlsInsecure or tlsAllowInvalidCertificates)",
            "give the server's CA with tlsCAFile and remove tlsInsecure/tlsAllowInvalidCertificates",
        ));
    }
    out
}

/// The CA line: the file and its certificates, or the built-in roots.
fn ca_finding(plan: &TlsPlan, files: &TlsFiles) -> Finding {
    let Some(ca) = &files.ca else {
        return Finding::info(
            "tls",
            "TLS on; CA: the driver's built-in roots (webpki) — a private CA needs tlsCAFile",
        );
    };
    match ca.as_deref().map_err(String::clone).and_then(check_ca) {
        Ok(n) => Finding::ok(
            "tls",
            format!("TLS on; CA file {} ({n} certificate(s))", shown(&plan.ca_file)),
        ),
        Err(reason) => Finding::problem(
            "tls",
            format!("TLS on; CA file {} unusable: {reason}", shown(&plan.ca_file)),
            "point tlsCAFile at a readable PEM file holding the CA certificate(s) (mount it from a Secret or ConfigMap)",
        ),
    }
}

fn shown(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
