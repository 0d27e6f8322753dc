//! The compressed all-reduces with every codec of `CodecConfig::examples()` (so codecs added
//! later are covered too), against references built from independent codec instances.

use gradwire_codec::{BuildContext, Codec, CodecConfig, SparseGrad};
use rand::{Rng, SeedableRng};

use super::{local_world, run_world};
use crate::compressed::{GatherDecode, Leg, QuantizedAllReduce, Reduce, SparseAllReduce};
use crate::reference;
use crate::Error;

const WORLDS: [usize; 5] = [1, 2, 3, 5, 8];
const LENS: [usize; 4] = [0, 1, 37, 1000];
const STEPS: usize = 2;
const SEED: u64 = 0x5eed;

fn grad(rank: usize, step: usize, len: usize) -> Vec<f32> {
    let mut g = rand::rngs::StdRng::seed_from_u64(((rank * 131 + step) as u64) << 20 | len as u64);
    (0..len)
        .map(|_| g.gen_range(-40i32..40) as f32 * 0.25)
        .collect()
}

fn ctx(rank: usize, world: usize, salt: u64) -> BuildContext {
    BuildContext {
        seed: SEED ^ salt,
        rank,
        world_size: world,
        layout: Vec::new(),
        ..Default::default()
    }
}

fn needs_scalar(cfg: &CodecConfig) -> bool {
    cfg.needs_shared_scalars()
}

fn sparsifies(cfg: &CodecConfig) -> bool {
    cfg.sparsifies()
}

#[test]
fn gather_decode_every_codec() {
    for cfg in CodecConfig::examples() {
        for world in WORLDS {
            for len in LENS {
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
                        codecs[0].decode_add(p, &mut acc).unwrap();
                    }
                    Reduce::Mean.finish(&mut acc, world);
                    want.push(acc);
                }
                let got = run_world(local_world(world), |t| {
                    let mut codec = cfg.build(&ctx(t.rank(), world, 0));
                    let mut g = GatherDecode::new();
                    (0..STEPS)
                        .map(|step| {
                            let mut b = grad(t.rank(), step, len);
                            g.all_reduce(t, &mut *codec, &mut b, Reduce::Mean)
                                .map(|()| b)
                        })
                        .collect::<Result<Vec<_>, Error>>()
                        .map_err(|e| e.to_string())
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g = g.unwrap_or_else(|e| panic!("{cfg} world {world} len {len}: {e}"));
                    for (a, b) in g.iter().zip(&want) {
                        // Bit-identical (NaN-safe comparison of bits).
                        let (a, b): (Vec<u32>, Vec<u32>) = (
                            a.iter().map(|x| x.to_bits()).collect(),
                            b.iter().map(|x| x.to_bits()).collect(),
                        );
                        assert_eq!(a, b, "{cfg} world {world} len {len} rank {r}");
                    }
                }
            }
        }
    }
}

fn quantized_factory(
    cfg: &CodecConfig,
    rank: usize,
    world: usize,
) -> impl FnMut(Leg, usize) -> Box<dyn Codec> + '_ {
    move |leg, chunk| {
        let salt = (chunk as u64 + 1) << 8 | u64::from(leg == Leg::AllGather);
        cfg.build(&ctx(rank, world, salt))
    }
}

