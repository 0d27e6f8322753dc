//! The executor ([`Exec`]): runs one group of one kind over the transport, with its reusable
//! buffers, and leaves each tensor's result in its buffer.

use gradwire_codec::{Codec, SparseGrad};
use gradwire_collective::compressed::{decode_add_each, Reduce, SparseAllReduce};
use gradwire_collective::{Algorithm, CollectiveConfig, ReduceOp};
use gradwire_transport::Transport;

use super::pack::{fuse_into, mean, split_all, sum_pairs_into, unfuse_from};
use super::{Clock, Item, Kind};
use crate::config::{DenseAlgorithm, MomentumConfig};
use crate::encoded::Encoded;
use crate::error::{Error, Result};
use crate::timeline::Phase;

/// Reusable buffers of the executors.
#[derive(Default)]
pub(crate) struct Exec {
    pub collective: CollectiveConfig,
    pub dense: DenseAlgorithm,
    fused: Vec<f32>,
    scratch: Vec<f32>,
    payload: Vec<u8>,
    message: Vec<u8>,
    gathered: Vec<Vec<u8>>,
    pairs: SparseGrad,
    fused_pairs: SparseGrad,
    sparse: SparseAllReduce,
    bcast: Vec<u8>,
    /// The hierarchy, when the job spans several hosts with several ranks on one: the
    /// dense reduction goes through it ([`crate::dense::hierarchical_mean`]).
    pub hosts: Option<crate::dense::HostLinks>,
}

/// Momentum correction: `u = beta u + g`, then `g = u` (Nesterov: `g + beta u`).
pub(crate) fn apply_momentum(m: &MomentumConfig, velocity: &mut Vec<f32>, g: &mut [f32]) {
    if velocity.len() != g.len() {
        *velocity = vec![0.0; g.len()];
    }
    for (u, g) in velocity.iter_mut().zip(g.iter_mut()) {
        *u = m.beta * *u + *g;
        *g = if m.nesterov { *g + m.beta * *u } else { *u };
    }
}

/// The entries this rank's own `payload` sends: `out` becomes `len` zeros with the payload
/// decoded into them (a payload that does not decode is this rank's, `rank`).
fn read_back(
    codec: &dyn Codec,
    payload: &[u8],
    len: usize,
    out: &mut Vec<f32>,
    rank: usize,
) -> std::result::Result<(), gradwire_collective::Error> {
    out.clear();
    out.resize(len, 0.0);
    codec
        .decode_add(payload, out)
        .map_err(|source| gradwire_collective::Error::Decode { peer: rank, source })
}

/// The refusal of a sparse strategy whose codec does not sparsify.
fn not_sparsifying() -> Error {
    gradwire_collective::Error::Codec {
        what: "sparse strategy with a codec that does not sparsify",
    }
    .into()
}

impl Exec {
    pub(crate) fn new(collective: CollectiveConfig, dense: DenseAlgorithm) -> Exec {
        Exec {
            collective,
            dense,
            ..Default::default()
        }
    }

    /// Bytes sent over the hierarchy's local link (0 when flat).
    pub(crate) fn local_bytes_sent(&self) -> u64 {
        self.hosts.as_ref().map_or(0, |h| h.bytes_sent())
    }

