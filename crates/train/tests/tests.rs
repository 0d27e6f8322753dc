//! Integration tests of gradwire-train (one binary; see each module).

mod distributed;
mod models;
mod overlap;
mod util;
