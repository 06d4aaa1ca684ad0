//! The seam between the store and its files: every read, write, sync and
//! change of length that the write-ahead log (`tether.wal`) and redb
//! (`tether.redb`) make goes through [`FileIo`], and every file they use is
//! opened through an [`Opener`].
//!
//! Why:
//!
//! * Failures of the disk can be tested where they happen. A full disk, an
//!   I/O error or a torn write at one exact operation of a commit cannot be
//!   had from a real filesystem without root (a loop device, a tiny tmpfs,
//!   `dm-flakey`), and even then not at a chosen point. Tests open the
//!   store through a faulty opener instead (`FaultyOpener`, with the
//!   `test-hooks` feature), which fails the operation asked for with a real
//!   errno.
//! * redb must never meet a full disk itself: after any I/O error it
//!   refuses every read as well until it is opened again. [`RedbFile`], the
//!   backend redb is built on, reserves blocks ahead of the file's end as
//!   it grows, and tells the store through [`Headroom`] how much is left,
//!   so that writes can be refused while reads go on.
//!
//! [`OsFile`] and [`OsOpener`] are the real implementation, over
//! [`std::fs::File`]; the system calls std does not offer (`fallocate`,
//! `fstatvfs`) are made through `rustix`.
//!
//! Outside the seam, on purpose (each reads or changes no byte of an open
//! store file, so no fault of a commit can happen there):
//!
//! * Whether a file is there, and its length, asked of the directory
//!   before anything is opened (`std::fs::metadata` and
//!   `symlink_metadata` in `store/mod.rs`, `store/recovery.rs`,
//!   `store/verify.rs`, `store/check.rs`, `store/repair.rs`): they tell a
//!   new store from an existing one and a missing file from a present
//!   one, and read no file's bytes. (What a file holds is read through
//!   the seam, the log's first bytes included.)
//! * The sizes `status` shows and the room a replay asks for
//!   (`Store::file_size`, `Store::log_len`): estimates, 0 when unknown.
//! * `store/backup.rs` and the end of `store/repair.rs`: whole files
//!   copied aside, renamed into place, directories made, synced and
//!   removed. These are operations on paths and directories, which
//!   [`FileIo`] (positioned I/O on one open file) does not model; they run
//!   only in `tetherd repair` and before an upgrade, never beside a
//!   commit, and their one expected failure, a disk without room for the
//!   copy, is checked before they start and tested on a real full disk.
//!   The store `tetherd repair` builds is opened through the seam.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

mod backend;
#[cfg(any(test, feature = "test-hooks"))]
mod faults;
mod os;
#[cfg(test)]
mod tests;

pub use backend::{Headroom, RedbFile};
#[cfg(any(test, feature = "test-hooks"))]
pub use faults::{FaultPlan, FaultyFile, FaultyOpener, Files, IoOp};
pub use os::{keep_private, OsFile, OsOpener};

/// One open file, as the log and the store use it: positioned reads and
/// writes, never a shared cursor, so that any thread may use it at once.
// `len` is a query of the filesystem that can fail, not a collection's
// size: an `is_empty` beside it would only repeat it.
#[allow(clippy::len_without_is_empty)]
pub trait FileIo: Send + Sync + std::fmt::Debug {
    /// The file's length.
    fn len(&self) -> io::Result<u64>;

    /// Fills `buf` from `offset`; [`io::ErrorKind::UnexpectedEof`] when the
    /// file ends before.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Writes all of `data` at `offset`.
    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()>;

    /// Cuts or extends the file to `len` bytes (new bytes read as zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;

    /// Makes the file's data (and what is needed to read it back, such as
    /// its length) durable: `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;

    /// Reserves the blocks of `len` bytes from `offset` without changing
    /// the file's length, so that writing there later cannot fail for want
    /// of space. `Ok(())` where the filesystem cannot reserve blocks: a
    /// reservation is a precaution, not a promise every filesystem keeps.
    fn allocate(&self, offset: u64, len: u64) -> io::Result<()>;

    /// Bytes free on the file's filesystem for this user.
    fn free_space(&self) -> io::Result<u64>;

    /// Asks the kernel to start writing the file's dirty pages out, without
    /// waiting for them (see
    /// [`SyncHandle::start_store_writeback`](crate::wal::SyncHandle::start_store_writeback)).
    fn start_writeback(&self) -> io::Result<()> {
        Ok(())
    }

    /// A descriptor for the same open file, for redb's advisory locks
    /// (taken on the open file description, as redb's own backend takes
    /// them on the descriptor it reads and writes through). `None` for a
    /// file no lock can be taken on: redb then allows a single writer
    /// without being able to tell another process it is there.
    fn lock_handle(&self) -> io::Result<Option<File>> {
        Ok(None)
    }
}

/// Opens the files of the log and of the store.
pub trait Opener: Send + Sync + std::fmt::Debug {
    /// Opens `path` to read and write, creating it when missing and
    /// keeping what it holds.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FileIo>>;

    /// Opens `path` to read only.
    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn FileIo>>;
}
