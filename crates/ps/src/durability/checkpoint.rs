//! Durable files of a shard: atomic checkpoints and the write-ahead log.
//!
//! Checkpoint file (`shard-<id>.ckpt`), written as temp file, fsync, rename, fsync of the
//! directory, so a crash leaves either the old or the new checkpoint, never a torn one:
//! ```text
//! 0..4    magic   u32 = 0x4B43_5747 ("GWCK")
//! 4       version u8  = 1
//! 5..8    zero    (reserved)
//! 8..16   len     u64 body bytes
//! 16..20  crc     u32 CRC-32 of the body
//! 20..    body    (the shard's state, see `shard.rs`)
//! ```
//! Write-ahead log (`shard-<id>.wal`), a sequence of records:
//! ```text
//! 0..4    len     u32 body bytes (<= the frame limit + 64)
//! 4..8    crc     u32 CRC-32 of the body
//! 8..     body    lsn u64, kind u8, then kind-specific bytes (see `shard.rs`)
//! ```
//! A record is acknowledged only after its append is fsynced, so no acknowledged push is
//! lost. On open, a torn or corrupt tail (a crash mid-append: never acknowledged) is cut off.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::wire::WireError;

/// Magic of a checkpoint file.
pub const CKPT_MAGIC: u32 = 0x4B43_5747;
const CKPT_HEADER: usize = 20;

/// Writes `body` as a checkpoint at `path`, atomically.
pub fn write_checkpoint(path: &Path, body: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("ckpt.tmp");
    {
        let mut f = File::create(&tmp)?;
        let mut head = Vec::with_capacity(CKPT_HEADER);
        head.extend_from_slice(&CKPT_MAGIC.to_le_bytes());
        head.extend_from_slice(&[1, 0, 0, 0]);
        head.extend_from_slice(&(body.len() as u64).to_le_bytes());
        head.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        f.write_all(&head)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        // Make the rename itself durable.
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Checks a checkpoint file's bytes and returns its body.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<&[u8], WireError> {
    if bytes.len() < CKPT_HEADER {
        return Err(WireError::Truncated {
            need: CKPT_HEADER,
            have: bytes.len(),
        });
    }
    let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != CKPT_MAGIC {
        return Err(WireError::BadMagic { found: magic });
    }
    if bytes[4] != 1 {
        return Err(WireError::UnknownVersion { found: bytes[4] });
    }
    if bytes[5..8] != [0, 0, 0] {
        return Err(WireError::BadField { field: "reserved" });
    }
    let len = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    let have = (bytes.len() - CKPT_HEADER) as u64;
    if len != have {
        return Err(if len > have {
            WireError::Truncated {
                need: CKPT_HEADER.saturating_add(len as usize),
                have: bytes.len(),
            }
        } else {
            WireError::Trailing {
                extra: (have - len) as usize,
            }
        });
    }
    let body = &bytes[CKPT_HEADER..];
    let expected = u32::from_le_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let found = crc32fast::hash(body);
    if expected != found {
        return Err(WireError::BadChecksum { expected, found });
    }
    Ok(body)
}

/// Reads the checkpoint at `path`: `Ok(None)` when there is none.
pub fn read_checkpoint(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    decode_checkpoint(&bytes)
        .map(|b| Some(b.to_vec()))
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
}

/// Splits WAL bytes into record bodies; stops at the first torn or corrupt record and
/// returns the byte length of the good prefix. Never panics, never allocates beyond the
/// input.
pub fn decode_wal(bytes: &[u8], max_record: usize) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while bytes.len() - pos >= 8 {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().expect("4 bytes"));
        if len > max_record || bytes.len() - pos - 8 < len {
            break;
        }
        let body = &bytes[pos + 8..pos + 8 + len];
        if crc32fast::hash(body) != crc {
            break;
        }
        out.push(body);
        pos += 8 + len;
    }
    (out, pos)
}

/// An append-only, fsynced write-ahead log.
#[derive(Debug)]
pub struct Wal {
    file: File,
    path: PathBuf,
    sync: bool,
    buf: Vec<u8>,
}

impl Wal {
    /// Opens (or creates) the log at `path`, reads its good records, and cuts off a torn
    /// tail. `sync`: fsync every append (off only for benchmarks).
    pub fn open(path: &Path, sync: bool, max_record: usize) -> io::Result<(Wal, Vec<Vec<u8>>)> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, good) = decode_wal(&bytes, max_record);
        let records: Vec<Vec<u8>> = records.into_iter().map(<[u8]>::to_vec).collect();
        if good != bytes.len() {
            tracing::warn!(path = %path.display(), cut = bytes.len() - good, "cutting torn WAL tail");
            file.set_len(good as u64)?;
            file.sync_all()?;
        }
        Ok((
            Wal {
                file,
                path: path.to_path_buf(),
                sync,
                buf: Vec::new(),
            },
            records,
        ))
    }

    /// Appends one record and (when `sync`) waits until it is durable.
    pub fn append(&mut self, body: &[u8]) -> io::Result<()> {
        self.buf.clear();
        self.buf
            .extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        self.buf.extend_from_slice(body);
        self.file.write_all(&self.buf)?;
        if self.sync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Empties the log (after a checkpoint made its records redundant).
    pub fn truncate(&mut self) -> io::Result<()> {
        self.file.set_len(0)?;
        self.file.sync_all()
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_round_trips_and_every_corruption_is_refused() {
        let dir = std::env::temp_dir().join(format!("gwps-ckpt-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("shard-0.ckpt");
        assert!(read_checkpoint(&path).unwrap().is_none());
        write_checkpoint(&path, b"hello state").unwrap();
        assert_eq!(read_checkpoint(&path).unwrap().unwrap(), b"hello state");
        let bytes = fs::read(&path).unwrap();
        for cut in 0..bytes.len() {
            assert!(decode_checkpoint(&bytes[..cut]).is_err());
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 4;
            assert!(decode_checkpoint(&b).is_err(), "flip at {i}");
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wal_keeps_good_records_and_cuts_a_torn_tail() {
        let dir = std::env::temp_dir().join(format!("gwps-wal-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("shard-0.wal");
        let _ = fs::remove_file(&path);
        {
            let (mut w, recs) = Wal::open(&path, true, 1000).unwrap();
            assert!(recs.is_empty());
            w.append(b"one").unwrap();
            w.append(b"two").unwrap();
        }
        // A torn third record.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let (mut w, recs) = Wal::open(&path, true, 1000).unwrap();
        assert_eq!(recs, vec![b"one".to_vec(), b"two".to_vec()]);
        w.append(b"three").unwrap();
        drop(w);
        let (_, recs) = Wal::open(&path, true, 1000).unwrap();
        assert_eq!(recs.len(), 3);
        fs::remove_dir_all(&dir).unwrap();
    }
}
