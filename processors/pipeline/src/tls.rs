//! The one rustls crypto provider of the process, and the registry's HTTP client with the
//! configured CA and client certificate.
//!
//! sqlx, redis-rs and reqwest all do TLS through rustls, and rustls needs one crypto
//! provider per process: with two compiled in (ring and aws-lc-rs) it refuses to choose and
//! the first TLS connection panics. The build has ring only; reqwest still asks for the
//! process default, so [`install_crypto_provider`] runs first thing in `main`, in test
//! set-up, and before any client here is built (it is idempotent).

use crate::config::{ConfigError, LoadedTls, RegistrySettings};
use std::sync::Once;
use std::time::Duration;

/// Installs ring as the process's rustls provider; later calls do nothing.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first (a test harness, say): that one
        // serves, and as the build has ring only it is ring too. rustls 0.23.48 deprecates
        // ring's provider for lacking post-quantum key exchange (X25519MLKEM768, which only
        // aws-lc-rs offers); ring stays the choice for now: one provider, a build without
        // cmake, and the classical key exchanges every server here speaks.
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let _ = provider.install_default();
    });
}

/// A reqwest client builder for the schema registry: `timeout_ms` per request, and for an
/// `https://` URL the settings' CA (then the only trusted one: the system's store is not
/// consulted) and client certificate.
pub fn registry_http(settings: &RegistrySettings) -> Result<reqwest::ClientBuilder, ConfigError> {
    install_crypto_provider();
    let mut builder =
        reqwest::Client::builder().timeout(Duration::from_millis(settings.timeout_ms));
    let LoadedTls { ca, client } = settings.tls.read("registry.tls")?;
    if let Some(ca) = ca {
        let certs = reqwest::Certificate::from_pem_bundle(&ca).map_err(|e| {
            ConfigError::Invalid(format!(
                "registry.tls.ca_file holds no PEM certificate: {e}"
            ))
        })?;
        builder = builder.tls_certs_only(certs);
    }
    if let Some((cert, key)) = client {
        let mut pem = cert;
        pem.push(b'\n');
        pem.extend_from_slice(&key);
        let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
            ConfigError::Invalid(format!(
                "registry.tls.cert_file/key_file: not a PEM certificate and key: {e}"
            ))
        })?;
        builder = builder.identity(identity);
    }
    Ok(builder)
}
