//! Plain JSON (the form of `schemas/examples`, and what a Python dict looks like) to Avro
//! values and back, driven by the schema. Used by `stocksvr produce`, the dead-letter tools
//! and the tests that run every example through the codec.

use apache_avro::schema::{Name, Schema, UnionSchema};
use apache_avro::types::Value;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use std::borrow::Cow;
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

/// The JSON does not fit; [`json_to_avro`] says where and why.
struct Misfit;

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

    /// The same cases as [`convert`], in the same order, writing instead of building.
    fn put<J: JsonView>(&self, json: &J, schema: &Schema, out: &mut Vec<u8>) -> Result<(), Misfit> {
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

/// What the writer reads of a JSON value: [`Json`] and the borrowed [`JsonNode`].
trait JsonView: Sized {
    fn is_null(&self) -> bool;
    fn as_bool(&self) -> Option<bool>;
    fn as_i64(&self) -> Option<i64>;
    fn as_f64(&self) -> Option<f64>;
    fn as_str(&self) -> Option<&str>;
    fn as_array(&self) -> Option<&[Self]>;
    /// Entries of an object (counting a repeated key each time); `None` for a non-object.
    fn object_len(&self) -> Option<usize>;
    /// The value of `key` in an object. `hint` is where the last lookup of this object
    /// ended: fields are looked up in schema order and written in much the same order.
    fn field(&self, key: &str, hint: &mut usize) -> Option<&Self>;
    fn each_entry(&self, f: impl FnMut(&str, &Self) -> Result<(), Misfit>) -> Result<(), Misfit>;
}

impl JsonView for Json {
    fn is_null(&self) -> bool {
        Json::is_null(self)
    }
    fn as_bool(&self) -> Option<bool> {
        Json::as_bool(self)
    }
    fn as_i64(&self) -> Option<i64> {
        Json::as_i64(self)
    }
    fn as_f64(&self) -> Option<f64> {
        Json::as_f64(self)
    }
    fn as_str(&self) -> Option<&str> {
        Json::as_str(self)
    }
    fn as_array(&self) -> Option<&[Self]> {
        Json::as_array(self).map(Vec::as_slice)
    }
    fn object_len(&self) -> Option<usize> {
        self.as_object().map(serde_json::Map::len)
    }
    fn field(&self, key: &str, _hint: &mut usize) -> Option<&Self> {
        self.as_object()?.get(key)
    }
    fn each_entry(
        &self,
        mut f: impl FnMut(&str, &Self) -> Result<(), Misfit>,
    ) -> Result<(), Misfit> {
        for (k, v) in self.as_object().ok_or(Misfit)? {
            f(k, v)?;
        }
        Ok(())
    }
}

/// A JSON value borrowed from its text where it can be: strings without escapes are
/// slices of the text, objects are their entries in text order (a repeated key is kept
/// twice, which the writer refuses).
#[derive(Debug, Clone, PartialEq)]
pub enum JsonNode<'a> {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(Cow<'a, str>),
    Array(Vec<JsonNode<'a>>),
    Object(Vec<(Cow<'a, str>, JsonNode<'a>)>),
}

