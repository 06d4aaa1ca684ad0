//! The syncer: makes logged transactions durable, then runs what waits on
//! them (publishing their frames, answering their commands), in the order
//! they were committed.
//!
//! The writer hands it one job per commit: either a ticket in the
//! write-ahead log (the commit is durable once the log is synced that far)
//! or "already durable" (redb committed it durably itself). One
//! `fdatasync` covers every record appended before it, so a busy writer's
//! commits are synced many at a time, while the writer is already applying
//! the next batch.
//!
//! Two threads share the work: one only syncs the log, whenever more of it
//! is wanted on disk; the other runs the jobs, each once the log is synced
//! through its ticket. So the next sync starts the moment the last one
//! ends, while the jobs it covered are answered: with one thread, the
//! answers (and the store's writeback nudge) sat between every two syncs,
//! and under load a commit waited for them as well as for the disk.
//!
//! After a failed sync nothing appended before it can be trusted to be on
//! disk (a later sync succeeding says nothing about the pages that failed),
//! so from then on every logged job fails, until a job that redb made
//! durable itself comes through: the writer, seeing [`Syncer::failed`],
//! commits the store durably, which makes everything before durable again. Syncs
//! never overlap, so a failure is always seen by the sync that meets it
//! and marks the log broken before the next one starts.
//!
//! When the writer has nothing else to do and no job is waiting here, it
//! may run a job itself ([`Syncer::run_here`]): a lone producer waiting on
//! its ack then waits for one `fdatasync`, not also for a thread to wake.
//!
//! A job nobody waits on closely (a consumer's ack) may share the next
//! job's sync instead of having one of its own ([`Syncer::after_sharing`]):
//! a follower acking as it reads would otherwise put a sync of a few bytes
//! between every few syncs of frames, and the producer's next ack behind
//! it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::metrics::Metrics;
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
    /// Whether it may wait up to [`SHARE_WAIT`] for the next job's sync.
    shares: bool,
}

/// How long a sharing job waits for another job to sync with it before
/// the log is synced for it alone: longer than the time between two
/// commits of a busy producer, short beside anyone waiting on an ack.
const SHARE_WAIT: Duration = Duration::from_millis(2);

/// A handle to the syncer's threads; dropping it finishes the jobs sent
/// and waits for them.
#[derive(Debug)]
pub struct Syncer {
    tx: Option<mpsc::Sender<Job>>,
    /// The thread running the jobs.
    jobs: Option<JoinHandle<()>>,
    /// The thread syncing the log.
    syncs: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the threads and a job run in place share.
#[derive(Debug)]
struct Shared {
    log: SyncHandle,
    /// Held across every sync of the log, so that syncs never overlap: a
    /// failed writeback is reported to one sync only, and a sync that
    /// started after it must see `broken` set rather than succeed.
    syncing: Mutex<()>,
    state: Mutex<SyncState>,
    /// Signalled when more of the log is wanted synced.
    wanted: Condvar,
    /// Signalled after every sync, done or failed.
    synced: Condvar,
    /// Jobs sent and not yet run to the end.
    pending: AtomicUsize,
    /// Whether a sync failed since the last durable job: `state.broken`,
    /// readable by the writer on every commit without the lock.
    failed: AtomicBool,
    /// Where each sync's duration goes, for `tether metrics`.
    timings: OnceLock<Arc<Metrics>>,
}

#[derive(Debug, Default)]
struct SyncState {
    /// The log's bytes known to be on disk.
    synced: u64,
    /// The log's bytes someone waits to have on disk.
    wanted: u64,
    /// Where the store's writeback was last started.
    nudged: u64,
    /// Why logged jobs fail, after a failed sync (each is told a
    /// [`Error::duplicate`] of it).
    broken: Option<Error>,
    /// Set when the sync thread should end.
    closing: bool,
    /// Syncs run, for tests to count.
    #[cfg(test)]
    syncs: u64,
}

impl Syncer {
    pub fn start(log: SyncHandle) -> Result<Syncer> {
        Syncer::start_sharing_for(log, SHARE_WAIT)
    }

