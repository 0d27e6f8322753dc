//! Resource assertions on idle engines (their own test binary, and one test at a time, so
//! the process's CPU time is theirs alone): a rank with nothing pending anywhere runs no
//! negotiation rounds and burns no CPU, and a rank waiting on a handle blocks rather than
//! spins. The CPU bounds sit far above what sleeping threads use (a few ms, more on a loaded
//! machine) and far below what one spinning thread uses over the second (about 1,000 ms).

use std::time::Duration;

use gradwire_engine::{Engine, EngineConfig, TensorSpec};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;

/// CPU time of this whole process (every thread), from the kernel's per-task runtime.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant the kernel knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

const IDLE: Duration = Duration::from_millis(1000);

/// A spinning thread would use about 1,000 ms of CPU over [`IDLE`]; sleeping ones a few.
const SPIN_BOUND: Duration = Duration::from_millis(200);

/// Serialises the tests of this binary, which measure the whole process's CPU time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn idle_engines_run_no_rounds_and_burn_no_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = 4;
    let tensors = vec![TensorSpec::new("w", [64, 32]), TensorSpec::new("b", [32])];
    let barrier = std::sync::Barrier::new(n + 1);
    let results = std::thread::scope(|s| {
        let hs: Vec<_> = Local::world(n)
            .into_iter()
            .map(|t| {
                let (tensors, barrier) = (&tensors, &barrier);
                s.spawn(move || {
                    let r = t.rank() as f32;
                    let e = Engine::start(t, EngineConfig::default(), tensors).unwrap();
                    // One step, so the response cache and the speculative batch are warm.
                    let hs = e.all_reduce_batch(vec![("w", vec![r; 64 * 32]), ("b", vec![r; 32])]);
                    for h in hs {
                        h.wait().unwrap();
                    }
                    let before = e.stats().cycles;
                    barrier.wait(); // every rank's step is done
                    barrier.wait(); // the idle second is over
                    let idle_rounds = e.stats().cycles - before;
                    // Still working after the idle second: one more step.
                    let got = e.all_reduce("b", vec![r; 32]).wait().unwrap();
                    e.shutdown().unwrap();
                    (idle_rounds, got)
                })
            })
            .collect();
        barrier.wait();
        let cpu0 = process_cpu();
        std::thread::sleep(IDLE);
        let cpu = process_cpu() - cpu0;
        barrier.wait();
        let out: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        (cpu, out)
    });
    let (cpu, out) = results;
    let rounds: Vec<u64> = out.iter().map(|(k, _)| *k).collect();
    eprintln!("idle {IDLE:?}: rounds per rank {rounds:?}, process CPU {cpu:?}");
    let want = (0..n).map(|r| r as f32).sum::<f32>() / n as f32;
    for (r, (idle_rounds, got)) in out.iter().enumerate() {
        assert!(
            *idle_rounds <= 2,
            "rank {r} ran {idle_rounds} negotiation rounds in {IDLE:?} with nothing pending"
        );
        assert_eq!(got, &vec![want; 32], "rank {r}");
    }
    // Four idle engines over a second: each progress thread looks at its queue every ten
    // cycles (100 wake-ups, about 1 ms of CPU; the old idle rounds cost 15 ms, which the
    // round count above catches).
    assert!(
        cpu < SPIN_BOUND,
        "four idle engines used {cpu:?} of CPU in {IDLE:?}"
    );
}

#[test]
fn a_waiting_handle_blocks_instead_of_spinning() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Rank 1 submits a second late: rank 0's waiting thread and both progress threads must
    // sleep meanwhile.
    let tensors = vec![TensorSpec::new("w", [1000])];
    let (cpu, got) = std::thread::scope(|s| {
        let cpu0 = process_cpu();
        let hs: Vec<_> = Local::world(2)
            .into_iter()
            .map(|t| {
                let tensors = &tensors;
                s.spawn(move || {
                    let rank = t.rank();
                    let e = Engine::start(t, EngineConfig::default(), tensors).unwrap();
                    if rank == 1 {
                        std::thread::sleep(IDLE);
                    }
                    let got = e.all_reduce("w", vec![rank as f32; 1000]).wait().unwrap();
                    e.shutdown().unwrap();
                    got
                })
            })
            .collect();
        let got: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        (process_cpu() - cpu0, got)
    });
    eprintln!("one-second wait: process CPU {cpu:?}");
    for g in got {
        assert_eq!(g, vec![0.5; 1000]);
    }
    assert!(cpu < SPIN_BOUND, "a one-second wait used {cpu:?} of CPU");
}
