//! The supervisor: executions of workers, each attempt run by a shim.
//!
//! * [`state`] is the transition table; [`policy`] decides restarts and
//!   backoff; [`manifest`] is the stored record of an execution (and
//!   validates run specs, makes ids); [`procfs`] names processes by pid and
//!   start time and signals them through pidfds; [`spawn`] starts shims.
//! * `attempt` runs attempts (run, launch, shim hello, worker exit, the
//!   policy's decision), `stop` stops them, `recovery` sorts out the
//!   recorded executions when the daemon starts, `remove` removes ended
//!   ones (`rm`, `prune`, `keep_ended`).
//! * [`Supervisor`] ties them together. It keeps every execution in memory,
//!   each behind its own async mutex, so that changes to one execution are
//!   serialised while different executions commit concurrently (and share
//!   group commits).
//!
//! Every change is made the same way: compute the next manifest and its
//! lifecycle events from the current one, validating each state
//! transition, commit manifest and events in one transaction through the
//! queue, and only then adopt the new manifest in memory. A failed commit
//! changes nothing. A transition and the decision that follows it (restart
//! or not) commit together, so a stored `failed` or `lost` is final.
//!
//! Work that reacts to the outside (a shim exiting, a timer) runs in tasks
//! that only *wait* in the cancellable part; the change itself runs in a
//! task nobody aborts, so a change is never cut off between its commit and
//! its adoption.

mod attempt;
pub mod manifest;
pub mod policy;
pub mod procfs;
mod recovery;
mod remove;
mod resume;
pub mod spawn;
pub mod state;
mod stop;

pub use recovery::{classify, Liveness};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use tether_protocol::time::now_micros;
use tether_protocol::{
    ExecState, ExecutionDetail, ExecutionInfo, RunSpecFull, ShimHello, WorkerExited,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};

use crate::engine::Queue;
use crate::{Config, Error, Result};
use manifest::{display_command, Manifest};
use procfs::{Pidfd, ProcessId};
use spawn::Launcher;

/// Longest worker output line kept as one frame; longer lines are split.
const MAX_LINE: u32 = 64 * 1024;
/// How long a checkpoint save waits for the shim to flush output through
/// before it takes its seq anyway.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// After SIGKILL, how long the worker's exit may take to be reported
/// before the shim itself is killed.
const KILL_GRACE: Duration = Duration::from_secs(5);
/// How long shutdown waits for changes in flight to commit.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a failed reaction to a shim exit or a timer waits before it
/// is tried again.
/// How long start-up waits for lost executions to be recorded.
const RECOVERY_SETTLE: Duration = Duration::from_secs(10);
const RETRY_DELAY: Duration = Duration::from_secs(1);
/// Tries at finding an unused execution id before giving up.
const ID_TRIES: usize = 16;

/// What the supervisor needs from the daemon's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// How shims are started.
    pub launcher: Launcher,
    /// The daemon's socket as an absolute path, handed to shims and workers.
    pub socket: PathBuf,
    /// Longest output line kept as one frame.
    pub max_line: u32,
    /// This boot's id.
    pub boot_id: String,
}

impl Settings {
    /// Settings from the daemon's configuration.
    pub fn from_config(config: &Config) -> Result<Self> {
        let program = config
            .shim_program()
            .map_err(|e| Error::io("cannot locate the shim program", e))?;
        let socket = std::path::absolute(&config.socket).map_err(|e| {
            Error::io(
                format!(
                    "cannot make socket path {} absolute",
                    config.socket.display()
                ),
                e,
            )
        })?;
        // A line and its frame envelope must fit the frame limit.
        let max_line = config.max_frame_len.saturating_sub(1024).max(1024);
        Ok(Self {
            launcher: Launcher {
                program,
                log_dir: config.shim_log_dir(),
            },
            socket,
            max_line: u32::try_from(max_line).unwrap_or(u32::MAX).min(MAX_LINE),
            boot_id: procfs::boot_id().map_err(|e| Error::io("cannot read the boot id", e))?,
        })
    }
}

