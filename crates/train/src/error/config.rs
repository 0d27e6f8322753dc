//! What [`Error::Config`](super::Error::Config) carries: which setting is invalid, or which
//! call came out of turn, grouped by where the setting belongs.

use crate::model::partition::MAX_MICRO_BATCHES;
use crate::model::{ModelKind, MAX_HIDDEN_LAYERS, MAX_HIDDEN_WIDTH, MAX_LSTM_HIDDEN, MAX_PARAMS};

/// An invalid setting, or a call that does not fit the state it found.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A training or evaluation batch size of 0.
    #[error("batch sizes must be positive")]
    BatchSize,
    /// An `overlap_steps` other than 0 or 1.
    #[error("overlap_steps {given} is not supported (0: synchronous, 1: one-step-stale)")]
    OverlapSteps {
        /// The value given.
        given: usize,
    },
    /// A local clip norm that is not positive and finite.
    #[error("local clip norm {value} must be positive and finite")]
    LocalClip {
        /// The value given.
        value: f64,
    },
    /// The training set, split over the ranks, gives no rank a full batch.
    #[error("{samples} training samples over {ranks} ranks give no full batch of {batch}")]
    NoFullBatch {
        /// Training samples in all.
        samples: usize,
        /// Ranks sharing them.
        ranks: usize,
        /// The batch size per rank.
        batch: usize,
    },
    /// A checkpoint asked of a run with overlapping steps.
    #[error("checkpoints need synchronous steps (overlap_steps = 0)")]
    CheckpointNeedsSynchronous,
    /// Elastic training asked of a run with overlapping steps.
    #[error("elastic training needs synchronous steps (overlap_steps = 0)")]
    ElasticNeedsSynchronous,
    /// A training step on a batch of no samples.
    #[error("empty training batch")]
    EmptyBatch,
    /// A training split of no samples.
    #[error("the training split is empty")]
    EmptySplit,
    /// A Sandblaster batch or unit size of 0.
    #[error("the Sandblaster batch and unit size must be at least 1")]
    SandblasterSize,
    /// A validation fraction outside `[0, 1)`.
    #[error("validation fraction {value} is not in [0, 1)")]
    ValFraction {
        /// The value given.
        value: f64,
    },
    /// A data set name not known.
    #[error("unknown data set {spec:?} (expected fashion-mnist|mnist|shakespeare|cifar10)")]
    UnknownDataSet {
        /// The name given.
        spec: String,
    },
    /// `sync` called while a `start_sync` is in flight.
    #[error("sync while a start_sync is still in flight")]
    SyncInFlight,
    /// `start_sync` called while the previous averaging is in flight.
    #[error("start_sync while the previous averaging is still in flight")]
    StartSyncInFlight,
    /// `finish_sync` called with no `start_sync` before it.
    #[error("finish_sync without start_sync")]
    FinishWithoutStart,
    /// A checkpoint asked for while a gradient averaging is in flight.
    #[error("checkpoint while a gradient averaging is in flight")]
    CheckpointInFlight,
    /// A local optimizer step asked of the parameter-server sync.
    #[error("the parameter server applies the update itself: the trainer calls server_step")]
    ServerStep,
    /// A parameter-server sync with no shard.
    #[error("no parameter-server shard given")]
    NoShards,
    /// Downpour's `n_fetch`/`n_push` with a synchronous table.
    #[error("n_fetch and n_push are Downpour's: they need an async or ssp table")]
    DownpourNeedsAsync,
    /// An optimizer the parameter-server shards cannot run.
    #[error(
        "the parameter server cannot run optimizer {optimizer}: {what} (the shards apply a \
         constant learning rate with sgd, momentum, adagrad or adam and nothing else)"
    )]
    PsOptimizer {
        /// The optimizer, as its spec reads.
        optimizer: String,
        /// What of it the shards cannot do.
        what: &'static str,
    },
    /// `step_part` under global-norm clipping.
    #[error("gradient clipping needs the whole gradient: use step()")]
    ClipNeedsWholeGradient,
    /// An invalid optimizer setting or spec.
    #[error(transparent)]
    Optimizer(#[from] OptimizerError),
    /// An invalid model spec, or a model that does not fit its data.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// An invalid split of a model over ranks.
    #[error(transparent)]
    Partition(#[from] PartitionError),
}

/// An invalid optimizer setting, or an optimizer spec that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OptimizerError {
    /// A learning rate that is not positive.
    #[error("learning rate {lr} must be positive")]
    LearningRate {
        /// The value given.
        lr: f64,
    },
    /// A negative weight decay.
    #[error("weight decay {value} must be >= 0")]
    WeightDecay {
        /// The value given.
        value: f64,
    },
    /// A clip norm that is not positive.
    #[error("clip norm {value} must be positive")]
    ClipNorm {
        /// The value given.
        value: f64,
    },
    /// A momentum outside `[0, 1)`.
    #[error("momentum {value} must be in [0, 1)")]
    Momentum {
        /// The value given.
        value: f64,
    },
    /// A dampening outside `[0, 1]`.
    #[error("dampening {value} must be in [0, 1]")]
    Dampening {
        /// The value given.
        value: f64,
    },
    /// Nesterov without momentum, or with dampening.
    #[error("nesterov needs momentum > 0 and dampening 0")]
    Nesterov,
    /// Adam betas outside `[0, 1)`.
    #[error("betas ({beta1}, {beta2}) must be in [0, 1)")]
    Betas {
        /// The first beta given.
        beta1: f64,
        /// The second beta given.
        beta2: f64,
    },
    /// An epsilon that is not positive.
    #[error("eps {value} must be positive")]
    Eps {
        /// The value given.
        value: f64,
    },
    /// A negative Adagrad initial accumulator.
    #[error("initial accumulator {value} must be >= 0")]
    InitialAccumulator {
        /// The value given.
        value: f64,
    },
    /// A step decay with `every` 0 or `gamma` outside `(0, 1]`.
    #[error("step decay needs every > 0 and gamma in (0, 1], got {every}, {gamma}")]
    StepDecay {
        /// Steps between decays.
        every: u64,
        /// The factor.
        gamma: f64,
    },
    /// A cosine floor outside `[0, lr]`.
    #[error("cosine min_lr {min_lr} must be in [0, lr]")]
    CosineMinLr {
        /// The value given.
        min_lr: f64,
    },
    /// An optimizer name not known.
    #[error("unknown optimizer {name:?} (expected sgd|nesterov|adam|adamw|adagrad)")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A value that should be a number.
    #[error("{key}={value}: not a number")]
    NotANumber {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A value that should be a whole number.
    #[error("{key}={value}: not a whole number")]
    NotAWholeNumber {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A value that should be a boolean.
    #[error("{key}={value}: not a boolean")]
    NotABoolean {
        /// The key.
        key: String,
        /// Its value.
        value: String,
    },
    /// A key the optimizer does not take.
    #[error("optimizer {optimizer}: unknown key {key:?}")]
    UnknownKey {
        /// The optimizer's name, as given.
        optimizer: String,
        /// The key.
        key: String,
    },
    /// `decay=step` without `every=N`.
    #[error("decay=step needs every=N")]
    StepDecayNeedsEvery,
    /// A decay name not known.
    #[error("unknown decay {name:?} (expected constant|step|cosine)")]
    UnknownDecay {
        /// The name given.
        name: String,
    },
}

/// An invalid model spec, or a model that does not fit its data or batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Hidden widths that [`MlpHidden::new`](crate::MlpHidden::new) refuses.
    #[error(transparent)]
    Hidden(#[from] HiddenError),
    /// Hidden sizes that do not parse.
    #[error("bad hidden sizes {spec:?}: {why} (expected e.g. 2048x3, 1024-512 or 512,256)")]
    HiddenSizes {
        /// The sizes as given.
        spec: String,
        /// What is wrong.
        why: HiddenSizesError,
    },
    /// A model built for data of another kind.
    #[error("model {model} does not fit {data} data")]
    DataMismatch {
        /// The model's name.
        model: &'static str,
        /// The kind of data ("image", "text").
        data: &'static str,
    },
    /// A wide MLP past [`MAX_PARAMS`] parameters.
    #[error("model {model} would have {params} parameters (at most {MAX_PARAMS})")]
    TooManyParams {
        /// The model.
        model: ModelKind,
        /// Its parameter count.
        params: usize,
    },
    /// Options given to a model that takes none.
    #[error(
        "model {spec:?}: only mlp and lstm take options (mlp:hidden=2048x3, mlp:wide, \
         lstm:hidden=128)"
    )]
    NoOptions {
        /// The spec as given.
        spec: String,
    },
    /// An MLP option not known.
    #[error(
        "model {spec:?}: unknown mlp option {option:?} (expected hidden=WIDTHS, e.g. \
         mlp:hidden=2048x3, or wide)"
    )]
    UnknownMlpOption {
        /// The spec as given.
        spec: String,
        /// The option.
        option: String,
    },
    /// An LSTM option that is wrong.
    #[error("model {spec:?}: {why}")]
    LstmOption {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        why: LstmOptionError,
    },
    /// A model name not known.
    #[error(
        "unknown model {spec:?} (expected mlp|lenet|resnet|lstm|mlp:hidden=2048x3|lstm:hidden=128)"
    )]
    Unknown {
        /// The spec as given.
        spec: String,
    },
    /// LeNet on images smaller than 12x12.
    #[error("LeNet needs images of at least 12x12, got {h}x{w}")]
    LeNetImages {
        /// Image height.
        h: usize,
        /// Image width.
        w: usize,
    },
    /// The hand-written LeNet on images smaller than 12x12, or with no class.
    #[error(
        "LeNet needs images of at least 12x12 and a class, got {c}x{h}x{w}, {classes} classes"
    )]
    LeNetShape {
        /// Image channels.
        c: usize,
        /// Image height.
        h: usize,
        /// Image width.
        w: usize,
        /// Classes.
        classes: usize,
    },
    /// The hand-written LeNet's layout differs from the burn model's.
    #[error("hand-written LeNet layout {ours:?} differs from the model's {theirs:?}")]
    LeNetLayout {
        /// The hand-written layout (tensor lengths).
        ours: Vec<usize>,
        /// The model's.
        theirs: Vec<usize>,
    },
    /// A batch of images of another shape than the LeNet was built for.
    #[error("LeNet built for {c}x{h}x{w} images got a batch of {got:?}")]
    LeNetBatch {
        /// Channels built for.
        c: usize,
        /// Height built for.
        h: usize,
        /// Width built for.
        w: usize,
        /// The batch's image shape.
        got: [usize; 3],
    },
    /// A batch of images of another size than the model takes.
    #[error("model {model} takes {inputs} values per image, got images of {got:?}")]
    ImageSize {
        /// The model.
        model: ModelKind,
        /// Values per image it takes.
        inputs: usize,
        /// The batch's image shape.
        got: [usize; 3],
    },
    /// A label past the model's classes.
    #[error("label {label} out of range for {classes} classes")]
    Label {
        /// The label.
        label: u8,
        /// The model's classes.
        classes: usize,
    },
}

