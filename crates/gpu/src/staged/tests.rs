//! The staged path against the simulated device and real engines over in-process ranks:
//! results against sums computed here, stream order (held streams), buffer reuse, errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gradwire_engine::{Engine, EngineConfig, TensorSpec};
use gradwire_transport::local::Local;

use super::pool::Pool;
use super::sim::Sim;
use super::{Stager, StreamApi};
use crate::error::Error;

/// Runs `f(rank, engine, sim)` on every rank of a world of `n` with `tensors` registered.
fn world<R: Send + 'static>(
    n: usize,
    tensors: &[TensorSpec],
    f: impl Fn(usize, Arc<Engine>, Sim) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let hs: Vec<_> = Local::world(n)
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let (f, tensors) = (f.clone(), tensors.to_vec());
            std::thread::spawn(move || {
                let e = Arc::new(Engine::start(t, EngineConfig::default(), &tensors).unwrap());
                let r = f(rank, e.clone(), Sim::default());
                Arc::into_inner(e)
                    .expect("the stager is dropped first")
                    .shutdown()
                    .unwrap();
                r
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn values(rank: usize, len: usize, salt: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7 + rank * 13 + salt * 5) % 101) as f32 - 50.0)
        .collect()
}

/// The mean over `n` ranks of `values`, in rank order.
fn mean(n: usize, len: usize, salt: usize) -> Vec<f32> {
    let mut acc = vec![0f32; len];
    for r in 0..n {
        for (a, v) in acc.iter_mut().zip(values(r, len, salt)) {
            *a += v;
        }
    }
    acc.iter().map(|a| a / n as f32).collect()
}

#[test]
fn submission_returns_before_the_gradient_exists_and_the_copy_waits_for_it() {
    let n = 3;
    let len = 1000;
    let tensors = vec![TensorSpec::new("w", [len])];
    let out = world(n, &tensors, move |rank, engine, sim| {
        let stager = Stager::new(sim.clone(), engine).unwrap();
        let s = sim.stream();
        let g = sim.alloc(len);
        // The "backward pass" is held back; the gradient is written after it.
        let gate = sim.hold(s);
        sim.write(s, &g, values(rank, len, 0));
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let (o, gate) = (opened.clone(), gate.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(5));
                o.store(true, Ordering::SeqCst);
                Sim::open(&gate);
            })
        };
        // SAFETY: `g` lives until after the wait below.
        let staged = unsafe { stager.all_reduce("w", g.ptr(), len, s, 1.0) }.unwrap();
        stager.flush();
        let returned_first = !opened.load(Ordering::SeqCst);
        Sim::open(&gate);
        // SAFETY: as above.
        unsafe { staged.wait_into(g.ptr(), len, s, 1.0) }.unwrap();
        let got = sim.read(s, &g);
        opener.join().unwrap();
        drop(stager);
        (returned_first, got)
    });
    for (rank, (returned_first, got)) in out.into_iter().enumerate() {
        assert!(
            returned_first,
            "rank {rank}: the submission waited for the GPU"
        );
        assert_eq!(got, mean(n, len, 0), "rank {rank}");
    }
}

