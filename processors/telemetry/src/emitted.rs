//! The catalog against its call sites: every `counter!`, `gauge!`, `histogram!` and
//! `zero_counter` under `processors/*/src` names a catalog constant, with the macro of its
//! type, exactly its declared label names, and only declared values where a label's values
//! are known; and every declared metric has a call site (or is in [`NOT_EMITTED_YET`]).
//! A metric that is declared but never emitted shows 0 or "no data" for ever, which reads as
//! "nothing happened"; a label the catalog does not declare splits a series in two.

use super::{Kind, CATALOG, CONSTANTS, NOT_EMITTED_YET};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One call site.
#[derive(Debug)]
struct Site {
    place: String,
    macro_kind: Kind,
    /// The `names::` constant, or the raw first argument when it is not one.
    name: Result<String, String>,
    /// Label names and their literal values (None: not a literal); None when the labels
    /// are built elsewhere (`&labels`).
    labels: Option<Vec<(String, Option<String>)>>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text between the parenthesis at `open` and its match, skipping string literals.
fn arguments(text: &str, open: usize) -> Option<&str> {
    let bytes = text.as_bytes();
    let (mut depth, mut i, mut in_str) = (0usize, open, false);
    while i < bytes.len() {
        let b = bytes[i];
        if in_str {
            match b {
                b'\\' => i += 1,
                b'"' => in_str = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_str = true,
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(&text[open + 1..i]);
                    }
                }
                _ => {}
            }
        }
        i += 1;
    }
    None
}

/// Splits at top-level commas.
fn split_top(args: &str) -> Vec<&str> {
    let bytes = args.as_bytes();
    let (mut depth, mut in_str, mut start, mut out) = (0i32, false, 0, Vec::new());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_str {
            match b {
                b'\\' => i += 1,
                b'"' => in_str = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_str = true,
                b'(' | b'[' | b'{' => depth += 1,
                b')' | b']' | b'}' => depth -= 1,
                b',' if depth == 0 => {
                    out.push(args[start..i].trim());
                    start = i + 1;
                }
                _ => {}
            }
        }
        i += 1;
    }
    let last = args[start..].trim();
    if !last.is_empty() {
        out.push(last);
    }
    out
}

fn string_literal(s: &str) -> Option<String> {
    let s = s.trim();
    (s.len() >= 2 && s.starts_with('"') && s.ends_with('"') && !s[1..s.len() - 1].contains('"'))
        .then(|| s[1..s.len() - 1].to_string())
}

fn constant(expr: &str) -> Result<String, String> {
    let expr = expr.trim();
    match expr.rsplit_once("names::") {
        Some((_, konst)) if konst.chars().all(|c| c.is_ascii_uppercase() || c == '_') => {
            Ok(konst.to_string())
        }
        _ => Err(expr.to_string()),
    }
}

/// `"key" => value` pairs of a macro call.
fn macro_labels(rest: &[&str]) -> Option<Vec<(String, Option<String>)>> {
    if rest.is_empty() {
        return Some(Vec::new());
    }
    let mut labels = Vec::new();
    for part in rest {
        let (key, value) = part.split_once("=>")?;
        labels.push((string_literal(key)?, string_literal(value)));
    }
    Some(labels)
}

/// `&[("key", value), ...]` of a `zero_counter` call.
fn tuple_labels(arg: &str) -> Option<Vec<(String, Option<String>)>> {
    let inner = arg.trim().strip_prefix("&[")?.strip_suffix(']')?;
    let mut labels = Vec::new();
    for tuple in split_top(inner) {
        let tuple = tuple.strip_prefix('(')?.strip_suffix(')')?;
        let parts = split_top(tuple);
        labels.push((
            string_literal(parts.first()?)?,
            parts.get(1).and_then(|v| string_literal(v)),
        ));
    }
    Some(labels)
}

fn sites_in(file: &Path, text: &str, out: &mut Vec<Site>) {
    let patterns = [
        ("counter!(", Kind::Counter),
        ("gauge!(", Kind::Gauge),
        ("histogram!(", Kind::Histogram),
        ("zero_counter(", Kind::Counter),
    ];
    for (pattern, macro_kind) in patterns {
        for (at, _) in text.match_indices(pattern) {
            // `describe_counter!(`, `fn zero_counter(` and comments are not call sites.
            let before = &text[..at];
            if before
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
                || before.ends_with("fn ")
                || before.rsplit('\n').next().is_some_and(|l| l.contains("//"))
            {
                continue;
            }
            let line = before.matches('\n').count() + 1;
            let place = format!("{}:{line}", file.display());
            let Some(args) = arguments(text, at + pattern.len() - 1) else {
                continue;
            };
            let parts = split_top(args);
            let Some(first) = parts.first() else {
                continue;
            };
            let labels = if pattern == "zero_counter(" {
                parts.get(1).and_then(|a| tuple_labels(a))
            } else {
                macro_labels(&parts[1..])
            };
            out.push(Site {
                place,
                macro_kind,
                name: constant(first),
                labels,
            });
        }
    }
}

