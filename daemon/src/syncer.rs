//! The syncer thread: makes logged transactions durable, then runs what
//! waits on them (publishing their frames, answering their commands), in
//! the order they were committed.
//!
//! The writer hands it one job per commit: either a ticket in the
//! write-ahead log (the commit is durable once the log is synced that far)
//! or "already durable" (redb committed it durably itself). One
//! `fdatasync` covers every record appended before it, so a busy writer's
//! commits are synced many at a time, while the writer is already applying
//! the next batch.
//!
//! After a failed sync nothing appended before it can be trusted to be on
//! disk (a later sync succeeding says nothing about the pages that failed),
//! so from then on every logged job fails, until a job that redb made
//! durable itself comes through: the writer, seeing [`Syncer::failed`],
//! persists the store, which makes everything before durable again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::wal::SyncHandle;
use crate::{Error, Result};

/// What a job waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durable {
    /// The log synced through this ticket.
    Logged(u64),
    /// Nothing: redb's own commit was durable, which also makes every
    /// logged commit before it durable (so it ends a failed sync's effect).
    Committed,
    /// Nothing, and no commit was made: the job only keeps its place in
    /// line (an answer that reports a failure, the hub's reset).
    Nothing,
}

/// What runs once the job's commit is durable, or with the reason it
/// could not be made so.
pub type Then = Box<dyn FnOnce(Result<()>) + Send>;

struct Job {
    durable: Durable,
    then: Then,
}

/// A handle to the syncer thread; dropping it finishes the jobs sent and
/// waits for the thread.
#[derive(Debug)]
pub struct Syncer {
    tx: Option<mpsc::Sender<Job>>,
    handle: Option<JoinHandle<()>>,
    failed: Arc<AtomicBool>,
}

impl Syncer {
    pub fn start(log: SyncHandle) -> Result<Syncer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let failed = Arc::new(AtomicBool::new(false));
        let flag = failed.clone();
        let handle = std::thread::Builder::new()
            .name("tetherd-syncer".into())
            .spawn(move || run(&log, &rx, &flag))
            .map_err(|e| Error::io("cannot start the syncer thread", e))?;
        Ok(Syncer {
            tx: Some(tx),
            handle: Some(handle),
            failed,
        })
    }

    /// Runs `then` once `durable` holds, after every job sent before.
    pub fn after(&self, durable: Durable, then: Then) {
        let job = Job { durable, then };
        let sent = match &self.tx {
            Some(tx) => tx.send(job).map_err(|mpsc::SendError(job)| job),
            None => Err(job),
        };
        if let Err(job) = sent {
            // The thread is gone (it cannot panic short of a bug in a
            // job): say so to whoever waits rather than leave them hanging.
            (job.then)(Err(Error::Storage("the syncer thread stopped".into())));
        }
    }

    /// What the writer calls between appending a record and committing it
    /// to redb, with the record's ticket: the syncer starts syncing the log
    /// that far at once, ahead of the job that will wait for it, so that
    /// the sync and redb's commit overlap.
    pub fn sync_ahead(&self) -> impl FnOnce(u64) {
        let tx = self.tx.clone();
        move |ticket| {
            if let Some(tx) = tx {
                // Only a head start: if the thread is gone, the job that
                // waits for this ticket says so.
                let _ = tx.send(Job {
                    durable: Durable::Logged(ticket),
                    then: Box::new(|_| {}),
                });
            }
        }
    }

    /// Waits until every job sent so far has run.
    pub fn wait_for_jobs(&self) {
        let (tx, rx) = mpsc::channel();
        self.after(
            Durable::Nothing,
            Box::new(move |_| {
                let _ = tx.send(());
            }),
        );
        // An error means the job ran with the thread gone: nothing to wait for.
        let _ = rx.recv();
    }

    /// Whether a sync failed since the last durable job: the writer must
    /// persist the store.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Finishes the jobs sent and waits for the thread.
    pub fn finish(&mut self) {
        drop(self.tx.take());
        if let Some(handle) = self.handle.take() {
            if handle.join().is_err() {
                tracing::error!("the syncer thread panicked");
            }
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Log bytes synced between two nudges of the store's writeback.
const WRITEBACK_EVERY: u64 = 4 * 1024 * 1024;

fn run(log: &SyncHandle, rx: &mpsc::Receiver<Job>, failed: &AtomicBool) {
    let mut synced = 0u64;
    let mut nudged = 0u64;
    let mut broken: Option<String> = None;
    while let Ok(job) = rx.recv() {
        let result = match job.durable {
            Durable::Committed => {
                broken = None;
                failed.store(false, Ordering::Release);
                Ok(())
            }
            Durable::Nothing => Ok(()),
            Durable::Logged(ticket) => {
                if broken.is_none() && ticket > synced {
                    match log.sync() {
                        Ok(covered) => {
                            synced = covered;
                            if synced - nudged >= WRITEBACK_EVERY {
                                nudged = synced;
                                log.start_store_writeback();
                            }
                        }
                        Err(e) => {
                            tracing::warn!("syncing the log {} failed: {e}", log.path().display());
                            broken =
                                Some(format!("cannot sync the log {}: {e}", log.path().display()));
                            failed.store(true, Ordering::Release);
                        }
                    }
                }
                match &broken {
                    Some(detail) => Err(Error::Storage(detail.clone())),
                    None => Ok(()),
                }
            }
        };
        (job.then)(result);
    }
}