#[test]
fn quantized_every_codec() {
    for cfg in CodecConfig::examples() {
        if needs_scalar(&cfg) {
            // Refused with a clear error, never a wrong answer.
            let got = run_world(local_world(2), |t| {
                let mut q =
                    QuantizedAllReduce::new(4, t.rank(), 2, quantized_factory(&cfg, t.rank(), 2));
                q.all_reduce(t, &mut [1.0, 2.0, 3.0, 4.0], Reduce::Sum)
            });
            // Rank 1 may see rank 0 leave instead; at least one names the codec problem.
            assert!(
                got.iter().any(|r| matches!(r, Err(Error::Codec { .. }))),
                "{cfg}: {got:?}"
            );
            continue;
        }
        for world in WORLDS {
            for len in LENS {
                let mut rs: Vec<Vec<Box<dyn Codec>>> = (0..world)
                    .map(|r| {
                        let mut f = quantized_factory(&cfg, r, world);
                        (0..world).map(|c| f(Leg::ReduceScatter, c)).collect()
                    })
                    .collect();
                let mut ag: Vec<Box<dyn Codec>> = (0..world)
                    .map(|r| quantized_factory(&cfg, r, world)(Leg::AllGather, r))
                    .collect();
                let mut want = Vec::new();
                for step in 0..STEPS {
                    let bufs: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
                    let out = reference::quantized_ring(&mut rs, &mut ag, bufs);
                    want.push(out);
                }
                let got = run_world(local_world(world), |t| {
                    let mut q = QuantizedAllReduce::new(
                        len,
                        t.rank(),
                        world,
                        quantized_factory(&cfg, t.rank(), world),
                    );
                    (0..STEPS)
                        .map(|step| {
                            let mut b = grad(t.rank(), step, len);
                            q.all_reduce(t, &mut b, Reduce::Sum).map(|()| b)
                        })
                        .collect::<Result<Vec<_>, Error>>()
                        .map_err(|e| e.to_string())
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g = g.unwrap_or_else(|e| panic!("{cfg} world {world} len {len}: {e}"));
                    let bits = |v: &Vec<Vec<f32>>| -> Vec<Vec<u32>> {
                        v.iter()
                            .map(|x| x.iter().map(|y| y.to_bits()).collect())
                            .collect()
                    };
                    assert_eq!(
                        bits(&g),
                        bits(&want),
                        "{cfg} world {world} len {len} rank {r}"
                    );
                }
            }
        }
    }
}

#[test]
fn sparse_every_sparsifying_codec() {
    let mut tested = Vec::new();
    for cfg in CodecConfig::examples().into_iter().filter(sparsifies) {
        tested.push(cfg.clone());
        for world in WORLDS {
            for len in LENS {
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
                let got = run_world(local_world(world), |t| {
                    let mut codec = cfg.build(&ctx(t.rank(), world, 0));
                    let mut sa = SparseAllReduce::new();
                    (0..STEPS)
                        .map(|step| {
                            let mut b = grad(t.rank(), step, len);
                            sa.all_reduce(t, &mut *codec, &mut b, Reduce::Sum)
                                .map(|()| b)
                        })
                        .collect::<Result<Vec<_>, Error>>()
                        .map_err(|e| e.to_string())
                });
                for (r, g) in got.into_iter().enumerate() {
                    let g = g.unwrap_or_else(|e| panic!("{cfg} world {world} len {len}: {e}"));
                    assert_eq!(g, want, "{cfg} world {world} len {len} rank {r}");
                }
            }
        }
    }
    // Every sparsifying family of the example set went through the sparse all-reduce: an
    // example set or a `caps()` that stopped marking them would otherwise pass untested.
    let mut families: Vec<String> = tested.iter().map(|c| c.name().to_string()).collect();
    families.dedup();
    assert_eq!(
        families,
        ["topk", "threshold", "randomk", "dgc"],
        "sparse all-reduce tested with {tested:?}"
    );
}

/// Strom's threshold codec through the sparse all-reduce travels as Strom's message: on two
/// ranks each sends one message of 32 bits per selected element (plus the 16-byte header
/// and the 4-byte tau), half of what (index, value) pairs cost.
#[test]
fn threshold_travels_as_32_bit_sign_words() {
    let len = 1000;
    let cfg: CodecConfig = "threshold:tau=9".parse().unwrap();
    let got = run_world(local_world(2), |t| {
        let mut codec = cfg.build(&ctx(t.rank(), 2, 0));
        let mut mine = SparseGrad::default();
        let g = grad(t.rank(), 0, len);
        cfg.build(&ctx(t.rank(), 2, 0))
            .sparse_encode()
            .expect("threshold sparsifies")
            .encode_sparse(&g, &mut mine);
        let mut b = g;
        SparseAllReduce::new()
            .all_reduce(t, &mut *codec, &mut b, Reduce::Sum)
            .unwrap();
        (mine.indices.len(), t.bytes_sent())
    });
    for (count, bytes) in got {
        assert!(count > 0 && count * 3 < len, "{count} selected");
        assert_eq!(bytes, 16 + 4 + 4 * count as u64);
    }
}
