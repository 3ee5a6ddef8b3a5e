//! Rebuilds the crate when a PostgreSQL migration changes: `sqlx::migrate!` embeds them at
//! compile time, and cargo does not watch that directory by itself.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
