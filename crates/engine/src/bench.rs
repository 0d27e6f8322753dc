//! Bench support for `gradwire bench engine`: per rank, over a given transport, time three
//! ways of averaging a model's gradient tensors and report the medians.
//!
//! - `per_tensor`: one blocking `Collectives::all_reduce` (mean) per tensor, in order;
//! - `flat`: copy every tensor into one buffer, one blocking all-reduce, copy back;
//! - `engine`: submit every tensor to an [`Engine`] as one burst and wait on all handles
//!   (negotiation, fusion and the engine's dense all-reduce included), as `gradwire train`'s
//!   synchronous step does ([`Engine::all_reduce_batch_unflushed`]: the waiting thread runs
//!   the round; a flush would also wake the progress thread, for nothing).
//!
//! Every rank must call [`run`] with the same case and repetitions.

use std::str::FromStr;
use std::time::Instant;

use gradwire_collective::{Collectives, ReduceOp};
use gradwire_transport::Transport;
use serde::{Deserialize, Serialize};

use crate::{Engine, EngineConfig, Error, Result, TensorSpec};

/// A gradient list to bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BenchCase {
    /// LeNet-5's ten tensors (61,706 parameters).
    Lenet,
    /// A two-layer character LSTM (vocabulary 65, embedding 64, hidden 128): 12 tensors.
    Lstm,
    /// 1,000 tensors of 200 to 399 floats.
    ManySmall,
}

impl BenchCase {
    /// Every case.
    pub const ALL: [BenchCase; 3] = [BenchCase::Lenet, BenchCase::Lstm, BenchCase::ManySmall];

    /// The case's name (`lenet`, `lstm`, `many-small`).
    pub fn name(self) -> &'static str {
        match self {
            BenchCase::Lenet => "lenet",
            BenchCase::Lstm => "lstm",
            BenchCase::ManySmall => "many-small",
        }
    }

    /// The tensors (name, shape).
    pub fn tensors(self) -> Vec<TensorSpec> {
        let t = |n: &str, s: &[usize]| TensorSpec::new(n, s.to_vec());
        match self {
            BenchCase::Lenet => vec![
                t("conv1.weight", &[6, 1, 5, 5]),
                t("conv1.bias", &[6]),
                t("conv2.weight", &[16, 6, 5, 5]),
                t("conv2.bias", &[16]),
                t("fc1.weight", &[120, 400]),
                t("fc1.bias", &[120]),
                t("fc2.weight", &[84, 120]),
                t("fc2.bias", &[84]),
                t("fc3.weight", &[10, 84]),
                t("fc3.bias", &[10]),
            ],
            BenchCase::Lstm => vec![
                t("embed.weight", &[65, 64]),
                t("lstm0.w_ih", &[512, 64]),
                t("lstm0.w_hh", &[512, 128]),
                t("lstm0.b_ih", &[512]),
                t("lstm0.b_hh", &[512]),
                t("lstm1.w_ih", &[512, 128]),
                t("lstm1.w_hh", &[512, 128]),
                t("lstm1.b_ih", &[512]),
                t("lstm1.b_hh", &[512]),
                t("head.weight", &[65, 128]),
                t("head.bias", &[65]),
                t("head.scale", &[65]),
            ],
            BenchCase::ManySmall => (0..1000)
                .map(|i| t(&format!("t{i:04}"), &[200 + (i * 37) % 200]))
                .collect(),
        }
    }
}

impl FromStr for BenchCase {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        BenchCase::ALL
            .into_iter()
            .find(|c| c.name() == s.trim())
            .ok_or_else(|| Error::InvalidSetting {
                field: "bench case",
                reason: format!("unknown case '{s}' (lenet, lstm, many-small)"),
            })
    }
}

/// One rank's timings of one case (medians over the repetitions, in ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// The case's name.
    pub case: String,
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Tensors in the case.
    pub tensors: usize,
    /// Elements in all of them.
    pub elements: usize,
    /// Timed repetitions per mode (in [`BLOCKS`] blocks, each after one untimed warm-up).
    pub reps: usize,
    /// Median ms of the engine mode.
    pub engine_ms: f64,
    /// Median ms of one blocking all-reduce per tensor.
    pub per_tensor_ms: f64,
    /// Median ms of one blocking all-reduce of everything concatenated.
    pub flat_ms: f64,
    /// Engine mode: negotiation rounds per repetition (mean; idle rounds included).
    pub engine_rounds: f64,
    /// Engine mode: fused collectives per repetition (mean).
    pub engine_collectives: f64,
    /// Engine mode: rounds per repetition that reduced the dense batch speculatively (mean).
    #[serde(default)]
    pub engine_speculative: f64,
    /// The engine's hierarchy ([`Engine::hierarchy`]); `None`: flat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hierarchy: Option<String>,
}

