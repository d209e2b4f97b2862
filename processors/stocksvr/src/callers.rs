//! Who may call the listener, from the settings: the clients of `http.auth.clients` and of
//! `http.auth.clients_file`, the certificate subjects of `http.auth.allowed_subjects`, and
//! the deprecated `http.admin_token` (a client named `admin` with the `admin` scope).

use crate::reload::Watched;
use std::path::PathBuf;
use stocksvr_api::auth::{digest_hex, Callers, Gate, Scopes};
use stocksvr_pipeline::config::{parse_clients_file, HttpSettings, Scope};

/// The name the deprecated `http.admin_token` goes by.
pub const ADMIN_TOKEN_CLIENT: &str = "admin";

fn scopes(scopes: &[Scope]) -> Scopes {
    Scopes {
        api: scopes.contains(&Scope::Api),
        admin: scopes.contains(&Scope::Admin),
    }
}

/// Every caller of `http`, with the clients of `clients_file`'s text when it has one.
pub fn build(http: &HttpSettings, clients_file: Option<&str>) -> Result<Callers, String> {
    let from_file = match clients_file {
        Some(text) => parse_clients_file(text)?,
        None => Vec::new(),
    };
    let mut callers = Callers::new();
    for client in http.auth.clients.iter().chain(&from_file) {
        let scopes = scopes(&client.scopes);
        if let Some(digest) = &client.token_sha256 {
            callers.add_token(&client.name, digest.expose(), scopes)?;
        }
        if let Some(subject) = &client.subject {
            callers.add_subject(subject, &client.name, scopes);
        }
    }
    for subject in &http.auth.allowed_subjects {
        callers.add_subject(subject, subject, scopes(&[Scope::Api]));
    }
    if let Some(token) = http.admin_token() {
        callers.add_token(
            ADMIN_TOKEN_CLIENT,
            &digest_hex(token.expose()),
            scopes(&[Scope::Admin]),
        )?;
    }
    Ok(callers)
}

/// `http.auth.clients_file`, applied to the gate: a line removed is a token revoked.
pub struct ClientsFile {
    pub gate: Gate,
    pub http: HttpSettings,
    pub files: Vec<PathBuf>,
}

impl Watched for ClientsFile {
    fn what(&self) -> &'static str {
        "http.auth.clients_file"
    }

    fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn apply(&mut self, contents: &[Vec<u8>]) -> Result<String, String> {
        let text = contents
            .first()
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
            .unwrap_or_default();
        let callers = build(&self.http, Some(&text))?;
        let summary = format!(
            "{} callers: {}",
            callers.len(),
            callers
                .names()
                .iter()
                .map(|n| n.as_ref())
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.gate.replace(callers);
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stocksvr_pipeline::config::{HttpClient, Secret};

    #[test]
    fn every_source_of_callers_is_one_list_and_the_admin_token_is_an_admin_client() {
        let mut http = HttpSettings::default();
        http.auth.clients = vec![HttpClient {
            name: "orders".into(),
            token_sha256: Some(Secret::new(digest_hex("orders-token"))),
            subject: Some("orders.internal".into()),
            scopes: vec![Scope::Api],
        }];
        http.auth.allowed_subjects = vec!["billing.internal".into()];
        http.admin_token = Some(Secret::new("legacy-token"));
        let file = format!("ops {} admin,api\n", digest_hex("ops-token"));
        let callers = build(&http, Some(&file)).expect("builds");
        let names: Vec<String> = callers.names().iter().map(|n| n.to_string()).collect();
        assert_eq!(names, ["admin", "billing.internal", "ops", "orders"]);
        let ops = callers.by_token("ops-token").expect("ops");
        assert_eq!(
            ops.scopes,
            Scopes {
                api: true,
                admin: true
            }
        );
        let legacy = callers.by_token("legacy-token").expect("admin alias");
        assert_eq!(
            (&*legacy.name, legacy.scopes.api, legacy.scopes.admin),
            ("admin", false, true)
        );
        // An empty admin token is none.
        http.admin_token = Some(Secret::new(" "));
        assert!(build(&http, None).expect("builds").by_token(" ").is_none());
    }

    #[test]
    fn a_file_error_names_the_line_and_hides_the_digest() {
        let http = HttpSettings::default();
        let err = build(&http, Some("orders 1234\n")).expect_err("bad digest");
        assert!(err.contains("line 1") && !err.contains("1234"), "{err}");
    }
}
