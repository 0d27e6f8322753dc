//! Models behind a framework-free trait: flat parameters out and in, flat gradients out.
//! burn (with the flex CPU backend) stays inside this module; nothing public names it.

mod flat;
pub mod init;
mod lenet;
mod lstm;
mod mlp;
mod net;
mod resnet;

use std::str::FromStr;

use crate::data::{Batch, DataShape};
use crate::error::{Error, Result};

/// Loss and accuracy summed over evaluated samples (tokens for a language model).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Eval {
    /// Sum of the per-sample cross-entropy (natural log).
    pub loss_sum: f64,
    /// Samples whose top-1 prediction is the target.
    pub correct: u64,
    /// Samples evaluated.
    pub n: u64,
}

impl Eval {
    /// Adds another evaluation's sums into this one.
    pub fn merge(&mut self, other: &Eval) {
        self.loss_sum += other.loss_sum;
        self.correct += other.correct;
        self.n += other.n;
    }

    /// Mean loss per sample (0 when nothing was evaluated).
    pub fn mean_loss(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.loss_sum / self.n as f64
        }
    }

    /// Top-1 accuracy in `0..=1` (0 when nothing was evaluated).
    pub fn accuracy(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.correct as f64 / self.n as f64
        }
    }

    /// `exp(mean loss)`: the perplexity of a language model.
    pub fn perplexity(&self) -> f64 {
        self.mean_loss().exp()
    }
}

/// What a parameter tensor is, for codecs that follow layer geometry (per-column 1-bit SGD
/// and adaptive quantization, TernGrad's float output layer, DGC's dense 1-D tensors).
pub use gradwire_engine::codec::TensorRole;

/// One parameter tensor of a model, in flat order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamTensor {
    /// Its dotted path in the model (`conv1.weight`, `fc3.bias`, `w_ih`).
    pub name: String,
    /// Its shape in burn's layout (Linear `[in, out]`, conv `[c_out, c_in, kh, kw]`).
    pub shape: Vec<usize>,
    /// Its role: the last linear layer's weight and bias are the `Output` layer.
    pub role: TensorRole,
}

impl ParamTensor {
    /// Element count.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for an empty tensor.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Roles from where each tensor sits: a `weight` of a `Linear` is a linear weight, of a
/// `Conv*` a convolution kernel, any 1-D tensor a bias, a 2-D parameter of a hand-written
/// cell (an LSTM's `[in, 4 hidden]` gate matrices, used as `x W`) a linear weight; the last
/// `Linear` holder's tensors are the output layer. Embeddings and anything else are `Other`.
pub(crate) fn roles(paths: &[flat::ParamPath]) -> Vec<ParamTensor> {
    let last_linear = paths.iter().rposition(|p| p.holder == "Linear").map(|i| {
        paths[i]
            .path
            .rsplit_once('.')
            .map_or("", |(m, _)| m)
            .to_string()
    });
    paths
        .iter()
        .map(|p| {
            let module = p.path.rsplit_once('.').map_or("", |(m, _)| m);
            let leaf = p.path.rsplit('.').next().unwrap_or("");
            let role = if p.holder == "Linear" && Some(module) == last_linear.as_deref() {
                TensorRole::Output
            } else if p.shape.len() == 1 {
                TensorRole::Bias
            } else if p.holder == "Linear" && leaf == "weight" {
                TensorRole::LinearWeight
            } else if p.holder.starts_with("Conv") && leaf == "weight" {
                TensorRole::ConvWeight
            } else if p.shape.len() == 2 && p.holder != "Embedding" {
                TensorRole::LinearWeight
            } else {
                TensorRole::Other
            };
            ParamTensor {
                name: p.path.clone(),
                shape: p.shape.clone(),
                role,
            }
        })
        .collect()
}

/// A trainable model seen as flat `f32` buffers.
///
/// The flat order is the same in every process for the same [`ModelKind`] and data shape,
/// so ranks can exchange parameters and gradients without any names.
pub trait Model: Send {
    /// Which architecture this is.
    fn kind(&self) -> ModelKind;

