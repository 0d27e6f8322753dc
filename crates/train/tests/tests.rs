//! Integration tests of gradwire-train (one binary; see each module).

mod distributed;
mod elastic;
mod lenet_cpu;
mod models;
mod overlap;
mod own_model;
mod util;
