//! `gradwire train`: data-parallel training of a real model on real data with any codec.
//!
//! Runs as the parent of `--workers` rank processes (TCP on loopback), or as one rank when a
//! launcher set the environment (`gradwire launch`, mpirun, srun, torchrun). Rank 0 shows a
//! progress bar and, per epoch, appends one JSON line (`epoch`, `train_loss`,
//! `test_accuracy` or `val_perplexity`, `wall_s`, `compute_s`, `comm_s`, `bytes_sent`,
//! `compression_ratio`); at the end it writes `run.json` and the plots into `--out`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use gradwire_codec::{CodecConfig, CodecId};
use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{
    CompressedSync, DenseSync, EpochStats, GradientSync, ModelKind, OptimizerConfig, StepInfo,
    SyncStrategy, TrainConfig, Trainer,
};
use gradwire_transport::local::Local;
use gradwire_transport::Transport;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use crate::launch::{describe, spawn_quiet, RankSpec};
use crate::plot::human_bytes;
use crate::records::{append_jsonl, EpochRecord, RunRecord};

/// Arguments of `gradwire train` (each may also come from `--config FILE.toml`, same keys).
#[derive(Args, Debug, Clone, Default)]
pub struct TrainArgs {
    /// TOML file with any of these settings (flags given on the command line win).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model: mlp, lenet, resnet, lstm.
    #[arg(long)]
    pub model: Option<String>,
    /// Data set: fashion-mnist, mnist, shakespeare, cifar10.
    #[arg(long)]
    pub dataset: Option<String>,
    /// Number of worker processes (data-parallel ranks) to start.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Gradient codec spec, e.g. none, fp16, onebit, topk:ratio=0.01, qsgd:bits=4, dgc:ratio=0.001.
    #[arg(long)]
    pub codec: Option<String>,
    /// How compressed gradients are reduced: auto, gather, quantized, sparse.
    #[arg(long)]
    pub sync: Option<String>,
    /// Momentum correction (DGC, section 3.2): each worker folds SGD's momentum into its
    /// gradient before the codec, and the optimizer steps without momentum. `auto` (and `on`)
    /// use it for every codec when the optimizer is SGD with momentum (it fixed the biased
    /// codecs and helped the unbiased ones: QSGD-4 and TernGrad gained 1.3 and 2.2 points on
    /// LeNet); DGC always owns its momentum. `off` applies momentum after decompression.
    #[arg(long, value_name = "auto|on|off")]
    pub momentum_correction: Option<String>,
    /// Epochs to train.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Base learning rate (overrides the optimizer spec's).
    #[arg(long)]
    pub lr: Option<f64>,
    /// Optimizer spec, e.g. `sgd:lr=0.05,momentum=0.9` or `adam:lr=1e-3` (default per model).
    #[arg(long)]
    pub optimizer: Option<String>,
    /// Samples per step on each worker.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Seed of initialization, shuffles and stochastic codecs (a run repeats exactly).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Cap on steps per epoch (for short runs).
    #[arg(long)]
    pub max_steps: Option<usize>,
    /// Cap on held-out samples evaluated per epoch.
    #[arg(long)]
    pub eval_limit: Option<usize>,
    /// Characters per training sequence (language models).
    #[arg(long)]
    pub seq_len: Option<usize>,
    /// Compute threads per worker (default: the cores divided among the workers).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where the data sets are (default: ./data, or GRADWIRE_DATA).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Append each epoch's JSON line to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Directory for metrics.jsonl, run.json and the plots (default out/<model>-<codec>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Run the workers as threads of this process instead of processes.
    #[arg(long)]
    pub threads_as_workers: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Internal: this process is one rank started by the parent.
    #[arg(long, hide = true)]
    pub worker: bool,
}

/// The same settings as read from a TOML file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainFile {
    model: Option<String>,
    dataset: Option<String>,
    workers: Option<usize>,
    codec: Option<String>,
    sync: Option<String>,
    momentum_correction: Option<String>,
    epochs: Option<usize>,
    lr: Option<f64>,
    optimizer: Option<String>,
    batch: Option<usize>,
    seed: Option<u64>,
    max_steps: Option<usize>,
    eval_limit: Option<usize>,
    seq_len: Option<usize>,
    threads: Option<usize>,
    data: Option<PathBuf>,
    json: Option<PathBuf>,
    out: Option<PathBuf>,
}

