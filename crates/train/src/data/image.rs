//! An in-memory image classification set: `u8` pixels, `u8` labels, normalized to `f32`
//! per channel when a batch is taken.

use super::batch::ImageBatch;

/// Images of one shape `[channels, height, width]` (row-major, channel-planar) with labels.
///
/// Pixels stay `u8` in memory (60,000 Fashion-MNIST images take 47 MB, not 188 MB); a batch
/// converts them to `f32` as `(p / 255 - mean[c]) / std[c]` through a per-channel table.
#[derive(Debug, Clone)]
pub struct ImageSet {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    shape: [usize; 3],
    classes: usize,
    /// Per channel: 256 normalized values, one per pixel byte.
    table: Vec<[f32; 256]>,
    norm: Vec<(f32, f32)>,
}

/// Why pixels and labels do not make an [`ImageSet`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageSetError {
    /// An image shape with a zero dimension.
    #[error("image shape {0:?} is empty")]
    EmptyShape([usize; 3]),
    /// The pixel bytes are not the labels' count of images of the shape.
    #[error("{bytes} pixel bytes for {images} images of {shape:?}")]
    PixelCount {
        /// Pixel bytes given.
        bytes: usize,
        /// Images (labels) given.
        images: usize,
        /// One image's shape.
        shape: [usize; 3],
    },
    /// A label at or above the class count.
    #[error("label {label} of image {image} is not below {classes} classes")]
    Label {
        /// The label.
        label: u8,
        /// Its image's index.
        image: usize,
        /// The class count.
        classes: usize,
    },
    /// Images of another shape or class count appended.
    #[error("cannot join images of {shape:?} ({classes} classes) to {into_shape:?} ({into_classes} classes)")]
    Join {
        /// The appended set's image shape.
        shape: [usize; 3],
        /// The appended set's classes.
        classes: usize,
        /// This set's image shape.
        into_shape: [usize; 3],
        /// This set's classes.
        into_classes: usize,
    },
}

impl ImageSet {
    /// Builds a set, checking that `pixels` holds `labels.len()` images of `shape` and that
    /// every label is below `classes`. Normalization statistics come from these pixels.
    pub fn new(
        pixels: Vec<u8>,
        labels: Vec<u8>,
        shape: [usize; 3],
        classes: usize,
    ) -> std::result::Result<Self, ImageSetError> {
        let per = shape.iter().product::<usize>();
        if per == 0 {
            return Err(ImageSetError::EmptyShape(shape));
        }
        if pixels.len() != labels.len() * per {
            return Err(ImageSetError::PixelCount {
                bytes: pixels.len(),
                images: labels.len(),
                shape,
            });
        }
        if let Some((i, l)) = labels
            .iter()
            .enumerate()
            .find(|(_, &l)| usize::from(l) >= classes)
        {
            return Err(ImageSetError::Label {
                label: *l,
                image: i,
                classes,
            });
        }
        let mut set = ImageSet {
            pixels,
            labels,
            shape,
            classes,
            table: Vec::new(),
            norm: Vec::new(),
        };
        let norm = set.channel_stats();
        set.set_normalization(&norm);
        Ok(set)
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when the set holds no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// `[channels, height, width]`.
    pub fn shape(&self) -> [usize; 3] {
        self.shape
    }

    /// Number of classes.
    pub fn classes(&self) -> usize {
        self.classes
    }

    /// All labels, in image order.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// The raw pixels of image `i` (`channels * height * width` bytes).
    pub fn raw(&self, i: usize) -> &[u8] {
        let per = self.shape.iter().product::<usize>();
        &self.pixels[i * per..(i + 1) * per]
    }

    /// Per-channel `(mean, std)` of the pixels scaled to `0..=1`.
    pub fn channel_stats(&self) -> Vec<(f32, f32)> {
        let [c, h, w] = self.shape;
        let plane = h * w;
        let mut hist = vec![[0u64; 256]; c];
        for img in self.pixels.chunks_exact(c * plane) {
            for (ch, px) in img.chunks_exact(plane).enumerate() {
                for &p in px {
                    hist[ch][usize::from(p)] += 1;
                }
            }
        }
        hist.iter()
            .map(|h| {
                let n: u64 = h.iter().sum();
                if n == 0 {
                    return (0.0, 1.0);
                }
                let (mut s, mut s2) = (0.0f64, 0.0f64);
                for (v, &k) in h.iter().enumerate() {
                    let x = v as f64 / 255.0;
                    s += x * k as f64;
                    s2 += x * x * k as f64;
                }
                let mean = s / n as f64;
                let var = (s2 / n as f64 - mean * mean).max(0.0);
                let std = if var > 1e-12 { var.sqrt() } else { 1.0 };
                (mean as f32, std as f32)
            })
            .collect()
    }

    /// The per-channel `(mean, std)` applied to batches.
    pub fn normalization(&self) -> &[(f32, f32)] {
        &self.norm
    }

    /// Sets the per-channel `(mean, std)` applied to batches (e.g. a test set takes its
    /// training set's). `norm` must hold one pair per channel.
    pub fn set_normalization(&mut self, norm: &[(f32, f32)]) {
        assert_eq!(norm.len(), self.shape[0], "one (mean, std) per channel");
        self.norm = norm.to_vec();
        self.table = norm
            .iter()
            .map(|&(m, s)| std::array::from_fn(|v| (v as f32 / 255.0 - m) / s))
            .collect();
    }

    /// Gathers the images at `indices` into a normalized batch.
    pub fn batch(&self, indices: &[usize]) -> ImageBatch {
        let [c, h, w] = self.shape;
        let plane = h * w;
        let mut pixels = Vec::with_capacity(indices.len() * c * plane);
        let mut labels = Vec::with_capacity(indices.len());
        for &i in indices {
            for (ch, px) in self.raw(i).chunks_exact(plane).enumerate() {
                let t = &self.table[ch];
                pixels.extend(px.iter().map(|&p| t[usize::from(p)]));
            }
            labels.push(self.labels[i]);
        }
        ImageBatch {
            pixels,
            labels,
            shape: self.shape,
        }
    }

    /// Appends the images of `other` (same shape and classes; its normalization is ignored).
    pub fn extend(&mut self, other: &ImageSet) -> std::result::Result<(), ImageSetError> {
        if other.shape != self.shape || other.classes != self.classes {
            return Err(ImageSetError::Join {
                shape: other.shape,
                classes: other.classes,
                into_shape: self.shape,
                into_classes: self.classes,
            });
        }
        self.pixels.extend_from_slice(&other.pixels);
        self.labels.extend_from_slice(&other.labels);
        let norm = self.channel_stats();
        self.set_normalization(&norm);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_and_normalizes() {
        assert!(ImageSet::new(vec![0; 5], vec![1], [1, 2, 2], 10).is_err());
        assert!(ImageSet::new(vec![0; 4], vec![10], [1, 2, 2], 10).is_err());
        let set = ImageSet::new(
            vec![0, 255, 0, 255, 0, 0, 255, 255],
            vec![1, 2],
            [1, 2, 2],
            3,
        )
        .unwrap();
        let (m, s) = set.normalization()[0];
        assert!((m - 0.5).abs() < 1e-6 && (s - 0.5).abs() < 1e-6);
        let b = set.batch(&[1, 0]);
        assert_eq!(b.labels, vec![2, 1]);
        assert_eq!(b.pixels, vec![-1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]);
    }
}
