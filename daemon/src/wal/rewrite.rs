//! The log when the disk fails or fills: its records written again after a
//! failed sync, and its file filled ahead so that a full disk is found
//! before a commit rather than by it.

use std::io;

use super::{Layout, Wal};
use crate::{Error, Result};

/// After a failed sync (see [`crate::degraded`]).
impl Wal {
    /// Writes the bytes the store may still need from the log again, as
    /// this process sees them, and syncs the file. After a failed
    /// `fdatasync` the kernel may have dropped the pages it could not
    /// write while still showing them to reads, so a later sync that
    /// succeeds says nothing about them: only writing them again makes
    /// them dirty, and so synced, once more. Wrapping, that is from the
    /// tail (the oldest chunk the store may name) to the records' end;
    /// otherwise from the file's start.
    pub fn rewrite(&self) -> Result<()> {
        let (from, to) = match self.layout {
            Layout::Flat => (0, self.pos),
            Layout::Wrapping => (self.tail, self.pos),
        };
        let mut buf = vec![0u8; REWRITE_PIECE];
        let mut at = from;
        while at < to {
            let physical = self.layout.file_offset(at, self.capacity);
            // A piece never crosses the file's end: wrapping, the next
            // lap's bytes start again at 0.
            let room = match self.layout {
                Layout::Flat => u64::MAX,
                Layout::Wrapping => self.capacity - physical,
            };
            let len = (to - at).min(REWRITE_PIECE as u64).min(room) as usize;
            let piece = &mut buf[..len];
            self.file
                .read_exact_at(piece, physical)
                .map_err(|e| self.rewrite_error("cannot read it back", e))?;
            self.file
                .write_all_at(piece, physical)
                .map_err(|e| self.rewrite_error("cannot write it again", e))?;
            at += len as u64;
        }
        self.file
            .sync_data()
            .map_err(|e| self.rewrite_error("cannot sync it", e))
    }

    /// A failure of [`Wal::rewrite`], worded as the syncer words a failed
    /// sync: `I/O error on FILE: what: ...`.
    fn rewrite_error(&self, what: &str, e: io::Error) -> Error {
        Error::write_failed(format!("I/O error on {}: {what}", self.path.display()), e)
    }
}

impl Wal {
    /// Makes sure a record of `bytes` can be written next: not
    /// wrapping, the file is filled with zeros past where it would end (as
    /// its append would), so that a full disk is found here rather than
    /// by a commit.
    pub fn make_room(&mut self, bytes: u64) -> Result<()> {
        if self.layout == Layout::Wrapping {
            return Ok(());
        }
        let end = (self.pos + bytes).min(self.capacity);
        if end > self.filled {
            self.fill_to(end)?;
        }
        Ok(())
    }
}

/// How much of the log [`Wal::rewrite`] reads and writes at a time.
const REWRITE_PIECE: usize = 1024 * 1024;
