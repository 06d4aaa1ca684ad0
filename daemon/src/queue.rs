//! The queue: appends become seqs, acks become compaction.
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
//! The writer keeps every stream's metadata, producers' dedupe state and
//! consumers' acks in memory, so an append needs no read. When a commit
//! fails, every command of that batch gets the error and the writer reloads
//! those caches from the store, so nothing half-applied lingers.
//!
//! Checkpoints and durable step results are written by the writer as well,
//! so that a checkpoint records the stream's last seq as of its own
//! transaction, and a new attempt's start reads the newest valid checkpoint
//! in the same transaction that records it (see [`crate::checkpoint`]).
//!
//! Compaction and retention run on the writer too, one bounded batch at a
//! time and only when no command is waiting, so they never delay an append
//! by more than one small batch.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tether_protocol::{
    validate_name, Checkpoint, CheckpointMeta, CheckpointRef, CheckpointSave, Frame, FrameKind,
    StreamInfo,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::checkpoint::{self, Resume};
use crate::config::Retention;
use crate::degraded::{Degradation, Fault, StorageHealth};
use crate::hub::{FollowerBudget, Hub, StreamUpdate};
use crate::ingest::{self, IngestAppend};
use crate::store::{ProducerState, Snapshot, Store, StreamMeta, WriteTxn};
use crate::subscription::Subscription;
use crate::syncer::{Durable, Syncer, Then};
use crate::wal::CopyPace;
use crate::{Error, Result};

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

/// Frames deleted by one compaction or retention batch, at most.
const COMPACT_BATCH: u64 = 4096;

/// Under a steady stream of commands the writer is never idle; it still
/// runs one compaction batch after this many command batches, so that
/// retention keeps up with a busy stream.
const COMPACT_EVERY_BATCHES: u32 = 64;

/// How often age retention is checked.
const AGE_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long compaction (and copying chunks from the log) rests after it
/// failed, so that a persistent failure (a full disk) does not keep the
/// writer spinning.
const COMPACT_RETRY_DELAY: Duration = Duration::from_secs(1);

/// How long commits may stay in the write-ahead log alone before an idle
/// writer persists the store (so that a restart has little to replay).
const PERSIST_AFTER: Duration = Duration::from_secs(1);

