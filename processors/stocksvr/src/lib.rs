//! `stocksvr`: the library behind the single binary. [`serve::run`] starts the HTTP listener
//! and the selected [`roles::Roles`] and stops them together on one shutdown signal, so tests
//! run the whole service in-process on port 0; `main.rs` parses the command line and calls in.

// The boot future nests every processor's future; proving it Send takes more than the
// default 128 levels of trait queries.
#![recursion_limit = "256"]

pub mod acls;
mod boot;
mod callers;
mod listener;
mod probes;
mod reload;
pub mod roles;
pub mod serve;
pub mod settings;
mod tls;

pub use roles::Roles;
pub use settings::Settings;
pub use tls::ring_provider;
