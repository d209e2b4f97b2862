//! The fast path of JSON to Avro: plain JSON written straight into the binary encoding of
//! one schema, with [`json_to_avro`] behind it for every JSON that does not fit.

use super::node::{JsonNode, JsonView, Misfit};
use super::{collect_names, err, json_to_avro, JsonAvroError};
use apache_avro::schema::{Name, Schema};
use apache_avro::types::Value;
use serde_json::Value as Json;
use std::collections::HashMap;

/// Writes plain JSON straight into the Avro binary encoding of one schema: what
/// `to_avro_datum(schema, json_to_avro(json, schema)?)` gives, without building the Avro
/// value, looking the named types up again or formatting a field path per field. The relay
/// encodes every outbox row this way: per row, [`json_to_avro`] and the generic encoder
/// cost about a third of the relay's CPU (hashing the named types anew, a path string per
/// field, the value tree, its validation), and the outbox rows are the one place where
/// every event of the service is converted.
///
/// Only the happy path is fast. A row that does not fit is converted again by
/// [`json_to_avro`] for its error, so the error names the same field in the same words.
#[derive(Debug, Clone)]
pub struct JsonAvroWriter {
    schema: Schema,
    names: HashMap<Name, Schema>,
}

impl JsonAvroWriter {
    pub fn new(schema: &Schema) -> Self {
        let mut names = HashMap::new();
        collect_names(schema, &mut names);
        Self {
            names: names.into_iter().map(|(n, s)| (n, s.clone())).collect(),
            schema: schema.clone(),
        }
    }

    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// Appends the Avro body of `json` to `out`. On an error `out` is as it was.
    pub fn write(&self, json: &Json, out: &mut Vec<u8>) -> Result<(), JsonAvroError> {
        let start = out.len();
        if self.put(json, &self.schema, out).is_ok() {
            return Ok(());
        }
        out.truncate(start);
        // The two walks accept the same JSON (the tests compare them on every example and
        // on mutations of each); were they ever to disagree, the generic path decides.
        let value = json_to_avro(json, &self.schema)?;
        let body =
            generic_body(&self.schema, value).map_err(|e| err("", format!("encoding: {e}")))?;
        out.extend_from_slice(&body);
        Ok(())
    }

    /// As [`JsonAvroWriter::write`] for JSON text (an outbox row's column), read into a
    /// borrowed tree ([`JsonNode`]) instead of a [`Json`] value: no map per object and no
    /// copy of a string without escapes. A text the tree does not take (a duplicate key, a
    /// misfit) is read into a [`Json`] value and goes the way of [`JsonAvroWriter::write`],
    /// so the outcome and the error are always that value's.
    pub fn write_text(&self, text: &str, out: &mut Vec<u8>) -> Result<(), TextError> {
        let start = out.len();
        if let Ok(node) = serde_json::from_str::<JsonNode<'_>>(text) {
            if self.put(&node, &self.schema, out).is_ok() {
                return Ok(());
            }
            out.truncate(start);
        }
        let json: Json = serde_json::from_str(text).map_err(TextError::Unreadable)?;
        self.write(&json, out).map_err(TextError::Misfit)
    }

    /// The same cases as [`convert`](super::convert), in the same order, writing instead of
    /// building.
    pub(super) fn put<J: JsonView>(
        &self,
        json: &J,
        schema: &Schema,
        out: &mut Vec<u8>,
    ) -> Result<(), Misfit> {
        match schema {
            Schema::Null => json.is_null().then_some(()).ok_or(Misfit)?,
            Schema::Boolean => out.push(u8::from(json.as_bool().ok_or(Misfit)?)),
            Schema::Int => {
                let n = json.as_i64().ok_or(Misfit)?;
                put_long(i64::from(i32::try_from(n).map_err(|_| Misfit)?), out);
            }
            Schema::Long => put_long(json.as_i64().ok_or(Misfit)?, out),
            Schema::Float => {
                out.extend_from_slice(&(json.as_f64().ok_or(Misfit)? as f32).to_le_bytes())
            }
            Schema::Double => out.extend_from_slice(&json.as_f64().ok_or(Misfit)?.to_le_bytes()),
            Schema::String | Schema::Bytes => {
                let s = json.as_str().ok_or(Misfit)?;
                put_long(s.len() as i64, out);
                out.extend_from_slice(s.as_bytes());
            }
            Schema::Enum(e) => {
                let symbol = json.as_str().ok_or(Misfit)?;
                let index = e.symbols.iter().position(|s| s == symbol).ok_or(Misfit)?;
                put_long(index as i64, out);
            }
            Schema::Array(a) => {
                let items = json.as_array().ok_or(Misfit)?;
                if !items.is_empty() {
                    put_long(items.len() as i64, out);
                    for item in items {
                        self.put(item, &a.items, out)?;
                    }
                }
                out.push(0);
            }
            Schema::Map(m) => {
                let len = json.object_len().ok_or(Misfit)?;
                if len > 0 {
                    put_long(len as i64, out);
                    json.each_entry(|k, v| {
                        put_long(k.len() as i64, out);
                        out.extend_from_slice(k.as_bytes());
                        self.put(v, &m.types, out)
                    })?;
                }
                out.push(0);
            }
            Schema::Union(u) => {
                for (i, branch) in u.variants().iter().enumerate() {
                    if json.is_null() != matches!(branch, Schema::Null) {
                        continue;
                    }
                    let mark = out.len();
                    put_long(i as i64, out);
                    if self.put(json, branch, out).is_ok() {
                        return Ok(());
                    }
                    out.truncate(mark);
                }
                return Err(Misfit);
            }
            Schema::Record(r) => {
                let len = json.object_len().ok_or(Misfit)?;
                let (mut found, mut hint) = (0, 0);
                for field in &r.fields {
                    match json.field(&field.name, &mut hint) {
                        Some(v) => {
                            found += 1;
                            self.put(v, &field.schema, out)?;
                        }
                        None => {
                            self.put(field.default.as_ref().ok_or(Misfit)?, &field.schema, out)?
                        }
                    }
                }
                // Each found key names a field once: any other key (or a key given twice)
                // is not what the schema reads.
                if found != len {
                    return Err(Misfit);
                }
            }
            Schema::Ref { name } => self.put(json, self.names.get(name).ok_or(Misfit)?, out)?,
            _ => return Err(Misfit),
        }
        Ok(())
    }
}

/// Why [`JsonAvroWriter::write_text`] wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("payload is not readable JSON: {0}")]
    Unreadable(serde_json::Error),
    #[error(transparent)]
    Misfit(JsonAvroError),
}

/// The Avro body of `value` as apache_avro writes it.
pub(super) fn generic_body(schema: &Schema, value: Value) -> Result<Vec<u8>, apache_avro::Error> {
    apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()?
        .write_value_to_vec(value)
}

/// Avro's long (and int, enum index, union index, length): zigzag, then a base-128 varint.
pub(crate) fn put_long(n: i64, out: &mut Vec<u8>) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}
