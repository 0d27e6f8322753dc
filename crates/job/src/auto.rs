//! `--codec auto` in a job: the `--codec` value ([`CodecArg`]), the default candidates of
//! the job's optimizer, and the model's gradient tensors that [`gradwire_sim::auto`]'s
//! policy chooses for (its module doc says how the choice is made and what it costs).

use gradwire_codec::CodecConfig;
use gradwire_engine::TensorSpec;
use gradwire_train::data::{DataShape, DatasetKind};
use gradwire_train::optim::{OptimizerConfig, OptimizerKind};
use gradwire_train::ModelKind;

pub use gradwire_sim::auto::{Calibration, Choice};

/// `--codec`: a codec spec, or `auto`.
#[derive(Debug, Clone, PartialEq)]
pub enum CodecArg {
    /// Choose per tensor (`gradwire_sim::auto::choose`).
    Auto,
    /// This codec for every tensor no rule matches.
    Codec(CodecConfig),
}

impl std::str::FromStr for CodecArg {
    type Err = gradwire_codec::ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("auto") {
            Ok(CodecArg::Auto)
        } else {
            s.parse().map(CodecArg::Codec)
        }
    }
}

/// Where `--codec auto` gets this machine's costs: the front end's cached calibration
/// (`gradwire_train::measure::cached`), or a fixed one in tests. Called only with
/// `--codec auto`.
pub type CalibrationSource<'a> =
    &'a dyn Fn() -> Result<Calibration, gradwire_train::measure::CalibrateError>;

/// The default candidates for a job under `optimizer`
/// ([`gradwire_sim::auto::default_candidates`]): whether it applies momentum after
/// aggregation (SGD with momentum, Adam) or not (AdaGrad, plain SGD).
/// (`--momentum-correction on`, under which the codecs would compress the velocity, is
/// refused with `--codec auto`.)
pub fn default_candidates(optimizer: &OptimizerConfig) -> &'static str {
    let momentum = match optimizer.kind {
        OptimizerKind::Adagrad { .. } => false,
        OptimizerKind::Sgd { momentum, .. } => momentum != 0.0,
        OptimizerKind::Adam { .. } => true,
    };
    gradwire_sim::auto::default_candidates(momentum)
}

/// Why the model's tensors cannot be listed for `--codec auto`.
#[derive(Debug, thiserror::Error)]
pub enum TensorsError {
    /// A text data set (the model's shape needs the text's vocabulary).
    #[error("--codec auto needs an image data set to know the model's tensors; {0} is text")]
    Text(String),
    /// The model does not build.
    #[error("building {model} to list its tensors: {source}")]
    Build {
        /// The model.
        model: ModelKind,
        /// Why.
        source: gradwire_train::Error,
    },
}

/// The gradient tensors of `model` on `dataset` (names, shapes, roles), as the engine will
/// see them; image data sets only.
pub fn model_tensors(
    model: ModelKind,
    dataset: DatasetKind,
) -> Result<Vec<TensorSpec>, TensorsError> {
    let shape = match dataset {
        DatasetKind::FashionMnist | DatasetKind::Mnist => [1, 28, 28],
        DatasetKind::Cifar10 => [3, 32, 32],
        other => return Err(TensorsError::Text(other.name().to_string())),
    };
    let built = model
        .build(DataShape::Image { shape, classes: 10 }, 0)
        .map_err(|source| TensorsError::Build { model, source })?;
    Ok(built
        .tensors()
        .into_iter()
        .map(|t| TensorSpec::new(t.name, t.shape).with_role(t.role))
        .collect())
}

#[cfg(test)]
mod tests {
    use gradwire_sim::auto::{DEFAULT_CANDIDATES, DEFAULT_CANDIDATES_NO_MOMENTUM};

    use super::*;

    #[test]
    fn the_optimizer_decides_whether_one_bit_sgd_is_a_default_candidate() {
        let opt = |spec: &str| spec.parse::<OptimizerConfig>().expect("an optimizer");
        for (spec, want) in [
            ("sgd:lr=0.05,momentum=0.9", DEFAULT_CANDIDATES),
            ("sgd:lr=0.05,momentum=0.9,nesterov", DEFAULT_CANDIDATES),
            ("adam:lr=0.001", DEFAULT_CANDIDATES),
            ("adagrad:lr=0.01", DEFAULT_CANDIDATES_NO_MOMENTUM),
            ("sgd:lr=0.05", DEFAULT_CANDIDATES_NO_MOMENTUM),
        ] {
            assert_eq!(default_candidates(&opt(spec)), want, "{spec}");
        }
    }

    #[test]
    fn codec_values_are_a_spec_or_auto() {
        assert!(matches!(" Auto ".parse::<CodecArg>(), Ok(CodecArg::Auto)));
        assert!(matches!("fp16".parse::<CodecArg>(), Ok(CodecArg::Codec(_))));
        assert!("zip".parse::<CodecArg>().is_err());
    }
}
