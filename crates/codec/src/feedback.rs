//! Error feedback (Seide 2014; Strom 2015; Karimireddy et al. 2019, "Error Feedback Fixes
//! SignSGD and other Gradient Compression Schemes"): what a biased codec leaves out this
//! step is added to the next step's gradient.
//!
//! With residual `r` (zero at first): `x = g + r`, send `encode(x)`, then
//! `r = x - decode(encode(x))`, so `sent + r_new == g + r_old` up to one rounding. Codecs
//! may fuse the three passes ([`crate::FeedbackEncode`], offered by
//! [`Codec::feedback_encode`]); otherwise the wrapper runs them with a reused scratch
//! buffer. The residual is part of the saved state. This is the crate's one generic
//! error-feedback mechanism ([`Feedback::Generic`]); the codecs whose selection reads the
//! residual keep their own instead ([`Feedback::Owned`], rule in the crate doc).
//!
//! State layout: `GWS` + inner codec id, `u64` 0x4546 ("EF"), the residual (`u64` length
//! and `f32`s), then the inner codec's state (`u64` length and bytes).

use crate::simd::multiversion;
use crate::{
    Caps, Codec, CodecId, DecodeError, Feedback, Progress, SharedScalars, SparseEncode, SparseGrad,
    StateReader, StateWriter,
};

const EF_TAG: u64 = 0x4546;

multiversion! {
    fn add_into(x: &mut [f32], g: &[f32], r: &[f32]) {
        for ((x, g), r) in x.iter_mut().zip(g).zip(r) {
            *x = g + r;
        }
    }
}

multiversion! {
    fn neg_into(r: &mut [f32], x: &[f32]) {
        for (r, x) in r.iter_mut().zip(x) {
            *r = -x;
        }
    }
}

multiversion! {
    fn negate(r: &mut [f32]) {
        for r in r.iter_mut() {
            *r = -*r;
        }
    }
}

/// Wraps a codec with a residual (error feedback).
#[derive(Debug, Clone)]
pub struct ErrorFeedback<C: Codec> {
    inner: C,
    residual: Vec<f32>,
    scratch: Vec<f32>,
    fused: bool,
}

/// Boxes `c`, wrapped in [`ErrorFeedback`] when `ef` is set.
pub(crate) fn maybe_wrap<C: Codec + 'static>(c: C, ef: bool) -> Box<dyn Codec> {
    if ef {
        Box::new(ErrorFeedback::new(c))
    } else {
        Box::new(c)
    }
}

impl<C: Codec> ErrorFeedback<C> {
    /// Wraps `inner` with a zero residual (using its fused path when it has one). `inner`
    /// must not own a residual itself ([`Feedback::Owned`]: the crate doc's rule; checked in
    /// debug builds).
    pub fn new(inner: C) -> Self {
        debug_assert!(
            inner.caps().feedback != Feedback::Owned,
            "{} owns its residual: use its ef= option, not ErrorFeedback",
            inner.id().name()
        );
        ErrorFeedback {
            inner,
            residual: Vec::new(),
            scratch: Vec::new(),
            fused: true,
        }
    }

    /// Like [`ErrorFeedback::new`], but always runs the generic passes (for testing fused
    /// paths against it).
    pub fn new_generic(inner: C) -> Self {
        ErrorFeedback {
            fused: false,
            ..Self::new(inner)
        }
    }

    /// The current residual (empty before the first encode).
    pub fn residual(&self) -> &[f32] {
        &self.residual
    }

    /// The wrapped codec.
    pub fn inner(&self) -> &C {
        &self.inner
    }

    fn load_x(&mut self, grad: &[f32]) {
        self.scratch.clear();
        self.scratch.resize(grad.len(), 0.0);
        add_into(&mut self.scratch, grad, &self.residual);
    }
}

impl<C: Codec> Codec for ErrorFeedback<C> {
    fn id(&self) -> CodecId {
        self.inner.id()
    }

    fn encode(&mut self, grad: &[f32], out: &mut Vec<u8>) {
        crate::sparse::fit(&mut self.residual, grad.len());
        if self.fused {
            if let Some(fused) = self.inner.feedback_encode() {
                fused.encode_feedback(grad, &mut self.residual, out);
                return;
            }
        }
        self.load_x(grad);
        self.inner.encode(&self.scratch, out);
        // r = -(-x + decode(out)) = x - decode(out), exactly as a direct subtraction.
        neg_into(&mut self.residual, &self.scratch);
        if self.inner.decode_add(out, &mut self.residual).is_ok() {
            negate(&mut self.residual);
        } else {
            // Only non-finite input makes a payload its own decoder refuses; the receivers
            // will refuse it too. Do not carry the poison into later steps.
            self.residual.fill(0.0);
        }
    }

    fn decode_add(&self, payload: &[u8], acc: &mut [f32]) -> Result<(), DecodeError> {
        self.inner.decode_add(payload, acc)
    }

    /// The residual is kept here ([`Feedback::Generic`]), and the wrapper is biased (it sends
    /// `grad + residual`).
    fn caps(&self) -> Caps {
        Caps::biased(Feedback::Generic)
    }

    fn set_progress(&mut self, progress: Progress) {
        self.inner.set_progress(progress)
    }

