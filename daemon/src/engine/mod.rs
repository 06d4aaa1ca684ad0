//! The engine: appends become seqs, acks become compaction. This file is
//! its front door: the [`Queue`] handle, whose methods are the commands the
//! rest of the daemon gives it, and opening and closing it.
//!
//! [`Queue`] is a cheap handle. Behind it one dedicated thread, the writer,
//! owns every write transaction. It blocks for a command, then takes every
//! command already waiting (up to a bound), applies them all in one write
//! transaction and commits it: through the write-ahead log (see
//! [`crate::wal`]) when the log can describe it, else with redb's immediate
//! durability. One fsync covers many frames (group commit). The
//! [`Syncer`] thread syncs the log and only then hands the committed
//! frames to the [`Hub`] and answers each command, so nothing is delivered
//! or acknowledged before it is durable, while the writer already applies
//! the next batch.
//!
//! The writer's parts, one file each:
//!
//! * `commands`: what the handle sends the writer, and the replies.
//! * `writer`: the writer thread: waiting, batching, committing a batch.
//! * `cache`: the writer's cache of the committed state.
//! * `apply`: each command applied to the transaction and the cache.
//! * `answer`: who makes a commit durable and answers it, and publishing.
//! * `compaction`: compaction and retention.
//! * `faults`: failed writes and degraded mode.
//! * `log_to_store`: copying chunks from the log, durable commits.

mod answer;
mod apply;
mod cache;
mod commands;
mod compaction;
mod faults;
mod gates;
mod log_to_store;
mod writer;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use tether_protocol::{
    Checkpoint, CheckpointEntry, CheckpointFull, CheckpointMeta, CheckpointRef, CheckpointSave,
    StepInfo, StreamInfo, UserMeta,
};
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::checkpoint::{self, Resume};
use crate::config::Retention;
use crate::degraded::{Fault, StorageHealth};
use crate::hub::{FollowerBudget, Hub};
use crate::ingest::{self, IngestAppend};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::subscription::Subscription;
use crate::syncer::{DurableReads, Syncer};
use crate::{Error, Result};

use cache::State;
pub use commands::Removed;
use commands::{Command, Reply, Request};
pub use gates::{GateChange, GateOutcome};
use writer::{spawn_writer, Writer};

pub(crate) use writer::AWAKE_FOR;

/// Commands that may wait for the writer. Senders wait (asynchronously)
/// beyond it, which bounds the memory of queued work.
const COMMAND_CAPACITY: usize = 1024;

/// Bytes of commands (payloads plus [`COMMAND_FRAME_OVERHEAD`] per frame)
/// read from clients but not yet committed, across all sessions. A session
/// whose command does not fit waits, and stops reading its socket, so the
/// daemon's memory stays flat however many producers push at once; the
/// rest of their backlog waits in the clients and the kernel. Twice the
/// writer's largest batch, so that one batch queues while one commits.
const IN_FLIGHT_BUDGET: usize = 2 * 4 * 1024 * 1024;

/// What a queued frame costs besides its payload: the decoded append with
/// its names, its outcome and its staged copy for the hub.
const COMMAND_FRAME_OVERHEAD: usize = 320;

/// How the queue batches and what it retains.
#[derive(Clone, Debug)]
pub struct QueueOptions {
    /// Per-stream retention limits.
    pub retention: Retention,
    /// Frames committed together at most (a single larger append call
    /// still commits whole).
    pub max_batch_frames: usize,
    /// Payload bytes committed together at most (same exception).
    pub max_batch_bytes: usize,
    /// Checkpoints kept per execution; saving deletes the older ones.
    /// Taken as at least 1.
    pub checkpoint_keep: usize,
    /// Largest checkpoint (and durable step result) accepted, in bytes.
    pub max_checkpoint_bytes: usize,
    /// The write-ahead log's size (see [`Store::open_with_log`]).
    pub log_capacity: u64,
    /// Opens the store's files (see [`Store::open_with`]).
    pub opener: Arc<dyn crate::store_io::Opener>,
    /// The counters `tether metrics` shows.
    pub metrics: Arc<Metrics>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        Self {
            retention: Retention::default(),
            max_batch_frames: 4096,
            max_batch_bytes: 4 * 1024 * 1024,
            checkpoint_keep: 10,
            max_checkpoint_bytes: 8 * 1024 * 1024,
            log_capacity: crate::wal::DEFAULT_CAPACITY,
            opener: Arc::new(crate::store_io::OsOpener),
            metrics: Arc::new(Metrics::new()),
        }
    }
}