impl BenchResult {
    /// `per_tensor_ms / engine_ms`.
    pub fn speedup_vs_per_tensor(&self) -> f64 {
        self.per_tensor_ms / self.engine_ms
    }

    /// `flat_ms / engine_ms` (at least 1 when the engine is no slower than flat).
    pub fn speedup_vs_flat(&self) -> f64 {
        self.flat_ms / self.engine_ms
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn grads(tensors: &[TensorSpec], rank: usize) -> Vec<Vec<f32>> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (0..t.len())
                .map(|j| ((i * 7 + j * 13 + rank * 31) % 101) as f32 * 0.01)
                .collect()
        })
        .collect()
}

/// How many blocks the repetitions are split into. Each block times per-tensor, then flat,
/// then the engine (started afresh on the transport and shut down after), so that a slow
/// spell of a shared machine falls on every mode alike instead of on the one mode that ran
/// through it; the medians are over all blocks.
pub const BLOCKS: usize = 5;

/// Times the three modes of `case` on this rank (`reps` timed repetitions each, in
/// [`BLOCKS`] interleaved blocks), the engine started with `config`; gives the transport back
/// with the result.
pub fn run<T: Transport + 'static>(
    transport: T,
    case: BenchCase,
    reps: usize,
    config: EngineConfig,
) -> Result<(BenchResult, Box<dyn Transport>)> {
    let tensors = case.tensors();
    let rank = transport.rank();
    let world = transport.world_size();
    let reps = reps.max(1);
    let mut g = grads(&tensors, rank);

    let total: usize = tensors.iter().map(TensorSpec::len).sum();
    let mut flat_buf = Vec::with_capacity(total);
    let (mut per_tensor, mut flat, mut times) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rounds, mut groups, mut spec) = (0u64, 0u64, 0u64);
    let mut hierarchy = None;
    let mut transport: Box<dyn Transport> = Box::new(transport);
    let blocks = BLOCKS.min(reps);
    for block in 0..blocks {
        // This block's share of the repetitions, each mode after one untimed warm-up.
        let n = reps / blocks + usize::from(block < reps % blocks);

        for rep in 0..=n {
            transport.barrier()?;
            let t0 = Instant::now();
            for x in g.iter_mut() {
                transport.all_reduce(x, ReduceOp::Mean)?;
            }
            if rep > 0 {
                per_tensor.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }

        for rep in 0..=n {
            transport.barrier()?;
            let t0 = Instant::now();
            flat_buf.clear();
            for x in &g {
                flat_buf.extend_from_slice(x);
            }
            transport.all_reduce(&mut flat_buf, ReduceOp::Mean)?;
            let mut off = 0;
            for x in g.iter_mut() {
                let len = x.len();
                x.copy_from_slice(&flat_buf[off..off + len]);
                off += len;
            }
            if rep > 0 {
                flat.push(t0.elapsed().as_secs_f64() * 1e3);
            }
        }

        let engine = Engine::start(transport, config.clone(), &tensors)?;
        hierarchy = engine.hierarchy().map(str::to_string);
        for rep in 0..=n {
            engine.barrier("bench.barrier").wait()?;
            // The counters alone: cloning the whole stats (records with names) between timed
            // repetitions cost each rank allocations, which on an oversubscribed host is time
            // taken from the ranks still timing.
            let s0 = engine.rounds();
            let t0 = Instant::now();
            let handles = engine.all_reduce_batch_unflushed(
                tensors
                    .iter()
                    .zip(g.drain(..))
                    .map(|(t, x)| (t.name.as_str(), x)),
            );
            for h in handles {
                g.push(h.wait()?);
            }
            if rep > 0 {
                times.push(t0.elapsed().as_secs_f64() * 1e3);
                let s1 = engine.rounds();
                rounds += s1.0 - s0.0;
                groups += s1.1 - s0.1;
                spec += s1.2 - s0.2;
            }
        }
        transport = engine.shutdown()?;
    }
    Ok((
        BenchResult {
            case: case.name().to_string(),
            rank,
            world_size: world,
            tensors: tensors.len(),
            elements: total,
            reps,
            engine_ms: median(times),
            per_tensor_ms: median(per_tensor),
            flat_ms: median(flat),
            engine_rounds: rounds as f64 / reps as f64,
            engine_collectives: groups as f64 / reps as f64,
            engine_speculative: spec as f64 / reps as f64,
            hierarchy,
        },
        transport,
    ))
}

