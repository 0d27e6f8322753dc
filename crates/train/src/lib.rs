//! gradwire-train: models, data sets, optimizers and the data-parallel trainer.
#![deny(missing_docs)]