/// A handle on the supervisor. Clones share it.
#[derive(Clone, Debug)]
pub struct Supervisor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    queue: Queue,
    settings: Settings,
    executions: Mutex<BTreeMap<String, Arc<Slot>>>,
    /// Cancelled on shutdown: timers and watchers stop waiting.
    shutdown: CancellationToken,
    /// Every task the supervisor starts, so that shutdown can wait for the
    /// changes in flight.
    tasks: TaskTracker,
}

/// One execution.
#[derive(Debug)]
struct Slot {
    exec: Arc<tokio::sync::Mutex<Execution>>,
    /// The committed manifest (`None` until the first commit of a new
    /// run), readable without waiting for a change in progress: `tether ps`
    /// reads it, `tether stop` waits on it.
    committed: watch::Sender<Option<Manifest>>,
    /// `run --name`, which never changes: readable before the first commit,
    /// so that a name is taken from the moment its run is reserved.
    name: Option<String>,
    /// When it was submitted, to tell the newest of ended ones apart.
    created_micros: u64,
    /// A resume has checked that no other live execution has the name
    /// and has not committed yet: the name counts as taken.
    reviving: AtomicBool,
    /// The session of the current attempt's shim, when it takes flush
    /// asks (see [`Supervisor::flush_output`]).
    flusher: Mutex<Option<Flusher>>,
}

/// Asks a shim's session to have the shim flush its output through: the
/// sender is answered once the shim has.
pub type Flusher = tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>;

impl Slot {
    /// The fields names are resolved by. Reserved, not yet committed
    /// executions are live.
    fn named<'a>(&'a self, id: &'a str) -> tether_protocol::Named<'a> {
        tether_protocol::Named {
            id,
            name: self.name.as_deref(),
            ended: !self.reviving.load(Ordering::Acquire)
                && self
                    .committed
                    .borrow()
                    .as_ref()
                    .is_some_and(|m| state::is_final(m.state)),
            created_micros: self.created_micros,
        }
    }
}

/// The in-memory side of an execution; `manifest` is always the committed one.
#[derive(Debug)]
struct Execution {
    manifest: Manifest,
    /// The current attempt's shim, while it may be alive.
    shim: Option<Arc<Pidfd>>,
    /// The current attempt's worker, once verified.
    worker: Option<Arc<Pidfd>>,
    /// The backoff or stop timer, aborted when replaced or dropped.
    timer: Option<AbortOnDropHandle<()>>,
    /// Whether the current attempt resumes from a checkpoint, as decided
    /// in the commit that started it (handed to its shim).
    resumed: bool,
    /// `tether restart` is stopping the current attempt: its end starts
    /// the next at once and is not counted as a failure. Kept in memory
    /// only: after a daemon restart the attempt's end meets the policy.
    restarting: bool,
}

/// A manifest change under construction: the next manifest and the
/// lifecycle events announcing it.
#[derive(Debug)]
struct Change {
    next: Manifest,
    events: Vec<String>,
    /// The change starts an attempt after the first: its commit also looks
    /// up the checkpoint the attempt resumes from.
    resume: bool,
    /// `tether resume --checkpoint`: the checkpoint to resume from.
    from_checkpoint: Option<u64>,
}

impl Change {
    fn of(manifest: &Manifest) -> Self {
        Self {
            next: manifest.clone(),
            events: Vec::new(),
            resume: false,
            from_checkpoint: None,
        }
    }

    /// Moves to `to`, announced by `event`. An illegal transition is
    /// refused and logged, and nothing of the change is applied.
    fn go(&mut self, to: ExecState, event: impl Into<String>) -> Result<()> {
        let from = self.next.state;
        if !state::allowed(from, to) {
            tracing::error!(
                execution = %self.next.id,
                "refusing illegal transition {} -> {}",
                from.as_str(),
                to.as_str()
            );
            return Err(Error::IllegalTransition {
                execution: self.next.id.clone(),
                from: from.as_str(),
                to: to.as_str(),
            });
        }
        self.next.state = to;
        self.events.push(event.into());
        Ok(())
    }

    /// An event with no transition.
    fn note(&mut self, event: impl Into<String>) {
        self.events.push(event.into());
    }

