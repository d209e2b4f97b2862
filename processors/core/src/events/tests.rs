//! Contract tests: `schemas/*.avsc`, `schemas/examples/*.json`, `schemas/catalog.yaml` and
//! the Rust types must all say the same thing. A drift here means a producer in another
//! language and this service disagree about the wire format, which only shows up in
//! production as dead letters, so it is caught at `cargo test` time instead.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::*;

/// The crate's directory, read when the test runs: a test binary reused from a shared target
/// dir may have been compiled in a checkout at another path, so `env!` could point elsewhere.
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}

fn schemas_dir() -> String {
    format!("{}/../../schemas", manifest_dir())
}

fn examples_dir() -> String {
    format!("{}/../../schemas/examples", manifest_dir())
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn files_with_ext(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|entry| entry.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

fn schema_of(kind: EventKind) -> Value {
    read_json(&Path::new(&schemas_dir()).join(kind.schema_file()))
}

/// `OrderCreated.scheduled.json` is an example of `OrderCreated`.
fn kind_of_example(path: &Path) -> EventKind {
    let file = path.file_name().unwrap().to_str().unwrap();
    let name = file.split('.').next().unwrap();
    EventKind::from_name(name).unwrap_or_else(|| {
        panic!("{file}: no event named {name}; name examples <Event>[.<case>].json")
    })
}

fn examples() -> Vec<(PathBuf, EventKind, Value)> {
    files_with_ext(&examples_dir(), "json")
        .into_iter()
        .map(|p| {
            let kind = kind_of_example(&p);
            let value = read_json(&p);
            (p, kind, value)
        })
        .collect()
}

/// Decodes, checks and re-encodes one example; returns what serde wrote back.
fn round_trip<D: EventData>(kind: EventKind, value: &Value) -> Result<Value, String> {
    let envelope: Envelope<D> = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    envelope
        .check(kind.full_name())
        .map_err(|e| e.to_string())?;
    serde_json::to_value(&envelope).map_err(|e| e.to_string())
}

fn round_trip_any(kind: EventKind, value: &Value) -> Result<Value, String> {
    use EventKind as K;
    match kind {
        K::OrderCreated => round_trip::<OrderCreatedData>(kind, value),
        K::OrderCreatedFailed => round_trip::<OrderCreatedFailedData>(kind, value),
        K::OrderCanceled => round_trip::<OrderCanceledData>(kind, value),
        K::RefundRequested => round_trip::<RefundRequestedData>(kind, value),
        K::InventoryConfirmDue => round_trip::<InventoryConfirmDueData>(kind, value),
        K::InventoryRedisReserved
        | K::InventoryRedisConfirmed
        | K::InventoryRedisCanceled
        | K::InventoryRedisRefunded => round_trip::<StockChangeData>(kind, value),
        K::StockBucketInitialized => round_trip::<StockBucketInitializedData>(kind, value),
        K::StockBaselineAdjusted => round_trip::<StockBaselineAdjustedData>(kind, value),
        K::StockBucketRepaired => round_trip::<StockBucketRepairedData>(kind, value),
        K::StockBucketRebuilt => round_trip::<StockBucketRebuiltData>(kind, value),
        K::InventoryReserved => round_trip::<InventoryReservedData>(kind, value),
        K::InventoryRejected => round_trip::<InventoryRejectedData>(kind, value),
        K::InventoryConfirmed => round_trip::<InventoryConfirmedData>(kind, value),
        K::InventoryCanceled => round_trip::<InventoryCanceledData>(kind, value),
        K::InventoryRefunded => round_trip::<InventoryRefundedData>(kind, value),
        K::InventoryOperationDead => round_trip::<InventoryOperationDeadData>(kind, value),
    }
}

#[test]
fn every_example_decodes_checks_and_encodes_back_unchanged() {
    let examples = examples();
    assert!(
        !examples.is_empty(),
        "no examples found in {}",
        examples_dir()
    );
    for (path, kind, value) in examples {
        let back =
            round_trip_any(kind, &value).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            back,
            value,
            "{}: serde did not write back the same JSON",
            path.display()
        );
    }
}

#[test]
fn every_event_has_an_example() {
    let covered: BTreeSet<EventKind> = examples().into_iter().map(|(_, kind, _)| kind).collect();
    for kind in EventKind::ALL {
        assert!(
            covered.contains(kind),
            "schemas/examples has no {}.json",
            kind.name()
        );
    }
}

#[test]
fn every_example_conforms_to_its_avro_schema() {
    for (path, kind, value) in examples() {
        let schema = schema_of(kind);
        Conformance::default()
            .check(&schema, &value, "", "$")
            .unwrap_or_else(|e| panic!("{} vs {}: {e}", path.display(), kind.schema_file()));
    }
}

#[test]
fn example_quantities_keep_the_bucket_invariant() {
    for (path, _, value) in examples() {
        if let Some(after) = value["data"].get("after") {
            let after: StockAfter = serde_json::from_value(after.clone()).unwrap();
            // After an adjust below what was accepted, `total` is the merchant's new total
            // and the excess is the deficit: available + reserved + sold = total + deficit.
            let deficit = value["data"]["deficit"].as_i64().unwrap_or(0);
            let effective = StockAfter {
                total: after.total + deficit,
                ..after
            };
            assert!(effective.is_consistent(), "{}: {after:?}", path.display());
        }
    }
}

#[test]
fn schema_files_and_event_kinds_match_one_to_one() {
    let files: BTreeSet<String> = files_with_ext(&schemas_dir(), "avsc")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let kinds: BTreeSet<String> = EventKind::ALL
        .iter()
        .map(|k| k.schema_file().to_owned())
        .collect();
    assert_eq!(files, kinds);

    for kind in EventKind::ALL {
        let schema = schema_of(*kind);
        assert_eq!(schema["type"], "record", "{}", kind.schema_file());
        assert_eq!(schema["name"], kind.name(), "{}", kind.schema_file());
        assert_eq!(
            schema["namespace"],
            kind.namespace(),
            "{}",
            kind.schema_file()
        );
        assert_eq!(EventKind::from_full_name(kind.full_name()), Some(*kind));
    }
}

/// The envelope is the same in every file, so generic tooling (dead letters, replay) can
/// read it without knowing the event.
#[test]
fn every_schema_starts_with_the_same_envelope() {
    let expected = [
        ("event_id", "\"string\""),
        ("event_type", "\"string\""),
        ("schema_version", "\"int\""),
        ("occurred_at", "\"string\""),
        ("producer", "\"string\""),
        ("trace_id", "[\"null\",\"string\"]"),
        ("partition_key", "\"string\""),
    ];
    for kind in EventKind::ALL {
        let schema = schema_of(*kind);
        let fields = schema["fields"].as_array().unwrap();
        let names: Vec<&str> = fields.iter().map(|f| f["name"].as_str().unwrap()).collect();
        let mut want: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
        want.push("data");
        assert_eq!(names, want, "{}", kind.schema_file());
        for ((_, ty), field) in expected.iter().zip(fields) {
            assert_eq!(
                field["type"].to_string(),
                *ty,
                "{}: {}",
                kind.schema_file(),
                field["name"]
            );
        }
        assert_eq!(
            fields[7]["type"]["name"],
            data_record_name(*kind).as_str(),
            "{}",
            kind.schema_file()
        );
    }
}

/// The four `InventoryRedis*` events share `StockChangeData`; every other event has its own.
fn data_record_name(kind: EventKind) -> String {
    if kind.name().starts_with("InventoryRedis") {
        "StockChangeData".to_owned()
    } else {
        format!("{}Data", kind.name())
    }
}

/// Nested types are repeated inline in each file under one full name; a registry (and any
/// Avro reader resolving old against new data) assumes one name means one shape.
#[test]
fn named_types_repeated_across_files_are_identical() {
    let mut seen: BTreeMap<String, (String, Value)> = BTreeMap::new();
    for kind in EventKind::ALL {
        let mut found = Vec::new();
        collect_named(&schema_of(*kind), "", &mut found);
        for (name, def) in found {
            match seen.get(&name) {
                Some((file, first)) => assert_eq!(
                    &def,
                    first,
                    "{name} differs between {file} and {}",
                    kind.schema_file()
                ),
                None => {
                    seen.insert(name, (kind.schema_file().to_owned(), def));
                }
            }
        }
    }
    assert!(seen.contains_key("io.stocksvr.order.OrderType"));
    assert!(seen.contains_key("io.stocksvr.inventory.StockAfter"));
}

/// Every nullable field must be `["null", T]` with default null, or adding it later would
/// not be BACKWARD compatible and a Python dict without the key would not encode.
/// Every record says what it is for.
#[test]
fn schemas_follow_the_house_rules() {
    for kind in EventKind::ALL {
        let mut found = Vec::new();
        collect_named(&schema_of(*kind), "", &mut found);
        for (name, def) in found {
            assert!(
                def["doc"].is_string(),
                "{name} in {} has no doc",
                kind.schema_file()
            );
            for field in def["fields"].as_array().into_iter().flatten() {
                if let Some(branches) = field["type"].as_array() {
                    assert_eq!(
                        branches.len(),
                        2,
                        "{name}.{}: only [null, T] unions",
                        field["name"]
                    );
                    assert_eq!(
                        branches[0], "null",
                        "{name}.{}: null goes first",
                        field["name"]
                    );
                    assert_eq!(
                        field.get("default"),
                        Some(&Value::Null),
                        "{name}.{}",
                        field["name"]
                    );
                }
            }
        }
    }
}

struct CatalogRow {
    name: String,
    topic: String,
    file: String,
    key: String,
    direction: String,
}

/// A deliberately tiny reader for the flat `events:` list of catalog.yaml (no YAML
/// dependency in core); the pipeline parses the same file with a real YAML parser.
fn catalog() -> Vec<CatalogRow> {
    let text = std::fs::read_to_string(Path::new(&schemas_dir()).join("catalog.yaml")).unwrap();
    let mut rows: Vec<BTreeMap<String, String>> = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap().trim_end();
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed == "events:" {
            continue;
        }
        let (item, rest) = match trimmed.strip_prefix("- ") {
            Some(rest) => (true, rest),
            None => (false, trimmed),
        };
        if item {
            rows.push(BTreeMap::new());
        }
        let (key, value) = rest
            .split_once(':')
            .unwrap_or_else(|| panic!("catalog.yaml: {line}"));
        let row = rows
            .last_mut()
            .expect("catalog.yaml: entry before first '-'");
        row.insert(key.trim().to_owned(), value.trim().to_owned());
    }
    rows.into_iter()
        .map(|mut r| {
            let mut take = |k: &str| {
                r.remove(k)
                    .unwrap_or_else(|| panic!("catalog.yaml: entry without {k}"))
            };
            CatalogRow {
                name: take("name"),
                topic: take("topic"),
                file: take("file"),
                key: take("key"),
                direction: take("direction"),
            }
        })
        .collect()
}