/// How long the writer stays awake for the next command after answering a
/// producer that waits on each ack (see `Writer::stay_awake`). A
/// producer's next frame takes two socket hops and two wake-ups to come
/// back; a sleeping writer adds one more (tens of µs on a virtual CPU).
/// A session waiting on such a producer's ack stays awake as long, at
/// most (see `connection`).
pub(crate) const AWAKE_FOR: Duration = Duration::from_micros(250);

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
    /// `None` once closing began: new commands are refused.
    tx: Mutex<Option<mpsc::Sender<Command>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Permits for [`IN_FLIGHT_BUDGET`], one per byte.
    in_flight: Arc<Semaphore>,
    /// Whether the store can be written (see [`crate::degraded`]).
    health: StorageHealth,
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
        let hub = Arc::new(Hub::new(FollowerBudget::default()));
        let health = StorageHealth::default();
        let (tx, rx) = mpsc::channel(COMMAND_CAPACITY);
        let mut writer = Writer {
            store: store.clone(),
            hub: hub.clone(),
            syncer: Syncer::start(store.wal_sync_handle())?,
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
        let handle = spawn_writer(writer)?;
        Ok(Queue {
            inner: Arc::new(Inner {
                store,
                hub,
                checkpoint_refs,
                tx: Mutex::new(Some(tx)),
                writer: Mutex::new(Some(handle)),
                in_flight: Arc::new(Semaphore::new(IN_FLIGHT_BUDGET)),
                health,
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
    /// [`FrameKind::Event`]) to the stream named after the execution, all in
    /// one transaction, so that the stream always tells the story the
    /// manifest is in. Resolves after the commit with the stream's last seq
    /// (0 when the stream does not exist and no event created it).
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
        };
        let recorded = self.call(request, Reply::Record).await?;
        Ok(recorded.last_seq)
    }

    /// [`Queue::record_execution`] for the start of a restarted attempt:
    /// in the same transaction, after `events`, it looks up the newest
    /// valid checkpoint and appends the event saying what the attempt
    /// resumes from (see [`Resume::event`]). Resolves after the commit with
    /// the stream's last seq and what the attempt resumes from.
    pub async fn record_attempt_start(
        &self,
        execution: &str,
        manifest: Vec<u8>,
        events: Vec<Bytes>,
    ) -> Result<(u64, Resume)> {
        let request = Request::Record {
            execution: execution.to_owned(),
            manifest,
            events,
            resume: true,
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
        self.call(Request::SaveCheckpoint(save), Reply::Checkpoint)
            .await
    }

    /// The execution's newest valid checkpoint; invalid newer ones are
    /// skipped (and logged). `None` when it has none that is valid.
    pub async fn load_checkpoint(&self, execution: &str) -> Result<Option<Checkpoint>> {
        let execution = execution.to_owned();
        self.read(move |store| {
            store.find_checkpoint(&execution, |id, record| {
                checkpoint::loadable(&execution, id, record)
            })
        })
        .await
    }

    /// The execution's stored checkpoints, newest first, valid or not.
    pub async fn list_checkpoints(&self, execution: &str) -> Result<Vec<CheckpointMeta>> {
        let execution = execution.to_owned();
        self.read(move |store| {
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
            .read(move |store| store.step(&execution, &step))
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

    /// Size of the store file on disk.
    /// Reads every stored frame and checks it (see [`Store::verify`]).
    pub async fn verify(&self) -> Result<String> {
        self.read(|store| store.verify()).await
    }

    /// The fault the store is degraded by, if writes are refused now.
    pub fn storage_fault(&self) -> Option<Fault> {
        self.inner.health.fault()
    }

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

fn spawn_writer(writer: Writer) -> Result<JoinHandle<()>> {
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

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

#[derive(Debug)]
struct Command {
    request: Request,
    reply: Reply,
    /// Its share of [`IN_FLIGHT_BUDGET`], given back once it is answered.
    in_flight: OwnedSemaphorePermit,
}

#[derive(Debug)]
enum Request {
    Append(Vec<IngestAppend>),
    OpenConsumer {
        stream: String,
        consumer: String,
    },
    Ack {
        stream: String,
        consumer: String,
        through_seq: u64,
    },
    Record {
        execution: String,
        manifest: Vec<u8>,
        events: Vec<Bytes>,
        /// Also look up and announce what a new attempt resumes from.
        resume: bool,
    },
    SaveCheckpoint(CheckpointSave),
    PutStep {
        execution: String,
        step: String,
        result: Bytes,
    },
    Compact,
    /// Handled by the writer without a transaction.
    SetRetention(Retention),
}

impl Request {
    /// (frames, payload bytes) this request adds to a commit.
    fn weight(&self) -> (usize, usize) {
        match self {
            Request::Append(appends) => {
                (appends.len(), appends.iter().map(|a| a.payload.len()).sum())
            }
            Request::OpenConsumer { .. } | Request::Ack { .. } => (1, 0),
            Request::Record {
                manifest, events, ..
            } => (
                events.len() + 1,
                manifest.len() + events.iter().map(Bytes::len).sum::<usize>(),
            ),
            Request::SaveCheckpoint(save) => (1, save.data.len()),
            Request::PutStep { result, .. } => (1, result.len()),
            Request::Compact | Request::SetRetention(_) => (0, 0),
        }
    }
}

#[derive(Debug)]
enum Reply {
    Append(oneshot::Sender<Result<Vec<AppendOutcome>>>),
    OpenConsumer(oneshot::Sender<Result<u64>>),
    Ack(oneshot::Sender<Result<()>>),
    Record(oneshot::Sender<Result<Recorded>>),
    Checkpoint(oneshot::Sender<Result<CheckpointMeta>>),
    Step(oneshot::Sender<Result<Bytes>>),
    Compact(oneshot::Sender<Result<()>>),
}

/// What recording an execution change returns.
#[derive(Debug)]
struct Recorded {
    /// The stream's last seq after the commit.
    last_seq: u64,
    /// What the new attempt resumes from, when that was asked for.
    resume: Option<Resume>,
}

#[derive(Debug)]
enum Outcome {
    Appended(Vec<AppendOutcome>),
    Consumer(u64),
    /// An execution was recorded.
    Recorded(Recorded),
    /// A checkpoint was saved.
    Checkpoint(CheckpointMeta),
    /// A durable step's kept result.
    Step(Bytes),
    /// An ack or a compaction finished.
    Done,
}

impl Reply {
    /// Answers the caller. A caller that went away is not an error: the
    /// work is committed either way and a resend is deduplicated.
    fn send(self, result: Result<Outcome>) {
        match (self, result) {
            (Reply::Append(tx), Ok(Outcome::Appended(v))) => {
                let _ = tx.send(Ok(v));
            }
            (Reply::OpenConsumer(tx), Ok(Outcome::Consumer(a))) => {
                let _ = tx.send(Ok(a));
            }
            (Reply::Record(tx), Ok(Outcome::Recorded(recorded))) => {
                let _ = tx.send(Ok(recorded));
            }
            (Reply::Checkpoint(tx), Ok(Outcome::Checkpoint(meta))) => {
                let _ = tx.send(Ok(meta));
            }
            (Reply::Step(tx), Ok(Outcome::Step(result))) => {
                let _ = tx.send(Ok(result));
            }
            (Reply::Ack(tx) | Reply::Compact(tx), Ok(Outcome::Done)) => {
                let _ = tx.send(Ok(()));
            }
            (reply, Ok(_)) => reply.fail(Error::Invariant(
                "internal error: answer of the wrong kind".into(),
            )),
            (reply, Err(e)) => reply.fail(e),
        }
    }

    fn fail(self, e: Error) {
        // Ignored for the reason given in `send`.
        let _ = match self {
            Reply::Append(tx) => tx.send(Err(e)).is_ok(),
            Reply::OpenConsumer(tx) => tx.send(Err(e)).is_ok(),
            Reply::Record(tx) => tx.send(Err(e)).is_ok(),
            Reply::Checkpoint(tx) => tx.send(Err(e)).is_ok(),
            Reply::Step(tx) => tx.send(Err(e)).is_ok(),
            Reply::Ack(tx) | Reply::Compact(tx) => tx.send(Err(e)).is_ok(),
        };
    }
}

/// Whether a commit answers consumers' acks alone: nobody waits on those
/// answers closely, so it may share a later commit's sync
/// ([`Syncer::after_sharing`]) rather than have one of its own.
fn acks_only<'r>(replies: impl IntoIterator<Item = &'r Reply>) -> bool {
    let mut replies = replies.into_iter().peekable();
    replies.peek().is_some() && replies.all(|r| matches!(r, Reply::Ack(_)))
}

/// Who makes a commit durable and answers it (see [`Writer::handing`]).
enum Handing {
    /// The syncer, with the next job's sync ([`Syncer::after_sharing`]).
    Shared,
    /// The writer itself ([`Syncer::run_here`]).
    Here,
    /// The syncer, in turn ([`Syncer::after`]).
    Queued,
}

/// Forgets where producers must resume (`Writer::failed_from`) once they
/// have: their append of that seq was stored, or was a duplicate of one
/// already stored. A failed commit whose log record was appended is
/// replayed when the store is reopened, so the resend of its first seq
/// can find it stored; the producer has resumed all the same.
fn forget_resumed(
    failed_from: &mut HashMap<String, HashMap<String, u64>>,
    outcomes: &[AppendOutcome],
) {
    for o in outcomes {
        let Some(failed) = failed_from.get_mut(&*o.stream) else {
            continue;
        };
        if failed.get(&*o.producer) == Some(&o.producer_seq) {
            failed.remove(&*o.producer);
        }
        if failed.is_empty() {
            failed_from.remove(&*o.stream);
        }
    }
}

// ---------------------------------------------------------------------------
// The writer
// ---------------------------------------------------------------------------

/// The writer's cache of the committed state.
#[derive(Debug, Default)]
struct State {
    next_stream_id: u64,
    streams: HashMap<String, StreamState>,
}

#[derive(Debug)]
struct StreamState {
    meta: StreamMeta,
    producers: HashMap<String, ProducerState>,
    consumers: BTreeMap<String, u64>,
    /// Timestamp of the first retained frame; `None` when unknown or when
    /// nothing is retained.
    oldest_ts: Option<u64>,
}

impl State {
    fn from_snapshot(snapshot: Snapshot) -> Self {
        let mut streams: HashMap<String, StreamState> = HashMap::new();
        let mut names = HashMap::new();
        for (name, meta) in snapshot.streams {
            names.insert(meta.id, name.clone());
            streams.insert(
                name,
                StreamState {
                    meta,
                    producers: HashMap::new(),
                    consumers: BTreeMap::new(),
                    oldest_ts: None,
                },
            );
        }
        for (id, producer, state) in snapshot.producers {
            if let Some(s) = names.get(&id).and_then(|n| streams.get_mut(n)) {
                s.producers.insert(producer, state);
            }
        }
        for (id, consumer, acked) in snapshot.consumers {
            if let Some(s) = names.get(&id).and_then(|n| streams.get_mut(n)) {
                s.consumers.insert(consumer, acked);
            }
        }
        Self {
            next_stream_id: snapshot.next_stream_id.max(1),
            streams,
        }
    }
}

/// What a batch changed, to be written at its end and published after its
/// commit.
#[derive(Debug, Default)]
struct Staged {
    streams: BTreeMap<String, Vec<(u64, Frame)>>,
    /// Producers whose dedupe state changed, by stream, with the first
    /// producer seq this batch stored for each.
    producers: HashMap<String, HashMap<String, u64>>,
    created_stream: bool,
    /// Checkpoints saved, in order, as `ps` will show them.
    checkpoints: Vec<(String, CheckpointRef)>,
}

impl Staged {
    /// Notes that `producer`'s dedupe state on `stream` changed; copies the
    /// names only the first time in a batch.
    fn stage_producer(&mut self, stream: &str, producer: &str, producer_seq: u64) {
        match self.producers.get_mut(stream) {
            Some(firsts) => {
                if !firsts.contains_key(producer) {
                    firsts.insert(producer.to_owned(), producer_seq);
                }
            }
            None => {
                self.producers.insert(
                    stream.to_owned(),
                    HashMap::from([(producer.to_owned(), producer_seq)]),
                );
            }
        }
    }

    /// The frames of `stream` staged for publication after the commit.
    fn frames_of(&mut self, stream: &str) -> &mut Vec<(u64, Frame)> {
        // Looked up before any `entry`, which would copy the name.
        if !self.streams.contains_key(stream) {
            self.streams.insert(stream.to_owned(), Vec::new());
        }
        self.streams
            .get_mut(stream)
            .unwrap_or_else(|| unreachable!("the stream was just inserted"))
    }
}

/// A committed batch's news for the hub and for `ps`, told once it is
/// durable.
struct Publish {
    hub: Arc<Hub>,
    updates: Vec<StreamUpdate>,
    checkpoint_refs: CheckpointRefs,
    checkpoints: Vec<(String, CheckpointRef)>,
}

impl Publish {
    /// Makes the commit visible to readers and to `ps`: what must hold
    /// before anyone is answered, so that a reader who was told "appended"
    /// finds the frames.
    fn advance(&mut self) {
        self.hub.advance(&self.updates);
        if !self.checkpoints.is_empty() {
            let mut refs = lock(&self.checkpoint_refs);
            for (execution, reference) in self.checkpoints.drain(..) {
                refs.insert(execution, reference);
            }
        }
    }

    /// Hands the commit's frames to the live followers.
    fn deliver(self) {
        self.hub.hand_out(self.updates);
    }
}

enum Wait {
    Command(Command),
    Idle,
    Closed,
}

struct Writer {
    store: Arc<Store>,
    /// Only ever used from jobs run through `syncer` (on its job thread,
    /// or on this one when it has nothing queued), so that the hub hears
    /// of commits in order and only once they are durable.
    hub: Arc<Hub>,
    syncer: Syncer,
    checkpoint_refs: CheckpointRefs,
    opts: QueueOptions,
    rx: mpsc::Receiver<Command>,
    state: State,
    /// False after a failed commit until the caches are reloaded.
    healthy: bool,
    /// Set while the store cannot be written (see [`crate::degraded`]):
    /// writes are refused, background work rests, a retry is scheduled.
    degraded: Option<Degradation>,
    health: StorageHealth,
    /// Consumers' acks received while degraded, by (stream, consumer):
    /// recorded once writing resumes.
    held_acks: BTreeMap<(String, String), u64>,
    /// When degraded mode last ended, and the fault it ended.
    cleared_at: Option<(Instant, Fault)>,
    /// The last timestamp given to a frame; frames never go back in time.
    last_ts: u64,
    /// Streams that may have frames to compact or expire, oldest first.
    dirty: VecDeque<String>,
    dirty_set: HashSet<String>,
    next_age_check: Instant,
    compaction_paused_until: Option<Instant>,
    /// Copying chunks from the log rests until then after it failed (a
    /// full disk), as compaction does: each failure reopens the store.
    copying_paused_until: Option<Instant>,
    /// When the writer last answered a lone command itself.
    answered_alone: Option<Instant>,
    /// Whether to wait awake for the next command (see
    /// [`Writer::stay_awake`]): the last batch was answered alone, and the
    /// command before it came back within [`AWAKE_FOR`].
    awake: bool,
    /// For each (stream, producer) whose appends failed to commit: the
    /// first producer seq that was not stored. Appends of that producer
    /// queued behind the failed ones would otherwise be stored after a gap,
    /// and the resent ones then taken for duplicates and lost; so until
    /// that seq is resent, later ones are refused (a retryable storage
    /// error, answered by a resend from the client's last ack).
    failed_from: HashMap<String, HashMap<String, u64>>,
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
                    self.tend_log(CopyPace::Pressed);
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
        if self.store.unpersisted_since().is_some() {
            if let Err(e) = self.store.persist() {
                tracing::warn!("persisting the store on close failed: {e}");
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

    fn compaction_ready(&self) -> bool {
        self.healthy
            && !self.dirty.is_empty()
            && self
                .compaction_paused_until
                .is_none_or(|t| Instant::now() >= t)
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
        let persist = self.store.unpersisted_since().map(|t| t + PERSIST_AFTER);
        [age, pause, persist].into_iter().flatten().min()
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
        self.tend_log(CopyPace::Idle);
        if self
            .store
            .unpersisted_since()
            .is_some_and(|t| t.elapsed() >= PERSIST_AFTER)
        {
            self.persist();
        }
    }

    /// When the log's records are getting near chunks it keeps for the
    /// store, copies a step of them into the store at `pace`, and persists
    /// it when the records need to go over them (see [`crate::wal`],
    /// "Going round"). Idle, or between batches when the records press,
    /// so that a full log rarely holds a commit up.
    fn tend_log(&mut self, pace: CopyPace) {
        if !self.copying_ready() {
            return;
        }
        match self.store.copy_from_log(pace) {
            Ok(true) => self.persist(),
            Ok(false) => {}
            Err(e) => {
                self.copying_paused_until = Some(Instant::now() + COMPACT_RETRY_DELAY);
                self.after_failure("copying chunks from the log into the store", &e);
            }
        }
    }

    /// Whether copying chunks from the log may run now: the store is
    /// healthy and copying is not resting after a failure.
    fn copying_ready(&self) -> bool {
        self.healthy
            && self
                .copying_paused_until
                .is_none_or(|t| Instant::now() >= t)
    }

    /// Makes the store hold every commit itself, so that no record of the
    /// log is needed for a replay; after a failed sync of the log, also
    /// what it could not sync.
    fn persist(&mut self) {
        match self.store.persist() {
            Ok(()) => self.syncer.after(Durable::Committed, Box::new(|_| {})),
            Err(e) => self.after_failure("persisting the store", &e),
        }
    }

    /// Enters degraded mode for `fault`, unless already in it.
    fn degrade(&mut self, fault: Fault) {
        self.healthy = false;
        if self.degraded.is_none() {
            let cleared = self.cleared_at.as_ref().map(|(at, fault)| (*at, fault));
            let began = Degradation::begin(fault, &self.health, Instant::now(), cleared);
            self.degraded = Some(began);
        }
    }

    /// Tries the store again while degraded: reopens it if redb failed,
    /// makes the log trustworthy again after a failed sync, checks that
    /// the write that failed would now find room, and commits durably. If
    /// that works, writing resumes and the acks held meanwhile are
    /// recorded; otherwise the next try is scheduled.
    fn retry_storage(&mut self) {
        let Some(mut degraded) = self.degraded.take() else {
            return;
        };
        match self.try_storage() {
            Ok(()) => {
                let now = Instant::now();
                self.cleared_at = Some((now, degraded.clear(&self.health, now)));
                self.record_held_acks();
            }
            Err(e) => {
                degraded.retry_failed(Fault::of(&e), &self.health, Instant::now());
                self.degraded = Some(degraded);
            }
        }
    }

    fn try_storage(&mut self) -> Result<()> {
        self.store.recover()?;
        if self.syncer.failure().is_some() {
            // After a failed sync nothing appended since the last good one
            // can be trusted to be on disk: what this process wrote is
            // written again, from its own view of the log, and synced. A
            // failure here is the cause now (the newest, shown alone).
            self.store.rewrite_log()?;
        }
        // Room for the batch that failed, checked as its commit does, so
        // that the store is not called writable only for that batch to be
        // refused again at once; and nothing is persisted (which may free
        // the log's file) while there is none, so that a full disk stays
        // one fault rather than a series of short ones.
        let batch = self.opts.max_batch_bytes as u64;
        self.store.room_again(batch)?;
        self.store.persist()?;
        // Not going round, the persist may have emptied the log's file.
        self.store.room_again(batch)?;
        // The durable commit ends the failed sync's effect; the writer
        // must see that before its next commit.
        self.syncer.after(Durable::Committed, Box::new(|_| {}));
        self.syncer.wait_for_jobs();
        let snapshot = self.store.load()?;
        self.install(snapshot);
        self.healthy = true;
        Ok(())
    }

    /// Records the acks held while degraded, in one commit of their own.
    fn record_held_acks(&mut self) {
        if self.held_acks.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.held_acks);
        let store = self.store.clone();
        let committed = store.write_logged(
            |txn| {
                for ((stream, consumer), through) in &held {
                    // Checked when held; a stream removed since is skipped.
                    let _refused = self.apply_ack(txn, stream, consumer, *through)?;
                }
                Ok(())
            },
            |_| {},
        );
        match committed {
            Ok(((), durable)) => self.syncer.after_sharing(durable, Box::new(|_| {})),
            Err(e) => {
                tracing::debug!("recording the acks held while degraded failed: {e}");
                self.held_acks = held;
                self.after_failure("recording held acks", &e);
            }
        }
    }

    /// Answers a batch while degraded, without touching the store: acks
    /// that are valid are held (and answered), a consumer already known
    /// is answered from the caches, and every other request is refused
    /// with the fault, so that its sender keeps what it sent and retries.
    fn refuse_while_degraded(
        &mut self,
        requests: Vec<Request>,
        replies: Vec<Reply>,
        in_flight: Vec<OwnedSemaphorePermit>,
    ) {
        let Some(fault) = self.degraded.as_ref().map(|d| d.fault().clone()) else {
            return;
        };
        let answers = requests
            .into_iter()
            .zip(replies)
            .map(|(request, reply)| {
                let result = match request {
                    Request::Ack {
                        stream,
                        consumer,
                        through_seq,
                    } => self.hold_ack(stream, consumer, through_seq),
                    Request::OpenConsumer { stream, consumer } => self
                        .state
                        .streams
                        .get(&stream)
                        .and_then(|s| s.consumers.get(&consumer))
                        .map(|&acked| {
                            let held = self.held_acks.get(&(stream.clone(), consumer.clone()));
                            Outcome::Consumer(held.copied().unwrap_or(acked).max(acked))
                        })
                        .ok_or_else(|| fault.refusal()),
                    _ => Err(fault.refusal()),
                };
                (reply, result)
            })
            .collect();
        self.answer(Durable::Nothing, None, answers, in_flight);
    }

    /// Holds a consumer's ack while degraded, after the checks
    /// `apply_ack` makes.
    fn hold_ack(&mut self, stream: String, consumer: String, through_seq: u64) -> Result<Outcome> {
        validate_name("consumer", &consumer)?;
        let Some(s) = self.state.streams.get(&stream) else {
            return Err(Error::StreamNotFound(stream));
        };
        if through_seq > s.meta.last_seq {
            return Err(Error::InvalidRequest(format!(
                "ack through seq {through_seq} is beyond the last seq {} of stream {stream}",
                s.meta.last_seq
            )));
        }
        let held = self.held_acks.entry((stream, consumer)).or_insert(0);
        *held = (*held).max(through_seq);
        Ok(Outcome::Done)
    }

    /// Replaces the caches with `snapshot` and tells the hub.
    fn install(&mut self, snapshot: Snapshot) {
        self.state = State::from_snapshot(snapshot);
        let ranges: Vec<(String, u64, u64)> = self
            .state
            .streams
            .iter()
            .map(|(name, s)| (name.clone(), s.meta.first_seq, s.meta.last_seq))
            .collect();
        let hub = self.hub.clone();
        // In line after the commits before it, which it supersedes.
        self.syncer
            .after(Durable::Nothing, Box::new(move |_| hub.reset(ranges)));
        // Compaction may have been behind the acks when the state was last
        // saved: look at every stream once.
        let names: Vec<String> = self.state.streams.keys().cloned().collect();
        for name in names {
            self.mark_dirty(&name);
        }
    }

    /// Reopens the store and reloads the caches after a failed commit.
    fn recover(&mut self) -> Result<()> {
        self.store.recover()?;
        let snapshot = self.store.load()?;
        self.install(snapshot);
        self.healthy = true;
        Ok(())
    }

    /// After a failed write: a fault of the store's enters degraded mode
    /// (logged there, once); the caches are reloaded from what is stored
    /// when the store can still be read, and otherwise at the next retry.
    fn after_failure(&mut self, what: &str, e: &Error) {
        self.healthy = false;
        match Fault::of(e) {
            Some(fault) => {
                tracing::debug!("{what} failed: {e}");
                self.degrade(fault);
                if let Ok(snapshot) = self.store.load() {
                    self.install(snapshot);
                }
            }
            None => {
                tracing::warn!("{what} failed: {e}");
                if let Err(e) = self.recover() {
                    tracing::warn!("reloading the store after a failed {what} failed: {e}");
                }
            }
        }
    }

    /// New retention limits: every stream may now be over them.
    fn set_retention(&mut self, retention: Retention) {
        self.opts.retention = retention;
        self.next_age_check = Instant::now();
        let names: Vec<String> = self.state.streams.keys().cloned().collect();
        for name in names {
            self.mark_dirty(&name);
        }
    }

    fn mark_dirty(&mut self, name: &str) {
        if self.dirty_set.insert(name.to_owned()) {
            self.dirty.push_back(name.to_owned());
        }
    }

    fn now_micros() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }

    /// A timestamp for the frames of one batch, never earlier than the last.
    fn next_ts(&mut self) -> u64 {
        self.last_ts = self.last_ts.max(Self::now_micros());
        self.last_ts
    }

    // -- commands ------------------------------------------------------------

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
                    Err(e) => Err(e.duplicate()),
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
                let failed = replies.into_iter().map(|r| (r, Err(e.duplicate())));
                self.answer(Durable::Nothing, None, failed.collect(), in_flight);
                return;
            }
        }
        // Not going round, the frames are written into redb's own pages:
        // refused here, before redb could meet a full disk.
        let bytes: usize = requests.iter().map(|r| r.weight().1).sum();
        let mut room = self.store.make_room_for(bytes as u64);
        if room.is_err() && self.store.unpersisted_since().is_some() {
            // Commits made without durability since the last persist hold
            // room a persist gives back: the pages they may still have to
            // write (see `Store::make_room`), and, on a disk this short,
            // the log's file. Persisted, the batch may fit.
            self.persist();
            if self.degraded.is_none() {
                room = self.store.make_room_for(bytes as u64);
            }
        }
        if let Err(e) = room {
            self.after_failure("commit", &e);
            let failed = replies.into_iter().map(|r| (r, Err(e.duplicate())));
            self.answer(Durable::Nothing, None, failed.collect(), in_flight);
            return;
        }
        let ts = self.next_ts();
        let mut results: Vec<Result<Outcome>> = Vec::with_capacity(requests.len());
        let mut staged = Staged::default();
        let store = self.store.clone();
        // Only a commit the syncer will sync for gives it a head start.
        let sync_ahead = matches!(self.handing(true, replies.iter()), Handing::Queued)
            .then(|| self.syncer.sync_ahead());
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
                    _ => (reply, Err(e.duplicate())),
                });
                self.answer(Durable::Nothing, None, failed.collect(), in_flight);
            }
        }
    }

    /// How a commit answering `replies` is made durable and answered
    /// (asked before the commit, for the syncer's head start, and again
    /// after it, when it counts).
    ///
    /// A logged commit of consumers' acks alone shares a later commit's
    /// sync: nobody waits on those answers closely. One command with
    /// nothing queued behind it is a producer waiting on its ack: the
    /// writer has nothing better to do than the syncer's work and is
    /// already awake for it, and with no job waiting on the syncer the
    /// order of answers holds.
    fn handing<'r>(
        &self,
        logged: bool,
        replies: impl ExactSizeIterator<Item = &'r Reply>,
    ) -> Handing {
        let commands = replies.len();
        if logged && acks_only(replies) {
            Handing::Shared
        } else if commands == 1 && self.rx.is_empty() && self.syncer.idle() {
            Handing::Here
        } else {
            Handing::Queued
        }
    }

    /// Once `durable` holds, in order with every commit's: publishes
    /// `publish` and sends `answers`; if it cannot be made to hold, fails
    /// every answer with the reason instead. Gives back `in_flight` either
    /// way. See [`Writer::handing`] for who syncs.
    fn answer(
        &mut self,
        durable: Durable,
        mut publish: Option<Publish>,
        answers: Vec<(Reply, Result<Outcome>)>,
        in_flight: Vec<OwnedSemaphorePermit>,
    ) {
        let logged = matches!(durable, Durable::Logged(_));
        let handing = self.handing(logged, answers.iter().map(|(reply, _)| reply));
        let then: Then = Box::new(move |synced| {
            match synced {
                Ok(()) => {
                    // The producers first, the followers after: a
                    // waiting producer sends its next frames sooner, and
                    // followers skip what they already read.
                    if let Some(publish) = &mut publish {
                        publish.advance();
                    }
                    for (reply, result) in answers {
                        reply.send(result);
                    }
                    if let Some(publish) = publish {
                        publish.deliver();
                    }
                }
                Err(e) => {
                    for (reply, _) in answers {
                        reply.fail(e.duplicate());
                    }
                }
            }
            drop(in_flight);
        });
        match handing {
            Handing::Shared => self.syncer.after_sharing(durable, then),
            Handing::Here => {
                self.syncer.run_here(durable, then);
                self.answered_alone = Some(Instant::now());
            }
            Handing::Queued => self.syncer.after(durable, then),
        }
    }

    /// Applies one request to the transaction and the caches. The outer
    /// error is a storage failure (the batch fails); the inner one refuses
    /// this request alone, before it changed anything.
    /// Takes the request by value so that appends move their names and
    /// payloads into the outcome and the frame instead of copying them.
    fn apply(
        &mut self,
        txn: &mut WriteTxn<'_>,
        request: Request,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        match request {
            Request::Append(appends) => self.apply_appends(txn, appends, ts, staged),
            Request::OpenConsumer { stream, consumer } => {
                self.apply_open_consumer(txn, &stream, &consumer)
            }
            Request::Ack {
                stream,
                consumer,
                through_seq,
            } => self.apply_ack(txn, &stream, &consumer, through_seq),
            Request::Record {
                execution,
                manifest,
                events,
                resume,
            } => self.apply_record(txn, &execution, &manifest, &events, resume, ts, staged),
            Request::SaveCheckpoint(save) => self.apply_checkpoint(txn, &save, ts, staged),
            Request::PutStep {
                execution,
                step,
                result,
            } => self.apply_step(txn, &execution, &step, &result),
            // Separated out by `process`; never part of a transaction.
            Request::Compact | Request::SetRetention(_) => Ok(Ok(Outcome::Done)),
        }
    }

    fn apply_appends(
        &mut self,
        txn: &mut WriteTxn<'_>,
        appends: Vec<IngestAppend>,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = self.check_resumed(&appends) {
            return Ok(Err(e));
        }
        let mut outcomes = Vec::with_capacity(appends.len());
        let mut appends = appends.into_iter().peekable();
        while let Some(first) = appends.next() {
            // A batch is mostly one producer's frames in a row: the stream,
            // the producer and the staged frames are looked up once a run.
            let mut run = vec![first];
            while let Some(next) = appends.next_if(|a| a.same_writer(&run[0])) {
                run.push(next);
            }
            self.apply_run(txn, run, ts, staged, &mut outcomes)?;
        }
        if !self.failed_from.is_empty() {
            forget_resumed(&mut self.failed_from, &outcomes);
        }
        Ok(Ok(Outcome::Appended(outcomes)))
    }

    /// Applies appends of one (stream, producer), in order. Per frame
    /// nothing is allocated here: names move into the outcome, and the
    /// payload into the frame.
    fn apply_run(
        &mut self,
        txn: &mut WriteTxn<'_>,
        run: Vec<IngestAppend>,
        ts: u64,
        staged: &mut Staged,
        outcomes: &mut Vec<AppendOutcome>,
    ) -> Result<()> {
        let (stream_name, producer_name) = match run.first() {
            Some(a) => (a.stream.clone(), a.producer.clone()),
            None => return Ok(()),
        };
        let stream = self.stream_or_create(&stream_name, ts, staged);
        let mut newest = stream.producers.get(&*producer_name).copied();
        let mut first_stored = None;
        let staged_frames = staged.frames_of(&stream_name);
        for a in run {
            let mut outcome = AppendOutcome {
                stream: a.stream,
                producer: a.producer,
                producer_seq: a.producer_seq,
                seq: 0,
                duplicate: false,
            };
            if let Some(p) = newest.filter(|p| outcome.producer_seq <= p.producer_seq) {
                outcome.seq = p.seq;
                outcome.duplicate = true;
                outcomes.push(outcome);
                continue;
            }
            let frame = Frame {
                ts_micros: ts,
                kind: a.kind,
                payload: a.payload,
            };
            outcome.seq = put_new_frame(txn, stream, frame, staged_frames)?;
            newest = Some(ProducerState {
                producer_seq: outcome.producer_seq,
                seq: outcome.seq,
            });
            first_stored.get_or_insert(outcome.producer_seq);
            outcomes.push(outcome);
        }
        if let (Some(state), Some(first)) = (newest, first_stored) {
            match stream.producers.get_mut(&*producer_name) {
                Some(stored) => *stored = state,
                None => {
                    stream.producers.insert(producer_name.to_string(), state);
                }
            }
            staged.stage_producer(&stream_name, &producer_name, first);
        }
        Ok(())
    }

    /// Records, after a failed commit, where each producer of the batch
    /// must resume.
    fn remember_failed(&mut self, staged: &Staged) {
        for (stream, firsts) in &staged.producers {
            let failed = self.failed_from.entry(stream.clone()).or_default();
            for (producer, &first) in firsts {
                let from = failed.entry(producer.clone()).or_insert(first);
                *from = (*from).min(first);
            }
        }
    }

    /// Refuses appends that would skip the first unstored seq of a
    /// producer whose earlier appends failed (see `failed_from`).
    fn check_resumed(&self, appends: &[IngestAppend]) -> Result<()> {
        if self.failed_from.is_empty() {
            return Ok(());
        }
        let mut resumed: Vec<(&str, &str)> = Vec::new();
        for a in appends {
            let from = self
                .failed_from
                .get(&*a.stream)
                .and_then(|m| m.get(&*a.producer));
            let Some(&from) = from else { continue };
            let key = (&*a.stream, &*a.producer);
            if a.producer_seq == from {
                resumed.push(key);
            } else if a.producer_seq > from && !resumed.contains(&key) {
                return Err(Error::Refused(format!(
                    "appends of producer {} on stream {} from producer seq {from} were not \
                     stored (a commit failed); resend from there",
                    a.producer, a.stream
                )));
            }
        }
        Ok(())
    }

    /// Stores a manifest and appends its lifecycle events (and, for a new
    /// attempt, the one saying what it resumes from). The daemon is their
    /// only producer and writes them once, so they carry no dedupe state.
    #[allow(clippy::too_many_arguments)]
    fn apply_record(
        &mut self,
        txn: &mut WriteTxn<'_>,
        execution: &str,
        manifest: &[u8],
        events: &[Bytes],
        resume: bool,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("stream", execution) {
            return Ok(Err(e.into()));
        }
        txn.put_execution(execution, manifest)?;
        for payload in events {
            let stream = self.stream_or_create(execution, ts, staged);
            let frame = Frame {
                ts_micros: ts,
                kind: FrameKind::Event,
                payload: payload.clone(),
            };
            put_new_frame(txn, stream, frame, staged.frames_of(execution))?;
        }
        let resume = match resume {
            true => {
                let resume = self.resume_point(txn, execution)?;
                if let Some(event) = resume.event() {
                    tracing::info!(execution, "{event}");
                    let stream = self.stream_or_create(execution, ts, staged);
                    let frame = Frame {
                        ts_micros: ts,
                        kind: FrameKind::Event,
                        payload: Bytes::from(event),
                    };
                    put_new_frame(txn, stream, frame, staged.frames_of(execution))?;
                }
                Some(resume)
            }
            false => None,
        };
        Ok(Ok(Outcome::Recorded(Recorded {
            last_seq: self.last_seq(execution),
            resume,
        })))
    }

    /// The stream's last seq as this batch has it so far (0 for none).
    fn last_seq(&self, stream: &str) -> u64 {
        self.state
            .streams
            .get(stream)
            .map_or(0, |s| s.meta.last_seq)
    }

    /// What a new attempt of `execution` resumes from, read in `txn`: the
    /// newest checkpoint whose checksum matches. Invalid newer ones are
    /// skipped and logged.
    fn resume_point(&self, txn: &mut WriteTxn<'_>, execution: &str) -> Result<Resume> {
        let mut any = false;
        let mut found = None;
        txn.visit_checkpoints(execution, |id, record| {
            any = true;
            let inspected = checkpoint::inspect(id, record);
            if inspected.meta.valid {
                found = Some(inspected.meta);
                return false;
            }
            checkpoint::warn_invalid(execution, id);
            true
        })?;
        Ok(match found {
            Some(meta) => Resume::From {
                checkpoint: meta.id,
                seq: meta.seq,
                through: self.last_seq(execution),
            },
            None if any => Resume::NoValid,
            None => Resume::Fresh,
        })
    }

    /// Stores a checkpoint with the stream's last seq and deletes those
    /// beyond the newest `checkpoint_keep`.
    fn apply_checkpoint(
        &mut self,
        txn: &mut WriteTxn<'_>,
        save: &CheckpointSave,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        let execution = save.execution.as_str();
        let limit = self.opts.max_checkpoint_bytes;
        if save.data.len() > limit {
            return Ok(Err(checkpoint::too_large(
                "checkpoint",
                save.data.len(),
                limit,
            )));
        }
        if !txn.has_execution(execution)? {
            return Ok(Err(Error::ExecutionNotFound(execution.to_owned())));
        }
        // Ids only grow: the newest checkpoint is never deleted, so the
        // next id is always above every id ever given.
        let id = txn.newest_checkpoint_id(execution)?.map_or(1, |n| n + 1);
        let seq = self.last_seq(execution);
        let record = checkpoint::encode_record(save.schema_version, ts, seq, &save.data)?;
        txn.put_checkpoint(execution, id, &record)?;
        let keep = self.opts.checkpoint_keep.max(1) as u64;
        if id > keep {
            txn.delete_checkpoints_before(execution, id + 1 - keep)?;
        }
        let meta = CheckpointMeta {
            id,
            seq,
            schema_version: save.schema_version,
            size: save.data.len() as u64,
            created_micros: ts,
            valid: true,
        };
        staged
            .checkpoints
            .push((execution.to_owned(), checkpoint::reference(&meta)));
        Ok(Ok(Outcome::Checkpoint(meta)))
    }

    /// Records a durable step's result unless one is recorded already: the
    /// first result is the one every later attempt gets back.
    fn apply_step(
        &mut self,
        txn: &mut WriteTxn<'_>,
        execution: &str,
        step: &str,
        result: &Bytes,
    ) -> Result<Result<Outcome>> {
        let limit = self.opts.max_checkpoint_bytes;
        if result.len() > limit {
            return Ok(Err(checkpoint::too_large(
                "step result",
                result.len(),
                limit,
            )));
        }
        if !txn.has_execution(execution)? {
            return Ok(Err(Error::ExecutionNotFound(execution.to_owned())));
        }
        if let Some(kept) = txn.step(execution, step)? {
            return Ok(Ok(Outcome::Step(Bytes::from(kept))));
        }
        txn.put_step(execution, step, result)?;
        Ok(Ok(Outcome::Step(result.clone())))
    }

    fn stream_or_create(&mut self, name: &str, ts: u64, staged: &mut Staged) -> &mut StreamState {
        // Looked up before any `entry`, which would copy the name for
        // every frame.
        if !self.state.streams.contains_key(name) {
            let id = self.state.next_stream_id;
            self.state.next_stream_id += 1;
            staged.created_stream = true;
            let created = StreamState {
                meta: StreamMeta::new(id, ts),
                producers: HashMap::new(),
                consumers: BTreeMap::new(),
                oldest_ts: None,
            };
            self.state.streams.insert(name.to_owned(), created);
        }
        self.state
            .streams
            .get_mut(name)
            .unwrap_or_else(|| unreachable!("the stream was just inserted"))
    }

    fn apply_open_consumer(
        &mut self,
        txn: &mut WriteTxn<'_>,
        stream: &str,
        consumer: &str,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("consumer", consumer) {
            return Ok(Err(e.into()));
        }
        let Some(s) = self.state.streams.get_mut(stream) else {
            return Ok(Err(Error::StreamNotFound(stream.to_owned())));
        };
        if let Some(&acked) = s.consumers.get(consumer) {
            return Ok(Ok(Outcome::Consumer(acked)));
        }
        let acked = s.meta.first_seq - 1;
        txn.put_consumer(s.meta.id, consumer, acked)?;
        s.consumers.insert(consumer.to_owned(), acked);
        Ok(Ok(Outcome::Consumer(acked)))
    }

    fn apply_ack(
        &mut self,
        txn: &mut WriteTxn<'_>,
        stream: &str,
        consumer: &str,
        through_seq: u64,
    ) -> Result<Result<Outcome>> {
        if let Err(e) = validate_name("consumer", consumer) {
            return Ok(Err(e.into()));
        }
        let Some(s) = self.state.streams.get_mut(stream) else {
            return Ok(Err(Error::StreamNotFound(stream.to_owned())));
        };
        if through_seq > s.meta.last_seq {
            return Ok(Err(Error::InvalidRequest(format!(
                "ack through seq {through_seq} is beyond the last seq {} of stream {stream}",
                s.meta.last_seq
            ))));
        }
        if s.consumers.get(consumer).is_some_and(|&a| a >= through_seq) {
            return Ok(Ok(Outcome::Done));
        }
        txn.put_consumer(s.meta.id, consumer, through_seq)?;
        s.consumers.insert(consumer.to_owned(), through_seq);
        self.mark_dirty(stream);
        Ok(Ok(Outcome::Done))
    }

    /// Writes the metadata and producer state a batch changed, once each.
    fn flush(&self, txn: &mut WriteTxn<'_>, staged: &Staged) -> Result<()> {
        for name in staged.streams.keys() {
            if let Some(s) = self.state.streams.get(name) {
                txn.put_stream(name, &s.meta)?;
            }
        }
        for (stream, producers) in &staged.producers {
            let Some(s) = self.state.streams.get(stream) else {
                continue;
            };
            for producer in producers.keys() {
                if let Some(state) = s.producers.get(producer) {
                    txn.put_producer(s.meta.id, producer, *state)?;
                }
            }
        }
        if staged.created_stream {
            txn.set_next_stream_id(self.state.next_stream_id)?;
        }
        Ok(())
    }

    /// What publishing a committed batch takes (run once it is durable),
    /// and queues streams over their retention limits for compaction.
    fn publish(&mut self, staged: Staged) -> Publish {
        let mut updates = Vec::with_capacity(staged.streams.len());
        let mut over_limit = Vec::new();
        for (name, frames) in staged.streams {
            let Some(s) = self.state.streams.get(&name) else {
                continue;
            };
            if self.over_size_limits(&s.meta) {
                over_limit.push(name.clone());
            }
            updates.push(StreamUpdate {
                stream: name,
                first_seq: s.meta.first_seq,
                last_seq: s.meta.last_seq,
                frames,
            });
        }
        for name in over_limit {
            self.mark_dirty(&name);
        }
        Publish {
            hub: self.hub.clone(),
            updates,
            checkpoint_refs: self.checkpoint_refs.clone(),
            checkpoints: staged.checkpoints,
        }
    }

    fn over_size_limits(&self, meta: &StreamMeta) -> bool {
        let r = &self.opts.retention;
        r.max_frames.is_some_and(|m| meta.frames > m) || r.max_bytes.is_some_and(|m| meta.bytes > m)
    }

    // -- compaction and retention --------------------------------------------

    /// Queues every stream whose oldest frame may have expired.
    fn mark_aged(&mut self) {
        let Some(cutoff) = self.age_cutoff() else {
            return;
        };
        let aged: Vec<String> = self
            .state
            .streams
            .iter()
            .filter(|(_, s)| s.meta.frames > 0 && s.oldest_ts.is_none_or(|t| t < cutoff))
            .map(|(name, _)| name.clone())
            .collect();
        for name in aged {
            self.mark_dirty(&name);
        }
    }

    /// Frames stamped before this have outlived `max_age`.
    fn age_cutoff(&self) -> Option<u64> {
        let age = self.opts.retention.max_age?;
        let age = u64::try_from(age.as_micros()).unwrap_or(u64::MAX);
        Some(Self::now_micros().saturating_sub(age))
    }

    /// Runs compaction batches until nothing is due.
    fn compact_all(&mut self) -> Result<()> {
        if !self.healthy {
            self.recover()?;
        }
        self.compaction_paused_until = None;
        self.mark_aged();
        // Ends: every step either deletes frames or takes a stream off the
        // dirty list.
        while !self.dirty.is_empty() {
            if let Err(e) = self.compact_step() {
                self.compaction_failed(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    fn compaction_failed(&mut self, e: &Error) {
        self.compaction_paused_until = Some(Instant::now() + COMPACT_RETRY_DELAY);
        self.after_failure("compaction", e);
    }

    /// Deletes one bounded batch of frames from the next dirty stream.
    fn compact_step(&mut self) -> Result<()> {
        let Some(name) = self.dirty.pop_front() else {
            return Ok(());
        };
        self.dirty_set.remove(&name);
        let plan = match self.plan(&name) {
            Ok(Some(plan)) => plan,
            Ok(None) => return Ok(()),
            Err(e) => {
                self.mark_dirty(&name);
                return Err(e);
            }
        };
        let store = self.store.clone();
        let sync_ahead = self.syncer.sync_ahead();
        let ((deleted, meta), durable) = store.write_logged(
            |txn| {
                let mut freed = 0;
                let deleted =
                    txn.delete_prefix(plan.meta.id, plan.meta.first_seq, plan.upto, |f| {
                        let go = f.seq <= plan.through_seq
                            || freed < plan.free_bytes
                            || f.ts_micros < plan.cutoff;
                        if go {
                            freed += f.payload_len;
                        }
                        go
                    })?;
                let mut meta = plan.meta.clone();
                meta.first_seq += deleted.frames;
                meta.frames = meta.frames.saturating_sub(deleted.frames);
                meta.bytes = meta.bytes.saturating_sub(deleted.bytes);
                if deleted.frames > 0 {
                    txn.put_stream(&name, &meta)?;
                }
                Ok((deleted, meta))
            },
            sync_ahead,
        )?;
        if let Some(s) = self.state.streams.get_mut(&name) {
            s.meta = meta.clone();
            s.oldest_ts = deleted.first_kept.map(|f| f.ts_micros);
        }
        if deleted.frames > 0 {
            let publish = Publish {
                hub: self.hub.clone(),
                updates: vec![StreamUpdate {
                    stream: name.clone(),
                    first_seq: meta.first_seq,
                    // Durable by the time this runs: the frames up to it
                    // were committed before this compaction, and are
                    // published first.
                    last_seq: meta.last_seq,
                    frames: Vec::new(),
                }],
                checkpoint_refs: self.checkpoint_refs.clone(),
                checkpoints: Vec::new(),
            };
            self.answer(durable, Some(publish), Vec::new(), Vec::new());
            // More may be due than one batch deletes.
            self.mark_dirty(&name);
        }
        Ok(())
    }

    /// What one compaction batch of `name` should delete; `None` when
    /// nothing is due.
    fn plan(&mut self, name: &str) -> Result<Option<CompactPlan>> {
        let cutoff = self.age_cutoff().unwrap_or(0);
        let r = self.opts.retention.clone();
        let Some(s) = self.state.streams.get_mut(name) else {
            return Ok(None);
        };
        if s.meta.frames == 0 {
            return Ok(None);
        }
        if cutoff > 0 && s.oldest_ts.is_none() {
            s.oldest_ts = self.store.frame_ts(s.meta.id, s.meta.first_seq)?;
        }
        let meta = &s.meta;
        // With no durable consumer, acks hold nothing back and delete
        // nothing: only retention applies.
        let acked = s.consumers.values().copied().min().unwrap_or(0);
        let over_count = r.max_frames.map_or(0, |m| meta.last_seq.saturating_sub(m));
        let through_seq = acked.max(over_count);
        let free_bytes = r.max_bytes.map_or(0, |m| meta.bytes.saturating_sub(m));
        let expired = s.oldest_ts.is_some_and(|t| t < cutoff);
        if through_seq < meta.first_seq && free_bytes == 0 && !expired {
            return Ok(None);
        }
        Ok(Some(CompactPlan {
            meta: meta.clone(),
            upto: meta.last_seq.min(meta.first_seq + COMPACT_BATCH - 1),
            through_seq,
            free_bytes,
            cutoff,
        }))
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

/// Stores `frame` as the next seq of `stream` (named `name`), updates the
/// cached metadata and stages the frame for publication after the commit.
fn put_new_frame(
    txn: &mut WriteTxn<'_>,
    stream: &mut StreamState,
    frame: Frame,
    staged: &mut Vec<(u64, Frame)>,
) -> Result<u64> {
    let seq = stream.meta.last_seq + 1;
    txn.put_frame(stream.meta.id, seq, &frame)?;
    if stream.meta.frames == 0 {
        stream.oldest_ts = Some(frame.ts_micros);
    }
    stream.meta.last_seq = seq;
    stream.meta.frames += 1;
    stream.meta.bytes += frame.payload.len() as u64;
    staged.push((seq, frame));
    Ok(seq)
}

/// One compaction batch: delete from `meta.first_seq`, no further than
/// `upto`, every frame through `through_seq`, then while `free_bytes` are
/// not yet freed or frames are older than `cutoff`.
#[derive(Debug)]
struct CompactPlan {
    meta: StreamMeta,
    upto: u64,
    through_seq: u64,
    free_bytes: u64,
    cutoff: u64,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn outcome(producer: &str, producer_seq: u64, duplicate: bool) -> AppendOutcome {
        AppendOutcome {
            stream: "s".into(),
            producer: producer.into(),
            producer_seq,
            seq: producer_seq,
            duplicate,
        }
    }

    fn failed_from(points: &[(&str, u64)]) -> HashMap<String, HashMap<String, u64>> {
        let producers = points
            .iter()
            .map(|(producer, seq)| (producer.to_string(), *seq))
            .collect();
        HashMap::from([("s".to_string(), producers)])
    }

    #[test]
    fn a_producer_has_resumed_once_its_first_unstored_seq_is_answered() {
        let mut failed = failed_from(&[("p", 5), ("q", 9)]);
        forget_resumed(
            &mut failed,
            &[outcome("p", 4, true), outcome("q", 8, false)],
        );
        assert_eq!(failed, failed_from(&[("p", 5), ("q", 9)]));
        forget_resumed(
            &mut failed,
            &[outcome("p", 5, false), outcome("p", 6, false)],
        );
        assert_eq!(failed, failed_from(&[("q", 9)]));
        forget_resumed(&mut failed, &[outcome("q", 9, false)]);
        assert!(failed.is_empty());
    }

    #[test]
    fn a_resend_found_stored_by_the_logs_replay_counts_as_resumed() {
        // The failed commit's record was replayed when the store was
        // reopened: the resend of its first seq is a duplicate.
        let mut failed = failed_from(&[("p", 5)]);
        forget_resumed(&mut failed, &[outcome("p", 5, true), outcome("p", 6, true)]);
        assert!(failed.is_empty());
    }
}
