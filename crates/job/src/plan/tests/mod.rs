//! Unit tests of the plan: flags, settings file, defaults and every rule between them.

use clap::Parser;
use gradwire_codec::{CodecConfig, CodecId};
use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::ModelKind;

use crate::auto::Calibration;
use crate::elastic::ElasticSettings;
use crate::model_parallel::MpSettings;
use crate::ps::PsSettings;
use crate::settings::FileSettings as TrainFile;
use crate::{Host, Plan, PlanError, Request, Settings};

mod ps;

/// The flags as `gradwire train` holds them.
#[derive(Parser, Debug)]
pub(super) struct Flags {
    #[command(flatten)]
    settings: Settings,
    #[arg(long)]
    threads_as_workers: bool,
    #[command(flatten)]
    ps: PsSettings,
    #[command(flatten)]
    mp: MpSettings,
    #[command(flatten)]
    elastic: ElasticSettings,
}

impl Flags {
    pub(super) fn merge(&self, file: TrainFile, name: &str, host: Host) -> Result<Plan, PlanError> {
        let request = Request {
            settings: &self.settings,
            ps: &self.ps,
            mp: &self.mp,
            elastic: &self.elastic,
        };
        let host = Host {
            threads_as_workers: self.threads_as_workers,
            ..host
        };
        Plan::merge(request, file, name, host, &|| Ok(fixed()))
    }
}

pub(super) fn args(flags: &[&str]) -> Result<Flags, clap::Error> {
    Flags::try_parse_from(std::iter::once("train").chain(flags.iter().copied()))
}

pub(super) const ALONE: Host = Host {
    cores: 8,
    launched: None,
    elastic_launched: false,
    worker: false,
    threads_as_workers: false,
};

fn file(toml_text: &str) -> TrainFile {
    toml::from_str(toml_text).unwrap()
}

/// A fixed calibration, so that `--codec auto`'s choices here do not depend on the machine.
fn fixed() -> Calibration {
    Calibration::two_core_example()
}

