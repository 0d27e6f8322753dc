//! Character-level LSTM language model: embedding -> one LSTM layer -> linear over the
//! vocabulary, trained on next-character prediction.
//!
//! The LSTM cell is written here with the four gates fused into one `[*, 4H]` product
//! (gate order i, f, g, o, as in PyTorch), which takes two matrix products per time step
//! where burn's `Lstm` takes eight.

use burn::module::Param;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, Linear};
use burn::prelude::*;
use burn::tensor::activation::{sigmoid, tanh};

use super::init::ParamInit;
use super::lenet::linear;
use super::net::{int_tensor, mismatch, Net};
use super::ModelKind;
use crate::data::Batch;
use crate::error::Result;

/// Embedding width.
pub(crate) const EMBED: usize = 64;
/// LSTM hidden size of the default model (`lstm`; `lstm:hidden=N` picks another).
pub(crate) const HIDDEN: usize = 256;

/// The char-LSTM.
#[derive(Module, Debug)]
pub(crate) struct CharLstm {
    embed: Embedding,
    /// Input to gates, `[EMBED, 4 * hidden]`.
    w_ih: Param<Tensor<2>>,
    /// Hidden to gates, `[hidden, 4 * hidden]`.
    w_hh: Param<Tensor<2>>,
    /// Gate bias, `[4 * hidden]`.
    bias: Param<Tensor<1>>,
    out: Linear,
    hidden: usize,
}

impl CharLstm {
    /// A char-LSTM over `vocab` ids with hidden size `h`.
    pub(crate) fn new(vocab: usize, h: usize, device: &Device) -> Self {
        CharLstm {
            embed: EmbeddingConfig::new(vocab, EMBED)
                .with_initializer(Initializer::Zeros)
                .init(device),
            w_ih: Param::from_tensor(Tensor::zeros([EMBED, 4 * h], device)),
            w_hh: Param::from_tensor(Tensor::zeros([h, 4 * h], device)),
            bias: Param::from_tensor(Tensor::zeros([4 * h], device)),
            out: linear(h, vocab, device),
            hidden: h,
        }
    }
}

impl Net for CharLstm {
    fn logits(&self, batch: &Batch, device: &Device) -> Result<(Tensor<2>, Tensor<1, Int>)> {
        let Batch::Text(b) = batch else {
            return Err(mismatch(ModelKind::CharLstm, batch));
        };
        let t_len = b.seq_len;
        let n = b.inputs.len() / t_len;
        let h_dim = self.hidden;
        let (w_ih, w_hh) = (self.w_ih.val(), self.w_hh.val());
        let bias = self.bias.val().unsqueeze_dim::<2>(0);
        let mut h = Tensor::<2>::zeros([n, h_dim], device);
        let mut c = Tensor::<2>::zeros([n, h_dim], device);
        let mut outs = Vec::with_capacity(t_len);
        let mut ids = vec![0i64; n];
        for t in 0..t_len {
            for (s, id) in ids.iter_mut().enumerate() {
                *id = i64::from(b.inputs[s * t_len + t]);
            }
            // [n, 1] ids -> [n, 1, E] -> [n, E]
            let x: Tensor<2> = self
                .embed
                .forward(int_tensor(&ids, [n, 1], device))
                .squeeze_dim(1);
            let g = x.matmul(w_ih.clone()) + h.matmul(w_hh.clone()) + bias.clone();
            let i = sigmoid(g.clone().narrow(1, 0, h_dim));
            let f = sigmoid(g.clone().narrow(1, h_dim, h_dim));
            let gg = tanh(g.clone().narrow(1, 2 * h_dim, h_dim));
            let o = sigmoid(g.narrow(1, 3 * h_dim, h_dim));
            c = f * c + i * gg;
            h = o * tanh(c.clone());
            outs.push(h.clone());
        }
        let hs: Tensor<3> = Tensor::stack(outs, 1); // [n, T, H]
        let logits = self.out.forward(hs.reshape([n * t_len, h_dim]));
        let y: Vec<i64> = b.targets.iter().map(|&v| i64::from(v)).collect();
        Ok((logits, int_tensor(&y, [n * t_len], device)))
    }

    fn init_plan(&self) -> Vec<ParamInit> {
        let k = ParamInit::fan_in(self.hidden);
        vec![ParamInit::Normal(1.0), k, k, k, k, k]
    }
}