    /// Runs one group (all items of one kind) and leaves each item's result in its `data`.
    pub(crate) fn run(
        &mut self,
        t: &mut dyn Transport,
        momentum: Option<&MomentumConfig>,
        items: &mut [Item<'_>],
        clock: &mut Clock,
    ) -> Result<()> {
        let kind = items[0].state.kind;
        debug_assert!(
            matches!(kind, Kind::Gather | Kind::Sparse)
                || items.iter().all(|it| it.encoded.is_none()),
            "pre-encoded submissions are admitted under gather and sparse only"
        );
        if !matches!(kind, Kind::AllGather | Kind::Broadcast(_) | Kind::Barrier) {
            if let Some(m) = momentum {
                for it in items.iter_mut() {
                    if let Some(v) = it.state.velocity.as_mut() {
                        apply_momentum(m, v, it.data);
                    }
                }
            }
            for it in items.iter_mut() {
                if let Some(c) = it.state.codec.as_mut() {
                    c.set_progress(it.progress);
                }
                if let Some(q) = it.state.quantized.as_mut() {
                    for c in 0..t.world_size() {
                        q.rs_codec_mut(c).set_progress(it.progress);
                    }
                    q.ag_codec_mut().set_progress(it.progress);
                }
                if let Some(s) = it.state.stripe.as_mut() {
                    s.set_progress(it.progress);
                }
            }
        }
        let mask = momentum.is_some_and(|m| m.masking);
        match kind {
            Kind::Dense => self.dense(t, items, clock),
            Kind::Gather => self.gather(t, items, mask, clock),
            Kind::Sparse => self.sparse(t, items, mask, clock),
            Kind::GatherUnit(_) | Kind::SparseUnit(_) => self.unit(t, items, mask, clock),
            // Strategies whose state belongs to one tensor: each reduces alone.
            Kind::Quantized | Kind::Stripe | Kind::PowerSgd => {
                clock.mark(Phase::Fuse);
                for it in items.iter_mut() {
                    let st = &mut it.state;
                    match kind {
                        Kind::Quantized => st
                            .quantized
                            .as_mut()
                            .expect("quantized state")
                            .all_reduce(t, it.data, Reduce::Mean)?,
                        Kind::Stripe => st.stripe.as_mut().expect("stripe state").all_reduce(
                            t,
                            it.data,
                            Reduce::Mean,
                        )?,
                        _ => st.powersgd.as_mut().expect("powersgd state").all_reduce(
                            t,
                            it.data,
                            Reduce::Mean,
                        )?,
                    }
                }
                clock.mark(Phase::Wire);
                Ok(())
            }
            Kind::AllGather => self.all_gather(t, items, clock),
            Kind::Broadcast(root) => self.broadcast(t, root, items, clock),
            Kind::Barrier => Ok(()),
        }
    }

    fn reduce_dense(&mut self, t: &mut dyn Transport, buf: &mut [f32], fused: bool) -> Result<()> {
        let _ = fused;
        if let Some(h) = self.hosts.as_mut() {
            let seg = self.collective.segment_bytes();
            match self.dense {
                // Rank order within each host, host order across: position-independent, so
                // fusion stays bit-identical (Tree has no hierarchical variant of its own).
                DenseAlgorithm::Canonical | DenseAlgorithm::Tree => {
                    crate::dense::hierarchical_mean(t, h, buf, seg, &mut self.scratch)?
                }
                // The collective crate's hierarchical all-reduce (ring within the host).
                DenseAlgorithm::Collective => h.all_reduce(t, buf, ReduceOp::Mean)?,
            }
            return Ok(());
        }
        match self.dense {
            DenseAlgorithm::Canonical => crate::dense::canonical_mean(
                t,
                buf,
                self.collective.segment_bytes(),
                &mut self.scratch,
            )?,
            DenseAlgorithm::Tree => gradwire_collective::all_reduce(
                t,
                buf,
                ReduceOp::Mean,
                Algorithm::Rabenseifner,
                self.collective.segment_bytes(),
            )?,
            DenseAlgorithm::Collective => {
                gradwire_collective::all_reduce_config(t, buf, ReduceOp::Mean, &self.collective)?
            }
        }
        Ok(())
    }

    fn dense(
        &mut self,
        t: &mut dyn Transport,
        items: &mut [Item<'_>],
        clock: &mut Clock,
    ) -> Result<()> {
        if items.len() == 1 {
            clock.mark(Phase::Fuse);
            self.reduce_dense(t, items[0].data, false)?;
            clock.mark(Phase::Wire);
            return Ok(());
        }
        let mut fused = std::mem::take(&mut self.fused);
        fuse_into(items, &mut fused);
        clock.mark(Phase::Fuse);
        let res = self.reduce_dense(t, &mut fused, true);
        clock.mark(Phase::Wire);
        if res.is_ok() {
            unfuse_from(items, &fused);
        }
        self.fused = fused;
        clock.mark(Phase::Unfuse);
        res
    }

    fn gather(
        &mut self,
        t: &mut dyn Transport,
        items: &mut [Item<'_>],
        mask: bool,
        clock: &mut Clock,
    ) -> Result<()> {
        let world = t.world_size();
        clock.mark(Phase::Fuse);
        // Shared scalars (TernGrad): every tensor's in one exact max all-reduce.
        let mut scalars: Vec<f32> = Vec::new();
        let mut counts = Vec::with_capacity(items.len());
        for it in items.iter_mut() {
            let codec = it.state.codec.as_mut().expect("gather codec");
            if let Some(shared) = codec.shared_scalars() {
                let v = shared.local_scalars(it.data);
                counts.push(Some(v.len()));
                scalars.extend(v);
            } else {
                counts.push(None);
            }
        }
        if counts.iter().any(Option::is_some) {
            gradwire_collective::all_reduce(
                t,
                &mut scalars,
                ReduceOp::Max,
                Algorithm::RecursiveDoubling,
                64,
            )?;
            let mut off = 0;
            for (it, n) in items.iter_mut().zip(&counts) {
                if let Some(n) = n {
                    let codec = it.state.codec.as_mut().expect("gather codec");
                    if let Some(shared) = codec.shared_scalars() {
                        shared.set_shared_scalars(&scalars[off..off + n]);
                    }
                    off += n;
                }
            }
        }
        self.message.clear();
        for it in items.iter_mut() {
            if let Some(Encoded::Payload(p)) = it.encoded {
                // Pre-encoded here (momentum is off, so nothing to mask).
                self.message
                    .extend_from_slice(&(p.len() as u32).to_le_bytes());
                self.message.extend_from_slice(p);
                continue;
            }
            let codec = it.state.codec.as_mut().expect("gather codec");
            codec.encode(it.data, &mut self.payload);
            if let (true, Some(u)) = (mask && codec.id().sparsifies(), &mut it.state.velocity) {
                // Momentum factor masking: zero u where this rank's payload sent an entry.
                let len = it.data.len();
                read_back(&**codec, &self.payload, len, &mut self.scratch, t.rank())?;
                for (u, &x) in u.iter_mut().zip(&self.scratch) {
                    if x != 0.0 {
                        *u = 0.0;
                    }
                }
            }
            self.message
                .extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
            self.message.extend_from_slice(&self.payload);
        }
        clock.mark(Phase::Encode);
        gradwire_collective::gather::all_gather_bytes(t, &self.message, &mut self.gathered)?;
        clock.mark(Phase::Wire);
        let parts = split_all(&self.gathered, items.len())?;
        for (i, it) in items.iter_mut().enumerate() {
            let codec = it.state.codec.as_ref().expect("gather codec");
            it.data.fill(0.0);
            decode_add_each(&**codec, parts.iter().map(|p| p[i]), it.data)?;
            mean(it.data, world);
        }
        clock.mark(Phase::Decode);
        Ok(())
    }

    fn sparse(
        &mut self,
        t: &mut dyn Transport,
        items: &mut [Item<'_>],
        mask: bool,
        clock: &mut Clock,
    ) -> Result<()> {
        clock.mark(Phase::Fuse);
        self.fused_pairs.clear();
        let mut off = 0u32;
        for it in items.iter_mut() {
            let pairs = match it.encoded {
                // Pre-encoded here (momentum is off, so nothing to mask).
                Some(Encoded::Pairs(p)) => p,
                _ => {
                    let codec = it.state.codec.as_mut().expect("sparse codec");
                    let Some(codec) = codec.sparse_encode() else {
                        return Err(not_sparsifying());
                    };
                    self.pairs.clear();
                    codec.encode_sparse(it.data, &mut self.pairs);
                    &self.pairs
                }
            };
            if let (true, Some(u)) = (mask, &mut it.state.velocity) {
                // Momentum factor masking: zero u at the sent indices.
                for &i in &pairs.indices {
                    if let Some(u) = u.get_mut(i as usize) {
                        *u = 0.0;
                    }
                }
            }
            self.fused_pairs
                .indices
                .extend(pairs.indices.iter().map(|i| i + off));
            self.fused_pairs.values.extend_from_slice(&pairs.values);
            off += it.data.len() as u32;
        }
        clock.mark(Phase::Encode);
        sum_pairs_into(&mut self.sparse, t, &self.fused_pairs, items, clock)
    }

    /// A selection unit (a global-scope top-k policy's tensors, all of them, in registration
    /// order): the first item's codec, built over the layout of all of them, selects once
    /// over their concatenation (its residual is the concatenation's); the selection is
    /// summed by one sparse all-reduce ([`Kind::SparseUnit`]) or all-gathered and decoded in
    /// rank order ([`Kind::GatherUnit`]), then each tensor takes its slice of the mean.
    fn unit(
        &mut self,
        t: &mut dyn Transport,
        items: &mut [Item<'_>],
        mask: bool,
        clock: &mut Clock,
    ) -> Result<()> {
        let world = t.world_size();
        let sparse = matches!(items[0].state.kind, Kind::SparseUnit(_));
        let mut cat = std::mem::take(&mut self.scratch);
        fuse_into(items, &mut cat);
        clock.mark(Phase::Fuse);
        let codec = items[0].state.codec.as_mut().expect("the unit's codec");
        self.pairs.clear();
        if sparse {
            let Some(codec) = codec.sparse_encode() else {
                self.scratch = cat;
                return Err(not_sparsifying());
            };
            codec.encode_sparse(&cat, &mut self.pairs);
        } else {
            codec.encode(&cat, &mut self.payload);
            if mask {
                // The sent entries, read back from this rank's own payload.
                let len = cat.len();
                read_back(&**codec, &self.payload, len, &mut cat, t.rank())?;
                let sent = cat.iter().enumerate().filter(|(_, &x)| x != 0.0);
                self.pairs.indices.extend(sent.map(|(i, _)| i as u32));
            }
        }
        if mask {
            // Momentum factor masking: zero u at the sent indices (increasing), tensor by
            // tensor.
            let (mut it, mut off) = (0, 0usize);
            for &i in &self.pairs.indices {
                let i = i as usize;
                while i >= off + items[it].data.len() {
                    off += items[it].data.len();
                    it += 1;
                }
                if let Some(u) = items[it].state.velocity.as_mut() {
                    u[i - off] = 0.0;
                }
            }
        }
        clock.mark(Phase::Encode);
        if sparse {
            self.scratch = cat;
            return sum_pairs_into(&mut self.sparse, t, &self.pairs, items, clock);
        }
        // The concatenation's length stays; its values become the sum's accumulator.
        cat.fill(0.0);
        let res =
            gradwire_collective::gather::all_gather_bytes(t, &self.payload, &mut self.gathered);
        clock.mark(Phase::Wire);
        if res.is_ok() {
            let codec = items[0].state.codec.as_ref().expect("the unit's codec");
            let payloads = self.gathered.iter().map(Vec::as_slice);
            if let Err(e) = decode_add_each(&**codec, payloads, &mut cat) {
                self.scratch = cat;
                return Err(e.into());
            }
            clock.mark(Phase::Decode);
        }
        if res.is_ok() {
            mean(&mut cat, world);
            unfuse_from(items, &cat);
        }
        self.scratch = cat;
        clock.mark(Phase::Unfuse);
        Ok(res?)
    }

    fn all_gather(
        &mut self,
        t: &mut dyn Transport,
        items: &mut [Item<'_>],
        clock: &mut Clock,
    ) -> Result<()> {
        self.message.clear();
        for it in items.iter() {
            self.message
                .extend_from_slice(&((it.data.len() * 4) as u32).to_le_bytes());
            self.message
                .extend_from_slice(bytemuck::cast_slice(it.data));
        }
        clock.mark(Phase::Fuse);
        gradwire_collective::gather::all_gather_bytes(t, &self.message, &mut self.gathered)?;
        clock.mark(Phase::Wire);
        let parts = split_all(&self.gathered, items.len())?;
        for (i, it) in items.iter_mut().enumerate() {
            it.data.clear();
            for (peer, p) in parts.iter().enumerate() {
                if p[i].len() % 4 != 0 {
                    return Err(Error::Protocol {
                        peer,
                        what: "all-gather payload is not a whole number of f32",
                    });
                }
                it.data.extend(
                    p[i].chunks_exact(4)
                        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes"))),
                );
            }
        }
        clock.mark(Phase::Unfuse);
        Ok(())
    }

    fn broadcast(
        &mut self,
        t: &mut dyn Transport,
        root: usize,
        items: &mut [Item<'_>],
        clock: &mut Clock,
    ) -> Result<()> {
        self.bcast.clear();
        if t.rank() == root {
            for it in items.iter() {
                self.bcast.extend_from_slice(bytemuck::cast_slice(it.data));
            }
        }
        clock.mark(Phase::Fuse);
        gradwire_collective::broadcast::broadcast_bytes(
            t,
            &mut self.bcast,
            root,
            self.collective.segment_bytes(),
            gradwire_collective::broadcast::DEFAULT_MAX_BROADCAST_BYTES,
        )?;
        clock.mark(Phase::Wire);
        let total: usize = items.iter().map(|it| it.data.len() * 4).sum();
        if self.bcast.len() != total {
            return Err(Error::Protocol {
                peer: root,
                what: "broadcast of another length than negotiated",
            });
        }
        let mut off = 0;
        for it in items.iter_mut() {
            let n = it.data.len() * 4;
            for (x, b) in it
                .data
                .iter_mut()
                .zip(self.bcast[off..off + n].chunks_exact(4))
            {
                *x = f32::from_le_bytes(b.try_into().expect("4 bytes"));
            }
            off += n;
        }
        clock.mark(Phase::Unfuse);
        Ok(())
    }
}
