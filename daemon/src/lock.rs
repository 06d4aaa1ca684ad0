//! One daemon per state directory.
//!
//! The lock is an advisory POSIX record lock (`fcntl(F_SETLK)`) on
//! `tetherd.lock` inside the state dir, holding the owner's pid as text.
//! The kernel drops the lock when the process dies, however it dies, so a
//! `kill -9` never leaves a stale lock behind; the pid is only there to
//! name the holder in the refusal.
//!
//! Not `flock`: that lock belongs to the open file, which a child shares
//! from `fork` until its `exec` closes the descriptor. A daemon killed
//! while starting a shim left the lock with the half-started child for a
//! moment, and a restart just then was refused. A record lock belongs to
//! the process alone and is never inherited. (It is also dropped when the
//! process closes any descriptor of the file: only this one is opened.)

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;
use rustix::io::Errno;

use crate::{Error, Result};

/// Holds the state directory's lock until dropped.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
    path: PathBuf,
}

impl StateLock {
    /// Takes the lock of `state_dir`, or fails at once naming the holder.
    pub fn acquire(state_dir: &Path) -> Result<StateLock> {
        let path = state_dir.join("tetherd.lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("cannot open lock file {}", path.display()), e))?;
        match try_lock(&file) {
            Ok(true) => {}
            Ok(false) => {
                let mut holder = String::new();
                // Best effort: the holder may be mid-write of its pid.
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "another tetherd".to_owned(),
                    pid => format!("tetherd pid {pid}"),
                };
                return Err(Error::AlreadyRunning {
                    dir: state_dir.to_owned(),
                    holder,
                });
            }
            Err(e) => {
                return Err(Error::io(format!("cannot lock {}", path.display()), e));
            }
        }
        let write_pid = |file: &mut File| -> std::io::Result<()> {
            file.set_len(0)?;
            file.seek(SeekFrom::Start(0))?;
            writeln!(file, "{}", std::process::id())?;
            file.flush()
        };
        write_pid(&mut file)
            .map_err(|e| Error::io(format!("cannot write lock file {}", path.display()), e))?;
        // Narrowed by the holder only, once it holds the lock.
        crate::store_io::keep_private(&file, &path)
            .map_err(|e| Error::io("cannot keep the lock file private", e))?;
        Ok(StateLock { _file: file, path })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes a write lock on the whole of `file` for this process; `false`
/// when another process holds one.
fn try_lock(file: &File) -> io::Result<bool> {
    // rustix's non-blocking exclusive `fcntl_lock` is `F_SETLK` with
    // `F_WRLCK` from offset 0 to the end of the file, however it grows: a
    // POSIX record lock, not `flock` (see the module docs).
    match rustix::fs::fcntl_lock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(true),
        // POSIX lets either say that another process holds the lock.
        Err(e) if e == Errno::ACCESS || e == Errno::AGAIN => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    /// Exit code of the probe when the lock was refused to it.
    const REFUSED: i32 = 3;

    #[test]
    fn a_child_forked_but_not_yet_started_does_not_hold_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let lock = StateLock::acquire(dir.path()).unwrap();
        // A child with every descriptor of this process, the lock file's
        // included, as a shim has between its fork and its exec.
        let starting = fork(|| {
            std::thread::sleep(Duration::from_secs(2));
            0
        });
        drop(lock);
        // Another process asks for the lock while that child still has
        // the descriptor: the lock went with its owner's hold on it.
        let probe = OpenOptions::new()
            .read(true)
            .write(true)
            .open(dir.path().join("tetherd.lock"))
            .unwrap();
        let probing = fork(move || match try_lock(&probe) {
            Ok(true) => 0,
            _ => REFUSED,
        });
        assert_eq!(exit_code(probing), 0, "the lock was held by the child");
        assert_eq!(exit_code(starting), 0);
        // And this process can take it again.
        StateLock::acquire(dir.path()).unwrap();
    }

    /// Forks a child that runs `child` and exits with what it returns.
    fn fork(child: impl FnOnce() -> i32) -> libc::pid_t {
        // SAFETY: the child only sleeps, takes a record lock and exits,
        // none of which needs a lock another thread may have held.
        #[allow(unsafe_code)]
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                libc::_exit(child());
            }
            pid
        }
    }

    fn exit_code(pid: libc::pid_t) -> i32 {
        let pid = rustix::process::Pid::from_raw(pid).unwrap();
        let (waited, status) =
            rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty())
                .unwrap()
                .unwrap();
        assert_eq!(waited, pid);
        status
            .exit_status()
            .unwrap_or_else(|| panic!("the child did not exit: {status:?}"))
    }
}
