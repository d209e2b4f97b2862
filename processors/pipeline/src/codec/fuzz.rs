//! What the decoder fuzz tests share (compiled for this crate's tests and, with the
//! `fuzzing` feature, for the processors' tests): a registry-free decoder with the embedded
//! schemas pre-loaded under made-up ids, the `schemas/examples` framed as a Confluent
//! serializer would frame them, and proptest strategies for arbitrary and mutated records.
//!
//! The pre-loaded decoder runs the production path ([`split_header`] and
//! [`decode_framed_body`]); only the registry lookup is replaced, so a panic found here is a
//! panic of the processors.
//!
//! Case counts: [`cases`] (default [`DEFAULT_CASES`], a few seconds per property in a debug
//! build); `STOCKSVR_FUZZ_CASES=100000 cargo test -p stocksvr-pipeline fuzz` runs longer.

use super::{decode_framed_body, split_header, DecodeError, Decoded, MAGIC_BYTE};
use crate::catalog::Catalog;
use apache_avro::types::Value;
use apache_avro::Schema;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError};
use std::path::PathBuf;
use std::sync::Arc;

/// Cases per property when `STOCKSVR_FUZZ_CASES` is not set.
pub const DEFAULT_CASES: u32 = 1024;

/// Cases per property: `STOCKSVR_FUZZ_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("STOCKSVR_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u32| n > 0)
        .unwrap_or(DEFAULT_CASES)
}

/// The proptest configuration of every decoder property: [`cases`] cases, no regression
/// files written into the source tree (a failure prints the shrunk input and its seed).
pub fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The embedded catalog's schemas under ids 1..=N in catalog order, decoded without a
/// registry: an id outside them is [`DecodeError::UnknownSchemaId`], as the registry's 404.
pub struct Preloaded {
    schemas: Vec<(u32, String, Schema)>,
}

impl Preloaded {
    pub fn embedded() -> Self {
        let catalog = Catalog::embedded().expect("the embedded catalog parses");
        let schemas = catalog
            .events()
            .iter()
            .zip(1u32..)
            .map(|(e, id)| (id, e.full_name.clone(), e.parsed.clone()))
            .collect();
        Self { schemas }
    }

    /// The highest id in use.
    pub fn max_id(&self) -> u32 {
        self.schemas.len() as u32
    }

    pub fn id_of(&self, full_name: &str) -> Option<u32> {
        self.schemas
            .iter()
            .find(|(_, name, _)| name == full_name)
            .map(|(id, _, _)| *id)
    }

    pub fn schema(&self, id: u32) -> Option<&Schema> {
        self.schemas
            .iter()
            .find(|(i, _, _)| *i == id)
            .map(|(_, _, s)| s)
    }

    /// [`super::AvroCodec::decode`] with the registry replaced by the pre-loaded schemas.
    pub fn decode(&self, bytes: Option<&[u8]>) -> Result<Decoded, DecodeError> {
        let (id, body) = split_header(bytes)?;
        let schema = self
            .schema(id)
            .ok_or_else(|| DecodeError::UnknownSchemaId {
                id,
                reason: "not pre-loaded".into(),
            })?;
        decode_framed_body(id, schema, body)
    }
}