    /// Moves to `starting` for the next attempt.
    fn begin_attempt(&mut self) -> Result<()> {
        let attempt = self.next.attempt.saturating_add(1);
        let command = display_command(&self.next.spec.command);
        self.go(
            ExecState::Starting,
            format!("starting attempt {attempt}: {command}"),
        )?;
        if self.next.attempt > 0 {
            self.next.restarts = self.next.restarts.saturating_add(1);
        }
        self.next.attempt = attempt;
        self.resume = attempt > 1;
        self.next.shim = None;
        self.next.worker = None;
        self.next.next_attempt_micros = None;
        self.next.reason = None;
        self.next.setup.attempt_started_micros = now_micros();
        Ok(())
    }
}

impl Supervisor {
    /// Loads every manifest and sorts the unfinished executions out before
    /// any connection is accepted: a live shim (pid, start time and boot
    /// all match) is held by a pidfd until it says hello again; any other
    /// `starting` or `running` execution is lost and handled by its
    /// restart policy; `pending` ones start and `backoff` timers resume
    /// (those actions run in the background once this returns).
    pub async fn start(
        queue: Queue,
        settings: Settings,
        shutdown: CancellationToken,
    ) -> Result<Supervisor> {
        let inner = Arc::new(Inner {
            queue,
            settings,
            executions: Mutex::new(BTreeMap::new()),
            shutdown,
            tasks: TaskTracker::new(),
        });
        let rows = inner.queue.load_executions().await?;
        let mut recovered = 0;
        let mut settling = Vec::new();
        for (id, bytes) in rows {
            let manifest = match Manifest::decode(&id, &bytes) {
                Ok(m) => m,
                Err(e) => {
                    // One unreadable record must not keep the daemon and
                    // every other execution down; it is left as it is.
                    tracing::error!("{e}; leaving execution {id} alone");
                    continue;
                }
            };
            if !state::is_final(manifest.state) {
                recovered += 1;
            }
            settling.extend(inner.recover_one(manifest));
        }
        // An execution whose shim is gone is recorded lost before the
        // socket accepts anything, so that no client is ever shown a dead
        // process as running. Bounded: a store that cannot commit (disk
        // full) must not keep the daemon from serving; the task goes on.
        let deadline = tokio::time::Instant::now() + RECOVERY_SETTLE;
        for task in settling {
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::warn!("lost executions still being recorded after {RECOVERY_SETTLE:?}");
                break;
            }
        }
        if recovered > 0 {
            tracing::info!("recovered {recovered} unfinished executions");
        }
        Ok(Supervisor { inner })
    }

    /// Records a new execution and starts its first attempt. Resolves with
    /// the execution id once the execution is durable; the shim is started
    /// right after.
    pub async fn run(&self, run: RunSpecFull) -> Result<String> {
        let inner = self.inner.clone();
        self.inner.detach(async move { inner.run(run).await }).await
    }

    /// The executions, oldest first; without `all`, only unfinished ones.
    pub fn list(&self, all: bool) -> Vec<ExecutionInfo> {
        self.manifests(all)
            .iter()
            .map(|m| self.inner.info(m))
            .collect()
    }

    /// [`Supervisor::list`] with each execution's environment keys and
    /// directory and, while a worker runs, its CPU and memory use.
    pub fn list_full(&self, all: bool) -> Vec<ExecutionDetail> {
        // Children are found among every execution, ended ones included.
        let mut children: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in self.manifests(true) {
            if let Some(parent) = &m.setup.parent {
                children
                    .entry(parent.clone())
                    .or_default()
                    .push(m.id.clone());
            }
        }
        self.manifests(all)
            .iter()
            .map(|m| {
                let running = matches!(m.state, ExecState::Running | ExecState::Starting);
                let usage = m.worker.filter(|_| running).and_then(procfs::usage);
                ExecutionDetail {
                    info: self.inner.info(m),
                    env_keys: m.spec.env.iter().map(|(key, _)| key.clone()).collect(),
                    cwd: m.spec.cwd.clone(),
                    cpu_per_mille: usage.map(|u| u.cpu_per_mille),
                    rss_bytes: usage.map(|u| u.rss_bytes),
                    labels: m.setup.labels.clone(),
                    parent: m.setup.parent.clone(),
                    children: children.get(&m.id).cloned().unwrap_or_default(),
                    max_restarts: m.spec.max_restarts,
                    deadline_ms: m.spec.deadline_ms,
                    stop_signal: m.setup.stop_signal.clone(),
                    max_failures_without_progress: m.setup.max_failures_without_progress,
                }
            })
            .collect()
    }

    /// The committed manifests, oldest first; without `all`, only those of
    /// unfinished executions.
    fn manifests(&self, all: bool) -> Vec<Manifest> {
        let slots: Vec<Arc<Slot>> = self.inner.slots().values().cloned().collect();
        let mut out: Vec<Manifest> = slots
            .iter()
            .filter_map(|slot| {
                let committed = slot.committed.borrow();
                let m = committed.as_ref()?;
                (all || !state::is_final(m.state)).then(|| m.clone())
            })
            .collect();
        out.sort_by(|a, b| (a.created_micros, &a.id).cmp(&(b.created_micros, &b.id)));
        out
    }

    /// One execution's row, as last committed.
    pub fn get(&self, id: &str) -> Result<ExecutionInfo> {
        let slot = self.inner.slot(id)?;
        let committed = slot.committed.borrow();
        committed
            .as_ref()
            .map(|m| self.inner.info(m))
            .ok_or_else(|| Error::ExecutionNotFound(id.to_owned()))
    }

    /// The id of the execution `key` names: `key` itself when it is an
    /// id, else the live execution named `key`, else the newest ended one
    /// so named ([`tether_protocol::find_execution`]). A key that names
    /// none is returned as it is, for the request to fail on as before.
    pub fn resolve(&self, key: &str) -> String {
        let slots = self.inner.slots();
        if slots.contains_key(key) {
            return key.to_owned();
        }
        let found = tether_protocol::find_execution(slots.iter(), key, |(id, slot)| slot.named(id));
        found.map_or_else(|| key.to_owned(), |(id, _)| id.clone())
    }

    /// How many executions the store holds.
    pub fn count(&self) -> u64 {
        let slots = self.inner.slots();
        slots
            .values()
            .filter(|slot| slot.committed.borrow().is_some())
            .count() as u64
    }

    /// Stops an execution: SIGTERM to its worker, SIGKILL after `timeout`;
    /// it ends `cancelled`. A pending or backing-off execution is cancelled
    /// at once; one that has already ended is returned as it is. Resolves
    /// once the execution has ended.
    pub async fn stop(&self, id: &str, timeout: Duration) -> Result<ExecutionInfo> {
        let inner = self.inner.clone();
        let owned = id.to_owned();
        let mut ended = self
            .inner
            .detach(async move { inner.request_stop(&owned, timeout).await })
            .await?;
        let shutdown = self.inner.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => return Err(Error::ShuttingDown),
            waited = ended.wait_for(|m| m.as_ref().is_some_and(|m| state::is_final(m.state))) => {
                if waited.is_err() {
                    return Err(Error::ShuttingDown);
                }
            }
        }
        self.get(id)
    }

    /// Starts a new attempt of an ended execution from its newest valid
    /// checkpoint (or `checkpoint`). Resolves once the attempt's start is
    /// committed; see `resume.rs`.
    pub async fn resume(&self, id: &str, checkpoint: Option<u64>) -> Result<String> {
        let inner = self.inner.clone();
        let owned = id.to_owned();
        self.inner
            .detach(async move { inner.resume_ended(&owned, checkpoint).await })
            .await?;
        Ok(id.to_owned())
    }

    /// Stops the current attempt (SIGTERM, SIGKILL after `timeout`) and
    /// starts the next at once. Resolves once the next attempt's start is
    /// committed; see `resume.rs`.
    pub async fn restart(&self, id: &str, timeout: Duration) -> Result<String> {
        let inner = self.inner.clone();
        let owned = id.to_owned();
        let (mut committed, attempt) = self
            .inner
            .detach(async move { inner.request_restart(&owned, timeout).await })
            .await?;
        let shutdown = self.inner.shutdown.clone();
        tokio::select! {
            _ = shutdown.cancelled() => return Err(Error::ShuttingDown),
            waited = committed.wait_for(|m| {
                m.as_ref().is_some_and(|m| m.attempt > attempt || state::is_final(m.state))
            }) => {
                if waited.is_err() {
                    return Err(Error::ShuttingDown);
                }
            }
        }
        let info = self.get(id)?;
        if state::is_final(info.state) && info.attempt == attempt {
            return Err(Error::InvalidRequest(format!(
                "execution {id} ended ({}) instead of restarting",
                info.state.as_str()
            )));
        }
        Ok(id.to_owned())
    }

    /// Takes `flusher` as the way to the shim of `attempt` of `id`, which
    /// its session has just accepted.
    pub fn attach_flusher(&self, id: &str, flusher: Flusher) {
        if let Ok(slot) = self.inner.slot(id) {
            *slot.flusher.lock().unwrap_or_else(PoisonError::into_inner) = Some(flusher);
        }
    }

    /// Has the shim of the execution `id`, when one is attached, append
    /// and have acknowledged every line its worker wrote so far: a
    /// checkpoint saved after this gets a seq above them. Returns at once
    /// without a live shim, and after [`FLUSH_TIMEOUT`] at most (logged):
    /// a slow shim delays a save, never stops it.
    pub async fn flush_output(&self, id: &str) {
        let Ok(slot) = self.inner.slot(id) else {
            return;
        };
        let live = slot
            .committed
            .borrow()
            .as_ref()
            .is_some_and(|m| state::has_shim(m.state));
        if !live {
            return;
        }
        let flusher = slot
            .flusher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(flusher) = flusher else {
            return;
        };
        let (done, flushed) = tokio::sync::oneshot::channel();
        if flusher.try_send(done).is_err() {
            // Its session has ended, or has asks enough in flight.
            return;
        }
        if tokio::time::timeout(FLUSH_TIMEOUT, flushed).await.is_err() {
            tracing::warn!(
                execution = %id,
                "the shim did not flush output within {FLUSH_TIMEOUT:?}; saving the checkpoint anyway"
            );
        }
    }

    /// A shim says hello for `hello.attempt` of `hello.execution`. Refused
    /// with [`Error::ExecutionNotFound`] for an unknown execution and
    /// [`Error::InvalidRequest`] when that attempt has ended (the shim then
    /// kills its worker) or the shim is not the one started for it.
    pub async fn shim_hello(&self, hello: ShimHello) -> Result<()> {
        let inner = self.inner.clone();
        self.inner
            .detach(async move { inner.shim_hello(&hello).await })
            .await
    }

    /// A shim reports its worker's exit. Recording it twice is harmless:
    /// an exit for an attempt that has already ended is accepted as
    /// already recorded.
    pub async fn worker_exited(&self, exited: WorkerExited) -> Result<()> {
        let inner = self.inner.clone();
        self.inner
            .detach(async move { inner.worker_exited(&exited).await })
            .await
    }

    /// Stops timers and watchers and waits (bounded) for changes in flight
    /// to commit. Shims and workers are left running: the next daemon
    /// reattaches them.
    pub async fn close(&self) {
        self.inner.shutdown.cancel();
        self.inner.tasks.close();
        if tokio::time::timeout(CLOSE_TIMEOUT, self.inner.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("supervisor tasks still busy after {CLOSE_TIMEOUT:?}; closing anyway");
        }
    }
}

