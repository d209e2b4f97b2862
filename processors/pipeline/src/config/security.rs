//! The secured side of the connection settings: TLS files, Kafka's security protocol and
//! SASL, and the secrets that may come from files (`*_file`, the way container platforms
//! mount them).
//!
//! Everything here is decided at start ([`resolve_connections`]): a secret file is read once
//! (its trailing line break dropped), a setting that cannot work (SASL without a mechanism,
//! a value given both inline and as a file, TLS files on a `redis://` URL) is one clear error
//! naming the setting, and a secret never reaches an error message, a log line or `Debug`.

use super::{ConfigError, KafkaSettings, MysqlSettings, RedisSettings, RegistrySettings, Secret};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no authentication: a trusted network only (the local stack).
    #[default]
    Plaintext,
    /// TLS; with `kafka.tls.cert_file` also mutual TLS (the certificate is the identity).
    Ssl,
    /// SASL without TLS: the password crosses the network in the clear with PLAIN.
    SaslPlaintext,
    /// SASL over TLS: what managed Kafka services (Confluent Cloud, MSK) ask for.
    SaslSsl,
}

impl SecurityProtocol {
    /// The value librdkafka takes.
    pub const fn librdkafka(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    pub const fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub const fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// The SASL mechanisms this build of librdkafka offers (OpenSSL, no Cyrus SASL, no curl):
/// GSSAPI (Kerberos) and OAUTHBEARER are not among them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    /// The value librdkafka's `sasl.mechanism` takes.
    pub const fn librdkafka(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// PEM files of a TLS client: the CA that verifies the server, and for mutual TLS the
/// client's own certificate and key. Paths, not contents: they are read at start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsFiles {
    /// CA certificate(s) that sign the server's certificate (PEM). Unset: the system's
    /// trust store. The server's name is always checked against its certificate.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM, unencrypted PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// Drops empty paths (an environment variable set to nothing means "unset").
    fn normalize(&mut self) {
        for f in [&mut self.ca_file, &mut self.cert_file, &mut self.key_file] {
            if f.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                *f = None;
            }
        }
    }

    /// Both halves of a client certificate or neither, and every file readable.
    fn check(&self, section: &str) -> Result<(), ConfigError> {
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(invalid(format!(
                "{section}.cert_file and {section}.key_file go together: set both for mutual TLS, or neither"
            )));
        }
        for (name, file) in [
            ("ca_file", &self.ca_file),
            ("cert_file", &self.cert_file),
            ("key_file", &self.key_file),
        ] {
            if let Some(path) = file {
                readable(&format!("{section}.{name}"), path)?;
            }
        }
        Ok(())
    }

    /// The PEM contents: (CA, (certificate, key)).
    pub fn read(&self, section: &str) -> Result<LoadedTls, ConfigError> {
        let ca = self
            .ca_file
            .as_deref()
            .map(|p| read_bytes(&format!("{section}.ca_file"), p))
            .transpose()?;
        let client = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some((
                read_bytes(&format!("{section}.cert_file"), cert)?,
                read_bytes(&format!("{section}.key_file"), key)?,
            )),
            _ => None,
        };
        Ok(LoadedTls { ca, client })
    }
}

/// The contents of [`TlsFiles`]. `Debug` names which parts are present, never their bytes.
#[derive(Clone, Default)]
pub struct LoadedTls {
    pub ca: Option<Vec<u8>>,
    /// Certificate and private key, PEM.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for LoadedTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// SASL credentials of the Kafka clients (`security_protocol` `sasl_plaintext` or
/// `sasl_ssl`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaslSettings {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: Option<SaslMechanism>,
    /// The SASL user: the principal the broker's ACLs name (`User:<username>`).
    pub username: Option<String>,
    /// The user's password. Prefer `password_file`.
    pub password: Option<Secret>,
    /// A file holding the password (read at start; a trailing line break is dropped).
    pub password_file: Option<PathBuf>,
}

fn invalid(message: String) -> ConfigError {
    ConfigError::Invalid(message)
}

/// A file the process must be able to read; the error names the setting and the path.
fn readable(setting: &str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(|_| ())
        .map_err(|e| invalid(format!("{setting}: cannot read {}: {e}", path.display())))
}

fn read_bytes(setting: &str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path)
        .map_err(|e| invalid(format!("{setting}: cannot read {}: {e}", path.display())))
}

/// Reads a secret from `path`: the whole file, without its trailing line break (the way
/// `echo` and most secret stores write it). The error names the setting and the path, never
/// the contents.
pub fn read_secret_file(setting: &str, path: &Path) -> Result<Secret, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("{setting}: cannot read {}: {e}", path.display())))?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.is_empty() {
        return Err(invalid(format!("{setting}: {} is empty", path.display())));
    }
    Ok(Secret::new(value))
}

/// The secret of `inline` or of `file` (read now); both set is an error.
fn one_of(
    section: &str,
    name: &str,
    inline: &mut Option<Secret>,
    file: &mut Option<PathBuf>,
) -> Result<(), ConfigError> {
    if file.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
        *file = None;
    }
    let Some(path) = file.as_deref() else {
        return Ok(());
    };
    if inline.is_some() {
        return Err(invalid(format!(
            "{section}.{name} and {section}.{name}_file are both set: set one"
        )));
    }
    *inline = Some(read_secret_file(&format!("{section}.{name}_file"), path)?);
    Ok(())
}

