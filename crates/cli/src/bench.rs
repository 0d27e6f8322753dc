//! `gradwire bench`: the benchmark subcommands.

use anyhow::Result;
use clap::Subcommand;

/// Which benchmark to run.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Collective bandwidth and latency across P ranks (all-reduce, all-gather, broadcast).
    ///
    /// Starts P ranks itself (TCP on loopback by default) and prints, per size, the median
    /// over iterations of the slowest rank's time and the bus bandwidth (nccl-tests
    /// convention: all-reduce moves bytes x 2(P-1)/P).
    Allreduce(crate::bench_allreduce::AllreduceBenchArgs),
    /// Codec throughput: encode and decode_add GB/s and compression ratio per codec, next to
    /// the memcpy GB/s of the same machine measured in the same run.
    Codecs(crate::bench_codecs::CodecBenchArgs),
    /// The engine (negotiation, fusion, progress thread) against one blocking all-reduce
    /// per tensor and one of everything, on LeNet's, a char-LSTM's and 1,000 small tensors'
    /// gradient lists; median step times from the same run.
    Engine(crate::bench_engine::EngineBenchArgs),
    /// Parameter-server pushes and pulls (P workers, S shards on loopback) against
    /// gradwire's all-reduce of the same size, for a LeNet-sized model and 16 MiB, with
    /// where the time goes (push, pull, the shards' arithmetic) and the bytes per worker.
    Ps(crate::bench_ps::PsBenchArgs),
}

/// Runs a benchmark subcommand.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Allreduce(a) => crate::bench_allreduce::run(&a),
        BenchCommand::Codecs(a) => crate::bench_codecs::run(&a),
        BenchCommand::Engine(a) => crate::bench_engine::run(&a),
        BenchCommand::Ps(a) => crate::bench_ps::run(&a),
    }
}
