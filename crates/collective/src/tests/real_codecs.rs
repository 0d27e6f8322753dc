//! The compressed all-reduces with every codec of `CodecConfig::examples()` (so codecs added
//! later are covered too), against references built from independent codec instances.

use gradwire_codec::{BuildContext, Codec, CodecConfig, SparseGrad};
use gradwire_transport::Transport;

use super::{local_world, quarters as grad, run_world};
use crate::compressed::{GatherDecode, Leg, QuantizedAllReduce, Reduce, SparseAllReduce};
use crate::reference;
use crate::Error;

const WORLDS: [usize; 5] = [1, 2, 3, 5, 8];
const LENS: [usize; 4] = [0, 1, 37, 1000];
const STEPS: usize = 2;
const SEED: u64 = 0x5eed;

fn ctx(rank: usize, world: usize, salt: u64) -> BuildContext {
    BuildContext {
        seed: SEED ^ salt,
        rank,
        world_size: world,
        layout: Vec::new(),
        ..Default::default()
    }
}

/// Runs `STEPS` all-reduces of `grad(rank, step, len)` on a local world of `world` ranks,
/// each rank with the all-reduce `build(rank)` returns (kept across the steps), and checks
/// that every rank's results are bit for bit `want`'s.
fn check_steps<A>(
    cfg: &CodecConfig,
    (world, len): (usize, usize),
    want: &[Vec<f32>],
    build: impl Fn(usize) -> A + Sync,
    step: impl Fn(&mut A, &mut dyn Transport, &mut [f32]) -> Result<(), Error> + Sync,
) {
    let got = run_world(local_world(world), |t| {
        let mut a = build(t.rank());
        (0..STEPS)
            .map(|s| {
                let mut b = grad(t.rank(), s, len);
                step(&mut a, t, &mut b).map(|()| b)
            })
            .collect::<Result<Vec<_>, Error>>()
    });
    // NaN-safe: the bits of every value.
    let bits = |steps: &[Vec<f32>]| -> Vec<Vec<u32>> {
        steps
            .iter()
            .map(|v| v.iter().map(|x| x.to_bits()).collect())
            .collect()
    };
    for (r, g) in got.into_iter().enumerate() {
        let g = g.unwrap_or_else(|e| panic!("{cfg} world {world} len {len}: {e}"));
        assert_eq!(
            bits(&g),
            bits(want),
            "{cfg} world {world} len {len} rank {r}"
        );
    }
}

/// Every rank's codec of `cfg` on a world of `world` ranks.
fn codecs(cfg: &CodecConfig, world: usize) -> Vec<Box<dyn Codec>> {
    (0..world).map(|r| cfg.build(&ctx(r, world, 0))).collect()
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
                let mut codecs = codecs(&cfg, world);
                let mut want = Vec::new();
                for step in 0..STEPS {
                    let grads: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
                    let mut acc = reference::gather_decode(&mut codecs, &grads);
                    Reduce::Mean.finish(&mut acc, world);
                    want.push(acc);
                }
                let build = |r| (cfg.build(&ctx(r, world, 0)), GatherDecode::new());
                check_steps(&cfg, (world, len), &want, build, |(codec, g), t, b| {
                    g.all_reduce(t, &mut **codec, b, Reduce::Mean)
                });
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
                let build =
                    |r| QuantizedAllReduce::new(len, r, world, quantized_factory(&cfg, r, world));
                check_steps(&cfg, (world, len), &want, build, |q, t, b| {
                    q.all_reduce(t, b, Reduce::Sum)
                });
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
                let mut codecs = codecs(&cfg, world);
                let mut want = Vec::new();
                for step in 0..STEPS {
                    let grads: Vec<Vec<f32>> = (0..world).map(|r| grad(r, step, len)).collect();
                    want.push(reference::sparse_sum(&mut codecs, &grads));
                }
                let build = |r| (cfg.build(&ctx(r, world, 0)), SparseAllReduce::new());
                check_steps(&cfg, (world, len), &want, build, |(codec, sa), t, b| {
                    sa.all_reduce(t, &mut **codec, b, Reduce::Sum)
                });
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
