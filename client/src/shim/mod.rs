//! The per-worker shim: the process between the daemon and one attempt of a
//! supervised worker, in the shape of containerd-shim and conmon.
//!
//! tetherd starts `tether-shim` in a session of its own and writes a
//! [`ShimSpecFull`] to its stdin ([`spec`]). The shim starts the worker
//! ([`worker`]), holds its stdout and stderr pipes (or its pseudo-terminal,
//! [`pty`]), turns every line into a frame on the execution's stream
//! ([`lines`]), reaps the worker and reports how it ended. Because the daemon is not the worker's parent and does not
//! hold its pipes, a daemon restart loses neither the worker nor its output.
//!
//! Towards the daemon the shim is a producer ([`Publisher`]) named
//! `shim-<execution>-<attempt>`, whose producer seqs number the frames in
//! the order they are sent (stdout and stderr share them). Every session
//! opens with a `ShimHello` naming the shim and the worker by pid, start time
//! ([`procfs`]) and boot id; only once the daemon accepts it are
//! unacknowledged frames resent. While the daemon is away the frames wait in
//! a bounded window; when it is full the shim stops reading the pipes, so
//! the worker blocks on its next write and nothing is lost. The shim never
//! gives up reconnecting while it holds a running worker or unacknowledged
//! frames.
//!
//! When a checkpoint of its execution is being saved, the daemon asks the
//! shim to flush output through (`FlushOutput`): the shim reads what the
//! worker has written so far, and once those frames are acknowledged
//! answers `OutputFlushed`; only then does the checkpoint take its seq, so
//! no line written before a save lands above it.
//!
//! When the worker has exited and both pipes are at end of file, the shim
//! waits until every frame is acknowledged, then sends `WorkerExited` and
//! waits for `ExitRecorded` (sending it again after a reconnect), and exits
//! 0. If the daemon refuses the shim (the execution is unknown or has
//! ended), the shim kills its worker and exits 1.
//!
//! The shim writes a few lines about its life to its stderr, which the
//! daemon points at a log file per execution. The worker gets none of the
//! shim's descriptors but its three ([`inherited`]).

pub mod lines;
pub mod procfs;
pub mod pty;
pub mod spec;
pub mod worker;

use std::fmt::Display;
use std::io::Write;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use tether_protocol::{
    validate_name, Capabilities, ErrorCode, ExitStatus, FrameKind, Request, Response, ShimHello,
    ShimSpec, ShimSpecFull, WorkerExited,
};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Child;

use crate::backoff::Backoff;
use crate::conn::{ConnectOptions, Connector, Endpoint, StorageFaultNotice, RETRY_FOREVER};
use crate::error::{Error, Result};
use crate::publisher::{FlushAsk, Greeting, Publisher, PublisherOptions};
use crate::time::{now_micros, Rfc3339};
use lines::LineSplitter;
use worker::{Output, Worker};

/// Frames in the window of unacknowledged output.
pub const DEFAULT_WINDOW: usize = 4096;
/// Payload bytes in the window of unacknowledged output. Small, because a
/// shim runs per worker and should stay within a few MiB of memory; the
/// daemon commits in batches far smaller than this.
pub const DEFAULT_MAX_UNACKED_BYTES: usize = 1024 * 1024;
/// Bytes asked for per read of a pipe.
pub const DEFAULT_READ_CHUNK: usize = 32 * 1024;
/// Initial size of the session's buffers: the shim writes frames of about
/// a line each and reads only acknowledgements, so it needs little.
const BUFFER_SIZE: usize = 32 * 1024;
/// How long a killed worker is given to be reaped before the shim exits
/// anyway.
const REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// How a shim behaves; the defaults suit production.
#[derive(Debug, Clone)]
pub struct ShimOptions {
    /// Frames allowed in the window of unacknowledged output.
    pub window: usize,
    /// Payload bytes allowed in the window of unacknowledged output.
    pub max_unacked_bytes: usize,
    /// Bytes asked for per read of a pipe.
    pub read_chunk: usize,
    /// First delay before reconnecting to the daemon.
    pub backoff_initial: Duration,
    /// Largest delay between reconnects. Short, so that shims reattach
    /// soon after a daemon restart.
    pub backoff_cap: Duration,
    /// Largest pause after an error that reconnecting does not obviously
    /// cure (the daemon refusing a request it should take).
    pub error_pause_cap: Duration,
}

