//! `stocksvr all` over HTTPS with mTLS, against certificates of a throwaway CA made here
//! (rcgen): the client verifies the listener by the test CA, a caller whose certificate
//! subject is allowed is served and one whose is not gets 401 with nothing written, a
//! caller without a certificate is refused at the handshake, a connection serves many
//! requests with one handshake (keep-alive), and a SIGHUP puts a new certificate in effect.
//! The listener is bound to every interface, which starts because callers are configured.

mod common;

use axum::body::Body;
use common::api::shop;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use stocksvr_test_support::eventually;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_rustls::TlsConnector;

/// A CA and the certificates it signs, written as PEM files into a directory of the test's.
struct Pki {
    ca: rcgen::Certificate,
    ca_key: KeyPair,
    dir: PathBuf,
}

/// A certificate and its key, as PEM.
struct Leaf {
    cert: String,
    key: String,
}

impl Pki {
    fn new() -> Self {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "stocksvr test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).expect("CA");
        let dir = std::env::temp_dir().join(common::unique("https"));
        std::fs::create_dir_all(&dir).expect("dir");
        Self { ca, ca_key, dir }
    }

    /// A leaf for `names` (DNS names or IP addresses) with common name `cn`.
    fn leaf(&self, cn: &str, names: &[&str], purpose: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![purpose];
        let cert = params
            .signed_by(&key, &self.ca, &self.ca_key)
            .expect("signed");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    fn write(&self, name: &str, pem: &str) -> PathBuf {
        let path = self.dir.join(name);
        let next = path.with_extension("next");
        std::fs::write(&next, pem).expect("write");
        std::fs::rename(&next, &path).expect("rename");
        path
    }

    fn client_config(&self, identity: Option<&Leaf>) -> ClientConfig {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).expect("CA");
        let builder = ClientConfig::builder_with_provider(Arc::new(stocksvr::ring_provider()))
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots);
        match identity {
            None => builder.with_no_client_auth(),
            Some(leaf) => builder
                .with_client_auth_cert(
                    CertificateDer::pem_slice_iter(leaf.cert.as_bytes())
                        .collect::<Result<_, _>>()
                        .expect("chain"),
                    PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key"),
                )
                .expect("client certificate"),
        }
    }
}

/// One TLS connection to the listener (the name checked is `localhost`), HTTP/1.1 on it;
/// also the certificate the listener showed.
async fn connect(
    port: u16,
    config: ClientConfig,
) -> Result<(SendRequest<Body>, CertificateDer<'static>), String> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").expect("name");
    let tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let shown = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("the listener shows a certificate")
        .clone()
        .into_owned();
    let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    Ok((send, shown))
}