/// Validated settings of a run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The model.
    pub model: ModelKind,
    /// The data set.
    pub dataset: DatasetKind,
    /// Worker count.
    pub workers: usize,
    /// The codec spec (canonical).
    pub codec: CodecConfig,
    /// Compressed all-reduce strategy.
    pub sync: SyncStrategy,
    /// Momentum correction in the sync: `(beta, nesterov)` taken from the optimizer.
    pub momentum_correction: Option<(f64, bool)>,
    /// Trainer settings.
    pub train: TrainConfig,
    /// Sequence length for text.
    pub seq_len: usize,
    /// Compute threads per worker.
    pub threads: usize,
    /// Data directory.
    pub data: PathBuf,
    /// JSON-lines file.
    pub json: Option<PathBuf>,
    /// Output directory.
    pub out: PathBuf,
}

impl TrainArgs {
    /// Merges the TOML file (if any) under the flags and validates everything before any
    /// thread or process starts.
    pub fn plan(&self) -> Result<Plan> {
        let file: TrainFile = match &self.config {
            Some(p) => toml::from_str(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("parsing {}", p.display()))?,
            None => TrainFile::default(),
        };
        let model: ModelKind = pick(&self.model, file.model, "lenet").parse()?;
        let default_data = if model.is_language_model() {
            "shakespeare"
        } else {
            "fashion-mnist"
        };
        let dataset: DatasetKind = pick(&self.dataset, file.dataset, default_data).parse()?;
        let workers = self.workers.or(file.workers).unwrap_or(1);
        if workers == 0 || workers > 64 {
            bail!("--workers must be between 1 and 64");
        }
        let codec: CodecConfig = pick(&self.codec, file.codec, "none")
            .parse()
            .context("--codec")?;
        let sync: SyncStrategy = pick(&self.sync, file.sync, "auto").parse()?;
        let epochs = self.epochs.or(file.epochs).unwrap_or(1);
        let batch = self
            .batch
            .or(file.batch)
            .unwrap_or(if model.is_language_model() { 32 } else { 64 });
        if batch == 0 || epochs == 0 {
            bail!("--batch and --epochs must be positive");
        }
        let mut optimizer: OptimizerConfig = match self.optimizer.clone().or(file.optimizer) {
            Some(spec) => spec.parse().context("--optimizer")?,
            None => default_optimizer(model),
        };
        if let Some(lr) = self.lr.or(file.lr) {
            optimizer.lr = lr;
        }
        let correct =
            match pick(&self.momentum_correction, file.momentum_correction, "auto").as_str() {
                "auto" | "on" => true,
                "off" => false,
                other => bail!("--momentum-correction must be auto, on or off, not '{other}'"),
            };
        let mut momentum_correction = None;
        if codec.id() == CodecId::Dgc {
            // DGC owns momentum (momentum correction): the optimizer step is plain SGD.
            optimizer = optimizer.without_momentum();
        } else if correct && codec.id() != CodecId::None {
            momentum_correction = optimizer.sgd_momentum();
            optimizer = optimizer.without_momentum();
        }
        optimizer.validate()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = self
            .threads
            .or(file.threads)
            .unwrap_or((cores / workers).max(1));
        let train = TrainConfig {
            batch_size: batch,
            epochs,
            seed: self.seed.or(file.seed).unwrap_or(42),
            optimizer,
            max_steps_per_epoch: self.max_steps.or(file.max_steps),
            eval_limit: self.eval_limit.or(file.eval_limit),
            ..TrainConfig::default()
        };
        let out = self.out.clone().or(file.out).unwrap_or_else(|| {
            PathBuf::from("out").join(format!(
                "{}-{}-{}",
                model.name(),
                dataset.name(),
                codec.name()
            ))
        });
        Ok(Plan {
            model,
            dataset,
            workers,
            codec,
            sync,
            momentum_correction,
            train,
            seq_len: self.seq_len.or(file.seq_len).unwrap_or(64),
            threads,
            data: self
                .data
                .clone()
                .or(file.data)
                .unwrap_or_else(default_data_dir),
            json: self.json.clone().or(file.json),
            out,
        })
    }
}