/// The result of one [`IngestAppend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    pub stream: Arc<str>,
    pub producer: Arc<str>,
    pub producer_seq: u64,
    /// The frame's stream seq; for a duplicate, the seq of the producer's
    /// newest stored frame.
    pub seq: u64,
    /// The append was a resend of one already stored and was not stored
    /// again.
    pub duplicate: bool,
}

/// The newest valid checkpoint of each execution that has one, as `ps`
/// shows it. The writer updates it after each commit that saves one.
type CheckpointRefs = Arc<Mutex<HashMap<String, CheckpointRef>>>;

/// A handle to the store and its writer. Clones share them.
#[derive(Clone, Debug)]
pub struct Queue {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<Store>,
    hub: Arc<Hub>,
    checkpoint_refs: CheckpointRefs,
    /// Holds reads of checkpoints and step results until what they saw
    /// is durable.
    durable_reads: DurableReads,
    /// `None` once closing began: new commands are refused.
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Permits for [`IN_FLIGHT_BUDGET`], one per byte.
    in_flight: Arc<Semaphore>,
    /// Whether the store can be written (see [`crate::degraded`]).
    health: StorageHealth,
    metrics: Arc<Metrics>,
    /// Questions and inbox counts (see [`crate::gates`]).
    gates: crate::gates::Gates,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Two mutexes guard a single `Option` that is only taken or read, and
    // the third a map whose every entry is whole on its own, so each value
    // is sound even after a panic elsewhere.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Queue {
    /// Opens (or creates) the store at `store_path`, loads its state and
    /// starts the writer thread.
    pub fn open(store_path: &Path, opts: QueueOptions) -> Result<Queue> {
        let store = Arc::new(Store::open_with(
            store_path,
            opts.log_capacity,
            opts.opener.clone(),
        )?);
        let snapshot = store.load()?;
        let checkpoint_refs = Arc::new(Mutex::new(newest_valid_checkpoints(&store)?));
        let gates = crate::gates::Gates::load(store.load_gates()?);
        let hub = Arc::new(Hub::new(FollowerBudget::default()));
        let health = StorageHealth::default();
        let metrics = opts.metrics.clone();
        let syncer = Syncer::start(store.wal_sync_handle())?;
        syncer.time_syncs(metrics.clone());
        let (tx, rx) = mpsc::channel(COMMAND_CAPACITY);
        let mut writer = Writer {
            store: store.clone(),
            hub: hub.clone(),
            syncer,
            checkpoint_refs: checkpoint_refs.clone(),
            opts,
            rx,
            state: State::default(),
            healthy: true,
            degraded: None,
            health: health.clone(),
            held_acks: BTreeMap::new(),
            cleared_at: None,
            failed_from: HashMap::new(),
            last_ts: 0,
            dirty: VecDeque::new(),
            dirty_set: HashSet::new(),
            next_age_check: Instant::now(),
            compaction_paused_until: None,
            copying_paused_until: None,
            answered_alone: None,
            awake: false,
        };
        writer.install(snapshot);
        // The hub has every stream before anyone can subscribe.
        writer.syncer.wait_for_jobs();
        let durable_reads = writer.syncer.durable_reads();
        let handle = spawn_writer(writer)?;
        Ok(Queue {
            inner: Arc::new(Inner {
                store,
                hub,
                checkpoint_refs,
                durable_reads,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                in_flight: Arc::new(Semaphore::new(IN_FLIGHT_BUDGET)),
                health,
                metrics,
                gates,
            }),
        })
    }

    /// Appends frames. All appends of one call commit together (maybe with
    /// others); resolves after the commit. Streams are created on first
    /// append. Dedupe: an append whose `producer_seq` is at or below the
    /// newest one stored for its (stream, producer) is a duplicate: it is not
    /// stored again, and its outcome carries that producer's newest seq.
    /// An invalid stream or producer name fails the whole call.
    pub async fn append<A: Into<IngestAppend>>(
        &self,
        appends: impl IntoIterator<Item = A>,
    ) -> Result<Vec<AppendOutcome>> {
        let appends: Vec<IngestAppend> = appends.into_iter().map(Into::into).collect();
        if appends.is_empty() {
            return Ok(Vec::new());
        }
        self.submit_append(appends).await?.await
    }