/// Magic byte, big-endian schema id, body.
pub fn frame(id: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// One `schemas/examples/*.json`, encoded with its schema and framed.
#[derive(Debug, Clone)]
pub struct Example {
    pub file: String,
    pub full_name: String,
    pub id: u32,
    /// The example as the Avro value its schema reads.
    pub value: Value,
    pub framed: Vec<u8>,
}

/// `schemas/examples` of the checkout under test. Read through the environment at run time:
/// every processor crate sits two levels below the repository root.
pub fn examples_dir() -> PathBuf {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    PathBuf::from(manifest).join("../../schemas/examples")
}

/// The `schemas/examples/*.json` files, in file-name order; at least one.
pub fn example_files() -> Vec<PathBuf> {
    let dir = examples_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

/// Every example, valid by construction (the test of this module checks that each one
/// decodes back), in file-name order.
pub fn examples(preloaded: &Preloaded) -> Vec<Example> {
    example_files()
        .into_iter()
        .map(|path| {
            let file = path
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let record = file.split('.').next().unwrap_or_default();
            let (id, full_name, schema) = preloaded
                .schemas
                .iter()
                .find(|(_, name, _)| name.rsplit('.').next() == Some(record))
                .unwrap_or_else(|| panic!("{file}: no schema named {record}"));
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
            let json: serde_json::Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
            let value =
                crate::json::json_to_avro(&json, schema).unwrap_or_else(|e| panic!("{file}: {e}"));
            let body = encode(schema, value.clone()).unwrap_or_else(|| panic!("{file}: encodes"));
            Example {
                file,
                full_name: full_name.clone(),
                id: *id,
                value,
                framed: frame(*id, &body),
            }
        })
        .collect()
}

/// The [`crate::consumer::Record`] the shared loop would hand a processor for `payload`
/// read from `topic` and decoded as `event`.
pub fn record(topic: &str, payload: &[u8], event: Decoded) -> crate::consumer::Record {
    let message = rdkafka::message::OwnedMessage::new(
        Some(payload.to_vec()),
        Some(b"key".to_vec()),
        topic.to_string(),
        rdkafka::Timestamp::CreateTime(1_700_000_000_000),
        0,
        0,
        None,
    );
    crate::consumer::Record { message, event }
}

/// The Avro body of `value`, or `None` when it does not fit `schema`.
fn encode(schema: &Schema, value: Value) -> Option<Vec<u8>> {
    #[allow(deprecated)] // the writer builder is more ceremony than a fixture needs
    apache_avro::to_avro_datum(schema, value).ok()
}

/// Avro's zig-zag varint, as lengths, union indexes, ints and longs are written.
pub fn zigzag(value: i64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    crate::json::put_long(value, &mut out);
    out
}

/// One change to a record's bytes. Positions are taken modulo the length, so any value
/// applies to any record; the header is the first 5 bytes.
#[derive(Debug, Clone)]
pub enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    SetByte {
        at: usize,
        byte: u8,
    },
    Truncate {
        at: usize,
    },
    Extend(Vec<u8>),
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Remove {
        at: usize,
        len: usize,
    },
    /// The byte at `at` replaced by a varint: aimed at length prefixes, union indexes and
    /// enum symbols (huge, negative, one past the end).
    Varint {
        at: usize,
        value: i64,
    },
    /// Another schema id in the header: a known one decodes the body with the wrong schema.
    SchemaId(u32),
}

impl Mutation {
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        let len = bytes.len();
        match self {
            Mutation::FlipBit { at, bit } if len > 0 => bytes[at % len] ^= 1 << (bit % 8),
            Mutation::SetByte { at, byte } if len > 0 => bytes[at % len] = *byte,
            Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
            Mutation::Extend(more) => bytes.extend_from_slice(more),
            Mutation::Insert { at, bytes: more } => {
                let at = at % (len + 1);
                bytes.splice(at..at, more.iter().copied());
            }
            Mutation::Remove { at, len: n } if len > 0 => {
                let at = at % len;
                let end = (at + n).min(len);
                bytes.drain(at..end);
            }
            Mutation::Varint { at, value } if len > 0 => {
                let at = at % len;
                bytes.splice(at..at + 1, zigzag(*value));
            }
            Mutation::SchemaId(id) if len >= 5 => bytes[1..5].copy_from_slice(&id.to_be_bytes()),
            _ => {}
        }
    }
}

/// A position: half the time inside the 5-byte header, else anywhere.
fn position() -> impl Strategy<Value = usize> {
    prop_oneof![0usize..5, any::<usize>()]
}

/// Varint values that matter to a decoder: small (indexes, short lengths), boundaries and
/// huge lengths.
fn varint_value() -> impl Strategy<Value = i64> {
    prop_oneof![
        -3i64..64,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(i32::MAX as i64),
        Just(i32::MIN as i64),
        Just(1 << 31),
        Just(512 * 1024 * 1024),
        any::<i64>(),
    ]
}

