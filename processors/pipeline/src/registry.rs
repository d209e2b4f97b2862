//! Administration of the Confluent-compatible schema registry: register our subjects with
//! BACKWARD compatibility and report an incompatible change before it is registered.
//! Encoding and decoding live in [`crate::codec`].

use crate::catalog::EventSchema;
use crate::config::RegistrySettings;
use apache_avro::Schema;
use serde::Deserialize;
use serde_json::json;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";
/// New versions must be able to read data written with the previous one, so consumers can
/// be upgraded before producers.
pub const COMPATIBILITY: &str = "BACKWARD";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("schema registry unreachable at {url}: {}", describe_reqwest(source))]
    Unreachable { url: String, source: reqwest::Error },
    #[error("schema registry client: {0}")]
    Config(String),
    #[error("schema registry answered {status} for {what}: {body}")]
    Status {
        what: String,
        status: u16,
        body: String,
    },
    #[error("schema registry sent an unreadable answer for {what}: {reason}")]
    Protocol { what: String, reason: String },
    #[error("{subject}: incompatible with the registered version: {}", messages.join("; "))]
    Incompatible {
        subject: String,
        messages: Vec<String>,
    },
}

/// Where a subject stands relative to the schema compiled into this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectState {
    /// Not registered yet; registering creates version 1.
    New,
    /// The latest registered version is this schema (same canonical form).
    Unchanged { id: u32, version: u32 },
    /// Differs from the latest version and the registry accepts it as compatible.
    Compatible { latest_version: u32 },
    /// Differs and the registry would refuse it.
    Incompatible { messages: Vec<String> },
}

/// A transport error with its causes, so a TLS failure says why (`invalid peer certificate:
/// UnknownIssuer`) instead of only "error sending request".
pub fn describe_reqwest(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterOutcome {
    Registered { id: u32 },
    Unchanged { id: u32 },
}

#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    base: String,
    settings: RegistrySettings,
}

#[derive(Deserialize)]
struct LatestVersion {
    id: u32,
    version: u32,
    schema: String,
}

#[derive(Deserialize)]
struct CompatibilityAnswer {
    is_compatible: bool,
    #[serde(default)]
    messages: Vec<String>,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: u32,
}

#[derive(Deserialize)]
struct ConfigAnswer {
    compatibility: Option<String>,
    #[serde(rename = "compatibilityLevel")]
    compatibility_level: Option<String>,
}

impl RegistryClient {
    pub fn new(settings: &RegistrySettings) -> Result<Self, RegistryError> {
        let http = crate::tls::registry_http(settings)
            .map_err(|e| RegistryError::Config(e.to_string()))?
            .build()
            .map_err(|source| RegistryError::Unreachable {
                url: settings.url.clone(),
                source,
            })?;
        Ok(Self {
            http,
            base: settings.url.trim_end_matches('/').to_string(),
            settings: settings.clone(),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.base, path))
            .header(reqwest::header::ACCEPT, CONTENT_TYPE);
        if let Some(token) = &self.settings.token {
            req = req.bearer_auth(token.expose());
        } else if let Some(user) = &self.settings.username {
            req = req.basic_auth(user, self.settings.password.as_ref().map(|p| p.expose()));
        }
        req
    }

    /// Sends and returns (status, body); only a transport failure is an error here.
    async fn send(&self, req: reqwest::RequestBuilder) -> Result<(u16, String), RegistryError> {
        let resp = req
            .send()
            .await
            .map_err(|source| RegistryError::Unreachable {
                url: self.base.clone(),
                source,
            })?;
        let status = resp.status().as_u16();
        let body = resp
            .text()
            .await
            .map_err(|source| RegistryError::Unreachable {
                url: self.base.clone(),
                source,
            })?;
        Ok((status, body))
    }

    fn parse<T: for<'de> Deserialize<'de>>(what: &str, body: &str) -> Result<T, RegistryError> {
        serde_json::from_str(body).map_err(|e| RegistryError::Protocol {
            what: what.to_string(),
            reason: format!("{e}: {body}"),
        })
    }

    /// Whether `subject` has a version. Ask this rather than searching [`Self::subjects`]:
    /// a registry lists a bounded page of subjects (Apicurio's ccompat API: 1,000 unless
    /// asked for more), and a registry shared by many deployments holds more than that.
    pub async fn has_subject(&self, subject: &str) -> Result<bool, RegistryError> {
        Ok(self.latest(subject).await?.is_some())
    }

    /// The registry's first page of subjects (not necessarily all of them); the readiness
    /// probe of the registry.
    pub async fn subjects(&self) -> Result<Vec<String>, RegistryError> {
        let (status, body) = self
            .send(self.request(reqwest::Method::GET, "/subjects"))
            .await?;
        if status != 200 {
            return Err(RegistryError::Status {
                what: "GET /subjects".into(),
                status,
                body,
            });
        }
        Self::parse("GET /subjects", &body)
    }

