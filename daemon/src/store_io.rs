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

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

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

/// A file of the filesystem.
#[derive(Debug)]
pub struct OsFile {
    file: File,
}

impl OsFile {
    pub fn new(file: File) -> OsFile {
        OsFile { file }
    }
}

impl FileIo for OsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.file, data, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => Ok(()),
            // Filesystems without fallocate (or without KEEP_SIZE) just
            // take blocks as they are written, as before.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn free_space(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstatvfs(&self.file)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    fn start_writeback(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // Neither std nor rustix offers `sync_file_range`.
        // SAFETY: a plain syscall on a descriptor `self.file` keeps open.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn lock_handle(&self) -> io::Result<Option<File>> {
        self.file.try_clone().map(Some)
    }
}

/// Opens files of the filesystem as [`OsFile`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsOpener;

impl Opener for OsOpener {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(OsFile::new(file)))
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        Ok(Arc::new(OsFile::new(File::open(path)?)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn an_os_file_reserves_blocks_without_changing_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let file = OsOpener.open(&path).unwrap();
        file.write_all_at(b"abc", 0).unwrap();
        file.allocate(0, 1 << 20).unwrap();
        assert_eq!(file.len().unwrap(), 3);
        file.set_len(4096).unwrap();
        let mut buf = [9u8; 5];
        file.read_exact_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"bc\0\0\0");
        file.sync_data().unwrap();
        file.start_writeback().unwrap();
        assert!(file.free_space().unwrap() > 0);
        // Reopening keeps what the file holds; read-only refuses writes.
        let again = OsOpener.open_read(&path).unwrap();
        assert_eq!(again.len().unwrap(), 4096);
        let err = again.write_all_at(b"x", 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        let mut past = [0u8; 2];
        let eof = again.read_exact_at(&mut past, 4095).unwrap_err();
        assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);
    }
}
