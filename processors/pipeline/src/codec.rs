//! Avro in the Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then
//! the Avro binary body written with that schema.
//!
//! Decoding looks the writer schema up by id in the registry (cached by
//! schema_registry_converter) and never panics on input: every way a record can be bad
//! has its own [`DecodeError`] variant, and [`DecodeError::is_retryable`] separates a
//! registry outage (retry) from a bad record (dead-letter).

use crate::catalog::{subject_for, Catalog, EventSchema};
use crate::config::RegistrySettings;
use crate::json::{JsonAvroError, TextError};
use apache_avro::types::Value;
use schema_registry_converter::async_impl::avro::{AvroDecoder, AvroEncoder};
use schema_registry_converter::async_impl::schema_registry::SrSettings;
use schema_registry_converter::error::SRCError;
use schema_registry_converter::schema_registry_common::{
    SchemaType, SubjectNameStrategy, SuppliedSchema,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashMap;
use std::io::Cursor;
use std::sync::{Arc, RwLock};
use std::time::Duration;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;

/// Magic byte of the Confluent wire format.
pub const MAGIC_BYTE: u8 = 0;
const HEADER_LEN: usize = 5;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("record has no value")]
    Empty,
    #[error("wrong magic byte {0:#04x}: not Confluent wire format (expected 0x00)")]
    WrongMagicByte(u8),
    #[error("record of {0} bytes is shorter than the 5-byte wire-format header")]
    TruncatedHeader(usize),
    #[error("schema id {id} is unknown to the registry: {reason}")]
    UnknownSchemaId { id: u32, reason: String },
    #[error("schema registry unavailable while resolving schema id {id}: {reason}")]
    RegistryUnavailable { id: u32, reason: String },
    #[error("body ends early for schema id {id} ({record}): {reason}")]
    TruncatedBody {
        id: u32,
        record: String,
        reason: String,
    },
    #[error("body does not match schema id {id} ({record}): {reason}")]
    MalformedBody {
        id: u32,
        record: String,
        reason: String,
    },
    #[error("schema mismatch: expected {expected}, record was written as {found}: {reason}")]
    SchemaMismatch {
        expected: String,
        found: String,
        reason: String,
    },
}

impl DecodeError {
    /// Only a registry outage can succeed on retry; every other variant is a property of
    /// the bytes and goes to the dead-letter topic at once.
    pub fn is_retryable(&self) -> bool {
        matches!(self, DecodeError::RegistryUnavailable { .. })
    }

    /// Short stable label for metrics and dead-letter headers.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Empty => "empty",
            DecodeError::WrongMagicByte(_) => "wrong_magic_byte",
            DecodeError::TruncatedHeader(_) => "truncated_header",
            DecodeError::UnknownSchemaId { .. } => "unknown_schema_id",
            DecodeError::RegistryUnavailable { .. } => "registry_unavailable",
            DecodeError::TruncatedBody { .. } => "truncated_body",
            DecodeError::MalformedBody { .. } => "malformed_body",
            DecodeError::SchemaMismatch { .. } => "schema_mismatch",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("{0} is not in the event catalog")]
    UnknownEvent(String),
    #[error("cannot encode {event}: {reason}")]
    Encode { event: String, reason: String },
    #[error("payload is not readable JSON: {0}")]
    Unreadable(String),
    #[error("payload does not fit {event}: {source}")]
    Misfit {
        event: String,
        source: JsonAvroError,
    },
}

/// A decoded record: its writer schema id, record full name and generic value.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    pub schema_id: u32,
    pub full_name: String,
    pub value: Value,
}

impl Decoded {
    /// Converts into a typed event, checking that the record is the one expected.
    pub fn into_typed<T: DeserializeOwned>(self, expected: &str) -> Result<T, DecodeError> {
        if self.full_name != expected {
            return Err(DecodeError::SchemaMismatch {
                expected: expected.to_string(),
                found: self.full_name,
                reason: "different record".into(),
            });
        }
        apache_avro::from_value::<T>(&self.value).map_err(|e| DecodeError::SchemaMismatch {
            expected: expected.to_string(),
            found: self.full_name.clone(),
            reason: e.to_string(),
        })
    }
}

/// Splits the wire-format header off. Pure, so every malformed shape is unit-tested.
pub fn split_header(bytes: Option<&[u8]>) -> Result<(u32, &[u8]), DecodeError> {
    let bytes = match bytes {
        None => return Err(DecodeError::Empty),
        Some([]) => return Err(DecodeError::Empty),
        Some(b) => b,
    };
    if bytes[0] != MAGIC_BYTE {
        return Err(DecodeError::WrongMagicByte(bytes[0]));
    }
    if bytes.len() < HEADER_LEN {
        return Err(DecodeError::TruncatedHeader(bytes.len()));
    }
    let id = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    Ok((id, &bytes[HEADER_LEN..]))
}