#[test]
fn the_copy_up_is_ordered_on_the_stream_and_no_buffer_in_use_is_reused() {
    let n = 2;
    let len = 300;
    let tensors = vec![TensorSpec::new("a", [len])];
    let out = world(n, &tensors, move |rank, engine, sim| {
        let stager = Stager::new(sim.clone(), engine).unwrap();
        let (s, s2) = (sim.stream(), sim.stream());
        let (a, c) = (sim.alloc(len), sim.alloc(len));
        sim.write(s, &a, values(rank, len, 1));
        sim.write(s2, &c, values(rank, len, 2));
        // SAFETY: `a` and `c` live until the end.
        let sa = unsafe { stager.all_reduce("a", a.ptr(), len, s, 1.0) }.unwrap();
        stager.flush();
        // a's copy up queues behind a held kernel: the host does not wait for it, and its
        // pinned buffer stays in use until the stream gets there.
        let gate = sim.hold(s);
        // SAFETY: as above.
        unsafe { sa.wait_into(a.ptr(), len, s, 2.0) }.unwrap();
        // Meanwhile another tensor is staged on another stream, which runs at once: its
        // copy down must not land in a's buffer.
        // SAFETY: as above.
        let sc = unsafe { stager.all_reduce("c", c.ptr(), len, s2, 1.0) }.unwrap();
        stager.flush();
        let gc = sc.wait_host().unwrap();
        let allocated = stager.pool.lock().unwrap().allocated();
        Sim::open(&gate);
        let ga = sim.read(s, &a);
        drop(stager);
        (allocated, ga, gc)
    });
    let want_a: Vec<f32> = mean(n, len, 1).iter().map(|v| v * 2.0).collect();
    for (rank, (allocated, ga, gc)) in out.into_iter().enumerate() {
        assert_eq!(ga, want_a, "rank {rank}: a, copied up after c was staged");
        assert_eq!(gc, mean(n, len, 2), "rank {rank}: c");
        assert_eq!(
            allocated, 2,
            "rank {rank}: a's buffer was busy, c needed its own"
        );
    }
}

#[test]
fn broadcast_and_the_scales_apply_on_the_host_side() {
    let n = 3;
    let len = 64;
    let tensors = vec![TensorSpec::new("g", [len])];
    let out = world(n, &tensors, move |rank, engine, sim| {
        let stager = Stager::new(sim.clone(), engine).unwrap();
        let s = sim.stream();
        let (p, g) = (sim.alloc(len), sim.alloc(len));
        sim.write(s, &p, values(rank, len, 3));
        sim.write(s, &g, values(rank, len, 4));
        // SAFETY: `p` and `g` live until the end.
        unsafe {
            let b = stager.broadcast("p.init", p.ptr(), len, s, 1).unwrap();
            let r = stager.all_reduce("g", g.ptr(), len, s, 0.5).unwrap();
            stager.flush();
            b.wait_into(p.ptr(), len, s, 1.0).unwrap();
            r.wait_into(g.ptr(), len, s, n as f32).unwrap();
        }
        let got = (sim.read(s, &p), sim.read(s, &g));
        drop(stager);
        got
    });
    // prescale 0.5, mean, postscale n: half the sum (exact: small integers and halves).
    let half_sum: Vec<f32> = mean(n, len, 4).iter().map(|v| v * n as f32 * 0.5).collect();
    for (rank, (p, g)) in out.into_iter().enumerate() {
        assert_eq!(p, values(1, len, 3), "rank {rank}: the broadcast");
        assert_eq!(g, half_sum, "rank {rank}: the scaled all-reduce");
    }
}

#[test]
fn errors_are_typed_and_the_stager_goes_on() {
    let tensors = vec![TensorSpec::new("w", [10])];
    let out = world(2, &tensors, move |rank, engine, sim| {
        let stager = Stager::new(sim.clone(), engine).unwrap();
        let s = sim.stream();
        let g = sim.alloc(10);
        sim.write(s, &g, values(rank, 10, 5));
        // SAFETY: `g` holds 10 floats and lives until the end.
        let (short, root, into) = unsafe {
            // A registered tensor submitted with the wrong length: the engine's error.
            let short = stager
                .all_reduce("w", g.ptr(), 9, s, 1.0)
                .unwrap()
                .wait_host();
            // A broadcast from a rank outside the world.
            let root = stager
                .broadcast("x", g.ptr(), 10, s, 7)
                .unwrap()
                .wait_host();
            // A result written to a buffer of another length.
            let ok = stager.all_reduce("w", g.ptr(), 10, s, 1.0).unwrap();
            stager.flush();
            let into = ok.wait_into(g.ptr(), 4, s, 1.0);
            (short, root, into)
        };
        // The stager and the engine still work.
        // SAFETY: as above.
        unsafe {
            let again = stager.all_reduce("w", g.ptr(), 10, s, 1.0).unwrap();
            stager.flush();
            again.wait_into(g.ptr(), 10, s, 1.0).unwrap();
        }
        let after = sim.read(s, &g);
        drop(stager);
        (
            format!("{}", short.unwrap_err()),
            format!("{}", root.unwrap_err()),
            into,
            after,
        )
    });
    for (rank, (short, root, into, after)) in out.into_iter().enumerate() {
        assert!(
            short.contains("'w'") && short.contains("9"),
            "rank {rank}: {short}"
        );
        assert!(root.contains("rank 7"), "rank {rank}: {root}");
        assert!(
            matches!(into, Err(Error::Length { want: 4, got: 10 })),
            "rank {rank}: {into:?}"
        );
        // The mean of the means is the mean: the first all-reduce left the mean in `g`.
        assert_eq!(after, mean(2, 10, 5), "rank {rank}");
    }
}

