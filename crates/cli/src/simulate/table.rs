//! The table of `gradwire simulate`'s data-parallel predictions, one line per (link,
//! workers, codec).

use gradwire_sim::sweep::SweepRow;
use gradwire_sim::ModelProfile;

/// Prints the predictions under a header naming the model and where its compute came from.
pub(super) fn print_table(model: &ModelProfile, rows: &[SweepRow], measured: bool) {
    println!(
        "# {}: {} elements, compute {:.1} ms/step ({})",
        model.name,
        model.elements(),
        model.compute_s * 1e3,
        if measured {
            "measured here"
        } else {
            "--compute-ms"
        }
    );
    println!(
        "{:<14} {:>7} {:<24} {:<9} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "link", "workers", "codec", "strategy", "step_ms", "codec_ms", "comm_ms", "speedup", "eff"
    );
    for r in rows {
        let (c, p) = (&r.codec, &r.prediction);
        println!(
            "{:<14} {:>7} {:<24} {:<9} {:>10.2} {:>10.2} {:>10.2} {:>8.2} {:>8.3}",
            r.link,
            r.workers,
            c.spec,
            c.strategy.to_string(),
            p.step.step_s * 1e3,
            p.step.codec_s * 1e3,
            p.step.comm_s * 1e3,
            p.speedup,
            p.efficiency
        );
    }
}