    /// Writes an execution's encoded manifest and appends `events` (kind
    /// [`FrameKind::Event`](tether_protocol::FrameKind::Event)) to the
    /// stream named after the execution, all in one transaction, so that
    /// the stream always tells the story the manifest is in. Resolves after
    /// the commit with the stream's last seq (0 when the stream does not
    /// exist and no event created it).
    pub async fn record_execution(
        &self,
        execution: &str,
        manifest: Vec<u8>,
        events: Vec<Bytes>,
    ) -> Result<u64> {
        let request = Request::Record {
            execution: execution.to_owned(),
            manifest,
            events,
            resume: false,
            from_checkpoint: None,
        };
        let recorded = self.call(request, Reply::Record).await?;
        Ok(recorded.last_seq)
    }

    /// [`Queue::record_execution`] for the start of a restarted attempt:
    /// in the same transaction, after `events`, it looks up the newest
    /// valid checkpoint and appends the event saying what the attempt
    /// resumes from (see [`Resume::event`]). Resolves after the commit with
    /// the stream's last seq and what the attempt resumes from.
    ///
    /// With `from_checkpoint` (`tether resume --checkpoint`), that
    /// checkpoint is copied as the newest, keeping its seq and data, so
    /// that the worker loads it as it loads any newest checkpoint; a
    /// missing or invalid one is [`Error::ExecutionNotFound`] or
    /// [`Error::InvalidRequest`], and nothing is recorded.
    pub async fn record_attempt_start(
        &self,
        execution: &str,
        manifest: Vec<u8>,
        events: Vec<Bytes>,
        from_checkpoint: Option<u64>,
    ) -> Result<(u64, Resume)> {
        let request = Request::Record {
            execution: execution.to_owned(),
            manifest,
            events,
            resume: true,
            from_checkpoint,
        };
        let recorded = self.call(request, Reply::Record).await?;
        Ok((recorded.last_seq, recorded.resume.unwrap_or(Resume::Fresh)))
    }

    /// Stores `save.data` as the execution's newest checkpoint, recording
    /// the execution stream's last seq, and deletes checkpoints beyond the
    /// newest [`QueueOptions::checkpoint_keep`]; resolves once durable. An
    /// unknown execution is [`Error::ExecutionNotFound`], data over
    /// [`QueueOptions::max_checkpoint_bytes`] [`Error::InvalidRequest`].
    pub async fn save_checkpoint(&self, save: CheckpointSave) -> Result<CheckpointMeta> {
        self.save_checkpoint_with(save, UserMeta::new()).await
    }

    /// [`Queue::save_checkpoint`] with user metadata kept beside the data.
    pub async fn save_checkpoint_with(
        &self,
        save: CheckpointSave,
        user_meta: UserMeta,
    ) -> Result<CheckpointMeta> {
        self.call(
            Request::SaveCheckpoint { save, user_meta },
            Reply::Checkpoint,
        )
        .await
    }

