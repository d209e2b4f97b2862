//! The HTTP listener's settings (`[http]`, `[http.tls]`, `[http.auth]`): its address, load
//! shedding, TLS, and who may call it. Bearer tokens are configured as SHA-256 digests only,
//! never as the tokens themselves, and the digests are [`Secret`]s too: neither `stocksvr
//! config`, `/admin/config`, a log line nor an error shows one.

use super::Secret;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpSettings {
    /// Address of the HTTP listener serving the API, `/metrics`, `/healthz` and `/readyz`.
    pub listen: String,
    /// Deprecated: a client named `admin` with the `admin` scope (`http.auth.clients`), kept
    /// so existing deployments keep working. Unlike `http.auth`, it leaves `/v1` open.
    pub admin_token: Option<Secret>,
    /// Timeout of each dependency check behind `/readyz`, in milliseconds.
    pub readiness_timeout_ms: u64,
    /// API requests (`/v1/...`) served at once; more wait in the admission queue. Each one
    /// in flight holds its request, its Try state and its share of the group commits in
    /// memory: `stocksvr all` at 1,024 connections peaked at 111 MB RSS with 256, 126 MB with
    /// 512. The hot-dish Try rate is near its top from 256 on (the bench's knee is 64-256).
    pub max_in_flight: usize,
    /// API requests waiting for a slot; one more is answered 503 `overloaded` at once.
    pub max_queued: usize,
    /// Longest wait for a slot, in milliseconds; then 503 `overloaded` with `Retry-After`.
    pub admission_deadline_ms: u64,
    /// Paths every caller may reach without caller authentication (exact paths): probes
    /// and scraping.
    pub public_paths: Vec<String>,
    /// Serve every caller on a listener other hosts can reach although no caller
    /// authentication is configured. Without it stocksvr refuses to start in that case.
    pub allow_unauthenticated: bool,
    /// How often the TLS files and `http.auth.clients_file` are read again, in milliseconds;
    /// a changed file takes effect without a restart (SIGHUP reads them at once too).
    /// 0: only on SIGHUP.
    pub reload_interval_ms: u64,
    /// After SIGTERM, how long the listener of a process serving the Try API (`all`,
    /// `order-lifecycle`) keeps serving, in milliseconds, with `/readyz`
    /// answering 503 `draining` from the first moment, so a load balancer takes the instance
    /// out of rotation before it stops accepting. Then the listener stops accepting, the
    /// requests in flight finish, and the processors commit and leave (within 15 s). 8 s:
    /// HAProxy's default health check (`inter 2s`, `fall 3`) marks the instance down 6 s
    /// after the first 503 at the latest, plus a check in flight. Behind Kubernetes (which
    /// stops routing to a terminating pod by itself, with a delay) a few seconds suffice;
    /// `terminationGracePeriodSeconds` must cover this plus the 15 s drain (the default 30
    /// does). 0: stop accepting at once (no balancer in front).
    pub drain_grace_ms: u64,
    pub tls: HttpTlsSettings,
    pub auth: HttpAuthSettings,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".into(),
            admin_token: None,
            readiness_timeout_ms: 2_000,
            max_in_flight: 256,
            max_queued: 2_048,
            admission_deadline_ms: 1_000,
            public_paths: ["/healthz", "/readyz", "/metrics"]
                .map(String::from)
                .to_vec(),
            allow_unauthenticated: false,
            reload_interval_ms: 5_000,
            drain_grace_ms: 8_000,
            tls: HttpTlsSettings::default(),
            auth: HttpAuthSettings::default(),
        }
    }
}

/// HTTPS: the listener's own certificate, and optionally the CA its callers' certificates
/// must chain to (mTLS).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpTlsSettings {
    /// PEM certificate chain of the listener (leaf first). With `key_file`, the listener
    /// speaks HTTPS only.
    pub cert_file: Option<String>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<String>,
    /// PEM CA certificate(s) a caller's certificate must chain to; turns on mTLS.
    pub client_ca_file: Option<String>,
    /// `required`: a caller without a valid certificate is refused at the handshake;
    /// `optional`: it may still authenticate with a bearer token. Default with
    /// `client_ca_file`: `required`.
    pub client_auth: Option<ClientAuth>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    Optional,
    Required,
}

/// Who may call the listener, and what for.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpAuthSettings {
    /// The callers, each `{ name, token_sha256, subject, scopes }`: a name (1-64 of
    /// `[A-Za-z0-9._-]`, in logs and in the `client` label of `stocksvr_http_auth_total`), the
    /// hex SHA-256 of its bearer token (`stocksvr token new`) and/or a certificate subject
    /// (CN or SAN DNS name), and scopes (`api`: everything outside `/admin`, the default;
    /// `admin`: `/admin/*`). A list of tables, so it is set in the configuration file; from
    /// the environment, point `clients_file` at a file instead.
    pub clients: Vec<HttpClient>,
    /// A file of more token clients, one `name sha256hex [scopes]` line each (scopes comma
    /// separated, default `api`; `#` starts a comment), read again every
    /// `http.reload_interval_ms` and on SIGHUP: a line removed is a token revoked.
    pub clients_file: Option<String>,
    /// Certificate subjects (a CN or a SAN DNS name of a caller's certificate verified
    /// against `http.tls.client_ca_file`) allowed to call with the `api` scope; the subject
    /// is the client's name.
    pub allowed_subjects: Vec<String>,
}

