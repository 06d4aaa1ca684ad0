//! The writer: the one thread that owns every write transaction. It waits
//! for a command, takes every command already waiting within the batch
//! bounds, applies them in one transaction and commits it (group commit),
//! then hands the commit to be answered. Between batches, and whenever no
//! command waits, it does the background work: compaction, copying from the
//! log, durable commits, retrying a degraded store.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::answer::AnsweredBy;
use super::apply::Staged;
use super::cache::State;
use super::commands::{Command, Outcome, Reply, Request};
use super::compaction::{AGE_CHECK_INTERVAL, COMPACT_EVERY_BATCHES};
use super::log_to_store::DURABLE_COMMIT_AFTER;
use super::{CheckpointRefs, QueueOptions};
use crate::degraded::{Degradation, Fault, StorageHealth};
use crate::hub::Hub;
use crate::store::Store;
use crate::syncer::{Durable, Syncer};
use crate::wal::CopyPace;
use crate::{Error, Result};

/// How long the writer stays awake for the next command after answering a
/// producer that waits on each ack (see `Writer::stay_awake`). A
/// producer's next frame takes two socket hops and two wake-ups to come
/// back; a sleeping writer adds one more (tens of µs on a virtual CPU).
/// A session waiting on such a producer's ack stays awake as long, at
/// most (see `connection`).
pub(crate) const AWAKE_FOR: Duration = Duration::from_micros(250);

pub(super) fn spawn_writer(writer: Writer) -> Result<JoinHandle<()>> {
    // The writer waits for commands with a timeout (for age retention),
    // which the tokio channel offers only through a runtime.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("tetherd-writer".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build();
            match runtime {
                Ok(runtime) => {
                    let _ = started_tx.send(Ok(()));
                    writer.run(&runtime);
                }
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| Error::io("cannot start the writer thread", e))?;
    match started_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(Error::io("cannot start the writer's timer", e)),
        Err(_) => Err(Error::Invariant(
            "the writer thread died while starting".into(),
        )),
    }
}

enum Wait {
    Command(Command),
    Idle,
    Closed,
}

pub(super) struct Writer {
    pub(super) store: Arc<Store>,
    /// Only ever used from jobs run through `syncer` (on its job thread,
    /// or on this one when it has nothing queued), so that the hub hears
    /// of commits in order and only once they are durable.
    pub(super) hub: Arc<Hub>,
    pub(super) syncer: Syncer,
    pub(super) checkpoint_refs: CheckpointRefs,
    pub(super) opts: QueueOptions,
    pub(super) rx: mpsc::Receiver<Command>,
    pub(super) state: State,
    /// False after a failed commit until the caches are reloaded.
    pub(super) healthy: bool,
    /// Set while the store cannot be written (see [`crate::degraded`]):
    /// writes are refused, background work rests, a retry is scheduled.
    pub(super) degraded: Option<Degradation>,
    pub(super) health: StorageHealth,
    /// Consumers' acks received while degraded, by (stream, consumer):
    /// recorded once writing resumes.
    pub(super) held_acks: BTreeMap<(String, String), u64>,
    /// When degraded mode last ended, and the fault it ended.
    pub(super) cleared_at: Option<(Instant, Fault)>,
    /// The last timestamp given to a frame; frames never go back in time.
    pub(super) last_ts: u64,
    /// Streams that may have frames to compact or expire, oldest first.
    pub(super) dirty: VecDeque<String>,
    pub(super) dirty_set: HashSet<String>,
    pub(super) next_age_check: Instant,
    pub(super) compaction_paused_until: Option<Instant>,
    /// Copying chunks from the log rests until then after it failed (a
    /// full disk), as compaction does: each failure reopens the store.
    pub(super) copying_paused_until: Option<Instant>,
    /// When the writer last answered a lone command itself.
    pub(super) answered_alone: Option<Instant>,
    /// Whether to wait awake for the next command (see
    /// [`Writer::stay_awake`]): the last batch was answered alone, and the
    /// command before it came back within [`AWAKE_FOR`].
    pub(super) awake: bool,
    /// For each (stream, producer) whose appends failed to commit: the
    /// first producer seq that was not stored. Appends of that producer
    /// queued behind the failed ones would otherwise be stored after a gap,
    /// and the resent ones then taken for duplicates and lost; so until
    /// that seq is resent, later ones are refused (a retryable storage
    /// error, answered by a resend from the client's last ack).
    pub(super) failed_from: HashMap<String, HashMap<String, u64>>,
}

