use super::*;
use proptest::prelude::*;

#[test]
fn every_uri_shape_keeps_its_hosts_and_loses_its_password() {
    for (uri, shown) in [
        (
            "mongodb://alice:s3cret@db1:27017,db2/?replicaSet=rs0",
            "mongodb://alice:***@db1:27017,db2/?replicaSet=rs0",
        ),
        ("mongodb://db1:27017/", "mongodb://db1:27017/"),
        ("mongodb://db1", "mongodb://db1"),
        (
            "mongodb+srv://bob:pw@cluster0.example.net/app?retryWrites=true",
            "mongodb+srv://bob:***@cluster0.example.net/app?retryWrites=true",
        ),
        // A raw `/`, `@`, `:`, `?`, `#` in the password (the driver refuses them; we hide them).
        (
            "mongodb://u:s3cr/et@pa:ss%25?#+=zz@localhost:1/",
            "mongodb://u:***@localhost:1/",
        ),
        ("mongodb://u:a/b@h/db", "mongodb://u:***@h/db"),
        ("mongodb://u:p?q@h", "mongodb://u:***@h"),
        // Percent-encoded.
        (
            "mongodb://u:s3cr%2Fet%40pa%3Ass@h1,h2:27018/?tls=true",
            "mongodb://u:***@h1,h2:27018/?tls=true",
        ),
        // A user without a password (X.509), and an empty password.
        (
            "mongodb://CN%3Dclient@h/?authMechanism=MONGODB-X509",
            "mongodb://CN%3Dclient@h/?authMechanism=MONGODB-X509",
        ),
        ("mongodb://u:@h/", "mongodb://u:***@h/"),
        // IPv6 and a Unix socket.
        ("mongodb://u:p@[::1]:27017/", "mongodb://u:***@[::1]:27017/"),
        (
            "mongodb://u:p@%2Ftmp%2Fmongodb-27017.sock/",
            "mongodb://u:***@%2Ftmp%2Fmongodb-27017.sock/",
        ),
        // Secret options.
        (
            "mongodb://h/?tls=true&tlsCertificateKeyFile=/etc/k.pem&tlsCertificateKeyFilePassword=kp4ss",
            "mongodb://h/?tls=true&tlsCertificateKeyFile=/etc/k.pem&tlsCertificateKeyFilePassword=***",
        ),
        (
            "mongodb://AKIA:s%2Fk@h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok3n",
            "mongodb://AKIA:***@h/?authMechanism=MONGODB-AWS&authMechanismProperties=***",
        ),
        ("mongodb://h/?apiKey=k;w=1", "mongodb://h/?apiKey=***;w=1"),
        (
            "mongodb://h/?tlsCertificateKeyFilePassword=a&b:c;d&w=1",
            "mongodb://h/?tlsCertificateKeyFilePassword=***&w=1",
        ),
        // Idempotent.
        ("mongodb://u:***@h/", "mongodb://u:***@h/"),
        // A raw `@` where the user would be: hidden whole.
        ("mongodb://a@b@h/", "mongodb://***@h/"),
        // Nothing shaped like a host after any `@`.
        ("mongodb://u:p@/x", UNPARSEABLE),
        ("mongodb://u:p@", UNPARSEABLE),
        // Without a scheme.
        ("localhost:27017", "localhost:27017"),
        ("u:p@localhost", UNPARSEABLE),
        ("", UNPARSEABLE),
    ] {
        assert_eq!(redact_uri(uri), shown, "{uri}");
    }
}

#[test]
fn secret_option_names() {
    for secret in [
        "tlsCertificateKeyFilePassword",
        "sslPEMKeyPassword",
        "authMechanismProperties",
        "AuthMechanismProperties",
        "apiKey",
        "clientSecret",
        "accessToken",
        "tlsCertificateKeyFile%50assword",
    ] {
        assert!(is_secret_option(secret), "{secret}");
    }
    for plain in [
        "tls",
        "tlsCAFile",
        "tlsCertificateKeyFile",
        "replicaSet",
        "authSource",
        "appName",
        "w",
    ] {
        assert!(!is_secret_option(plain), "{plain}");
    }
}

#[test]
fn uris_inside_text_are_redacted_and_the_rest_stays() {
    let text = "setting `mongodb_uri` = \"mongodb://u:s3cr/et@pa:ss@db:27017/\": not a valid connection string (expected mongodb:// then [user:password@]host)";
    assert_eq!(
        redact_text(text),
        "setting `mongodb_uri` = \"mongodb://u:***@db:27017/\": not a valid connection string (expected mongodb:// then [user:password@]host)"
    );
    assert_eq!(
        redact_text("a mongodb://x:y z@h/ and b"),
        "a mongodb://x:***@h/ and b"
    );
    assert_eq!(
        redact_text("two: mongodb://a:1111@h1/ and mongodb+srv://b:2222@h2/?x=1\nnext line"),
        "two: mongodb://a:***@h2/?x=1\nnext line",
        "credentials end at the last host-like `@` of the line: more is hidden, never less"
    );
    assert_eq!(redact_text("no uri here"), "no uri here");
    assert_eq!(redact_text("odd ://x"), "odd ://x");
}

