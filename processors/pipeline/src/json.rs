//! Plain JSON (the form of `schemas/examples`, and what a Python dict looks like) to Avro
//! values and back, driven by the schema. Used by `stocksvr produce`, the dead-letter tools
//! and the tests that run every example through the codec.

mod node;
mod writer;

pub use node::JsonNode;
// The fuzz strategies write Avro longs of their own.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use writer::put_long;
pub use writer::{JsonAvroWriter, TextError};

use apache_avro::schema::{Name, Schema, UnionSchema};
use apache_avro::types::Value;
use serde_json::Value as Json;
use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{path}: {reason}")]
pub struct JsonAvroError {
    pub path: String,
    pub reason: String,
}

fn err(path: &str, reason: impl Into<String>) -> JsonAvroError {
    JsonAvroError {
        path: if path.is_empty() {
            "$".into()
        } else {
            path.to_string()
        },
        reason: reason.into(),
    }
}

/// Converts `json` to an Avro value of `schema`, naming the offending field on failure.
pub fn json_to_avro(json: &Json, schema: &Schema) -> Result<Value, JsonAvroError> {
    let mut names = HashMap::new();
    collect_names(schema, &mut names);
    convert(json, schema, &names, "")
}

fn collect_names<'a>(schema: &'a Schema, names: &mut HashMap<Name, &'a Schema>) {
    match schema {
        Schema::Record(r) => {
            names.insert(r.name.clone(), schema);
            for f in &r.fields {
                collect_names(&f.schema, names);
            }
        }
        Schema::Enum(e) => {
            names.insert(e.name.clone(), schema);
        }
        Schema::Fixed(f) => {
            names.insert(f.name.clone(), schema);
        }
        Schema::Array(a) => collect_names(&a.items, names),
        Schema::Map(m) => collect_names(&m.types, names),
        Schema::Union(u) => u.variants().iter().for_each(|v| collect_names(v, names)),
        _ => {}
    }
}

fn convert(
    json: &Json,
    schema: &Schema,
    names: &HashMap<Name, &Schema>,
    path: &str,
) -> Result<Value, JsonAvroError> {
    let expect = |what: &str| err(path, format!("expected {what}, found {json}"));
    Ok(match schema {
        Schema::Null => match json {
            Json::Null => Value::Null,
            _ => return Err(expect("null")),
        },
        Schema::Boolean => Value::Boolean(json.as_bool().ok_or_else(|| expect("a boolean"))?),
        Schema::Int => {
            let n = json.as_i64().ok_or_else(|| expect("an integer"))?;
            Value::Int(i32::try_from(n).map_err(|_| err(path, format!("{n} does not fit in int")))?)
        }
        Schema::Long => Value::Long(json.as_i64().ok_or_else(|| expect("an integer"))?),
        Schema::Float => Value::Float(json.as_f64().ok_or_else(|| expect("a number"))? as f32),
        Schema::Double => Value::Double(json.as_f64().ok_or_else(|| expect("a number"))?),
        Schema::String => {
            Value::String(json.as_str().ok_or_else(|| expect("a string"))?.to_string())
        }
        Schema::Bytes => Value::Bytes(
            json.as_str()
                .ok_or_else(|| expect("a string"))?
                .as_bytes()
                .to_vec(),
        ),
        Schema::Enum(e) => {
            let symbol = json.as_str().ok_or_else(|| expect("an enum symbol"))?;
            let index = e
                .symbols
                .iter()
                .position(|s| s == symbol)
                .ok_or_else(|| err(path, format!("{symbol} is not one of {:?}", e.symbols)))?;
            Value::Enum(index as u32, symbol.to_string())
        }
        Schema::Array(a) => {
            let items = json.as_array().ok_or_else(|| expect("an array"))?;
            Value::Array(
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| convert(item, &a.items, names, &format!("{path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
        Schema::Map(m) => {
            let obj = json.as_object().ok_or_else(|| expect("an object"))?;
            Value::Map(
                obj.iter()
                    .map(|(k, v)| {
                        Ok((
                            k.clone(),
                            convert(v, &m.types, names, &format!("{path}.{k}"))?,
                        ))
                    })
                    .collect::<Result<_, JsonAvroError>>()?,
            )
        }
        Schema::Union(u) => convert_union(json, u, names, path)?,
        Schema::Record(r) => {
            let obj = json.as_object().ok_or_else(|| expect("an object"))?;
            if let Some(unknown) = obj.keys().find(|k| !r.fields.iter().any(|f| &f.name == *k)) {
                return Err(err(&format!("{path}.{unknown}"), "field not in the schema"));
            }
            let mut fields = Vec::with_capacity(r.fields.len());
            for field in &r.fields {
                let field_path = format!("{path}.{}", field.name);
                let value = match obj.get(&field.name) {
                    Some(v) => convert(v, &field.schema, names, &field_path)?,
                    None => match &field.default {
                        Some(default) => convert(default, &field.schema, names, &field_path)?,
                        None => return Err(err(&field_path, "missing required field")),
                    },
                };
                fields.push((field.name.clone(), value));
            }
            Value::Record(fields)
        }
        Schema::Ref { name } => {
            let target = names
                .get(name)
                .ok_or_else(|| err(path, format!("unresolved type {}", name.fullname(None))))?;
            convert(json, target, names, path)?
        }
        other => return Err(err(path, format!("unsupported schema type {other:?}"))),
    })
}

/// Plain JSON has no union tags: null picks the null branch, anything else the first
/// non-null branch it converts into.
fn convert_union(
    json: &Json,
    union: &UnionSchema,
    names: &HashMap<Name, &Schema>,
    path: &str,
) -> Result<Value, JsonAvroError> {
    let mut last = None;
    for (i, branch) in union.variants().iter().enumerate() {
        if json.is_null() != matches!(branch, Schema::Null) {
            continue;
        }
        match convert(json, branch, names, path) {
            Ok(v) => return Ok(Value::Union(i as u32, Box::new(v))),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| err(path, format!("{json} matches no branch of the union"))))
}

/// Avro value back to plain JSON (union tags dropped), for logs and operator tools.
pub fn avro_to_json(value: &Value) -> Json {
    match value {
        Value::Null => Json::Null,
        Value::Boolean(b) => Json::Bool(*b),
        Value::Int(n) => Json::from(*n),
        Value::Long(n) => Json::from(*n),
        Value::Float(f) => Json::from(*f as f64),
        Value::Double(f) => Json::from(*f),
        Value::String(s) | Value::Enum(_, s) => Json::String(s.clone()),
        Value::Bytes(b) | Value::Fixed(_, b) => {
            Json::String(String::from_utf8_lossy(b).into_owned())
        }
        Value::Union(_, inner) => avro_to_json(inner),
        Value::Array(items) => Json::Array(items.iter().map(avro_to_json).collect()),
        Value::Map(m) => Json::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), avro_to_json(v)))
                .collect(),
        ),
        Value::Record(fields) => Json::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), avro_to_json(v)))
                .collect(),
        ),
        other => Json::String(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests;