impl Default for ShimOptions {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_unacked_bytes: DEFAULT_MAX_UNACKED_BYTES,
            read_chunk: DEFAULT_READ_CHUNK,
            backoff_initial: Duration::from_millis(20),
            backoff_cap: Duration::from_secs(1),
            error_pause_cap: Duration::from_secs(5),
        }
    }
}

/// How a shim's run ended.
#[derive(Debug)]
pub enum Outcome {
    /// The daemon recorded the worker's exit.
    Recorded,
    /// The daemon refused the shim (the execution is unknown or has ended);
    /// the worker, if it was still running, was killed.
    Refused(Error),
    /// The shim could not do its job at all (an invalid spec, a failure to
    /// wait for its own child).
    Failed(Error),
}

impl Outcome {
    /// The shim's exit code: 0 recorded, 1 refused, 2 for an invalid spec,
    /// 1 for other failures.
    pub fn exit_code(&self) -> u8 {
        match self {
            Outcome::Recorded => 0,
            Outcome::Refused(_) => 1,
            Outcome::Failed(e) => e.exit_code(),
        }
    }
}

/// The producer name of an attempt's output.
pub fn producer_name(spec: &ShimSpec) -> String {
    format!("shim-{}-{}", spec.execution, spec.attempt)
}

/// Runs one attempt to its end: starts the worker, relays its output,
/// reports its exit. Logs to stderr as it goes.
pub async fn run(spec: ShimSpecFull, options: ShimOptions) -> Outcome {
    let log = Log::new(&spec.spec);
    let outcome = supervise(&spec, &options, &log).await;
    match &outcome {
        Outcome::Recorded => log.say("the daemon recorded the exit; done"),
        Outcome::Refused(e) => log.say(format_args!("{e}; giving up")),
        Outcome::Failed(e) => log.say(format_args!("failed: {e}")),
    }
    outcome
}

async fn supervise(full: &ShimSpecFull, options: &ShimOptions, log: &Log) -> Outcome {
    let spec = &full.spec;
    let producer = producer_name(spec);
    if let Err(e) =
        validate_name("stream", &spec.execution).and_then(|()| validate_name("producer", &producer))
    {
        return Outcome::Failed(e.into());
    }
    let spawned = worker::spawn(full);
    let hello = hello(spec, spawned.as_ref().ok(), log);
    let publisher = match Publisher::new(
        connector(spec, options),
        spec.execution.clone(),
        producer,
        PublisherOptions {
            window: options.window,
            max_unacked_bytes: options.max_unacked_bytes,
            kind: FrameKind::Stdout,
            greeting: Some(Greeting {
                request: Request::ShimHello(hello),
                accepts: |r| matches!(r, Response::ShimAccepted),
            }),
        },
    ) {
        Ok(publisher) => publisher,
        Err(e) => {
            if let Ok(mut worker) = spawned {
                kill(&mut worker.child, log).await;
            }
            return Outcome::Failed(e);
        }
    };
    let max_frame = match spec.max_line {
        0 => publisher.max_payload(),
        n => (n as usize).min(publisher.max_payload()),
    };
    let mut shim = Shim {
        publisher,
        log,
        pause: Backoff::new(options.backoff_initial, options.error_pause_cap),
        next_seq: 0,
        sessions_seen: 0,
    };
    let status = match spawned {
        Ok(worker) => {
            // Debug formatting keeps a multi-line script on one log line.
            log.say(format_args!(
                "started worker pid {}: {:?}",
                worker.pid, spec.command
            ));
            match shim.relay(worker, max_frame, options.read_chunk).await {
                Ok(status) => status,
                Err(Stop::Refused(e)) => return Outcome::Refused(e),
                Err(Stop::Failed(e)) => return Outcome::Failed(e),
            }
        }
        Err(reason) => {
            log.say(format_args!("cannot start the worker: {reason}"));
            ExitStatus::SpawnFailed(reason)
        }
    };
    shim.report(spec, status).await
}

/// Why relaying stopped before the worker's end was reported.
enum Stop {
    Refused(Error),
    Failed(Error),
}

/// The running shim's state.
struct Shim<'a> {
    publisher: Publisher,
    log: &'a Log,
    /// Pauses between retries after errors that are not plain connection
    /// losses (those are paced by the publisher's own backoff).
    pause: Backoff,
    /// The producer seq of the last frame handed to the publisher.
    next_seq: u64,
    /// Sessions already logged.
    sessions_seen: u64,
}

