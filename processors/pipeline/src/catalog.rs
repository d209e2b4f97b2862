//! The event catalog: which record goes to which topic, under which registry subject.
//!
//! Subject naming follows Confluent's TopicRecordNameStrategy (`<topic>-<record full name>`)
//! because one topic carries several event types; see `schemas/README.md`.

use crate::json::JsonAvroWriter;
use apache_avro::Schema;
use serde::Deserialize;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/schemas.rs"));
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("schemas/catalog.yaml: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("schemas/{file}: {reason}")]
    Schema { file: String, reason: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Consumed by stocksvr (produced by the order service or our own time wheel).
    In,
    /// Produced by stocksvr.
    Out,
}

#[derive(Debug, Deserialize)]
struct CatalogFile {
    events: Vec<CatalogEntry>,
}

#[derive(Debug, Deserialize)]
struct CatalogEntry {
    name: String,
    topic: String,
    file: String,
    key: String,
    direction: Direction,
}

/// One event type with its parsed schema.
#[derive(Debug, Clone)]
pub struct EventSchema {
    pub full_name: String,
    pub topic: String,
    pub file: String,
    pub key: String,
    pub direction: Direction,
    pub raw: &'static str,
    pub parsed: Schema,
    /// `parsed` prepared for writing plain JSON straight to Avro (the relay's rows).
    pub writer: JsonAvroWriter,
}

impl EventSchema {
    pub fn subject(&self) -> String {
        subject_for(&self.topic, &self.full_name)
    }
}

/// TopicRecordNameStrategy.
pub fn subject_for(topic: &str, full_name: &str) -> String {
    format!("{topic}-{full_name}")
}

#[derive(Debug, Clone)]
pub struct Catalog {
    events: Vec<EventSchema>,
}

impl Catalog {
    /// The catalog compiled into this binary.
    pub fn embedded() -> Result<Self, CatalogError> {
        Self::from_parts(embedded::CATALOG_YAML, embedded::SCHEMA_FILES)
    }

    fn from_parts(
        catalog_yaml: &str,
        files: &'static [(&'static str, &'static str)],
    ) -> Result<Self, CatalogError> {
        let file: CatalogFile = serde_yaml::from_str(catalog_yaml)?;
        let mut events = Vec::with_capacity(file.events.len());
        for entry in file.events {
            let schema_err = |reason: String| CatalogError::Schema {
                file: entry.file.clone(),
                reason,
            };
            let raw = files
                .iter()
                .find(|(name, _)| *name == entry.file)
                .map(|(_, text)| *text)
                .ok_or_else(|| schema_err("listed in catalog.yaml but not found".into()))?;
            let parsed = Schema::parse_str(raw).map_err(|e| schema_err(e.to_string()))?;
            let name = match &parsed {
                Schema::Record(record) => record.name.fullname(None),
                _ => return Err(schema_err("top level must be a record".into())),
            };
            if name != entry.name {
                return Err(schema_err(format!(
                    "record is {name} but catalog.yaml says {}",
                    entry.name
                )));
            }
            events.push(EventSchema {
                full_name: entry.name,
                topic: entry.topic,
                file: entry.file,
                key: entry.key,
                direction: entry.direction,
                raw,
                writer: JsonAvroWriter::new(&parsed),
                parsed,
            });
        }
        Ok(Self { events })
    }

    /// The embedded catalog with every topic inside `kafka.topic_namespace`: what this
    /// deployment produces and consumes, and the subjects it registers.
    pub fn for_deployment(kafka: &crate::config::KafkaSettings) -> Result<Self, CatalogError> {
        let ns = kafka.namespace();
        let mut catalog = Self::embedded()?;
        for event in &mut catalog.events {
            event.topic = ns.topic(&event.topic);
        }
        Ok(catalog)
    }

    pub fn events(&self) -> &[EventSchema] {
        &self.events
    }

    pub fn by_name(&self, full_name: &str) -> Option<&EventSchema> {
        self.events.iter().find(|e| e.full_name == full_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_is_in_the_catalog_and_parses() {
        let catalog = Catalog::embedded().expect("embedded catalog is valid");
        for (file, _) in embedded::SCHEMA_FILES {
            assert!(
                catalog.events().iter().any(|e| e.file == *file),
                "{file} is not listed in schemas/catalog.yaml"
            );
        }
        assert_eq!(catalog.events().len(), embedded::SCHEMA_FILES.len());
    }

    #[test]
    fn subjects_follow_topic_record_name_strategy() {
        let catalog = Catalog::embedded().expect("valid");
        let created = catalog
            .by_name("io.stocksvr.order.OrderCreated")
            .expect("OrderCreated is declared");
        assert_eq!(
            created.subject(),
            "order.lifecycle.v1-io.stocksvr.order.OrderCreated"
        );
        assert_eq!(created.direction, Direction::In);
    }

    #[test]
    fn a_catalog_naming_the_wrong_record_is_rejected() {
        static FILES: &[(&str, &str)] = &[(
            "A.avsc",
            r#"{"type":"record","name":"A","namespace":"x","fields":[]}"#,
        )];
        let yaml = "events:\n  - {name: x.B, topic: t, file: A.avsc, key: k, direction: in}\n";
        let err = Catalog::from_parts(yaml, FILES).expect_err("mismatch");
        assert!(err.to_string().contains("record is x.A"), "{err}");
    }
}
