// `sqlx::migrate!` embeds `migrations/` at compile time, but on stable Rust it cannot tell
// Cargo to watch that folder: a new migration alone would leave a stale binary that never
// applies it. This does (sqlx's documented build script).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