/// Reads one Avro datum and insists the body is consumed exactly.
pub fn decode_body(
    id: u32,
    schema: &apache_avro::Schema,
    body: &[u8],
) -> Result<Value, DecodeError> {
    let record = match schema {
        apache_avro::Schema::Record(r) => r.name.fullname(None),
        other => format!("{other:?}"),
    };
    let mut cursor = Cursor::new(body);
    let read = apache_avro::reader::datum::GenericDatumReader::builder(schema)
        .build()
        .and_then(|reader| reader.read_value(&mut cursor));
    match read {
        // apache-avro can return a record with a Null in a non-null field when the input
        // ends at a field boundary, so a cut body is caught by validating the value.
        Ok(value) if !value.validate(schema) => Err(DecodeError::TruncatedBody {
            id,
            record,
            reason: "input ended before the record was complete".into(),
        }),
        Ok(value) if cursor.position() as usize == body.len() => Ok(value),
        Ok(_) => Err(DecodeError::MalformedBody {
            id,
            record,
            reason: format!(
                "{} trailing bytes after the record",
                body.len() - cursor.position() as usize
            ),
        }),
        Err(e) => {
            let reason = e.to_string();
            // Running out of input is the signature of a cut-off body; anything else
            // (bad union index, invalid length, bad UTF-8) is a body of another shape.
            let eof = cursor.position() as usize >= body.len()
                || reason.contains("failed to fill whole buffer")
                || reason.to_lowercase().contains("eof");
            if eof {
                Err(DecodeError::TruncatedBody { id, record, reason })
            } else {
                Err(DecodeError::MalformedBody { id, record, reason })
            }
        }
    }
}

/// The body of a record whose header named schema `id`, read with that writer schema: the
/// whole of decoding once the schema is known, shared by [`AvroCodec::decode`] and the
/// registry-free decoder of the fuzz tests, so both run exactly this code.
pub fn decode_framed_body(
    id: u32,
    schema: &apache_avro::Schema,
    body: &[u8],
) -> Result<Decoded, DecodeError> {
    let value = decode_body(id, schema, body)?;
    let full_name = match schema {
        apache_avro::Schema::Record(r) => r.name.fullname(None),
        _ => String::new(),
    };
    Ok(Decoded {
        schema_id: id,
        full_name,
        value,
    })
}

/// Encoder and decoder bound to one registry.
#[derive(Clone)]
pub struct AvroCodec {
    decoder: Arc<AvroDecoder>,
    encoder: Arc<AvroEncoder>,
    catalog: Arc<Catalog>,
    /// Schema id by topic and record name, for [`AvroCodec::encode_json_on`].
    ids: Arc<RwLock<HashMap<String, HashMap<String, u32>>>>,
}

impl AvroCodec {
    pub fn new(settings: &RegistrySettings, catalog: Arc<Catalog>) -> Result<Self, SRCError> {
        let sr = sr_settings(settings)?;
        Ok(Self {
            decoder: Arc::new(AvroDecoder::new(sr.clone())),
            encoder: Arc::new(AvroEncoder::new(sr)),
            catalog,
            ids: Arc::default(),
        })
    }

    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Decodes any Confluent-framed Avro record whose schema the registry knows.
    pub async fn decode(&self, bytes: Option<&[u8]>) -> Result<Decoded, DecodeError> {
        let (id, body) = split_header(bytes)?;
        let schema = self.decoder.get_schema(id).await.map_err(|e| {
            let reason = e.to_string();
            if e.retriable {
                // The cache keeps non-retriable errors only; a retriable one is re-asked.
                DecodeError::RegistryUnavailable { id, reason }
            } else if registry_refused(&e) {
                // The registry refused this process (credentials, a proxy's 5xx), not the
                // id: forget the cached refusal so the next attempt asks again, and wait.
                self.decoder.remove_errors_from_cache();
                DecodeError::RegistryUnavailable { id, reason }
            } else {
                DecodeError::UnknownSchemaId { id, reason }
            }
        })?;
        decode_framed_body(id, &schema.parsed, body)
    }

    /// Decodes and converts to `T`, which must be the record named `expected`.
    pub async fn decode_as<T: DeserializeOwned>(
        &self,
        bytes: Option<&[u8]>,
        expected: &str,
    ) -> Result<T, DecodeError> {
        self.decode(bytes).await?.into_typed(expected)
    }

    /// Encodes `event` with the catalog schema of `full_name` on that event's topic. The
    /// schema is registered on first use if the subject does not have it (as a Confluent
    /// serializer with auto-registration would), so encoding never needs a manual step.
    pub async fn encode<T: Serialize>(
        &self,
        full_name: &str,
        event: &T,
    ) -> Result<Vec<u8>, EncodeError> {
        let entry = self
            .catalog
            .by_name(full_name)
            .ok_or_else(|| EncodeError::UnknownEvent(full_name.to_string()))?;
        self.encode_on(&entry.topic, full_name, entry.raw, event)
            .await
    }

