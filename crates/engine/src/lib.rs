//! gradwire-engine: non-blocking gradient synchronization (Horovod, Aluminum).
//!
//! This layer owns what happens between "a rank has a named gradient tensor" and "every rank
//! holds the reduced tensor": the per-tensor compression policy, negotiation of which tensors
//! are ready, fusion, the progress thread that owns the transport, and the timeline. It must
//! never know what a model, a data set or an optimizer is.
#![deny(missing_docs)]
