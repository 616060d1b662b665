use super::*;
use crate::doctor::Level;

fn fixture(name: &str) -> Vec<u8> {
    let dir = env!("CARGO_MANIFEST_DIR");
    std::fs::read(format!("{dir}/fixtures/tls/{name}")).unwrap()
}

#[test]
fn a_ca_file_is_counted_or_refused_with_its_reason() {
    assert_eq!(check_ca(&fixture("ca.pem")), Ok(1));
    assert_eq!(check_ca(&fixture("client.pem")), Ok(1));
    assert_eq!(
        check_ca(&fixture("empty.pem")),
        Err("the file is empty".into())
    );
    assert!(check_ca(&fixture("garbage.pem"))
        .unwrap_err()
        .starts_with("no PEM certificate"));
    assert!(check_ca(&fixture("broken.pem"))
        .unwrap_err()
        .starts_with("not valid PEM"));
}

#[test]
fn a_client_certificate_needs_its_unencrypted_key() {
    assert_eq!(check_cert_key(&fixture("client.pem")), Ok(()));
    let ca_only = check_cert_key(&fixture("ca.pem")).unwrap_err();
    assert!(ca_only.starts_with("no PEM private key"), "{ca_only}");
    let encrypted = check_cert_key(&fixture("client-encrypted.pem")).unwrap_err();
    assert!(encrypted.contains("encrypted"), "{encrypted}");
    assert!(check_cert_key(&fixture("empty.pem")).is_err());
    assert!(check_cert_key(&fixture("garbage.pem")).is_err());
}

#[test]
fn the_plan_follows_the_uri() {
    assert_eq!(TlsPlan::of("mongodb://h/"), Some(TlsPlan::default()));
    let plan =
        TlsPlan::of("mongodb://h/?tls=true&tlsCAFile=/etc/ca.pem&tlsCertificateKeyFile=/etc/c.pem")
            .unwrap();
    assert!(plan.enabled && !plan.insecure);
    assert_eq!(plan.ca_file, Some(PathBuf::from("/etc/ca.pem")));
    assert_eq!(plan.cert_key_file, Some(PathBuf::from("/etc/c.pem")));
    let plan = |uri: &str| TlsPlan::of(uri).unwrap();
    assert!(plan("mongodb://h/?ssl=true&tlsInsecure=true").insecure);
    assert!(plan("mongodb+srv://cluster0.example.net/").enabled);
    assert!(!plan("mongodb+srv://cluster0.example.net/?tls=false").enabled);
}

#[test]
fn a_missing_file_is_named_with_its_setting() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let uri = format!("mongodb://h/?tls=true&tlsCAFile={dir}/fixtures/tls/nope.pem");
    let e = check_files(&uri).unwrap_err();
    assert_eq!(e.setting, "tlsCAFile");
    assert!(e.to_string().contains("nope.pem: no such file"), "{e}");
    let uri = format!("mongodb://h/?tls=true&tlsCAFile={dir}/fixtures/tls/ca.pem&tlsCertificateKeyFile={dir}/fixtures/tls/garbage.pem");
    let e = check_files(&uri).unwrap_err();
    assert_eq!(e.setting, "tlsCertificateKeyFile");
    assert!(check_files(&format!(
        "mongodb://h/?tls=true&tlsCAFile={dir}/fixtures/tls/ca.pem"
    ))
    .is_ok());
    assert!(
        check_files("mongodb://h/").is_ok(),
        "nothing named, nothing to check"
    );
}

#[test]
fn doctor_says_tls_on_or_off_and_which_ca() {
    let off = findings(&TlsPlan::default(), &TlsFiles::default());
    assert!(off[0].message.starts_with("TLS off"), "{off:?}");
    let builtin = TlsPlan {
        enabled: true,
        ..TlsPlan::default()
    };
    let said = findings(&builtin, &TlsFiles::default());
    assert!(
        said[0].message.contains("built-in roots (webpki)")
            && said[0].message.contains("tlsCAFile")
    );
    let with_ca = TlsPlan {
        enabled: true,
        ca_file: Some("/etc/ca.pem".into()),
        ..TlsPlan::default()
    };
    // The findings with the CA file `/etc/ca.pem` holding the fixture `name`.
    let ca_file_holding = |name: &str| {
        let files = TlsFiles {
            ca: Some(Ok(fixture(name))),
            cert_key: None,
        };
        findings(&with_ca, &files)
    };
    let good = ca_file_holding("ca.pem");
    assert_eq!(
        (good[0].level, good[0].message.as_str()),
        (Level::Ok, "TLS on; CA file /etc/ca.pem (1 certificate(s))")
    );
    let bad = ca_file_holding("garbage.pem");
    assert_eq!(bad[0].level, Level::Problem);
    assert!(
        bad[0]
            .message
            .contains("/etc/ca.pem unusable: no PEM certificate"),
        "{bad:?}"
    );
    let insecure = TlsPlan {
        insecure: true,
        ..builtin
    };
    assert!(findings(&insecure, &TlsFiles::default())
        .iter()
        .any(|f| f.level == Level::Warning));
}

#[test]
fn the_summary_names_the_ca() {
    assert_eq!(summary(&TlsPlan::default()), "off");
    let on = TlsPlan {
        enabled: true,
        ..TlsPlan::default()
    };
    assert!(summary(&on).contains("webpki"));
    let ca = TlsPlan {
        ca_file: Some("/etc/ca.pem".into()),
        ..on
    };
    assert_eq!(summary(&ca), "on (CA: /etc/ca.pem)");
}
