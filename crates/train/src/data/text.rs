//! Plain text as character ids: a vocabulary, a train/validation split, and fixed-length
//! windows for next-character prediction.

use std::path::Path;
use std::sync::Arc;

use super::batch::TextBatch;
use crate::error::{ConfigError, Error, Result};

/// The characters of a corpus, sorted; a character's id is its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocab {
    chars: Vec<char>,
}

impl Vocab {
    /// The sorted distinct characters of `text`.
    pub fn from_text(text: &str) -> Self {
        let mut seen = std::collections::BTreeSet::new();
        seen.extend(text.chars());
        Vocab {
            chars: seen.into_iter().collect(),
        }
    }

    /// Number of distinct characters.
    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// True for an empty vocabulary.
    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The id of `c`, if it is in the vocabulary.
    pub fn id(&self, c: char) -> Option<u32> {
        self.chars.binary_search(&c).ok().map(|i| i as u32)
    }

    /// The character of `id`, if in range.
    pub fn char(&self, id: u32) -> Option<char> {
        self.chars.get(id as usize).copied()
    }

    /// Encodes `text`; characters outside the vocabulary are an error.
    pub fn encode(&self, text: &str) -> std::result::Result<Vec<u32>, char> {
        text.chars().map(|c| self.id(c).ok_or(c)).collect()
    }

    /// Decodes ids back to text (ids out of range become U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.char(i).unwrap_or('\u{fffd}'))
            .collect()
    }
}

/// One split of a corpus: token ids cut into non-overlapping windows of `seq_len + 1`
/// tokens (input = the first `seq_len`, target = the same shifted by one).
#[derive(Debug, Clone)]
pub struct TextSplit {
    ids: Arc<[u32]>,
    seq_len: usize,
}

impl TextSplit {
    /// Wraps `ids` with windows of `seq_len` (at least 1).
    pub fn new(ids: impl Into<Arc<[u32]>>, seq_len: usize) -> Self {
        TextSplit {
            ids: ids.into(),
            seq_len: seq_len.max(1),
        }
    }

    /// Number of windows (samples).
    pub fn len(&self) -> usize {
        self.ids.len().saturating_sub(1) / self.seq_len
    }

    /// True when not even one window fits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tokens per window.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// The same tokens cut into windows of another length.
    pub fn with_seq_len(&self, seq_len: usize) -> Self {
        TextSplit::new(self.ids.clone(), seq_len)
    }

    /// All token ids.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Gathers the windows at `indices`.
    pub fn batch(&self, indices: &[usize]) -> TextBatch {
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(indices.len() * t);
        let mut targets = Vec::with_capacity(indices.len() * t);
        for &i in indices {
            let s = i * t;
            inputs.extend_from_slice(&self.ids[s..s + t]);
            targets.extend_from_slice(&self.ids[s + 1..s + t + 1]);
        }
        TextBatch {
            inputs,
            targets,
            seq_len: t,
        }
    }
}

/// A corpus split into training and validation text, with its vocabulary.
#[derive(Debug, Clone)]
pub struct TextCorpus {
    /// The characters of the whole corpus.
    pub vocab: Vocab,
    /// The first `1 - val_fraction` of the text.
    pub train: TextSplit,
    /// The last `val_fraction` of the text.
    pub validation: TextSplit,
}

impl TextCorpus {
    /// Builds the vocabulary of `text` and splits it (by characters, contiguously) with the
    /// last `val_fraction` for validation.
    pub fn from_text(text: &str, val_fraction: f64, seq_len: usize) -> Result<Self> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(ConfigError::ValFraction {
                value: val_fraction,
            }
            .into());
        }
        let vocab = Vocab::from_text(text);
        let ids = vocab
            .encode(text)
            .expect("every character of the text is in its own vocabulary");
        let n_val = (ids.len() as f64 * val_fraction) as usize;
        let cut = ids.len() - n_val;
        Ok(TextCorpus {
            vocab,
            train: TextSplit::new(&ids[..cut], seq_len),
            validation: TextSplit::new(&ids[cut..], seq_len),
        })
    }

    /// Reads a UTF-8 text file and splits it as [`TextCorpus::from_text`] does.
    pub fn load(path: &Path, val_fraction: f64, seq_len: usize) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::reading_data(path, e))?;
        let text = String::from_utf8(bytes).map_err(|e| Error::Malformed {
            format: "UTF-8 text",
            path: path.to_path_buf(),
            what: format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to()),
        })?;
        if text.chars().nth(1).is_none() {
            return Err(Error::Malformed {
                format: "UTF-8 text",
                path: path.to_path_buf(),
                what: "fewer than 2 characters".into(),
            });
        }
        Self::from_text(&text, val_fraction, seq_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vocab_split_and_windows() {
        let c = TextCorpus::from_text("abcabcabcd", 0.2, 3).unwrap();
        assert_eq!(c.vocab.len(), 4);
        assert_eq!(c.vocab.decode(c.train.ids()), "abcabcab");
        assert_eq!(c.vocab.decode(c.validation.ids()), "cd");
        assert_eq!(c.train.len(), 2);
        let b = c.train.batch(&[1, 0]);
        assert_eq!(c.vocab.decode(&b.inputs), "abcabc");
        assert_eq!(c.vocab.decode(&b.targets), "bcabca");
        assert_eq!(c.validation.len(), 0);
        assert!(TextCorpus::from_text("ab", 1.0, 3).is_err());
    }

    #[test]
    fn loads_files_and_reports_problems() {
        let dir = std::env::temp_dir().join(format!("gw-text-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("input.txt");
        std::fs::write(&f, "To be, or not to be: that is the question.\n").unwrap();
        let c = TextCorpus::load(&f, 0.1, 8).unwrap();
        assert!(c.vocab.id('q').is_some());
        std::fs::write(&f, [0x66, 0xff, 0x66]).unwrap();
        assert!(TextCorpus::load(&f, 0.1, 8).is_err());
        let e = TextCorpus::load(&dir.join("none.txt"), 0.1, 8).unwrap_err();
        assert!(e.to_string().contains("scripts/fetch-data.sh"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
