//! gradwire-ps: the parameter server (DistBelief, MXNet KVStore).
//!
//! This layer owns server shards, the worker-side KVStore client, consistency modes,
//! server-side updaters and the PS wire protocol. It must never know what a model or a data
//! set is: it stores and updates named f32 tensors.
#![deny(missing_docs)]
