//! Embeds `schemas/catalog.yaml` and every `schemas/*.avsc` into the binary, so a deployed
//! `stocksvr` registers and encodes exactly the contracts it was built with.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    // Read at run time, not with env!(): a build-script binary cached in a shared target dir
    // may have been compiled for a checkout at another path.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR set by cargo");
    let dir = Path::new(&manifest).join("../../schemas");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("schemas/ exists beside the workspace")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "avsc"))
        .collect();
    files.sort();
    let mut out = String::from("/// (file name, schema text) of every embedded Avro schema.\n");
    out.push_str("pub static SCHEMA_FILES: &[(&str, &str)] = &[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("utf-8 file name");
        let _ = writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            path.display().to_string()
        );
    }
    out.push_str("];\n");
    let catalog = dir.join("catalog.yaml");
    println!("cargo:rerun-if-changed={}", catalog.display());
    let _ = writeln!(
        out,
        "pub static CATALOG_YAML: &str = include_str!({:?});",
        catalog.display().to_string()
    );
    let dest =
        Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR set by cargo")).join("schemas.rs");
    std::fs::write(dest, out).expect("write embedded schemas");
}
