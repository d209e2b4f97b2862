//! Users' existing serializers work with us: a record produced by Python `confluent-kafka`
//! with its Confluent `AvroSerializer` is decoded by our codec, and a record we produce is
//! decoded by that client's `AvroDeserializer`. The Python environment comes from
//! `tests/interop/venv.sh` (PyPI), Kafka and the registry are the real local stack.

mod common;

use rdkafka::producer::FutureRecord;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use stocksvr_pipeline::catalog::Catalog;
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::json::{avro_to_json, json_to_avro};
use stocksvr_pipeline::kafka;

fn python() -> String {
    let root = common::repo_root();
    let out = Command::new("bash")
        .arg(root.join("tests/interop/venv.sh"))
        .output()
        .expect("venv.sh runs");
    assert!(
        out.status.success(),
        "venv.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn example(name: &str) -> serde_json::Value {
    let path = common::repo_root().join("schemas/examples").join(name);
    serde_json::from_str(&std::fs::read_to_string(path).expect("example")).expect("json")
}

#[tokio::test]
async fn python_avro_serializer_output_is_decoded_by_our_codec() {
    let settings = common::settings();
    let test_topic = common::TestTopic::new("it.interop.order", 1).await;
    let topic = test_topic.name.clone();
    let root = common::repo_root();
    let out = common::output_within(
        Command::new(python())
            .arg(root.join("tests/interop/produce.py"))
            .args([
                "--bootstrap",
                &settings.kafka.brokers,
                "--registry",
                &settings.registry.url,
                "--topic",
                &topic,
            ])
            .arg("--schema-file")
            .arg(root.join("schemas/OrderCreated.avsc"))
            .arg("--payload-file")
            .arg(root.join("schemas/examples/OrderCreated.json")),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "produce.py: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let produced: serde_json::Value =
        serde_json::from_str(stdout.trim().lines().last().expect("a line")).expect("json line");
    let partition = produced["partition"].as_i64().expect("partition") as i32;
    let offset = produced["offset"].as_i64().expect("offset");

    let message = common::read_at(&topic, partition, offset, Duration::from_secs(30));
    let codec = AvroCodec::new(
        &settings.registry,
        Arc::new(Catalog::embedded().expect("catalog")),
    )
    .expect("codec");
    let decoded = codec
        .decode(rdkafka::Message::payload(&message))
        .await
        .expect("our codec decodes the Python record");
    assert_eq!(decoded.full_name, "io.stocksvr.order.OrderCreated");
    assert_eq!(avro_to_json(&decoded.value), example("OrderCreated.json"));
}

#[tokio::test]
async fn our_records_are_decoded_by_the_python_avro_deserializer() {
    let settings = common::settings();
    let test_topic = common::TestTopic::new("it.interop.inventory", 1).await;
    let topic = test_topic.name.clone();
    let catalog = Arc::new(Catalog::embedded().expect("catalog"));
    let event = catalog
        .by_name("io.stocksvr.inventory.InventoryRedisReserved")
        .expect("declared")
        .clone();
    let payload = example("InventoryRedisReserved.json");
    let codec = AvroCodec::new(&settings.registry, catalog).expect("codec");
    let bytes = codec
        .encode_value_on(
            &topic,
            &event.full_name,
            event.raw,
            json_to_avro(&payload, &event.parsed).expect("valid"),
        )
        .await
        .expect("encodes");
    let producer = kafka::producer(&settings.kafka, "it-interop").expect("producer");
    let delivery = producer
        .send(
            FutureRecord::to(&topic).key("bucket").payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("delivered");

    let out = common::output_within(
        Command::new(python())
            .arg(common::repo_root().join("tests/interop/consume.py"))
            .args([
                "--bootstrap",
                &settings.kafka.brokers,
                "--registry",
                &settings.registry.url,
                "--topic",
                &topic,
            ])
            .args([
                "--partition",
                &delivery.partition.to_string(),
                "--offset",
                &delivery.offset.to_string(),
            ])
            .args(["--timeout", "30"]),
        Duration::from_secs(120),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "consume.py: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value =
        serde_json::from_str(stdout.trim().lines().last().expect("a line")).expect("json");
    // consume.py prints the value it deserialized, either bare or under "value".
    let value = line.get("value").cloned().unwrap_or(line);
    assert_eq!(value, payload);
}
