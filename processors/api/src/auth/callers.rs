//! The callers the listener knows: bearer tokens by their SHA-256 digest, certificate
//! subjects by name, each with a client name and its scopes. A presented token is hashed
//! and compared with every digest in constant time, so neither the token nor how much of it
//! matched can be learned from timing; only digests are ever held.

use super::PeerNames;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The SHA-256 of a bearer token: what the configuration holds instead of the token.
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// [`token_digest`] as the 64 hex digits `http.auth` takes.
pub fn digest_hex(token: &str) -> String {
    hex::encode(token_digest(token))
}

/// What a client may call: `api` (everything outside `/admin`) and/or `admin`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes {
    pub api: bool,
    pub admin: bool,
}

#[derive(Debug, Clone)]
pub struct Caller {
    /// The client's configured name: its `client` label and its log field.
    pub name: Arc<str>,
    pub scopes: Scopes,
}

/// Every configured caller. Built whole at start and at each reload, then swapped in.
#[derive(Debug, Default)]
pub struct Callers {
    tokens: Vec<([u8; 32], Caller)>,
    subjects: Vec<(String, Caller)>,
}

impl Callers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token client from its hex digest. Errors name the client, never the digest.
    pub fn add_token(
        &mut self,
        name: &str,
        digest_hex: &str,
        scopes: Scopes,
    ) -> Result<(), String> {
        let mut digest = [0u8; 32];
        hex::decode_to_slice(digest_hex, &mut digest)
            .map_err(|_| format!("client {name}: token_sha256 is not 64 hex digits"))?;
        if let Some((_, other)) = self.tokens.iter().find(|(d, _)| *d == digest) {
            return Err(format!(
                "clients {} and {name} have the same token: give each its own",
                other.name
            ));
        }
        self.tokens.push((
            digest,
            Caller {
                name: name.into(),
                scopes,
            },
        ));
        Ok(())
    }

    /// Adds a certificate subject (a CN or SAN DNS name) as client `name`.
    pub fn add_subject(&mut self, subject: &str, name: &str, scopes: Scopes) {
        self.subjects.push((
            subject.to_string(),
            Caller {
                name: name.into(),
                scopes,
            },
        ));
    }

    /// The client whose token this is. Every digest is compared, each in constant time.
    pub fn by_token(&self, token: &str) -> Option<&Caller> {
        let presented = token_digest(token);
        let mut found = None;
        for (digest, caller) in &self.tokens {
            let equal: bool = digest.ct_eq(&presented).into();
            if equal && found.is_none() {
                found = Some(caller);
            }
        }
        found
    }

    /// The first configured subject among the certificate's names (DNS names and CNs
    /// compare without regard to ASCII case).
    pub fn by_subject(&self, peer: &PeerNames) -> Option<&Caller> {
        self.subjects
            .iter()
            .find(|(subject, _)| peer.names().iter().any(|n| n.eq_ignore_ascii_case(subject)))
            .map(|(_, caller)| caller)
    }

    /// Every client name, once each (for the metric series created at zero).
    pub fn names(&self) -> Vec<Arc<str>> {
        let mut names: Vec<Arc<str>> = self
            .tokens
            .iter()
            .map(|(_, c)| c.name.clone())
            .chain(self.subjects.iter().map(|(_, c)| c.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// How many tokens and subjects are configured.
    pub fn len(&self) -> usize {
        self.tokens.len() + self.subjects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const API: Scopes = Scopes {
        api: true,
        admin: false,
    };

    #[test]
    fn a_token_finds_its_client_and_nothing_else_does() {
        let mut callers = Callers::new();
        callers
            .add_token("orders", &digest_hex("orders-token"), API)
            .expect("added");
        callers
            .add_token(
                "ops",
                &digest_hex("ops-token"),
                Scopes {
                    api: false,
                    admin: true,
                },
            )
            .expect("added");
        assert_eq!(
            callers.by_token("orders-token").map(|c| &*c.name),
            Some("orders")
        );
        assert_eq!(callers.by_token("ops-token").map(|c| &*c.name), Some("ops"));
        for wrong in [
            "",
            "orders-toke",
            "orders-token ",
            "ORDERS-TOKEN",
            &digest_hex("orders-token"),
        ] {
            assert!(callers.by_token(wrong).is_none(), "{wrong:?}");
        }
        assert_eq!(callers.names().len(), 2);
    }

    #[test]
    fn a_shared_token_or_a_bad_digest_is_refused_without_showing_it() {
        let mut callers = Callers::new();
        let digest = digest_hex("same");
        callers.add_token("a", &digest, API).expect("added");
        let err = callers.add_token("b", &digest, API).expect_err("shared");
        assert!(err.contains("clients a and b"), "{err}");
        let err = callers
            .add_token("c", "zz-not-hex", API)
            .expect_err("not hex");
        assert!(
            !err.contains("zz-not-hex") && !err.contains(&digest),
            "{err}"
        );
    }

    #[test]
    fn a_subject_matches_any_name_of_the_certificate_ignoring_case() {
        let mut callers = Callers::new();
        callers.add_subject("orders.internal", "orders.internal", API);
        let peer = PeerNames::from_names(vec!["Some CN".into(), "ORDERS.internal".into()]);
        assert_eq!(
            callers.by_subject(&peer).map(|c| &*c.name),
            Some("orders.internal")
        );
        let other = PeerNames::from_names(vec!["orders.internal.evil".into()]);
        assert!(callers.by_subject(&other).is_none());
    }
}
