//! [`Plan::new`]: the flags over the settings file over the defaults, every rule applied.

use std::path::{Path, PathBuf};

use gradwire_codec::CodecConfig;
use gradwire_train::data::{default_data_dir, DatasetKind};
use gradwire_train::{EngineConfig, ModelKind, OptimizerConfig, OptimizerKind, Rule, TrainConfig};

use super::{checks, Host, Plan, PlanError, Request};
use crate::auto::{default_candidates, model_tensors, CalibrationSource, CodecArg};
use crate::model_parallel::ModelParallel;
use crate::ps::PlanContext;
use crate::settings::{from_file, FileSettings, MomentumMode};
use crate::sync_mode::SyncMode;

impl Plan {
    /// Reads the settings file (if any), merges it under the flags and validates everything
    /// before any thread or process starts. `calibration` is asked for this machine's costs
    /// only under `--codec auto`.
    pub fn new(
        request: Request<'_>,
        file: Option<&Path>,
        host: Host,
        calibration: CalibrationSource<'_>,
    ) -> Result<Plan, PlanError> {
        let (settings, name) = match file {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| PlanError::Read {
                    path: p.to_path_buf(),
                    source,
                })?;
                let parsed = toml::from_str(&text).map_err(|source| PlanError::Parse {
                    path: p.to_path_buf(),
                    source: Box::new(source),
                })?;
                (parsed, p.display().to_string())
            }
            None => (FileSettings::default(), String::new()),
        };
        Plan::merge(request, settings, &name, host, calibration)
    }

    /// Flags over the file's settings (`name` is the file, for errors) over the defaults.
    ///
    /// Longer than 120 lines on purpose: each setting is read (flag, then file, then
    /// default) in the order the later ones depend on the earlier (the model before the
    /// dataset, the workers before the link, the codec before the rules), and the plan's
    /// fields are filled in one literal; the rules themselves are the functions below.
    pub fn merge(
        request: Request<'_>,
        file: FileSettings,
        name: &str,
        host: Host,
        calibration: CalibrationSource<'_>,
    ) -> Result<Plan, PlanError> {
        let flags = request.settings;
        let model = match flags.model {
            Some(m) => m,
            None => from_file(name, "model", file.model)?.unwrap_or(ModelKind::LeNet),
        };
        let dataset = match flags.dataset {
            Some(d) => d,
            None => {
                from_file(name, "dataset", file.dataset)?.unwrap_or(if model.is_language_model() {
                    DatasetKind::Shakespeare
                } else {
                    DatasetKind::FashionMnist
                })
            }
        };
        let model_parallel = ModelParallel::from_settings(request.mp, model)?;
        let k = model_parallel.map_or(1, |m| m.partitions);
        let workers = workers(flags.workers.or(file.workers), k, host);
        if workers == 0 || (host.launched.is_none() && workers > 64) {
            return Err(PlanError::Workers);
        }
        if let Some(mp) = &model_parallel {
            mp.replicas(workers)?;
        }
        let dense = CodecConfig::None(gradwire_codec::CastConfig::default());
        let codec_arg = match &flags.codec {
            Some(c) => c.clone(),
            None => from_file(name, "codec", file.codec)?.unwrap_or(CodecArg::Codec(dense.clone())),
        };
        let auto = codec_arg == CodecArg::Auto;
        let codec = match codec_arg {
            CodecArg::Auto => dense,
            CodecArg::Codec(c) => c,
        };
        if !auto && flags.auto_codecs.is_some() {
            return Err(PlanError::AutoCodecsWithoutAuto);
        }
        let sync: SyncMode = match flags.sync {
            Some(s) => s,
            None => from_file(name, "sync", file.sync)?.unwrap_or_default(),
        };
        let (sync, ps_mode) = sync.split();
        let rules = rules(flags, file.rules, name)?;
        // An impossible codec/strategy pair is refused here, before any data loads (rules
        // naming tensors are checked against the model when the engine starts).
        EngineConfig {
            codec: codec.clone(),
            strategy: sync,
            ..EngineConfig::default()
        }
        .plan(&[gradwire_train::sync::probe_tensor()])
        .map_err(|source| PlanError::CodecWithSync {
            codec: codec.clone(),
            source,
        })?;
        let epochs = flags.epochs.or(file.epochs).unwrap_or(1);
        let batch = flags
            .batch
            .or(file.batch)
            .unwrap_or(if model.is_language_model() { 32 } else { 64 });
        if batch == 0 || epochs == 0 {
            return Err(PlanError::BatchEpochs);
        }
        let (file_names_optimizer, file_names_lr) = (file.optimizer.is_some(), file.lr.is_some());
        let optimizer = match &flags.optimizer {
            Some(o) => o.clone(),
            None => from_file(name, "optimizer", file.optimizer)?
                .unwrap_or_else(|| default_optimizer(model)),
        };
        let choices = gradwire_run::RuleChoices {
            momentum: flags
                .momentum_correction
                .or(file.momentum_correction)
                .unwrap_or_default(),
            clip_scope: flags.clip_scope.or(file.clip_scope).unwrap_or_default(),
            allow_dgc_adaptive: flags.allow_dgc_adaptive || file.allow_dgc_adaptive == Some(true),
        };
        let TrainingRules {
            codec,
            optimizer,
            momentum_correction,
            local_clip,
        } = training_rules(codec, optimizer, flags.lr.or(file.lr), choices, auto)?;
        optimizer.validate().map_err(PlanError::Optimizer)?;
        let local = host.launched.map_or(workers, |(_, local)| local);
        let threads = flags
            .threads
            .or(file.threads)
            .unwrap_or(gradwire_train::threads_per_worker(host.cores, local));
        let train = TrainConfig {
            batch_size: batch,
            epochs,
            seed: flags.seed.or(file.seed).unwrap_or(42),
            optimizer,
            max_steps_per_epoch: flags.max_steps.or(file.max_steps),
            eval_limit: flags.eval_limit.or(file.eval_limit),
            overlap_steps: flags.overlap_steps.map_or(0, usize::from),
            local_clip,
            ..TrainConfig::default()
        };
        let out = flags
            .out
            .clone()
            .or(file.out)
            .or_else(|| flags.resume.clone())
            .unwrap_or_else(|| default_out(model, dataset, &codec));
        let link = match &flags.link {
            Some(l) => Some(l.clone()),
            None => match from_file(name, "link", file.link)? {
                Some(l) => Some(l),
                None => {
                    gradwire_transport::link::config_from_env(workers).map_err(PlanError::Link)?
                }
            },
        };
        let mut plan = Plan {
            model,
            dataset,
            workers,
            model_parallel,
            codec,
            sync,
            rules,
            fusion_bytes: flags
                .fusion_bytes
                .or(file.fusion_bytes)
                .unwrap_or(EngineConfig::default().fusion_bytes),
            timeline: flags.timeline.clone().or(file.timeline),
            link,
            momentum_correction,
            train,
            seq_len: flags.seq_len.or(file.seq_len).unwrap_or(64),
            threads,
            data: flags
                .data
                .clone()
                .or(file.data)
                .unwrap_or_else(default_data_dir),
            json: flags.json.clone().or(file.json),
            out,
            ps: None,
            save_params: request.ps.save_params.clone(),
            codec_choice: None,
            checkpoint_every: flags
                .checkpoint_every
                .or(file.checkpoint_every)
                .unwrap_or(0),
            resume: flags.resume.clone(),
            elastic: None,
        };
        if plan.checkpoint_every > 0 || plan.resume.is_some() {
            if ps_mode.is_some() {
                return Err(PlanError::CheckpointWithPs);
            }
            if plan.train.overlap_steps != 0 {
                return Err(PlanError::CheckpointWithOverlap);
            }
        }
        if let Some(mp) = &plan.model_parallel {
            checks::model_parallel(mp, &plan, ps_mode, auto)?;
        }
        if auto {
            if ps_mode.is_some() {
                return Err(PlanError::AutoWithPs);
            }
            choose_codec(&mut plan, flags.auto_codecs.as_deref(), calibration)?;
        }
        plan.ps = crate::ps::plan(
            ps_mode,
            &PlanContext {
                flags,
                ps: request.ps,
                tables: k,
                file_names: (file_names_optimizer, file_names_lr),
                codec: &plan.codec,
                optimizer: &plan.train.optimizer,
                launched: host.launched.is_some(),
                worker: host.worker,
                threads_as_workers: host.threads_as_workers,
                link: plan.link.is_some(),
            },
        )?;
        if let (Some(mp), Some(ps)) = (&plan.model_parallel, &plan.ps) {
            checks::model_parallel_ps(mp, ps)?;
        }
        plan.elastic = checks::elastic(request.elastic, &plan, host.elastic_launched)?;
        Ok(plan)
    }
}