impl HttpAuthSettings {
    /// Whether any caller authentication is configured. A `clients_file` counts even while
    /// it lists nobody: revoking every token must close the API, never open it.
    pub fn configured(&self) -> bool {
        !self.clients.is_empty() || self.clients_file.is_some() || !self.allowed_subjects.is_empty()
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpClient {
    /// 1-64 characters of `[A-Za-z0-9._-]`; the same name may appear twice (a token being
    /// rotated).
    pub name: String,
    /// Hex SHA-256 of the bearer token (`stocksvr token hash`, `stocksvr token new`).
    #[serde(default)]
    pub token_sha256: Option<Secret>,
    /// A CN or SAN DNS name of the caller's certificate (needs `http.tls.client_ca_file`).
    #[serde(default)]
    pub subject: Option<String>,
    #[serde(default = "api_only")]
    pub scopes: Vec<Scope>,
}

fn api_only() -> Vec<Scope> {
    vec![Scope::Api]
}

/// What a client may call.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The Try API and every other path outside `/admin`.
    Api,
    /// `/admin/*`.
    Admin,
}

impl Scope {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "api" => Some(Self::Api),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

/// The names the `client` label takes besides the configured ones.
pub const RESERVED_CLIENT_NAMES: [&str; 2] = ["anonymous", "unknown"];

fn check_name(name: &str) -> Result<(), String> {
    let valid = (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !valid {
        return Err(format!(
            "client name {name:?}: use 1-64 characters of [A-Za-z0-9._-]"
        ));
    }
    if RESERVED_CLIENT_NAMES.contains(&name) {
        return Err(format!("client name {name:?} is reserved"));
    }
    Ok(())
}

/// A hex SHA-256 digest: 64 hex digits. The value is never put in the message.
fn check_digest(name: &str, digest: &Secret) -> Result<(), String> {
    let d = digest.expose();
    if d.len() != 64 || !d.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(format!(
            "client {name}: token_sha256 must be 64 hex digits (the SHA-256 of the token, \
             from `stocksvr token hash`), never the token itself"
        ));
    }
    Ok(())
}

impl HttpClient {
    pub fn validate(&self) -> Result<(), String> {
        check_name(&self.name)?;
        if self.token_sha256.is_none() && self.subject.is_none() {
            return Err(format!(
                "client {}: give token_sha256, subject or both",
                self.name
            ));
        }
        if let Some(digest) = &self.token_sha256 {
            check_digest(&self.name, digest)?;
        }
        if self.subject.as_deref().is_some_and(str::is_empty) {
            return Err(format!("client {}: subject is empty", self.name));
        }
        if self.scopes.is_empty() {
            return Err(format!(
                "client {}: scopes is empty (api, admin or both)",
                self.name
            ));
        }
        Ok(())
    }
}

/// The clients of a `clients_file`: `name sha256hex [scopes]` per line, `#` comments, blank
/// lines ignored. An error names the line, never its digest.
pub fn parse_clients_file(text: &str) -> Result<Vec<HttpClient>, String> {
    let mut clients = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = |e: String| format!("line {}: {e}", i + 1);
        let (name, digest, scopes) = match fields[..] {
            [name, digest] => (name, digest, "api"),
            [name, digest, scopes] => (name, digest, scopes),
            _ => return Err(at("expected `name sha256hex [scopes]`".into())),
        };
        let scopes = scopes
            .split(',')
            // The value is not shown: a line in the wrong order may have a digest there.
            .map(|s| {
                Scope::parse(s.trim())
                    .ok_or_else(|| at("scopes are api, admin or api,admin".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = HttpClient {
            name: name.to_string(),
            token_sha256: Some(Secret::new(digest)),
            subject: None,
            scopes,
        };
        client.validate().map_err(at)?;
        clients.push(client);
    }
    Ok(clients)
}

impl HttpSettings {
    /// Checks what can be checked without reading a file: TLS settings that go together, the
    /// clients, the public paths.
    pub fn validate(&self) -> Result<(), String> {
        let tls = &self.tls;
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return Err("http.tls: set both cert_file and key_file, or neither".into());
        }
        if tls.client_ca_file.is_some() && tls.cert_file.is_none() {
            return Err(
                "http.tls.client_ca_file needs the listener's own cert_file and key_file".into(),
            );
        }
        if tls.client_auth.is_some() && tls.client_ca_file.is_none() {
            return Err("http.tls.client_auth needs http.tls.client_ca_file".into());
        }
        let subjects = !self.auth.allowed_subjects.is_empty()
            || self.auth.clients.iter().any(|c| c.subject.is_some());
        if subjects && tls.client_ca_file.is_none() {
            return Err(
                "certificate subjects (http.auth.allowed_subjects, a client's subject) \
                 need http.tls.client_ca_file"
                    .into(),
            );
        }
        if let Some(empty) = self.auth.allowed_subjects.iter().find(|s| s.is_empty()) {
            return Err(format!(
                "http.auth.allowed_subjects: an empty subject {empty:?}"
            ));
        }
        for client in &self.auth.clients {
            client
                .validate()
                .map_err(|e| format!("http.auth.clients: {e}"))?;
        }
        if let Some(bad) = self.public_paths.iter().find(|p| !p.starts_with('/')) {
            return Err(format!(
                "http.public_paths: {bad:?} is not a path (starts with /)"
            ));
        }
        Ok(())
    }

    /// `http.admin_token` unless empty (an empty token would let `Authorization: Bearer `
    /// through: it counts as none).
    pub fn admin_token(&self) -> Option<&Secret> {
        self.admin_token
            .as_ref()
            .filter(|t| !t.expose().trim().is_empty())
    }

    /// The mTLS mode in effect: none without a client CA, `required` by default with one.
    pub fn client_auth(&self) -> Option<ClientAuth> {
        self.tls
            .client_ca_file
            .as_ref()
            .map(|_| self.tls.client_auth.unwrap_or(ClientAuth::Required))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    #[test]
    fn a_clients_file_reads_names_digests_and_scopes() {
        let text = format!(
            "# callers of the Try API\n\norders {DIGEST}\nops {DIGEST} admin # on call\n\
             both {DIGEST} api,admin\n"
        );
        let clients = parse_clients_file(&text).expect("parses");
        let got: Vec<(&str, &[Scope])> = clients
            .iter()
            .map(|c| (c.name.as_str(), c.scopes.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                ("orders", &[Scope::Api][..]),
                ("ops", &[Scope::Admin][..]),
                ("both", &[Scope::Api, Scope::Admin][..])
            ]
        );
    }

    #[test]
    fn a_bad_line_is_named_and_its_digest_never_shown() {
        for (text, says) in [
            ("orders".to_string(), "line 1: expected"),
            (format!("\norders {DIGEST} root"), "line 2: scopes are api"),
            ("orders not-a-digest-but-maybe-a-token".into(), "64 hex"),
            (format!("anonymous {DIGEST}"), "reserved"),
            (format!("or ders {DIGEST}"), "line 1"),
        ] {
            let err = parse_clients_file(&text).expect_err(&text);
            assert!(err.contains(says), "{err}");
            assert!(
                !err.contains(DIGEST) && !err.contains("maybe-a-token"),
                "{err}"
            );
        }
    }

    #[test]
    fn tls_and_subject_settings_must_go_together() {
        let with = |f: &dyn Fn(&mut HttpSettings)| {
            let mut s = HttpSettings::default();
            f(&mut s);
            s.validate()
        };
        assert!(with(&|_| {}).is_ok());
        assert!(with(&|s| s.tls.cert_file = Some("c.pem".into())).is_err());
        assert!(with(&|s| s.tls.client_ca_file = Some("ca.pem".into())).is_err());
        assert!(with(&|s| s.auth.allowed_subjects = vec!["orders".into()]).is_err());
        assert!(with(&|s| s.public_paths = vec!["healthz".into()]).is_err());
        let mtls = |s: &mut HttpSettings| {
            s.tls.cert_file = Some("c.pem".into());
            s.tls.key_file = Some("k.pem".into());
            s.tls.client_ca_file = Some("ca.pem".into());
        };
        assert!(with(&|s| {
            mtls(s);
            s.auth.allowed_subjects = vec!["orders".into()];
        })
        .is_ok());
        let mut s = HttpSettings::default();
        mtls(&mut s);
        assert_eq!(s.client_auth(), Some(ClientAuth::Required));
        s.tls.client_auth = Some(ClientAuth::Optional);
        assert_eq!(s.client_auth(), Some(ClientAuth::Optional));
        assert_eq!(HttpSettings::default().client_auth(), None);
    }

    #[test]
    fn digests_are_masked_and_revoking_every_token_keeps_auth_on() {
        let auth = HttpAuthSettings {
            clients: parse_clients_file(&format!("orders {DIGEST}")).expect("parses"),
            ..Default::default()
        };
        let shown = serde_json::to_string(&auth).expect("json") + &format!("{auth:?}");
        assert!(!shown.contains(DIGEST), "{shown}");
        assert!(shown.contains("orders"), "{shown}");
        let file_only = HttpAuthSettings {
            clients_file: Some("/run/secrets/clients".into()),
            ..Default::default()
        };
        assert!(file_only.configured());
        assert!(!HttpAuthSettings::default().configured());
    }
}
