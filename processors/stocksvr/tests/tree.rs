//! Checks of the repository itself, so the structure the project chose does not erode one
//! change at a time: no source file over 700 lines and no function over 100 outside tests, no
//! cycle between the files of a crate, no stored code spelled in SQL (they are bound from
//! `stocksvr_core::codes`), every path and link in the README and `docs/` exists, and nothing
//! cites a document outside the repository. Plain text scanning: no server, no build of the
//! code it reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 100;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            files_under(&p, ext, out);
        } else if p.extension().is_some_and(|x| x == ext) {
            out.push(p);
        }
    }
}

/// `(crate, path under src/, text)` of every library and binary source file.
fn rust_sources() -> Vec<(String, PathBuf, String)> {
    let mut out = Vec::new();
    let processors = repo().join("processors");
    let mut crates: Vec<_> = std::fs::read_dir(&processors)
        .expect("processors/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("src").is_dir())
        .collect();
    crates.sort();
    for dir in crates {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut files = Vec::new();
        files_under(&dir.join("src"), "rs", &mut files);
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            let rel = f.strip_prefix(dir.join("src")).unwrap().to_path_buf();
            out.push((name.clone(), rel, text));
        }
    }
    out
}

/// The lines before a file's `#[cfg(test)] mod …`: what runs in production.
fn production_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim_start().starts_with("#[cfg(test)]") {
            let next = lines.get(i + 1).map_or("", |n| n.trim_start());
            if next.starts_with("mod ") || next.starts_with("pub mod ") {
                return lines[..i].to_vec();
            }
        }
    }
    lines
}

/// A line without its string and char literals and its `//` comment, for brace counting and
/// path scanning.
fn code_of(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    let mut in_str = false;
    while let Some(c) = chars.next() {
        if in_str {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_str = false;
                    out.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            '\'' => {
                // A char literal ('{', '\n') or a lifetime ('a): skip a literal whole.
                let rest: String = chars.clone().take(3).collect();
                if rest.starts_with('\\') {
                    let skip = rest.find('\'').map_or(0, |i| i + 1).max(3);
                    for _ in 0..skip {
                        chars.next();
                    }
                } else if rest.chars().nth(1) == Some('\'') {
                    chars.next();
                    chars.next();
                }
                out.push(' ');
            }
            _ => out.push(c),
        }
    }
    out
}

fn fn_name(line: &str) -> Option<&str> {
    let t = line.trim_start();
    let mut words = t.split_whitespace().peekable();
    while let Some(w) = words.next() {
        match w {
            "pub" | "async" | "const" | "unsafe" | "extern" => continue,
            w if w.starts_with("pub(") => continue,
            "fn" => {
                let name = words.next()?;
                let end = name.find(['(', '<']).unwrap_or(name.len());
                return Some(&name[..end]);
            }
            _ => return None,
        }
    }
    None
}

/// `(first line, length, name)` of every function in `lines`.
fn functions(lines: &[&str]) -> Vec<(usize, usize, String)> {
    let code: Vec<String> = lines.iter().map(|l| code_of(l)).collect();
    let mut out = Vec::new();
    for i in 0..code.len() {
        let Some(name) = fn_name(&code[i]) else {
            continue;
        };
        let (mut depth, mut started) = (0i32, false);
        for (j, c) in code.iter().enumerate().skip(i) {
            for ch in c.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if started && depth <= 0 {
                out.push((i + 1, j - i + 1, name.to_string()));
                break;
            }
            if !started && c.trim_end().ends_with(';') {
                break;
            }
        }
    }
    out
}

#[test]
fn no_source_file_is_over_700_lines() {
    let big: Vec<String> = rust_sources()
        .iter()
        .filter(|(_, _, t)| t.lines().count() > MAX_FILE_LINES)
        .map(|(c, p, t)| format!("{c}/src/{}: {} lines", p.display(), t.lines().count()))
        .collect();
    assert!(
        big.is_empty(),
        "split these along their seams:\n{}",
        big.join("\n")
    );
}