    /// Encodes a generic value already shaped by the catalog schema of `full_name`.
    pub async fn encode_value(
        &self,
        full_name: &str,
        value: Value,
    ) -> Result<Vec<u8>, EncodeError> {
        let entry = self
            .catalog
            .by_name(full_name)
            .ok_or_else(|| EncodeError::UnknownEvent(full_name.to_string()))?;
        self.encode_value_on(&entry.topic, full_name, entry.raw, value)
            .await
    }

    /// As [`AvroCodec::encode_value`] with an explicit topic and schema text.
    pub async fn encode_value_on(
        &self,
        topic: &str,
        full_name: &str,
        schema_text: &str,
        value: Value,
    ) -> Result<Vec<u8>, EncodeError> {
        self.encoder
            .encode_value(value, &strategy(topic, full_name, schema_text))
            .await
            .map_err(|e| EncodeError::Encode {
                event: full_name.to_string(),
                reason: e.to_string(),
            })
    }

    /// Plain JSON text (an outbox row's payload) framed as a record of `event` on `topic`:
    /// the bytes [`AvroCodec::encode_value_on`] gives for `json_to_avro(json)`, written
    /// without the intermediate values (see [`crate::json::JsonAvroWriter::write_text`]). A
    /// payload that does not fit is refused before the registry is asked, as the generic
    /// path does.
    pub async fn encode_json_on(
        &self,
        topic: &str,
        event: &EventSchema,
        text: &str,
    ) -> Result<Vec<u8>, EncodeError> {
        let mut framed = Vec::with_capacity(HEADER_LEN + text.len() / 2);
        framed.extend_from_slice(&[MAGIC_BYTE, 0, 0, 0, 0]);
        event
            .writer
            .write_text(text, &mut framed)
            .map_err(|e| match e {
                TextError::Unreadable(e) => EncodeError::Unreadable(e.to_string()),
                TextError::Misfit(source) => EncodeError::Misfit {
                    event: event.full_name.clone(),
                    source,
                },
            })?;
        let id = self
            .schema_id_on(topic, &event.full_name, event.raw)
            .await?;
        framed[1..HEADER_LEN].copy_from_slice(&id.to_be_bytes());
        Ok(framed)
    }

    /// The registry id of `full_name` under `topic`'s subject, registered on first use as
    /// the generic encoder does. Kept per process after the first answer: a subject's id for
    /// one schema text never changes, and the generic encoder's own cache would cost a
    /// subject string and a copy of the schema text per record to look up.
    async fn schema_id_on(
        &self,
        topic: &str,
        full_name: &str,
        schema_text: &str,
    ) -> Result<u32, EncodeError> {
        let known = self
            .ids
            .read()
            .ok()
            .and_then(|ids| ids.get(topic)?.get(full_name).copied());
        if let Some(id) = known {
            return Ok(id);
        }
        let schema = self
            .encoder
            .get_schema_and_id(
                &subject_for(topic, full_name),
                strategy(topic, full_name, schema_text),
            )
            .await
            .map_err(|e| EncodeError::Encode {
                event: full_name.to_string(),
                reason: e.to_string(),
            })?;
        if let Ok(mut ids) = self.ids.write() {
            ids.entry(topic.to_string())
                .or_default()
                .insert(full_name.to_string(), schema.id);
        }
        Ok(schema.id)
    }

    /// As [`AvroCodec::encode`] with an explicit topic and schema text (tests use random topics).
    pub async fn encode_on<T: Serialize>(
        &self,
        topic: &str,
        full_name: &str,
        schema_text: &str,
        event: &T,
    ) -> Result<Vec<u8>, EncodeError> {
        self.encoder
            .encode_struct(event, &strategy(topic, full_name, schema_text))
            .await
            .map_err(|e| EncodeError::Encode {
                event: full_name.to_string(),
                reason: e.to_string(),
            })
    }
}

/// TopicRecordNameStrategy with the schema supplied, so the subject gets it registered on
/// first use.
fn strategy(topic: &str, full_name: &str, schema_text: &str) -> SubjectNameStrategy {
    let strategy = SubjectNameStrategy::TopicRecordNameStrategyWithSchema(
        topic.to_string(),
        SuppliedSchema::new(
            Some(full_name.to_string()),
            SchemaType::Avro,
            schema_text.to_string(),
        ),
    );
    debug_assert_eq!(
        strategy.get_subject().ok(),
        Some(subject_for(topic, full_name))
    );
    strategy
}