    /// The execution's newest valid checkpoint with its user metadata, of
    /// exactly `schema_version` when one is given. `None` when there is
    /// none such.
    pub async fn load_checkpoint_full(
        &self,
        execution: &str,
        schema_version: Option<u32>,
    ) -> Result<Option<CheckpointFull>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| {
            store.find_checkpoint(&execution, |id, record| {
                checkpoint::loadable_full(&execution, id, record, schema_version)
            })
        })
        .await
    }

    /// [`Queue::list_checkpoints`] with each one's user metadata.
    pub async fn list_checkpoints_full(&self, execution: &str) -> Result<Vec<CheckpointEntry>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| {
            store.map_checkpoints(&execution, |id, record| {
                let inspected = checkpoint::inspect(id, record);
                CheckpointEntry {
                    meta: inspected.meta,
                    user_meta: inspected.user_meta,
                }
            })
        })
        .await
    }

    /// The execution's newest valid checkpoint; invalid newer ones are
    /// skipped (and logged). `None` when it has none that is valid.
    pub async fn load_checkpoint(&self, execution: &str) -> Result<Option<Checkpoint>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| {
            store.find_checkpoint(&execution, |id, record| {
                checkpoint::loadable(&execution, id, record)
            })
        })
        .await
    }

    /// The execution's stored checkpoints, newest first, valid or not.
    pub async fn list_checkpoints(&self, execution: &str) -> Result<Vec<CheckpointMeta>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| {
            store.map_checkpoints(&execution, |id, record| {
                checkpoint::inspect(id, record).meta
            })
        })
        .await
    }

    /// The execution's newest valid checkpoint as `ps` shows it.
    pub fn last_checkpoint(&self, execution: &str) -> Option<CheckpointRef> {
        lock(&self.inner.checkpoint_refs).get(execution).copied()
    }

    /// The recorded result of durable step `step` of the execution.
    pub async fn step(&self, execution: &str, step: &str) -> Result<Option<Bytes>> {
        checkpoint::validate_step_name(step)?;
        let (execution, step) = (execution.to_owned(), step.to_owned());
        let result = self
            .read_durable(move |store| store.step(&execution, &step))
            .await?;
        Ok(result.map(Bytes::from))
    }

    /// Records `result` for durable step `step` unless one is recorded
    /// already; resolves once durable with the result kept (the first).
    pub async fn put_step(&self, execution: &str, step: &str, result: Bytes) -> Result<Bytes> {
        checkpoint::validate_step_name(step)?;
        let request = Request::PutStep {
            execution: execution.to_owned(),
            step: step.to_owned(),
            result,
        };
        self.call(request, Reply::Step).await
    }

    /// The durable steps recorded for the execution, in name order.
    pub async fn list_steps(&self, execution: &str) -> Result<Vec<StepInfo>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| store.list_steps(&execution))
            .await
    }

    /// Forgets the named step results of the execution, or all of them
    /// when `steps` is `None`; resolves once durable with how many were
    /// recorded.
    pub async fn clear_steps(&self, execution: &str, steps: Option<Vec<String>>) -> Result<u64> {
        if let Some(steps) = &steps {
            for step in steps {
                checkpoint::validate_step_name(step)?;
            }
        }
        let request = Request::ClearSteps {
            execution: execution.to_owned(),
            steps,
        };
        self.call(request, Reply::Cleared).await
    }

    /// Removes executions (each with its manifest, checkpoints, steps and
    /// stream) and streams, all in one durable commit; a removed stream
    /// leaves a tombstone of its last seq. Names not stored are skipped;
    /// the answer says what was removed. Whether an execution may be
    /// removed (it has ended) is the caller's to check.
    pub async fn remove(&self, executions: Vec<String>, streams: Vec<String>) -> Result<Removed> {
        let request = Request::Remove {
            executions,
            streams,
        };
        let removed = self.call(request, Reply::Removed).await?;
        // Their questions and inboxes went in the same commit.
        self.inner.gates.forget(&removed.executions);
        Ok(removed)
    }

    /// [`Queue::read`] of checkpoints or step results, answered once what
    /// it read is durable (see [`DurableReads`]).
    async fn read_durable<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Store) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let durable = self.inner.durable_reads.clone();
        self.read(move |store| {
            let value = read(store)?;
            durable.wait_synced()?;
            Ok(value)
        })
        .await
    }

    /// Runs a store read on a blocking thread.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Store) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.inner.check_open()?;
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || read(&store))
            .await
            .map_err(|e| Error::storage("store read task failed", e))?
    }

    /// Every stored execution manifest as (execution id, encoded manifest).
    pub async fn load_executions(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.inner.check_open()?;
        let store = self.inner.store.clone();
        tokio::task::spawn_blocking(move || store.load_executions())
            .await
            .map_err(|e| Error::storage("store read task failed", e))?
    }

    /// Creates the durable consumer if absent, with nothing acked (its ack is
    /// the stream's first retained seq minus one); returns its ack.
    pub async fn open_consumer(&self, stream: &str, consumer: &str) -> Result<u64> {
        let request = Request::OpenConsumer {
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
        };
        self.call(request, Reply::OpenConsumer).await
    }

    /// Records that `consumer` processed `stream` through `through_seq`;
    /// durable when it resolves. An ack beyond the stream's last seq is
    /// [`Error::InvalidRequest`]; one below the stored ack changes nothing
    /// (acks never go backwards). Unknown consumers are created.
    pub async fn ack(&self, stream: &str, consumer: &str, through_seq: u64) -> Result<()> {
        let request = Request::Ack {
            stream: stream.to_owned(),
            consumer: consumer.to_owned(),
            through_seq,
        };
        self.call(request, Reply::Ack).await
    }

    /// The committed (first_seq, last_seq) of `stream`; `None` if there is
    /// no such stream. An empty stream has `first == last + 1`.
    pub fn stream_range(&self, stream: &str) -> Option<(u64, u64)> {
        self.inner.hub.range(stream)
    }

    /// A durable subscription delivering the seqs after `after_seq`. Without
    /// `follow` it ends with [`SubEvent::End`](crate::subscription::SubEvent)
    /// after the stream's last seq at the time of this call.
    pub fn subscribe(&self, stream: &str, after_seq: u64, follow: bool) -> Result<Subscription> {
        self.inner.check_open()?;
        let (_, last) = self
            .stream_range(stream)
            .ok_or_else(|| Error::StreamNotFound(stream.to_owned()))?;
        if after_seq > last {
            return Err(Error::InvalidRequest(format!(
                "resume after seq {after_seq} is beyond the last seq {last} of stream {stream}"
            )));
        }
        Ok(Subscription::new(
            self.inner.store.clone(),
            self.inner.hub.clone(),
            stream,
            after_seq + 1,
            (!follow).then_some(last),
        ))
    }

    /// A following subscription with no replay: it delivers the frames
    /// committed after this call. It still falls back to the store when it
    /// cannot keep up, so it skips nothing without a gap notice.
    pub fn subscribe_live(&self, stream: &str) -> Result<Subscription> {
        self.inner.check_open()?;
        let registration = self.inner.hub.register(stream)?;
        Ok(Subscription::from_registration(
            self.inner.store.clone(),
            self.inner.hub.clone(),
            stream,
            registration,
        ))
    }

    /// One row per stream, in name order.
    ///
    /// Only what readers can see: redb holds a commit before the log's
    /// sync makes it durable, and the hub learns of it after; a stream or
    /// frame listed in between could be asked for and refused.
    pub async fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        let store = self.inner.store.clone();
        let mut streams = tokio::task::spawn_blocking(move || store.list_streams())
            .await
            .map_err(|e| Error::storage("store read task failed", e))??;
        streams.retain_mut(|info| match self.stream_range(&info.name) {
            None => false,
            Some((_, last)) => {
                if last < info.last_seq {
                    info.frames = info.frames.saturating_sub(info.last_seq - last);
                    info.last_seq = last;
                }
                true
            }
        });
        Ok(streams)
    }

    /// Every stream's name with its committed last seq, in no order.
    pub fn last_seqs(&self) -> Vec<(String, u64)> {
        self.inner.hub.last_seqs()
    }

    /// How many streams exist.
    pub fn stream_count(&self) -> u64 {
        self.inner.hub.stream_count()
    }

    /// Runs every compaction and retention batch that is due now (age
    /// retention included), then resolves. Compaction otherwise runs by
    /// itself whenever the writer is idle; this makes it observable.
    pub async fn compact(&self) -> Result<()> {
        self.call(Request::Compact, Reply::Compact).await
    }

    /// Replaces the retention limits (a config reload). Every stream is
    /// checked against them by the next compaction pass, which runs as soon
    /// as the writer is idle; resolves once the writer has them.
    pub async fn set_retention(&self, retention: Retention) -> Result<()> {
        self.call(Request::SetRetention(retention), Reply::Compact)
            .await
    }

    /// Reads every stored frame and checks it (see [`Store::verify`]).
    pub async fn verify(&self) -> Result<String> {
        self.read(|store| store.verify()).await
    }

    /// The fault the store is degraded by, if writes are refused now.
    pub fn storage_fault(&self) -> Option<Fault> {
        self.inner.health.fault()
    }

    /// The counters `tether metrics` shows.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The bytes of the store's files on disk, the log's included.
    pub fn store_bytes(&self) -> u64 {
        self.inner.store.file_size()
    }

    /// Finishes the commands already sent (the commit in flight among
    /// them), refuses new ones with [`Error::ShuttingDown`], waits for the
    /// writer thread and closes the database. Subscriptions then end with
    /// [`Error::ShuttingDown`].
    pub async fn close(&self) -> Result<()> {
        drop(lock(&self.inner.tx).take());
        let handle = lock(&self.inner.writer).take();
        if let Some(handle) = handle {
            let joined = tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(|e| Error::storage("waiting for the writer failed", e))?;
            if joined.is_err() {
                return Err(Error::Invariant("the writer thread panicked".into()));
            }
        }
        self.inner.hub.close();
        self.inner.store.close()
    }

    /// Sends one request to the writer and waits for its answer.
    async fn call<T: Send + 'static>(
        &self,
        request: Request,
        reply: fn(oneshot::Sender<Result<T>>) -> Reply,
    ) -> Result<T> {
        self.submit(request, reply).await?.await
    }

    /// Hands `request` to the writer now and returns a future of its
    /// outcome. Once this resolves the command is in the writer's queue, so
    /// commands submitted one after another by one caller are applied in
    /// that order, however their outcome futures are polled later.
    async fn submit<T: Send + 'static>(
        &self,
        request: Request,
        reply: fn(oneshot::Sender<Result<T>>) -> Reply,
    ) -> Result<impl std::future::Future<Output = Result<T>> + Send + 'static> {
        let tx = lock(&self.inner.tx).clone().ok_or(Error::ShuttingDown)?;
        let (frames, bytes) = request.weight();
        let cost = bytes
            .saturating_add(frames.saturating_mul(COMMAND_FRAME_OVERHEAD))
            .min(IN_FLIGHT_BUDGET);
        // A command bigger than the budget takes all of it, and so waits
        // for everything before it rather than forever.
        let permits = u32::try_from(cost).unwrap_or(u32::MAX);
        let in_flight = self
            .inner
            .in_flight
            .clone()
            .acquire_many_owned(permits)
            .await
            .map_err(|_| Error::ShuttingDown)?;
        let (reply_tx, reply_rx) = oneshot::channel();
        tx.send(Command {
            request,
            reply: reply(reply_tx),
            in_flight,
        })
        .await
        .map_err(|_| self.inner.writer_gone())?;
        let inner = self.inner.clone();
        Ok(async move { reply_rx.await.map_err(|_| inner.writer_gone())? })
    }

    /// Like [`Queue::append`], but split in two: the returned future is
    /// obtained once the appends are queued for the writer, in order with
    /// this caller's earlier submissions. A session pipelines with it: it
    /// submits batch after batch in socket order and awaits the outcomes
    /// later. (Submitting inside the awaited futures instead would let a
    /// later batch overtake an earlier one, and the producer dedupe would
    /// then take the earlier one for a duplicate.)
    pub async fn submit_append(
        &self,
        appends: Vec<IngestAppend>,
    ) -> Result<impl std::future::Future<Output = Result<Vec<AppendOutcome>>> + Send + 'static>
    {
        // Checked on the caller's task, not on the writer thread, which
        // every commit waits for.
        ingest::validate(&appends)?;
        self.submit(Request::Append(appends), Reply::Append).await
    }
}

