//! The HTTPS listener in-process with optional client certificates: a caller may come with
//! an allowed certificate or with a bearer token instead, a certificate of another CA is
//! refused at the handshake, and files that do not fit together are named.

use super::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use stocksvr_api::auth::{self, digest_hex, Callers, Gate, Guard, Policy, Scopes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::ClientConfig;
use tokio_rustls::TlsConnector;

struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

/// A PEM certificate and key.
type Leaf = (String, String);

impl Ca {
    fn new() -> Self {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "test CA");
        let cert = params.self_signed(&key).expect("CA");
        Self { cert, key }
    }

    fn leaf(&self, name: &str, purpose: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec![name.to_string()]).expect("params");
        params.extended_key_usages = vec![purpose];
        let cert = params.signed_by(&key, &self.cert, &self.key).expect("leaf");
        (cert.pem(), key.serialize_pem())
    }
}

fn files(client_auth: Option<ClientAuth>) -> ListenerTls {
    ListenerTls {
        files: Vec::new(),
        client_auth,
    }
}

fn client(ca: &Ca, identity: Option<&Leaf>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert.der().clone()).expect("root");
    let builder = ClientConfig::builder_with_provider(Arc::new(ring_provider()))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<_, _>>()
                    .expect("chain"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key"),
            )
            .expect("identity"),
    }
}

/// One GET over a fresh TLS connection (`Connection: close`): the status, or the error.
async fn get(
    addr: std::net::SocketAddr,
    config: ClientConfig,
    token: Option<&str>,
) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").expect("name");
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request =
        format!("GET /v1/thing HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut reply = String::new();
    tls.read_to_string(&mut reply)
        .await
        .map_err(|e| e.to_string())?;
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {reply:?}"))
}

#[tokio::test]
async fn optional_client_certificates_leave_room_for_tokens_and_refuse_other_cas() {
    let ca = Ca::new();
    let (cert, key) = ca.leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let orders = ca.leaf("orders.internal", ExtendedKeyUsagePurpose::ClientAuth);
    let stranger_ca = Ca::new();
    let stranger = stranger_ca.leaf("orders.internal", ExtendedKeyUsagePurpose::ClientAuth);
    let config = files(Some(ClientAuth::Optional))
        .server_config(&[cert.into(), key.into(), ca.cert.pem().into()])
        .expect("config");
    let state = Arc::new(TlsState::default());
    state.replace(config);

    let api = Scopes {
        api: true,
        admin: false,
    };
    let mut callers = Callers::new();
    callers
        .add_token("batch", &digest_hex("batch-token"), api)
        .expect("token");
    callers.add_subject("orders.internal", "orders.internal", api);
    let policy = Policy {
        public_paths: vec![],
        api: Guard::Callers,
        admin: Guard::Callers,
    };
    let router = Router::new()
        .route("/v1/thing", axum::routing::get(|| async { "ok" }))
        .layer(middleware::from_fn_with_state(
            Gate::new(policy, callers),
            auth::check,
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, state, router, std::future::pending()));

    assert_eq!(get(addr, client(&ca, Some(&orders)), None).await, Ok(200));
    assert_eq!(
        get(addr, client(&ca, None), Some("batch-token")).await,
        Ok(200)
    );
    assert_eq!(get(addr, client(&ca, None), None).await, Ok(401));
    assert_eq!(get(addr, client(&ca, None), Some("other")).await, Ok(401));
    let refused = get(addr, client(&ca, Some(&stranger)), None).await;
    assert!(
        refused.is_err(),
        "a certificate of another CA was served: {refused:?}"
    );
}

#[test]
fn files_that_do_not_fit_together_are_named() {
    let ca = Ca::new();
    let (cert, _) = ca.leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let (_, other_key) = ca.leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let mismatch = files(None)
        .server_config(&[cert.clone().into(), other_key.clone().into()])
        .expect_err("a key of another certificate");
    assert!(mismatch.contains("cert_file and key_file"), "{mismatch}");
    assert!(!mismatch.contains("PRIVATE"), "{mismatch}");
    let no_cert = files(None)
        .server_config(&[b"not pem".to_vec(), other_key.into()])
        .expect_err("no certificate");
    assert!(no_cert.contains("cert_file"), "{no_cert}");
    let (_, key) = ca.leaf("localhost", ExtendedKeyUsagePurpose::ServerAuth);
    let bad_ca = files(Some(ClientAuth::Required))
        .server_config(&[cert.into(), key.into(), b"no CA here".to_vec()])
        .expect_err("no CA");
    assert!(bad_ca.contains("client_ca_file"), "{bad_ca}");
}