/// The world size: the launcher's, else `asked` (`--workers`, times the `k` ranks of a
/// replica under model parallelism), else one replica.
fn workers(asked: Option<usize>, k: usize, host: Host) -> usize {
    // Under model parallelism --workers counts replicas, each of K ranks.
    let asked = asked.map(|w| w.saturating_mul(k));
    match host.launched {
        Some((world, _)) => {
            if let Some(w) = asked.filter(|&w| w != world) {
                tracing::warn!("--workers {w} ignored: the launcher started {world} ranks");
            }
            world
        }
        None => asked.unwrap_or(k),
    }
}

/// The per-tensor codec rules: the flags' when any, else the file's (parsed, naming the file
/// and the rule when one does not parse).
fn rules(
    flags: &crate::Settings,
    file: Option<Vec<String>>,
    name: &str,
) -> Result<Vec<Rule>, PlanError> {
    if !flags.rules.is_empty() {
        return Ok(flags.rules.clone());
    }
    file.unwrap_or_default()
        .into_iter()
        .map(|r| {
            r.parse::<Rule>().map_err(|source| PlanError::FileRule {
                file: name.to_string(),
                rule: r.clone(),
                source,
            })
        })
        .collect()
}

/// The codec and optimizer after the training rules.
struct TrainingRules {
    codec: CodecConfig,
    optimizer: OptimizerConfig,
    /// The sync's momentum correction, `(beta, nesterov)`, when on.
    momentum_correction: Option<(f64, bool)>,
    /// Each worker's own clip, `C / sqrt(N)`.
    local_clip: Option<f64>,
}