impl Inner {
    fn slots(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Slot>>> {
        // Each change is one insert or remove: sound after a panic.
        self.executions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, id: &str) -> Result<Arc<Slot>> {
        self.slots()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::ExecutionNotFound(id.to_owned()))
    }

    fn info(&self, manifest: &Manifest) -> ExecutionInfo {
        let last_seq = self
            .queue
            .stream_range(&manifest.id)
            .map_or(0, |(_, last)| last);
        let mut info = manifest.info(last_seq);
        info.last_checkpoint = self.queue.last_checkpoint(&manifest.id);
        // `waiting` is running with a question of this attempt open: shown
        // from the questions, never stored, so that it comes back with
        // them after a crash (see `crate::gates`).
        if manifest.state == ExecState::Running {
            if let Some(text) = self
                .queue
                .gates()
                .waiting_on(&manifest.id, manifest.attempt)
            {
                info.state = ExecState::Waiting;
                info.reason = Some(text);
            }
        }
        info
    }

    /// Runs `work` in a task of its own, so that a caller that goes away
    /// (a client disconnecting) cannot cut a change off half-way.
    async fn detach<T: Send + 'static>(
        &self,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        self.tasks
            .spawn(work)
            .await
            .map_err(|e| Error::storage("a supervisor task failed", e))?
    }

    /// Commits `change` and adopts it.
    async fn commit(&self, slot: &Slot, exec: &mut Execution, mut change: Change) -> Result<()> {
        if state::is_final(change.next.state) && change.next.ended_micros.is_none() {
            change.next.ended_micros = Some(now_micros());
        }
        let bytes = change.next.encode()?;
        let events: Vec<Bytes> = change.events.into_iter().map(Bytes::from).collect();
        for event in &events {
            tracing::info!(
                execution = %change.next.id,
                "{}",
                String::from_utf8_lossy(event)
            );
        }
        if change.resume {
            let (_, resume) = self
                .queue
                .record_attempt_start(&change.next.id, bytes, events, change.from_checkpoint)
                .await?;
            exec.resumed = resume.resumed();
        } else {
            self.queue
                .record_execution(&change.next.id, bytes, events)
                .await?;
        }
        exec.manifest = change.next;
        if state::is_final(exec.manifest.state) {
            exec.timer = None;
            exec.worker = None;
            exec.restarting = false;
        }
        slot.committed.send_replace(Some(exec.manifest.clone()));
        Ok(())
    }

    // -- timers --------------------------------------------------------------

    /// A task that waits until `at_micros` (wall clock, as stored) and then
    /// runs `action` in a task of its own, which aborting the timer does
    /// not reach.
    fn timer<F, Fut>(
        self: &Arc<Self>,
        what: String,
        at_micros: u64,
        action: F,
    ) -> AbortOnDropHandle<()>
    where
        F: Fn(Arc<Inner>) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let weak: Weak<Inner> = Arc::downgrade(self);
        let shutdown = self.shutdown.clone();
        let handle = self.tasks.spawn(async move {
            let wait = Duration::from_micros(at_micros.saturating_sub(now_micros()));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let Some(inner) = weak.upgrade() else { return };
            let tasks = inner.tasks.clone();
            tasks.spawn(async move {
                inner
                    .clone()
                    .retry_until_done(&what, || action(inner.clone()))
                    .await;
            });
        });
        AbortOnDropHandle::new(handle)
    }

    /// Runs a reaction to the outside (a shim exit, a timer) until it
    /// succeeds or fails for good: nothing else would ever retry it, and an
    /// execution must not stay `running` with a dead shim because one
    /// commit met a full disk. Storage failures are retried every
    /// [`RETRY_DELAY`] until shutdown.
    async fn retry_until_done<F, Fut>(self: Arc<Self>, what: &str, mut attempt: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        loop {
            match attempt().await {
                Ok(()) => return,
                Err(
                    e @ (Error::Storage { .. }
                    | Error::Invariant(_)
                    | Error::Refused(_)
                    | Error::DiskFull { .. }),
                ) => {
                    tracing::warn!("{what} failed: {e}; retrying in {RETRY_DELAY:?}");
                }
                Err(e) => {
                    tracing::error!("{what} failed: {e}");
                    return;
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(RETRY_DELAY) => {}
            }
        }
    }
}

