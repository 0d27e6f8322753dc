//! Stripe-quantized all-reduce: 1-bit SGD's data-parallel exchange (Seide et al. 2014, as in
//! CNTK's 1-bit SGD) and the direct exchange of Dryden et al. 2016 (LBANN).
//!
//! ```text
//! the gradient is cut into P stripes (whole columns of each tensor, see StripePlan)
//! 1. every rank q quantizes its slice of stripe j ONCE, with codec local[j]
//!    (its own residual per stripe: error feedback)         ── payload ──▶ owner j
//! 2. owner j decodes the P payloads of stripe j and sums them in f32, in rank order
//! 3. owner j quantizes its reduced stripe ONCE, with its owner codec (a second residual)
//! 4. all-gather of the P owner payloads (forwarded, never re-quantized); every rank, owner
//!    included, decodes every stripe → identical bits everywhere
//! ```
//! Two quantizations in series, whatever `P` (the forwarding ring of `quantized.rs`
//! re-quantizes partial sums at every hop: `P` in series).
//!
//! The owner's own contribution: by default ([`OwnContribution::Quantized`]) the owner
//! quantizes its own slice like every other rank's, as CNTK does (it quantizes the whole
//! gradient, then unquantizes its own stripe with the others'); every rank's contribution then
//! goes through the same codec and the result does not depend on which rank owns a stripe.
//! [`OwnContribution::Exact`] adds the owner's slice in f32 instead (Dryden's ring, where the
//! owner's partial sum stays in full precision); its local residual for that stripe stays
//! empty.
//!
//! Stripes: [`StripePlan`] cuts near `j * len / P` but only at tensor boundaries and at
//! multiples of each tensor's grain ([`CodecConfig::stripe_grain`] combined with the tensor's
//! column length), so each stripe holds whole columns (1-bit SGD, adaptive) and whole QSGD
//! buckets, and its codecs see the pieces as tensors of their own: a piece of `k` leading
//! indices of a `[d0, d1, ..]` tensor is a `[k, d1, ..]` tensor of the same role. 1-D tensors
//! are never cut (a bias is one column). Stripes may therefore be uneven, or empty on large
//! worlds of small tensors. Deviations: codecs with one scale per tensor (TernGrad, signSGD)
//! get one scale per piece, and TernGrad's shared scale is agreed per piece (one small max
//! all-reduce over all stripes' scalars).
//!
//! Summation order: each owner adds the decoded contributions into zeros in rank order
//! `0, 1, .., P-1`. With the lossless codec (`none`), the result equals the dense all-reduce
//! whenever the dense sums are order-independent (e.g. exactly representable inputs, as the
//! tests use); in general f32 sums in another order may differ in the last bits.
//!
//! Bytes: [`StripeAllReduce::bytes_by_leg`] counts the payload bytes this rank put on the wire
//! for the exchange (`P - 1` slices of about `len / P`) and the all-gather (`P - 1` forwarded
//! stripes), as Dryden counts them.

use std::ops::Range;

use gradwire_codec::{
    segments, tensor_ranges, BuildContext, Codec, CodecConfig, DecodeError, Progress, TensorInfo,
};
use gradwire_transport::Transport;

use super::state::{load_codecs, save_codecs, Tag};
use super::{all_gather_chunks, Leg, Reduce};
use crate::{Algorithm, Error, ReduceOp, Result};

/// How the owner of a stripe counts its own slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OwnContribution {
    /// Quantized like every other rank's (CNTK's 1-bit SGD; the default).
    #[default]
    Quantized,
    /// Added in f32 (Dryden's ring keeps the owner's partial sum in full precision).
    Exact,
}

/// Where the stripes of a gradient lie, and the codec context of each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripePlan {
    /// Stripe `j`'s element range (owned by rank `j`); they cover `0..len` in order.
    pub ranges: Vec<Range<usize>>,
    /// Stripe `j`'s tensors: element counts (its codecs' `layout`).
    pub layouts: Vec<Vec<usize>>,
    /// Stripe `j`'s tensors' shapes and roles (empty when the shapes are unknown).
    pub tensors: Vec<Vec<TensorInfo>>,
    base: BuildContext,
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(mut a: usize, mut b: usize) -> usize {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    if a == usize::MAX || b == usize::MAX {
        return usize::MAX;
    }
    let (a, b) = (a.max(1), b.max(1));
    (a / gcd(a, b)).saturating_mul(b)
}

