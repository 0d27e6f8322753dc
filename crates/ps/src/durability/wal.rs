//! The write-ahead log: appends that are durable before they are acknowledged, repair of a
//! failed append before the next one, and a streaming reader that cuts only a torn tail.

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::WalFaults;

/// Shortest record body (an lsn and a kind).
pub const MIN_RECORD: usize = 9;

/// Splits WAL bytes into record bodies; stops at the first torn or corrupt record and
/// returns the byte length of the good prefix. Never panics, never allocates beyond the
/// input.
pub fn decode_wal(bytes: &[u8], max_record: usize) -> (Vec<&[u8]>, usize) {
    let mut out = Vec::new();
    let mut pos = 0;
    while bytes.len() - pos >= 8 {
        let len = u32::from_le_bytes([bytes[pos], bytes[pos + 1], bytes[pos + 2], bytes[pos + 3]])
            as usize;
        let crc = u32::from_le_bytes([
            bytes[pos + 4],
            bytes[pos + 5],
            bytes[pos + 6],
            bytes[pos + 7],
        ]);
        if !(MIN_RECORD..=max_record).contains(&len) || bytes.len() - pos - 8 < len {
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
    /// Bytes known good (written, and fsynced when `sync`).
    good: u64,
    /// A failed append or fsync may have left bytes past `good`.
    broken: bool,
    faults: Option<Arc<WalFaults>>,
}

/// What the reader found at one position.
enum Next {
    /// A good record of this many body bytes (in the buffer).
    Record(usize),
    /// The end of the file, exactly between records.
    End,
    /// A torn or bad record.
    Bad,
}

impl Wal {
    /// Opens (or creates) the log at `path`, reads its good records, and cuts off a torn
    /// tail. `sync`: fsync every append (off only for benchmarks). Holds every record in
    /// memory; a shard uses [`Wal::open_with`].
    pub fn open(path: &Path, sync: bool, max_record: usize) -> io::Result<(Wal, Vec<Vec<u8>>)> {
        let mut records = Vec::new();
        let wal = Self::open_with(path, sync, max_record, None, |r| records.push(r.to_vec()))?;
        Ok((wal, records))
    }

    /// Opens (or creates) the log at `path`, handing each good record to `each` as it is
    /// read (one record in memory at a time), and cuts off a torn tail. A bad record with
    /// more than a tail after it fails the open (`InvalidData`) and leaves the file as it
    /// is. `faults` injects failures into later appends.
    pub fn open_with(
        path: &Path,
        sync: bool,
        max_record: usize,
        faults: Option<Arc<WalFaults>>,
        mut each: impl FnMut(&[u8]),
    ) -> io::Result<Wal> {
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let size = file.metadata()?.len();
        let mut pos = 0u64;
        let mut body = Vec::new();
        let bad = {
            let mut r = BufReader::new(&mut file);
            loop {
                match read_record(&mut r, size - pos, max_record, &mut body)? {
                    Next::Record(n) => {
                        each(&body[..n]);
                        pos += 8 + n as u64;
                    }
                    Next::End => break false,
                    Next::Bad => break true,
                }
            }
        };
        if bad && !is_tail(&mut file, pos, size, max_record)? {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: a damaged record at byte {pos} with {} more bytes after it; not \
                     cutting records that may have been acknowledged (move the file aside to \
                     start from the checkpoint alone)",
                    path.display(),
                    size - pos
                ),
            ));
        }
        if pos != size {
            tracing::warn!(path = %path.display(), cut = size - pos, "cutting a torn WAL tail");
            file.set_len(pos)?;
            file.sync_all()?;
        }
        Ok(Wal {
            file,
            path: path.to_path_buf(),
            sync,
            buf: Vec::new(),
            good: pos,
            broken: false,
            faults,
        })
    }

    /// Appends one record and (when `sync`) waits until it is durable. After a failure the
    /// file is cut back to its last good length at once (so a crash cannot bring the
    /// refused record back); if that fails too the log stays broken and the next append
    /// tries again first, failing while it cannot.
    pub fn append(&mut self, body: &[u8]) -> io::Result<()> {
        if self.broken {
            self.repair()?;
        }
        self.buf.clear();
        self.buf
            .extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.buf
            .extend_from_slice(&crc32fast::hash(body).to_le_bytes());
        self.buf.extend_from_slice(body);
        // Broken until proven written (and durable).
        self.broken = true;
        match self.write_buf() {
            Ok(()) => {
                self.good += self.buf.len() as u64;
                self.broken = false;
                Ok(())
            }
            Err(e) => {
                if let Err(r) = self.repair() {
                    tracing::warn!(path = %self.path.display(), error = %r, "WAL repair failed; refusing appends until it succeeds");
                }
                Err(e)
            }
        }
    }

    fn write_buf(&mut self) -> io::Result<()> {
        if self.faults.as_ref().is_some_and(|f| f.tear()) {
            let half = self.buf.len() / 2;
            self.file.write_all(&self.buf[..half])?;
            return Err(io::Error::other("injected torn write"));
        }
        self.file.write_all(&self.buf)?;
        if self.sync {
            self.sync_data()?;
        }
        Ok(())
    }

    /// Cuts the file back to its last good length and makes that durable.
    fn repair(&mut self) -> io::Result<()> {
        self.file.set_len(self.good)?;
        if let Some(f) = &self.faults {
            f.sync_error()?;
        }
        self.file.sync_all()?;
        self.broken = false;
        Ok(())
    }

    fn sync_data(&mut self) -> io::Result<()> {
        if let Some(f) = &self.faults {
            f.sync_error()?;
        }
        self.file.sync_data()
    }

    /// Empties the log (after a checkpoint made its records redundant).
    pub fn truncate(&mut self) -> io::Result<()> {
        self.broken = true;
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.good = 0;
        self.broken = false;
        Ok(())
    }

    /// Bytes of good records in the log.
    pub fn len(&self) -> u64 {
        self.good
    }

    /// Whether the log holds no record.
    pub fn is_empty(&self) -> bool {
        self.good == 0
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reads the record at the reader's position (`left` bytes remain in the file) into
/// `body` (grown to at most `max_record`).
fn read_record(
    r: &mut impl Read,
    left: u64,
    max_record: usize,
    body: &mut Vec<u8>,
) -> io::Result<Next> {
    if left == 0 {
        return Ok(Next::End);
    }
    if left < 8 {
        return Ok(Next::Bad);
    }
    let mut h = [0u8; 8];
    r.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if !(MIN_RECORD..=max_record).contains(&len) || (len as u64) > left - 8 {
        return Ok(Next::Bad);
    }
    if body.len() < len {
        body.resize(len, 0);
    }
    r.read_exact(&mut body[..len])?;
    if crc32fast::hash(&body[..len]) != crc {
        return Ok(Next::Bad);
    }
    Ok(Next::Record(len))
}

/// Whether the bad record at `pos` is a torn tail: too short for its header, running past
/// the end, ending exactly at the end, or followed by nothing but zeros.
fn is_tail(file: &mut File, pos: u64, size: u64, max_record: usize) -> io::Result<bool> {
    let left = size - pos;
    if left < 8 {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(pos))?;
    let mut h = [0u8; 8];
    file.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as u64;
    if (MIN_RECORD as u64..=max_record as u64).contains(&len) && len >= left - 8 {
        return Ok(true);
    }
    // Zeros to the end (a file extended but never written, as after a crash).
    file.seek(SeekFrom::Start(pos))?;
    let mut rest = file.take(left);
    let mut chunk = [0u8; 64 << 10];
    loop {
        let n = rest.read(&mut chunk)?;
        if n == 0 {
            return Ok(true);
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gwps-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn rec(tag: u8) -> Vec<u8> {
        vec![tag; MIN_RECORD + tag as usize]
    }

    fn reopen(path: &Path) -> io::Result<Vec<Vec<u8>>> {
        Wal::open(path, true, 1000).map(|(_, r)| r)
    }

    #[test]
    fn a_torn_tail_is_cut_and_appends_continue_after_it() {
        let d = dir("wal-tail");
        let path = d.join("shard-0.wal");
        {
            let (mut w, recs) = Wal::open(&path, true, 1000).unwrap();
            assert!(recs.is_empty());
            w.append(&rec(1)).unwrap();
            w.append(&rec(2)).unwrap();
        }
        let good = fs::metadata(&path).unwrap().len();
        // A torn third record, then zeros: each a tail.
        for tail in [&[30u8, 0, 0, 0, 1, 2][..], &[0u8; 100][..], &[7u8; 5][..]] {
            let mut f = OpenOptions::new().append(true).open(&path).unwrap();
            f.write_all(tail).unwrap();
            drop(f);
            assert_eq!(reopen(&path).unwrap(), vec![rec(1), rec(2)]);
            assert_eq!(fs::metadata(&path).unwrap().len(), good);
        }
        let (mut w, _) = Wal::open(&path, true, 1000).unwrap();
        w.append(&rec(3)).unwrap();
        drop(w);
        assert_eq!(reopen(&path).unwrap(), vec![rec(1), rec(2), rec(3)]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_damaged_record_with_records_after_it_fails_the_open_and_keeps_the_file() {
        let d = dir("wal-middle");
        let path = d.join("shard-0.wal");
        {
            let (mut w, _) = Wal::open(&path, true, 1000).unwrap();
            for t in 1..=4 {
                w.append(&rec(t)).unwrap();
            }
        }
        let mut bytes = fs::read(&path).unwrap();
        let second = 8 + rec(1).len();
        bytes[second + 9] ^= 0x10; // inside record 2's body
        fs::write(&path, &bytes).unwrap();
        let e = reopen(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "nothing cut");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_failed_append_or_fsync_is_cut_back_before_the_next_append() {
        let d = dir("wal-fail");
        let path = d.join("shard-0.wal");
        let faults = Arc::new(WalFaults::new());
        let mut w = Wal::open_with(&path, true, 1000, Some(faults.clone()), |_| {}).unwrap();
        w.append(&rec(1)).unwrap();
        faults.tear_writes(1);
        assert!(w.append(&rec(2)).is_err());
        w.append(&rec(3)).unwrap();
        faults.fail_syncs(1);
        assert!(w.append(&rec(4)).is_err());
        // The refused record is cut at once: a crash now would not bring it back.
        assert_eq!(reopen(&path).unwrap(), vec![rec(1), rec(3)]);
        // While the repairs' own fsyncs fail, nothing is appended.
        faults.fail_syncs(3);
        assert!(w.append(&rec(5)).is_err());
        assert!(w.append(&rec(6)).is_err());
        w.append(&rec(7)).unwrap();
        drop(w);
        assert_eq!(reopen(&path).unwrap(), vec![rec(1), rec(3), rec(7)]);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn decode_wal_stops_at_the_first_bad_record() {
        let mut bytes = Vec::new();
        for t in [1u8, 2] {
            let r = rec(t);
            bytes.extend_from_slice(&(r.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&crc32fast::hash(&r).to_le_bytes());
            bytes.extend_from_slice(&r);
        }
        let whole = bytes.len();
        bytes.extend_from_slice(&[0u8; 8]);
        let (recs, good) = decode_wal(&bytes, 1000);
        assert_eq!((recs.len(), good), (2, whole));
    }
}
