//! CIFAR-10 binary format: records of 1 label byte then 3072 pixel bytes (the 1024 red,
//! then green, then blue values of a 32x32 image, row-major). Files `data_batch_1.bin` to
//! `data_batch_5.bin` and `test_batch.bin` under `cifar-10-batches-bin/`. No copy of
//! CIFAR-10 is reachable from the package registries; point the loader at your own.

use std::path::Path;

use super::image::ImageSet;
use crate::error::{Error, Result};

const SIDE: usize = 32;
const RECORD: usize = 1 + 3 * SIDE * SIDE;

fn malformed(path: &Path, what: impl Into<String>) -> Error {
    Error::Malformed {
        format: "CIFAR-10",
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Parses the bytes of one CIFAR-10 batch file; `path` only names the source in errors.
pub fn parse_cifar(bytes: &[u8], path: &Path) -> Result<ImageSet> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(RECORD) {
        return Err(malformed(
            path,
            format!(
                "{} bytes is not a positive multiple of the {RECORD}-byte record",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / RECORD;
    let mut labels = Vec::with_capacity(n);
    let mut pixels = Vec::with_capacity(n * (RECORD - 1));
    for rec in bytes.chunks_exact(RECORD) {
        labels.push(rec[0]);
        pixels.extend_from_slice(&rec[1..]);
    }
    ImageSet::new(pixels, labels, [3, SIDE, SIDE], 10).map_err(|w| malformed(path, w.to_string()))
}

/// Reads one CIFAR-10 batch file.
pub fn read_cifar(path: &Path) -> Result<ImageSet> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::MissingCifar {
            path: path.to_path_buf(),
        },
        _ => Error::io(path)(e),
    })?;
    parse_cifar(&bytes, path)
}

/// Loads a `cifar-10-batches-bin` folder: the five training batches and the test batch.
/// Returns `(train, test)`, the test set normalized with the training statistics.
pub fn load_cifar10(dir: &Path) -> Result<(ImageSet, ImageSet)> {
    let mut train = read_cifar(&dir.join("data_batch_1.bin"))?;
    for i in 2..=5 {
        let p = dir.join(format!("data_batch_{i}.bin"));
        let part = read_cifar(&p)?;
        train
            .extend(&part)
            .map_err(|w| malformed(&p, w.to_string()))?;
    }
    let mut test = read_cifar(&dir.join("test_batch.bin"))?;
    test.set_normalization(train.normalization());
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(label: u8, fill: [u8; 3]) -> Vec<u8> {
        let mut r = vec![label];
        for v in fill {
            r.extend(std::iter::repeat_n(v, SIDE * SIDE));
        }
        r
    }

    #[test]
    fn reads_a_written_folder() {
        let dir = std::env::temp_dir().join(format!("gw-cifar-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for i in 1..=5u8 {
            let mut f = record(i, [i, 0, 255]);
            f.extend(record(9, [0, i, 255]));
            std::fs::write(dir.join(format!("data_batch_{i}.bin")), f).unwrap();
        }
        std::fs::write(dir.join("test_batch.bin"), record(3, [10, 20, 255])).unwrap();
        let (train, test) = load_cifar10(&dir).unwrap();
        assert_eq!((train.len(), test.len()), (10, 1));
        assert_eq!(train.shape(), [3, 32, 32]);
        assert_eq!(&train.labels()[..4], &[1, 9, 2, 9]);
        let raw = train.raw(2);
        assert_eq!((raw[0], raw[1024], raw[2048]), (2, 0, 255));
        assert_eq!(test.normalization(), train.normalization());
        // Blue is constant: its std falls back to 1, so it normalizes to 1 - mean = 0.
        let b = test.batch(&[0]);
        assert_eq!(b.pixels[2048], 0.0);
        std::fs::write(dir.join("test_batch.bin"), vec![0u8; RECORD - 1]).unwrap();
        assert!(load_cifar10(&dir).is_err());
        std::fs::write(dir.join("test_batch.bin"), record(10, [0, 0, 0])).unwrap();
        assert!(load_cifar10(&dir).is_err());
        std::fs::remove_file(dir.join("data_batch_4.bin")).unwrap();
        let e = load_cifar10(&dir).unwrap_err().to_string();
        assert!(e.contains("not in any package registry"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