impl StripePlan {
    /// Plans `world` stripes of a gradient of `len` elements whose tensors `ctx` describes
    /// (`ctx.tensors` when their counts sum to `len`, else `ctx.layout`, else one tensor of
    /// unknown shape), aligned to `config`'s grouping.
    pub fn new(config: &CodecConfig, ctx: &BuildContext, len: usize, world: usize) -> Self {
        assert!(world > 0, "world of 0 ranks");
        let shaped = ctx.tensors_for(len);
        // (range, grain, shape) of each tensor.
        let tensors: Vec<(Range<usize>, usize, Option<TensorInfo>)> = match shaped {
            Some(ts) => tensor_ranges(ts)
                .map(|(r, t)| {
                    let g = lcm(config.stripe_grain(Some(t)), t.column_len());
                    (r, g, Some(t.clone()))
                })
                .collect(),
            None => segments(&ctx.layout, len)
                .map(|r| (r, config.stripe_grain(None), None))
                .collect(),
        };
        let mut cuts = vec![0usize];
        for j in 1..world {
            let target = ((len as u128 * j as u128) / world as u128) as usize;
            let prev = *cuts.last().expect("starts with 0");
            let cut = tensors
                .iter()
                .find(|(r, _, _)| r.start <= target && target < r.end)
                .map_or(len, |(r, g, _)| {
                    let off = target - r.start;
                    let down = r.start + if *g == usize::MAX { 0 } else { off / g * g };
                    let up = if *g == usize::MAX {
                        r.end
                    } else {
                        (down + g).min(r.end)
                    };
                    if target - down <= up - target {
                        down
                    } else {
                        up
                    }
                });
            cuts.push(cut.max(prev));
        }
        cuts.push(len);
        let ranges: Vec<Range<usize>> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
        let mut layouts = Vec::with_capacity(world);
        let mut pieces = Vec::with_capacity(world);
        for s in &ranges {
            let mut lay = Vec::new();
            let mut ts = Vec::new();
            for (r, _, info) in &tensors {
                let (a, b) = (r.start.max(s.start), r.end.min(s.end));
                if a >= b {
                    continue;
                }
                lay.push(b - a);
                if let Some(t) = info {
                    ts.push(if t.is_matrix() {
                        t.rows((b - a) / t.column_len())
                    } else {
                        t.clone()
                    });
                }
            }
            layouts.push(lay);
            pieces.push(ts);
        }
        StripePlan {
            ranges,
            layouts,
            tensors: pieces,
            base: ctx.clone(),
        }
    }

    /// The context of stripe `j`'s codec on `leg` (`ReduceScatter`: the codec that quantizes
    /// this rank's slice for owner `j`; `AllGather`: the owner's). Seeds differ per stripe and
    /// leg; the tensors are the stripe's pieces.
    pub fn context(&self, j: usize, leg: Leg) -> BuildContext {
        let salt = ((j as u64 + 1) << 20) ^ (u64::from(leg == Leg::AllGather) << 40);
        BuildContext {
            seed: self.base.seed ^ salt,
            rank: self.base.rank,
            world_size: self.base.world_size,
            layout: self.layouts[j].clone(),
            tensors: self.tensors[j].clone(),
        }
    }
}

/// The tag of a [`StripeAllReduce`]'s saved state.
const TAG: Tag = Tag {
    tag: b"GWSR",
    not_ours: "not a stripe all-reduce state",
    other_world: "stripe all-reduce state of another world size",
};

/// The stripe-quantized all-reduce of a gradient of one length on one world, with the codec
/// state (the residuals of both quantizations) it carries across steps.
pub struct StripeAllReduce {
    len: usize,
    rank: usize,
    world: usize,
    plan: StripePlan,
    own: OwnContribution,
    /// `local[j]`: quantizes this rank's slice of stripe `j`; also decodes stripe `j`'s
    /// payloads (every rank builds the same codec type for stripe `j`).
    local: Vec<Box<dyn Codec>>,
    /// Re-quantizes the reduced stripe this rank owns.
    owner: Box<dyn Codec>,
    payloads: Vec<Vec<u8>>,
    recv: Vec<Vec<u8>>,
    acc: Vec<f32>,
    send: Vec<u8>,
    gathered: Vec<Vec<u8>>,
    rs_bytes: u64,
    ag_bytes: u64,
}