pub fn mutation(max_id: u32) -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (position(), any::<u8>()).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        (position(), any::<u8>()).prop_map(|(at, byte)| Mutation::SetByte { at, byte }),
        position().prop_map(|at| Mutation::Truncate { at }),
        vec(any::<u8>(), 1..16).prop_map(Mutation::Extend),
        (position(), vec(any::<u8>(), 1..8)).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (position(), 1usize..8).prop_map(|(at, len)| Mutation::Remove { at, len }),
        (position(), varint_value()).prop_map(|(at, value)| Mutation::Varint { at, value }),
        prop_oneof![0..=max_id + 1, any::<u32>()].prop_map(Mutation::SchemaId),
    ]
}

/// A valid example with 1 to 4 mutations: `(example file, mutated bytes)`.
pub fn mutated_example(
    examples: Arc<Vec<Example>>,
    max_id: u32,
) -> impl Strategy<Value = (String, Vec<u8>)> {
    let count = examples.len();
    (0..count, vec(mutation(max_id), 1..=4)).prop_map(move |(i, mutations)| {
        let example = &examples[i];
        let mut bytes = example.framed.clone();
        for m in &mutations {
            m.apply(&mut bytes);
        }
        (example.file.clone(), bytes)
    })
}

/// Arbitrary values: no value, raw bytes (mostly failing the header), and a valid header
/// with a known or unknown id over arbitrary body bytes (reaching every schema's decoder).
pub fn arbitrary_record(max_id: u32) -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        1 => Just(None),
        2 => vec(any::<u8>(), 0..48).prop_map(Some),
        6 => (0..=max_id + 1, vec(any::<u8>(), 0..256)).prop_map(|(id, body)| Some(frame(id, &body))),
    ]
}

/// Strings that break parsers and columns: empty, past VARCHAR(64), multi-byte, control
/// characters, numbers past `i64`, dates and instants that do not exist or lie at the edges
/// of what chrono represents.
const ODD_STRINGS: &[&str] = &[
    "",
    " ",
    "\u{0}",
    "é",
    "-1",
    "0",
    "9223372036854775808",
    "18446744073709551616",
    "2026-02-30",
    "2026-13-01",
    "0000-01-01",
    "+262143-12-31",
    "2026-11-29T12:00:00.250+25:00",
    "2026-11-29T24:00:00Z",
    "9999-12-31T23:59:59.999Z",
    "+275760-09-13T00:00:00Z",
    "0001-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "2026-11-29T12:00:00.250",
    "bucket_1_2_20261129",
    "bucket_-1_2_99999999",
    "INSTANT",
    "SCHEDULED",
];

/// Replaces one leaf (a number, string, boolean or array) of an example's value with an
/// extreme of the same type: the record still encodes and decodes, so it reaches the
/// processors' typed checks, which byte mutations mostly do not.
#[derive(Debug, Clone)]
pub struct ValueMutation {
    /// Which leaf, in depth-first order, modulo the number of leaves.
    pub leaf: usize,
    pub pick: usize,
    pub number: i64,
}

fn count_leaves(v: &Value) -> usize {
    match v {
        Value::Record(fields) => fields.iter().map(|(_, f)| count_leaves(f)).sum(),
        Value::Union(_, inner) => count_leaves(inner),
        Value::Array(items) => 1 + items.iter().map(count_leaves).sum::<usize>(),
        Value::Map(items) => items.values().map(count_leaves).sum(),
        _ => 1,
    }
}