#[test]
fn catalog_matches_event_kinds_and_schemas() {
    let rows = catalog();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let kinds: Vec<&str> = EventKind::ALL.iter().map(|k| k.full_name()).collect();
    assert_eq!(
        names, kinds,
        "catalog.yaml and EventKind::ALL list different events (or order)"
    );

    for (row, kind) in rows.iter().zip(EventKind::ALL) {
        assert_eq!(row.topic, kind.topic(), "{}", row.name);
        assert_eq!(row.file, kind.schema_file(), "{}", row.name);
        let schema = schema_of(*kind);
        let full = format!(
            "{}.{}",
            schema["namespace"].as_str().unwrap(),
            schema["name"].as_str().unwrap()
        );
        assert_eq!(full, row.name, "{}", row.file);
        let inbound = matches!(
            kind.topic(),
            topics::ORDER_LIFECYCLE | topics::INVENTORY_SCHEDULE
        );
        assert_eq!(
            row.direction,
            if inbound { "in" } else { "out" },
            "{}",
            row.name
        );
        let data_fields: Vec<&str> = schema["fields"][7]["type"]["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert!(
            data_fields.contains(&row.key.as_str()),
            "{}: key {} is not a data field",
            row.name,
            row.key
        );
    }
}

/// The key the Rust side derives is the catalog's key field (or, for a dead WAL operation
/// without an order, its bucket).
#[test]
fn partition_key_is_the_catalog_key_field() {
    let rows = catalog();
    for (path, kind, value) in examples() {
        let row = rows.iter().find(|r| r.name == kind.full_name()).unwrap();
        let field = &value["data"][row.key.as_str()];
        let expected = match field {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            Value::Null if kind == EventKind::InventoryOperationDead => value["data"]
                ["stock_bucket_id"]
                .as_str()
                .unwrap()
                .to_owned(),
            other => panic!("{}: key field {} is {other}", path.display(), row.key),
        };
        assert_eq!(
            value["partition_key"],
            expected.as_str(),
            "{}",
            path.display()
        );
    }
}

