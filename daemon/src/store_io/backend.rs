//! redb's storage: [`RedbFile`], the backend redb is built on, and the
//! [`Headroom`] it keeps reserved beyond the store file's end.

use std::io;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

use super::FileIo;

/// The least blocks reserved ahead of the store's end at a time: redb
/// grows a small file by little, and a step a call keeps `fallocate` off
/// most of its growths.
const MIN_STEP: u64 = 1024 * 1024;

/// The most blocks reserved ahead of the store's end: enough for a large
/// store's growths to be seldom, while a disk filling up still leaves the
/// log most of what is free.
const MAX_STEP: u64 = 64 * 1024 * 1024;

/// How far ahead of `len` blocks are reserved: an eighth of the file,
/// within [`MIN_STEP`] and [`MAX_STEP`].
fn step(len: u64) -> u64 {
    (len / 8).clamp(MIN_STEP, MAX_STEP)
}

/// Reserving ahead takes at most this share of the filesystem's free
/// space (a quarter). Where free space is shorter, blocks are reserved
/// only as the store asks for them ([`Headroom::reserve`], exactly what a
/// write needs), and the file grows without a reservation, its blocks
/// taken as redb writes them: a disk that then fills up refuses the
/// store's writes at once, rather than letting them go on into blocks put
/// aside while the disk was all but full. The log does the same with its
/// own file (see [`Wal::restart`](crate::wal::Wal::restart)).
/// [`Headroom::space_short`] says so.
const SPARE_SHARE: u64 = 4;