/// Mutates the `n`th leaf; returns whether it found it (`n` counts down).
fn mutate_leaf(v: &mut Value, n: &mut usize, m: &ValueMutation) -> bool {
    match v {
        Value::Record(fields) => fields.iter_mut().any(|(_, f)| mutate_leaf(f, n, m)),
        Value::Union(_, inner) => mutate_leaf(inner, n, m),
        Value::Map(items) => items.values_mut().any(|f| mutate_leaf(f, n, m)),
        Value::Array(items) if *n > 0 => {
            *n -= 1;
            items.iter_mut().any(|f| mutate_leaf(f, n, m))
        }
        _ if *n > 0 => {
            *n -= 1;
            false
        }
        leaf => {
            let extremes = [i64::MIN, i64::MAX, 0, -1, 1, 1 << 53, m.number];
            let pick = m.pick % extremes.len();
            *leaf = match &mut *leaf {
                Value::Long(_) => Value::Long(extremes[pick]),
                Value::Int(_) => {
                    Value::Int([i32::MIN, i32::MAX, 0, -1, 1, m.number as i32][m.pick % 6])
                }
                Value::String(_) if m.pick % 4 == 3 => {
                    Value::String("x".repeat(60 + (m.number.unsigned_abs() % 10) as usize))
                }
                Value::String(_) => Value::String(ODD_STRINGS[m.pick % ODD_STRINGS.len()].into()),
                Value::Boolean(b) => Value::Boolean(!*b),
                Value::Double(_) => Value::Double([f64::NAN, f64::INFINITY, -0.0][m.pick % 3]),
                Value::Float(_) => Value::Float([f32::NAN, f32::INFINITY, -0.0][m.pick % 3]),
                // An array: emptied, or its items repeated.
                Value::Array(_) if m.pick.is_multiple_of(2) => Value::Array(Vec::new()),
                Value::Array(items) => {
                    let twice = items.iter().chain(items.iter()).cloned().collect();
                    Value::Array(twice)
                }
                other => std::mem::replace(other, Value::Null),
            };
            true
        }
    }
}

pub fn value_mutation() -> impl Strategy<Value = ValueMutation> {
    (any::<usize>(), any::<usize>(), any::<i64>()).prop_map(|(leaf, pick, number)| ValueMutation {
        leaf,
        pick,
        number,
    })
}

/// A valid example with 1 to 3 leaves replaced by extremes of their type, re-encoded with
/// its schema and framed: `(example file, bytes)`. A combination the schema refuses (none
/// should, types are kept) falls back to the unchanged example.
pub fn value_mutated_example(
    examples: Arc<Vec<Example>>,
    preloaded: Arc<Preloaded>,
) -> impl Strategy<Value = (String, Vec<u8>)> {
    let count = examples.len();
    (0..count, vec(value_mutation(), 1..=3)).prop_map(move |(i, mutations)| {
        let example = &examples[i];
        let mut value = example.value.clone();
        for m in &mutations {
            let leaves = count_leaves(&value).max(1);
            let mut n = m.leaf % leaves;
            mutate_leaf(&mut value, &mut n, m);
        }
        let bytes = preloaded
            .schema(example.id)
            .and_then(|schema| encode(schema, value))
            .map(|body| frame(example.id, &body))
            .unwrap_or_else(|| example.framed.clone());
        (example.file.clone(), bytes)
    })
}