impl JsonView for JsonNode<'_> {
    fn is_null(&self) -> bool {
        matches!(self, JsonNode::Null)
    }
    fn as_bool(&self) -> Option<bool> {
        match self {
            JsonNode::Bool(b) => Some(*b),
            _ => None,
        }
    }
    // As serde_json's Number: an unsigned above i64::MAX is no i64, a float is none.
    fn as_i64(&self) -> Option<i64> {
        match self {
            JsonNode::I64(n) => Some(*n),
            JsonNode::U64(n) => i64::try_from(*n).ok(),
            _ => None,
        }
    }
    fn as_f64(&self) -> Option<f64> {
        match self {
            JsonNode::I64(n) => Some(*n as f64),
            JsonNode::U64(n) => Some(*n as f64),
            JsonNode::F64(f) => Some(*f),
            _ => None,
        }
    }
    fn as_str(&self) -> Option<&str> {
        match self {
            JsonNode::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_array(&self) -> Option<&[Self]> {
        match self {
            JsonNode::Array(items) => Some(items),
            _ => None,
        }
    }
    fn object_len(&self) -> Option<usize> {
        match self {
            JsonNode::Object(entries) => Some(entries.len()),
            _ => None,
        }
    }
    fn field(&self, key: &str, hint: &mut usize) -> Option<&Self> {
        let JsonNode::Object(entries) = self else {
            return None;
        };
        let (n, start) = (entries.len(), *hint);
        let i = (0..n)
            .map(|i| (start + i) % n)
            .find(|&i| entries[i].0 == key)?;
        *hint = i + 1;
        Some(&entries[i].1)
    }
    fn each_entry(
        &self,
        mut f: impl FnMut(&str, &Self) -> Result<(), Misfit>,
    ) -> Result<(), Misfit> {
        let JsonNode::Object(entries) = self else {
            return Err(Misfit);
        };
        for (k, v) in entries {
            f(k, v)?;
        }
        Ok(())
    }
}

impl<'de> Deserialize<'de> for JsonNode<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = JsonNode<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(JsonNode::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(JsonNode::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Deserialize::deserialize(d)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(JsonNode::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(JsonNode::I64(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(JsonNode::U64(n))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
        Ok(JsonNode::F64(f))
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(JsonNode::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(JsonNode::Str(Cow::Owned(s.to_string())))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(JsonNode::Str(Cow::Owned(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(JsonNode::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(8));
        while let Some(key) = map.next_key::<Key<'de>>()? {
            entries.push((key.0, map.next_value()?));
        }
        Ok(JsonNode::Object(entries))
    }
}

/// An object key, borrowed when it has no escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(s.to_string())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(s)))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The Avro body of `value` as apache_avro writes it.
fn generic_body(schema: &Schema, value: Value) -> Result<Vec<u8>, apache_avro::Error> {
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
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Schema {
        Schema::parse_str(
            r#"{"type":"record","name":"R","namespace":"t","fields":[
              {"name":"id","type":"long"},
              {"name":"kind","type":{"type":"enum","name":"K","symbols":["A","B"]}},
              {"name":"note","type":["null","string"],"default":null},
              {"name":"items","type":{"type":"array","items":{"type":"record","name":"I","fields":[{"name":"q","type":"int"}]}}},
              {"name":"again","type":["null","I"],"default":null}
            ]}"#,
        )
        .expect("valid")
    }

    #[test]
    fn round_trips_plain_json() {
        let input =
            json!({"id": 7, "kind": "B", "note": "x", "items": [{"q": 1}], "again": {"q": 2}});
        let value = json_to_avro(&input, &schema()).expect("converts");
        assert!(value.validate(&schema()));
        assert_eq!(avro_to_json(&value), input);
    }

    #[test]
    fn defaults_fill_missing_optional_fields() {
        let value =
            json_to_avro(&json!({"id": 1, "kind": "A", "items": []}), &schema()).expect("ok");
        assert_eq!(avro_to_json(&value)["note"], Json::Null);
    }

    #[test]
    fn errors_name_the_field() {
        let e = json_to_avro(&json!({"kind": "A", "items": []}), &schema()).unwrap_err();
        assert_eq!(e.path, ".id");
        let e = json_to_avro(&json!({"id": 1, "kind": "C", "items": []}), &schema()).unwrap_err();
        assert_eq!(e.path, ".kind");
        let e = json_to_avro(
            &json!({"id": 1, "kind": "A", "items": [{"q": "x"}]}),
            &schema(),
        )
        .unwrap_err();
        assert_eq!(e.path, ".items[0].q");
        let e = json_to_avro(
            &json!({"id": 1, "kind": "A", "items": [], "extra": 1}),
            &schema(),
        )
        .unwrap_err();
        assert_eq!(e.path, ".extra");
    }

    /// Every path of `json` (object keys and array items, depth first) with the ways a
    /// producer could get it wrong, plus a key the schema does not have at each object.
    fn mutations(json: &Json) -> Vec<Json> {
        fn walk(at: &Json, rebuild: &dyn Fn(Json) -> Json, out: &mut Vec<Json>) {
            let wrong = [
                Json::Null,
                json!(true),
                json!(1.5),
                json!(1_i64 << 40),
                json!(-3),
                json!("x"),
                json!("CONFIRM"),
                json!([]),
                json!([1]),
                json!({}),
            ];
            for w in wrong {
                out.push(rebuild(w));
            }
            match at {
                Json::Object(obj) => {
                    let mut extra = obj.clone();
                    extra.insert("not_in_schema".into(), json!(1));
                    out.push(rebuild(Json::Object(extra)));
                    for key in obj.keys() {
                        let mut without = obj.clone();
                        without.remove(key);
                        out.push(rebuild(Json::Object(without)));
                        let child = |v: Json| {
                            let mut o = obj.clone();
                            o.insert(key.clone(), v);
                            rebuild(Json::Object(o))
                        };
                        walk(&obj[key], &child, out);
                    }
                }
                Json::Array(items) => {
                    for (i, item) in items.iter().enumerate() {
                        let child = |v: Json| {
                            let mut a = items.clone();
                            a[i] = v;
                            rebuild(Json::Array(a))
                        };
                        walk(item, &child, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = vec![json.clone()];
        walk(json, &|v| v, &mut out);
        out
    }

    /// The writer's own walk (not its fallback) accepts exactly what [`json_to_avro`]
    /// accepts, and writes what the generic encoder writes for it.
    fn assert_same_as_generic(writer: &JsonAvroWriter, json: &Json, what: &str) -> bool {
        let mut fast = Vec::new();
        let fast_ok = writer.put(json, writer.schema(), &mut fast).is_ok();
        // The borrowed tree of the same JSON as text takes the same walk to the same bytes.
        let text = json.to_string();
        let node: JsonNode<'_> = serde_json::from_str(&text).expect("a tree of valid JSON");
        let mut from_node = Vec::new();
        let node_ok = writer.put(&node, writer.schema(), &mut from_node).is_ok();
        assert_eq!(node_ok, fast_ok, "{what}: tree and value differ on {text}");
        if fast_ok {
            assert_eq!(from_node, fast, "{what}: {text}");
        }
        let mut from_text = vec![9];
        let text_outcome = writer
            .write_text(&text, &mut from_text)
            .map_err(|e| e.to_string());
        let generic = json_to_avro(json, writer.schema());
        assert_eq!(
            text_outcome,
            generic.as_ref().map(|_| ()).map_err(ToString::to_string),
            "{what}: write_text on {text}"
        );
        if fast_ok {
            assert_eq!(from_text[1..], fast[..], "{what}: write_text appends");
        } else {
            assert_eq!(from_text, vec![9], "{what}: nothing appended on an error");
        }
        match generic {
            Ok(value) => {
                assert!(fast_ok, "{what}: the writer refused {json}");
                let body = generic_body(writer.schema(), value).expect("encodes");
                assert_eq!(fast, body, "{what}: {json}");
                let mut written = vec![9];
                writer.write(json, &mut written).expect("fits");
                assert_eq!(written[1..], body[..], "{what}: write appends");
            }
            Err(e) => {
                assert!(
                    !fast_ok,
                    "{what}: the writer took {json}, which is off the schema: {e}"
                );
                let mut written = vec![9];
                assert_eq!(writer.write(json, &mut written), Err(e), "{what}");
                assert_eq!(written, vec![9], "{what}: nothing appended on an error");
            }
        }
        fast_ok
    }

    #[test]
    fn the_writer_writes_what_the_generic_encoder_writes_for_every_example_and_mutation() {
        let catalog = crate::catalog::Catalog::embedded().expect("catalog");
        let files = crate::codec::fuzz::example_files();
        let (mut accepted, mut refused) = (0, 0);
        for path in &files {
            let file = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            let record = file.split('.').next().expect("record name");
            let event = catalog
                .events()
                .iter()
                .find(|e| e.full_name.rsplit('.').next() == Some(record))
                .unwrap_or_else(|| panic!("{file}: no schema"));
            let writer = JsonAvroWriter::new(&event.parsed);
            let example: Json =
                serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("json");
            assert!(
                assert_same_as_generic(&writer, &example, &file),
                "{file} fits"
            );
            for mutated in mutations(&example) {
                if assert_same_as_generic(&writer, &mutated, &file) {
                    accepted += 1;
                } else {
                    refused += 1;
                }
            }
        }
        // Both outcomes are exercised in numbers: optional fields that take null or are
        // dropped for their default, and every kind of misfit.
        assert!(files.len() >= 15, "{} examples", files.len());
        assert!(
            accepted > 100 && refused > 1_000,
            "{accepted} accepted, {refused} refused"
        );
    }

    #[test]
    fn the_writer_handles_unions_of_named_types_arrays_and_defaults() {
        let writer = JsonAvroWriter::new(&schema());
        for json in [
            json!({"id": -7, "kind": "B", "note": "x", "items": [{"q": 1}, {"q": -2}], "again": {"q": 2}}),
            json!({"id": i64::MAX, "kind": "A", "items": []}),
            json!({"id": i64::MIN, "kind": "A", "items": [], "again": null, "note": null}),
        ] {
            assert!(assert_same_as_generic(&writer, &json, "test schema"));
        }
        for json in mutations(
            &json!({"id": 1, "kind": "A", "note": "n", "items": [{"q": 3}], "again": {"q": 4}}),
        ) {
            assert_same_as_generic(&writer, &json, "test schema");
        }
        let e = {
            let mut out = Vec::new();
            writer
                .write(
                    &json!({"id": 1, "kind": "A", "items": [{"q": "x"}]}),
                    &mut out,
                )
                .unwrap_err()
        };
        assert_eq!(e.path, ".items[0].q", "the error of the generic walk");
    }

    #[test]
    fn text_with_escapes_repeated_keys_or_big_numbers_goes_the_way_of_its_value() {
        let writer = JsonAvroWriter::new(&schema());
        let write = |text: &str| {
            let mut out = Vec::new();
            writer
                .write_text(text, &mut out)
                .map(|()| out)
                .map_err(|e| e.to_string())
        };
        let value = |text: &str| {
            let json: Json = serde_json::from_str(text).expect("json");
            let mut out = Vec::new();
            writer
                .write(&json, &mut out)
                .map(|()| out)
                .map_err(|e| e.to_string())
        };
        for text in [
            // An escaped string is owned, not borrowed; it must read the same.
            r#"{"id": 1, "kind": "A", "note": "a \"q\" \u00e4 \\n", "items": []}"#,
            r#"{"id": 1, "kind": "\u0041", "items": []}"#,
            r#"{"\u0069d": 1, "kind": "A", "items": []}"#,
            // A repeated key: the value reads the last one; the tree refuses and defers.
            r#"{"id": 1, "id": 2, "kind": "A", "items": []}"#,
            r#"{"id": 1, "kind": "A", "items": [], "items": [{"q": 1}]}"#,
            // Numbers at and beyond i64 and i32.
            r#"{"id": 9223372036854775807, "kind": "A", "items": [{"q": 2147483647}]}"#,
            r#"{"id": 9223372036854775808, "kind": "A", "items": []}"#,
            r#"{"id": 1, "kind": "A", "items": [{"q": 2147483648}]}"#,
            r#"{"id": 1.0, "kind": "A", "items": []}"#,
            r#"{"id": -0, "kind": "A", "items": []}"#,
        ] {
            assert_eq!(write(text), value(text), "{text}");
        }
        assert_eq!(
            write(r#"{"id": 1, "id": 2, "kind": "A", "items": []}"#),
            write(r#"{"id": 2, "kind": "A", "items": []}"#),
            "last one wins, as in a serde_json value"
        );
        let unreadable = write(r#"{"id": 1,"#).unwrap_err();
        assert!(
            unreadable.starts_with("payload is not readable JSON"),
            "{unreadable}"
        );
    }

    #[test]
    fn the_writer_writes_maps_that_read_back() {
        let schema =
            Schema::parse_str(r#"{"type":"map","values":["null","long"]}"#).expect("valid");
        let writer = JsonAvroWriter::new(&schema);
        let json = json!({"a": 1, "b": null, "c": -300});
        let mut out = Vec::new();
        writer.write(&json, &mut out).expect("fits");
        let read = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
            .build()
            .expect("reader")
            .read_value(&mut out.as_slice())
            .expect("reads");
        assert_eq!(avro_to_json(&read), json);
        assert!(writer.write(&json!({"a": "x"}), &mut out).is_err());
    }
}
