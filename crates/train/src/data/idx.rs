//! IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.
//!
//! Layout: two zero bytes, a type byte (`0x08` = unsigned byte, the only type read here),
//! the number of dimensions `d`, then `d` big-endian `u32` sizes, then the data in row-major
//! order. The header is untrusted: sizes are checked with overflow checks and against the
//! bytes actually present, and nothing is allocated from a declared size beyond a cap.

use std::io::Read;
use std::path::Path;

use super::image::ImageSet;
use crate::error::{Error, Result};

/// Largest payload accepted (1 GiB): far above any IDX file in use, far below an allocation
/// that could hurt.
pub const MAX_IDX_BYTES: usize = 1 << 30;

/// A decoded IDX array of unsigned bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idx {
    /// Sizes of the dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Row-major data, `dims.iter().product()` bytes.
    pub data: Vec<u8>,
}

fn malformed(path: &Path, what: impl Into<String>) -> Error {
    Error::Malformed {
        format: "IDX",
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Reads an IDX file, gunzipping it when it starts with the gzip magic.
pub fn read_idx(path: &Path) -> Result<Idx> {
    let file = std::fs::File::open(path).map_err(|e| Error::reading_data(path, e))?;
    let mut reader = std::io::BufReader::new(file);
    let mut magic = [0u8; 2];
    let peeked = {
        use std::io::BufRead;
        let buf = reader.fill_buf().map_err(Error::io(path))?;
        let n = buf.len().min(2);
        magic[..n].copy_from_slice(&buf[..n]);
        n
    };
    if peeked == 2 && magic == [0x1f, 0x8b] {
        parse_idx(flate2::read::GzDecoder::new(reader), path)
    } else {
        parse_idx(reader, path)
    }
}

/// Parses an IDX stream (already decompressed); `path` only names the source in errors.
pub fn parse_idx<R: Read>(mut reader: R, path: &Path) -> Result<Idx> {
    let mut head = [0u8; 4];
    read_exact_or(
        &mut reader,
        &mut head,
        path,
        "file shorter than the 4-byte magic",
    )?;
    if head[0] != 0 || head[1] != 0 {
        return Err(malformed(
            path,
            format!("bad magic {:02x}{:02x}, expected 0000", head[0], head[1]),
        ));
    }
    if head[2] != 0x08 {
        return Err(malformed(
            path,
            format!(
                "element type {:#04x} unsupported (only 0x08, unsigned byte)",
                head[2]
            ),
        ));
    }
    let ndims = usize::from(head[3]);
    if ndims == 0 || ndims > 4 {
        return Err(malformed(
            path,
            format!("{ndims} dimensions (expected 1 to 4)"),
        ));
    }
    let mut dims = Vec::with_capacity(ndims);
    for i in 0..ndims {
        let mut b = [0u8; 4];
        read_exact_or(
            &mut reader,
            &mut b,
            path,
            "header ends inside the dimension sizes",
        )?;
        let d = u32::from_be_bytes(b) as usize;
        if d == 0 {
            return Err(malformed(path, format!("dimension {i} has size 0")));
        }
        dims.push(d);
    }
    let expected = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_IDX_BYTES)
        .ok_or_else(|| {
            malformed(
                path,
                format!("dimensions {dims:?} declare more than {MAX_IDX_BYTES} bytes"),
            )
        })?;
    // Grow with the data actually present; never trust `expected` for a big reservation.
    let mut data = Vec::with_capacity(expected.min(1 << 26));
    reader
        .take(expected as u64 + 1)
        .read_to_end(&mut data)
        .map_err(Error::io(path))?;
    if data.len() != expected {
        let got = if data.len() > expected {
            "more".to_string()
        } else {
            data.len().to_string()
        };
        return Err(malformed(
            path,
            format!("dimensions {dims:?} declare {expected} data bytes, the file holds {got}"),
        ));
    }
    Ok(Idx { dims, data })
}

fn read_exact_or<R: Read>(r: &mut R, buf: &mut [u8], path: &Path, what: &str) -> Result<()> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => malformed(path, what),
        _ => Error::io(path)(e),
    })
}

