//! Checkpoint files: written atomically (temp file, fsync, rename, fsync of the
//! directory), read back with every field checked.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use crate::wire::WireError;

/// Magic of a checkpoint file.
pub const CKPT_MAGIC: u32 = 0x4B43_5747;
/// Version written by this build (1 is still read).
pub const CKPT_VERSION: u8 = 2;
const CKPT_HEADER: usize = 20;

/// Writes `body` as a checkpoint at `path`, atomically.
pub fn write_checkpoint(path: &Path, body: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("ckpt.tmp");
    {
        let mut f = File::create(&tmp)?;
        let mut head = Vec::with_capacity(CKPT_HEADER);
        head.extend_from_slice(&CKPT_MAGIC.to_le_bytes());
        head.extend_from_slice(&[CKPT_VERSION, 0, 0, 0]);
        head.extend_from_slice(&(body.len() as u64).to_le_bytes());
        head.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        f.write_all(&head)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    // Make the rename itself durable: until then the old checkpoint may come back.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Checks a checkpoint file's bytes and returns its body.
pub fn decode_checkpoint(bytes: &[u8]) -> Result<&[u8], WireError> {
    decode_checkpoint_versioned(bytes).map(|(_, b)| b)
}

/// Checks a checkpoint file's bytes and returns its version and body.
pub fn decode_checkpoint_versioned(bytes: &[u8]) -> Result<(u8, &[u8]), WireError> {
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
    let version = bytes[4];
    if !(1..=CKPT_VERSION).contains(&version) {
        return Err(WireError::UnknownVersion { found: version });
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
    Ok((version, body))
}

/// Reads the checkpoint at `path`: `Ok(None)` when there is none.
pub fn read_checkpoint(path: &Path) -> io::Result<Option<Vec<u8>>> {
    read_checkpoint_versioned(path).map(|c| c.map(|(_, b)| b))
}

/// Reads the checkpoint at `path` with its version: `Ok(None)` when there is none.
pub fn read_checkpoint_versioned(path: &Path) -> io::Result<Option<(u8, Vec<u8>)>> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    decode_checkpoint_versioned(&bytes)
        .map(|(v, b)| Some((v, b.to_vec())))
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        })
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
}