    /// Starts the threads with sharing jobs waiting up to `share_wait`.
    fn start_sharing_for(log: SyncHandle, share_wait: Duration) -> Result<Syncer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            log,
            syncing: Mutex::new(()),
            state: Mutex::new(SyncState::default()),
            wanted: Condvar::new(),
            synced: Condvar::new(),
            pending: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            timings: OnceLock::new(),
        });
        let sync_shared = shared.clone();
        let syncs = std::thread::Builder::new()
            .name("tetherd-syncer".into())
            .spawn(move || sync_shared.sync_when_wanted())
            .map_err(|e| Error::io("cannot start the syncer thread", e))?;
        let mut syncer = Syncer {
            tx: None,
            jobs: None,
            syncs: Some(syncs),
            shared: shared.clone(),
        };
        // Started second: if it cannot start, dropping `syncer` ends the
        // first.
        let jobs = std::thread::Builder::new()
            .name("tetherd-jobs".into())
            .spawn(move || shared.serve(&rx, share_wait))
            .map_err(|e| Error::io("cannot start the syncer's job thread", e))?;
        syncer.tx = Some(tx);
        syncer.jobs = Some(jobs);
        Ok(syncer)
    }

    /// Records the duration of every later sync of the log in `metrics`
    /// (only the first given is kept).
    pub fn time_syncs(&self, metrics: Arc<Metrics>) {
        let _ = self.shared.timings.set(metrics);
    }

    /// Runs `then` once `durable` holds, after every job sent before.
    pub fn after(&self, durable: Durable, then: Then) {
        self.send(Job {
            durable,
            then,
            shares: false,
        });
    }

    /// Like [`Syncer::after`], for a job whose `then` nobody waits on
    /// closely: rather than sync the log for it alone, the job thread
    /// waits up to [`SHARE_WAIT`] for the next job, whose sync then covers
    /// both.
    pub fn after_sharing(&self, durable: Durable, then: Then) {
        self.send(Job {
            durable,
            then,
            shares: true,
        });
    }

    /// Sends `job` to the job thread, counting it pending until it has
    /// run.
    fn send(&self, job: Job) {
        self.shared.pending.fetch_add(1, Ordering::AcqRel);
        let sent = match &self.tx {
            Some(tx) => tx.send(job).map_err(|mpsc::SendError(job)| job),
            None => Err(job),
        };
        if let Err(job) = sent {
            self.shared.pending.fetch_sub(1, Ordering::Release);
            // The thread is gone (it cannot panic short of a bug in a
            // job): say so to whoever waits rather than leave them hanging.
            (job.then)(Err(Error::Invariant(
                "the syncer's job thread stopped".into(),
            )));
        }
    }

    /// Whether every job sent has run: a job run here now keeps its place
    /// in line. Only the writer sends jobs, so once it sees this, it stays
    /// true until the writer sends another.
    pub fn idle(&self) -> bool {
        self.shared.pending.load(Ordering::Acquire) == 0
    }

    /// Runs the job on the calling thread: syncs the log if `durable` asks
    /// for it, then runs `then`. Only when [`Syncer::idle`], or the job
    /// would overtake those before it; otherwise it is sent to the job
    /// thread.
    pub fn run_here(&self, durable: Durable, then: Then) {
        if self.idle() {
            let result = self.shared.wait_durable(durable, true);
            then(result);
            self.shared.nudge_store_writeback();
        } else {
            self.after(durable, then);
        }
    }

    /// What the writer calls between appending a record and committing it
    /// to redb, with the record's ticket: the log is synced that far at
    /// once, ahead of the job that will wait for it, so that the sync and
    /// redb's commit overlap.
    pub fn sync_ahead(&self) -> impl FnOnce(u64) {
        let shared = self.shared.clone();
        move |ticket| {
            let mut state = shared.lock_state();
            shared.want(&mut state, ticket);
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
    /// commit the store durably.
    pub fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// Why the last sync failed, while no durable job has run since.
    pub fn failure(&self) -> Option<Error> {
        if !self.failed() {
            return None;
        }
        self.shared.lock_state().broken.clone()
    }

    /// A handle for readers to wait for the log's sync with.
    pub fn durable_reads(&self) -> DurableReads {
        DurableReads {
            shared: self.shared.clone(),
        }
    }

    /// Finishes the jobs sent and waits for the threads.
    pub fn finish(&mut self) {
        drop(self.tx.take());
        // The jobs first: they may still wait on syncs.
        if let Some(jobs) = self.jobs.take() {
            if jobs.join().is_err() {
                tracing::error!("the syncer's job thread panicked");
            }
        }
        self.shared.lock_state().closing = true;
        self.shared.wanted.notify_all();
        // Readers waiting for a sync that will not come now (see
        // `DurableReads`).
        self.shared.synced.notify_all();
        if let Some(syncs) = self.syncs.take() {
            if syncs.join().is_err() {
                tracing::error!("the syncer thread panicked");
            }
        }
    }
}

/// Lets readers wait until what they read is durable. A logged commit is
/// in redb, where any reader sees it, before the log's sync makes it
/// durable; frames are held back by the hub until then, but checkpoints
/// and step results are read from redb alone. So a read of those waits,
/// after taking its snapshot, until the log is synced through every
/// record appended so far (each commit it can see appended its record
/// before committing): nothing is shown before it is durable. Most
/// reads find the log synced already and do not wait.
///
/// Degraded mode is the exception. While a failed sync leaves the log
/// broken, nothing more becomes durable until the fault clears, and reads
/// must go on (the contract's "every read keeps working"): they are served
/// from what the store holds. That may include a save whose sync failed
/// and which was refused to its sender; the writer writes it again and
/// syncs it once the fault clears, and only a daemon that dies before
/// then loses it.
#[derive(Clone, Debug)]
pub struct DurableReads {
    shared: Arc<Shared>,
}

impl DurableReads {
    /// Waits until the log is synced through every record appended so
    /// far, or returns at once while a failed sync leaves the log broken
    /// (see above). Blocks: only for threads that may (a `spawn_blocking`
    /// read). Fails once the syncer is closing.
    pub fn wait_synced(&self) -> Result<()> {
        let ticket = self.shared.log.written();
        let mut state = self.shared.lock_state();
        loop {
            if state.synced >= ticket || state.broken.is_some() {
                return Ok(());
            }
            if state.closing {
                return Err(Error::ShuttingDown);
            }
            self.shared.want(&mut state, ticket);
            state = self
                .shared
                .synced
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Log bytes synced between two nudges of the store's writeback. Small:
/// the log's next sync waits for whatever store pages the disk is writing,
/// so a little with every few syncs keeps each one short, where 4 MiB at
/// once made one sync in sixty take several ms (W1's p99 5.3 against
/// 3.2 ms with 256 KiB).
const WRITEBACK_EVERY: u64 = 256 * 1024;

impl Shared {
    /// Never held across a sync. A panic while it was held cannot leave
    /// the counters half-updated.
    fn lock_state(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks the sync thread to sync the log through `ticket`. Wakes it
    /// whenever the ticket is not on disk yet, even if it was wanted
    /// before: the sync thread may have stopped for a failed sync since.
    fn want(&self, state: &mut SyncState, ticket: u64) {
        state.wanted = state.wanted.max(ticket);
        if ticket > state.synced {
            self.wanted.notify_one();
        }
    }

    /// The sync thread: syncs the log whenever more of it is wanted on
    /// disk, so that the next sync starts as soon as the last one ends,
    /// while the job thread answers for the last one.
    fn sync_when_wanted(&self) {
        let mut state = self.lock_state();
        loop {
            if state.closing {
                return;
            }
            if state.wanted > state.synced && state.broken.is_none() {
                drop(state);
                self.sync();
                state = self.lock_state();
            } else {
                state = self
                    .wanted
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// Syncs the log once (unless a failed sync left it broken) and tells
    /// those waiting.
    fn sync(&self) {
        let _syncing = self.syncing.lock().unwrap_or_else(PoisonError::into_inner);
        if self.lock_state().broken.is_some() {
            return;
        }
        let started = std::time::Instant::now();
        let result = self.log.sync();
        if let Some(metrics) = self.timings.get() {
            metrics.synced(started.elapsed());
        }
        let mut state = self.lock_state();
        #[cfg(test)]
        {
            state.syncs += 1;
        }
        match result {
            Ok(covered) => state.synced = state.synced.max(covered),
            Err(e) => {
                // Not logged here: the writer enters degraded mode, which
                // logs the fault once (see `crate::degraded`).
                let path = self.log.path().display();
                tracing::debug!("syncing the log {path} failed: {e}");
                state.broken = Some(Error::storage(
                    format!("I/O error on {path}: cannot sync it"),
                    e,
                ));
                self.failed.store(true, Ordering::Release);
            }
        }
        drop(state);
        self.synced.notify_all();
    }

    /// The job thread: runs the jobs in the order they come, a sharing one
    /// together with the next if it comes within `share_wait`.
    fn serve(&self, rx: &mpsc::Receiver<Job>, share_wait: Duration) {
        while let Ok(job) = rx.recv() {
            let next = if job.shares {
                rx.recv_timeout(share_wait).ok()
            } else {
                None
            };
            let ran = match next {
                Some(next) => {
                    self.run_sharing(job, next);
                    2
                }
                None => {
                    self.run(job);
                    1
                }
            };
            self.pending.fetch_sub(ran, Ordering::Release);
            self.nudge_store_writeback();
        }
    }

    fn run(&self, job: Job) {
        let result = self.wait_durable(job.durable, false);
        (job.then)(result);
    }

    /// Runs a sharing job and the one sent after it: the later one is
    /// made durable first (a sync covers every record appended before it,
    /// so the earlier record with it; a durable redb commit covers every
    /// commit before it), then the jobs run in the order they were sent.
    fn run_sharing(&self, first: Job, second: Job) {
        let second_result = self.wait_durable(second.durable, false);
        let first_result = self.wait_durable(first.durable, false);
        (first.then)(first_result);
        (second.then)(second_result);
    }

    /// Waits until `durable` holds; `here` syncs on the calling thread
    /// (the writer, with no job waiting) instead of waking the sync thread.
    fn wait_durable(&self, durable: Durable, here: bool) -> Result<()> {
        let ticket = match durable {
            Durable::Committed => {
                let mut state = self.lock_state();
                if state.broken.take().is_some() {
                    // What was wanted before is durable in the store now:
                    // the sync thread must not sync for it again (on a
                    // failing disk that would break the log at once).
                    // Jobs after this one want their own tickets.
                    state.wanted = state.synced;
                }
                self.failed.store(false, Ordering::Release);
                return Ok(());
            }
            Durable::Nothing => return Ok(()),
            Durable::Logged(ticket) => ticket,
        };
        let mut state = self.lock_state();
        loop {
            if let Some(broken) = &state.broken {
                return Err(broken.clone());
            }
            if state.synced >= ticket {
                return Ok(());
            }
            if here {
                drop(state);
                self.sync();
                state = self.lock_state();
            } else {
                self.want(&mut state, ticket);
                state = self
                    .synced
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// Starts the store's writeback after every [`WRITEBACK_EVERY`] of log
    /// synced; from the job thread, so that the next sync does not wait
    /// for it.
    fn nudge_store_writeback(&self) {
        let mut state = self.lock_state();
        if state.synced - state.nudged >= WRITEBACK_EVERY {
            state.nudged = state.synced;
            drop(state);
            self.log.start_store_writeback();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Mutex;
    use std::thread::ThreadId;

    use super::*;
    use crate::store_io::{OsFile, OsOpener};
    use crate::wal::Wal;

    /// A syncer over a real log in a temporary directory.
    fn syncer() -> (tempfile::TempDir, Wal, Syncer) {
        syncer_sharing_for(SHARE_WAIT)
    }

    /// [`syncer`] with sharing jobs waiting up to `share_wait`.
    fn syncer_sharing_for(share_wait: Duration) -> (tempfile::TempDir, Wal, Syncer) {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(&dir.path().join("tether.wal"), 1024 * 1024, &OsOpener).unwrap();
        let syncer = Syncer::start_sharing_for(wal.sync_handle(None), share_wait).unwrap();
        (dir, wal, syncer)
    }

    type Seen = Arc<Mutex<Vec<(&'static str, ThreadId)>>>;

    /// The names of the jobs run so far, in order.
    fn names(seen: &Seen) -> Vec<&'static str> {
        seen.lock().unwrap().iter().map(|(name, _)| *name).collect()
    }

    /// A job that notes its name and the thread it ran on.
    fn note(seen: &Seen, name: &'static str) -> Then {
        let seen = seen.clone();
        Box::new(move |result| {
            result.unwrap();
            seen.lock()
                .unwrap()
                .push((name, std::thread::current().id()));
        })
    }

    /// Waits up to 10 s for `done`; fails saying what never happened.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "{what}");
            std::thread::yield_now();
        }
    }

    /// Waits for the job thread to count its last job done, which it does just
    /// after the job has run (and told `wait_for_jobs`).
    fn wait_until_idle(syncer: &Syncer) {
        wait_until("the syncer never became idle", || syncer.idle());
    }

    /// Like [`note`], for a job that holds the job thread inside it until
    /// the returned sender is sent to.
    fn held(seen: &Seen, name: &'static str) -> (mpsc::Sender<()>, Then) {
        let (release, held) = mpsc::channel::<()>();
        let note = note(seen, name);
        let then: Then = Box::new(move |result| {
            held.recv().unwrap();
            note(result);
        });
        (release, then)
    }

    /// Appends a small record to the log; returns its ticket.
    fn append(wal: &mut Wal) -> u64 {
        let mut record = crate::wal::RecordBuf::new();
        record.push(&crate::wal::Op::NextStreamId(7)).unwrap();
        wal.append(&mut record).unwrap()
    }

    fn syncs(syncer: &Syncer) -> u64 {
        syncer.shared.state.lock().unwrap().syncs
    }

    #[test]
    fn a_sharing_job_is_covered_by_the_next_jobs_sync() {
        // Waits long enough for this test to look before the next job.
        let (_dir, mut wal, syncer) = syncer_sharing_for(Duration::from_secs(60));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ack = append(&mut wal);
        syncer.after_sharing(Durable::Logged(ack), note(&seen, "ack"));
        // Not synced alone: it waits for the next job. (A thread kept
        // from running for this long could only make the test pass.)
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(seen.lock().unwrap().is_empty(), "the ack was synced alone");
        let frames = append(&mut wal);
        syncer.after(Durable::Logged(frames), note(&seen, "frames"));
        syncer.wait_for_jobs();
        assert_eq!(names(&seen), ["ack", "frames"]);
        assert_eq!(syncs(&syncer), 1);
        wait_until_idle(&syncer);
    }

    #[test]
    fn a_sharing_job_with_nothing_after_it_is_synced_alone() {
        let (_dir, mut wal, syncer) = syncer();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ack = append(&mut wal);
        syncer.after_sharing(Durable::Logged(ack), note(&seen, "ack"));
        wait_until_idle(&syncer);
        assert_eq!(names(&seen), ["ack"]);
        assert_eq!(syncs(&syncer), 1);
    }

    #[test]
    fn an_idle_syncer_lets_the_caller_run_the_job() {
        let (_dir, _wal, syncer) = syncer();
        let seen = Arc::new(Mutex::new(Vec::new()));
        syncer.after(Durable::Nothing, note(&seen, "sent"));
        syncer.wait_for_jobs();
        wait_until_idle(&syncer);
        syncer.run_here(Durable::Logged(0), note(&seen, "here"));
        assert_eq!(names(&seen), ["sent", "here"]);
        let seen = seen.lock().unwrap();
        assert_ne!(seen[0].1, std::thread::current().id());
        assert_eq!(seen[1].1, std::thread::current().id());
    }

    #[test]
    fn a_job_run_here_never_overtakes_one_still_waiting() {
        let (_dir, _wal, syncer) = syncer();
        let seen = Arc::new(Mutex::new(Vec::new()));
        // The thread is held inside the first job until released.
        let (release, first) = held(&seen, "first");
        syncer.after(Durable::Nothing, first);
        assert!(!syncer.idle());
        syncer.run_here(Durable::Nothing, note(&seen, "second"));
        assert!(seen.lock().unwrap().is_empty(), "the second job ran first");
        release.send(()).unwrap();
        syncer.wait_for_jobs();
        assert_eq!(names(&seen), ["first", "second"]);
        let seen = seen.lock().unwrap();
        // Both on the job thread: the second was sent there.
        assert_eq!(seen[0].1, seen[1].1);
        assert_ne!(seen[1].1, std::thread::current().id());
        wait_until_idle(&syncer);
    }

    #[test]
    fn the_log_is_synced_while_a_job_is_still_running() {
        let (_dir, mut wal, syncer) = syncer();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (release, first) = held(&seen, "first");
        let ticket = append(&mut wal);
        syncer.after(Durable::Logged(ticket), first);
        let synced_through = |ticket: u64| {
            wait_until(&format!("the log was not synced through {ticket}"), || {
                syncer.shared.lock_state().synced >= ticket
            });
        };
        synced_through(ticket);
        // The first job now holds the job thread; the next record's sync
        // is not held up behind it.
        let next = append(&mut wal);
        (syncer.sync_ahead())(next);
        synced_through(next);
        assert_eq!(syncs(&syncer), 2);
        assert!(seen.lock().unwrap().is_empty(), "the first job ended early");
        release.send(()).unwrap();
        syncer.after(Durable::Logged(next), note(&seen, "second"));
        syncer.wait_for_jobs();
        assert_eq!(names(&seen), ["first", "second"]);
        assert_eq!(syncs(&syncer), 2);
        wait_until_idle(&syncer);
    }

    #[test]
    fn a_failed_sync_fails_logged_jobs_until_a_durable_commit() {
        // A character device cannot be synced: every sync fails.
        let path = std::path::Path::new("/dev/null");
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        let file = Arc::new(OsFile::new(file));
        let syncer = Syncer::start(SyncHandle::over(file, path, 10)).unwrap();
        let results = Arc::new(Mutex::new(Vec::new()));
        let keep = |name: &'static str| -> Then {
            let results = results.clone();
            Box::new(move |result: Result<()>| {
                let result = result.map_err(|e| e.to_string());
                results.lock().unwrap().push((name, result));
            })
        };
        syncer.after(Durable::Logged(10), keep("first"));
        syncer.wait_for_jobs();
        assert!(syncer.failed());
        // Below what the failed sync was for: failed all the same, and
        // without another sync.
        syncer.after(Durable::Logged(5), keep("below"));
        syncer.after(Durable::Committed, keep("persisted"));
        syncer.wait_for_jobs();
        assert!(!syncer.failed());
        assert_eq!(syncs(&syncer), 1);
        // After the durable commit a job is synced for again (and fails
        // again here), even one whose ticket was wanted before the log
        // broke, rather than waited on for ever.
        syncer.after(Durable::Logged(10), keep("again"));
        let (tx, rx) = mpsc::channel();
        syncer.after(Durable::Nothing, Box::new(move |_| tx.send(()).unwrap()));
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            // Dropping it would wait for the stuck thread.
            std::mem::forget(syncer);
            panic!("a job waited for a sync that never came");
        }
        let error = "storage error: I/O error on /dev/null: cannot sync it: \
                     Invalid argument (os error 22)";
        let results = results.lock().unwrap().clone();
        assert_eq!(
            results,
            [
                ("first", Err(error.to_string())),
                ("below", Err(error.to_string())),
                ("persisted", Ok(())),
                ("again", Err(error.to_string())),
            ]
        );
        assert!(syncer.failed());
        assert_eq!(syncs(&syncer), 2);
    }
}
