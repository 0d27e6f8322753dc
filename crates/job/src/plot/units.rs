//! How quantities and codecs are written on a chart: byte counts and bandwidths in decimal
//! units, and a codec spec shortened to the settings that set its compression.

/// A byte count in decimal units with three significant figures (`1.25 MB`).
pub use gradwire_run::report::render::human_bytes;
/// A bandwidth in bits per second as people write it (`100 Mbit/s`, `2.5 Gbit/s`).
pub use gradwire_run::report::tta::human_bits;

/// The parameters of a codec spec that set its compression, kept on a chart's labels.
const KEPT_PARAMS: [&str; 6] = ["ratio", "bits", "levels", "tau", "pi", "rank"];

/// A codec spec shortened for a chart: its name and the parameters that set its compression
/// (`topk:ratio=0.01,select=sampled,...` gives `topk ratio=0.01`).
pub fn codec_label(spec: &str) -> String {
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let mut out = name.to_string();
    for kv in params.split(',') {
        if KEPT_PARAMS
            .iter()
            .any(|k| kv.split_once('=').is_some_and(|(key, _)| key == *k))
        {
            out.push(' ');
            out.push_str(kv);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_labels_keep_the_compression_setting() {
        assert_eq!(
            codec_label("topk:ratio=0.01,select=sampled,scope=global,values=fp32,ef=true"),
            "topk ratio=0.01"
        );
        assert_eq!(
            codec_label("qsgd:bits=4,bucket=512,norm=max,coding=fixed,ef=false"),
            "qsgd bits=4"
        );
        assert_eq!(codec_label("none"), "none");
        assert_eq!(codec_label("terngrad:clip=2.5,ef=false"), "terngrad");
    }

    #[test]
    fn byte_counts_in_decimal_units() {
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1_250_000.0), "1.25 MB");
        assert_eq!(human_bytes(40_000.0), "40.0 kB");
    }
}