impl Writer {
    fn run(mut self, runtime: &tokio::runtime::Runtime) {
        let mut busy_batches = 0;
        loop {
            match self.wait(runtime) {
                Wait::Command(first) => {
                    let quick = self
                        .answered_alone
                        .take()
                        .is_some_and(|t| t.elapsed() < AWAKE_FOR);
                    let batch = self.drain(first);
                    self.process(batch);
                    self.copy_log_chunks(CopyPace::BetweenBatches);
                    self.awake = quick && self.answered_alone.is_some();
                    busy_batches += 1;
                    if busy_batches >= COMPACT_EVERY_BATCHES {
                        busy_batches = 0;
                        self.idle_work();
                    }
                }
                Wait::Idle => {
                    busy_batches = 0;
                    self.idle_work();
                }
                Wait::Closed => break,
            }
        }
        if self.store.not_durable_since().is_some() {
            if let Err(e) = self.store.commit_durably() {
                tracing::warn!("committing the store durably on close failed: {e}");
            }
        }
        // Publishes and answers what the log still had to sync.
        self.syncer.finish();
    }

    /// The next command; `Idle` when there is background work to do and no
    /// command waiting, or a timer is due.
    fn wait(&mut self, runtime: &tokio::runtime::Runtime) -> Wait {
        let idle_work =
            self.compaction_ready() || (self.copying_ready() && self.store.wants_copying());
        let received = if idle_work {
            match self.rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::error::TryRecvError::Empty) => return Wait::Idle,
                Err(mpsc::error::TryRecvError::Disconnected) => None,
            }
        } else {
            if let Some(command) = self.stay_awake() {
                return command;
            }
            match self.next_wakeup() {
                None => runtime.block_on(self.rx.recv()),
                Some(at) => {
                    let deadline = tokio::time::Instant::from_std(at);
                    let rx = &mut self.rx;
                    // The timer must be created inside the runtime.
                    let timed = async move { tokio::time::timeout_at(deadline, rx.recv()).await };
                    match runtime.block_on(timed) {
                        Ok(c) => c,
                        Err(_) => return Wait::Idle,
                    }
                }
            }
        };
        received.map_or(Wait::Closed, Wait::Command)
    }

    /// Waits awake (yielding the CPU to anything else that can run) for
    /// the next command of a producer that sends one frame at a time, then
    /// gives up. Such a producer waits on every round trip, and a writer
    /// woken from sleep makes each one longer; one that sends more than a
    /// command at a time never comes here, and neither does a writer left
    /// alone: the first command that takes longer to come ends it.
    fn stay_awake(&mut self) -> Option<Wait> {
        if !std::mem::take(&mut self.awake) {
            return None;
        }
        let since = self.answered_alone?;
        while since.elapsed() < AWAKE_FOR {
            match self.rx.try_recv() {
                Ok(command) => return Some(Wait::Command(command)),
                Err(mpsc::error::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::error::TryRecvError::Disconnected) => return Some(Wait::Closed),
            }
        }
        None
    }

    fn next_wakeup(&self) -> Option<Instant> {
        if let Some(degraded) = &self.degraded {
            // Nothing else runs while degraded (see `idle_work`): a timer
            // of another kind already due would wake the writer for
            // nothing, over and over.
            return Some(degraded.next_retry());
        }
        let age = self.opts.retention.max_age.map(|_| self.next_age_check);
        let pause = self
            .compaction_paused_until
            .filter(|_| !self.dirty.is_empty());
        let durable = self
            .store
            .not_durable_since()
            .map(|t| t + DURABLE_COMMIT_AFTER);
        [age, pause, durable].into_iter().flatten().min()
    }

    /// Takes every command already waiting, within the batch bounds.
    fn drain(&mut self, first: Command) -> Vec<Command> {
        let (mut frames, mut bytes) = first.request.weight();
        let mut batch = vec![first];
        while frames < self.opts.max_batch_frames && bytes < self.opts.max_batch_bytes {
            let Ok(next) = self.rx.try_recv() else { break };
            let (f, b) = next.request.weight();
            frames += f;
            bytes += b;
            batch.push(next);
        }
        batch
    }

    fn idle_work(&mut self) {
        if self
            .degraded
            .as_ref()
            .is_some_and(|d| d.is_due(Instant::now()))
        {
            self.retry_storage();
        }
        if self.degraded.is_some() {
            return;
        }
        if let Some(t) = self.compaction_paused_until {
            if Instant::now() >= t {
                self.compaction_paused_until = None;
            }
        }
        if self.opts.retention.max_age.is_some() && Instant::now() >= self.next_age_check {
            self.next_age_check = Instant::now() + AGE_CHECK_INTERVAL;
            self.mark_aged();
        }
        if self.compaction_ready() {
            if let Err(e) = self.compact_step() {
                self.compaction_failed(&e);
            }
        }
        self.copy_log_chunks(CopyPace::Idle);
        if self
            .store
            .not_durable_since()
            .is_some_and(|t| t.elapsed() >= DURABLE_COMMIT_AFTER)
        {
            self.commit_durably();
        }
    }

    /// Applies a batch in one transaction, commits it, publishes what it
    /// stored and answers every command.
    fn process(&mut self, batch: Vec<Command>) {
        let mut compactions = Vec::new();
        let mut requests = Vec::with_capacity(batch.len());
        let mut replies = Vec::with_capacity(batch.len());
        // Held until the batch is committed and answered, so that what the
        // budget bounds includes the commit in progress.
        let mut in_flight = Vec::with_capacity(batch.len());
        for command in batch {
            in_flight.push(command.in_flight);
            match command.request {
                Request::Compact => compactions.push(command.reply),
                Request::SetRetention(retention) => {
                    self.set_retention(retention);
                    command.reply.send(Ok(Outcome::Done));
                }
                request => {
                    requests.push(request);
                    replies.push(command.reply);
                }
            }
        }
        if !requests.is_empty() {
            self.commit_batch(requests, replies, std::mem::take(&mut in_flight));
        }
        if !compactions.is_empty() {
            let result = self.compact_all();
            let answers = compactions.into_iter().map(|reply| {
                let result = match &result {
                    Ok(()) => Ok(Outcome::Done),
                    Err(e) => Err(e.clone()),
                };
                (reply, result)
            });
            // The compaction's commits are logged: answered once synced.
            let durable = Durable::Logged(self.store.wal_written());
            self.answer(durable, None, answers.collect(), in_flight);
        }
    }

    fn commit_batch(
        &mut self,
        requests: Vec<Request>,
        replies: Vec<Reply>,
        in_flight: Vec<OwnedSemaphorePermit>,
    ) {
        if let Some(fault) = self.syncer.failure().as_ref().and_then(Fault::of) {
            self.degrade(fault);
        }
        if self.degraded.is_some() {
            self.refuse_while_degraded(requests, replies, in_flight);
            return;
        }
        if !self.healthy {
            if let Err(e) = self.recover() {
                let failed = replies.into_iter().map(|r| (r, Err(e.clone())));
                self.answer(Durable::Nothing, None, failed.collect(), in_flight);
                return;
            }
        }
        // Not wrapping, the frames are written into redb's own pages:
        // refused here, before redb could meet a full disk.
        let bytes: usize = requests.iter().map(|r| r.weight().1).sum();
        let mut room = self.store.make_room_for(bytes as u64);
        if room.is_err() && self.store.not_durable_since().is_some() {
            // Commits made without durability since the last durable
            // commit hold room a durable commit gives back: the pages they
            // may still have to write (see `Store::make_room`), and, on a
            // disk this short, the log's file. After one, the batch may fit.
            self.commit_durably();
            if self.degraded.is_none() {
                room = self.store.make_room_for(bytes as u64);
            }
        }
        if let Err(e) = room {
            self.after_failure("commit", &e);
            let failed = replies.into_iter().map(|r| (r, Err(e.clone())));
            self.answer(Durable::Nothing, None, failed.collect(), in_flight);
            return;
        }
        let ts = self.next_ts();
        let mut results: Vec<Result<Outcome>> = Vec::with_capacity(requests.len());
        let mut staged = Staged::default();
        let store = self.store.clone();
        // Only a commit the syncer will sync for gives it a head start.
        let sync_ahead = matches!(self.answered_by(true, replies.iter()), AnsweredBy::Syncer)
            .then(|| self.syncer.sync_ahead());
        let started = Instant::now();
        let committed = store.write_logged(
            |txn| {
                for request in requests {
                    let result = self.apply(txn, request, ts, &mut staged)?;
                    results.push(result);
                }
                self.flush(txn, &staged)
            },
            |ticket| {
                if let Some(sync_ahead) = sync_ahead {
                    sync_ahead(ticket);
                }
            },
        );
        match committed {
            Ok(((), durable)) => {
                self.opts.metrics.committed(started.elapsed());
                let publish = self.publish(staged);
                let answers = replies.into_iter().zip(results).collect();
                self.answer(durable, Some(publish), answers, in_flight);
            }
            Err(e) => {
                // Reopen first, so that readers woken by these answers find
                // a working store.
                self.after_failure("commit", &e);
                self.remember_failed(&staged);
                let mut results = results.into_iter();
                let failed = replies.into_iter().map(|reply| match results.next() {
                    // A refused command was refused before the commit
                    // and would be refused again: say why.
                    Some(Err(refused)) => (reply, Err(refused)),
                    _ => (reply, Err(e.clone())),
                });
                self.answer(Durable::Nothing, None, failed.collect(), in_flight);
            }
        }
    }

    pub(super) fn now_micros() -> u64 {
        tether_protocol::time::now_micros()
    }

    /// A timestamp for the frames of one batch, never earlier than the last.
    fn next_ts(&mut self) -> u64 {
        self.last_ts = self.last_ts.max(Self::now_micros());
        self.last_ts
    }
}