#[test]
fn secrets_of_a_uri_are_found_raw_and_decoded() {
    let uri = "mongodb://u:p%2Fw0rd@h/?tlsCertificateKeyFilePassword=k%40y9";
    let secrets = secrets_of(uri);
    for s in ["p%2Fw0rd", "p/w0rd", "k%40y9", "k@y9"] {
        assert!(secrets.iter().any(|x| x == s), "{s}: {secrets:?}");
    }
    assert_eq!(
        redact_text_for("login failed for p/w0rd and k@y9", uri),
        "login failed for *** and k@y9",
        "4 characters: too short to scrub from free text"
    );
    assert_eq!(
        redact_text_for(
            "count 1234567 for s3cret!",
            "mongodb://u:1234567@h/?apiKey=s3cret!"
        ),
        "count 1234567 for ***",
        "digits alone are not scrubbed (they would alter numbers)"
    );
}

/// Characters that break naive redaction, plus letters.
const HARD: &str = "/@:%?#+=&;abcXYZ019 ";

fn password() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        proptest::sample::select(HARD.chars().collect::<Vec<_>>()),
        1..24,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

fn encode(p: &str) -> String {
    percent_encoding::utf8_percent_encode(p, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// Substrings of `secret` (4 characters or more) that appear in `shown` and not in `skeleton`
/// (the URI without its secret): a leak.
pub(crate) fn leaked(secret: &str, skeleton: &str, shown: &str) -> Option<String> {
    let chars: Vec<char> = secret.chars().collect();
    for len in (4..=chars.len()).rev() {
        for w in chars.windows(len) {
            let part: String = w.iter().collect();
            if shown.contains(&part) && !skeleton.contains(&part) && !REDACTED.contains(&part) {
                return Some(part);
            }
        }
    }
    None
}

fn uri_with(scheme: &str, password: &str, hosts: &str, option: &str) -> String {
    format!("{scheme}://user:{password}@{hosts}/db?{option}")
}

proptest! {
    #[test]
    fn no_password_survives_redaction(
        raw in password(),
        encoded in any::<bool>(),
        srv in any::<bool>(),
        hosts in proptest::sample::select(vec!["db1", "db1:27017,db2:27018", "[::1]:27017", "cluster0.example.net"]),
        in_option in any::<bool>(),
    ) {
        // In an option's value a raw `&name=` (or `;name=`) starts another option, by the
        // URI's own syntax, and a blank ends a URI in text: those are not in raw option values.
        let raw = if in_option && !encoded { raw.replace([' ', '&', ';'], "_") } else { raw };
        let secret = if encoded { encode(&raw) } else { raw.clone() };
        let scheme = if srv { "mongodb+srv" } else { "mongodb" };
        let (uri, skeleton) = if in_option {
            (format!("{scheme}://{hosts}/db?tls=true&tlsCertificateKeyFilePassword={secret}&w=1"),
             format!("{scheme}://{hosts}/db?tls=true&tlsCertificateKeyFilePassword=&w=1"))
        } else {
            (uri_with(scheme, &secret, hosts, "replicaSet=rs0"), uri_with(scheme, "", hosts, "replicaSet=rs0"))
        };
        let shown = redact_uri(&uri);
        prop_assert_eq!(leaked(&secret, &skeleton, &shown), None, "{} -> {}", uri, shown);
        prop_assert_eq!(leaked(&raw, &skeleton, &shown), None, "{} -> {}", uri, shown);
        // The words around the URI are part of the skeleton: "error: cannot" holds ": ca".
        let in_text = |uri: &str| format!("error: cannot use \"{uri}\": refused\nnext");
        let said = redact_text(&in_text(&uri));
        prop_assert_eq!(leaked(&secret, &in_text(&skeleton), &said), None, "{} -> {}", uri, said);
        if !in_option && !raw.contains(['&', ';', '#', '?', ' ']) {
            prop_assert!(shown.contains(hosts) || shown == UNPARSEABLE, "{} -> {}", uri, shown);
        }
        prop_assert_eq!(redact_uri(&shown), shown.clone(), "idempotent");
    }
}

#[test]
fn a_fragment_of_a_secret_is_found() {
    let uri = "mongodb://alice::::#?/@h:1/";
    assert!(shows_part_of_secret(
        "invalid server address alice::::#: got :::#",
        uri
    ));
    assert!(!shows_part_of_secret("password must be URL encoded", uri));
    let alice99 = "mongodb://alice:alice99@h:1/";
    assert!(
        !shows_part_of_secret("alice at h:1", alice99),
        "the user shows anyway"
    );
    assert!(shows_part_of_secret("got ice99", alice99));
}