/// Hidden widths [`MlpHidden::new`](crate::MlpHidden::new) refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HiddenError {
    /// Too few or too many hidden layers.
    #[error("an MLP needs 1 to {MAX_HIDDEN_LAYERS} hidden layers, got {got}")]
    Layers {
        /// The number given.
        got: usize,
    },
    /// A width of 0 or past [`MAX_HIDDEN_WIDTH`].
    #[error("hidden width {width} is out of range (1 to {MAX_HIDDEN_WIDTH})")]
    Width {
        /// The width given.
        width: usize,
    },
}

/// Why hidden sizes (`2048x3`, `1024-512`) do not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HiddenSizesError {
    /// An item whose width is not a number.
    #[error("{0:?} is not a width")]
    Width(String),
    /// An item whose count is not a number.
    #[error("{0:?} is not a layer count")]
    Count(String),
    /// A count of 0, or more layers than [`MAX_HIDDEN_LAYERS`] in all.
    #[error("1 to {MAX_HIDDEN_LAYERS} hidden layers in all")]
    Layers,
    /// Widths that parse but are refused.
    #[error(transparent)]
    Invalid(#[from] HiddenError),
}

/// Why the options of `lstm:OPTS` are refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LstmOptionError {
    /// Options that are not `key=value`.
    #[error("unknown lstm option {0:?} (expected hidden=N, e.g. lstm:hidden=128)")]
    Option(String),
    /// A key other than `hidden`.
    #[error("unknown lstm option {0:?} (expected hidden=N)")]
    Key(String),
    /// A hidden size that is not a number.
    #[error("hidden size {0:?} is not a number")]
    NotANumber(String),
    /// A hidden size outside 8 to [`MAX_LSTM_HIDDEN`].
    #[error("hidden size {0} is out of range (8 to {MAX_LSTM_HIDDEN})")]
    Range(u32),
}

