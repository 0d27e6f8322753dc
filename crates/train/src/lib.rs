//! gradwire-train: models, data sets, optimizers and the data-parallel trainer.
//!
//! This crate owns what a rank computes: the real data sets (Fashion-MNIST, MNIST,
//! Shakespeare, CIFAR-10 format) and their per-rank sharding ([`data`]), the models (MLP,
//! LeNet-5, ResNet-8, char-LSTM) behind the framework-free [`Model`] trait of flat `f32`
//! parameters and gradients ([`model`]; burn with its flex CPU backend stays inside), our
//! own optimizers on flat buffers ([`optim`]), and the training loop ([`Trainer`]) that
//! meets communication at exactly one seam, [`GradientSync`]. It never opens a socket, parses
//! a command line, or knows how gradients are compressed or moved: a [`GradientSync`] (such as
//! [`EngineSync`], gradwire-engine over any `Transport`) does that.
//!
//! ```no_run
//! use gradwire_train::{data::DatasetKind, EngineSync, ModelKind, TrainConfig, Trainer};
//! use gradwire_transport::local::Local;
//!
//! gradwire_train::init_threads(1);
//! let data = DatasetKind::FashionMnist.load(&gradwire_train::data::default_data_dir(), 64)?;
//! let model = ModelKind::LeNet.build(data.shape(), 42)?;
//! let sync = EngineSync::dense(Local::world(1).pop().unwrap(), &model.tensors())?;
//! let config = TrainConfig { seed: 42, ..TrainConfig::default() };
//! let mut trainer = Trainer::new(model, sync, config, data.train.len())?;
//! let stats = trainer.run_epoch(&data, &mut |s| if s.step % 100 == 0 { println!("{}", s.loss) })?;
//! println!("{}", serde_json::to_string(&stats).unwrap());
//! # Ok::<(), gradwire_train::Error>(())
//! ```
#![deny(missing_docs)]

pub mod data;
mod error;
pub mod model;
pub mod optim;
pub mod sandblaster;
pub mod sync;
mod threads;
mod trainer;

pub use error::{Error, Result};
pub use model::{Eval, MlpHidden, Model, ModelKind};
pub use model::{ParamTensor, TensorRole};
pub use optim::{LrDecay, Optimizer, OptimizerConfig, OptimizerKind, OptimizerState};
pub use sync::{
    EngineConfig, EngineSync, GradientSync, MomentumConfig, Phase, PsConfig, PsSync, Rule,
    SyncStats, SyncStrategy,
};
pub use threads::{init_threads, num_threads, threads_per_worker};
pub use trainer::{evaluate, EpochStats, EvalMode, StepInfo, TrainConfig, Trainer};
