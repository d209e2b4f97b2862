//! Kafka client construction shared by every processor and admin command: one function
//! ([`client_config`]) gives every client of the process the same brokers, security settings
//! (TLS, SASL) and reconnect pacing, and [`KafkaContext`] reports what refuses it.

pub mod context;

use crate::config::KafkaSettings;
use crate::producer::Producer;
pub use context::KafkaContext;
use rdkafka::admin::AdminClient;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// Base configuration: brokers, a client id naming the role, the security settings, and
/// the operator's extra properties (`kafka.properties`) applied last so they win. Every
/// Kafka client of stocksvr starts from here: the processors' consumers, the producer, the
/// admin client, the lag exporter, dead-letter replay and `stocksvr produce`.
pub fn client_config(settings: &KafkaSettings, role: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("client.id", format!("{}-{}", settings.client_id, role))
        .set("socket.timeout.ms", settings.request_timeout_ms.to_string())
        // A refused connection (a wrong password, an untrusted certificate) is retried
        // from 0.5 s, doubling to 10 s, instead of from librdkafka's 100 ms: the refusal is
        // not going to change in a tenth of a second, and a broker that restarts is back
        // in no less. 10 s is librdkafka's own cap.
        .set("reconnect.backoff.ms", "500")
        .set("reconnect.backoff.max.ms", "10000");
    security(&mut config, settings);
    for (key, value) in &settings.properties {
        config.set(key.replace('_', "."), value.expose());
    }
    config
}

/// `security.protocol`, TLS files and SASL credentials, as the settings say (checked at
/// load: `kafka.sasl.*` only with a SASL protocol, `kafka.tls.*` only with a TLS one).
fn security(config: &mut ClientConfig, settings: &KafkaSettings) {
    let protocol = settings.security_protocol;
    config.set("security.protocol", protocol.librdkafka());
    if protocol.uses_tls() {
        // librdkafka's default since 2.0, set so no property file can have turned it off
        // unnoticed: the broker's certificate must carry the name it is reached by.
        config.set("ssl.endpoint.identification.algorithm", "https");
        let tls = &settings.tls;
        for (key, path) in [
            ("ssl.ca.location", &tls.ca_file),
            ("ssl.certificate.location", &tls.cert_file),
            ("ssl.key.location", &tls.key_file),
        ] {
            if let Some(path) = path {
                config.set(key, path.display().to_string());
            }
        }
    }
    if protocol.uses_sasl() {
        let sasl = &settings.sasl;
        if let Some(mechanism) = sasl.mechanism {
            config.set("sasl.mechanism", mechanism.librdkafka());
        }
        if let Some(user) = &sasl.username {
            config.set("sasl.username", user);
        }
        if let Some(password) = &sasl.password {
            config.set("sasl.password", password.expose());
        }
    }
}

pub fn admin_client(settings: &KafkaSettings) -> Result<AdminClient<KafkaContext>, KafkaError> {
    client_config(settings, "admin").create_with_context(KafkaContext::new(settings, "admin"))
}

/// An idempotent producer (`enable.idempotence`, `acks=all`): a retried send after a lost
/// acknowledgement is written once per partition, and nothing counts as sent until every
/// in-sync replica has it.
///
/// One producer per process and configuration, shared by every role that asks (the relay,
/// each consumer loop's dead-letter path): every librdkafka producer brings its own broker
/// threads and its polling thread. The producer is
/// thread-safe and its order per partition does not depend on who enqueues. `role` names the
/// first user in `client.id` only when the process makes a producer for a configuration of
/// its own; a shared one is `<client_id>-producer`.
pub fn producer(settings: &KafkaSettings, role: &str) -> Result<Producer, KafkaError> {
    static SHARED: OnceLock<Mutex<HashMap<String, Producer>>> = OnceLock::new();
    let mut config = client_config(settings, "producer");
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5");
    // The whole configuration is the key, so a role with other settings (other brokers,
    // credentials) never gets a producer that was made for different ones.
    let key = format!("{:?}", config.config_map());
    let mut shared = SHARED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(producer) = shared.get(&key) {
        return Ok(producer.clone());
    }
    tracing::debug!(role, "making the process's Kafka producer");
    let producer = Producer::with_context(&config, KafkaContext::new(settings, role))?;
    shared.insert(key, producer.clone());
    Ok(producer)
}

/// Asks the cluster for its metadata over a client of its own; `topics` uses it.
pub async fn fetch_metadata(
    settings: &KafkaSettings,
) -> Result<rdkafka::metadata::Metadata, KafkaError> {
    let admin = Arc::new(admin_client(settings)?);
    fetch_metadata_on(&admin, settings.request_timeout()).await
}

/// Asks the cluster for its metadata over `admin`, which keeps its connections between
/// calls (the readiness probe asks every few seconds).
pub async fn fetch_metadata_on(
    admin: &Arc<AdminClient<KafkaContext>>,
    timeout: std::time::Duration,
) -> Result<rdkafka::metadata::Metadata, KafkaError> {
    let admin = Arc::clone(admin);
    tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, timeout))
        .await
        .map_err(|_| KafkaError::Canceled)?
}

/// Asks for one topic by name, as a consumer (which never makes the broker create it):
/// `Ok` when it is there; otherwise why not, in one line (`topic authorization failed for
/// <topic>`, or that it does not exist). Blocking: run it off the async runtime.
pub fn describe_topic(settings: &KafkaSettings, topic: &str) -> Result<(), String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let context = KafkaContext::new(settings, "readiness");
    let consumer: BaseConsumer<KafkaContext> = client_config(settings, "readiness")
        .set("allow.auto.create.topics", "false")
        .create_with_context(context.clone())
        .map_err(|e| e.to_string())?;
    let metadata = consumer
        .fetch_metadata(Some(topic), settings.request_timeout())
        .map_err(|e| e.to_string())?;
    let code = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .and_then(|t| t.error())
        .map(rdkafka::types::RDKafkaErrorCode::from);
    match code {
        None => Ok(()),
        Some(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition) => Err(format!(
            "topic {topic} does not exist (`stocksvr topics apply` creates it)"
        )),
        Some(code) => match crate::failure::kafka_refusal(code, "") {
            Some(refusal) => Err(context.describe(refusal, "", topic)),
            None => Err(format!("topic {topic}: {code}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Making a producer does not connect; nothing listens on these ports.
    fn settings(brokers: &str) -> KafkaSettings {
        KafkaSettings {
            brokers: brokers.into(),
            ..KafkaSettings::default()
        }
    }

    #[test]
    fn roles_with_one_configuration_share_one_producer_and_others_get_their_own() {
        let relay = producer(&settings("127.0.0.1:1"), "outbox-relay").expect("producer");
        let dlt = producer(&settings("127.0.0.1:1"), "projector").expect("producer");
        let elsewhere = producer(&settings("127.0.0.1:2"), "projector").expect("producer");
        assert_eq!(
            relay.client().native_ptr(),
            dlt.client().native_ptr(),
            "one librdkafka producer for one configuration"
        );
        assert_ne!(
            relay.client().native_ptr(),
            elsewhere.client().native_ptr(),
            "other brokers, another producer"
        );
    }
}
