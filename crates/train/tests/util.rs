//! Helpers shared by the integration tests.

use gradwire_train::data::{Batch, DataShape, Dataset, DatasetKind, ImageBatch, TextBatch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A random image batch of `n` images of `shape` with labels below `classes`.
pub fn image_batch(n: usize, shape: [usize; 3], classes: usize, seed: u64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let px = shape.iter().product::<usize>() * n;
    Batch::Images(ImageBatch {
        pixels: (0..px).map(|_| rng.gen_range(-1.0..1.0)).collect(),
        labels: (0..n).map(|_| rng.gen_range(0..classes as u8)).collect(),
        shape,
    })
}

/// A random text batch of `n` sequences of `seq_len` ids below `vocab`.
pub fn text_batch(n: usize, seq_len: usize, vocab: u32, seed: u64) -> Batch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let ids: Vec<u32> = (0..n * (seq_len + 1))
        .map(|_| rng.gen_range(0..vocab))
        .collect();
    let (mut inputs, mut targets) = (vec![], vec![]);
    for s in ids.chunks_exact(seq_len + 1) {
        inputs.extend_from_slice(&s[..seq_len]);
        targets.extend_from_slice(&s[1..]);
    }
    Batch::Text(TextBatch {
        inputs,
        targets,
        seq_len,
    })
}

/// Fashion-MNIST's shape.
pub const FMNIST: DataShape = DataShape::Image {
    shape: [1, 28, 28],
    classes: 10,
};

/// Where the tests look for the fetched data sets: `$GRADWIRE_DATA`, else `data/` at the
/// workspace root (tests run from the crate's folder).
pub fn data_dir() -> std::path::PathBuf {
    std::env::var_os("GRADWIRE_DATA").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data"),
        Into::into,
    )
}

/// Loads a real data set, or prints why the test is skipped and returns `None`. With
/// `GRADWIRE_REQUIRE_DATA=1` (as CI sets) a missing data set fails the test instead.
pub fn real_data(kind: DatasetKind, seq_len: usize) -> Option<Dataset> {
    match kind.load(&data_dir(), seq_len) {
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("GRADWIRE_REQUIRE_DATA").is_ok_and(|v| v == "1") {
                panic!("{kind} data required (GRADWIRE_REQUIRE_DATA=1) but not available: {e}");
            }
            eprintln!("SKIPPED: {kind} data not available ({e}); run scripts/fetch-data.sh");
            None
        }
    }
}
