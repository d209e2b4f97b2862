//! HTTPS for the listener (`http.tls`): rustls with the ring provider through tokio-rustls,
//! each connection served by hyper's HTTP/1.1 with keep-alive, so a caller handshakes once
//! per connection, not once per request. With `client_ca_file` the caller's certificate is
//! verified against that CA (required, or optional beside bearer tokens) and its names
//! reach the caller check as [`PeerNames`].
//!
//! The configuration is rebuilt whole from the files and swapped in on a reload; a
//! connection keeps the configuration it was accepted with.

use axum::middleware;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use stocksvr_api::auth::PeerNames;
use stocksvr_pipeline::config::{ClientAuth, HttpSettings};
use stocksvr_pipeline::http::count_requests;
use stocksvr_telemetry::{metrics, names};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

/// Longest a caller may take to finish its handshake: a connection that never does must
/// not hold a task for ever.
const HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);
/// Longest a caller may take to send a request's headers on an open connection.
const HEADERS_WITHIN: Duration = Duration::from_secs(30);

/// The files of `http.tls`, in the order [`ListenerTls::server_config`] takes their contents.
#[derive(Debug, Clone)]
pub struct ListenerTls {
    pub files: Vec<PathBuf>,
    client_auth: Option<ClientAuth>,
}

impl ListenerTls {
    /// `None` when the listener speaks plain HTTP.
    pub fn from_settings(http: &HttpSettings) -> Option<Self> {
        let tls = &http.tls;
        let (cert, key) = (tls.cert_file.as_ref()?, tls.key_file.as_ref()?);
        let mut files = vec![PathBuf::from(cert), PathBuf::from(key)];
        files.extend(tls.client_ca_file.as_ref().map(PathBuf::from));
        Some(Self {
            files,
            client_auth: http.client_auth(),
        })
    }

    /// The rustls configuration from the files' contents (certificate chain, key, client
    /// CA). Errors name the file at fault, never a key.
    pub fn server_config(&self, contents: &[Vec<u8>]) -> Result<ServerConfig, String> {
        let provider = Arc::new(ring_provider());
        let [cert, key, rest @ ..] = contents else {
            return Err("the certificate and key files were not read".into());
        };
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("http.tls.cert_file: {e}"))?;
        if chain.is_empty() {
            return Err("http.tls.cert_file holds no PEM certificate".into());
        }
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| format!("http.tls.key_file: no PEM private key ({e})"))?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?;
        let builder = match (rest.first(), self.client_auth) {
            (Some(ca), Some(mode)) => {
                let mut roots = RootCertStore::empty();
                for ca in CertificateDer::pem_slice_iter(ca) {
                    let ca = ca.map_err(|e| format!("http.tls.client_ca_file: {e}"))?;
                    roots
                        .add(ca)
                        .map_err(|e| format!("http.tls.client_ca_file: {e}"))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match mode {
                    ClientAuth::Required => verifier,
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| format!("http.tls.client_ca_file: {e}"))?;
                builder.with_client_cert_verifier(verifier)
            }
            _ => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("http.tls.cert_file and key_file: {e}"))?;
        // HTTP/1.1 only: the listener's hyper is built without HTTP/2.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// rustls' ring provider, the one crypto provider of the process (ring builds far faster
/// than aws-lc on two cores, and two providers in one binary make rustls refuse to pick).
/// rustls 0.23.48 deprecated it for want of post-quantum key exchange; the listener's
/// callers are services of the same deployment, and the whole process moves to another
/// provider at once if that changes.
#[allow(deprecated)]
pub fn ring_provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// The configuration new connections are accepted with: none until the files were read
/// (the listener is not served before).
#[derive(Default)]
pub struct TlsState(RwLock<Option<Arc<ServerConfig>>>);

impl TlsState {
    pub fn replace(&self, config: ServerConfig) {
        let config = Some(Arc::new(config));
        match self.0.write() {
            Ok(mut current) => *current = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }

    fn acceptor(&self) -> Option<TlsAcceptor> {
        let config = match self.0.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        config.map(TlsAcceptor::from)
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves; open connections
/// finish their request in flight, idle ones are closed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<TlsState>,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // As `http::serve` does for plain HTTP; `with_state` turns every route into its service
    // once, here, not per request.
    let app: Router = router
        .layer(middleware::from_fn(count_requests))
        .with_state(());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (tcp, acceptor) = match (accepted, tls.acceptor()) {
            (Ok((tcp, _)), Some(acceptor)) => (tcp, acceptor),
            // Not reachable: the files are read before the listener is served.
            (Ok(_), None) => continue,
            (Err(e), _) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "accepting an HTTPS connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(connection(tcp, acceptor, app.clone(), graceful.watcher()));
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// One caller's connection: the handshake, then HTTP/1.1 requests until either side closes
/// it. A refused handshake (no certificate where one is required, an unknown CA) ends here.
async fn connection(
    tcp: tokio::net::TcpStream,
    acceptor: TlsAcceptor,
    app: Router,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let _ = tcp.set_nodelay(true);
    let stream = match tokio::time::timeout(HANDSHAKE_WITHIN, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        outcome => {
            metrics::counter!(names::HTTP_TLS_HANDSHAKES, "outcome" => "failed").increment(1);
            let error = match outcome {
                Ok(Err(e)) => e.to_string(),
                _ => format!("no handshake within {} s", HANDSHAKE_WITHIN.as_secs()),
            };
            tracing::debug!(error, "TLS handshake refused");
            return;
        }
    };
    metrics::counter!(names::HTTP_TLS_HANDSHAKES, "outcome" => "ok").increment(1);
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|leaf| PeerNames::from_der(leaf));
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        if let Some(peer) = &peer {
            req.extensions_mut().insert(peer.clone());
        }
        app.clone().oneshot(req.map(axum::body::Body::new))
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADERS_WITHIN)
        .serve_connection(TokioIo::new(stream), service);
    let served = watcher.watch(connection).await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "HTTPS connection ended with an error");
    }
}

#[cfg(test)]
mod tests;