fn sr_settings(settings: &RegistrySettings) -> Result<SrSettings, SRCError> {
    let mut builder = SrSettings::new_builder(settings.url.clone());
    builder.set_timeout(Duration::from_millis(settings.timeout_ms));
    if let Some(token) = &settings.token {
        builder.set_token_authorization(token.expose());
    } else if let Some(user) = &settings.username {
        builder.set_basic_authorization(user, settings.password.as_ref().map(|p| p.expose()));
    }
    let http = crate::tls::registry_http(settings)
        .map_err(|e| SRCError::new(&e.to_string(), None, false))?;
    builder.build_with(http)
}

/// True when schema_registry_converter's non-retriable error is the registry refusing the
/// request rather than not knowing the schema: 401 and 403 (credentials, a role), 408 and
/// 429 (a proxy or a limit), and any 5xx the crate does not already call retriable. The
/// crate says the status only in its message (`... failed with status 401 Unauthorized`).
fn registry_refused(e: &SRCError) -> bool {
    let Some((_, rest)) = e.error.split_once("failed with status ") else {
        return false;
    };
    let code: String = rest.chars().take_while(char::is_ascii_digit).collect();
    matches!(code.parse::<u16>(), Ok(401 | 403 | 408 | 429 | 500..=599))
}

#[cfg(test)]
mod tests {
    use super::*;
    use apache_avro::Schema;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"T","namespace":"t","fields":[
                {"name":"id","type":"long"},{"name":"s","type":"string"}]}"#,
        )
        .expect("valid")
    }

    #[allow(deprecated)] // the writer builder is more ceremony than a test fixture needs
    fn body() -> Vec<u8> {
        let value = Value::Record(vec![
            ("id".into(), Value::Long(42)),
            ("s".into(), Value::String("hello".into())),
        ]);
        apache_avro::to_avro_datum(&schema(), value).expect("encodes")
    }

    #[test]
    fn a_refused_request_is_told_from_an_unknown_schema() {
        let refused = |m: &str| registry_refused(&SRCError::new(m, None, false));
        assert!(refused(
            "HTTP request to schema registry failed with status 401 Unauthorized"
        ));
        assert!(refused(
            "HTTP request to schema registry failed with status 403 Forbidden"
        ));
        assert!(refused(
            "HTTP request to schema registry failed with status 500 Internal Server Error"
        ));
        assert!(!refused(
            "HTTP request to schema registry failed with status 404 Not Found"
        ));
        assert!(!refused("could not parse to RawRegisteredSchema"));
    }

    #[test]
    fn header_errors_are_typed() {
        assert_eq!(split_header(None), Err(DecodeError::Empty));
        assert_eq!(split_header(Some(&[])), Err(DecodeError::Empty));
        assert_eq!(
            split_header(Some(&[7, 0, 0, 0, 1])),
            Err(DecodeError::WrongMagicByte(7))
        );
        assert_eq!(
            split_header(Some(&[0, 0, 1])),
            Err(DecodeError::TruncatedHeader(3))
        );
        assert_eq!(
            split_header(Some(&[0, 0, 0, 1, 2, 9])),
            Ok((258, &[9u8][..]))
        );
    }

    #[test]
    fn a_whole_body_decodes() {
        let value = decode_body(1, &schema(), &body()).expect("decodes");
        assert!(matches!(value, Value::Record(ref f) if f.len() == 2));
    }

    #[test]
    fn every_cut_of_a_body_is_truncated_not_a_panic() {
        let full = body();
        for cut in 0..full.len() {
            let err = decode_body(1, &schema(), &full[..cut]).expect_err("cut body fails");
            assert!(
                matches!(
                    err,
                    DecodeError::TruncatedBody { .. } | DecodeError::MalformedBody { .. }
                ),
                "cut at {cut}: {err:?}"
            );
        }
        let err = decode_body(1, &schema(), &full[..full.len() - 2]).expect_err("cut");
        assert_eq!(err.kind(), "truncated_body");
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let mut long = body();
        long.extend_from_slice(&[1, 2, 3]);
        let err = decode_body(1, &schema(), &long).expect_err("trailing");
        assert_eq!(err.kind(), "malformed_body");
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic generator: the point is coverage of odd shapes, not randomness.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for len in 0..200usize {
            let bytes: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = decode_body(1, &schema(), &bytes);
        }
    }

    #[test]
    fn typed_conversion_checks_the_record_name() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            id: i64,
            s: String,
        }
        let decoded = Decoded {
            schema_id: 1,
            full_name: "t.T".into(),
            value: decode_body(1, &schema(), &body()).expect("decodes"),
        };
        let err = decoded
            .clone()
            .into_typed::<T>("t.Other")
            .expect_err("wrong record");
        assert_eq!(err.kind(), "schema_mismatch");
        assert_eq!(decoded.into_typed::<T>("t.T").expect("right record").id, 42);
    }
}