#[test]
fn envelope_new_fills_the_redundant_fields_from_the_data() {
    let data: StockChangeData = serde_json::from_value(
        read_json(&Path::new(&examples_dir()).join("InventoryRedisReserved.json"))["data"].clone(),
    )
    .unwrap();
    let env = Envelope::new(
        "evt_1",
        "2026-07-25T20:30:00.456+08:00",
        "inventory-service",
        None,
        data,
    );
    assert_eq!(env.event_type, "InventoryRedisReserved");
    assert_eq!(env.schema_version, 1);
    assert_eq!(env.partition_key, "bucket_10001_90001_20260726");
    assert_eq!(
        env.kind().subject(),
        "inventory.stock-change.v1-io.stocksvr.inventory.InventoryRedisReserved"
    );
    env.check("io.stocksvr.inventory.InventoryRedisReserved")
        .unwrap();
}

#[test]
fn check_refuses_an_envelope_that_contradicts_its_data() {
    let value = read_json(&Path::new(&examples_dir()).join("InventoryRedisReserved.json"));
    let env: Envelope<StockChangeData> = serde_json::from_value(value).unwrap();

    let err = env
        .check("io.stocksvr.inventory.InventoryRedisConfirmed")
        .unwrap_err();
    assert!(matches!(err, EventError::KindMismatch { .. }), "{err}");

    let mut wrong_type = env.clone();
    wrong_type.event_type = "InventoryRedisConfirmed".into();
    let err = wrong_type
        .check("io.stocksvr.inventory.InventoryRedisReserved")
        .unwrap_err();
    assert!(matches!(err, EventError::EventTypeMismatch { .. }), "{err}");

    let mut wrong_key = env;
    wrong_key.partition_key = "90000001".into();
    let err = wrong_key
        .check("io.stocksvr.inventory.InventoryRedisReserved")
        .unwrap_err();
    assert!(
        matches!(err, EventError::PartitionKeyMismatch { .. }),
        "{err}"
    );
}

