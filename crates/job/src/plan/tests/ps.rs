//! The parameter-server flags in a plan: modes, defaults and refusals.

use gradwire_ps::{Consistency, UpdaterSpec};
use gradwire_train::OptimizerConfig;

use super::{args, TrainFile, ALONE};
use crate::{Plan, PlanError, PsMode};

fn plan_of(flags: &[&str]) -> Result<Plan, PlanError> {
    args(flags)
        .expect("flags that parse")
        .merge(TrainFile::default(), "", ALONE)
}

fn refused(flags: &[&str], words: &[&str]) {
    let e = plan_of(flags).unwrap_err().to_string();
    for w in words {
        assert!(e.contains(w), "{flags:?}: {e}");
    }
}

#[test]
fn ps_modes_parse_and_mirror_the_optimizer() {
    let p = plan_of(&["--sync", "ps-async", "--workers", "4", "--servers", "2"]).unwrap();
    let ps = p.ps.unwrap();
    assert_eq!(ps.consistency, Consistency::Async);
    assert_eq!((ps.servers, ps.n_fetch, ps.n_push), (2, 1, 1));
    assert!(
        matches!(ps.updater, UpdaterSpec::Adagrad { lr, .. } if lr == 0.01),
        "ps-async defaults to Downpour's Adagrad, not {}",
        ps.updater
    );
    assert_eq!(
        (ps.local_lr, ps.optimizer.clone()),
        (0.0, OptimizerConfig::adagrad(0.01))
    );
    let p = plan_of(&["--sync", "ps-ssp:3", "--optimizer", "adagrad:lr=0.1"]).unwrap();
    let ps = p.ps.unwrap();
    assert_eq!(ps.consistency, Consistency::Ssp { staleness: 3 });
    assert!(matches!(ps.updater, UpdaterSpec::Adagrad { .. }));
    assert_eq!(ps.local_lr, 0.0);
    let p = plan_of(&["--sync", "ps-sync"]).unwrap();
    assert_eq!(p.ps.unwrap().servers, 1);
    let p = plan_of(&["--sync", "sandblaster", "--servers", "2", "--sb-unit", "50"]).unwrap();
    let ps = p.ps.unwrap();
    assert_eq!((ps.mode, ps.servers), (PsMode::Sandblaster, 2));
    let sb = ps.sb.unwrap();
    assert_eq!(
        (sb.iters_per_epoch, sb.history, sb.unit),
        (10, 10, Some(50))
    );
    assert!(sb.backups && sb.batch.is_none());
    assert!(plan_of(&["--sync", "dense"]).unwrap().ps.is_none());
    // Codecs on pushes: error feedback forced on, 2-bit by --push-codec, none is dense.
    let codec_of = |flags: &[&str]| plan_of(flags).unwrap().ps.unwrap().codec.to_string();
    let c = codec_of(&["--sync", "ps-async", "--codec", "qsgd:bits=4"]);
    assert!(c.starts_with("qsgd") && c.contains("ef=true"), "{c}");
    let c = codec_of(&["--sync", "ps-sync", "--codec", "topk:ratio=0.1,ef=false"]);
    assert!(c.contains("ef=true") && !c.contains("ef=false"), "{c}");
    let c = codec_of(&["--sync", "ps-ssp:2", "--push-codec", "2bit:threshold=0.25"]);
    assert!(c.starts_with("2bit") && c.contains("0.25"), "{c}");
    assert_eq!(codec_of(&["--sync", "ps-sync", "--codec", "none"]), "dense");
}

#[test]
fn ps_async_defaults_to_adagrad_and_keeps_a_named_optimizer() {
    let updater = |flags: &[&str]| plan_of(flags).unwrap().ps.unwrap().updater;
    let adagrad_at = |u: UpdaterSpec| match u {
        UpdaterSpec::Adagrad { lr, .. } => Some(lr),
        _ => None,
    };
    assert_eq!(adagrad_at(updater(&["--sync", "ps-async"])), Some(0.01));
    assert_eq!(
        adagrad_at(updater(&["--sync", "ps-async", "--lr", "0.02"])),
        Some(0.02),
        "--lr sets the default Adagrad's rate"
    );
    assert_eq!(
        updater(&[
            "--sync",
            "ps-async",
            "--optimizer",
            "sgd:lr=0.05,momentum=0.9"
        ]),
        UpdaterSpec::Momentum { lr: 0.05, mu: 0.9 },
        "momentum SGD by name"
    );
    // The other modes keep mirroring the run's optimizer.
    for mode in ["ps-sync", "ps-ssp:2"] {
        assert_eq!(
            updater(&["--sync", mode]),
            UpdaterSpec::Momentum { lr: 0.05, mu: 0.9 },
            "{mode}"
        );
    }
    // An optimizer in the settings file is the user's choice too.
    let with_file = |text: &str| {
        args(&["--sync", "ps-async"])
            .unwrap()
            .merge(toml::from_str(text).unwrap(), "train.toml", ALONE)
            .unwrap()
            .ps
            .unwrap()
            .updater
    };
    assert_eq!(
        with_file("optimizer = \"sgd:lr=0.03,momentum=0.5\"\n"),
        UpdaterSpec::Momentum { lr: 0.03, mu: 0.5 }
    );
    assert_eq!(adagrad_at(with_file("lr = 0.004\n")), Some(0.004));
}

#[test]
fn bad_ps_flag_combinations_are_refused_by_name() {
    refused(&["--servers", "2"], &["--servers", "ps-sync"]);
    refused(&["--n-fetch", "3", "--sync", "dense"], &["--n-fetch"]);
    refused(
        &["--sync", "ps-sync", "--n-push", "2"],
        &["Downpour", "ps-async"],
    );
    refused(
        &["--sync", "sandblaster", "--optimizer", "adam:lr=0.001"],
        &["--optimizer", "sandblaster"],
    );
    refused(&["--sync", "ps-sync", "--sb-iters", "3"], &["--sb-iters"]);
    refused(
        &["--sync", "sandblaster", "--sb-history", "0"],
        &["--sb-history"],
    );
    refused(
        &["--sync", "ps-async", "--codec", "powersgd"],
        &["--codec", "PowerSGD", "all-reduce"],
    );
    refused(
        &["--sync", "ps-sync", "--codec", "dgc"],
        &["DGC", "momentum"],
    );
    refused(
        &[
            "--sync",
            "ps-sync",
            "--codec",
            "qsgd",
            "--push-codec",
            "2bit",
        ],
        &["--push-codec", "one of them"],
    );
    refused(&["--push-codec", "2bit"], &["--push-codec", "ps-sync"]);
    refused(
        &["--sync", "sandblaster", "--codec", "qsgd"],
        &["--codec", "sandblaster"],
    );
    refused(
        &["--sync", "ps-async", "--optimizer", "sgd:lr=0.1,wd=0.0001"],
        &["weight decay"],
    );
    refused(&["--sync", "ps-sync", "--servers", "0"], &["--servers"]);
    refused(
        &["--sync", "ps-sync", "--timeline", "t.json"],
        &["--timeline", "all-reduce"],
    );
    refused(
        &["--sync", "ps-async", "--dead-policy", "shrink"],
        &["--dead-policy"],
    );
    let e = args(&["--sync", "ps-bogus"]).unwrap_err().to_string();
    assert!(e.contains("ps-async"), "{e}");
}
