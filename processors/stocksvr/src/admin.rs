//! Operator commands. Each prints what it changed, one line per item, and is idempotent.

use anyhow::{bail, Context};
use rdkafka::producer::FutureRecord;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use stocksvr::Settings;
use stocksvr_core::retry::RetryPolicy;
use stocksvr_pipeline::catalog::{Catalog, EventSchema};
use stocksvr_pipeline::codec::AvroCodec;
use stocksvr_pipeline::config::redact_url;
use stocksvr_pipeline::registry::{RegisterOutcome, RegistryClient, RegistryError, SubjectState};
use stocksvr_pipeline::{json, kafka, topics};

pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let url = settings.mysql.url.expose();
    let pool = stocksvr_store::mysql_pool(
        url,
        2,
        Duration::from_millis(settings.mysql.acquire_timeout_ms),
    )?;
    stocksvr_store::ping_mysql(&pool)
        .await
        .with_context(|| format!("connecting to {}", redact_url(url)))?;
    let steps = stocksvr_store::migrate(&pool).await?;
    let applied = steps.iter().filter(|s| s.applied_now).count();
    for step in &steps {
        let state = if step.applied_now {
            "applied"
        } else {
            "up to date"
        };
        println!("migration {} {}: {state}", step.version, step.description);
    }
    println!(
        "migrate: {applied} applied, {} already up to date",
        steps.len() - applied
    );
    Ok(())
}

fn topic_specs(settings: &Settings) -> anyhow::Result<Vec<topics::TopicSpec>> {
    Ok(topics::for_deployment(&settings.kafka)?)
}

pub async fn topics_apply(settings: &Settings) -> anyhow::Result<ExitCode> {
    let specs = topic_specs(settings)?;
    let (changes, drift) = topics::apply(&settings.kafka, &specs)
        .await
        .with_context(|| format!("applying topics to {}", settings.kafka.brokers))?;
    for change in &changes {
        println!("changed: {change}");
    }
    for d in &drift {
        println!("drift (not fixed): {d}");
    }
    println!(
        "topics apply: {} topics declared, {} changes made, {} drift",
        specs.len(),
        changes.len(),
        drift.len()
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn topics_describe(settings: &Settings) -> anyhow::Result<ExitCode> {
    let specs = topic_specs(settings)?;
    let actual = topics::describe_cluster(&settings.kafka, &specs).await?;
    let (changes, drift) = topics::plan(&specs, &actual);
    for spec in &specs {
        let state = match actual.get(&spec.name) {
            None => "missing".to_string(),
            Some(a) => format!(
                "partitions={} replication_factor={}",
                a.partitions, a.replication_factor
            ),
        };
        println!("{:<32} {state}", spec.name);
    }
    for change in &changes {
        println!("would change: {change}");
    }
    for d in &drift {
        println!("drift: {d}");
    }
    let in_sync = changes.is_empty() && drift.is_empty();
    println!(
        "topics describe: {}",
        if in_sync {
            "cluster matches topics.yaml"
        } else {
            "cluster differs from topics.yaml"
        }
    );
    Ok(if in_sync {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `register_event`, tried again (after 1, 2 and 4 s) when the registry did not answer: a
/// registry that has just started answered one of the first requests after the 5 s timeout
/// here. Registering is idempotent: a retried subject whose earlier attempt did land is
/// found unchanged.
async fn register_retrying(
    client: &RegistryClient,
    event: &EventSchema,
) -> Result<(RegisterOutcome, bool), RegistryError> {
    // Whole seconds, no jitter: the message says when the next try comes.
    RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(4))
        .times(3)
        .without_jitter()
        .run(
            || client.register_event(event),
            |e| matches!(e, RegistryError::Unreachable { .. }),
            |e, after| {
                eprintln!(
                    "stocksvr: registering {}: {e}; trying again in {} s",
                    event.subject(),
                    after.as_secs()
                )
            },
        )
        .await
}

pub async fn schemas_register(settings: &Settings) -> anyhow::Result<ExitCode> {
    let catalog = Catalog::for_deployment(&settings.kafka)?;
    let client = RegistryClient::new(&settings.registry)?;
    let mut registered = 0;
    for event in catalog.events() {
        let (outcome, level_changed) = register_retrying(&client, event)
            .await
            .with_context(|| format!("registering {}", event.subject()))?;
        let what = match outcome {
            RegisterOutcome::Registered { id } => {
                registered += 1;
                format!("registered (id {id})")
            }
            RegisterOutcome::Unchanged { id } => format!("unchanged (id {id})"),
        };
        let level = if level_changed {
            ", compatibility set to BACKWARD"
        } else {
            ""
        };
        println!("{}: {what}{level}", event.subject());
    }
    println!(
        "schemas register: {} subjects, {registered} new versions",
        catalog.events().len()
    );
    Ok(ExitCode::SUCCESS)
}

pub async fn schemas_check(settings: &Settings) -> anyhow::Result<ExitCode> {
    let catalog = Catalog::for_deployment(&settings.kafka)?;
    let client = RegistryClient::new(&settings.registry)?;
    let mut incompatible = 0;
    for event in catalog.events() {
        let state = client.check(&event.subject(), event.raw).await?;
        let line = match &state {
            SubjectState::New => "new subject (would register version 1)".to_string(),
            SubjectState::Unchanged { id, version } => {
                format!("unchanged (id {id}, version {version})")
            }
            SubjectState::Compatible { latest_version } => {
                format!("compatible change (would register after version {latest_version})")
            }
            SubjectState::Incompatible { messages } => {
                incompatible += 1;
                format!(
                    "INCOMPATIBLE with the registered version: {}",
                    messages.join("; ")
                )
            }
        };
        println!("{}: {line}", event.subject());
    }
    println!(
        "schemas check: {} subjects, {incompatible} incompatible",
        catalog.events().len()
    );
    Ok(if incompatible == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Record name of an example file: `OrderCreated.scheduled.json` holds an OrderCreated.
fn example_record(file: &Path) -> anyhow::Result<String> {
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .context("example path has no file name")?;
    Ok(name.split('.').next().unwrap_or(name).to_string())
}

pub async fn produce_example(
    settings: &Settings,
    file: &Path,
    event: Option<&str>,
) -> anyhow::Result<()> {
    let catalog = Arc::new(Catalog::for_deployment(&settings.kafka)?);
    let record = match event {
        Some(name) => name.to_string(),
        None => example_record(file)?,
    };
    let Some(event) = catalog
        .events()
        .iter()
        .find(|e| e.file == format!("{record}.avsc"))
    else {
        bail!("no schema {record}.avsc in the catalog");
    };
    let event = event.clone();
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(file)?
    };
    let payload: serde_json::Value = serde_json::from_str(&text)?;
    let value = json::json_to_avro(&payload, &event.parsed)?;
    let key = payload["data"][&event.key]
        .to_string()
        .trim_matches('"')
        .to_string();
    let codec = AvroCodec::new(&settings.registry, catalog)?;
    let bytes = codec.encode_value(&event.full_name, value).await?;
    let producer = kafka::producer(&settings.kafka, "produce")?;
    let delivery = producer
        .send(
            FutureRecord::to(&event.topic).key(&key).payload(&bytes),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)?;
    println!(
        "produced {} to {} partition {} offset {} (key {key}, {} bytes)",
        event.full_name,
        event.topic,
        delivery.partition,
        delivery.offset,
        bytes.len()
    );
    Ok(())
}
