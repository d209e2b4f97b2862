//! `docs/configuration.md` is generated from the settings types, as `docs/metrics.md` is from
//! the metric catalog: every key of every section with its default, its environment variable
//! and the `///` documentation of its field. The defaults come from `Settings` itself (the
//! values the binary starts with); the text comes from the field declarations in the
//! sources, so a setting is documented once, where it is declared.
//!
//! `STOCKSVR_UPDATE_CONFIG_DOC=1 cargo test -p stocksvr --test config_reference` rewrites the
//! file; without it the test fails while the file and the types differ.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use stocksvr::Settings;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A field of a settings struct as declared: its name as serde sees it, the name of its
/// type (the last path segment, inside `Option<…>`), and its `///` lines.
#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// Every `pub struct` of the workspace's sources with its fields; a name declared twice keeps
/// both, and [`fields_of`] refuses the ambiguity only if the settings reach it.
fn structs() -> HashMap<String, Vec<Vec<Field>>> {
    let mut files = Vec::new();
    collect(&repo().join("processors"), &mut files);
    let mut out: HashMap<String, Vec<Vec<Field>>> = HashMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let t = lines[i].trim();
            if let Some(rest) = t.strip_prefix("pub struct ") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if t.ends_with('{') {
                    let (fields, end) = parse_fields(&lines, i + 1);
                    out.entry(name).or_default().push(fields);
                    i = end;
                }
            }
            i += 1;
        }
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "tests" && n != "target") {
                collect(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The fields from `start` to the struct's closing brace, and the index of that brace.
fn parse_fields(lines: &[&str], start: usize) -> (Vec<Field>, usize) {
    let mut fields = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    let mut rename: Option<String> = None;
    for (i, line) in lines.iter().enumerate().skip(start) {
        let t = line.trim();
        if t == "}" {
            return (fields, i);
        }
        if let Some(d) = t.strip_prefix("///") {
            doc.push(d.trim().to_string());
            continue;
        }
        if t.starts_with("#[serde(") && t.contains("rename = \"") {
            let from = t.find("rename = \"").unwrap() + 10;
            rename = t[from..].split('"').next().map(String::from);
            continue;
        }
        if let Some(rest) = t.strip_prefix("pub ") {
            if let Some((name, ty)) = rest.split_once(':') {
                let ty = ty.trim().trim_end_matches(',');
                fields.push(Field {
                    name: rename.take().unwrap_or_else(|| name.trim().to_string()),
                    ty: type_name(ty),
                    doc: doc.join(" "),
                });
            }
        }
        if !t.starts_with("#[") {
            doc.clear();
        }
    }
    (fields, lines.len())
}

/// `Option<stocksvr_x::TlsFiles>` -> `TlsFiles`.
fn type_name(ty: &str) -> String {
    let inner = ty
        .strip_prefix("Option<")
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or(ty);
    inner.rsplit("::").next().unwrap_or(inner).to_string()
}

fn fields_of<'a>(structs: &'a HashMap<String, Vec<Vec<Field>>>, ty: &str) -> Option<&'a [Field]> {
    let found = structs.get(ty)?;
    assert_eq!(
        found.len(),
        1,
        "two settings structs are named {ty}: the reference cannot tell them apart"
    );
    Some(&found[0])
}

fn render_default(v: &Value) -> String {
    match v {
        Value::Null => "unset".into(),
        Value::String(s) if s.is_empty() => "`\"\"`".into(),
        Value::String(s) => format!("`\"{s}\"`"),
        Value::Object(m) if m.is_empty() => "empty".into(),
        Value::Array(a) if a.is_empty() => "empty".into(),
        other => format!("`{other}`"),
    }
}

