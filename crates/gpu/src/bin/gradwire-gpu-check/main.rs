//! `gradwire-gpu-check`: the device checks of the `cuda` feature, in one run, as JSON.
//!
//! 1. every device codec against its CPU twin: the same gradients (several steps, layouts
//!    with shapes and roles), byte-for-byte equal payloads, and each device payload decoded
//!    by the CPU codec;
//! 2. encode throughput of DGC 0.1%, top-k 0.1% and QSGD 4-bit on large buffers, as a ratio of the
//!    device's own copy bandwidth measured in the same run (`--data DIR` reads the buffers
//!    `g25m.f32`, `g100m.f32` that the torch comparison used);
//! 3. the host-transfer all-reduce between rank threads sharing the GPU, over TCP and shared
//!    memory, pipelined and not, checked against the exact reference sum, with its time
//!    split;
//! 4. training on the GPU with DGC (`--fashion-mnist DIR`): 2 ranks, an MLP, the sparse
//!    all-reduce, test accuracy per epoch;
//! 5. device tensors through the engine (`staged`): DGC, QSGD and a dense tensor copied down
//!    whole and encoded on the device, each bit for bit against the same engines fed from
//!    host memory, with what came to the host.
//!
//! `gradwire-gpu-check --help` lists the options.

use gradwire_gpu::device::Device;
use serde_json::json;

mod allreduce;
mod bench;
mod codecs;
mod ranks;
mod staged;
mod train;

pub(crate) type R<T> = Result<T, Box<dyn std::error::Error>>;

/// The GPU checks of gradwire's `cuda` feature, as one JSON report.
///
/// Exit status: 0 when every device codec wrote its CPU twin's bytes (and the staged device
/// tensors gave the host submissions' results), 1 otherwise, 2 when no
/// GPU or NVRTC could be opened.
#[derive(Debug, clap::Parser)]
#[command(name = "gradwire-gpu-check", version)]
struct Args {
    /// Run only these parts (comma-separated): codecs, bench, allreduce, train, staged.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Read the benchmark buffers g25m.f32 and g100m.f32 from DIR (written by
    /// scripts/gpu/torch_topk.py, so both time the same values); generated otherwise.
    #[arg(long, value_name = "DIR")]
    data: Option<String>,
    /// Train an MLP with DGC on the GPU on the Fashion-MNIST IDX files in DIR.
    #[arg(long, value_name = "DIR")]
    fashion_mnist: Option<String>,
    /// Small sizes: a smoke run.
    #[arg(long)]
    quick: bool,
    /// Write the report to FILE (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
}

fn main() {
    use clap::Parser;
    let args = Args::parse();
    let command: Vec<String> = std::env::args().collect();
    let quick = args.quick;
    let dev = match Device::open(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("gradwire-gpu-check: {e}");
            std::process::exit(2);
        }
    };
    let (major, minor) = dev.context().compute_capability().unwrap_or((0, 0));
    let mut report = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "revision": option_env!("GRADWIRE_REVISION").unwrap_or("unknown"),
        "command": command.join(" "),
        "device": dev.name().unwrap_or_default(),
        "compute_capability": format!("{major}.{minor}"),
    });
    let wants = |s: &str| args.only.is_empty() || args.only.iter().any(|x| x == s);
    let mut ok = true;
    if wants("codecs") {
        let v = codecs::codecs(&dev, quick).unwrap_or_else(|e| json!({"error": e.to_string()}));
        ok &= v["all_identical"] == json!(true);
        report["codecs"] = v;
    }
    if wants("bench") {
        report["bench"] = bench::bench(&dev, quick, args.data.as_deref())
            .unwrap_or_else(|e| json!({"error": e.to_string()}));
    }
    if wants("allreduce") {
        report["allreduce"] =
            allreduce::allreduce(&dev, quick).unwrap_or_else(|e| json!({"error": e.to_string()}));
    }
    if wants("train") {
        if let Some(dir) = &args.fashion_mnist {
            report["train"] = train::train(&dev, std::path::Path::new(dir), quick)
                .unwrap_or_else(|e| json!({"error": e.to_string()}));
        }
    }
    if wants("staged") {
        let v = staged::staged(&dev, quick).unwrap_or_else(|e| json!({"error": e.to_string()}));
        ok &= v["all_equal"] == json!(true);
        report["staged"] = v;
    }
    let text = serde_json::to_string_pretty(&report).expect("json");
    match &args.out {
        Some(f) => std::fs::write(f, &text).expect("write report"),
        None => println!("{text}"),
    }
    std::process::exit(if ok { 0 } else { 1 });
}