    /// The inner codec's sparse form, run on `grad + residual` (no fused kernel of its own).
    fn sparse_encode(&mut self) -> Option<&mut dyn SparseEncode> {
        match self.inner.sparse_encode() {
            Some(_) => Some(self),
            None => None,
        }
    }

    /// The inner codec's shared scalars, computed from `grad + residual`.
    fn shared_scalars(&mut self) -> Option<&mut dyn SharedScalars> {
        match self.inner.shared_scalars() {
            Some(_) => Some(self),
            None => None,
        }
    }

    fn save_state(&self) -> Vec<u8> {
        StateWriter::new(self.inner.id())
            .u64(EF_TAG)
            .f32s(&self.residual)
            .bytes(&self.inner.save_state())
            .finish()
    }

    fn load_state(&mut self, state: &[u8]) -> Result<(), DecodeError> {
        let mut r = StateReader::new(state, self.inner.id())?;
        if r.u64()? != EF_TAG {
            return Err(DecodeError::invalid_state("not an error-feedback state"));
        }
        let mut residual = Vec::new();
        r.f32s_into(&mut residual)?;
        let inner = r.bytes()?;
        r.finish()?;
        self.inner.load_state(inner)?;
        self.residual = residual;
        Ok(())
    }
}

/// Forwards to the inner codec's [`SparseEncode`] on `x = grad + residual` and keeps
/// `x - selected` as the residual. An inner codec without a sparse form selects nothing
/// (`out` empty, all of `x` kept); [`Codec::sparse_encode`] offers this only when the inner
/// codec has one.
impl<C: Codec> SparseEncode for ErrorFeedback<C> {
    fn encode_sparse(&mut self, grad: &[f32], out: &mut SparseGrad) {
        crate::sparse::fit(&mut self.residual, grad.len());
        self.load_x(grad);
        match self.inner.sparse_encode() {
            Some(inner) => inner.encode_sparse(&self.scratch, out),
            None => out.clear(),
        }
        std::mem::swap(&mut self.residual, &mut self.scratch);
        for (&i, &v) in out.indices.iter().zip(&out.values) {
            if let Some(r) = self.residual.get_mut(i as usize) {
                *r -= v;
            }
        }
    }

    /// The inner codec's: the wrapper's payload and pairs are the inner codec's of
    /// `grad + residual`. Without an inner sparse form, the trait's default error.
    fn decode_pairs(
        &mut self,
        payload: &[u8],
        n: usize,
        out: &mut SparseGrad,
    ) -> Result<(), DecodeError> {
        match self.inner.sparse_encode() {
            Some(inner) => inner.decode_pairs(payload, n, out),
            None => crate::no_pairs(out),
        }
    }
}

/// Forwards to the inner codec's [`SharedScalars`], computing its scalars from
/// `grad + residual` (what the next encode will send). An inner codec without shared
/// scalars has none (empty) and ignores agreed ones; [`Codec::shared_scalars`] offers this
/// only when the inner codec has them.
impl<C: Codec> SharedScalars for ErrorFeedback<C> {
    fn local_scalars(&mut self, grad: &[f32]) -> Vec<f32> {
        let x: Vec<f32>;
        let from = if self.residual.len() == grad.len() {
            x = grad
                .iter()
                .zip(&self.residual)
                .map(|(g, r)| g + r)
                .collect();
            &x[..]
        } else {
            grad
        };
        match self.inner.shared_scalars() {
            Some(inner) => inner.local_scalars(from),
            None => Vec::new(),
        }
    }

    fn set_shared_scalars(&mut self, values: &[f32]) {
        if let Some(inner) = self.inner.shared_scalars() {
            inner.set_shared_scalars(values)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_conserves, assert_resumes};
    use crate::{Fp16, OneBit, SignSgd};

    fn grad(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32) ^ seed).wrapping_mul(2654435761) as f32 / 4.3e9 - 0.5) * 0.1)
            .collect()
    }

    fn conserves<C: Codec>(mut ef: ErrorFeedback<C>) {
        let grads = (0..6).map(|step| grad(3001, step));
        assert_conserves(&mut ef, ErrorFeedback::residual, grads, 1e-6);
    }

    #[test]
    fn conserves_the_signal() {
        conserves(ErrorFeedback::new(OneBit::new(300, &[])));
        conserves(ErrorFeedback::new_generic(OneBit::new(300, &[])));
        conserves(ErrorFeedback::new(SignSgd::new(&[1000, 2001])));
        conserves(ErrorFeedback::new_generic(SignSgd::new(&[1000, 2001])));
        conserves(ErrorFeedback::new(Fp16));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "owns its residual")]
    fn refuses_a_codec_that_owns_its_residual() {
        let cfg = crate::ThresholdConfig {
            tau: 0.5,
            max_ratio: 1.0,
        };
        ErrorFeedback::new(crate::Threshold::new(cfg));
    }

    #[test]
    fn state_resumes_exactly() {
        let mut a = ErrorFeedback::new(OneBit::new(64, &[]));
        let mut out = Vec::new();
        a.encode(&grad(500, 1), &mut out);
        let mut b = ErrorFeedback::new(OneBit::new(64, &[]));
        let s = assert_resumes(&mut a, &mut b, [grad(500, 2)]);
        assert!(b.load_state(&s[..s.len() - 1]).is_err());
        assert!(ErrorFeedback::new(Fp16).load_state(&s).is_err());
    }
}