    async fn latest(&self, subject: &str) -> Result<Option<LatestVersion>, RegistryError> {
        let what = format!("latest version of {subject}");
        let path = format!("/subjects/{}/versions/latest", urlencode(subject));
        let (status, body) = self.send(self.request(reqwest::Method::GET, &path)).await?;
        match status {
            200 => Ok(Some(Self::parse(&what, &body)?)),
            404 => Ok(None),
            _ => Err(RegistryError::Status { what, status, body }),
        }
    }

    /// Compares the subject with `raw` (schema text) without changing anything.
    pub async fn check(&self, subject: &str, raw: &str) -> Result<SubjectState, RegistryError> {
        let Some(latest) = self.latest(subject).await? else {
            return Ok(SubjectState::New);
        };
        if same_schema(&latest.schema, raw) {
            return Ok(SubjectState::Unchanged {
                id: latest.id,
                version: latest.version,
            });
        }
        let what = format!("compatibility of {subject}");
        let path = format!(
            "/compatibility/subjects/{}/versions/latest?verbose=true",
            urlencode(subject)
        );
        let req = self
            .request(reqwest::Method::POST, &path)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(json!({ "schema": raw }).to_string());
        let (status, body) = self.send(req).await?;
        match status {
            200 => {
                let answer: CompatibilityAnswer = Self::parse(&what, &body)?;
                Ok(if answer.is_compatible {
                    SubjectState::Compatible {
                        latest_version: latest.version,
                    }
                } else {
                    // Apicurio answers without `messages` even with ?verbose=true: say why
                    // ourselves, under the level the subject runs with.
                    let messages = if answer.messages.is_empty() {
                        let level = self
                            .compatibility(subject)
                            .await
                            .ok()
                            .flatten()
                            .unwrap_or_else(|| COMPATIBILITY.to_string());
                        vec![why_incompatible(
                            &level,
                            latest.version,
                            &latest.schema,
                            raw,
                        )]
                    } else {
                        answer.messages
                    };
                    SubjectState::Incompatible { messages }
                })
            }
            // Some registries answer an incompatible schema with 409 instead of a verdict.
            409 | 422 => Ok(SubjectState::Incompatible {
                messages: vec![body],
            }),
            _ => Err(RegistryError::Status { what, status, body }),
        }
    }

    /// The subject's own compatibility level, if one is set.
    pub async fn compatibility(&self, subject: &str) -> Result<Option<String>, RegistryError> {
        let what = format!("config of {subject}");
        let path = format!("/config/{}", urlencode(subject));
        let (status, body) = self.send(self.request(reqwest::Method::GET, &path)).await?;
        match status {
            200 => {
                let c: ConfigAnswer = Self::parse(&what, &body)?;
                Ok(c.compatibility_level.or(c.compatibility))
            }
            404 => Ok(None),
            _ => Err(RegistryError::Status { what, status, body }),
        }
    }

    pub async fn set_compatibility(&self, subject: &str, level: &str) -> Result<(), RegistryError> {
        let path = format!("/config/{}", urlencode(subject));
        let req = self
            .request(reqwest::Method::PUT, &path)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(json!({ "compatibility": level }).to_string());
        let (status, body) = self.send(req).await?;
        if status != 200 {
            return Err(RegistryError::Status {
                what: format!("PUT config of {subject}"),
                status,
                body,
            });
        }
        Ok(())
    }

    /// Registers `schema` under `subject` unless it is already the latest version; refuses
    /// an incompatible change with the registry's reasons.
    /// The text is registered as written: its canonical form would drop the field
    /// defaults that BACKWARD evolution depends on.
    pub async fn register(
        &self,
        subject: &str,
        raw: &str,
    ) -> Result<RegisterOutcome, RegistryError> {
        match self.check(subject, raw).await? {
            SubjectState::Unchanged { id, .. } => return Ok(RegisterOutcome::Unchanged { id }),
            SubjectState::Incompatible { messages } => {
                return Err(RegistryError::Incompatible {
                    subject: subject.to_string(),
                    messages,
                })
            }
            SubjectState::New | SubjectState::Compatible { .. } => {}
        }
        let what = format!("register {subject}");
        let path = format!("/subjects/{}/versions", urlencode(subject));
        let req = self
            .request(reqwest::Method::POST, &path)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(json!({ "schema": raw }).to_string());
        let (status, body) = self.send(req).await?;
        match status {
            200 => Ok(RegisterOutcome::Registered {
                id: Self::parse::<IdAnswer>(&what, &body)?.id,
            }),
            409 => Err(RegistryError::Incompatible {
                subject: subject.to_string(),
                messages: vec![body],
            }),
            _ => Err(RegistryError::Status { what, status, body }),
        }
    }

    /// Registers one catalog event and pins its subject to BACKWARD compatibility.
    /// Returns the outcome and whether the compatibility level had to be changed.
    pub async fn register_event(
        &self,
        event: &EventSchema,
    ) -> Result<(RegisterOutcome, bool), RegistryError> {
        let subject = event.subject();
        let outcome = self.register(&subject, event.raw).await?;
        let pinned = |level: Option<String>| {
            level.is_some_and(|level| level.eq_ignore_ascii_case(COMPATIBILITY))
        };
        let level_changed = if pinned(self.compatibility(&subject).await?) {
            false
        } else {
            match self.set_compatibility(&subject, COMPATIBILITY).await {
                Ok(()) => true,
                // Another `schemas register` (a second instance deploying at the same time)
                // pinned it between the read and the write: Apicurio answers 409, the rule
                // exists already. Fine if it is the level we want.
                Err(e @ RegistryError::Status { status: 409, .. }) => {
                    if !pinned(self.compatibility(&subject).await?) {
                        return Err(e);
                    }
                    false
                }
                Err(e) => return Err(e),
            }
        };
        Ok((outcome, level_changed))
    }
}