#[test]
fn the_pool_hands_out_only_buffers_whose_copy_is_done_and_the_smallest_that_fits() {
    let sim = Sim::default();
    let s = sim.stream();
    let mut pool: Pool<Sim> = Pool::new(Arc::new(sim.clone()));
    let big = pool.take(100).unwrap();
    let small = pool.take(10).unwrap();
    assert_eq!(pool.allocated(), 2);
    let gate = sim.hold(s);
    let busy = sim.record(s);
    pool.give(big, Some(busy));
    pool.give(small, None);
    // The small one fits 8 and is free.
    let b = pool.take(8).unwrap();
    assert_eq!(Sim::pinned_len(&b), 10);
    // The big one is still in use: a new buffer.
    let c = pool.take(50).unwrap();
    assert_eq!((Sim::pinned_len(&c), pool.allocated()), (50, 3));
    Sim::open(&gate);
    sim.synchronize(&sim.record(s)).unwrap();
    // Now it is done: reused.
    let d = pool.take(60).unwrap();
    assert_eq!((Sim::pinned_len(&d), pool.allocated()), (100, 3));
    for buf in [b, c, d] {
        pool.give(buf, None);
    }
    // The pool keeps at most KEEP buffers.
    for _ in 0..super::pool::KEEP + 5 {
        let buf = sim.alloc_pinned(1).unwrap();
        pool.give(buf, None);
    }
    assert_eq!(pool.len(), super::pool::KEEP);
    pool.drain();
    assert!(pool.is_empty());
}

/// The engine's own CPU codecs as an [`Encoder`] over the simulated device: what the GPU's
/// device codecs do, byte for byte, so the stager's encoded path is checked here.
struct CpuEncoder {
    sim: Sim,
    codecs: std::collections::HashMap<String, Box<dyn gradwire_codec::Codec>>,
}

impl super::Encoder<Sim> for CpuEncoder {
    fn accepts(
        &mut self,
        name: &str,
        _len: usize,
        context: Option<(gradwire_codec::CodecConfig, gradwire_codec::BuildContext)>,
    ) -> bool {
        match context {
            Some((cfg, ctx)) => {
                self.codecs.insert(name.into(), cfg.build(&ctx));
                true
            }
            None => false,
        }
    }

    unsafe fn encode(
        &mut self,
        name: &str,
        src: super::DevicePtr,
        len: usize,
        ready: &super::sim::SimEvent,
        progress: gradwire_codec::Progress,
        out: &mut Vec<u8>,
    ) -> crate::Result<()> {
        self.sim.synchronize(ready)?;
        // SAFETY: the producer's event completed; nothing writes `src` until this returns.
        let grad = unsafe { std::slice::from_raw_parts(src.0 as *const f32, len) };
        let codec = self.codecs.get_mut(name).unwrap();
        codec.set_progress(progress);
        codec.encode(grad, out);
        Ok(())
    }
}