/// A slot for `manifest`; `committed` says whether it is already stored.
fn new_slot(
    manifest: Manifest,
    committed: bool,
    shim: Option<Arc<Pidfd>>,
    worker: Option<Arc<Pidfd>>,
) -> Arc<Slot> {
    let (committed, _) = watch::channel(committed.then(|| manifest.clone()));
    let name = manifest.spec.name.clone();
    let created_micros = manifest.created_micros;
    Arc::new(Slot {
        name,
        created_micros,
        reviving: AtomicBool::new(false),
        flusher: Mutex::new(None),
        exec: Arc::new(tokio::sync::Mutex::new(Execution {
            manifest,
            shim,
            worker,
            timer: None,
            resumed: false,
            restarting: false,
        })),
        committed,
    })
}

/// Signals the worker and what it started: its process group (the worker
/// alone when it leads none) through its pidfd, then every other process
/// of its shim's session except the shim, so that children of a shell
/// script holding its output pipes go too. Before the shim has reported
/// the worker, only the session is signalled.
fn terminate_worker(exec: &Execution, signal: i32) {
    let id = &exec.manifest.id;
    if let Some(worker) = &exec.worker {
        match worker.signal_group(signal) {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(execution = %id, "worker pid {} already exited", worker.pid())
            }
            Err(e) => {
                tracing::warn!(execution = %id, "cannot signal worker pid {}: {e}", worker.pid())
            }
        }
    }
    if let Some(shim) = exec.manifest.shim.filter(|_| exec.shim.is_some()) {
        if let Err(e) = procfs::signal_session(shim, false, signal) {
            tracing::warn!(execution = %id, "cannot signal the session of shim pid {}: {e}", shim.pid);
        }
    }
}

