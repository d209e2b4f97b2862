//! Where the local stack is: the same layered settings as the binary (defaults, then
//! `STOCKSVR__...` variables, which `scripts/stack env` prints).

use std::path::PathBuf;
use stocksvr_pipeline::config::InfraSettings;

/// The server connections of the local stack. Installs the process's rustls provider first
/// (`stocksvr_pipeline::tls`): every test that reaches a server comes here before it builds
/// an HTTP client, whose TLS set-up needs it even for `http://`.
pub fn infra() -> InfraSettings {
    stocksvr_pipeline::tls::install_crypto_provider();
    InfraSettings::load(None).expect("the STOCKSVR__ variables form a valid configuration")
}

/// The repository root, found from the running test's crate directory. Read at run time: a
/// test binary reused from a shared target dir may have been compiled in another checkout.
pub fn repo_root() -> PathBuf {
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let mut dir = PathBuf::from(manifest);
    while !dir.join("topics.yaml").exists() {
        if !dir.pop() {
            panic!("no topics.yaml above CARGO_MANIFEST_DIR");
        }
    }
    dir
}
