//! Models behind a framework-free trait: flat parameters out and in, flat gradients out.
//! burn (with the flex CPU backend) stays inside this module; nothing public names it.
//! LeNet trains on a hand-written CPU implementation of the same network ([`ModelKind::build`]);
//! burn's version stays as its reference ([`ModelKind::build_burn`]).

mod cpu_lenet;
mod flat;
pub mod init;
mod lenet;
mod lstm;
mod mlp;
mod net;
pub mod partition;

pub use net::{flat_images, BurnModel, Net};
mod resnet;

use std::str::FromStr;

use crate::data::{Batch, DataShape};
use crate::error::{Error, HiddenError, HiddenSizesError, LstmOptionError, ModelError, Result};

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

    /// The engine's description of it (name, shape, role).
    pub fn spec(&self) -> gradwire_engine::TensorSpec {
        gradwire_engine::TensorSpec::new(self.name.clone(), self.shape.clone()).with_role(self.role)
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

/// [`Model::params`] of a model whose parameters are one flat buffer: `out` becomes a copy
/// of `params`.
pub(crate) fn copy_params(params: &[f32], out: &mut Vec<f32>) {
    out.clear();
    out.extend_from_slice(params);
}

/// [`Model::set_params`] of a model whose parameters are one flat buffer: `params` becomes
/// a copy of `flat`.
///
/// # Panics
/// When `flat.len() != params.len()`.
pub(crate) fn overwrite_params(params: &mut [f32], flat: &[f32]) {
    assert_eq!(flat.len(), params.len(), "flat parameter buffer length");
    params.copy_from_slice(flat);
}

/// Most hidden layers a `mlp:hidden=...` spec may ask for.
pub const MAX_HIDDEN_LAYERS: usize = 8;
/// Widest hidden layer a `mlp:hidden=...` spec may ask for.
pub const MAX_HIDDEN_WIDTH: usize = 16_384;
/// Most parameters a model may have when built (1 GiB of `f32`), so a spec cannot ask for
/// an unbounded allocation.
pub const MAX_PARAMS: usize = 1 << 28;

/// The hidden widths of a wide MLP (`mlp:hidden=2048x3`): 1 to [`MAX_HIDDEN_LAYERS`] layers
/// of 1 to [`MAX_HIDDEN_WIDTH`] units. Kept inline (not a `Vec`) so [`ModelKind`] stays `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MlpHidden {
    len: u8,
    widths: [u32; MAX_HIDDEN_LAYERS],
}

impl MlpHidden {
    /// Three hidden layers of 2,048 units: the wide fully-connected networks of the 1-bit SGD
    /// (Seide et al. 2014) and threshold-quantization (Strom 2015) papers, which used 2,048
    /// units per layer (7 layers on speech; 3 here keep a Fashion-MNIST step short).
    pub const PAPER: MlpHidden = MlpHidden {
        len: 3,
        widths: [2048, 2048, 2048, 0, 0, 0, 0, 0],
    };

    /// Hidden widths from a list, checked against the limits.
    pub fn new(widths: &[usize]) -> Result<MlpHidden> {
        Ok(MlpHidden::checked(widths).map_err(ModelError::Hidden)?)
    }

    /// [`MlpHidden::new`], with the refusal as it is.
    fn checked(widths: &[usize]) -> std::result::Result<MlpHidden, HiddenError> {
        if widths.is_empty() || widths.len() > MAX_HIDDEN_LAYERS {
            return Err(HiddenError::Layers { got: widths.len() });
        }
        let mut out = [0u32; MAX_HIDDEN_LAYERS];
        for (o, &w) in out.iter_mut().zip(widths) {
            if !(1..=MAX_HIDDEN_WIDTH).contains(&w) {
                return Err(HiddenError::Width { width: w });
            }
            *o = w as u32;
        }
        Ok(MlpHidden {
            len: widths.len() as u8,
            widths: out,
        })
    }