impl Shim<'_> {
    /// Relays the worker's output until it has exited and both pipes are
    /// at end of file, and returns how it ended.
    async fn relay(
        &mut self,
        worker: Worker,
        max_frame: usize,
        chunk: usize,
    ) -> std::result::Result<ExitStatus, Stop> {
        let Worker {
            mut child, output, ..
        } = worker;
        let (stdout, stderr): (Reader, Option<Reader>) = match output {
            Output::Pipes { stdout, stderr } => (Box::new(stdout), Some(Box::new(stderr))),
            // One terminal carries both, as kind stdout.
            Output::Pty(master) => (Box::new(master), None),
        };
        let mut out = Pipe::new(Some(stdout), FrameKind::Stdout, max_frame, chunk);
        let mut err = Pipe::new(stderr, FrameKind::Stderr, max_frame, chunk);
        let mut status = None;
        let mut flushes = Flushes::default();
        loop {
            if let (Some(status), false, false) = (&status, out.is_open(), err.is_open()) {
                return Ok(ExitStatus::clone(status));
            }
            self.flush_through(&mut flushes, &mut out, &mut err)
                .await
                .map_err(Stop::Failed)?;
            // Pipes are read only while the window has room: when it is
            // full the worker blocks on its next write instead of output
            // piling up here.
            let room = self.publisher.has_room();
            tokio::select! {
                progressed = self.publisher.progress() => match progressed {
                    Ok(()) => self.note_sessions(),
                    Err(e) if is_refusal(&e) => {
                        kill(&mut child, self.log).await;
                        return Err(Stop::Refused(e));
                    }
                    Err(e) => self.pause_after(e).await,
                },
                waited = child.wait(), if status.is_none() => {
                    let waited = waited.map_err(|source| Stop::Failed(Error::Local {
                        context: "cannot wait for the worker".into(),
                        source,
                    }))?;
                    let ended = worker::exit_status(waited);
                    self.log.say(format_args!("worker ended: {}", worker::describe(&ended)));
                    status = Some(ended);
                }
                read = out.read(), if room && out.is_open() => {
                    self.take(&mut out, read).map_err(Stop::Failed)?;
                }
                read = err.read(), if room && err.is_open() => {
                    self.take(&mut err, read).map_err(Stop::Failed)?;
                }
            }
        }
    }

    /// Serves the daemon's asks to flush output through now (a checkpoint
    /// is being saved): reads everything the worker has written so far
    /// (as far as the window has room), and answers each ask once every
    /// frame pushed by then is acknowledged, so that the checkpoint's seq
    /// is above every line written before it was saved.
    async fn flush_through<A, B>(
        &mut self,
        flushes: &mut Flushes,
        out: &mut Pipe<A>,
        err: &mut Pipe<B>,
    ) -> Result<()>
    where
        A: AsyncRead + Unpin,
        B: AsyncRead + Unpin,
    {
        let asks = self.publisher.take_flush_asks();
        if !asks.is_empty() {
            flushes.draining.extend(asks);
            flushes.yielded = false;
        }
        if !flushes.draining.is_empty() {
            if !flushes.yielded {
                // One turn of the runtime first, so that its reactor has
                // seen every pipe readable that has data: a read polled
                // once below then finds what the worker wrote before it
                // asked to save.
                tokio::task::yield_now().await;
                flushes.yielded = true;
            }
            let mut drained = true;
            for pipe in [&mut *out as &mut dyn Drain, &mut *err] {
                while pipe.open() {
                    if !self.publisher.has_room() {
                        // The rest is read once acknowledgements make room.
                        drained = false;
                        break;
                    }
                    match pipe.read_now() {
                        Some(read) => pipe.take_into(self, read)?,
                        None => break,
                    }
                }
            }
            if drained {
                let through = self.next_seq;
                let asks = flushes.draining.drain(..);
                flushes.waiting.extend(asks.map(|ask| (ask, through)));
            }
        }
        let acked = self.publisher.acked_through();
        let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut flushes.waiting)
            .into_iter()
            .partition(|(_, through)| *through <= acked);
        flushes.waiting = waiting;
        for (ask, _) in done {
            self.publisher.answer_flush(ask)?;
        }
        Ok(())
    }

    /// Hands the frames of one read to the publisher. End of file (or a
    /// read error, logged) closes the pipe after its last partial line.
    fn take<R>(&mut self, pipe: &mut Pipe<R>, read: std::io::Result<usize>) -> Result<()> {
        let eof = match read {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => {
                self.log.say(format_args!(
                    "cannot read the worker's {}: {e}; closing it",
                    pipe.kind.as_str()
                ));
                true
            }
        };
        // Every line of one read is dated by the read: it is when the shim
        // had it, kept across a daemon outage (see `Publisher::push_stamped`).
        let read_at = tether_protocol::time::now_micros();
        while let Some(frame) = pipe.lines.next_frame() {
            self.push(pipe.kind, frame, read_at)?;
        }
        if eof {
            if let Some(rest) = pipe.lines.finish() {
                self.push(pipe.kind, rest, read_at)?;
            }
            pipe.close();
        }
        Ok(())
    }

    fn push(&mut self, kind: FrameKind, payload: Bytes, read_at: u64) -> Result<()> {
        self.next_seq += 1;
        self.publisher
            .push_stamped(self.next_seq, kind, payload, read_at)
    }

    /// Reports the worker's end once every frame is acknowledged, and
    /// waits until the daemon has recorded it.
    async fn report(&mut self, spec: &ShimSpec, status: ExitStatus) -> Outcome {
        let exited = Request::WorkerExited(WorkerExited {
            execution: spec.execution.clone(),
            attempt: spec.attempt,
            status,
        });
        loop {
            let answer = self
                .publisher
                .finish(&exited, |r| matches!(r, Response::ExitRecorded))
                .await;
            self.note_sessions();
            match answer {
                Ok(_) => return Outcome::Recorded,
                // With the worker gone, a permanent refusal of anything is
                // final: the daemon has moved past this attempt and there
                // is no output left to wait for. (While the worker runs,
                // only a refused ShimHello ends the shim; see `relay`.)
                Err(e) if is_refusal(&e) || is_refused_report(&e) => return Outcome::Refused(e),
                Err(e) => self.pause_after(e).await,
            }
        }
    }

    /// Logs an error that reconnecting may not cure and waits before the
    /// next attempt, so that a daemon that keeps refusing is not hammered.
    async fn pause_after(&mut self, e: Error) {
        let delay = self.pause.next_delay();
        self.log
            .say(format_args!("{e}; retrying in {}ms", delay.as_millis()));
        tokio::time::sleep(delay).await;
    }

    /// Logs each new session once: the first attach and every reattach.
    fn note_sessions(&mut self) {
        let sessions = self.publisher.sessions();
        if sessions == self.sessions_seen {
            return;
        }
        self.sessions_seen = sessions;
        self.pause.reset();
        if sessions == 1 {
            self.log.say("attached to tetherd");
        } else {
            self.log
                .say(format_args!("reattached to tetherd (session {sessions})"));
        }
    }
}

