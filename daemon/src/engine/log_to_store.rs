//! Moving what the log holds into the store: a durable redb commit, so
//! that a restart needs no record of the log, and copying chunks the log
//! keeps into the store before its records go over them (see [`crate::wal`], "Wrapping").

use std::time::{Duration, Instant};

use super::compaction::COMPACT_RETRY_DELAY;
use super::writer::Writer;
use crate::syncer::Durable;
use crate::wal::CopyPace;

/// How long commits may stay in the write-ahead log alone before an idle
/// writer commits the store durably (so that a restart has little to replay).
pub(super) const DURABLE_COMMIT_AFTER: Duration = Duration::from_secs(1);

impl Writer {
    /// When the log's records are getting near chunks it keeps for the
    /// store, copies a step of them into the store at `pace`, and commits
    /// it durably when the records need to go over them (see [`crate::wal`],
    /// "Wrapping"). Idle, or between batches once the records come near,
    /// so that a full log rarely holds a commit up.
    pub(super) fn copy_log_chunks(&mut self, pace: CopyPace) {
        if !self.copying_ready() {
            return;
        }
        match self.store.copy_from_log(pace) {
            Ok(true) => self.commit_durably(),
            Ok(false) => {}
            Err(e) => {
                self.copying_paused_until = Some(Instant::now() + COMPACT_RETRY_DELAY);
                self.after_failure("copying chunks from the log into the store", &e);
            }
        }
    }

    /// Whether copying chunks from the log may run now: the store is
    /// healthy and copying is not resting after a failure.
    pub(super) fn copying_ready(&self) -> bool {
        self.healthy
            && self
                .copying_paused_until
                .is_none_or(|t| Instant::now() >= t)
    }

    /// Makes the store hold every commit itself, so that no record of the
    /// log is needed for a replay; after a failed sync of the log, also
    /// what it could not sync.
    pub(super) fn commit_durably(&mut self) {
        match self.store.commit_durably() {
            Ok(()) => self.syncer.after(Durable::Committed, Box::new(|_| {})),
            Err(e) => self.after_failure("committing the store durably", &e),
        }
    }
}