    /// The widths, input side first.
    pub fn widths(&self) -> Vec<usize> {
        self.widths[..usize::from(self.len)]
            .iter()
            .map(|&w| w as usize)
            .collect()
    }

    /// Parameter count for `inputs` features and `classes` outputs (weights and biases).
    pub fn num_params(&self, inputs: usize, classes: usize) -> usize {
        let mut d_in = inputs;
        let mut n = 0usize;
        for w in self.widths().into_iter().chain([classes]) {
            n = n.saturating_add(d_in.saturating_mul(w).saturating_add(w));
            d_in = w;
        }
        n
    }
}

impl std::fmt::Display for MlpHidden {
    /// Runs of equal widths as `WxN`, joined by `-`: `2048x3`, `1024-512`, `512x2-128`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.widths();
        let mut i = 0;
        while i < w.len() {
            let run = w[i..].iter().take_while(|&&x| x == w[i]).count();
            if i > 0 {
                f.write_str("-")?;
            }
            if run > 1 {
                write!(f, "{}x{run}", w[i])?;
            } else {
                write!(f, "{}", w[i])?;
            }
            i += run;
        }
        Ok(())
    }
}

impl FromStr for MlpHidden {
    type Err = Error;
    /// `WIDTH[xCOUNT]` items joined by `-` or `,`: `2048x3`, `1024-512`, `512,256`.
    fn from_str(s: &str) -> Result<MlpHidden> {
        let bad = |why: HiddenSizesError| {
            Error::from(ModelError::HiddenSizes {
                spec: s.to_string(),
                why,
            })
        };
        let mut widths = Vec::new();
        for item in s.split(['-', ',']) {
            let item = item.trim();
            let (w, n) = match item.split_once(['x', 'X', '*']) {
                Some((w, n)) => (w.trim(), n.trim()),
                None => (item, "1"),
            };
            let w: usize = w
                .parse()
                .map_err(|_| bad(HiddenSizesError::Width(w.to_string())))?;
            let n: usize = n
                .parse()
                .map_err(|_| bad(HiddenSizesError::Count(n.to_string())))?;
            if n == 0 || widths.len() + n > MAX_HIDDEN_LAYERS {
                return Err(bad(HiddenSizesError::Layers));
            }
            widths.extend(std::iter::repeat_n(w, n));
        }
        MlpHidden::checked(&widths).map_err(|e| bad(e.into()))
    }
}

/// The architectures gradwire trains.
///
/// Written and read as text (`mlp`, `lenet`, `resnet`, `lstm`, `mlp:hidden=2048x3`), also in
/// serde.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum ModelKind {
    /// MLP 784-256-128-10.
    Mlp,
    /// LeNet-5 (ReLU, max pooling).
    LeNet,
    /// A ResNet-8 without batch norm (widths 16/32/64).
    ResNet8,
    /// Character-level LSTM language model (embedding 64, hidden 256).
    CharLstm,
    /// The char-LSTM with another hidden size (`lstm:hidden=128`, 8 to
    /// [`MAX_LSTM_HIDDEN`]); `lstm:hidden=256` is plain [`ModelKind::CharLstm`].
    CharLstmHidden(u32),
    /// An MLP with the given hidden widths (`mlp:hidden=2048x3`, or `mlp:wide` for
    /// [`MlpHidden::PAPER`]); `mlp:hidden=256-128` is plain [`ModelKind::Mlp`].
    WideMlp(MlpHidden),
    /// A model defined outside gradwire, brought as a burn network ([`BurnModel::custom`]):
    /// written `custom`, never parsed and never built from a spec.
    Custom,
}

impl From<ModelKind> for String {
    fn from(k: ModelKind) -> String {
        k.to_string()
    }
}

impl TryFrom<String> for ModelKind {
    type Error = Error;
    fn try_from(s: String) -> Result<ModelKind> {
        s.parse()
    }
}