#[test]
fn every_metric_is_emitted_as_declared() {
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let processors = Path::new(&dir).join("..");
    let mut files = Vec::new();
    for krate in std::fs::read_dir(&processors)
        .expect("processors/")
        .flatten()
    {
        if krate.file_name() == "telemetry" {
            continue;
        }
        rust_files(&krate.path().join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut sites = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable source");
        let shown = file.strip_prefix(&processors).unwrap_or(file);
        sites_in(shown, &text, &mut sites);
    }

    let by_constant: BTreeMap<&str, &str> = CONSTANTS.iter().copied().collect();
    let mut problems = Vec::new();
    let mut emitted = BTreeSet::new();
    for site in &sites {
        let konst = match &site.name {
            Ok(k) => k,
            Err(raw) => {
                problems.push(format!(
                    "{}: metric {raw} is not a names:: constant of the catalog",
                    site.place
                ));
                continue;
            }
        };
        let Some(name) = by_constant.get(konst.as_str()) else {
            problems.push(format!("{}: names::{konst} is not declared", site.place));
            continue;
        };
        let Some(metric) = CATALOG.iter().find(|m| m.name == *name) else {
            continue;
        };
        emitted.insert(metric.name);
        if metric.kind != site.macro_kind {
            problems.push(format!(
                "{}: {} is a {} but is emitted as a {}",
                site.place,
                metric.name,
                metric.kind.name(),
                site.macro_kind.name()
            ));
        }
        let Some(labels) = &site.labels else {
            continue; // built elsewhere, e.g. the lag exporter's shared label vector
        };
        let got: BTreeSet<&str> = labels.iter().map(|(k, _)| k.as_str()).collect();
        let want: BTreeSet<&str> = metric.labels.iter().map(|l| l.name).collect();
        if got != want {
            problems.push(format!(
                "{}: {} emitted with labels {got:?}, declared {want:?}",
                site.place, metric.name
            ));
        }
        for (key, value) in labels {
            let (Some(value), Some(label)) =
                (value, metric.labels.iter().find(|l| l.name == key.as_str()))
            else {
                continue;
            };
            if !label.values.is_empty() && !label.values.contains(&value.as_str()) {
                problems.push(format!(
                    "{}: {}{{{key}=\"{value}\"}}: the catalog declares only {:?}",
                    site.place, metric.name, label.values
                ));
            }
        }
    }
    for m in CATALOG {
        let pending = NOT_EMITTED_YET.iter().any(|(n, _)| *n == m.name);
        match (emitted.contains(m.name), pending) {
            (false, false) => problems.push(format!(
                "{} is declared but nothing under processors/*/src emits it",
                m.name
            )),
            (true, true) => problems.push(format!(
                "{} is emitted now: remove it from NOT_EMITTED_YET",
                m.name
            )),
            _ => {}
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_scanner_reads_the_call_shapes_in_use() {
    let text = r#"
        metrics::counter!(names::A, "topic" => row.topic.clone(), "class" => "invalid").increment(1);
        metrics::gauge!(names::B).set(1.0);
        metrics::describe_counter!(m.name, m.help);
        metrics::gauge!(names::C, &labels).set(0.0);
        // metrics::counter!(names::D).increment(1);
        stocksvr_telemetry::zero_counter(
            names::E,
            &[("processor", name.to_string()), ("topic", t.clone())],
        );
        metrics::histogram!("stocksvr_raw_seconds").record(1.0);
    "#;
    let mut sites = Vec::new();
    sites_in(Path::new("x.rs"), text, &mut sites);
    let names: Vec<_> = sites.iter().map(|s| s.name.clone()).collect();
    assert_eq!(
        names,
        [
            Ok("A".to_string()),
            Ok("B".to_string()),
            Ok("C".to_string()),
            Err("\"stocksvr_raw_seconds\"".to_string()),
            Ok("E".to_string()),
        ]
    );
    assert_eq!(
        sites[0].labels,
        Some(vec![
            ("topic".into(), None),
            ("class".into(), Some("invalid".into()))
        ])
    );
    assert_eq!(sites[1].labels, Some(vec![]));
    assert_eq!(sites[2].labels, None);
    assert_eq!(
        sites[4].labels,
        Some(vec![("processor".into(), None), ("topic".into(), None)])
    );
    assert_eq!(sites[4].macro_kind, Kind::Counter);
}
