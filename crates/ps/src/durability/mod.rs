//! Durable files of a shard: atomic checkpoints and the write-ahead log.
//!
//! Checkpoint file (`shard-<id>.ckpt`), written as temp file, fsync, rename, fsync of the
//! directory (a failure of any step fails the checkpoint, and the WAL is only emptied after
//! a checkpoint succeeded), so a crash leaves either the old or the new checkpoint:
//! ```text
//! 0..4    magic   u32 = 0x4B43_5747 ("GWCK")
//! 4       version u8  = 2 (1 is still read: a body without scratch vectors)
//! 5..8    zero    (reserved)
//! 8..16   len     u64 body bytes
//! 16..20  crc     u32 CRC-32 of the body
//! 20..    body    (the shard's state, see `shard/durable.rs`)
//! ```
//! Write-ahead log (`shard-<id>.wal`), a sequence of records:
//! ```text
//! 0..4    len     u32 body bytes (9 ..= the frame limit + 64)
//! 4..8    crc     u32 CRC-32 of the body
//! 8..     body    lsn u64, kind u8, then kind-specific bytes (see `shard/durable.rs`)
//! ```
//! A record is acknowledged only after its append is fsynced, so no acknowledged push is
//! lost. A failed append or fsync leaves the log marked broken: the request is refused, and
//! before the next append the file is cut back to its last durable length and fsynced, so a
//! torn record never sits in front of later, acknowledged ones (while that repair fails,
//! every append is refused: nothing more is acknowledged). On open the log is read record
//! by record (never whole into memory); a torn tail (a crash mid-append: an incomplete last
//! record, a bad last record, or zeros to the end) is cut off, and a bad record with more
//! bytes after it is refused (opening fails) rather than cutting records that may have been
//! acknowledged.

mod checkpoint;
mod faults;
mod wal;

pub use checkpoint::{
    decode_checkpoint, decode_checkpoint_versioned, read_checkpoint, read_checkpoint_versioned,
    write_checkpoint, CKPT_MAGIC, CKPT_VERSION,
};
pub use faults::WalFaults;
pub use wal::{decode_wal, Wal, MIN_RECORD};