/// SIGKILLs what runs in a shim's session: the shim too when `with_shim`.
fn sweep_session(shim: ProcessId, with_shim: bool) {
    match procfs::signal_session(shim, with_shim, libc::SIGKILL) {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            "killed {n} processes in the session of shim pid {}",
            shim.pid
        ),
        Err(e) => tracing::warn!("cannot clear the session of shim pid {}: {e}", shim.pid),
    }
}

/// SIGKILLs a recorded process if it is still that process.
fn kill_verified(id: ProcessId) {
    match Pidfd::open_verified(id) {
        Ok(Some(pidfd)) => {
            if let Err(e) = pidfd.signal_group(libc::SIGKILL) {
                tracing::warn!("cannot kill pid {}: {e}", id.pid);
            }
        }
        Ok(None) => {}
        Err(e) => tracing::warn!("cannot check pid {}: {e}", id.pid),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tether_protocol::RestartPolicy;

    use super::*;

    fn manifest(state: ExecState) -> Manifest {
        let spec = tether_protocol::RunSpec {
            name: None,
            command: vec!["true".into()],
            cwd: None,
            env: Vec::new(),
            restart: RestartPolicy::OnFailure,
            max_restarts: None,
            deadline_ms: None,
        };
        let run = RunSpecFull::from(spec);
        let mut m = Manifest::new("true-aaaaaa".into(), run, 1, "boot".into());
        m.state = state;
        m
    }

    #[test]
    fn an_illegal_transition_is_refused_and_changes_nothing() {
        let m = manifest(ExecState::Completed);
        let mut change = Change::of(&m);
        let e = change.go(ExecState::Running, "running again").unwrap_err();
        assert!(matches!(
            e,
            Error::IllegalTransition {
                from: "completed",
                to: "running",
                ..
            }
        ));
        assert_eq!(e.code(), tether_protocol::ErrorCode::INTERNAL);
        assert_eq!(change.next, m);
        assert!(change.events.is_empty());
    }

    #[test]
    fn a_new_attempt_counts_restarts_after_the_first() {
        let mut change = Change::of(&manifest(ExecState::Pending));
        change.begin_attempt().unwrap();
        assert_eq!((change.next.attempt, change.next.restarts), (1, 0));
        assert_eq!(change.events, ["starting attempt 1: true"]);
        change.go(ExecState::Running, "started pid 1").unwrap();
        change.go(ExecState::Failed, "exited 1").unwrap();
        change.begin_attempt().unwrap();
        assert_eq!((change.next.attempt, change.next.restarts), (2, 1));
        assert_eq!(change.next.state, ExecState::Starting);
    }

    #[test]
    fn a_live_shim_is_told_from_a_dead_or_reused_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let boot = procfs::boot_id().unwrap();
        let mut m = manifest(ExecState::Running);
        m.boot_id = boot.clone();
        assert!(matches!(classify(&m, &boot).unwrap(), Liveness::Gone(r) if r.contains("no shim")));
        let id = procfs::identify(child.id()).unwrap();
        m.shim = Some(id);
        assert!(matches!(classify(&m, &boot).unwrap(), Liveness::Live(p) if p.pid() == id.pid));
        m.shim = Some(ProcessId {
            start_ticks: id.start_ticks + 1,
            ..id
        });
        assert!(matches!(classify(&m, &boot).unwrap(), Liveness::Gone(r) if r.contains("is gone")));
        m.shim = Some(id);
        assert!(matches!(
            classify(&m, "another boot").unwrap(),
            Liveness::Gone(r) if r.contains("earlier boot")
        ));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(matches!(classify(&m, &boot).unwrap(), Liveness::Gone(_)));
    }
}
