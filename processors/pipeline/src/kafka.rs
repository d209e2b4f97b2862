//! Kafka client construction shared by every processor and admin command.

use crate::config::KafkaSettings;
use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureProducer;

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
pub fn producer(settings: &KafkaSettings, role: &str) -> Result<FutureProducer, KafkaError> {
    client_config(settings, role)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("compression.type", "lz4")
        .set("linger.ms", "5")
        .create()
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