    /// Total number of parameters.
    fn num_params(&self) -> usize;

    /// Element count of each parameter tensor, in flat order (sums to `num_params`).
    fn layout(&self) -> Vec<usize>;

    /// Name, shape and role of each parameter tensor, in flat order (their element counts
    /// are [`Model::layout`]).
    fn tensors(&self) -> Vec<ParamTensor>;

    /// When the last [`Model::forward_backward`] started, ended its forward pass and ended
    /// its backward pass (gradients taken out), for the timeline; `None` if unknown.
    fn last_pass_times(&self) -> Option<[std::time::Instant; 3]> {
        None
    }

    /// Writes all parameters into `out` (cleared first).
    fn params(&self, out: &mut Vec<f32>);

    /// Overwrites all parameters from `flat`.
    ///
    /// # Panics
    /// When `flat.len() != self.num_params()`.
    fn set_params(&mut self, flat: &[f32]);

    /// Forward and backward pass on `batch`: writes the gradient of the batch's mean loss
    /// into `grads` (resized to `num_params`) and returns that mean loss.
    fn forward_backward(&mut self, batch: &Batch, grads: &mut Vec<f32>) -> Result<f32>;

    /// Loss sum and correct count on `batch`, without gradients.
    fn evaluate(&self, batch: &Batch) -> Result<Eval>;
}

/// The architectures gradwire trains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// MLP 784-256-128-10.
    Mlp,
    /// LeNet-5 (ReLU, max pooling).
    #[serde(rename = "lenet")]
    LeNet,
    /// A ResNet-8 without batch norm (widths 16/32/64).
    #[serde(rename = "resnet")]
    ResNet8,
    /// Character-level LSTM language model (embedding 64, hidden 256).
    #[serde(rename = "lstm")]
    CharLstm,
}

impl ModelKind {
    /// Every kind, in a stable order.
    pub const ALL: [ModelKind; 4] = [
        ModelKind::Mlp,
        ModelKind::LeNet,
        ModelKind::ResNet8,
        ModelKind::CharLstm,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::LeNet => "lenet",
            ModelKind::ResNet8 => "resnet",
            ModelKind::CharLstm => "lstm",
        }
    }

    /// True for a model that takes text (token) batches.
    pub fn is_language_model(self) -> bool {
        self == ModelKind::CharLstm
    }

    /// Builds the model for data of `shape`, with parameters drawn from `seed` (the same
    /// seed gives bit-identical parameters everywhere).
    pub fn build(self, shape: DataShape, seed: u64) -> Result<Box<dyn Model>> {
        use burn::prelude::Device;
        let device = Device::flex().autodiff();
        let wrong = || {
            Error::Config(format!(
                "model {} does not fit {} data",
                self.name(),
                match shape {
                    DataShape::Image { .. } => "image",
                    DataShape::Text { .. } => "text",
                }
            ))
        };
        Ok(match (self, shape) {
            (ModelKind::Mlp, DataShape::Image { shape, classes }) => {
                let inputs = shape.iter().product();
                let net = mlp::Mlp::new(inputs, classes, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            (ModelKind::LeNet, DataShape::Image { shape, classes }) => {
                let net = lenet::LeNet::new(shape, classes, &device)?;
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            (ModelKind::ResNet8, DataShape::Image { shape, classes }) => {
                let net = resnet::ResNet::new(shape, classes, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            (ModelKind::CharLstm, DataShape::Text { vocab }) => {
                let net = lstm::CharLstm::new(vocab, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            _ => return Err(wrong()),
        })
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ModelKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "mlp" => Ok(ModelKind::Mlp),
            "lenet" | "lenet5" | "lenet-5" => Ok(ModelKind::LeNet),
            "resnet" | "resnet8" | "resnet-8" => Ok(ModelKind::ResNet8),
            "lstm" | "char-lstm" | "charlstm" => Ok(ModelKind::CharLstm),
            _ => Err(Error::Config(format!(
                "unknown model {s:?} (expected mlp|lenet|resnet|lstm)"
            ))),
        }
    }
}
