//! The JSON writer and the generic conversion agree on every example, every mutation of
//! one, and every error.

use super::writer::generic_body;
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
    let input = json!({"id": 7, "kind": "B", "note": "x", "items": [{"q": 1}], "again": {"q": 2}});
    let value = json_to_avro(&input, &schema()).expect("converts");
    assert!(value.validate(&schema()));
    assert_eq!(avro_to_json(&value), input);
}

#[test]
fn defaults_fill_missing_optional_fields() {
    let value = json_to_avro(&json!({"id": 1, "kind": "A", "items": []}), &schema()).expect("ok");
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
    let schema = Schema::parse_str(r#"{"type":"map","values":["null","long"]}"#).expect("valid");
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