fn pick(flag: &Option<String>, file: Option<String>, default: &str) -> String {
    flag.clone().or(file).unwrap_or_else(|| default.to_string())
}

/// The optimizer a model trains well with here.
fn default_optimizer(model: ModelKind) -> OptimizerConfig {
    match model {
        ModelKind::CharLstm => {
            let mut o = OptimizerConfig::adam(2e-3);
            o.clip_norm = Some(5.0);
            o
        }
        _ => OptimizerConfig::sgd(0.05, 0.9),
    }
}

/// Runs `gradwire train`.
pub fn run(args: &TrainArgs) -> Result<()> {
    let plan = args.plan()?;
    let under_launcher = gradwire_transport::env::tcp_config_from_env()?.is_some();
    if args.worker || under_launcher {
        let t = crate::world::join_from_env()?;
        return run_rank(t, &plan, args.quiet);
    }
    if plan.workers == 1 || args.threads_as_workers {
        let mut world = Local::world(plan.workers);
        let rest: Vec<_> = world
            .drain(1..)
            .map(|t| {
                let p = plan.clone();
                std::thread::spawn(move || run_rank(t, &p, true))
            })
            .collect();
        let r0 = run_rank(world.pop().expect("rank 0"), &plan, args.quiet);
        for h in rest {
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker thread panicked"))??;
        }
        return r0;
    }
    // One process per worker, this binary again with --worker.
    let exe = std::env::current_exe().context("locating the gradwire binary")?;
    let mut child_args: Vec<String> = std::env::args().skip(1).collect();
    child_args.push("--worker".into());
    let spec = RankSpec {
        np: plan.workers,
        master: None,
        timeout: None,
        program: exe.display().to_string(),
        args: child_args,
    };
    let outcome = spawn_quiet(&spec)?.wait()?;
    if let Some((rank, status)) = outcome.failure {
        bail!(
            "worker {rank} failed ({}); the others were stopped",
            describe(status)
        );
    }
    Ok(())
}