/// One case's medians as `gradwire bench engine` reports them (a JSON shape other tools
/// read: keep the field names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseSummary {
    /// `lenet`, `lstm` or `many-small`.
    pub case: String,
    /// Tensors in the list.
    pub tensors: usize,
    /// Median step time through the engine, ms.
    pub engine_ms: f64,
    /// Median step time with one blocking all-reduce per tensor, ms.
    pub per_tensor_ms: f64,
    /// Median step time with one blocking all-reduce of everything, ms.
    pub flat_ms: f64,
    /// Engine: negotiation rounds per step (mean).
    #[serde(default)]
    pub engine_rounds: f64,
    /// Engine: steps whose dense batch rode the negotiation round (mean per step, 0..1).
    #[serde(default)]
    pub engine_speculative: f64,
    /// The engine's hierarchy (e.g. `2 hosts (2+2 ranks)`, from declared hosts); absent: flat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hierarchy: Option<String>,
}

impl From<&BenchResult> for CaseSummary {
    fn from(r: &BenchResult) -> CaseSummary {
        CaseSummary {
            case: r.case.clone(),
            tensors: r.tensors,
            engine_ms: r.engine_ms,
            per_tensor_ms: r.per_tensor_ms,
            flat_ms: r.flat_ms,
            engine_rounds: r.engine_rounds,
            engine_speculative: r.engine_speculative,
            hierarchy: r.hierarchy.clone(),
        }
    }
}

/// Errors of [`run_cases`].
#[derive(Debug, thiserror::Error)]
pub enum CasesError {
    /// This rank's host settings could not be read.
    #[error(transparent)]
    Hosts(#[from] crate::HostError),
    /// A case failed.
    #[error("case {case}")]
    Case {
        /// The case's name.
        case: &'static str,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
}

/// [`run`] of every case in turn on this rank, each engine with the default configuration
/// and this rank's host settings from the environment ([`crate::host_config_from_env`]).
/// Every rank calls it with the same cases and repetitions; every rank returns its own
/// medians (taken after barriers, so of the same steps).
#[cfg(unix)]
pub fn run_cases(
    mut t: Box<dyn Transport>,
    cases: &[BenchCase],
    reps: usize,
) -> std::result::Result<Vec<CaseSummary>, CasesError> {
    let mut out = Vec::with_capacity(cases.len());
    for &case in cases {
        let config = EngineConfig {
            hosts: crate::host_config_from_env(t.rank(), t.world_size())?,
            ..EngineConfig::default()
        };
        let (r, back) = run(t, case, reps, config).map_err(|e| CasesError::Case {
            case: case.name(),
            source: Box::new(e),
        })?;
        t = back;
        out.push(CaseSummary::from(&r));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gradwire_transport::local::Local;

    #[test]
    fn case_names_parse_back() {
        for c in BenchCase::ALL {
            assert_eq!(c.name().parse::<BenchCase>().unwrap(), c);
        }
        assert!("resnet".parse::<BenchCase>().is_err());
    }

    /// Every case on two in-process ranks: one summary per case, in order, with the case's
    /// tensor count and the JSON field names other tools read.
    #[cfg(unix)]
    #[test]
    fn run_cases_summarizes_every_case() {
        let cases = [BenchCase::Lenet, BenchCase::Lstm];
        let hs: Vec<_> = Local::world(2)
            .into_iter()
            .map(|t| std::thread::spawn(move || run_cases(Box::new(t), &cases, 2).unwrap()))
            .collect();
        for h in hs {
            let out = h.join().unwrap();
            assert_eq!(out.len(), 2);
            for (s, c) in out.iter().zip(cases) {
                assert_eq!(s.case, c.name());
                assert_eq!(s.tensors, c.tensors().len());
                assert!(s.engine_ms > 0.0 && s.per_tensor_ms > 0.0 && s.flat_ms > 0.0);
                assert!(s.engine_rounds >= 1.0, "{s:?}");
                assert!((0.0..=1.0).contains(&s.engine_speculative), "{s:?}");
                assert_eq!(s.hierarchy, None);
            }
            let v = serde_json::to_value(&out[0]).unwrap();
            let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                [
                    "case",
                    "engine_ms",
                    "engine_rounds",
                    "engine_speculative",
                    "flat_ms",
                    "per_tensor_ms",
                    "tensors"
                ]
            );
        }
    }
}
