//! Kafka client construction shared by every processor and admin command.

use crate::config::KafkaSettings;
use crate::producer::Producer;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Base configuration: brokers, a client id naming the role, and the operator's extra
/// properties (security settings and the like) applied last so they win.
pub fn client_config(settings: &KafkaSettings, role: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &settings.brokers)
        .set("client.id", format!("{}-{}", settings.client_id, role))
        .set("socket.timeout.ms", settings.request_timeout_ms.to_string());
    for (key, value) in &settings.properties {
        config.set(key.replace('_', "."), value.expose());
    }
    config
}

pub fn admin_client(
    settings: &KafkaSettings,
) -> Result<AdminClient<DefaultClientContext>, KafkaError> {
    client_config(settings, "admin").create()
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
    let producer = Producer::new(&config)?;
    shared.insert(key, producer.clone());
    Ok(producer)
}

/// Asks the cluster for its metadata; the readiness probe and `topics` use it.
pub async fn fetch_metadata(
    settings: &KafkaSettings,
) -> Result<rdkafka::metadata::Metadata, KafkaError> {
    let admin = admin_client(settings)?;
    let timeout = settings.request_timeout();
    tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, timeout))
        .await
        .map_err(|_| KafkaError::Canceled)?
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