#[test]
fn enums_use_the_avro_symbol_names() {
    assert_eq!(
        serde_json::to_value(OrderType::Scheduled).unwrap(),
        "SCHEDULED"
    );
    assert_eq!(serde_json::to_value(StockAction::Refund).unwrap(), "REFUND");
    assert_eq!(OrderType::Instant.to_string(), "INSTANT");
    assert!(serde_json::from_value::<OrderType>(Value::from("instant")).is_err());
}

/// Fields that have an Avro default may be missing in a JSON payload, as they would be
/// filled by Avro schema resolution when reading data written before the field existed.
#[test]
fn defaulted_fields_may_be_absent() {
    let mut value = read_json(&Path::new(&examples_dir()).join("InventoryCanceled.json"));
    let data = value["data"].as_object_mut().unwrap();
    data.remove("empty_rollback");
    data.remove("reason_code");
    let env: Envelope<InventoryCanceledData> = serde_json::from_value(value).unwrap();
    assert!(!env.data.empty_rollback);
    assert_eq!(env.data.reason_code, None);
}

#[test]
fn dead_wal_operation_is_keyed_by_bucket() {
    let value = read_json(&Path::new(&examples_dir()).join("InventoryOperationDead.wal.json"));
    let env: Envelope<InventoryOperationDeadData> = serde_json::from_value(value).unwrap();
    assert_eq!(env.data.order_id, None);
    assert_eq!(env.data.partition_key(), env.data.stock_bucket_id);
}

// ---- a minimal Avro-JSON conformance check (only the constructs our schemas use) ----

fn qualify(name: &str, ns: &str) -> String {
    if name.contains('.') || ns.is_empty() {
        name.to_owned()
    } else {
        format!("{ns}.{name}")
    }
}

