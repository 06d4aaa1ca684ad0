//! Handles on the log for other threads: the syncer's, and readers of the
//! chunks the log keeps for the store.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Wal;
use crate::store_io::FileIo;
use crate::{Error, Result};

/// What the syncer needs to make appended records durable: the file, and
/// how many bytes were ever appended (a record's *ticket* is that count
/// just after it).
#[derive(Clone, Debug)]
pub struct SyncHandle {
    file: Arc<dyn FileIo>,
    written: Arc<AtomicU64>,
    path: Arc<PathBuf>,
    /// The store's file, read-only, to start its writeback early.
    store: Option<Arc<dyn FileIo>>,
}

impl SyncHandle {
    /// Syncs everything appended so far; returns the ticket it covers.
    pub fn sync(&self) -> io::Result<u64> {
        let covered = self.written.load(Ordering::Acquire);
        self.file.sync_data()?;
        Ok(covered)
    }

    /// Asks the kernel to start writing the store's dirty pages out, and
    /// returns without waiting for them. The store is made durable only by
    /// a durable commit, which then has little left to write: without
    /// this, a durable commit after a full log wrote tens of MiB while the writer waited.
    /// Harmless at any moment: the kernel may write those pages whenever it
    /// likes anyway, and the store's own commit protocol allows for it.
    pub fn start_store_writeback(&self) {
        if let Some(store) = &self.store {
            if let Err(e) = store.start_writeback() {
                tracing::debug!("starting the store's writeback failed: {e}");
            }
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ticket of the last record appended: syncing covers it.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// A handle over any file, as if `written` bytes had been appended
    /// to it: for tests of what happens when syncing it fails.
    #[cfg(test)]
    pub fn over(file: Arc<dyn FileIo>, path: &Path, written: u64) -> SyncHandle {
        SyncHandle {
            file,
            written: Arc::new(AtomicU64::new(written)),
            path: Arc::new(path.to_path_buf()),
            store: None,
        }
    }
}

/// Reads chunks the log keeps for the store (see [`crate::wal`],
/// "Wrapping"), from any thread.
#[derive(Clone, Debug)]
pub struct LogReader {
    file: Arc<dyn FileIo>,
    path: Arc<PathBuf>,
    capacity: u64,
    head: Arc<AtomicU64>,
}

impl LogReader {
    /// Reads the `len` bytes kept at position `at` into `buf`. Returns
    /// false when the records may since have gone over them: the store
    /// had copied them by then, and a read of a newer snapshot finds them
    /// there. (The writer raises the head before it writes, and this
    /// looks at it after reading, like a sequence lock.)
    pub fn read(&self, at: u64, len: usize, buf: &mut Vec<u8>) -> Result<bool> {
        let physical = at % self.capacity;
        if physical + len as u64 > self.capacity {
            return Err(Error::Invariant(format!(
                "a chunk kept in the log {} at {at} ({len} bytes) would pass its end",
                self.path.display()
            )));
        }
        buf.clear();
        buf.resize(len, 0);
        self.file.read_exact_at(buf, physical).map_err(|e| {
            Error::io(
                format!(
                    "cannot read a chunk kept in the log {}",
                    self.path.display()
                ),
                e,
            )
        })?;
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(self.head.load(Ordering::SeqCst) <= at + self.capacity)
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Handles for other threads.
impl Wal {
    /// Reads chunks kept in the log, from any thread.
    pub fn reader(&self) -> LogReader {
        LogReader {
            file: self.file.clone(),
            path: self.path.clone(),
            capacity: self.capacity,
            head: self.head.clone(),
        }
    }

    /// For the syncer.
    /// `store` is the store's file (see [`SyncHandle::start_store_writeback`]).
    pub fn sync_handle(&self, store: Option<Arc<dyn FileIo>>) -> SyncHandle {
        SyncHandle {
            file: self.file.clone(),
            written: self.written.clone(),
            path: self.path.clone(),
            store,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::wal::tests::{sized, small_ring};

    #[test]
    fn a_reader_is_told_when_the_records_went_over_what_it_read() {
        let (_dir, mut wal) = small_ring();
        let reader = wal.reader();
        wal.append(&mut sized(1000, 9)).unwrap();
        let mut buf = Vec::new();
        assert!(reader.read(100, 10, &mut buf).unwrap());
        assert_eq!(buf, vec![9; 10]);
        // Records a lap on, over the same bytes.
        let mut at = wal.pos;
        while at < 64 * 1024 + 200 {
            wal.copied_to(wal.pos);
            wal.committed_durably(wal.next_number()).unwrap();
            wal.append(&mut sized(1000, 8)).unwrap();
            at = wal.pos;
        }
        assert!(!reader.read(100, 10, &mut buf).unwrap());
        // A read past the file's end is refused, naming the log.
        let err = reader.read(64 * 1024 - 5, 10, &mut buf).unwrap_err();
        assert!(err.to_string().contains("t.wal"), "{err}");
    }
}
