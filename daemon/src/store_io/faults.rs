//! Failures injected at chosen operations, for tests (built with the
//! `test-hooks` feature, and in this crate's own tests).

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{FileIo, Opener, OsOpener};

/// The operations a [`FaultPlan`] fails and counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    Read,
    Write,
    Sync,
    SetLen,
    Allocate,
}

/// Which files a fault or a count is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Files {
    Any,
    /// Those whose name ends so (`".wal"`, `".redb"`).
    Suffix(String),
}

impl Files {
    pub fn suffix(suffix: &str) -> Files {
        Files::Suffix(suffix.to_owned())
    }

    fn matches(&self, path: &Path) -> bool {
        match self {
            Files::Any => true,
            Files::Suffix(suffix) => path
                .file_name()
                .is_some_and(|name| name.to_string_lossy().ends_with(suffix.as_str())),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Fails with this errno.
    Fail(i32),
    /// Writes the first half, then fails with EIO.
    Tear,
}

#[derive(Debug)]
struct Rule {
    files: Files,
    op: IoOp,
    /// Matching operations to let through first; `None`: fail every
    /// one until cleared.
    skip: Option<u64>,
    fault: Fault,
}

#[derive(Debug, Default)]
struct PlanState {
    rules: Vec<Rule>,
    counts: HashMap<(PathBuf, IoOp), u64>,
    injected: u64,
    /// Free space to report instead of the filesystem's; the last
    /// that matches a file wins.
    free: Vec<(Files, u64)>,
}

/// What to fail, shared by a [`FaultyOpener`] and the test that steers
/// it. Every operation is counted, failed or not, so that a test can
/// count a clean run's operations and then fail each in turn. Errors
/// are real OS errors (`io::Error::from_raw_os_error`), as the code
/// under test would get them from the kernel.
#[derive(Debug, Default)]
pub struct FaultPlan {
    state: Mutex<PlanState>,
}

impl FaultPlan {
    pub fn new() -> Arc<FaultPlan> {
        Arc::new(FaultPlan::default())
    }

    /// Fails the `n`th next `op` on `files` from now (0: the next one)
    /// with `errno`, once.
    pub fn fail_nth(&self, files: Files, op: IoOp, n: u64, errno: i32) {
        self.add(files, op, Some(n), Fault::Fail(errno));
    }

    /// Fails the next `op` on `files` with `errno`, once.
    pub fn fail_next(&self, files: Files, op: IoOp, errno: i32) {
        self.fail_nth(files, op, 0, errno);
    }

    /// Fails every `op` on `files` with `errno` until
    /// [`FaultPlan::clear`].
    pub fn fail_all(&self, files: Files, op: IoOp, errno: i32) {
        self.add(files, op, None, Fault::Fail(errno));
    }

    /// Tears the `n`th next write on `files` (0: the next one): only
    /// its first half is written, and it fails with EIO.
    pub fn tear_nth_write(&self, files: Files, n: u64) {
        self.add(files, IoOp::Write, Some(n), Fault::Tear);
    }

    /// Tears the next write on `files` (see [`FaultPlan::tear_nth_write`]).
    pub fn tear_next_write(&self, files: Files) {
        self.tear_nth_write(files, 0);
    }

    /// Reports `bytes` as the free space of `files` (`None`: the
    /// filesystem's again), for code that decides by it.
    pub fn set_free_space(&self, files: Files, bytes: Option<u64>) {
        let mut state = self.lock();
        state.free.retain(|(f, _)| *f != files);
        if let Some(bytes) = bytes {
            state.free.push((files, bytes));
        }
    }

    /// Drops every fault not injected yet and every free space set;
    /// counts are kept.
    pub fn clear(&self) {
        let mut state = self.lock();
        state.rules.clear();
        state.free.clear();
    }

    /// How many `op`s were made on `files` since the plan was made or
    /// [`FaultPlan::reset_counts`], failed ones included.
    pub fn count(&self, files: &Files, op: IoOp) -> u64 {
        self.lock()
            .counts
            .iter()
            .filter(|((path, o), _)| *o == op && files.matches(path))
            .map(|(_, n)| n)
            .sum()
    }

    /// Starts every count from 0 again.
    pub fn reset_counts(&self) {
        self.lock().counts.clear();
    }

    /// How many operations were failed or torn so far.
    pub fn injected(&self) -> u64 {
        self.lock().injected
    }

    /// Whether faults asked for once are still waiting for their
    /// operation.
    pub fn pending(&self) -> bool {
        self.lock().rules.iter().any(|r| r.skip.is_some())
    }

    fn add(&self, files: Files, op: IoOp, skip: Option<u64>, fault: Fault) {
        self.lock().rules.push(Rule {
            files,
            op,
            skip,
            fault,
        });
    }

    fn free_space(&self, path: &Path) -> Option<u64> {
        let state = self.lock();
        let set = state.free.iter().rev().find(|(f, _)| f.matches(path));
        set.map(|(_, bytes)| *bytes)
    }

    /// Counts `op` on `path` and says which fault, if any, it meets.
    /// Every matching rule sees it, so that each counts its own.
    fn check(&self, path: &Path, op: IoOp) -> Option<Fault> {
        let mut state = self.lock();
        *state.counts.entry((path.to_path_buf(), op)).or_default() += 1;
        let mut hit = None;
        state.rules.retain_mut(|rule| {
            if rule.op != op || !rule.files.matches(path) {
                return true;
            }
            match &mut rule.skip {
                None => {
                    hit = hit.or(Some(rule.fault));
                    true
                }
                Some(0) => {
                    hit = hit.or(Some(rule.fault));
                    false
                }
                Some(n) => {
                    *n -= 1;
                    true
                }
            }
        });
        if hit.is_some() {
            state.injected += 1;
        }
        hit
    }

    fn lock(&self) -> MutexGuard<'_, PlanState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Opens files of the filesystem as [`FaultyFile`]s following `plan`.
#[derive(Clone, Debug)]
pub struct FaultyOpener {
    plan: Arc<FaultPlan>,
}

impl FaultyOpener {
    pub fn new(plan: Arc<FaultPlan>) -> FaultyOpener {
        FaultyOpener { plan }
    }

    fn wrap(&self, path: &Path, inner: Arc<dyn FileIo>) -> Arc<dyn FileIo> {
        Arc::new(FaultyFile {
            inner,
            path: path.to_path_buf(),
            plan: self.plan.clone(),
        })
    }
}

impl Opener for FaultyOpener {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        Ok(self.wrap(path, OsOpener.open(path)?))
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        Ok(self.wrap(path, OsOpener.open_read(path)?))
    }
}

/// A file of the filesystem whose reads, writes, syncs, changes of
/// length and reservations go through a [`FaultPlan`] first, and whose
/// free space the plan can set.
#[derive(Debug)]
pub struct FaultyFile {
    inner: Arc<dyn FileIo>,
    path: PathBuf,
    plan: Arc<FaultPlan>,
}

impl FaultyFile {
    /// Fails `op` when the plan says so.
    fn gate(&self, op: IoOp) -> io::Result<()> {
        match self.plan.check(&self.path, op) {
            Some(Fault::Fail(errno)) => Err(io::Error::from_raw_os_error(errno)),
            Some(Fault::Tear) => Err(io::Error::from_raw_os_error(libc::EIO)),
            None => Ok(()),
        }
    }
}

impl FileIo for FaultyFile {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.gate(IoOp::Read)?;
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        match self.plan.check(&self.path, IoOp::Write) {
            Some(Fault::Fail(errno)) => Err(io::Error::from_raw_os_error(errno)),
            Some(Fault::Tear) => {
                self.inner.write_all_at(&data[..data.len() / 2], offset)?;
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            None => self.inner.write_all_at(data, offset),
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.gate(IoOp::SetLen)?;
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.gate(IoOp::Sync)?;
        self.inner.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        self.gate(IoOp::Allocate)?;
        self.inner.allocate(offset, len)
    }

    fn free_space(&self) -> io::Result<u64> {
        match self.plan.free_space(&self.path) {
            Some(bytes) => Ok(bytes),
            None => self.inner.free_space(),
        }
    }

    fn start_writeback(&self) -> io::Result<()> {
        self.inner.start_writeback()
    }

    fn lock_handle(&self) -> io::Result<Option<File>> {
        self.inner.lock_handle()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store_io::tests::{errno, EIO, ENOSPC};

    #[test]
    fn a_plan_fails_exactly_the_op_asked_for_with_the_errno_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let opener = FaultyOpener::new(plan.clone());
        let wal = opener.open(&dir.path().join("t.wal")).unwrap();
        let redb = opener.open(&dir.path().join("t.redb")).unwrap();
        let (log, any) = (Files::suffix(".wal"), Files::Any);

        // The third write to the log from now, and only that one.
        plan.fail_nth(log.clone(), IoOp::Write, 2, ENOSPC);
        assert!(plan.pending());
        let mut results = Vec::new();
        for i in 0..4u64 {
            results.push(errno(wal.write_all_at(b"x", i)));
            redb.write_all_at(b"y", i).unwrap();
        }
        assert_eq!(results, [None, None, Some(ENOSPC), None]);
        assert!(!plan.pending());
        assert_eq!(std::fs::read(dir.path().join("t.wal")).unwrap(), b"xx\0x");

        // The next sync of any file, once.
        plan.fail_next(any.clone(), IoOp::Sync, EIO);
        assert_eq!(errno(redb.sync_data()), Some(EIO));
        wal.sync_data().unwrap();
        redb.sync_data().unwrap();

        // Every change of the store's length until cleared.
        plan.fail_all(Files::suffix(".redb"), IoOp::SetLen, libc::EROFS);
        for _ in 0..3 {
            assert_eq!(errno(redb.set_len(100)), Some(libc::EROFS));
        }
        wal.set_len(100).unwrap();
        assert!(!plan.pending(), "failing all is not waiting for one");
        plan.clear();
        redb.set_len(100).unwrap();

        plan.fail_next(log.clone(), IoOp::Allocate, libc::EDQUOT);
        assert_eq!(errno(wal.allocate(0, 4096)), Some(libc::EDQUOT));
        wal.allocate(0, 4096).unwrap();
        plan.fail_next(log.clone(), IoOp::Read, EIO);
        let mut buf = [0u8; 1];
        assert_eq!(errno(wal.read_exact_at(&mut buf, 0)), Some(EIO));
        wal.read_exact_at(&mut buf, 0).unwrap();

        // Everything was counted, failed or not.
        assert_eq!(plan.count(&log, IoOp::Write), 4);
        assert_eq!(plan.count(&any, IoOp::Write), 8);
        assert_eq!(plan.count(&any, IoOp::Sync), 3);
        assert_eq!(plan.count(&Files::suffix(".redb"), IoOp::SetLen), 4);
        assert_eq!(plan.count(&log, IoOp::Allocate), 2);
        assert_eq!(plan.injected(), 1 + 1 + 3 + 1 + 1);
        plan.reset_counts();
        assert_eq!(plan.count(&any, IoOp::Write), 0);
    }

    #[test]
    fn a_torn_write_leaves_its_first_half_and_fails_with_eio() {
        let dir = tempfile::tempdir().unwrap();
        let plan = FaultPlan::new();
        let path = dir.path().join("t.wal");
        let file = FaultyOpener::new(plan.clone()).open(&path).unwrap();
        plan.tear_next_write(Files::suffix(".wal"));
        assert_eq!(errno(file.write_all_at(b"abcdefgh", 0)), Some(EIO));
        assert_eq!(std::fs::read(&path).unwrap(), b"abcd");
        file.write_all_at(b"ijkl", 4).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abcdijkl");
    }
}