#[test]
fn bad_values_are_refused_at_the_edge_with_the_allowed_ones() {
    let e = args(&["--model", "vgg"]).unwrap_err().to_string();
    assert!(e.contains("mlp|lenet|resnet|lstm"), "{e}");
    let e = args(&["--codec", "zip"]).unwrap_err().to_string();
    assert!(e.contains("topk") && e.contains("qsgd"), "{e}");
    let e = args(&["--sync", "fast"]).unwrap_err().to_string();
    assert!(e.contains("gather") && e.contains("sparse"), "{e}");
    let e = args(&["--momentum-correction", "maybe"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("auto") && e.contains("off"), "{e}");
    let e = args(&["--dataset", "imagenet"]).unwrap_err().to_string();
    assert!(e.contains("fashion-mnist"), "{e}");
    assert!(args(&["--optimizer", "rmsprop"]).is_err());
}

#[test]
fn flags_win_over_the_file_which_wins_over_defaults() {
    let a = args(&["--codec", "topk:ratio=0.01", "--epochs", "3"]).unwrap();
    let f = file("codec = \"qsgd:bits=4\"\nepochs = 7\nbatch = 16\nmodel = \"mlp\"\n");
    let p = a.merge(f, "run.toml", ALONE).unwrap();
    assert_eq!(
        p.codec.to_string(),
        "topk:ratio=0.01"
            .parse::<CodecConfig>()
            .unwrap()
            .to_string()
    );
    assert_eq!(p.train.epochs, 3);
    assert_eq!(p.train.batch_size, 16);
    assert_eq!(p.model, ModelKind::Mlp);
    assert_eq!(p.dataset, DatasetKind::FashionMnist);
    // Defaults.
    let p = args(&[])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(
        (p.model, p.workers, p.train.epochs, p.train.batch_size),
        (ModelKind::LeNet, 1, 1, 64)
    );
    assert_eq!(p.codec.id(), CodecId::None);
    assert_eq!(p.data, default_data_dir());
    let p = args(&["--model", "lstm"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(
        (p.dataset, p.train.batch_size),
        (DatasetKind::Shakespeare, 32)
    );
}

#[test]
fn a_bad_file_value_names_the_file_and_key() {
    let e = args(&[])
        .unwrap()
        .merge(file("model = \"vgg\"\n"), "run.toml", ALONE)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("run.toml") && e.contains("model") && e.contains("lenet"),
        "{e}"
    );
    assert!(toml::from_str::<TrainFile>("modle = \"mlp\"\n").is_err());
}

#[test]
fn stripe_quantizers_under_momentum_after_aggregation_are_warned() {
    let warn = |a: &[&str]| {
        args(a)
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap()
            .momentum_warning()
    };
    for codec in ["onebit", "adaptive", "onebit:column=tensor"] {
        let w = warn(&["--codec", codec]).expect(codec);
        assert!(w.contains("momentum 0.9") && w.contains("adagrad"), "{w}");
        // The papers' optimizer, the correction, or no momentum: no warning.
        assert_eq!(warn(&["--codec", codec, "--optimizer", "adagrad"]), None);
        assert_eq!(
            warn(&["--codec", codec, "--optimizer", "sgd:lr=0.05"]),
            None
        );
        assert_eq!(
            warn(&["--codec", codec, "--momentum-correction", "on"]),
            None
        );
    }
    for codec in ["none", "qsgd", "terngrad", "topk", "dgc"] {
        assert_eq!(warn(&["--codec", codec]), None, "{codec}");
    }
    // A rule sends some tensors through 1-bit SGD: those tensors are warned for.
    let w = warn(&["--rule", "name=fc*=>onebit"]).expect("rule");
    assert!(w.contains("1-bit SGD"), "{w}");
    let w = warn(&["--codec", "qsgd", "--rule", "dims=2=>adaptive"]).expect("rule");
    assert!(w.contains("adaptive"), "{w}");
    assert_eq!(
        warn(&["--rule", "name=fc*=>onebit", "--optimizer", "adagrad"]),
        None
    );
    assert_eq!(warn(&["--rule", "name=fc*=>qsgd"]), None);
}

#[test]
fn auto_weighs_one_bit_sgd_only_where_no_momentum_follows_aggregation() {
    let plan = |a: &[&str]| {
        let mut all = vec!["--model", "mlp:hidden=1024x2", "--workers", "4"];
        all.extend_from_slice(&["--codec", "auto", "--link", "1gbit"]);
        all.extend_from_slice(a);
        args(&all)
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap()
    };
    let choice = |a: &[&str]| plan(a).codec_choice.unwrap();
    let weighed = |c: &crate::auto::Choice| c.candidates.join(",");
    // The default optimizer, SGD with momentum 0.9 after aggregation: no 1-bit SGD.
    let c = choice(&[]);
    assert_eq!(weighed(&c), "none,fp16,qsgd:bits=4");
    assert!(c.tensors.iter().all(|t| t.codec != "onebit"), "{c:?}");
    // AdaGrad and plain SGD: 1-bit SGD is weighed, and over 1 Gbit/s it sends the two
    // big weight matrices (about a quarter of QSGD's bytes at about its codec cost).
    for opt in ["adagrad:lr=0.01", "sgd:lr=0.05"] {
        let p = plan(&["--optimizer", opt]);
        let c = p.codec_choice.as_ref().unwrap();
        assert_eq!(weighed(c), "none,fp16,qsgd:bits=4,onebit", "{opt}");
        for big in ["hidden.0.weight", "hidden.1.weight"] {
            let t = c.tensors.iter().find(|t| t.tensor == big).unwrap();
            assert_eq!(t.codec, "onebit", "{opt}: {t:?}");
        }
        // The job's own rules send those tensors through it, so no momentum warning.
        assert_eq!(p.momentum_warning(), None, "{opt}");
    }
    // A list given by hand is taken as it is.
    let c = choice(&[
        "--optimizer",
        "adagrad",
        "--auto-codecs",
        "none,qsgd:bits=4",
    ]);
    assert_eq!(weighed(&c), "none,qsgd:bits=4");
}

#[test]
fn momentum_correction_moves_momentum_out_of_the_optimizer() {
    // The papers' default: the optimizer keeps momentum for every codec but DGC.
    for codec in [
        "qsgd",
        "onebit",
        "threshold:tau=0.01",
        "adaptive",
        "topk",
        "terngrad",
    ] {
        let p = args(&["--codec", codec])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(p.momentum_correction, None, "{codec}");
        assert_eq!(
            p.train.optimizer.sgd_momentum(),
            Some((0.9, false)),
            "{codec}"
        );
    }
    let p = args(&["--codec", "dgc:momentum=0.8"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(p.momentum_correction, None, "DGC's codec owns its momentum");
    assert_eq!(p.train.optimizer.sgd_momentum(), None);
    assert!(
        p.train.optimizer.to_string().contains("momentum=0.8")
            && p.train.optimizer.to_string().contains("corrected"),
        "weight decay takes DGC's momentum: {}",
        p.train.optimizer
    );
    let p = args(&["--codec", "qsgd", "--momentum-correction", "on"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(p.momentum_correction, Some((0.9, false)));
    assert_eq!(p.train.optimizer.sgd_momentum(), None);
    let p = args(&["--codec", "qsgd", "--momentum-correction", "off"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(p.momentum_correction, None);
    assert_eq!(p.train.optimizer.sgd_momentum(), Some((0.9, false)));
    let p = args(&["--momentum-correction", "on"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(
        p.momentum_correction, None,
        "dense keeps the optimizer's momentum"
    );
    let e = args(&[
        "--codec",
        "qsgd",
        "--momentum-correction",
        "on",
        "--optimizer",
        "adam",
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .unwrap_err()
    .to_string();
    assert!(e.contains("momentum"), "{e}");
    let e = args(&[
        "--codec",
        "adaptive:ternary=true",
        "--momentum-correction",
        "on",
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .unwrap_err()
    .to_string();
    assert!(e.contains("ternary"), "{e}");
}

#[test]
fn dgc_clips_locally_where_the_optimizer_would_clip_the_sum() {
    let p = args(&[
        "--codec",
        "dgc",
        "--optimizer",
        "sgd:lr=0.1,momentum=0.9,clip=5",
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .unwrap();
    assert_eq!(p.train.optimizer.clip_norm, None);
    assert!(p.codec.to_string().contains("clip=5"), "{}", p.codec);
    let p = args(&["--codec", "dgc:clip=2", "--optimizer", "sgd:lr=0.1,clip=5"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!(
        p.train.optimizer.clip_norm,
        Some(5.0),
        "an explicit clip wins"
    );
    assert!(p.codec.to_string().contains("clip=2"), "{}", p.codec);
    let p = args(&["--codec", "dgc"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert!(
        p.codec.to_string().contains("clip=0"),
        "no clip without one to scale"
    );
}

#[test]
fn clip_scope_local_moves_the_optimizer_clip_to_each_worker() {
    let sgd = "sgd:lr=1,momentum=0.9,clip=5";
    for codec in ["topk", "none", "qsgd"] {
        let p = args(&["--codec", codec, "--optimizer", sgd])
            .unwrap()
            .merge(TrainFile::default(), "", ALONE)
            .unwrap();
        assert_eq!(p.train.optimizer.clip_norm, Some(5.0), "{codec}: global");
        assert_eq!(p.train.local_clip, None, "{codec}: global");
        let p = args(&[
            "--codec",
            codec,
            "--optimizer",
            sgd,
            "--clip-scope",
            "local",
        ])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
        assert_eq!(p.train.optimizer.clip_norm, None, "{codec}: local");
        assert_eq!(p.train.local_clip, Some(5.0), "{codec}: local");
    }
    // DGC clips in its codec either way; nothing is clipped twice.
    let p = args(&[
        "--codec",
        "dgc",
        "--optimizer",
        sgd,
        "--clip-scope",
        "local",
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .unwrap();
    assert_eq!(
        (p.train.optimizer.clip_norm, p.train.local_clip),
        (None, None)
    );
    assert!(p.codec.to_string().contains("clip=5"), "{}", p.codec);
    // Nothing to move: refused, naming the fix.
    let e = args(&[
        "--codec",
        "topk",
        "--optimizer",
        "sgd:lr=1",
        "--clip-scope",
        "local",
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .unwrap_err()
    .to_string();
    assert!(e.contains("clip=C"), "{e}");
}

#[test]
fn dgc_under_an_adaptive_optimizer_is_refused_unless_allowed() {
    let e = args(&["--codec", "dgc", "--optimizer", "adam:lr=0.001"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("DGC needs SGD") && e.contains("--allow-dgc-adaptive"),
        "{e}"
    );
    assert!(args(&[
        "--codec",
        "dgc",
        "--optimizer",
        "adam",
        "--allow-dgc-adaptive"
    ])
    .unwrap()
    .merge(TrainFile::default(), "", ALONE)
    .is_ok());
    assert!(args(&["--codec", "dgc"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .is_ok());
}

#[test]
fn a_launcher_sets_the_world_and_threads_follow_the_ranks_on_the_host() {
    let launched = Host {
        cores: 8,
        elastic_launched: false,
        worker: false,
        threads_as_workers: false,
        launched: Some((16, 4)),
    };
    let p = args(&["--workers", "2"])
        .unwrap()
        .merge(TrainFile::default(), "", launched)
        .unwrap();
    assert_eq!((p.workers, p.threads), (16, 2));
    let p = args(&["--workers", "4"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .unwrap();
    assert_eq!((p.workers, p.threads), (4, 2));
    let p = args(&["--threads", "3"])
        .unwrap()
        .merge(TrainFile::default(), "", launched)
        .unwrap();
    assert_eq!(p.threads, 3);
    assert!(args(&["--workers", "0"])
        .unwrap()
        .merge(TrainFile::default(), "", ALONE)
        .is_err());
}