/// The daemon's flush asks: those whose output is still being read, and
/// those waiting for their frames' acknowledgement, each with the producer
/// seq that must be acknowledged first.
#[derive(Default)]
struct Flushes {
    draining: Vec<FlushAsk>,
    /// The runtime has had its turn since the newest ask came.
    yielded: bool,
    waiting: Vec<(FlushAsk, u64)>,
}

/// A pipe read without waiting, whatever its reader's type.
trait Drain {
    fn open(&self) -> bool;
    /// A read that completes at once, or `None` when it would wait.
    fn read_now(&mut self) -> Option<std::io::Result<usize>>;
    fn take_into(&mut self, shim: &mut Shim<'_>, read: std::io::Result<usize>) -> Result<()>;
}

impl<R: AsyncRead + Unpin> Drain for Pipe<R> {
    fn open(&self) -> bool {
        self.is_open()
    }

    fn read_now(&mut self) -> Option<std::io::Result<usize>> {
        // Cancel-safe (see `Pipe::read`): dropped while pending, it has
        // consumed nothing.
        self.read().now_or_never()
    }

    fn take_into(&mut self, shim: &mut Shim<'_>, read: std::io::Result<usize>) -> Result<()> {
        shim.take(self, read)
    }
}

/// One of the worker's outputs, as the shim reads it.
type Reader = Box<dyn AsyncRead + Unpin + Send>;

/// One of the worker's output pipes and its line splitter.
struct Pipe<R> {
    /// `None` once closed; dropping the read end makes a worker that keeps
    /// writing after a read error get EPIPE rather than block forever.
    reader: Option<R>,
    lines: LineSplitter,
    kind: FrameKind,
    chunk: usize,
}

impl<R> Pipe<R> {
    /// A pipe read from `reader`; closed from the start without one.
    fn new(reader: Option<R>, kind: FrameKind, max_frame: usize, chunk: usize) -> Self {
        Self {
            reader,
            lines: LineSplitter::new(max_frame),
            kind,
            chunk: chunk.max(1),
        }
    }