/// Runs `step` (a decode step: `Err` fails the case, a panic fails the test) over every
/// valid example, then [`cases`] byte-mutated examples, value-mutated examples and
/// arbitrary records each. A failure panics with proptest's shrunk input.
pub fn run_decode_fuzz<F>(step: F)
where
    F: Fn(&Preloaded, &[u8]) -> Result<(), TestCaseError>,
{
    let preloaded = Arc::new(Preloaded::embedded());
    let examples = Arc::new(examples(&preloaded));
    for e in examples.iter() {
        step(&preloaded, &e.framed).unwrap_or_else(|err| panic!("{}: {err}", e.file));
    }
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(
            &mutated_example(examples.clone(), preloaded.max_id()),
            |(_, bytes)| step(&preloaded, &bytes),
        )
        .unwrap_or_else(|e| panic!("byte-mutated example: {e}"));
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(
            &value_mutated_example(examples, preloaded.clone()),
            |(_, bytes)| step(&preloaded, &bytes),
        )
        .unwrap_or_else(|e| panic!("value-mutated example: {e}"));
    let mut runner = proptest::test_runner::TestRunner::new(config());
    runner
        .run(&arbitrary_record(preloaded.max_id()), |bytes| {
            step(&preloaded, bytes.as_deref().unwrap_or_default())
        })
        .unwrap_or_else(|e| panic!("arbitrary record: {e}"));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;

    fn setup() -> (Preloaded, Arc<Vec<Example>>) {
        let preloaded = Preloaded::embedded();
        let examples = Arc::new(examples(&preloaded));
        (preloaded, examples)
    }

    /// What a decode may come to: a value conforming to the schema its header names, or a
    /// typed error that is never "retry" (nothing here can be fixed by waiting).
    fn check(preloaded: &Preloaded, bytes: Option<&[u8]>) -> Result<(), TestCaseError> {
        match preloaded.decode(bytes) {
            Ok(decoded) => {
                let schema = preloaded
                    .schema(decoded.schema_id)
                    .expect("decoded with a pre-loaded schema");
                prop_assert!(
                    decoded.value.validate(schema),
                    "decoded value does not conform to schema {}",
                    decoded.schema_id
                );
            }
            Err(e) => {
                prop_assert!(!e.is_retryable(), "{e}");
                prop_assert!(!e.kind().is_empty());
            }
        }
        Ok(())
    }

    #[test]
    fn every_example_decodes_back_with_its_schema() {
        let (preloaded, examples) = setup();
        for e in examples.iter() {
            let decoded = preloaded
                .decode(Some(&e.framed))
                .unwrap_or_else(|err| panic!("{}: {err}", e.file));
            assert_eq!(decoded.full_name, e.full_name, "{}", e.file);
        }
    }

    #[test]
    fn mutations_apply_where_they_say() {
        let mut b = frame(7, &[1, 2, 3]);
        Mutation::SchemaId(9).apply(&mut b);
        assert_eq!(b, [0, 0, 0, 0, 9, 1, 2, 3]);
        Mutation::Truncate { at: 6 }.apply(&mut b);
        assert_eq!(b, [0, 0, 0, 0, 9, 1]);
        Mutation::Varint { at: 5, value: -1 }.apply(&mut b);
        assert_eq!(b, [0, 0, 0, 0, 9, 1]);
        Mutation::Varint { at: 5, value: 64 }.apply(&mut b);
        assert_eq!(b, [0, 0, 0, 0, 9, 0x80, 0x01]);
        assert_eq!(zigzag(i64::MIN).len(), 10);
    }

    /// A 7-byte record whose body claims a string of 500 MB: refused as a typed error
    /// without reading (or holding) anything like that.
    #[test]
    fn a_huge_length_prefix_is_a_typed_error() {
        let preloaded = Preloaded::embedded();
        for id in 1..=preloaded.max_id() {
            for claimed in [500_000_000i64, i64::MAX, -1, i32::MAX as i64] {
                let bytes = frame(id, &zigzag(claimed));
                let err = preloaded.decode(Some(&bytes)).expect_err("cannot decode");
                assert!(!err.is_retryable(), "{err}");
            }
        }
    }

    #[test]
    fn arbitrary_records_never_panic() {
        let preloaded = Preloaded::embedded();
        let mut runner = proptest::test_runner::TestRunner::new(config());
        runner
            .run(&arbitrary_record(preloaded.max_id()), |bytes| {
                check(&preloaded, bytes.as_deref())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }

    /// Value mutations keep the schema, so (almost) every one decodes: they are the cases
    /// that reach the processors' typed checks.
    #[test]
    fn value_mutated_examples_decode() {
        let (preloaded, examples) = setup();
        let preloaded = Arc::new(preloaded);
        let mut runner = proptest::test_runner::TestRunner::new(config());
        let strategy = value_mutated_example(examples.clone(), preloaded.clone());
        let mut changed = 0;
        for _ in 0..200 {
            let (file, bytes) = strategy.new_tree(&mut runner).expect("generates").current();
            let decoded = preloaded.decode(Some(&bytes));
            assert!(decoded.is_ok(), "{file}: {decoded:?}");
            let original = examples.iter().find(|e| e.file == file).expect("example");
            changed += usize::from(bytes != original.framed);
        }
        assert!(
            changed > 150,
            "only {changed} of 200 value mutations changed the record"
        );
    }

    #[test]
    fn mutated_and_arbitrary_records_never_panic() {
        run_decode_fuzz(|preloaded, bytes| check(preloaded, Some(bytes)));
    }
}
