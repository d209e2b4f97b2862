//! What the JSON writer reads: a [`Json`] value, or a [`JsonNode`] tree borrowed from the
//! JSON text (no map per object, no copy of a string without escapes).

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;
use std::borrow::Cow;

/// The JSON does not fit; [`json_to_avro`](super::json_to_avro) says where and why.
pub(super) struct Misfit;

/// What the writer reads of a JSON value: [`Json`] and the borrowed [`JsonNode`].
pub(super) trait JsonView: Sized {
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