impl StripeAllReduce {
    /// Builds the codecs of rank `ctx.rank` of `ctx.world_size` for a gradient of `len`
    /// elements whose tensors `ctx` describes (see [`StripePlan::new`]).
    pub fn new(config: &CodecConfig, ctx: &BuildContext, len: usize) -> Self {
        let (rank, world) = (ctx.rank, ctx.world_size.max(1));
        assert!(rank < world, "rank {rank} of {world}");
        let plan = StripePlan::new(config, ctx, len, world);
        let local = (0..world)
            .map(|j| config.build(&plan.context(j, Leg::ReduceScatter)))
            .collect();
        let owner = config.build(&plan.context(rank, Leg::AllGather));
        StripeAllReduce {
            len,
            rank,
            world,
            plan,
            own: OwnContribution::default(),
            local,
            owner,
            payloads: vec![Vec::new(); world],
            recv: vec![Vec::new(); world],
            acc: Vec::new(),
            send: Vec::new(),
            gathered: Vec::new(),
            rs_bytes: 0,
            ag_bytes: 0,
        }
    }

    /// Chooses how the owner counts its own slice (default [`OwnContribution::Quantized`]).
    pub fn with_own(mut self, own: OwnContribution) -> Self {
        self.own = own;
        self
    }

    /// The stripes.
    pub fn plan(&self) -> &StripePlan {
        &self.plan
    }

    /// Tells every codec where training is.
    pub fn set_progress(&mut self, progress: Progress) {
        for c in &mut self.local {
            c.set_progress(progress);
        }
        self.owner.set_progress(progress);
    }

    /// The codec quantizing this rank's slice of stripe `j` (for state save/load).
    pub fn local_codec_mut(&mut self, j: usize) -> &mut dyn Codec {
        &mut *self.local[j]
    }

    /// The codec re-quantizing the stripe this rank owns (for state save/load).
    pub fn owner_codec_mut(&mut self) -> &mut dyn Codec {
        &mut *self.owner
    }

    /// Payload bytes this rank has sent on the exchange and all-gather legs so far (frame
    /// headers excluded).
    pub fn bytes_by_leg(&self) -> (u64, u64) {
        (self.rs_bytes, self.ag_bytes)
    }

    /// Everything that changes across steps: the state of every stripe's local codec (in
    /// stripe order) and of the owner codec ([`Codec::save_state`]; the residuals of both
    /// quantizations, RNG positions). Layout (see `state.rs`): tag `GWSR`, the world size as
    /// a `u64`, then each codec's state as a `u64` length and its bytes, the owner's last.
    /// Buffers and byte counters are not state.
    pub fn save_state(&self) -> Vec<u8> {
        save_codecs(&TAG, &self.local, &*self.owner)
    }

    /// Restores what [`StripeAllReduce::save_state`] saved on the same rank of a world of
    /// the same size with the same codecs and plan. Bad input gives a [`DecodeError`] (a
    /// state of another all-reduce, another world size, truncated, or refused by a codec)
    /// and leaves this all-reduce as it was.
    pub fn load_state(&mut self, state: &[u8]) -> std::result::Result<(), DecodeError> {
        load_codecs(state, &TAG, &mut self.local, &mut self.owner)
    }