/// The training rules of the papers applied to the codec and the optimizer (DGC owns the
/// momentum, momentum correction, the clip's scope; `gradwire_run::resolve`), after `lr`
/// overrides the optimizer's rate.
fn training_rules(
    codec: CodecConfig,
    mut optimizer: OptimizerConfig,
    lr: Option<f64>,
    choices: gradwire_run::RuleChoices,
    auto: bool,
) -> Result<TrainingRules, PlanError> {
    if let Some(lr) = lr {
        optimizer.lr = lr;
    }
    if auto && choices.momentum == MomentumMode::On {
        return Err(PlanError::MomentumWithAuto);
    }
    let view = gradwire_run::OptimizerView {
        name: optimizer.to_string(),
        is_sgd: matches!(optimizer.kind, OptimizerKind::Sgd { .. }),
        sgd_momentum: optimizer.sgd_momentum(),
        clip_norm: optimizer.clip_norm,
    };
    let resolved = gradwire_run::resolve(&codec, &view, choices)?;
    if let gradwire_run::OptimizerMomentum::Corrected(m) = resolved.optimizer_momentum {
        optimizer = optimizer.momentum_corrected(m);
    }
    optimizer.clip_norm = resolved.optimizer_clip;
    Ok(TrainingRules {
        codec: resolved.codec,
        optimizer,
        momentum_correction: resolved.momentum_correction,
        local_clip: resolved.local_clip,
    })
}

/// Where a run writes when no `--out` is given: `out/MODEL-DATASET-CODEC`.
fn default_out(model: ModelKind, dataset: DatasetKind, codec: &CodecConfig) -> PathBuf {
    PathBuf::from("out").join(format!(
        "{}-{}-{}",
        model.name(),
        dataset.name(),
        codec.name()
    ))
}

/// `--codec auto`: this machine's calibration, the candidates (`--auto-codecs`, else the
/// optimizer's defaults) and the cost model's choice for the plan's model, workers and link;
/// the choice's rules join the plan's.
fn choose_codec(
    plan: &mut Plan,
    auto_codecs: Option<&str>,
    calibration: CalibrationSource<'_>,
) -> Result<(), PlanError> {
    let calibration = calibration().map_err(PlanError::Calibration)?;
    let list = auto_codecs.unwrap_or_else(|| default_candidates(&plan.train.optimizer));
    let candidates =
        gradwire_sim::auto::candidates(list, &calibration).map_err(PlanError::Candidates)?;
    let tensors = model_tensors(plan.model, plan.dataset)?;
    let choice = gradwire_sim::auto::choose(
        &tensors,
        plan.workers,
        plan.link.as_ref(),
        plan.fusion_bytes,
        &candidates,
        &calibration,
    )
    .map_err(PlanError::Auto)?;
    tracing::info!(
        "--codec auto over {} at {} workers: {}",
        choice.link,
        plan.workers,
        choice.summary()
    );
    plan.rules.extend(choice.rules().map_err(PlanError::Auto)?);
    plan.codec_choice = Some(choice);
    Ok(())
}

/// The optimizer a model trains well with here.
fn default_optimizer(model: ModelKind) -> OptimizerConfig {
    match model {
        ModelKind::CharLstm | ModelKind::CharLstmHidden(_) => {
            let mut o = OptimizerConfig::adam(2e-3);
            o.clip_norm = Some(5.0);
            o
        }
        _ => OptimizerConfig::sgd(0.05, 0.9),
    }
}