#[test]
fn no_function_is_over_100_lines_outside_tests() {
    let mut big = Vec::new();
    for (c, p, t) in rust_sources() {
        if p.file_name().is_some_and(|f| f == "tests.rs") || p.starts_with("tests") {
            continue;
        }
        for (line, len, name) in functions(&production_lines(&t)) {
            if len > MAX_FN_LINES {
                big.push(format!(
                    "{c}/src/{}:{line} {name}: {len} lines",
                    p.display()
                ));
            }
        }
    }
    assert!(
        big.is_empty(),
        "split these into named steps:\n{}",
        big.join("\n")
    );
}

#[test]
fn the_function_scanner_measures_what_it_should() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '{';\n}\nfn b();\npub async fn c<T>(x: T) {\n}\n";
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        functions(&lines),
        [(1, 4, "a".to_string()), (6, 2, "c".to_string())]
    );
}

/// The module path (`service::step`) of a file under `src/`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The modules of its own crate a file refers to (`crate::x::…`, `use crate::{x, …}`,
/// `super::x`), parents and children left out: a parent declaring its children is not a cycle.
fn references(module: &str, code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let longest = |path: &[&str]| {
        (1..=path.len())
            .rev()
            .map(|k| path[..k].join("::"))
            .find(|m| modules.contains(m))
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let path: Vec<&str> = item.trim().split("::").collect();
                refs.extend(longest(&path));
            }
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
        refs.extend(longest(&path));
    }
    let parent: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let parent = &parent[..parent.len().saturating_sub(1)];
    let mut rest = code;
    while let Some(i) = rest.find("super::") {
        rest = &rest[i + 7..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let mut path: Vec<&str> = parent.to_vec();
        path.push(&rest[..end]);
        refs.extend(longest(&path));
    }
    refs.into_iter()
        .filter(|r| {
            let related = r == module
                || r.starts_with(&format!("{module}::"))
                || module.starts_with(&format!("{r}::"))
                || module.is_empty()
                || r.is_empty();
            !related
        })
        .collect()
}

/// Groups of modules that reach each other (Tarjan's strongly connected components).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on.insert(v);
            let graph = self.graph;
            for w in graph.get(v).into_iter().flatten() {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(lw);
                } else if self.on.contains(w.as_str()) {
                    let iw = self.index[w.as_str()];
                    let lv = self.low.get_mut(v).unwrap();
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    group.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    group.sort();
                    self.out.push(group);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.out
}

