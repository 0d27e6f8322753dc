//! The `gradwire` binary.
fn main() {}
