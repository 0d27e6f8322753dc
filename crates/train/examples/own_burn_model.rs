//! A model of your own, trained data-parallel through gradwire: a small burn network defined
//! here (not one of gradwire's built-in models) on Fashion-MNIST, 2 ranks (threads over the
//! in-process transport), every gradient through the engine with QSGD 4-bit. Rank 0 prints
//! one JSON line per epoch (`test_accuracy` among its keys), and checks that the network
//! learned: the last epoch's test accuracy is over 50% (chance is 10%) and, over two epochs
//! or more, the last epoch's training loss is below the first's.
//!
//! ```sh
//! bash scripts/fetch-data.sh
//! cargo run --release -p gradwire-train --example own_burn_model [-- EPOCHS CODEC]
//! ```

use gradwire_train::burn::{
    self,
    nn::{Linear, LinearConfig},
    prelude::*,
    tensor::activation::relu,
};
use gradwire_train::data::{default_data_dir, Batch, DatasetKind};
use gradwire_train::model::flat_images;
use gradwire_train::{
    BurnModel, EngineConfig, EngineSync, GradientSync, Model, Net, TrainConfig, Trainer,
};
use gradwire_transport::local::Local;

/// 784 -> 128 -> ReLU -> 10: the network this example brings.
#[derive(Module, Debug)]
struct SmallNet {
    hidden: Linear,
    out: Linear,
}

impl SmallNet {
    fn new(device: &Device) -> Self {
        SmallNet {
            hidden: LinearConfig::new(784, 128).init(device),
            out: LinearConfig::new(128, 10).init(device),
        }
    }
}

impl Net for SmallNet {
    fn logits(
        &self,
        batch: &Batch,
        device: &Device,
    ) -> gradwire_train::Result<(Tensor<2>, Tensor<1, Int>)> {
        let (x, y) =
            flat_images(batch, device).ok_or_else(|| gradwire_train::Error::BatchMismatch {
                model: "SmallNet",
                batch: batch.kind(),
            })?;
        Ok((self.out.forward(relu(self.hidden.forward(x))), y))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let epochs: u64 = args.next().map_or(Ok(2), |a| a.parse())?;
    let codec = args.next().unwrap_or_else(|| "qsgd:bits=4".to_string());
    let config = EngineConfig {
        codec: codec.parse()?,
        ..EngineConfig::default()
    };
    gradwire_train::init_threads(1);
    let data = std::sync::Arc::new(DatasetKind::FashionMnist.load(&default_data_dir(), 64)?);
    let ranks: Vec<_> = Local::world(2)
        .into_iter()
        .map(|transport| {
            let (data, config) = (data.clone(), config.clone());
            std::thread::spawn(move || -> gradwire_train::Result<Vec<_>> {
                let device = Device::flex().autodiff();
                let model = BurnModel::custom(SmallNet::new(&device), device, 1);
                let sync = EngineSync::new(transport, config, &model.tensors(), 1)?;
                let train = TrainConfig {
                    seed: 1,
                    ..TrainConfig::default()
                };
                let mut trainer = Trainer::new(Box::new(model), sync, train, data.train.len())?;
                let mut epochs_run = Vec::new();
                for _ in 0..epochs {
                    let stats = trainer.run_epoch(&data, &mut |_| {})?;
                    if stats.test_accuracy.is_some() && trainer.sync().rank() == 0 {
                        println!(
                            "{}",
                            serde_json::to_string(&stats).expect("stats serialize")
                        );
                    }
                    epochs_run.push(stats);
                }
                Ok(epochs_run)
            })
        })
        .collect();
    for r in ranks {
        let stats = r.join().expect("rank thread")?;
        let (Some(first), Some(last)) = (stats.first(), stats.last()) else {
            continue;
        };
        if let Some(acc) = last.test_accuracy {
            assert!(
                acc > 0.5,
                "test accuracy {acc} after {} epochs",
                stats.len()
            );
        }
        if stats.len() >= 2 {
            assert!(
                last.train_loss < first.train_loss,
                "training loss {} -> {}",
                first.train_loss,
                last.train_loss
            );
        }
    }
    Ok(())
}
