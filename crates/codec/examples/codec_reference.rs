//! The Rust reference for checking a codec from another language (the Python package's
//! tests): encodes one float32 gradient with every spec given, `steps` times in a row (as one
//! rank's codec does: residuals and momentum carried from step to step), and writes each
//! payload and the decoding of the last one.
//!
//! ```text
//! cargo run -p gradwire-codec --example codec_reference -- GRAD.f32 SHAPE SPECS.txt OUT_DIR \
//!     [STEPS SEED RANK WORLD EPOCHS_PER_STEP]
//! ```
//! `GRAD.f32`: little-endian float32 values; `SHAPE`: dimensions joined by `x` (`16x8`);
//! `SPECS.txt`: one codec spec per line. For the spec on line `i` it writes
//! `OUT_DIR/i.stepS.bin` (payload of step `S`) and `OUT_DIR/i.decoded.f32`.
//!
//! It checks what it writes: every decoding is finite and decodes the same twice; `none`
//! decodes to the gradient exactly and, after one step (no residual carried), `fp16` and
//! `bf16` to within their rounding (half a unit in the last place of 11 and 8 significant
//! bits), else it fails naming the spec.

use std::path::PathBuf;

use gradwire_codec::{BuildContext, CodecConfig, Progress, TensorInfo, TensorRole};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        return Err(
            "usage: codec_reference GRAD.f32 SHAPE SPECS.txt OUT_DIR [STEPS SEED RANK \
                    WORLD EPOCHS_PER_STEP]"
                .into(),
        );
    }
    let raw = std::fs::read(&args[0])?;
    let grad: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let shape: Vec<usize> = args[1]
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let specs = std::fs::read_to_string(&args[2])?;
    let out = PathBuf::from(&args[3]);
    let num = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let steps: usize = num(4, "1").parse()?;
    let seed: u64 = num(5, "0").parse()?;
    let rank: usize = num(6, "0").parse()?;
    let world: usize = num(7, "1").parse()?;
    let epochs_per_step: f32 = num(8, "0").parse()?;
    let role = if shape.len() == 1 {
        TensorRole::Bias
    } else {
        TensorRole::Other
    };
    let info = TensorInfo::new(shape, role);
    if info.numel() != grad.len() {
        return Err(format!(
            "shape holds {} values, the file {}",
            info.numel(),
            grad.len()
        )
        .into());
    }
    std::fs::create_dir_all(&out)?;
    for (i, spec) in specs.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let cfg: CodecConfig = spec.trim().parse()?;
        let ctx = BuildContext::new(seed, rank, world, Vec::new()).with_tensors(vec![info.clone()]);
        let mut codec = cfg.build(&ctx);
        let mut payload = Vec::new();
        for s in 0..steps {
            codec.set_progress(Progress {
                step: s as u64,
                epoch: s as f32 * epochs_per_step,
            });
            codec.encode(&grad, &mut payload);
            std::fs::write(out.join(format!("{i}.step{s}.bin")), &payload)?;
        }
        let mut acc = vec![0.0f32; grad.len()];
        let decoder = cfg.build(&BuildContext::default().with_tensors(vec![info.clone()]));
        decoder.decode_add(&payload, &mut acc)?;
        check(spec.trim(), &cfg, &grad, &acc, steps);
        let mut again = vec![0.0f32; grad.len()];
        decoder.decode_add(&payload, &mut again)?;
        assert_eq!(
            acc.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            again.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{spec}: decoding is deterministic"
        );
        let bytes: Vec<u8> = acc.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out.join(format!("{i}.decoded.f32")), bytes)?;
    }
    Ok(())
}

/// The decoding of `grad` by `cfg` against the codec's own bound (see the module doc).
fn check(spec: &str, cfg: &CodecConfig, grad: &[f32], decoded: &[f32], steps: usize) {
    assert!(
        decoded.iter().all(|v| v.is_finite()),
        "{spec}: a decoded value is not finite"
    );
    // Relative rounding error of the float format, and the smallest step near zero.
    let bound = match cfg.name() {
        "none" => Some((0.0, 0.0)),
        "fp16" if steps == 1 => Some((2f32.powi(-11), 2f32.powi(-25))),
        "bf16" if steps == 1 => Some((2f32.powi(-8), f32::MIN_POSITIVE)),
        _ => None,
    };
    if let Some((rel, abs)) = bound {
        for (i, (&g, &d)) in grad.iter().zip(decoded).enumerate() {
            assert!(
                (d - g).abs() <= rel * g.abs() + abs,
                "{spec}: element {i} decodes to {d}, the gradient holds {g}"
            );
        }
    }
}