#[test]
fn no_cycle_between_the_files_of_a_crate() {
    let mut by_crate: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (c, p, t) in rust_sources() {
        let code: Vec<String> = production_lines(&t).iter().map(|l| code_of(l)).collect();
        by_crate
            .entry(c)
            .or_default()
            .push((module_of(&p), code.join("\n")));
    }
    let mut found = Vec::new();
    for (c, files) in by_crate {
        let modules: BTreeSet<String> = files.iter().map(|(m, _)| m.clone()).collect();
        let graph: BTreeMap<String, BTreeSet<String>> = files
            .iter()
            .map(|(m, code)| (m.clone(), references(m, code, &modules)))
            .collect();
        for group in cycles(&graph) {
            found.push(format!("{c}: {}", group.join(" <-> ")));
        }
    }
    assert!(
        found.is_empty(),
        "files that depend on each other (move what both need to a module of its own):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cycle_finder_finds_cycles_and_only_cycles() {
    let modules: BTreeSet<String> = ["a", "b", "c", "c::d"].map(String::from).into();
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", references("a", "use crate::b::X;", &modules)),
        ("b", references("b", "use crate::{c::d::Y, a};", &modules)),
        ("c", references("c", "use crate::c::d::Z;", &modules)),
        ("c::d", references("c::d", "use super::Q;", &modules)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    assert_eq!(cycles(&graph), [vec!["a".to_string(), "b".to_string()]]);
}

/// The string literals of a line of production code, joined for statements split over lines
/// with `\`.
fn sql_literals(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let mut chars = production_lines(text)
        .join("\n")
        .chars()
        .collect::<Vec<_>>()
        .into_iter();
    let mut prev = ' ';
    while let Some(c) = chars.next() {
        match (&mut current, c) {
            (None, '"') if prev != '\'' => current = Some(String::new()),
            (None, '/') if prev == '/' => {
                for n in chars.by_ref() {
                    if n == '\n' {
                        break;
                    }
                }
            }
            (None, _) => {}
            (Some(s), '\\') => {
                if let Some(n) = chars.next() {
                    if n == '\n' {
                        s.push(' ');
                    } else {
                        s.push(n);
                    }
                }
            }
            (Some(_), '"') => out.extend(current.take()),
            (Some(s), _) => s.push(c),
        }
        prev = c;
    }
    out.into_iter()
        .filter(|s| {
            let u = s.to_ascii_uppercase();
            [
                "SELECT ", "UPDATE ", "INSERT ", "DELETE ", " WHERE ", " SET ",
            ]
            .iter()
            .any(|k| u.contains(k))
        })
        .collect()
}

/// Where a SQL text compares a status, action or flag column with a number or a stored name.
fn literal_codes(sql: &str) -> Vec<String> {
    let mut spaced = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' | '>' | '!'
                if chars.peek() == Some(&'=') || (c == '<' && chars.peek() == Some(&'>')) =>
            {
                spaced.push(' ');
                spaced.push(c);
                spaced.extend(chars.next());
                spaced.push(' ');
            }
            '=' | '(' | ')' | ',' => {
                spaced.push(' ');
                spaced.push(c);
                spaced.push(' ');
            }
            _ => spaced.push(c),
        }
    }
    let words: Vec<&str> = spaced.split_whitespace().collect();
    let mut hits = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let column = w.rsplit('.').next().unwrap_or(w).to_ascii_lowercase();
        if !(column.ends_with("status") || column == "action") {
            continue;
        }
        let mut k = i + 1;
        if words.get(k).is_some_and(|x| x.eq_ignore_ascii_case("NOT")) {
            k += 1;
        }
        let Some(op) = words.get(k) else { continue };
        if !["=", "<>", "!=", ">=", "<=", "IN"].contains(&op.to_ascii_uppercase().as_str()) {
            continue;
        }
        k += 1;
        if words.get(k) == Some(&"(") {
            k += 1;
        }
        let Some(value) = words.get(k) else { continue };
        if value.starts_with(|c: char| c.is_ascii_digit()) || value.starts_with('\'') {
            hits.push(format!("{w} {op} {value}"));
        }
    }
    hits
}