/// Trains on one rank; rank 0 reports.
fn run_rank<T: Transport + 'static>(t: T, plan: &Plan, quiet: bool) -> Result<()> {
    gradwire_train::init_threads(plan.threads);
    let (rank, world) = (t.rank(), t.world_size());
    let data = plan
        .dataset
        .load(&plan.data, plan.seq_len)
        .with_context(|| format!("rank {rank}: loading {}", plan.dataset.name()))?;
    let model = plan.model.build(data.shape(), plan.train.seed)?;
    let layout = model.layout();
    let steps_guess = steps_per_epoch(data.train.len(), world, &plan.train);
    let sync: Box<dyn GradientSync> =
        if plan.codec.id() == CodecId::None && plan.sync == SyncStrategy::Auto {
            Box::new(DenseSync::new(t))
        } else {
            let sync = CompressedSync::new(
                t,
                plan.codec.clone(),
                plan.sync,
                layout,
                plan.train.seed,
                steps_guess,
            );
            Box::new(match plan.momentum_correction {
                Some((beta, nesterov)) => sync.with_momentum_correction(beta as f32, nesterov),
                None => sync,
            })
        };
    let mut trainer = Trainer::new(model, sync, plan.train.clone(), data.train.len())?;
    let steps = trainer.steps_per_epoch(data.train.len());
    let reporting = rank == 0;
    if reporting {
        eprintln!(
            "gradwire train: {} on {} ({} train / {} held out), {world} worker(s), codec {}{}, {} steps/epoch x {} epochs, batch {} per worker",
            plan.model.name(),
            plan.dataset.name(),
            data.train.len(),
            data.test.len(),
            plan.codec,
            plan.momentum_correction
                .map_or(String::new(), |(b, _)| format!(" (momentum correction {b})")),
            steps,
            plan.train.epochs,
            plan.train.batch_size
        );
        std::fs::create_dir_all(&plan.out)
            .with_context(|| format!("creating {}", plan.out.display()))?;
        let _ = std::fs::remove_file(plan.out.join("metrics.jsonl"));
    }
    let mut run = RunRecord {
        codec: plan.codec.to_string(),
        model: plan.model.name().into(),
        dataset: plan.dataset.name().into(),
        workers: world,
        steps_per_epoch: steps,
        epochs: Vec::new(),
        momentum_correction: plan.momentum_correction.map(|(beta, _)| beta),
    };
    let mut last_acc = String::new();
    let mut total_bytes = 0u64;
    for epoch in 0..plan.train.epochs {
        let bar = (reporting && !quiet).then(|| progress_bar(steps, epoch, plan.train.epochs));
        let start = Instant::now();
        let mut epoch_bytes = 0u64;
        let mut on_step = |s: &StepInfo| {
            epoch_bytes += s.sync.bytes_sent;
            if let Some(b) = &bar {
                b.set_position(s.step as u64 + 1);
                let ms = start.elapsed().as_secs_f64() * 1e3 / (s.step + 1) as f64;
                b.set_message(format!(
                    "loss {:.4}{last_acc} | {ms:.0} ms/step | sent {}",
                    s.loss,
                    human_bytes((total_bytes + epoch_bytes) as f64)
                ));
            }
        };
        let stats = trainer.run_epoch(&data, &mut on_step)?;
        total_bytes += stats.bytes_sent;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        if reporting {
            let rec = record(&stats);
            last_acc = match (rec.test_accuracy, rec.val_perplexity) {
                (_, Some(p)) => format!(" | val ppl {p:.2}"),
                (Some(a), _) => format!(" | acc {:.2}%", a * 100.0),
                _ => String::new(),
            };
            println!("{}", serde_json::to_string(&rec)?);
            eprintln!(
                "epoch {}/{}: loss {:.4}{last_acc} | {:.1} s (compute {:.1}, comm {:.1}) | sent {} | ratio {:.1}x",
                rec.epoch,
                plan.train.epochs,
                rec.train_loss,
                rec.wall_s,
                rec.compute_s,
                rec.comm_s,
                human_bytes(rec.bytes_sent as f64),
                rec.compression_ratio
            );
            append_jsonl(&plan.out.join("metrics.jsonl"), &rec)?;
            if let Some(j) = &plan.json {
                append_jsonl(j, &rec)?;
            }
            run.epochs.push(rec);
        }
    }
    if reporting {
        write_run(&run, &plan.out)?;
        eprintln!("gradwire train: wrote {}", plan.out.display());
    }
    Ok(())
}

/// Steps per epoch as the trainer computes them (each rank's shard over its batch).
fn steps_per_epoch(train_len: usize, world: usize, cfg: &TrainConfig) -> usize {
    let s = (train_len / world.max(1)) / cfg.batch_size.max(1);
    cfg.max_steps_per_epoch.map_or(s, |m| s.min(m)).max(1)
}

fn record(s: &EpochStats) -> EpochRecord {
    EpochRecord {
        epoch: s.epoch as usize + 1,
        train_loss: s.train_loss,
        test_accuracy: s.test_accuracy,
        val_perplexity: s.val_perplexity,
        wall_s: s.wall_s,
        compute_s: s.compute_s,
        comm_s: s.comm_s,
        bytes_sent: s.bytes_sent,
        compression_ratio: s.compression_ratio,
    }
}

/// Writes `run.json` and the plots of a finished run.
pub fn write_run(run: &RunRecord, out: &Path) -> Result<()> {
    std::fs::write(
        out.join("run.json"),
        serde_json::to_string_pretty(run)? + "\n",
    )
    .with_context(|| format!("writing {}", out.join("run.json").display()))?;
    crate::plot::plot_run(run, out)?;
    Ok(())
}

fn progress_bar(steps: usize, epoch: usize, epochs: usize) -> ProgressBar {
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(
        ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!("{}/{}", epoch + 1, epochs));
    bar
}
