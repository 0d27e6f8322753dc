//! The hierarchical dense path chosen from declared hosts: results against independently
//! written references (the flat rank-order mean on exact data; the host-grouped rank-order
//! mean bit for bit on inexact data), fusion on and off bit-identical under the hierarchy,
//! and a flat layout staying flat.

use std::time::Duration;

use gradwire_transport::local::Local;
use gradwire_transport::Transport;

use super::{bits, grad, naive_mean};
use crate::{Engine, EngineConfig, HostConfig, LocalLink, TensorSpec};

fn specs() -> Vec<TensorSpec> {
    vec![
        TensorSpec::new("conv.weight", [4, 3, 3]),
        TensorSpec::new("conv.bias", [4]),
        TensorSpec::new("fc.weight", [10, 37]),
        TensorSpec::new("fc.bias", [10]),
    ]
}

/// Runs `steps` steps of every tensor on ranks placed on `hosts` (one declared name per
/// rank), each rank's gradients from `g(rank, step, tensor, len)`; per rank, per step, per
/// tensor, the reduced values.
fn run(
    hosts: &[&str],
    fusion_bytes: usize,
    steps: usize,
    g: &(dyn Fn(usize, usize, usize, usize) -> Vec<f32> + Sync),
) -> Vec<Vec<Vec<Vec<f32>>>> {
    let n = hosts.len();
    // Each host's local world, its ranks numbered in job-rank order.
    let mut links: Vec<Option<LocalLink>> = (0..n).map(|_| None).collect();
    let mut seen: Vec<&str> = Vec::new();
    for &h in hosts {
        if seen.contains(&h) {
            continue;
        }
        seen.push(h);
        let members: Vec<usize> = (0..n).filter(|&r| hosts[r] == h).collect();
        for (r, t) in members.iter().zip(Local::world(members.len())) {
            links[*r] = Some(LocalLink::given(t));
        }
    }
    let tensors = specs();
    std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(n)
            .into_iter()
            .zip(links)
            .map(|(mut t, link)| {
                let tensors = tensors.clone();
                let host = hosts[t.rank()].to_string();
                t.set_timeout(Duration::from_secs(10));
                s.spawn(move || {
                    let rank = t.rank();
                    let cfg = EngineConfig {
                        fusion_bytes,
                        hosts: Some(HostConfig {
                            host,
                            local: link.expect("a link per rank"),
                        }),
                        ..EngineConfig::default()
                    };
                    let e = Engine::start(t, cfg, &tensors).unwrap();
                    let mut out = Vec::new();
                    for step in 0..steps {
                        let hs = e.all_reduce_batch(
                            tensors
                                .iter()
                                .enumerate()
                                .map(|(i, ts)| (ts.name.clone(), g(rank, step, i, ts.len()))),
                        );
                        out.push(hs.into_iter().map(|h| h.wait().unwrap()).collect());
                    }
                    e.shutdown().unwrap();
                    out
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank panicked"))
            .collect()
    })
}

/// Written independently of the engine: per host (in order of its lowest rank) its ranks'
/// values summed in rank order, the host sums summed in host order, divided by P.
fn host_grouped_mean(hosts: &[&str], inputs: &[Vec<f32>]) -> Vec<f32> {
    let mut order: Vec<&str> = Vec::new();
    for &h in hosts {
        if !order.contains(&h) {
            order.push(h);
        }
    }
    (0..inputs[0].len())
        .map(|i| {
            let mut total: Option<f32> = None;
            for h in &order {
                let mut host: Option<f32> = None;
                for (r, x) in inputs.iter().enumerate() {
                    if hosts[r] == *h {
                        host = Some(host.map_or(x[i], |s| s + x[i]));
                    }
                }
                let host = host.expect("a host has ranks");
                total = Some(total.map_or(host, |s| s + host));
            }
            total.expect("ranks") / inputs.len() as f32
        })
        .collect()
}

/// Whole numbers: every sum is exact, so any summation order gives the flat mean's bits.
fn whole(rank: usize, step: usize, tensor: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((rank * 7 + i * 3 + step * 5 + tensor) % 17) as f32 - 8.0)
        .collect()
}

const LAYOUTS: [&[&str]; 3] = [
    &["a", "a", "b", "b"],
    &["x", "y", "y", "z", "z", "z"],
    &["b", "a", "b", "a", "a"],
];

#[test]
fn declared_hosts_equal_the_flat_reference() {
    let tensors = specs();
    for hosts in LAYOUTS {
        let n = hosts.len();
        let got = run(hosts, 4 << 20, 2, &whole);
        for step in 0..2 {
            for (i, t) in tensors.iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..n).map(|r| whole(r, step, i, t.len())).collect();
                let want = naive_mean(&inputs);
                for (r, g) in got.iter().enumerate() {
                    assert_eq!(
                        bits(&g[step][i]),
                        bits(&want),
                        "hosts {hosts:?} rank {r} step {step} tensor {}",
                        t.name
                    );
                }
            }
        }
    }
}

#[test]
fn declared_hosts_sum_by_host_and_fusion_stays_bit_identical() {
    let tensors = specs();
    for hosts in LAYOUTS {
        let n = hosts.len();
        let fused = run(hosts, 4 << 20, 2, &grad);
        let unfused = run(hosts, 0, 2, &grad);
        let mut differs_from_flat = false;
        for step in 0..2 {
            for (i, t) in tensors.iter().enumerate() {
                let inputs: Vec<Vec<f32>> = (0..n).map(|r| grad(r, step, i, t.len())).collect();
                let want = host_grouped_mean(hosts, &inputs);
                differs_from_flat |= bits(&want) != bits(&naive_mean(&inputs));
                for r in 0..n {
                    let label = format!("hosts {hosts:?} rank {r} step {step} {}", t.name);
                    assert_eq!(bits(&fused[r][step][i]), bits(&want), "fused, {label}");
                    assert_eq!(bits(&unfused[r][step][i]), bits(&want), "unfused, {label}");
                }
            }
        }
        // The data is inexact enough that the grouping shows: the hierarchy really ran.
        assert!(
            differs_from_flat,
            "hosts {hosts:?}: no element tells the paths apart"
        );
    }
}

#[test]
fn one_rank_per_host_stays_flat() {
    let tensors = specs();
    let hosts = ["a", "b", "c"];
    let got = run(&hosts, 4 << 20, 1, &grad);
    for (i, t) in tensors.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..3).map(|r| grad(r, 0, i, t.len())).collect();
        let want = naive_mean(&inputs);
        for g in &got {
            assert_eq!(bits(&g[0][i]), bits(&want), "{}", t.name);
        }
    }
}
