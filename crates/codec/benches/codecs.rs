//! Criterion benches of the codecs (filled in with the codecs).
fn main() {}
