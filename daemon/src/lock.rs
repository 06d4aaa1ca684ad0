//! One daemon per state directory.
//!
//! The lock is an advisory `flock` on `tetherd.lock` inside the state dir,
//! holding the owner's pid as text. The kernel drops the lock when the
//! process dies, however it dies, so a `kill -9` never leaves a stale lock
//! behind; the pid is only there to name the holder in the refusal.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

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
            .open(&path)
            .map_err(|e| Error::io(format!("cannot open lock file {}", path.display()), e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
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
            Err(TryLockError::Error(e)) => {
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
        Ok(StateLock { _file: file, path })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