impl ModelKind {
    /// Every fixed architecture, in a stable order (the parametric [`ModelKind::WideMlp`]
    /// is left out: its size is the caller's choice).
    pub const ALL: [ModelKind; 4] = [
        ModelKind::Mlp,
        ModelKind::LeNet,
        ModelKind::ResNet8,
        ModelKind::CharLstm,
    ];

    /// The family name used on the command line (`mlp` for every MLP; the full spec with
    /// hidden sizes is the [`Display`](std::fmt::Display) form).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp | ModelKind::WideMlp(_) => "mlp",
            ModelKind::LeNet => "lenet",
            ModelKind::ResNet8 => "resnet",
            ModelKind::CharLstm | ModelKind::CharLstmHidden(_) => "lstm",
            ModelKind::Custom => "custom",
        }
    }

    /// True for a model that takes text (token) batches.
    pub fn is_language_model(self) -> bool {
        matches!(self, ModelKind::CharLstm | ModelKind::CharLstmHidden(_))
    }

    /// Builds the model for data of `shape`, with parameters drawn from `seed` (the same
    /// seed gives bit-identical parameters everywhere).
    ///
    /// LeNet is the hand-written CPU implementation (im2col + GEMM, no autodiff graph): the
    /// same network, flat layout and initial parameters as [`ModelKind::build_burn`]'s, with
    /// gradients equal to burn's within float rounding, several times faster per step.
    pub fn build(self, shape: DataShape, seed: u64) -> Result<Box<dyn Model>> {
        if let (ModelKind::LeNet, DataShape::Image { shape, classes }) = (self, shape) {
            let device = burn::prelude::Device::flex();
            let net = lenet::LeNet::new(shape, classes, &device)?;
            let tensors = roles(&flat::param_paths(&net));
            let plan = net::Net::init_plan(&net);
            return Ok(Box::new(cpu_lenet::CpuLeNet::new(
                shape, classes, tensors, &plan, seed,
            )?));
        }
        self.build_burn(shape, seed)
    }

    /// Builds the model as a burn network trained with burn's autodiff (flex CPU backend),
    /// for every architecture: the reference the hand-written LeNet of [`ModelKind::build`]
    /// is tested and measured against. Same parameters from the same `seed`.
    pub fn build_burn(self, shape: DataShape, seed: u64) -> Result<Box<dyn Model>> {
        use burn::prelude::Device;
        let device = Device::flex().autodiff();
        let wrong = || {
            Error::from(ModelError::DataMismatch {
                model: self.name(),
                data: match shape {
                    DataShape::Image { .. } => "image",
                    DataShape::Text { .. } => "text",
                },
            })
        };
        Ok(match (self, shape) {
            (ModelKind::Mlp, DataShape::Image { shape, classes }) => {
                let inputs = shape.iter().product();
                let net = mlp::Mlp::new(inputs, classes, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            (ModelKind::WideMlp(hidden), DataShape::Image { shape, classes }) => {
                let inputs = shape.iter().product();
                let n = hidden.num_params(inputs, classes);
                if n > MAX_PARAMS {
                    return Err(ModelError::TooManyParams {
                        model: self,
                        params: n,
                    }
                    .into());
                }
                let net = mlp::WideMlp::new(inputs, &hidden.widths(), classes, &device);
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
                let net = lstm::CharLstm::new(vocab, lstm::HIDDEN, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            (ModelKind::CharLstmHidden(h), DataShape::Text { vocab }) => {
                let net = lstm::CharLstm::new(vocab, h as usize, &device);
                Box::new(net::BurnModel::new(net, self, device, seed))
            }
            _ => return Err(wrong()),
        })
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelKind::WideMlp(h) => write!(f, "mlp:hidden={h}"),
            ModelKind::CharLstmHidden(h) => write!(f, "lstm:hidden={h}"),
            k => f.write_str(k.name()),
        }
    }
}

impl FromStr for ModelKind {
    type Err = Error;
    /// `mlp`, `lenet`, `resnet`, `lstm`, an MLP with options: `mlp:hidden=2048x3`
    /// (widths as [`MlpHidden`] reads them) or `mlp:wide` ([`MlpHidden::PAPER`]), or a
    /// char-LSTM of another hidden size: `lstm:hidden=128`.
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        if let Some((family, opts)) = lower.split_once(':') {
            if matches!(family.trim(), "lstm" | "char-lstm" | "charlstm") {
                return parse_lstm(s, opts);
            }
            if family.trim() != "mlp" {
                return Err(ModelError::NoOptions {
                    spec: s.to_string(),
                }
                .into());
            }
            let hidden = match opts.trim().split_once('=') {
                None if opts.trim() == "wide" => MlpHidden::PAPER,
                Some((key, value)) if key.trim() == "hidden" => value.parse()?,
                _ => {
                    return Err(ModelError::UnknownMlpOption {
                        spec: s.to_string(),
                        option: opts.to_string(),
                    }
                    .into())
                }
            };
            return Ok(if hidden.widths() == [256, 128] {
                ModelKind::Mlp
            } else {
                ModelKind::WideMlp(hidden)
            });
        }
        match lower.as_str() {
            "mlp" => Ok(ModelKind::Mlp),
            "lenet" | "lenet5" | "lenet-5" => Ok(ModelKind::LeNet),
            "resnet" | "resnet8" | "resnet-8" => Ok(ModelKind::ResNet8),
            "lstm" | "char-lstm" | "charlstm" => Ok(ModelKind::CharLstm),
            _ => Err(ModelError::Unknown {
                spec: s.to_string(),
            }
            .into()),
        }
    }
}

/// Widest hidden state a `lstm:hidden=N` spec may ask for.
pub const MAX_LSTM_HIDDEN: u32 = 2048;

/// `opts` of `lstm:OPTS` (`s` is the whole spec, for errors): `hidden=N`.
fn parse_lstm(s: &str, opts: &str) -> Result<ModelKind> {
    let bad = |why: LstmOptionError| {
        Error::from(ModelError::LstmOption {
            spec: s.to_string(),
            why,
        })
    };
    let Some((key, value)) = opts.trim().split_once('=') else {
        return Err(bad(LstmOptionError::Option(opts.to_string())));
    };
    if key.trim() != "hidden" {
        return Err(bad(LstmOptionError::Key(key.trim().to_string())));
    }
    let h: u32 = value
        .trim()
        .parse()
        .map_err(|_| bad(LstmOptionError::NotANumber(value.trim().to_string())))?;
    if !(8..=MAX_LSTM_HIDDEN).contains(&h) {
        return Err(bad(LstmOptionError::Range(h)));
    }
    Ok(if h as usize == lstm::HIDDEN {
        ModelKind::CharLstm
    } else {
        ModelKind::CharLstmHidden(h)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        s.parse::<ModelKind>().unwrap_err().to_string()
    }

    #[test]
    fn mlp_specs_parse() {
        let hidden = |s: &str| match s.parse::<ModelKind>().unwrap() {
            ModelKind::WideMlp(h) => h.widths(),
            other => panic!("{s}: {other:?}"),
        };
        assert_eq!(hidden("mlp:hidden=2048x3"), [2048, 2048, 2048]);
        assert_eq!(hidden("MLP:Hidden=1024-512"), [1024, 512]);
        assert_eq!(hidden("mlp:hidden=512,256"), [512, 256]);
        assert_eq!(hidden("mlp:hidden=512x2-128"), [512, 512, 128]);
        assert_eq!(hidden("mlp:hidden=64"), [64]);
        assert_eq!(hidden("mlp:wide"), [2048, 2048, 2048]);
        // The default widths are the plain MLP.
        assert_eq!(
            "mlp:hidden=256-128".parse::<ModelKind>().unwrap(),
            ModelKind::Mlp
        );
        assert_eq!("mlp".parse::<ModelKind>().unwrap(), ModelKind::Mlp);
    }

    #[test]
    fn lstm_specs_parse_print_and_refuse() {
        assert_eq!(
            "lstm:hidden=128".parse::<ModelKind>().unwrap(),
            ModelKind::CharLstmHidden(128)
        );
        assert_eq!(
            " LSTM:Hidden = 64 ".parse::<ModelKind>().unwrap(),
            ModelKind::CharLstmHidden(64)
        );
        // The default size is the plain model, printed without options.
        assert_eq!(
            "lstm:hidden=256".parse::<ModelKind>().unwrap(),
            ModelKind::CharLstm
        );
        let k = ModelKind::CharLstmHidden(96);
        assert_eq!(k.to_string(), "lstm:hidden=96");
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"lstm:hidden=96\"");
        assert_eq!("lstm:hidden=96".parse::<ModelKind>().unwrap(), k);
        assert!(k.is_language_model());
        assert_eq!(k.name(), "lstm");
        for (spec, why) in [
            ("lstm:hidden=4", "out of range"),
            ("lstm:hidden=99999", "out of range"),
            ("lstm:hidden=x", "not a number"),
            ("lstm:width=64", "unknown lstm option"),
            ("lstm:big", "unknown lstm option"),
            ("lenet:hidden=3", "only mlp and lstm take options"),
        ] {
            let e = err(spec);
            assert!(e.contains(why), "{spec}: {e}");
        }
    }

    #[test]
    fn mlp_specs_print_and_round_trip() {
        for (s, printed) in [
            ("mlp:hidden=2048x3", "mlp:hidden=2048x3"),
            ("mlp:hidden=512,512,128", "mlp:hidden=512x2-128"),
            ("mlp:hidden=1024-512", "mlp:hidden=1024-512"),
            ("mlp:hidden=7", "mlp:hidden=7"),
        ] {
            let k: ModelKind = s.parse().unwrap();
            assert_eq!(k.to_string(), printed);
            assert_eq!(printed.parse::<ModelKind>().unwrap(), k);
            // serde writes the same text.
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{printed}\""));
            assert_eq!(serde_json::from_str::<ModelKind>(&json).unwrap(), k);
        }
        for k in ModelKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
        }
    }

    #[test]
    fn bad_mlp_specs_say_why() {
        assert!(
            err("mlp:hidden=").contains("not a width"),
            "{}",
            err("mlp:hidden=")
        );
        assert!(err("mlp:hidden=abc").contains("\"abc\" is not a width"));
        assert!(err("mlp:hidden=512xq").contains("not a layer count"));
        assert!(err("mlp:hidden=0").contains("out of range"));
        assert!(err("mlp:hidden=99999").contains("out of range"));
        assert!(err("mlp:hidden=64x0").contains("hidden layers"));
        assert!(err("mlp:hidden=64x9").contains("hidden layers"));
        assert!(err("mlp:hidden=64x4-64x5").contains("hidden layers"));
        assert!(err("mlp:depth=3").contains("unknown mlp option"));
        assert!(err("lenet:hidden=3").contains("only mlp and lstm take options"));
        assert!(err("vgg").contains("unknown model"));
        // Every error names the spec it refused.
        assert!(err("mlp:hidden=1-x").contains("1-x"));
    }

    #[test]
    fn hidden_param_count_matches_hand_count() {
        let h = MlpHidden::new(&[100, 50]).unwrap();
        assert_eq!(
            h.num_params(784, 10),
            784 * 100 + 100 + 100 * 50 + 50 + 50 * 10 + 10
        );
        assert!(MlpHidden::new(&[]).is_err());
        assert!(MlpHidden::new(&[1; MAX_HIDDEN_LAYERS + 1]).is_err());
    }

    #[test]
    fn too_big_a_model_is_refused_before_allocating() {
        let k: ModelKind = "mlp:hidden=16384x8".parse().unwrap();
        let shape = crate::data::DataShape::Image {
            shape: [1, 28, 28],
            classes: 10,
        };
        let e = k
            .build(shape, 0)
            .err()
            .expect("over MAX_PARAMS")
            .to_string();
        assert!(e.contains("parameters"), "{e}");
    }
}