/// Loads an image/label IDX pair (e.g. `train-images-idx3-ubyte.gz` and
/// `train-labels-idx1-ubyte.gz`) into a one-channel [`ImageSet`] with `classes` classes.
pub fn load_idx_images(images: &Path, labels: &Path, classes: usize) -> Result<ImageSet> {
    let img = read_idx(images)?;
    let lab = read_idx(labels)?;
    if img.dims.len() != 3 {
        return Err(malformed(
            images,
            format!("image file has {} dimensions, expected 3", img.dims.len()),
        ));
    }
    if lab.dims.len() != 1 {
        return Err(malformed(
            labels,
            format!("label file has {} dimensions, expected 1", lab.dims.len()),
        ));
    }
    if img.dims[0] != lab.dims[0] {
        return Err(malformed(
            labels,
            format!("{} labels for {} images", lab.dims[0], img.dims[0]),
        ));
    }
    ImageSet::new(img.data, lab.data, [1, img.dims[1], img.dims[2]], classes)
        .map_err(|what| malformed(labels, what.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Encodes an IDX u8 array (test helper, also used by other tests of this crate).
    pub(crate) fn encode(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut v = vec![0, 0, 0x08, dims.len() as u8];
        for d in dims {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v.extend_from_slice(data);
        v
    }

    pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn p() -> &'static Path {
        Path::new("<test>")
    }

    #[test]
    fn parses_a_valid_array() {
        let bytes = encode(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let idx = parse_idx(&bytes[..], p()).unwrap();
        assert_eq!(idx.dims, vec![2, 3]);
        assert_eq!(idx.data, vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn rejects_malformed_headers() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "shorter"),
            (vec![0, 0, 8], "shorter"),
            (vec![1, 0, 8, 1, 0, 0, 0, 1, 7], "magic"),
            (
                encode(&[1], &[7])
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| if i == 2 { 0x0d } else { b })
                    .collect(),
                "element type",
            ),
            (vec![0, 0, 8, 0], "0 dimensions"),
            (vec![0, 0, 8, 9], "9 dimensions"),
            (vec![0, 0, 8, 2, 0, 0, 0, 1], "dimension sizes"),
            (encode(&[0], &[]), "size 0"),
            (encode(&[3], &[1, 2]), "holds 2"),
            (encode(&[2], &[1, 2, 3]), "holds more"),
            // 4 x 2^32-1: overflows the cap without allocating anything.
            (
                encode(&[u32::MAX, u32::MAX, u32::MAX, u32::MAX], &[1]),
                "declare more than",
            ),
            (encode(&[60000, 28, 28], &[0; 10]), "holds 10"),
        ];
        for (bytes, want) in cases {
            let err = parse_idx(&bytes[..], p()).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
    }

    #[test]
    fn reads_gzip_and_plain_files_and_pairs() {
        let dir = std::env::temp_dir().join(format!("gw-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let images: Vec<u8> = (0..3 * 4 * 4).map(|i| i as u8).collect();
        let img = dir.join("img.gz");
        let lab = dir.join("lab");
        std::fs::write(&img, gzip(&encode(&[3, 4, 4], &images))).unwrap();
        std::fs::write(&lab, encode(&[3], &[2, 0, 9])).unwrap();
        let set = load_idx_images(&img, &lab, 10).unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.shape(), [1, 4, 4]);
        assert_eq!(set.labels(), &[2, 0, 9]);
        // Mismatched counts and out-of-range labels are errors.
        std::fs::write(&lab, encode(&[2], &[2, 0])).unwrap();
        assert!(load_idx_images(&img, &lab, 10).is_err());
        std::fs::write(&lab, encode(&[3], &[2, 0, 10])).unwrap();
        assert!(load_idx_images(&img, &lab, 10).is_err());
        // A corrupt gzip stream is an error, not a panic.
        std::fs::write(&img, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
        assert!(read_idx(&img).is_err());
        let missing = read_idx(&dir.join("nope.gz")).unwrap_err().to_string();
        assert!(missing.contains("scripts/fetch-data.sh"), "{missing}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
