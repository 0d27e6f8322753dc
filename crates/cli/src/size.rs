//! Byte sizes on the command line (`4KiB`, `1MiB`, `16M`, `512`): the collective bench's
//! parser and formatter.

pub use gradwire_collective::bench::{format_size, parse_size};
