//! gradwire-train: models, data sets, optimizers and the data-parallel trainer.
//!
//! This crate owns what a rank computes: the real data sets (Fashion-MNIST, MNIST,
//! Shakespeare, CIFAR-10 format) and their per-rank sharding ([`data`]), the models (MLP,
//! LeNet-5, ResNet-8, char-LSTM) behind the framework-free [`Model`] trait of flat `f32`
//! parameters and gradients ([`model`]; burn with its flex CPU backend stays inside), our
//! own optimizers on flat buffers ([`optim`]), and the training loop ([`Trainer`]) that
//! meets communication at exactly one seam, [`GradientSync`]. The trainer never opens a socket,
//! parses a command line, or knows how gradients are compressed or moved: a [`GradientSync`]
//! (such as [`EngineSync`], gradwire-engine over any `Transport`) does that. Two modules stand
//! beside it: [`model::partition`] splits one replica over the ranks of a `Transport` it is
//! given, and [`measure`] times a model, a codec, an engine step and the loopback stack (over
//! TCP on 127.0.0.1) for `gradwire simulate`'s cost model.
//!
//! Bring your own burn model: implement [`Net`] (batch in, logits and targets out) for your
//! `#[derive(Module)]` network, wrap it in [`BurnModel::custom`], and it trains
//! data-parallel through the engine with any codec
//! (`crates/train/examples/own_burn_model.rs` runs this on 2 ranks):
//!
//! ```no_run
//! # use gradwire_train::burn::{self, nn::{Linear, LinearConfig}, prelude::*};
//! # use gradwire_train::{data::{default_data_dir, Batch, DatasetKind}, *};
//! # let transport = gradwire_transport::local::Local::world(1).pop().unwrap();
//! #[derive(Module, Debug)]
//! struct MyNet { fc: Linear }
//! impl Net for MyNet {
//!     fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
//!         let (x, y) = model::flat_images(batch, device).expect("image batches");
//!         Ok((self.fc.forward(x), y))
//!     }
//! }
//! let data = DatasetKind::FashionMnist.load(&default_data_dir(), 64)?;
//! let device = Device::flex().autodiff();
//! let model = BurnModel::custom(MyNet { fc: LinearConfig::new(784, 10).init(&device) }, device, 0);
//! let config = EngineConfig { codec: "qsgd:bits=4".parse().unwrap(), ..EngineConfig::default() };
//! let sync = EngineSync::new(transport, config, &model.tensors(), 1)?;
//! let mut trainer = Trainer::new(Box::new(model), sync, TrainConfig::default(), data.train.len())?;
//! println!("{:?}", trainer.run_epoch(&data, &mut |_| {})?.test_accuracy);
//! # Ok::<(), gradwire_train::Error>(())
//! ```
//!
//! The built-in models work the same way, built from a [`ModelKind`]:
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

pub mod checkpoint;
pub mod data;
pub mod elastic;
mod error;
pub mod measure;
pub mod model;
pub mod optim;
pub mod sandblaster;
pub mod sync;
mod threads;
mod trainer;

/// The burn this crate is built with (0.22, flex CPU backend with autodiff): define your own
/// network with it and train it through [`BurnModel::custom`].
pub use burn;
pub use checkpoint::Checkpoint;
pub use error::{
    ConfigError, Error, HiddenError, HiddenSizesError, LstmOptionError, ModelError, OptimizerError,
    PartitionError, Result,
};
pub use model::{BurnModel, Eval, MlpHidden, Model, ModelKind, Net};
pub use model::{ParamTensor, TensorRole};
pub use optim::{LrDecay, Optimizer, OptimizerConfig, OptimizerKind, OptimizerState};
pub use sync::{
    CheckpointSync, EngineConfig, EngineSync, GradientSync, MomentumConfig, OverlapSync, Phase,
    PsConfig, PsSync, Rule, ServerSync, SyncStats, SyncStrategy,
};
pub use threads::{init_threads, num_threads, threads_per_worker};
pub use trainer::{
    evaluate, steps_per_epoch, EpochStats, EvalMode, StepInfo, TrainConfig, Trainer,
};
