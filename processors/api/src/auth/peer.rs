//! The names of a caller's TLS certificate, read once per connection: every subject CN and
//! every SAN DNS name, what `http.auth.allowed_subjects` and a client's `subject` match.
//! The certificate was verified against the client CA during the handshake; this only reads.

use std::sync::Arc;
use x509_cert::der::asn1::ObjectIdentifier;
use x509_cert::der::{Decode, Tag, Tagged};
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

/// id-at-commonName (RFC 4519).
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// A request extension set by the HTTPS listener when the caller sent a certificate.
#[derive(Debug, Clone, Default)]
pub struct PeerNames(Arc<[String]>);

impl PeerNames {
    /// The CNs and SAN DNS names of a DER certificate; none when it does not parse (the
    /// handshake verified it, so that would be a certificate no subject can match anyway).
    pub fn from_der(der: &[u8]) -> Self {
        let Ok(cert) = x509_cert::Certificate::from_der(der) else {
            return Self::default();
        };
        let tbs = &cert.tbs_certificate;
        let common_names = tbs
            .subject
            .0
            .iter()
            .flat_map(|rdn| rdn.0.iter())
            .filter(|atv| atv.oid == COMMON_NAME)
            .filter(|atv| {
                matches!(
                    atv.value.tag(),
                    Tag::Utf8String | Tag::PrintableString | Tag::Ia5String
                )
            })
            .filter_map(|atv| std::str::from_utf8(atv.value.value()).ok())
            .map(str::to_string);
        let dns_names = match tbs.get::<SubjectAltName>() {
            Ok(Some((_, san))) => san
                .0
                .into_iter()
                .filter_map(|name| match name {
                    GeneralName::DnsName(dns) => Some(dns.to_string()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        Self::from_names(common_names.chain(dns_names).collect())
    }

    pub fn from_names(names: Vec<String>) -> Self {
        Self(names.into())
    }

    pub fn names(&self) -> &[String] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_name_and_dns_names_are_read_ip_addresses_are_not() {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(vec![
            "orders.internal".into(),
            "orders-2.internal".into(),
        ])
        .expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "orders service");
        params
            .subject_alt_names
            .push(rcgen::SanType::IpAddress([10, 0, 0, 1].into()));
        let cert = params.self_signed(&key).expect("cert");
        let peer = PeerNames::from_der(cert.der());
        assert_eq!(
            peer.names(),
            ["orders service", "orders.internal", "orders-2.internal"]
        );
        assert!(PeerNames::from_der(b"not a certificate").names().is_empty());
    }
}