    fn is_open(&self) -> bool {
        self.reader.is_some()
    }

    fn close(&mut self) {
        self.reader = None;
    }
}

impl<R: AsyncRead + Unpin> Pipe<R> {
    /// Reads what is there, up to about one chunk, into the splitter.
    /// Cancel-safe: a read either completes or consumes nothing.
    async fn read(&mut self) -> std::io::Result<usize> {
        let Some(reader) = self.reader.as_mut() else {
            return Ok(0);
        };
        let buf = self.lines.buffer();
        buf.reserve(self.chunk);
        reader.read_buf(buf).await
    }
}

/// The daemon refused the shim's `ShimHello`: the execution is unknown or
/// has ended. Other refusals may be cured by a fixed or restarted daemon.
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::Refused { code, .. }
            if *code == ErrorCode::NOT_FOUND || *code == ErrorCode::INVALID_REQUEST
    )
}

/// The daemon refused the `WorkerExited` report itself for the same reasons.
fn is_refused_report(e: &Error) -> bool {
    matches!(
        e,
        Error::Daemon { code, .. }
            if *code == ErrorCode::NOT_FOUND || *code == ErrorCode::INVALID_REQUEST
    )
}

/// SIGKILLs the worker (safe by pid: it is our unreaped child, so its pid
/// cannot have been recycled) and reaps it.
async fn kill(child: &mut Child, log: &Log) {
    if let Err(e) = child.start_kill() {
        // Already reaped: nothing left to kill.
        if e.kind() != std::io::ErrorKind::InvalidInput {
            log.say(format_args!("cannot kill the worker: {e}"));
        }
    }
    if tokio::time::timeout(REAP_TIMEOUT, child.wait())
        .await
        .is_err()
    {
        log.say("the killed worker was not reaped in time");
    }
}

/// The greeting sent on every session: who the shim and its worker are.
fn hello(spec: &ShimSpec, worker: Option<&Worker>, log: &Log) -> ShimHello {
    let shim_pid = std::process::id();
    let shim_start_ticks = procfs::start_ticks(shim_pid).unwrap_or_else(|e| {
        log.say(format_args!("cannot read this process's start time: {e}"));
        0
    });
    let boot_id = procfs::boot_id().unwrap_or_else(|e| {
        log.say(format_args!("cannot read the boot id: {e}"));
        String::new()
    });
    ShimHello {
        execution: spec.execution.clone(),
        attempt: spec.attempt,
        shim_pid,
        shim_start_ticks,
        worker_pid: worker.map(|w| w.pid),
        worker_start_ticks: worker.map_or(0, |w| w.start_ticks),
        boot_id,
    }
}

fn connector(spec: &ShimSpec, options: &ShimOptions) -> Connector {
    Connector::new(
        Endpoint::unix(&spec.socket),
        ConnectOptions {
            retry_window: RETRY_FOREVER,
            client: format!(
                "tether-shim {} {}/{}",
                env!("CARGO_PKG_VERSION"),
                spec.execution,
                spec.attempt
            ),
            capabilities: Capabilities::NONE,
            backoff_initial: options.backoff_initial,
            backoff_cap: options.backoff_cap,
            buffer_size: BUFFER_SIZE,
            on_storage_fault: {
                let log = Log::new(spec);
                StorageFaultNotice::new(move |cause| {
                    log.say(format_args!(
                        "{cause}; holding the worker's output until the daemon can store it"
                    ));
                })
            },
            ..ConnectOptions::default()
        },
    )
}

/// The shim's diagnostics: one line per event on stderr, with the time,
/// pid, execution and attempt, since one log file collects every attempt.
#[derive(Debug)]
struct Log {
    prefix: String,
}

impl Log {
    fn new(spec: &ShimSpec) -> Self {
        Self {
            prefix: format!(
                "tether-shim[{}] {}/{}:",
                std::process::id(),
                spec.execution,
                spec.attempt
            ),
        }
    }

    fn say(&self, message: impl Display) {
        // A log that cannot be written must not stop the shim.
        let _ = writeln!(
            std::io::stderr().lock(),
            "{} {} {message}",
            Rfc3339(now_micros()),
            self.prefix
        );
    }
}
