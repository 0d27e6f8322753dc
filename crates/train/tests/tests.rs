//! Integration tests of gradwire-train (one binary; see each module).

mod distributed;
mod lenet_cpu;
mod models;
mod overlap;
mod util;
