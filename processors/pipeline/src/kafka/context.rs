//! The client context of every Kafka client of the process: librdkafka's log lines and
//! global errors, with a refusal (a password the brokers do not accept, a certificate this
//! process does not trust, a missing ACL) said once per change ([`crate::causes`]) instead
//! of at every retry, and named by `/readyz`.

use crate::causes;
use crate::config::KafkaSettings;
use crate::failure::{kafka_refusal, Dependency, Refusal};
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::ConsumerContext;
use rdkafka::error::KafkaError;

/// Who a client is, for naming a refusal: the SASL user and the client's role.
#[derive(Debug, Clone, Default)]
pub struct KafkaContext {
    user: Option<String>,
    role: String,
}

impl KafkaContext {
    pub fn new(settings: &KafkaSettings, role: &str) -> Self {
        Self {
            user: settings
                .security_protocol
                .uses_sasl()
                .then(|| settings.sasl.username.clone())
                .flatten(),
            role: role.to_string(),
        }
    }

    /// A librdkafka error with the text that came with it: a refusal is recorded (and
    /// logged once); anything else is for the caller to log. `what` names what was refused
    /// when the text does not (the topics a consumer reads, the group it joins).
    pub fn refused(&self, error: &KafkaError, text: &str, what: &str) -> bool {
        let Some(code) = error.rdkafka_error_code() else {
            return false;
        };
        let Some(refusal) = kafka_refusal(code, text) else {
            return false;
        };
        causes::seen(Dependency::Kafka, &self.describe(refusal, text, what));
        true
    }

    /// The cause, in one line without the parts that change from retry to retry (the
    /// broker's address, the time spent, the count of suppressed repeats).
    pub fn describe(&self, refusal: Refusal, text: &str, what: &str) -> String {
        match refusal {
            Refusal::Authentication => match &self.user {
                Some(user) => format!("SASL authentication failed for user {user}"),
                None => "SASL authentication failed".into(),
            },
            Refusal::Tls => format!("TLS: {}", tls_detail(text)),
            Refusal::Authorization(resource) => {
                let named = named_topic(text).unwrap_or(what);
                if named.is_empty() {
                    format!("{resource} authorization failed ({})", self.role)
                } else {
                    format!("{resource} authorization failed for {named}")
                }
            }
        }
    }
}

/// What OpenSSL said about a failed handshake, without librdkafka's framing:
/// `ssl://host:9093/1: SSL handshake failed: error:0A000086:SSL routines::certificate verify
/// failed: broker certificate could not be verified, ... (after 5ms in state SSL_HANDSHAKE)`
/// becomes `certificate verify failed: broker certificate could not be verified, ...`.
fn tls_detail(text: &str) -> String {
    let text = strip_volatile(text);
    let after = text
        .rsplit_once("SSL handshake failed:")
        .map_or(text, |(_, rest)| rest)
        .trim();
    // OpenSSL's `error:<code>:<library>::<reason>` prefix.
    let after = match after.strip_prefix("error:") {
        Some(rest) => rest.split_once("::").map_or(after, |(_, r)| r),
        None => after,
    };
    after.trim().to_string()
}

/// The topic a librdkafka message names (`Subscribed topic not available: <topic>: Broker:
/// Topic authorization failed`).
fn named_topic(text: &str) -> Option<&str> {
    let rest = text.split_once("topic not available: ")?.1;
    rest.split_once(':').map(|(topic, _)| topic.trim())
}

/// Drops ` (after 12ms in state X, 3 identical error(s) suppressed)` and the like.
fn strip_volatile(text: &str) -> &str {
    match text.rfind(" (after ") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// True for a librdkafka log line that repeats a refusal the error callback reports too.
fn repeats_a_refusal(message: &str) -> bool {
    [
        "SASL authentication error",
        "SSL handshake failed",
        "authorization failed",
        "Authorization failed",
    ]
    .iter()
    .any(|m| message.contains(m))
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        log_line(level, fac, message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        report_error(self, &error, reason);
    }
}

impl ConsumerContext for KafkaContext {}

/// librdkafka's log line, at its level, under target `librdkafka` (the filter's
/// `librdkafka=warn`); a line that repeats a refusal goes to debug, the error callback
/// records the refusal once.
pub fn log_line(level: RDKafkaLogLevel, fac: &str, message: &str) {
    let refusal = repeats_a_refusal(message);
    match level {
        _ if refusal => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        RDKafkaLogLevel::Warning => {
            tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        RDKafkaLogLevel::Debug => {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
    }
}

/// A global error of a client: a refusal is recorded once; anything else is logged as
/// rust-rdkafka's default context did.
pub fn report_error(context: &KafkaContext, error: &KafkaError, reason: &str) {
    if !context.refused(error, reason, "") {
        tracing::error!(target: "librdkafka", "librdkafka: {error}: {reason}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_described_without_what_changes_between_retries() {
        let ctx = KafkaContext {
            user: Some("stocksvr".into()),
            role: "order-lifecycle".into(),
        };
        assert_eq!(
            ctx.describe(Refusal::Authentication, "SASL authentication error: Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 301ms in state AUTH_REQ, 4 identical error(s) suppressed)", ""),
            "SASL authentication failed for user stocksvr"
        );
        assert_eq!(
            ctx.describe(Refusal::Tls, "sasl_ssl://localhost:9094/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (install ca-certificates package) (after 5ms in state SSL_HANDSHAKE)", ""),
            "TLS: certificate verify failed: broker certificate could not be verified, verify that ssl.ca.location is correctly configured or root CA certificates are installed (install ca-certificates package)"
        );
        assert_eq!(
            ctx.describe(Refusal::Authorization("topic"), "Subscribed topic not available: demo.order.lifecycle.v1: Broker: Topic authorization failed", "x"),
            "topic authorization failed for demo.order.lifecycle.v1"
        );
        assert_eq!(
            ctx.describe(
                Refusal::Authorization("group"),
                "Broker: Group authorization failed",
                "stocksvr.projector"
            ),
            "group authorization failed for stocksvr.projector"
        );
        assert_eq!(
            ctx.describe(Refusal::Authorization("cluster"), "", ""),
            "cluster authorization failed (order-lifecycle)"
        );
    }
}
