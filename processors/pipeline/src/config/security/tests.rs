//! Loading and checking the security settings: secrets from files, the errors that name the
//! setting, and secrets kept out of every printed form.

use super::super::{load_layered, InfraSettings};
use super::*;
use std::collections::HashMap;
use std::io::Write;

/// A file of the test's own under the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn with(contents: &str) -> Self {
        let n: u64 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("stocksvr-secret-{}-{n}-{seq}", std::process::id()));
        let mut f = std::fs::File::create(&path).expect("temp file");
        f.write_all(contents.as_bytes()).expect("write");
        Self(path)
    }

    fn path(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn load(vars: &[(&str, &str)]) -> Result<InfraSettings, ConfigError> {
    let env: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut s: InfraSettings = load_layered(None, Some(env))?;
    resolve_connections(&mut s.kafka, &mut s.registry, &mut s.mysql, &mut s.redis)?;
    Ok(s)
}

fn error_of(vars: &[(&str, &str)]) -> String {
    load(vars).expect_err("must be refused").to_string()
}

#[test]
fn the_defaults_stay_plaintext_and_need_no_file() {
    let s = load(&[]).expect("defaults");
    assert_eq!(s.kafka.security_protocol, SecurityProtocol::Plaintext);
    assert!(s.kafka.tls.is_empty() && s.registry.tls.is_empty() && s.redis.tls.is_empty());
    assert!(s.registry.token.is_none());
}

#[test]
fn secrets_come_from_files_without_their_trailing_line_break() {
    let kafka = TempFile::with("k-s3cret\n");
    let registry = TempFile::with("r-s3cret\r\n");
    let token = TempFile::with("t0ken-value\n");
    let mysql = TempFile::with("m/s3cret@x\n");
    let redis = TempFile::with("r3dis\n");
    let ca = TempFile::with("-----BEGIN CERTIFICATE-----\n");
    let s = load(&[
        ("STOCKSVR__KAFKA__SECURITY_PROTOCOL", "sasl_ssl"),
        ("STOCKSVR__KAFKA__SASL__MECHANISM", "SCRAM-SHA-512"),
        ("STOCKSVR__KAFKA__SASL__USERNAME", "stocksvr"),
        ("STOCKSVR__KAFKA__SASL__PASSWORD_FILE", &kafka.path()),
        ("STOCKSVR__KAFKA__TLS__CA_FILE", &ca.path()),
        ("STOCKSVR__REGISTRY__URL", "https://r:8443/apis/ccompat/v7"),
        ("STOCKSVR__REGISTRY__USERNAME", "stocksvr"),
        ("STOCKSVR__REGISTRY__PASSWORD_FILE", &registry.path()),
        (
            "STOCKSVR__MYSQL__URL",
            "mysql://stocksvr@db:3306/stocksvr?ssl-mode=VERIFY_IDENTITY",
        ),
        ("STOCKSVR__MYSQL__PASSWORD_FILE", &mysql.path()),
        ("STOCKSVR__REDIS__URL", "rediss://stocksvr@r:6380/"),
        ("STOCKSVR__REDIS__PASSWORD_FILE", &redis.path()),
        ("STOCKSVR__REDIS__TLS__CA_FILE", &ca.path()),
    ])
    .expect("loads");
    assert_eq!(s.kafka.sasl.mechanism, Some(SaslMechanism::ScramSha512));
    assert_eq!(
        s.kafka.sasl.password.as_ref().map(Secret::expose),
        Some("k-s3cret")
    );
    assert_eq!(
        s.registry.password.as_ref().map(Secret::expose),
        Some("r-s3cret")
    );
    // The file's password replaces the URL's, percent-encoded as a URL needs it (sqlx and
    // redis-rs decode it again).
    assert_eq!(
        s.mysql.url.expose(),
        "mysql://stocksvr:m%2Fs3cret%40x@db:3306/stocksvr?ssl-mode=VERIFY_IDENTITY"
    );
    assert_eq!(s.redis.url.expose(), "rediss://stocksvr:r3dis@r:6380/");
    let shown = format!("{s:?}{}", serde_json::to_string(&s).expect("json"));
    for secret in ["k-s3cret", "r-s3cret", "s3cret", "r3dis"] {
        assert!(!shown.contains(secret), "{secret} shown: {shown}");
    }
    let s = load(&[("STOCKSVR__REGISTRY__TOKEN_FILE", &token.path())]).expect("token");
    assert_eq!(
        s.registry.token.as_ref().map(Secret::expose),
        Some("t0ken-value")
    );
    assert!(!format!("{s:?}").contains("t0ken"));
}

#[test]
fn a_missing_or_empty_secret_file_names_the_setting_not_the_contents() {
    let err = error_of(&[(
        "STOCKSVR__REGISTRY__TOKEN_FILE",
        "/nonexistent/registry.token",
    )]);
    assert!(
        err.contains("registry.token_file") && err.contains("/nonexistent/registry.token"),
        "{err}"
    );
    let empty = TempFile::with("\n");
    let err = error_of(&[("STOCKSVR__MYSQL__PASSWORD_FILE", &empty.path())]);
    assert!(
        err.contains("mysql.password_file") && err.contains("empty"),
        "{err}"
    );
    let err = error_of(&[(
        "STOCKSVR__MYSQL__URL",
        "mysql://u:p@db/x?ssl-mode=VERIFY_IDENTITY&ssl-ca=/nonexistent/ca.pem",
    )]);
    assert!(
        err.contains("mysql.url ssl-ca") && !err.contains("u:p"),
        "{err}"
    );
}

#[test]
fn settings_that_cannot_work_together_are_one_error_naming_them() {
    let pw = TempFile::with("pw\n");
    let cases: [(&[(&str, &str)], &str); 8] = [
        (
            &[("STOCKSVR__KAFKA__SECURITY_PROTOCOL", "sasl_ssl")],
            "needs kafka.sasl.mechanism",
        ),
        (
            &[
                ("STOCKSVR__KAFKA__SECURITY_PROTOCOL", "sasl_ssl"),
                ("STOCKSVR__KAFKA__SASL__MECHANISM", "PLAIN"),
            ],
            "needs kafka.sasl.username",
        ),
        (
            &[("STOCKSVR__KAFKA__SASL__USERNAME", "u")],
            "does not use SASL",
        ),
        (
            &[("STOCKSVR__KAFKA__TLS__CA_FILE", "/etc/hostname")],
            "does not use TLS",
        ),
        (
            &[
                ("STOCKSVR__REGISTRY__PASSWORD", "inline"),
                ("STOCKSVR__REGISTRY__PASSWORD_FILE", &pw.path()),
            ],
            "registry.password and registry.password_file are both set",
        ),
        (
            &[("STOCKSVR__REDIS__TLS__CA_FILE", "/etc/hostname")],
            "redis.url is not rediss://",
        ),
        (
            &[
                ("STOCKSVR__REGISTRY__TOKEN", "t"),
                ("STOCKSVR__REGISTRY__USERNAME", "u"),
            ],
            "choose bearer or basic",
        ),
        (
            &[
                ("STOCKSVR__KAFKA__SECURITY_PROTOCOL", "ssl"),
                ("STOCKSVR__KAFKA__TLS__CERT_FILE", "/etc/hostname"),
            ],
            "go together",
        ),
    ];
    for (vars, expected) in cases {
        let err = error_of(vars);
        assert!(err.contains(expected), "{vars:?}: {err}");
        assert!(!err.contains("inline"), "a secret in the error: {err}");
    }
    let err = error_of(&[("STOCKSVR__KAFKA__SASL__MECHANISM", "GSSAPI")]);
    assert!(err.contains("GSSAPI") || err.contains("mechanism"), "{err}");
}

#[test]
fn loaded_tls_shows_which_parts_it_has_never_their_bytes() {
    let key = TempFile::with("-----BEGIN PRIVATE KEY-----\nsecretbytes\n");
    let cert = TempFile::with("-----BEGIN CERTIFICATE-----\n");
    let files = TlsFiles {
        ca_file: None,
        cert_file: Some(cert.0.clone()),
        key_file: Some(key.0.clone()),
    };
    let loaded = files.read("redis.tls").expect("reads");
    assert!(loaded.client.is_some() && loaded.ca.is_none());
    let shown = format!("{loaded:?}");
    assert!(!shown.contains("secretbytes"), "{shown}");
}