#[test]
fn no_stored_code_is_spelled_in_sql() {
    let mut found = Vec::new();
    for (c, p, t) in rust_sources() {
        for sql in sql_literals(&t) {
            for hit in literal_codes(&sql) {
                found.push(format!("{c}/src/{}: {hit}", p.display()));
            }
        }
        for (n, line) in production_lines(&t).iter().enumerate() {
            let code = code_of(line);
            // A stored column read into a row (`b.stock_status == 1`), not an HTTP status.
            for op in ["_status == ", "_status != ", ".status == ", ".status != "] {
                if let Some(i) = code.find(op) {
                    if code[i + op.len()..].starts_with(|c: char| c.is_ascii_digit()) {
                        found.push(format!(
                            "{c}/src/{}:{}: {}",
                            p.display(),
                            n + 1,
                            line.trim()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "bind the code from stocksvr_core::codes instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_sql_scanner_flags_literal_codes_and_passes_bound_ones() {
    assert_eq!(
        literal_codes("SELECT id FROM t WHERE o.status IN (20, 40) AND x = ?"),
        ["o.status IN 20"]
    );
    assert_eq!(
        literal_codes("UPDATE t SET a = 1 WHERE status=30"),
        ["status = 30"]
    );
    assert_eq!(literal_codes("WHERE bucket_status <> 30").len(), 1);
    assert_eq!(literal_codes("WHERE status NOT IN (10, 70)").len(), 1);
    assert_eq!(literal_codes("WHERE w.action IN (1, 2)").len(), 1);
    assert_eq!(literal_codes("AND outcome_status = 'SUCCEEDED'").len(), 1);
    assert!(literal_codes("WHERE status IN (?, ?) AND action = ? AND sync_status = ?").is_empty());
    let text = "const Q: &str = \"SELECT a FROM t \\\n WHERE status = 30\";\n";
    assert_eq!(sql_literals(text).len(), 1);
    assert_eq!(literal_codes(&sql_literals(text)[0]).len(), 1);
}

/// Markdown files the users read: the README and everything under docs/.
fn user_docs() -> Vec<PathBuf> {
    let mut docs = vec![repo().join("README.md")];
    files_under(&repo().join("docs"), "md", &mut docs);
    docs.sort();
    docs
}

/// Targets of `[text](target)` links and repository paths in backticks.
fn cited_paths(text: &str) -> Vec<String> {
    const ROOTS: [&str; 14] = [
        "processors/",
        "scripts/",
        "docs/",
        "lua/",
        "schemas/",
        "migrations/",
        "tests/",
        "config/",
        "prometheus/",
        "grafana/",
        "stack/",
        "topics.yaml",
        "docker-compose.yml",
        ".ci/",
    ];
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find(')').unwrap_or(rest.len());
        let target = rest[..end].split('#').next().unwrap_or("").trim();
        if !(target.is_empty()
            || target.starts_with("http://")
            || target.starts_with("https://")
            || target.starts_with("mailto:"))
        {
            out.push(target.to_string());
        }
    }
    for (i, chunk) in text.split('`').enumerate() {
        if i % 2 == 0 || chunk.contains(char::is_whitespace) {
            continue;
        }
        let path = chunk.trim_end_matches([':', '.', ',']);
        let wild = path.contains(['*', '<', '{', '…', '$', '|']) || path.contains("...");
        if !wild && ROOTS.iter().any(|r| path.starts_with(r)) {
            out.push(format!("/{path}"));
        }
    }
    out
}

#[test]
fn every_path_and_link_in_the_readme_and_docs_exists() {
    let mut missing = Vec::new();
    for doc in user_docs() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for target in cited_paths(&text) {
            let path = match target.strip_prefix('/') {
                Some(from_root) => repo().join(from_root),
                None => doc.parent().unwrap().join(&target),
            };
            if !path.exists() {
                let shown = doc
                    .strip_prefix(repo())
                    .unwrap_or(&doc)
                    .display()
                    .to_string();
                missing.push(format!("{shown}: {target}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}

/// `../shared/…`, or a section of the source design (`seed §10.2`, `seed 13.2`), which users
/// of the repository do not have. A random seed (`--seed 1`) is not a citation.
fn cites_outside(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    if l.contains("../shared") || l.contains("seed §") || l.contains("seed 00") {
        return true;
    }
    l.match_indices("seed ").any(|(i, _)| {
        let rest = &l[i + 5..];
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        digits > 0
            && rest[digits..].starts_with('.')
            && rest[digits + 1..].starts_with(|c: char| c.is_ascii_digit())
    })
}

#[test]
fn the_citation_check_tells_sections_from_random_seeds() {
    assert!(cites_outside("-- create a day's bucket (seed 12.1)."));
    assert!(cites_outside("//! the failure windows of seed §10.2"));
    assert!(cites_outside("see [`../shared/DESIGN.md`]"));
    assert!(cites_outside("the thresholds of seed 003"));
    assert!(!cites_outside("scripts/chaos --minutes 2 --seed 1 --ci"));
    assert!(!cites_outside("a seeded run (seed 7) found nothing"));
}

#[test]
fn nothing_cites_a_document_outside_the_repository() {
    let mut files = user_docs();
    // Not migrations/: an applied migration is checked by its checksum, so even a comment in
    // it is history that cannot change.
    for dir in [
        "processors",
        "lua",
        "scripts",
        "tests",
        "config",
        "stack",
        "schemas",
        "prometheus",
    ] {
        for ext in ["rs", "lua", "py", "md", "toml", "sh", "yml", "yaml"] {
            files_under(&repo().join(dir), ext, &mut files);
        }
    }
    let this_file = Path::new(file!()).file_name().unwrap().to_owned();
    let skipped = ["target", ".stack", "venv-harness", "__pycache__"];
    let mut found = Vec::new();
    for f in files {
        if f.file_name() == Some(&this_file)
            || f.components()
                .any(|c| skipped.iter().any(|s| c.as_os_str() == *s))
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if cites_outside(line) {
                let shown = f.strip_prefix(repo()).unwrap_or(&f).display().to_string();
                found.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "cite docs/design.md (or another file of the repository) instead:\n{}",
        found.join("\n")
    );
}