/// One request on an open connection.
async fn request(
    send: &mut SendRequest<Body>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, String), String> {
    send.ready().await.map_err(|e| e.to_string())?;
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20)
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// The value of a series on `/metrics`, 0 when absent.
fn series(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn https_with_required_client_certificates_of_allowed_subjects() {
    let shop = shop(10).await;
    let pki = Pki::new();
    let server_leaf = pki.leaf(
        "stocksvr",
        &["localhost", "127.0.0.1"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let orders = pki.leaf(
        "orders service",
        &["orders.internal"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let intruder = pki.leaf(
        "intruder",
        &["intruder.internal"],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let files = [
        ("cert.pem", server_leaf.cert.clone()),
        ("key.pem", server_leaf.key.clone()),
        ("ca.pem", pki.ca.pem()),
    ]
    .map(|(name, pem)| pki.write(name, &pem));
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let port = free_port();
    let listen = format!("0.0.0.0:{port}");
    let server = shop.server(&[
        ("STOCKSVR__HTTP__LISTEN", &listen),
        ("STOCKSVR__HTTP__TLS__CERT_FILE", &path(&files[0])),
        ("STOCKSVR__HTTP__TLS__KEY_FILE", &path(&files[1])),
        ("STOCKSVR__HTTP__TLS__CLIENT_CA_FILE", &path(&files[2])),
        ("STOCKSVR__HTTP__AUTH__ALLOWED_SUBJECTS", "orders.internal"),
        // Only SIGHUP reads the files again: the rotation below proves the signal.
        ("STOCKSVR__HTTP__RELOAD_INTERVAL_MS", "0"),
    ]);
    let up = eventually(Duration::from_secs(60), || async {
        let Ok((mut send, _)) = connect(port, pki.client_config(Some(&orders))).await else {
            return false;
        };
        matches!(
            request(&mut send, "GET", "/v1/reservations/1", None).await,
            Ok((404, _))
        )
    })
    .await;
    assert!(up, "the HTTPS API never came up; log:\n{}", server.log());

    // One connection, many requests, one handshake.
    let (mut send, shown) = connect(port, pki.client_config(Some(&orders)))
        .await
        .expect("connects");
    let (_, metrics) = request(&mut send, "GET", "/metrics", None)
        .await
        .expect("metrics");
    let ok = r#"stocksvr_http_tls_handshakes_total{outcome="ok"}"#;
    let handshakes = series(&metrics, ok);
    let try_body = |order_id: u64| {
        json!({"order_id": order_id, "order_item_id": order_id, "merchant_id": shop.merchant_id,
               "dish_id": shop.dish_id, "quantity": 1, "order_type": "INSTANT"})
    };
    let (status, body) = request(&mut send, "POST", "/v1/reservations", Some(&try_body(701)))
        .await
        .expect("Try");
    assert_eq!(status, 201, "{body}");
    for _ in 0..20 {
        let (status, _) = request(&mut send, "GET", "/v1/reservations/1", None)
            .await
            .expect("read");
        assert_eq!(status, 404);
    }
    let (_, metrics) = request(&mut send, "GET", "/metrics", None)
        .await
        .expect("metrics");
    assert_eq!(
        series(&metrics, ok),
        handshakes,
        "a request handshook again"
    );
    assert!(
        metrics.contains(r#"stocksvr_http_auth_total{client="orders.internal",outcome="allowed"}"#),
        "{metrics}"
    );

    // A certificate of the same CA whose subject is not allowed: 401, nothing written.
    let (mut stranger, _) = connect(port, pki.client_config(Some(&intruder)))
        .await
        .expect("connects");
    let (status, body) = request(
        &mut stranger,
        "POST",
        "/v1/reservations",
        Some(&try_body(702)),
    )
    .await
    .expect("answered");
    assert_eq!(status, 401, "{body}");
    let pool = shop.env.pool();
    let rows: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM inventory_reservation WHERE order_id = 702")
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(rows, 0, "a refused caller wrote a reservation");

    // No certificate: the handshake is refused (under TLS 1.3 the client learns it from
    // the alert that arrives in place of the first answer).
    let refused = match connect(port, pki.client_config(None)).await {
        Err(e) => e,
        Ok((mut send, _)) => request(&mut send, "GET", "/healthz", None)
            .await
            .expect_err("served without a certificate"),
    };
    assert!(!refused.is_empty());
    let (_, metrics) = request(&mut send, "GET", "/metrics", None)
        .await
        .expect("metrics");
    assert!(
        series(
            &metrics,
            r#"stocksvr_http_tls_handshakes_total{outcome="failed"}"#
        ) >= 1
    );

    // A new certificate, put in effect by SIGHUP for new connections.
    let rotated = pki.leaf(
        "stocksvr rotated",
        &["localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    pki.write("key.pem", &rotated.key);
    pki.write("cert.pem", &rotated.cert);
    server.signal("-HUP");
    let new_der = CertificateDer::from_pem_slice(rotated.cert.as_bytes()).expect("der");
    let reloaded = eventually(Duration::from_secs(10), || async {
        connect(port, pki.client_config(Some(&orders)))
            .await
            .is_ok_and(|(_, now)| now == new_der)
    })
    .await;
    assert!(
        reloaded,
        "the rotated certificate was not served; log:\n{}",
        server.log()
    );
    assert_ne!(shown, new_der);
    // The open connection keeps serving.
    assert_eq!(
        request(&mut send, "GET", "/healthz", None)
            .await
            .expect("healthz")
            .0,
        200
    );

    let (status, log) = server.terminate();
    assert!(status.success(), "{log}");
    assert!(!log.contains("BEGIN PRIVATE KEY"), "{log}");
    let _ = std::fs::remove_dir_all(&pki.dir);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}
