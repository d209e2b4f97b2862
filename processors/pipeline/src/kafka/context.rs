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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often one client says the same error that is not a refusal (all brokers down, a
/// connection lost) while it lasts: librdkafka reports it at every reconnect attempt.
const SAME_ERROR_EVERY: Duration = Duration::from_secs(60);

/// Who a client is, for naming a refusal: the SASL user, the client's role, and for a
/// consumer the topics it reads and the group it joins. Clones share one record of whether
/// this client was refused.
#[derive(Debug, Clone, Default)]
pub struct KafkaContext {
    user: Option<String>,
    role: String,
    topics: String,
    group: String,
    refused: Arc<AtomicBool>,
    /// The last error this client logged (not a refusal) and when.
    last_logged: Arc<Mutex<Option<(String, Instant)>>>,
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
            ..Self::default()
        }
    }

    /// A consumer's context: a refused fetch or join names `topics` or `group`.
    pub fn reading(mut self, topics: &[String], group: &str) -> Self {
        self.topics = topics.join(", ");
        self.group = group.to_string();
        self
    }

    /// A librdkafka error with the text that came with it: a refusal is recorded (and
    /// logged once); anything else is for the caller to log. `what` names what was refused
    /// when neither the text nor the context does.
    pub fn refused(&self, error: &KafkaError, text: &str, what: &str) -> bool {
        let Some(code) = error.rdkafka_error_code() else {
            return false;
        };
        let Some(refusal) = kafka_refusal(code, text) else {
            return false;
        };
        causes::seen(Dependency::Kafka, &self.describe(refusal, text, what));
        self.refused.store(true, Ordering::Release);
        true
    }

    /// Any error of this client, from librdkafka's error callback or a consumer's queue: a
    /// refusal is recorded once ([`KafkaContext::refused`]); anything else is logged when it
    /// changes and at most once a minute while it repeats, and not at all while a refused
    /// password or certificate explains it (every broker looks down then).
    pub fn report(&self, error: &KafkaError, text: &str) {
        // With `enable.partition.eof` the end of a partition comes this way too: a fetch
        // that succeeded.
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
            || matches!(error, KafkaError::PartitionEOF(_))
        {
            self.fetched();
            return;
        }
        if self.refused(error, text, "") {
            return;
        }
        let explained = self.refused.load(Ordering::Acquire)
            && causes::current(Dependency::Kafka)
                .iter()
                .any(|c| c.starts_with("SASL") || c.starts_with("TLS"));
        let line = if text.is_empty() {
            error.to_string()
        } else {
            format!("{error}: {text}")
        };
        let mut last = self
            .last_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let repeat = last
            .as_ref()
            .is_some_and(|(l, at)| *l == line && at.elapsed() < SAME_ERROR_EVERY);
        if explained || repeat {
            tracing::debug!(target: "librdkafka", client = %self.role, "{line}");
            return;
        }
        *last = Some((line.clone(), Instant::now()));
        tracing::warn!(
            target: "librdkafka",
            client = %self.role,
            repeats = "said again when it changes, or after a minute",
            "kafka: {line}"
        );
    }

    /// The client fetched (a record, or the end of a partition): whatever refused its
    /// reads is gone, its group's ACL, its topics', the password and the certificate.
    pub fn fetched(&self) {
        if !self.refused.swap(false, Ordering::AcqRel) {
            return;
        }
        let (topics, group) = self.own_causes();
        causes::ruled_out(Dependency::Kafka, |c| {
            c == topics || c == group || c.starts_with("SASL") || c.starts_with("TLS")
        });
    }

    /// The consumer joined its group (partitions were assigned): its group's ACL is there.
    pub fn joined(&self) {
        if self.refused.load(Ordering::Acquire) {
            let (_, group) = self.own_causes();
            causes::ruled_out(Dependency::Kafka, |c| c == group);
        }
    }

    /// The causes a refused read or join of this client are recorded as.
    fn own_causes(&self) -> (String, String) {
        (
            self.describe(Refusal::Authorization("topic"), "", ""),
            self.describe(Refusal::Authorization("group"), "", ""),
        )
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
                let own = match resource {
                    "topic" => self.topics.as_str(),
                    "group" => self.group.as_str(),
                    _ => "",
                };
                let named = named_topic(text)
                    .or((!what.is_empty()).then_some(what))
                    .unwrap_or(own);
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

/// A global error of a client ([`KafkaContext::report`]).
pub fn report_error(context: &KafkaContext, error: &KafkaError, reason: &str) {
    context.report(error, reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_described_without_what_changes_between_retries() {
        let ctx = KafkaContext {
            user: Some("stocksvr".into()),
            role: "order-lifecycle".into(),
            ..KafkaContext::default()
        };
        ctx.report(
            &KafkaError::Global(rdkafka::types::RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
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
        let consumer = ctx.reading(&["t.order.lifecycle.v1".to_string()], "t.order-lifecycle");
        assert_eq!(
            consumer.describe(
                Refusal::Authorization("topic"),
                "Broker: Topic authorization failed",
                ""
            ),
            "topic authorization failed for t.order.lifecycle.v1"
        );
        assert_eq!(
            consumer.describe(Refusal::Authorization("group"), "", ""),
            "group authorization failed for t.order-lifecycle"
        );
    }

    #[test]
    fn a_consumer_that_fetches_again_rules_its_refusals_out() {
        let ctx =
            KafkaContext::default().reading(&["ctx-test.topic".to_string()], "ctx-test.group");
        let refused = KafkaError::MessageConsumption(
            rdkafka::types::RDKafkaErrorCode::TopicAuthorizationFailed,
        );
        assert!(ctx.refused(&refused, "", ""));
        let group = KafkaError::MessageConsumption(
            rdkafka::types::RDKafkaErrorCode::GroupAuthorizationFailed,
        );
        assert!(ctx.refused(&group, "", ""));
        let ours = |c: &String| c.contains("ctx-test.");
        assert_eq!(
            causes::current(Dependency::Kafka)
                .iter()
                .filter(|c| ours(c))
                .count(),
            2
        );
        ctx.joined();
        assert_eq!(
            causes::current(Dependency::Kafka)
                .iter()
                .filter(|c| ours(c))
                .collect::<Vec<_>>(),
            ["topic authorization failed for ctx-test.topic"]
        );
        ctx.fetched();
        assert!(!causes::current(Dependency::Kafka).iter().any(ours));
        let timeout =
            KafkaError::MessageConsumption(rdkafka::types::RDKafkaErrorCode::RequestTimedOut);
        assert!(!ctx.refused(&timeout, "", ""), "not a refusal");
    }
}