    /// Replaces `grad` by the quantized sum (or mean) over ranks.
    pub fn all_reduce<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        grad: &mut [f32],
        reduce: Reduce,
    ) -> Result<()> {
        super::check_built_for(
            t,
            (self.rank, self.world, self.len),
            grad.len(),
            "StripeAllReduce was built for another rank or world size",
        )?;
        let (rank, world) = (self.rank, self.world);
        let ranges = &self.plan.ranges;
        // Shared scalars (TernGrad): one max all-reduce over every stripe's scalars.
        let scalars: Vec<Option<Vec<f32>>> = self
            .local
            .iter_mut()
            .zip(ranges)
            .map(|(c, r)| Some(c.shared_scalars()?.local_scalars(&grad[r.clone()])))
            .collect();
        if scalars.iter().any(Option::is_some) {
            let mut flat: Vec<f32> = scalars.iter().flatten().flatten().copied().collect();
            crate::all_reduce(
                t,
                &mut flat,
                ReduceOp::Max,
                Algorithm::RecursiveDoubling,
                64,
            )?;
            let mut at = 0;
            for (c, s) in self.local.iter_mut().zip(&scalars) {
                if let (Some(s), Some(c)) = (s, c.shared_scalars()) {
                    c.set_shared_scalars(&flat[at..at + s.len()]);
                    at += s.len();
                }
            }
        }
        for j in 0..world {
            if j == rank && self.own == OwnContribution::Exact {
                continue;
            }
            self.local[j].encode(&grad[ranges[j].clone()], &mut self.payloads[j]);
        }
        let before = t.bytes_sent();
        for s in 1..world {
            let (to, from) = ((rank + s) % world, (rank + world - s) % world);
            t.send_recv(to, &self.payloads[to], from, &mut self.recv[from])?;
        }
        let mid = t.bytes_sent();
        self.rs_bytes += mid - before;
        let mine = ranges[rank].clone();
        self.acc.clear();
        self.acc.resize(mine.len(), 0.0);
        for q in 0..world {
            let payload = if q == rank {
                if self.own == OwnContribution::Exact {
                    for (a, g) in self.acc.iter_mut().zip(&grad[mine.clone()]) {
                        *a += g;
                    }
                    continue;
                }
                &self.payloads[rank]
            } else {
                &self.recv[q]
            };
            self.local[rank]
                .decode_add(payload, &mut self.acc)
                .map_err(|source| Error::Decode { peer: q, source })?;
        }
        self.owner.encode(&self.acc, &mut self.send);
        let local = &self.local;
        let stripe = |j: usize| (ranges[j].clone(), &*local[j]);
        self.ag_bytes +=
            all_gather_chunks(t, &self.send, &mut self.gathered, grad, stripe, reduce)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tests::lenet;

    /// Stripes cover the gradient in order, cut only at allowed places, and describe their
    /// pieces consistently.
    #[test]
    fn stripes_hold_whole_columns_and_buckets() {
        let ctx = BuildContext::new(1, 0, 1, Vec::new()).with_tensors(lenet(256));
        let len: usize = ctx.layout.iter().sum();
        for spec in ["onebit", "adaptive", "qsgd:bucket=512", "none", "terngrad"] {
            let cfg: CodecConfig = spec.parse().unwrap();
            for world in 1..=8 {
                let plan = StripePlan::new(&cfg, &ctx, len, world);
                assert_eq!(plan.ranges.len(), world);
                assert_eq!(plan.ranges[0].start, 0);
                assert_eq!(plan.ranges[world - 1].end, len);
                for w in plan.ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                for (j, r) in plan.ranges.iter().enumerate() {
                    assert_eq!(plan.layouts[j].iter().sum::<usize>(), r.len());
                    let tl: usize = plan.tensors[j].iter().map(TensorInfo::numel).sum();
                    assert_eq!(tl, r.len(), "{spec} P={world} stripe {j}");
                }
                // Every cut is a tensor boundary or a multiple of the grain inside a tensor.
                let mut at = 0;
                for t in ctx.tensors.iter() {
                    let g = lcm(cfg.stripe_grain(Some(t)), t.column_len());
                    for r in &plan.ranges {
                        if r.start > at && r.start < at + t.numel() {
                            assert_eq!((r.start - at) % g, 0, "{spec} P={world}");
                            assert!(t.is_matrix());
                        }
                    }
                    at += t.numel();
                }
                // Balanced up to the coarsest grain (fc1 dominates LeNet but is cut by rows).
                let grain = ctx
                    .tensors
                    .iter()
                    .filter(|t| t.is_matrix())
                    .map(|t| lcm(cfg.stripe_grain(Some(t)), t.column_len()))
                    .max()
                    .unwrap();
                let max = plan.ranges.iter().map(|r| r.len()).max().unwrap();
                assert!(max <= len / world + grain, "{spec} P={world}: {plan:?}");
            }
        }
    }

    #[test]
    fn unknown_shapes_cut_at_the_codec_grain() {
        let cfg: CodecConfig = "onebit".parse().unwrap();
        let ctx = BuildContext::new(1, 0, 1, vec![10_000, 30]);
        let plan = StripePlan::new(&cfg, &ctx, 10_030, 3);
        for r in &plan.ranges[1..] {
            assert!(r.start % 2048 == 0 || r.start == 10_000, "{plan:?}");
        }
        assert!(plan.tensors.iter().all(Vec::is_empty));
    }
}