/// One section's table, and the sections of its nested structs after it.
fn section(
    out: &mut String,
    path: &str,
    defaults: &serde_json::Map<String, Value>,
    fields: &[Field],
    structs: &HashMap<String, Vec<Vec<Field>>>,
) {
    let mut nested = Vec::new();
    let mut rows = Vec::new();
    for f in fields {
        let Some(default) = defaults.get(&f.name) else {
            continue; // not a setting (skipped by serde)
        };
        let key = format!("{path}.{}", f.name);
        if let (Value::Object(inner), Some(sub)) = (default, fields_of(structs, &f.ty)) {
            nested.push((key, inner.clone(), sub.to_vec(), f.doc.clone()));
            continue;
        }
        let env = format!("STOCKSVR__{}", key.to_uppercase().replace('.', "__"));
        let doc = if f.doc.is_empty() {
            "-".into()
        } else {
            f.doc.replace('|', "\\|")
        };
        rows.push(format!(
            "| `{}` | {} | `{env}` | {doc} |",
            f.name,
            render_default(default)
        ));
    }
    if !rows.is_empty() {
        // Top-level sections already have their heading.
        if path.contains('.') {
            out.push_str(&format!("\n### `[{path}]`\n"));
        }
        out.push_str("\n| key | default | environment | meaning |\n|---|---|---|---|\n");
        for r in rows {
            out.push_str(&r);
            out.push('\n');
        }
    }
    for (key, inner, sub, doc) in nested {
        section(out, &key, &inner, &sub, structs);
        if !doc.is_empty() {
            // Placed under the nested table's heading, before its rows.
            let heading = format!("### `[{key}]`\n");
            if let Some(at) = out.rfind(&heading) {
                out.insert_str(at + heading.len(), &format!("\n{doc}\n"));
            }
        }
    }
}

fn reference() -> String {
    let settings = Settings::load_from(None, Some(HashMap::new())).expect("defaults load");
    let Value::Object(defaults) = serde_json::to_value(&settings).expect("settings serialize")
    else {
        panic!("settings serialize to an object");
    };
    let structs = structs();
    let top = fields_of(&structs, "Settings").expect("struct Settings");
    let mut out = String::from(
        "# Configuration\n\n\
         Every setting of `stocksvr`, generated from the settings types (their defaults and \
         the documentation of their fields): `STOCKSVR_UPDATE_CONFIG_DOC=1 cargo test -p \
         stocksvr --test config_reference` rewrites this file, and a test fails while it \
         differs from the code.\n\n\
         Layers, later wins: the defaults below, then a TOML file (`stocksvr --config FILE` or \
         `STOCKSVR_CONFIG=FILE`; [`config/stocksvr.example.toml`](../config/stocksvr.example.toml) \
         holds every key with its default), then environment variables \
         `STOCKSVR__<SECTION>__<KEY>` (double underscores between levels). Unknown keys are \
         refused at start. Secrets (passwords, tokens, URLs with credentials, Kafka \
         properties) are never printed: `stocksvr config` and `GET /admin/config` mask them.\n",
    );
    let mut sections: BTreeMap<usize, String> = BTreeMap::new();
    for (i, f) in top.iter().enumerate() {
        let Some(Value::Object(inner)) = defaults.get(&f.name) else {
            continue;
        };
        let fields = fields_of(&structs, &f.ty)
            .unwrap_or_else(|| panic!("no struct {} for section {}", f.ty, f.name));
        let mut text = String::new();
        text.push_str(&format!("\n## `[{}]`\n", f.name));
        if !f.doc.is_empty() {
            text.push('\n');
            text.push_str(&f.doc);
            text.push('\n');
        }
        section(&mut text, &f.name, inner, fields, &structs);
        sections.insert(i, text);
    }
    for text in sections.into_values() {
        out.push_str(&text);
    }
    out
}

#[test]
fn the_configuration_reference_is_generated_from_the_settings_types() {
    let path = repo().join("docs/configuration.md");
    let want = reference();
    if std::env::var_os("STOCKSVR_UPDATE_CONFIG_DOC").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/configuration.md differs from the settings types: run \
         STOCKSVR_UPDATE_CONFIG_DOC=1 cargo test -p stocksvr --test config_reference"
    );
}

#[test]
fn every_setting_has_its_documentation() {
    let text = reference();
    let undocumented: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("| `") && l.ends_with("| - |"))
        .collect();
    assert!(
        undocumented.is_empty(),
        "write a `///` line on these fields:\n{}",
        undocumented.join("\n")
    );
}