/// Reads every `*_file` secret into its setting and checks the security settings of the
/// four connections together, so a start with settings that cannot work fails at once with
/// one error naming the setting.
pub fn resolve_connections(
    kafka: &mut KafkaSettings,
    registry: &mut RegistrySettings,
    mysql: &mut MysqlSettings,
    redis: &mut RedisSettings,
) -> Result<(), ConfigError> {
    resolve_kafka(kafka)?;
    resolve_registry(registry)?;
    resolve_mysql(mysql)?;
    resolve_redis(redis)?;
    Ok(())
}

fn resolve_kafka(kafka: &mut KafkaSettings) -> Result<(), ConfigError> {
    let protocol = kafka.security_protocol;
    let name = protocol.librdkafka();
    kafka.tls.normalize();
    let sasl = &mut kafka.sasl;
    one_of(
        "kafka.sasl",
        "password",
        &mut sasl.password,
        &mut sasl.password_file,
    )?;
    let sasl_set = sasl.mechanism.is_some() || sasl.username.is_some() || sasl.password.is_some();
    if protocol.uses_sasl() {
        let Some(mechanism) = sasl.mechanism else {
            return Err(invalid(format!(
                "kafka.security_protocol = {name} needs kafka.sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)"
            )));
        };
        if sasl.username.as_deref().is_none_or(str::is_empty) || sasl.password.is_none() {
            return Err(invalid(format!(
                "kafka.sasl.mechanism = {} needs kafka.sasl.username and kafka.sasl.password (or kafka.sasl.password_file)",
                mechanism.librdkafka()
            )));
        }
    } else if sasl_set {
        return Err(invalid(format!(
            "kafka.sasl.* is set but kafka.security_protocol = {name} does not use SASL (sasl_ssl or sasl_plaintext)"
        )));
    }
    if !protocol.uses_tls() && !kafka.tls.is_empty() {
        return Err(invalid(format!(
            "kafka.tls.* is set but kafka.security_protocol = {name} does not use TLS (ssl or sasl_ssl)"
        )));
    }
    kafka.tls.check("kafka.tls")
}

fn resolve_registry(registry: &mut RegistrySettings) -> Result<(), ConfigError> {
    registry.tls.normalize();
    one_of(
        "registry",
        "password",
        &mut registry.password,
        &mut registry.password_file,
    )?;
    one_of(
        "registry",
        "token",
        &mut registry.token,
        &mut registry.token_file,
    )?;
    if registry.token.is_some() && (registry.username.is_some() || registry.password.is_some()) {
        return Err(invalid(
            "registry.token and registry.username/password are both set: the registry gets one Authorization header, choose bearer or basic".into(),
        ));
    }
    if registry.password.is_some() && registry.username.is_none() {
        return Err(invalid(
            "registry.password is set without registry.username".into(),
        ));
    }
    if !registry.tls.is_empty() && !registry.url.starts_with("https://") {
        return Err(invalid(
            "registry.tls.* is set but registry.url is not https://".into(),
        ));
    }
    registry.tls.check("registry.tls")
}

fn resolve_mysql(mysql: &mut MysqlSettings) -> Result<(), ConfigError> {
    let mut password = None;
    one_of("mysql", "password", &mut password, &mut mysql.password_file)?;
    if let Some(password) = password {
        mysql.url = with_password("mysql.url", &mysql.url, &password)?;
    }
    // What sqlx reads from the URL (ssl-mode, ssl-ca, ssl-cert, ssl-key): refused now, not at
    // every connection attempt.
    let parsed = url::Url::parse(mysql.url.expose())
        .map_err(|e| invalid(format!("mysql.url does not parse: {e}")))?;
    for (key, value) in parsed.query_pairs() {
        if matches!(key.as_ref(), "ssl-ca" | "ssl-cert" | "ssl-key") {
            readable(&format!("mysql.url {key}"), Path::new(value.as_ref()))?;
        }
    }
    <sqlx::mysql::MySqlConnectOptions as std::str::FromStr>::from_str(mysql.url.expose())
        .map_err(|e| invalid(format!("mysql.url: {e}")))?;
    Ok(())
}

fn resolve_redis(redis: &mut RedisSettings) -> Result<(), ConfigError> {
    redis.tls.normalize();
    let mut password = None;
    one_of("redis", "password", &mut password, &mut redis.password_file)?;
    if let Some(password) = password {
        redis.url = with_password("redis.url", &redis.url, &password)?;
        for node in &mut redis.nodes {
            *node = with_password("redis.nodes", node, &password)?;
        }
    }
    let urls: Vec<(&str, &Secret)> = match redis.mode {
        super::RedisMode::Standalone => vec![("redis.url", &redis.url)],
        super::RedisMode::Cluster => redis.nodes.iter().map(|n| ("redis.nodes", n)).collect(),
    };
    if !redis.tls.is_empty() {
        if let Some((setting, _)) = urls
            .iter()
            .find(|(_, u)| !u.expose().starts_with("rediss://"))
        {
            return Err(invalid(format!(
                "redis.tls.* is set but {setting} is not rediss:// (TLS needs the rediss scheme)"
            )));
        }
    }
    redis.tls.check("redis.tls")
}

/// `url` with its password replaced by `password` (percent-encoded as a URL needs it).
fn with_password(setting: &str, url: &Secret, password: &Secret) -> Result<Secret, ConfigError> {
    let mut parsed = url::Url::parse(url.expose())
        .map_err(|e| invalid(format!("{setting} does not parse: {e}")))?;
    parsed
        .set_password(Some(password.expose()))
        .map_err(|()| invalid(format!("{setting} cannot carry a password")))?;
    Ok(Secret::new(String::from(parsed)))
}

#[cfg(test)]
mod tests;