/// Records and enums with their full names, as written in a schema file.
fn collect_named(schema: &Value, ns: &str, out: &mut Vec<(String, Value)>) {
    match schema {
        Value::Array(branches) => branches.iter().for_each(|b| collect_named(b, ns, out)),
        Value::Object(obj) => match obj.get("type").and_then(Value::as_str) {
            Some("record") | Some("enum") => {
                let ns = obj.get("namespace").and_then(Value::as_str).unwrap_or(ns);
                let full = qualify(obj["name"].as_str().unwrap(), ns);
                out.push((full.clone(), schema.clone()));
                let inner_ns = full.rsplit_once('.').map(|(n, _)| n).unwrap_or("");
                for field in obj
                    .get("fields")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    collect_named(&field["type"], inner_ns, out);
                }
            }
            Some("array") => collect_named(&obj["items"], ns, out),
            _ => {}
        },
        _ => {}
    }
}

/// Checks example values against a schema, knowing the records and enums it named so far.
#[derive(Default, Clone)]
struct Conformance {
    names: BTreeMap<String, Value>,
}

impl Conformance {
    fn check(&mut self, schema: &Value, value: &Value, ns: &str, at: &str) -> Result<(), String> {
        match schema {
            Value::String(t) => self.named(t, value, ns, at),
            Value::Array(branches) => {
                if branches
                    .iter()
                    .any(|b| self.clone().check(b, value, ns, at).is_ok())
                {
                    Ok(())
                } else {
                    Err(format!("{at}: {value} matches no branch of {schema}"))
                }
            }
            Value::Object(obj) => match obj["type"].as_str().unwrap_or_default() {
                "record" => self.record(schema, value, ns, at),
                "enum" => {
                    let ns = obj.get("namespace").and_then(Value::as_str).unwrap_or(ns);
                    self.names
                        .insert(qualify(obj["name"].as_str().unwrap(), ns), schema.clone());
                    let symbol = value
                        .as_str()
                        .ok_or(format!("{at}: expected enum symbol"))?;
                    obj["symbols"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|s| s == symbol)
                        .then_some(())
                        .ok_or(format!("{at}: {symbol} is not a symbol of {}", obj["name"]))
                }
                "array" => {
                    let items = value.as_array().ok_or(format!("{at}: expected array"))?;
                    for (i, item) in items.iter().enumerate() {
                        self.check(&obj["items"], item, ns, &format!("{at}[{i}]"))?;
                    }
                    Ok(())
                }
                other => Err(format!(
                    "{at}: schema construct {other:?} not supported by this check"
                )),
            },
            _ => Err(format!("{at}: bad schema {schema}")),
        }
    }

    /// A primitive type, or a record or enum named earlier in the schema.
    fn named(&mut self, type_name: &str, value: &Value, ns: &str, at: &str) -> Result<(), String> {
        let fits = match type_name {
            "null" => value.is_null(),
            "boolean" => value.is_boolean(),
            "string" => value.is_string(),
            "int" => value.as_i64().is_some_and(|n| i32::try_from(n).is_ok()),
            "long" => value.as_i64().is_some(),
            named => {
                let full = qualify(named, ns);
                let def = self
                    .names
                    .get(&full)
                    .cloned()
                    .ok_or(format!("{at}: unknown type {full}"))?;
                return self.check(&def, value, ns, at);
            }
        };
        fits.then_some(())
            .ok_or(format!("{at}: expected {type_name}"))
    }

    /// A record: every declared field present (examples spell out every field), none other,
    /// each conforming to its type.
    fn record(&mut self, schema: &Value, value: &Value, ns: &str, at: &str) -> Result<(), String> {
        let ns = schema
            .get("namespace")
            .and_then(Value::as_str)
            .unwrap_or(ns)
            .to_owned();
        let full = qualify(schema["name"].as_str().unwrap(), &ns);
        self.names.insert(full.clone(), schema.clone());
        let inner_ns = full
            .rsplit_once('.')
            .map(|(n, _)| n.to_owned())
            .unwrap_or_default();
        let map = value
            .as_object()
            .ok_or(format!("{at}: expected object for {full}"))?;
        let fields = schema["fields"].as_array().unwrap();
        let declared: BTreeSet<&str> = fields.iter().map(|f| f["name"].as_str().unwrap()).collect();
        let present: BTreeSet<&str> = map.keys().map(String::as_str).collect();
        if declared != present {
            return Err(format!(
                "{at}: {full} fields {declared:?} but example has {present:?} (examples spell out every field)"
            ));
        }
        for field in fields {
            let name = field["name"].as_str().unwrap();
            self.check(
                &field["type"],
                &map[name],
                &inner_ns,
                &format!("{at}.{name}"),
            )?;
        }
        Ok(())
    }
}