/// Two schema texts are the same schema when their Parsing Canonical Forms are equal
/// (whitespace, docs and attribute order do not matter).
fn same_schema(registered: &str, ours: &str) -> bool {
    match (Schema::parse_str(registered), Schema::parse_str(ours)) {
        (Ok(a), Ok(b)) => a.canonical_form() == b.canonical_form(),
        _ => false,
    }
}

/// Subjects contain only `[A-Za-z0-9._-]` here, but escape anything else defensively.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Why `new` cannot follow version `version` (`latest`) under `level`, in Avro's words (the
/// field and what is wrong with it), as far as the schemas show it.
pub fn why_incompatible(level: &str, version: u32, latest: &str, new: &str) -> String {
    use apache_avro::schema_compatibility::SchemaCompatibility;
    use apache_avro::Schema;
    let unexplained =
        || format!("the registry finds it incompatible with version {version} under {level}");
    let (Ok(old), Ok(new)) = (Schema::parse_str(latest), Schema::parse_str(new)) else {
        return unexplained();
    };
    let level = level.to_ascii_uppercase();
    // BACKWARD: the new schema reads what the old one wrote; FORWARD: the other way round;
    // FULL: both. (The _TRANSITIVE levels compare with every version; this names the latest.)
    let mut reasons = Vec::new();
    if !level.starts_with("FORWARD") {
        if let Err(e) = SchemaCompatibility::can_read(&old, &new) {
            reasons.push(format!(
                "the new schema cannot read data written with version {version}: {}",
                error_chain(&e)
            ));
        }
    }
    if level.starts_with("FORWARD") || level.starts_with("FULL") {
        if let Err(e) = SchemaCompatibility::can_read(&new, &old) {
            reasons.push(format!(
                "readers of version {version} cannot read data written with the new schema: {}",
                error_chain(&e)
            ));
        }
    }
    if reasons.is_empty() {
        unexplained()
    } else {
        format!("incompatible under {level}: {}", reasons.join("; "))
    }
}

/// An error and its sources, outermost first.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_differing_only_in_docs_are_the_same() {
        let a = r#"{"type":"record","name":"A","namespace":"x","doc":"one","fields":[{"name":"f","type":"long"}]}"#;
        let b = r#"{"namespace":"x","name":"A","type":"record","fields":[{"type":"long","name":"f","doc":"two"}]}"#;
        assert!(same_schema(a, b));
        let c =
            r#"{"type":"record","name":"A","namespace":"x","fields":[{"name":"f","type":"int"}]}"#;
        assert!(!same_schema(c, b));
    }

    #[test]
    fn urlencode_keeps_subject_characters() {
        assert_eq!(
            urlencode("order.lifecycle.v1-io.x.A_b"),
            "order.lifecycle.v1-io.x.A_b"
        );
        assert_eq!(urlencode("a/b c"), "a%2Fb%20c");
    }

    fn record(fields: &str) -> String {
        format!(r#"{{"type":"record","name":"A","namespace":"x","fields":[{fields}]}}"#)
    }

    #[test]
    fn an_incompatible_change_is_explained_by_field_under_the_subjects_level() {
        let v1 = record(r#"{"name":"a","type":"long"}"#);
        let required = record(r#"{"name":"a","type":"long"},{"name":"b","type":"string"}"#);
        let why = why_incompatible("BACKWARD", 1, &v1, &required);
        assert!(why.contains("under BACKWARD"), "{why}");
        assert!(why.contains("version 1"), "{why}");
        assert!(why.contains("'b'") && why.contains("default"), "{why}");

        // Dropping a field without a default: fine for new readers, not for old ones.
        let dropped = record(r#"{"name":"c","type":["null","long"],"default":null}"#);
        let with_a = record(
            r#"{"name":"a","type":"long"},{"name":"c","type":["null","long"],"default":null}"#,
        );
        let why = why_incompatible("FULL", 2, &with_a, &dropped);
        assert!(why.contains("readers of version 2"), "{why}");
        assert!(why.contains("'a'"), "{why}");

        // A type change is named with the field and both types.
        let text = record(r#"{"name":"a","type":"string"}"#);
        let why = why_incompatible("BACKWARD", 1, &v1, &text);
        assert!(why.contains("'a'"), "{why}");

        // Nothing the schemas show: the registry's verdict, with the level.
        let why = why_incompatible("FORWARD_TRANSITIVE", 3, &v1, "not a schema");
        assert_eq!(
            why,
            "the registry finds it incompatible with version 3 under FORWARD_TRANSITIVE"
        );
    }
}
