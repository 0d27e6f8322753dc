//! One mini-batch, as the models take it.

/// A mini-batch of normalized images and their labels.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageBatch {
    /// `len * channels * height * width` normalized pixels, image after image.
    pub pixels: Vec<f32>,
    /// One class per image.
    pub labels: Vec<u8>,
    /// `[channels, height, width]` of every image.
    pub shape: [usize; 3],
}

/// A mini-batch of token sequences for next-token prediction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextBatch {
    /// `len * seq_len` token ids, sequence after sequence.
    pub inputs: Vec<u32>,
    /// The next token after each input token (same layout).
    pub targets: Vec<u32>,
    /// Tokens per sequence.
    pub seq_len: usize,
}

/// A mini-batch of either kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Batch {
    /// Images with class labels.
    Images(ImageBatch),
    /// Token sequences with next-token targets.
    Text(TextBatch),
}

impl Batch {
    /// Number of samples (images or sequences).
    pub fn len(&self) -> usize {
        match self {
            Batch::Images(b) => b.labels.len(),
            Batch::Text(b) => b.inputs.len().checked_div(b.seq_len).unwrap_or(0),
        }
    }

    /// True when the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// "images" or "text", for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Batch::Images(_) => "images",
            Batch::Text(_) => "text",
        }
    }
}