/// Whether `e` says the filesystem or the user's quota is full.
fn out_of_space(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// The blocks reserved for the store's file beyond its end, shared between
/// the [`RedbFile`] redb writes through and the store, which reserves here
/// before a write and refuses the write when it cannot: redb itself, once
/// it meets a full disk (or any failure of its file), fails every later
/// read too until it is opened again.
///
/// The reservation is a pool that every block redb takes draws on, not a
/// place: a page redb writes past the blocks the file already has (into a
/// hole of a file that grew without a reservation, or beyond its end)
/// takes a free block if the disk has one, and otherwise the backend gives
/// the pool back to the filesystem and writes again (see
/// [`RedbFile`]). So redb never meets a full disk while the store asks
/// for at least what each write may take ([`Headroom::reserve`]), wherever
/// redb puts its pages, and a file's holes cost nothing until used.
///
/// One `Headroom` can outlive the backend it was made with: a store that
/// reopens redb gives the new [`RedbFile`] the same one
/// ([`RedbFile::with_headroom`]), and it then follows the new file.
#[derive(Debug, Default)]
pub struct Headroom {
    /// The file reserved for; `None` once its backend is closed.
    state: Mutex<Option<Reservation>>,
    /// Whether the last reservation could not take a whole step ahead.
    short: AtomicBool,
    /// Whether the backend now in use reported a failure to redb, which
    /// then refuses all work until it is opened again.
    failed: AtomicBool,
    /// Tells the backends that shared this apart, so that a closed one
    /// cannot change what the open one reserved.
    owners: AtomicU64,
}

#[derive(Debug)]
struct Reservation {
    /// The [`RedbFile`] this is for (see [`Headroom::owners`]).
    owner: u64,
    file: Arc<dyn FileIo>,
    /// The file's length, as last set through the backend.
    len: u64,
    /// Where the blocks reserved beyond the file's end end: at least
    /// `len`. What lies between is the pool (see [`Headroom`]); holes
    /// within the file are not reserved, on opening or after a growth
    /// short of space: each page redb writes there draws on the pool when
    /// the disk has no block free.
    end: u64,
}

impl Reservation {
    /// The blocks reserved beyond the file's end.
    fn pool(&self) -> u64 {
        self.end.saturating_sub(self.len)
    }

    /// Reserves blocks through at least `want`: a step beyond it when
    /// that takes at most its share of the free space ([`SPARE_SHARE`]),
    /// else, or when there was no room for the step after all, exactly
    /// through it; the error when not even that can be had.
    fn reserve(&mut self, want: u64, short: &AtomicBool) -> io::Result<()> {
        if want <= self.end {
            return Ok(());
        }
        if self.reserve_step(want, short)? {
            return Ok(());
        }
        self.file.allocate(self.end, want - self.end)?;
        self.end = want;
        Ok(())
    }

    /// Reserves a whole step beyond `want` when there is space to spare
    /// for it (see [`SPARE_SHARE`]), and says whether it did; `short`
    /// then tells whether space is short. The one place both reserving
    /// and growing try for a step.
    fn reserve_step(&mut self, want: u64, short: &AtomicBool) -> io::Result<bool> {
        let ahead = want.saturating_add(step(want));
        let spare = ahead > self.end
            && self
                .file
                .free_space()
                .is_ok_and(|free| free / SPARE_SHARE >= ahead - self.end);
        if spare {
            match self.file.allocate(self.end, ahead - self.end) {
                Ok(()) => {
                    short.store(false, Ordering::Release);
                    self.end = ahead;
                    return Ok(true);
                }
                Err(e) if out_of_space(&e) => {}
                Err(e) => return Err(e),
            }
        }
        short.store(true, Ordering::Release);
        Ok(false)
    }

    /// Grows the file to `len`. Within the pool while space is not short,
    /// or with a step reserved beyond where there is space to spare, the
    /// file grows over reserved blocks. Short of that, it grows without a reservation
    /// (growing a file takes no blocks), and the pool moves to beyond the
    /// new end as large as it was: the store asked for it for the blocks
    /// redb's next pages take, wherever they are, and blocks the file
    /// grew over would count for nothing ([`Reservation::pool`] is what
    /// lies beyond the end). Growing must not fail for space: redb then
    /// refuses every read.
    fn grow(&mut self, len: u64, short: &AtomicBool) -> io::Result<()> {
        if len <= self.end && !short.load(Ordering::Acquire) {
            return self.file.set_len(len);
        }
        if self.reserve_step(len, short)? {
            return self.file.set_len(len);
        }
        // Cutting a file to its own length frees the blocks reserved
        // beyond its end (ext4 and tmpfs alike): the pool's blocks go back
        // to the filesystem and are taken again past the new end.
        let pool = self.give_back()?;
        self.file.set_len(len)?;
        self.len = len;
        self.end = len;
        self.take_back(pool, 0);
        Ok(())
    }

    /// Gives the pool back to the filesystem, for a write that found the
    /// disk full (or a growth short of space), to be taken again after it
    /// ([`Reservation::take_back`]). Returns the pool as it was, 0 for
    /// none.
    fn give_back(&mut self) -> io::Result<u64> {
        let pool = self.pool();
        if pool > 0 {
            self.file.set_len(self.len)?;
            self.end = self.len;
        }
        Ok(pool)
    }

    /// Reserves again what is left of a `pool` that was given back, less
    /// the `used` bytes a write took from it.
    fn take_back(&mut self, pool: u64, used: u64) {
        let left = pool.saturating_sub(used);
        if left == 0 {
            return;
        }
        match self.file.allocate(self.len, left) {
            Ok(()) => self.end = self.len + left,
            Err(e) => {
                tracing::debug!("cannot reserve {left} bytes again past the end of the store: {e}")
            }
        }
    }
}

impl Headroom {
    /// Bytes reserved beyond the store file's end: what redb can still
    /// take in blocks without meeting a full disk. 0 while no backend is
    /// open.
    pub fn headroom(&self) -> u64 {
        self.lock().as_ref().map_or(0, Reservation::pool)
    }

    /// Whether the last attempt to reserve a whole step ahead failed for
    /// want of space, or was not made because the step would have taken
    /// more than a quarter of the free space: the disk is nearly full.
    pub fn space_short(&self) -> bool {
        self.short.load(Ordering::Acquire)
    }

    /// Whether redb met a failure of its file through the backend now in
    /// use (see [`RedbFile`]): it then refuses all work, reads included,
    /// until it is opened again. A failed write that never reached redb
    /// (the log's, or one refused for space) leaves it working.
    pub fn redb_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Has `bytes` reserved beyond the file's end, before a write that may
    /// take that many blocks (see [`Headroom`]): a whole step beyond,
    /// where there is space to spare, so that a disk with space again
    /// stops being [`Headroom::space_short`]; else exactly that, however
    /// little free space is left, since the write waits on it. The error
    /// when the disk has not even that.
    pub fn reserve(&self, bytes: u64) -> io::Result<()> {
        match self.lock().as_mut() {
            Some(r) => {
                let want = r.len.saturating_add(bytes);
                r.reserve(want, &self.short)
            }
            None => Err(io::Error::other("the store is closed")),
        }
    }

    /// [`Headroom::reserve`], saying only whether the bytes are reserved.
    pub fn try_reserve(&self, bytes: u64) -> bool {
        self.reserve(bytes).is_ok()
    }

    fn lock(&self) -> MutexGuard<'_, Option<Reservation>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// redb's storage: a file opened through an [`Opener`](super::Opener),
/// with blocks kept reserved beyond its end (see [`Headroom`]).
///
/// When redb grows the file, blocks are first reserved through a step
/// beyond the new length (an eighth of it, 1 to 64 MiB), where that takes
/// at most a quarter of the free space; otherwise the file grows without
/// a reservation, the pool moving past its new end. A write that meets a
/// full disk (a page in a hole of the file) gives the pool back and is
/// made again, the rest of the pool then taken again. Every failure
/// reported to redb is noted ([`Headroom::redb_failed`]) and logged at
/// debug level with the operation: redb refuses all work after one. Locks
/// are redb's own, taken by its [`FileBackend`] on the same open file.
#[derive(Debug)]
pub struct RedbFile {
    file: Arc<dyn FileIo>,
    headroom: Arc<Headroom>,
    /// This backend's number in `headroom` (see [`Headroom::owners`]).
    owner: u64,
    /// Takes redb's locks, exactly as redb's own backend does; `None`
    /// when `file` offers no descriptor to lock.
    locks: Option<FileBackend>,
}

impl RedbFile {
    /// A backend over `file`, and the handle to its [`Headroom`].
    pub fn new(file: Arc<dyn FileIo>) -> io::Result<(RedbFile, Arc<Headroom>)> {
        let headroom = Arc::new(Headroom::default());
        let backend = RedbFile::with_headroom(file, &headroom)?;
        Ok((backend, headroom))
    }

    /// A backend over `file` that reserves through `headroom` (which then
    /// no longer follows the file it was made with): for a store that
    /// reopens redb and keeps its handle.
    pub fn with_headroom(file: Arc<dyn FileIo>, headroom: &Arc<Headroom>) -> io::Result<RedbFile> {
        let len = file.len()?;
        let locks = match file.lock_handle()? {
            Some(handle) => Some(FileBackend::new(handle).map_err(io::Error::other)?),
            None => None,
        };
        let owner = headroom.owners.fetch_add(1, Ordering::Relaxed);
        *headroom.lock() = Some(Reservation {
            owner,
            file: file.clone(),
            len,
            end: len,
        });
        headroom.failed.store(false, Ordering::Release);
        Ok(RedbFile {
            file,
            headroom: headroom.clone(),
            owner,
            locks,
        })
    }

    fn locks(&self) -> Result<&FileBackend, BackendError> {
        self.locks.as_ref().ok_or(BackendError::Unsupported)
    }

    /// Lets go of the headroom's reservation, unless a newer backend has
    /// it: the file's descriptor must not outlive the backend, or the
    /// locks taken on its open file would too.
    fn detach(&self) {
        let mut state = self.headroom.lock();
        if state.as_ref().is_some_and(|r| r.owner == self.owner) {
            *state = None;
        }
    }

    /// Notes and logs a failure reported to redb, which then refuses all
    /// work on this handle (unless a newer backend took over).
    fn failed<T>(&self, op: &str, at: u64, len: u64, result: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &result {
            tracing::debug!(op, offset = at, len, "the store file failed redb: {e}");
            let state = self.headroom.lock();
            if state.as_ref().is_some_and(|r| r.owner == self.owner) {
                self.headroom.failed.store(true, Ordering::Release);
            }
        }
        result
    }

    /// Writes `data` at `offset`; on a full disk, gives the pool back and
    /// writes again (see [`Headroom`]).
    fn write_drawing_on_pool(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        match self.file.write_all_at(data, offset) {
            Err(e) if out_of_space(&e) => {
                let mut state = self.headroom.lock();
                let Some(r) = state.as_mut().filter(|r| r.owner == self.owner) else {
                    return Err(e);
                };
                let pool = r.give_back()?;
                if pool == 0 {
                    return Err(e);
                }
                tracing::debug!(
                    offset,
                    len = data.len(),
                    pool,
                    "the disk is full: the store's reserved blocks are given back for a write"
                );
                let written = self.file.write_all_at(data, offset);
                r.take_back(pool, data.len() as u64);
                written
            }
            result => result,
        }
    }
}

impl Drop for RedbFile {
    // redb does not call `close` when it panics while opening a file.
    fn drop(&mut self) {
        self.detach();
    }
}

impl StorageBackend for RedbFile {
    fn len(&self) -> io::Result<u64> {
        self.failed("len", 0, 0, self.file.len())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        let read = self.file.read_exact_at(out, offset);
        self.failed("read", offset, out.len() as u64, read)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut state = self.headroom.lock();
        let result = match state.as_mut().filter(|r| r.owner == self.owner) {
            None => self.file.set_len(len),
            Some(r) if len > r.len => r.grow(len, &self.headroom.short).map(|()| r.len = len),
            Some(r) => self.file.set_len(len).map(|()| {
                // Cutting a file frees every block past its new end, the
                // reserved ones too.
                r.len = len;
                r.end = len;
            }),
        };
        drop(state);
        self.failed("set_len", len, 0, result)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.failed("sync", 0, 0, self.file.sync_data())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let written = self.write_drawing_on_pool(offset, data);
        self.failed("write", offset, data.len() as u64, written)
    }

    fn close(&self) -> io::Result<()> {
        self.detach();
        match &self.locks {
            Some(locks) => locks.close(),
            None => Ok(()),
        }
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.locks()?.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.locks()?.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.locks()?.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store_io::tests::{errno, EIO, ENOSPC};
    use crate::store_io::{FaultPlan, FaultyOpener, Files, IoOp, Opener, OsOpener};

    const CHUNKS: redb::TableDefinition<'_, u64, &[u8]> = redb::TableDefinition::new("chunks");

    /// Commits `n` values of 64 KiB, one transaction each, from `from` on.
    fn fill(db: &redb::Database, from: u64, n: u64) -> std::result::Result<(), redb::Error> {
        let value = vec![7u8; 64 * 1024];
        for key in from..from + n {
            let txn = db.begin_write()?;
            txn.open_table(CHUNKS)?.insert(key, value.as_slice())?;
            txn.commit()?;
        }
        Ok(())
    }

    #[test]
    fn redb_grows_its_file_into_blocks_reserved_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let path = dir.path().join("t.redb");
        let file = FaultyOpener::new(plan.clone()).open(&path).unwrap();
        let (backend, headroom) = RedbFile::new(file).unwrap();
        let db = redb::Builder::new().create_with_backend(backend).unwrap();
        let store = Files::suffix(".redb");
        let mut last_len = 0;
        for round in 0..8 {
            fill(&db, round * 16, 16).unwrap();
            let len = std::fs::metadata(&path).unwrap().len();
            assert!(len >= last_len);
            last_len = len;
            // redb doubles a small file as it grows: each growth passes
            // the step reserved before, and reserves a step past itself.
            assert_eq!(headroom.headroom(), step(len), "reserved ahead at {len}");
            assert!(!headroom.space_short());
            assert_eq!(
                plan.count(&store, IoOp::Allocate),
                plan.count(&store, IoOp::SetLen)
            );
        }
        assert!(last_len >= 16 * 1024 * 1024, "redb grew its file");
        drop(db);
        assert_eq!(headroom.headroom(), 0, "nothing reserved once closed");
        assert!(!headroom.try_reserve(1));
    }

    #[test]
    fn short_of_space_a_growth_keeps_the_pool_and_never_fails_for_space() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let path = dir.path().join("t.redb");
        let file = FaultyOpener::new(plan.clone()).open(&path).unwrap();
        let (backend, headroom) = RedbFile::new(file).unwrap();
        assert_eq!(headroom.headroom(), 0);
        backend.set_len(4096).unwrap();
        assert_eq!(headroom.headroom(), MIN_STEP);
        // Within the reservation: no reserving at all.
        plan.fail_all(Files::Any, IoOp::Allocate, ENOSPC);
        backend.set_len(8192).unwrap();
        assert_eq!(headroom.headroom(), MIN_STEP - 4096);
        assert!(!headroom.space_short());
        plan.clear();

        // No room for a step: the file grows without a reservation, and
        // the pool moves past its new end, as large as it was.
        plan.fail_next(Files::Any, IoOp::Allocate, libc::EDQUOT);
        backend.set_len(4 * MIN_STEP).unwrap();
        assert_eq!(headroom.headroom(), MIN_STEP - 4096);
        assert!(headroom.space_short());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 4 * MIN_STEP);

        // No room at all: the growth still works (a failed change of
        // length would make redb refuse every read), with no pool left.
        plan.fail_all(Files::Any, IoOp::Allocate, ENOSPC);
        backend.set_len(5 * MIN_STEP).unwrap();
        assert_eq!(backend.len().unwrap(), 5 * MIN_STEP);
        assert_eq!(headroom.headroom(), 0);
        assert!(!headroom.try_reserve(1));
        assert!(!headroom.redb_failed());
        // Space again: a reservation asked for takes a whole step.
        plan.clear();
        assert!(headroom.try_reserve(4096));
        assert!(!headroom.space_short());
        assert_eq!(headroom.headroom(), 4096 + step(5 * MIN_STEP + 4096));
        // An I/O error reserving is the growth's error, and redb's.
        plan.fail_next(Files::Any, IoOp::Allocate, EIO);
        assert_eq!(errno(backend.set_len(16 * MIN_STEP)), Some(EIO));
        assert!(headroom.redb_failed());
        // Cutting the file frees what was reserved past its end.
        backend.set_len(MIN_STEP).unwrap();
        assert_eq!(headroom.headroom(), 0);
    }

    #[test]
    fn where_free_space_is_short_the_file_grows_without_a_reservation() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let file = FaultyOpener::new(plan.clone())
            .open(&dir.path().join("t.redb"))
            .unwrap();
        let (backend, headroom) = RedbFile::new(file).unwrap();
        // A step through 2 MiB would take more than a quarter of 7 MiB.
        plan.set_free_space(Files::Any, Some(7 * MIN_STEP));
        backend.set_len(MIN_STEP).unwrap();
        assert_eq!(plan.count(&Files::Any, IoOp::Allocate), 0);
        assert_eq!(backend.len().unwrap(), MIN_STEP);
        assert_eq!(headroom.headroom(), 0);
        assert!(headroom.space_short());
        // With room to spare, the next growth reserves a step past it.
        plan.set_free_space(Files::Any, Some(12 * MIN_STEP));
        backend.set_len(2 * MIN_STEP).unwrap();
        assert_eq!(plan.count(&Files::Any, IoOp::Allocate), 1);
        assert_eq!(headroom.headroom(), MIN_STEP);
        assert!(!headroom.space_short());
        // Short of space, a reservation asked for takes exactly what it
        // asks, however little free space there is.
        plan.set_free_space(Files::Any, Some(0));
        assert!(headroom.try_reserve(2 * MIN_STEP));
        assert_eq!(headroom.headroom(), 2 * MIN_STEP);
        assert!(headroom.space_short());
        // And a growth, even within it, leaves it whole past the new end.
        backend.set_len(3 * MIN_STEP).unwrap();
        assert_eq!(headroom.headroom(), 2 * MIN_STEP);
    }

    #[test]
    fn a_write_that_meets_a_full_disk_draws_on_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let path = dir.path().join("t.redb");
        let file = FaultyOpener::new(plan.clone()).open(&path).unwrap();
        let (backend, headroom) = RedbFile::new(file).unwrap();
        backend.set_len(64 * 1024).unwrap();
        let pool = headroom.headroom();
        assert!(pool >= 64 * 1024);
        // A page in a hole on a full disk: the pool is given back and the
        // write made again; the rest of the pool is taken again.
        plan.fail_next(Files::suffix(".redb"), IoOp::Write, ENOSPC);
        backend.write(8192, &[7u8; 4096]).unwrap();
        assert_eq!(headroom.headroom(), pool - 4096);
        let mut page = [0u8; 4096];
        backend.read(8192, &mut page).unwrap();
        assert_eq!(page, [7u8; 4096]);
        assert!(!headroom.redb_failed());
        // With no pool, the full disk is redb's failure, and noted.
        backend.set_len(64 * 1024 + pool).unwrap();
        plan.fail_all(Files::Any, IoOp::Allocate, ENOSPC);
        let grown = 64 * 1024 + pool + 4 * MIN_STEP;
        backend.set_len(grown).unwrap();
        assert_eq!(headroom.headroom(), 0);
        plan.fail_next(Files::suffix(".redb"), IoOp::Write, ENOSPC);
        assert_eq!(errno(backend.write(grown - 4096, &page)), Some(ENOSPC));
        assert!(headroom.redb_failed());
        // A new backend is a new start.
        let again = RedbFile::with_headroom(OsOpener.open(&path).unwrap(), &headroom).unwrap();
        assert!(!headroom.redb_failed());
        drop(again);
    }

    #[test]
    fn a_reopened_backend_takes_over_the_stores_headroom() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let (first, headroom) = RedbFile::new(OsOpener.open(&path).unwrap()).unwrap();
        first.set_len(4096).unwrap();
        let second = RedbFile::with_headroom(OsOpener.open(&path).unwrap(), &headroom).unwrap();
        assert_eq!(headroom.headroom(), 0, "follows the new file");
        // The old one changes nothing the new one reserved, even closing.
        first.set_len(8192).unwrap();
        first.close().unwrap();
        second.set_len(16384).unwrap();
        assert_eq!(headroom.headroom(), MIN_STEP);
    }

    #[test]
    fn redb_locks_its_file_as_with_its_own_backend() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let open = || {
            let (backend, _) = RedbFile::new(OsOpener.open(&path).unwrap()).unwrap();
            redb::Builder::new().create_with_backend(backend)
        };
        let db = open().unwrap();
        fill(&db, 0, 1).unwrap();
        assert!(matches!(
            open(),
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
        ));
        assert!(matches!(
            redb::Database::create(&path),
            Err(redb::DatabaseError::DatabaseAlreadyOpen)
        ));
        drop(db);
        let db = open().unwrap();
        let read = redb::ReadableDatabase::begin_read(&db).unwrap();
        let table = read.open_table(CHUNKS).unwrap();
        assert_eq!(redb::ReadableTableMetadata::len(&table).unwrap(), 1);
    }
}
