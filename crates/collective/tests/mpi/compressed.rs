//! The compressed section: the compressed all-reduces with the codec crate's examples
//! (gather-decode, sparse, the quantized ring) against step-by-step references.

use gradwire_codec::{BuildContext, Codec, CodecConfig, SparseGrad};
use gradwire_collective::compressed::{
    GatherDecode, Leg, QuantizedAllReduce, Reduce, SparseAllReduce,
};
use gradwire_collective::reference;
use gradwire_transport::mpi::Mpi;
use gradwire_transport::Transport;
use rand::{Rng, SeedableRng};

use crate::suite::Tally;

pub(crate) const SEED: u64 = 0x5eed;

pub(crate) fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64(((rank * 131 + step) as u64) << 20 | len as u64);
    (0..len)
        .map(|_| g.gen_range(-40i32..40) as f32 * 0.25)
        .collect()
}

pub(crate) fn ctx(rank: usize, world: usize, salt: u64) -> BuildContext {
    BuildContext {
        seed: SEED ^ salt,
        rank,
        world_size: world,
        layout: Vec::new(),
        ..Default::default()
    }
}

pub(crate) fn quantized_factory(
    cfg: &CodecConfig,
    rank: usize,
    world: usize,
) -> impl FnMut(Leg, usize) -> Box<dyn Codec> + '_ {
    move |leg, chunk| {
        let salt = (chunk as u64 + 1) << 8 | u64::from(leg == Leg::AllGather);
        cfg.build(&ctx(rank, world, salt))
    }
}

pub(crate) fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|x| x.iter().map(|y| y.to_bits()).collect())
        .collect()
}

pub(crate) fn compressed_checks(t: &mut Mpi, k: &mut Tally) {
    let (rank, world) = (t.rank(), t.world_size());
    const STEPS: usize = 2;
    for cfg in CodecConfig::examples() {
        let (needs_scalar, sparsifies) = (cfg.needs_shared_scalars(), cfg.sparsifies());
        for len in [0usize, 1, 37, 1000] {
            if k.broken {
                return;
            }
            // Gather-decode: every rank decodes every payload, in rank order.
            let mut codecs: Vec<Box<dyn Codec>> =
                (0..world).map(|r| cfg.build(&ctx(r, world, 0))).collect();
            let mut want = Vec::new();
            for step in 0..STEPS {
                let grads: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
                let shared = codecs
                    .iter_mut()
                    .zip(&grads)
                    .filter_map(|(c, g)| c.shared_scalars().map(|s| s.local_scalars(g)))
                    .reduce(|a, b| a.iter().zip(&b).map(|(x, y)| x.max(*y)).collect());
                let mut acc = vec![0.0f32; len];
                let mut payloads = Vec::new();
                for r in 0..world {
                    if let (Some(s), Some(c)) = (&shared, codecs[r].shared_scalars()) {
                        c.set_shared_scalars(s);
                    }
                    let mut p = Vec::new();
                    codecs[r].encode(&grads[r], &mut p);
                    payloads.push(p);
                }
                for p in &payloads {
                    codecs[0].decode_add(p, &mut acc).expect("decode");
                }
                acc.iter_mut().for_each(|x| *x /= world as f32);
                want.push(acc);
            }
            let mut codec = cfg.build(&ctx(rank, world, 0));
            let mut g = GatherDecode::new();
            let got: Result<Vec<Vec<f32>>, _> = (0..STEPS)
                .map(|step| {
                    let mut b = grad(rank, step, len);
                    g.all_reduce(t, &mut *codec, &mut b, Reduce::Mean)
                        .map(|()| b)
                })
                .collect();
            if let Some(got) = k.res(&format!("{cfg} gather-decode len {len}"), got) {
                k.eq(
                    &format!("{cfg} gather-decode len {len}"),
                    &bits(&got),
                    &bits(&want),
                );
            }

            if !needs_scalar {
                quantized_one(t, k, &cfg, len, STEPS);
            }
            if sparsifies {
                let mut codecs: Vec<Box<dyn Codec>> =
                    (0..world).map(|r| cfg.build(&ctx(r, world, 0))).collect();
                let mut want = Vec::new();
                for step in 0..STEPS {
                    let mut acc = vec![0.0f32; len];
                    let mut s = SparseGrad::default();
                    for (r, c) in codecs.iter_mut().enumerate() {
                        let c = c.sparse_encode().expect("a sparsifier");
                        c.encode_sparse(&grad(r, step, len), &mut s);
                        for (&i, &v) in s.indices.iter().zip(&s.values) {
                            acc[i as usize] += v;
                        }
                    }
                    want.push(acc);
                }
                let mut codec = cfg.build(&ctx(rank, world, 0));
                let mut sa = SparseAllReduce::new();
                let got: Result<Vec<Vec<f32>>, _> = (0..STEPS)
                    .map(|step| {
                        let mut b = grad(rank, step, len);
                        sa.all_reduce(t, &mut *codec, &mut b, Reduce::Sum)
                            .map(|()| b)
                    })
                    .collect();
                if let Some(got) = k.res(&format!("{cfg} sparse len {len}"), got) {
                    k.eq(&format!("{cfg} sparse len {len}"), &got, &want);
                }
            }
        }
    }
}

/// The quantized ring (Dryden) against a step-by-step simulation with independent codecs.
pub(crate) fn quantized_one(
    t: &mut Mpi,
    k: &mut Tally,
    cfg: &CodecConfig,
    len: usize,
    steps: usize,
) {
    let (rank, world) = (t.rank(), t.world_size());
    let mut rs: Vec<Vec<Box<dyn Codec>>> = (0..world)
        .map(|r| {
            let mut f = quantized_factory(cfg, r, world);
            (0..world).map(|c| f(Leg::ReduceScatter, c)).collect()
        })
        .collect();
    let mut ag: Vec<Box<dyn Codec>> = (0..world)
        .map(|r| quantized_factory(cfg, r, world)(Leg::AllGather, r))
        .collect();
    let mut want = Vec::new();
    for step in 0..steps {
        let bufs: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
        want.push(reference::quantized_ring(&mut rs, &mut ag, bufs));
    }
    let mut q = QuantizedAllReduce::new(len, rank, world, quantized_factory(cfg, rank, world));
    let got: Result<Vec<Vec<f32>>, _> = (0..steps)
        .map(|step| {
            let mut b = grad(rank, step, len);
            q.all_reduce(t, &mut b, Reduce::Sum).map(|()| b)
        })
        .collect();
    if let Some(got) = k.res(&format!("{cfg} quantized len {len}"), got) {
        k.eq(
            &format!("{cfg} quantized len {len}"),
            &bits(&got),
            &bits(&want),
        );
    }
}