/// Three steps of `w` (top-k, sparse), `q` (QSGD 4-bit, gather) and `d` (dense) through a
/// stager with or without the encoder: every rank's results, and the stager's counts.
fn encoded_run(with_encoder: bool) -> Vec<(Vec<Vec<u32>>, super::StagerStats)> {
    use gradwire_engine::{Rule, Selector, Strategy};
    let tensors = vec![
        TensorSpec::new("w", [40, 25]),
        TensorSpec::new("q", [600]),
        TensorSpec::new("d", [30]),
    ];
    let rule = |name: &str, codec: &str, strategy| Rule {
        select: Selector::Name(name.into()),
        codec: codec.parse().unwrap(),
        strategy,
    };
    let cfg = EngineConfig {
        rules: vec![
            rule("w", "topk:ratio=0.05,scope=tensor", Strategy::Auto),
            rule("q", "qsgd:bits=4", Strategy::Gather),
        ],
        seed: 11,
        ..Default::default()
    };
    let hs: Vec<_> = Local::world(2)
        .into_iter()
        .enumerate()
        .map(|(rank, t)| {
            let (tensors, cfg) = (tensors.clone(), cfg.clone());
            std::thread::spawn(move || {
                let engine = Arc::new(Engine::start(t, cfg, &tensors).unwrap());
                let sim = Sim::default();
                let stager = if with_encoder {
                    let enc = CpuEncoder {
                        sim: sim.clone(),
                        codecs: Default::default(),
                    };
                    Stager::with_encoder(sim.clone(), engine.clone(), Box::new(enc)).unwrap()
                } else {
                    Stager::new(sim.clone(), engine.clone()).unwrap()
                };
                let s = sim.stream();
                let bufs: Vec<_> = tensors.iter().map(|t| sim.alloc(t.len())).collect();
                let mut results = Vec::new();
                for step in 0..3 {
                    engine.set_progress(step, step as f32 / 10.0);
                    let gate = sim.hold(s);
                    for (i, (t, b)) in tensors.iter().zip(&bufs).enumerate() {
                        sim.write(s, b, values(rank, t.len(), 10 * step as usize + i));
                    }
                    // SAFETY: the buffers live until the end.
                    let staged: Vec<_> = tensors
                        .iter()
                        .zip(&bufs)
                        .map(|(t, b)| unsafe {
                            stager
                                .all_reduce(&t.name, b.ptr(), t.len(), s, 1.0)
                                .unwrap()
                        })
                        .collect();
                    stager.flush();
                    Sim::open(&gate);
                    for ((t, b), st) in tensors.iter().zip(&bufs).zip(staged) {
                        // SAFETY: as above.
                        unsafe { st.wait_into(b.ptr(), t.len(), s, 1.0) }.unwrap();
                        results.push(sim.read(s, b).iter().map(|v| v.to_bits()).collect());
                    }
                }
                let stats = stager.stats();
                drop(stager);
                Arc::into_inner(engine).unwrap().shutdown().unwrap();
                (results, stats)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn device_encoded_tensors_give_the_host_paths_results_bit_for_bit_and_only_payloads_move() {
    let host = encoded_run(false);
    let enc = encoded_run(true);
    for (rank, ((hr, hs), (er, es))) in host.iter().zip(&enc).enumerate() {
        assert!(hr.iter().any(|r| r.iter().any(|&b| b != 0)), "all zero");
        assert_eq!(hr, er, "rank {rank}: the encoded path's results differ");
        // Host path: 3 tensors x 3 steps copied down whole.
        assert_eq!((hs.staged, hs.encoded), (9, 0), "rank {rank}: {hs:?}");
        // Encoded path: w and q encoded on the "device", only d copied down.
        assert_eq!((es.staged, es.encoded), (3, 6), "rank {rank}: {es:?}");
        assert_eq!(es.staged_bytes, 3 * 30 * 4);
        assert_eq!(es.encoded_bytes, 3 * (1000 + 600) * 4);
        assert!(
            es.payload_bytes * 4 < es.encoded_bytes,
            "rank {rank}: payloads of {} bytes for {} dense bytes",
            es.payload_bytes,
            es.encoded_bytes
        );
    }
}