/// An invalid split of a model over ranks (`model::partition`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PartitionError {
    /// A split into no partitions.
    #[error("a model needs at least one partition")]
    NoPartitions,
    /// A partition index past the split's partitions.
    #[error("partition {index} of {partitions}")]
    Index {
        /// The index given.
        index: usize,
        /// The split's partitions.
        partitions: usize,
    },
    /// A partition index past a plan's partitions.
    #[error("partition {index} of a plan of {partitions} partitions")]
    PlanIndex {
        /// The index given.
        index: usize,
        /// The plan's partitions.
        partitions: usize,
    },
    /// A whole element no partition holds.
    #[error("the plan holds no partition's copy of whole element {element}")]
    NoCopy {
        /// The element.
        element: usize,
    },
    /// A model that is not an image model.
    #[error("model {model} cannot be split: only image models (mlp, lenet) can")]
    NotImage {
        /// The model.
        model: ModelKind,
    },
    /// An image model other than an MLP or LeNet.
    #[error("model {model} cannot be split: only mlp (any widths) and lenet can")]
    NotSplittable {
        /// The model.
        model: ModelKind,
    },
    /// A model whose tensors are not weight/bias pairs.
    #[error("model {model}: expected weight/bias pairs, got {tensors} tensors")]
    NotPairs {
        /// The model.
        model: ModelKind,
        /// Its tensor count.
        tensors: usize,
    },
    /// A tensor of a shape no layer has.
    #[error("model {model}: cannot split tensor {tensor} of shape {shape:?}")]
    TensorShape {
        /// The model.
        model: ModelKind,
        /// The tensor's name.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A layer whose tensors have other lengths than it needs.
    #[error("model {model}: layer {layer} does not match its tensors")]
    LayerTensors {
        /// The model.
        model: ModelKind,
        /// The layer's name.
        layer: String,
    },
    /// A layer that reads another width than the one before writes.
    #[error(
        "model {model}: layer {layer} reads {reads} values per sample, the one before writes \
         {writes}"
    )]
    LayerWidths {
        /// The model.
        model: ModelKind,
        /// The layer's name.
        layer: String,
        /// Values per sample it reads.
        reads: usize,
        /// Values per sample the layer before writes.
        writes: usize,
    },
    /// A last layer that writes another width than the classes.
    #[error("model {model}: the last layer writes {writes} values, not {classes} classes")]
    Classes {
        /// The model.
        model: ModelKind,
        /// Values per sample the last layer writes.
        writes: usize,
        /// The classes.
        classes: usize,
    },
    /// A transport of another rank or world size than the partition's.
    #[error("partition {index} of {partitions} was given a transport of rank {rank} in a world of {world}")]
    Transport {
        /// The partition's index.
        index: usize,
        /// The partitions.
        partitions: usize,
        /// The transport's rank.
        rank: usize,
        /// The transport's world size.
        world: usize,
    },
    /// A pipeline of more partitions than the model has layers (or of none).
    #[error(
        "model {model} has {} layers ({}): a pipeline of {partitions} partitions needs 1 to {}",
        .layers.len(),
        .layers.join(", "),
        .layers.len()
    )]
    PipelineDepth {
        /// The model.
        model: ModelKind,
        /// Its layers' names.
        layers: Vec<String>,
        /// The partitions asked for.
        partitions: usize,
    },
    /// A pipeline of too few or too many micro-batches.
    #[error("a pipeline needs 1 to {MAX_MICRO_BATCHES} micro-batches, got {given}")]
    MicroBatches {
        /// The count given.
        given: usize,
    },
    /// A split spec not known.
    #[error("unknown split {spec:?} (expected tensor, pipeline or pipeline:micro_batches=N)")]
    UnknownSplit {
        /// The spec as given.
        spec: String,
    },
    /// A micro-batch count that is not a number.
    #[error("split {spec:?}: {value:?} is not a count")]
    SplitCount {
        /// The spec as given.
        spec: String,
        /// The count as given.
        value: String,
    },
    /// A layer the tensor split cannot take (not fully connected).
    #[error(
        "model {model}: layer {layer} is not fully connected; the tensor split takes MLPs only \
         (use the pipeline split)"
    )]
    NotLinear {
        /// The model.
        model: ModelKind,
        /// The layer's name.
        layer: String,
    },
    /// A layer with fewer units (or inputs) than partitions.
    #[error(
        "model {model}: layer {layer} has {count} {what} to split over {partitions} partitions"
    )]
    TooNarrow {
        /// The model.
        model: ModelKind,
        /// The layer's name.
        layer: String,
        /// Its units (or inputs).
        count: usize,
        /// "units" or "inputs".
        what: &'static str,
        /// The partitions.
        partitions: usize,
    },
}