impl Inner {
    fn check_open(&self) -> Result<()> {
        match lock(&self.tx).as_ref() {
            Some(_) => Ok(()),
            None => Err(Error::ShuttingDown),
        }
    }

    /// The error for a command the writer never answered.
    fn writer_gone(&self) -> Error {
        if self.check_open().is_err() {
            Error::ShuttingDown
        } else {
            Error::Invariant("the store writer stopped unexpectedly".into())
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The last handle is gone without `close`: still let the writer
        // finish what it was given, so that the file is released when this
        // returns (a new queue may open it right away).
        drop(lock(&self.tx).take());
        if let Some(handle) = lock(&self.writer).take() {
            if handle.join().is_err() {
                tracing::error!("the writer thread panicked");
            }
        }
        self.hub.close();
        if let Err(e) = self.store.close() {
            tracing::warn!("closing the store: {e}");
        }
    }
}

/// The newest valid checkpoint of every execution that has one; invalid
/// newer ones are logged.
fn newest_valid_checkpoints(store: &Store) -> Result<HashMap<String, CheckpointRef>> {
    let found = store.find_checkpoints_of_all(|execution, id, record| {
        let inspected = checkpoint::inspect(id, record);
        if !inspected.meta.valid {
            checkpoint::warn_invalid(execution, id);
            return None;
        }
        Some(checkpoint::reference(&inspected.meta))
    })?;
    Ok(found.into_iter().collect())
}
