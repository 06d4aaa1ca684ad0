//! One client's session: Hello, then requests until the client leaves, the
//! daemon shuts down, or a request is refused.
//!
//! Appends and acks are pipelined: each becomes a future in an ordered set,
//! so the session keeps reading while earlier commits are in flight and
//! still answers in request order. Consecutive appends already buffered on
//! the socket are handed to the queue as one batch. Other requests first let
//! the pipeline drain, which keeps every answer in order without bookkeeping.
//!
//! Supervision requests (`Run`, `ListExecutions`, `Stop`) go to the
//! supervisor. A `ShimHello` makes the session a shim session for one
//! attempt of one execution; only such a session may report that attempt's
//! `WorkerExited`, and because other requests first drain the pipeline, the
//! exit is recorded only after every output frame sent before it.
//!
//! A subscription runs in a pump task of its own that feeds a channel of
//! capacity [`SUBSCRIPTION_BACKLOG`], so reading from the store never has to
//! be cancelled by `select!`, and a slow client holds at most that many
//! batches here; everything else waits in the store.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, SinkExt, StreamExt};
use tether_protocol::codec::{decode_wire_message, peek_hello_version};
use tether_protocol::{
    validate_name, Appended, Capabilities, DurableAck, DurableResume, ErrorCode, ErrorFrame, Hello,
    HelloOk, Request, Response, ServerCodec, ShimHello, StartAt, StatusInfo, StorageFault,
    StorageState, Subscribe, Subscribed, WorkerExited, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::access::{self, Peer};
use crate::engine::{AppendOutcome, Queue, AWAKE_FOR};
use crate::ingest::{Incoming, IngestAppend, SessionCodec, SessionReader};
use crate::subscription::{SubEvent, Subscription, WireForm};
use crate::supervisor::Supervisor;
use crate::{Config, Error};

/// The judged peer of a new connection, and the sentence it is refused
/// with when it may not use the daemon at all.
#[derive(Debug)]
pub struct Admission {
    pub peer: Peer,
    /// `Some` for a peer that is refused after its Hello.
    pub denial: Option<String>,
}

/// What every session shares.
#[derive(Debug)]
pub struct Shared {
    pub queue: Queue,
    pub supervisor: Supervisor,
    pub config: Config,
    pub started: Instant,
    /// Sessions currently open (for `tether status`).
    pub connections: AtomicU64,
}

/// A client has this long to send its Hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);
/// A Hello is small; a longer first frame is refused without reading it.
const MAX_HELLO_LEN: usize = 64 * 1024;
/// Append or ack batches in flight per session before it stops reading.
const MAX_PIPELINE: usize = 64;
/// Appends gathered into one batch from what is already buffered.
const MAX_APPEND_BATCH: usize = 4096;
/// Payload bytes gathered into one batch (give or take one read). What a
/// session has read but not yet handed to the writer is outside the
/// writer's in-flight budget, so this bounds it: a hundred producers that
/// all connect with a full window must not all be read into memory at once.
const MAX_APPEND_BATCH_BYTES: usize = 32 * 1024;
/// What a session buffers before it writes to its socket.
const WRITE_BATCH_BYTES: usize = 32 * 1024;
/// Subscription events buffered between the pump and the socket.
const SUBSCRIPTION_BACKLOG: usize = 1;

/// Why a session ends with an error frame.
#[derive(Debug)]
struct Refusal {
    code: ErrorCode,
    message: String,
    /// The client is gone: there is nobody to tell and nothing to warn about.
    client_gone: bool,
}

impl Refusal {
    fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            client_gone: false,
        }
    }
}

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Self::new(e.code(), e.to_string())
    }
}

impl From<tether_protocol::Error> for Refusal {
    fn from(e: tether_protocol::Error) -> Self {
        Error::from(e).into()
    }
}

/// How a session ended without a refusal.
enum Ending {
    /// The client closed its side.
    ClientLeft,
    /// The daemon is shutting down; the client is told so and may reconnect.
    Shutdown,
}

type Pending = Pin<Box<dyn Future<Output = Result<Vec<Response>, Error>> + Send>>;

/// The open subscription of a session.
struct ActiveSubscription {
    stream: String,
    consumer: Option<String>,
    durable: bool,
    /// `None` once a non-following subscription has sent `End`; the
    /// subscription still names the consumer its acks are for.
    events: Option<mpsc::Receiver<crate::Result<SubEvent>>>,
    _pump: AbortOnDropHandle<()>,
}

/// Serves one connection to its end. Never panics on input; every failure
/// is answered with an error frame (when the socket still takes one) and
/// logged.
pub async fn run(
    stream: UnixStream,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    admission: Admission,
) {
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let (read_half, write_half) = stream.into_split();
    let mut out = FramedWrite::new(write_half, ServerCodec::with_max_frame_len(usize::MAX));
    // Frames are fed in bulk (a replay, a batch of live frames) and flushed
    // once: writes of up to this size take fewer syscalls than the default
    // 8 KiB, and the buffer only grows on a session that writes that much.
    out.set_backpressure_boundary(WRITE_BATCH_BYTES);
    let mut session = Session {
        shared: shared.clone(),
        out,
        durable: false,
        subscription: None,
        pending: FuturesOrdered::new(),
        shim: None,
        shutdown: shutdown.clone(),
        peer: admission.peer,
        denial: admission.denial,
        logged_writes: false,
        lone_streak: false,
        awaiting_lone: None,
    };
    match session.serve(read_half, &shutdown).await {
        Ok(Ending::ClientLeft) => {}
        Ok(Ending::Shutdown) => {
            session
                .send_error(Refusal::new(
                    ErrorCode::SHUTTING_DOWN,
                    "the daemon is shutting down; reconnect to resume",
                ))
                .await;
        }
        Err(refusal) if refusal.client_gone => {
            tracing::debug!("client went away: {}", refusal.message);
        }
        Err(refusal)
            if refusal.code == ErrorCode::STORAGE_FULL || refusal.code == ErrorCode::STORAGE =>
        {
            // A degraded store refuses every write until it clears, and
            // says so in the log itself (see `crate::degraded`): a line per
            // refused producer would fill the journal instead.
            tracing::debug!(code = %refusal.code, "closing connection: {}", refusal.message);
            session.send_error(refusal).await;
        }
        Err(refusal) => {
            tracing::warn!(code = %refusal.code, "closing connection: {}", refusal.message);
            session.send_error(refusal).await;
        }
    }
    shared.connections.fetch_sub(1, Ordering::Relaxed);
}

struct Session {
    shared: Arc<Shared>,
    out: FramedWrite<OwnedWriteHalf, ServerCodec>,
    durable: bool,
    subscription: Option<ActiveSubscription>,
    pending: FuturesOrdered<Pending>,
    /// Set by `ShimHello`: the (execution, attempt) this session's shim runs.
    shim: Option<(String, u32)>,
    shutdown: CancellationToken,
    /// Who is at the other end, and what they may do.
    peer: Peer,
    /// Why the peer is refused, if it is.
    denial: Option<String>,
    /// Appends and acks come by the thousand: only the session's first is
    /// logged with the peer's identity.
    logged_writes: bool,
    /// Whether the last batch of appends was a lone append with nothing
    /// else in flight: a producer that waits on each ack.
    lone_streak: bool,
    /// When such a producer's append, now in flight, was submitted, if
    /// the session stays awake for its answer (see `Session::stays_awake`).
    awaiting_lone: Option<Instant>,
}

impl Session {
    async fn serve(
        &mut self,
        mut read_half: OwnedReadHalf,
        shutdown: &CancellationToken,
    ) -> Result<Ending, Refusal> {
        let hello = tokio::select! {
            _ = shutdown.cancelled() => return Ok(Ending::Shutdown),
            hello = tokio::time::timeout(HELLO_TIMEOUT, read_hello(&mut read_half, self.shared.config.max_frame_len)) => match hello {
                Err(_) => return Err(Refusal::new(ErrorCode::HELLO_REQUIRED, format!("no Hello within {HELLO_TIMEOUT:?}"))),
                Ok(Ok(Some(hello))) => hello,
                Ok(Ok(None)) => return Ok(Ending::ClientLeft),
                Ok(Err(refusal)) => return Err(refusal),
            },
        };
        // The peer was judged at accept; a refused one learns why in answer
        // to its Hello, before any request is served.
        if let Some(denial) = self.denial.take() {
            return Err(Refusal::new(ErrorCode::PERMISSION_DENIED, denial));
        }
        self.accept_hello(&hello).await?;

        let codec = SessionCodec::new(self.shared.config.max_frame_len);
        let mut reader = SessionReader::new(read_half, codec);
        let mut reading = true;
        loop {
            if !reading && self.pending.is_empty() {
                return Ok(if shutdown.is_cancelled() {
                    Ending::Shutdown
                } else {
                    Ending::ClientLeft
                });
            }
            let subscribed = self
                .subscription
                .as_ref()
                .is_some_and(|s| s.events.is_some());
            tokio::select! {
                // Shutdown stops reading; what is already in flight is
                // finished and answered before the session ends.
                _ = shutdown.cancelled(), if reading => reading = false,
                Some(done) = self.pending.next(), if !self.pending.is_empty() => {
                    self.send_all(done?).await?;
                    if self.pending.is_empty() {
                        self.awaiting_lone = None;
                    }
                }
                // Another turn of the loop, after any task that can run.
                () = tokio::task::yield_now(), if self.stays_awake() => {}
                event = recv_event(&mut self.subscription), if subscribed => {
                    self.deliver(event).await?;
                }
                request = reader.next(), if reading && self.pending.len() < MAX_PIPELINE => {
                    match request {
                        None => reading = false,
                        Some(Err(e)) => return Err(e.into()),
                        Some(Ok(Incoming::Appends(batch))) => {
                            self.gather_appends(batch, &mut reader).await?;
                        }
                        Some(Ok(Incoming::Request(request))) => self.dispatch(request).await?,
                    }
                }
            }
        }
    }

    async fn accept_hello(&mut self, hello: &Hello) -> Result<(), Refusal> {
        let granted = hello.capabilities.intersect(Capabilities::ALL);
        self.durable = granted.contains(Capabilities::DURABLE);
        tracing::debug!(client = %hello.client, durable = self.durable, "session opened");
        let ok = Response::HelloOk(HelloOk {
            version: PROTOCOL_VERSION,
            capabilities: granted,
            daemon: env!("CARGO_PKG_VERSION").to_owned(),
        });
        self.send_all(vec![ok]).await
    }

    /// Handles one request other than an append.
    async fn dispatch(&mut self, request: Request) -> Result<(), Refusal> {
        if let Request::Append(append) = request {
            // `SessionCodec` hands appends over as batches; an `Append`
            // here would come from another decoder, and is served (and
            // authorized) the same.
            return self.start_appends(vec![append.into()]).await;
        }
        self.authorize(&request)?;
        match request {
            Request::DurableAck(ack) => self.start_ack(ack),
            other => {
                // Keep answers in request order: finish the pipeline first.
                while let Some(done) = self.pending.next().await {
                    self.send_all(done?).await?;
                }
                self.handle_control(other).await
            }
        }
    }

    /// Refuses a request the peer may not send, and logs the control
    /// actions it may, naming the peer's uid and pid.
    fn authorize(&mut self, request: &Request) -> Result<(), Refusal> {
        if let Err(why) = self.peer.permits(request) {
            return Err(Refusal::new(ErrorCode::PERMISSION_DENIED, why));
        }
        if access::is_control(request) {
            // Appends never come here: see `authorize_appends`.
            let per_frame = matches!(request, Request::DurableAck(_));
            self.log_control(request.name(), control_target(request), per_frame);
        }
        Ok(())
    }

    /// Logs a control request, naming the peer's uid and pid. Requests that
    /// come by the thousand (`per_frame`) are logged once a session.
    fn log_control(&mut self, request: &str, target: &str, per_frame: bool) {
        if per_frame && std::mem::replace(&mut self.logged_writes, true) {
            return;
        }
        if per_frame && self.shared.queue.storage_fault().is_some() {
            // Producers retrying against a degraded store reconnect every
            // few seconds; their sessions are refused, and the fault is
            // logged once (see `crate::degraded`).
            tracing::debug!(uid = self.peer.uid(), request, target, "control request");
            return;
        }
        tracing::info!(
            uid = self.peer.uid(),
            pid = self.peer.pid(),
            request,
            target,
            "control request"
        );
    }

    /// Adds to `batch` the appends already waiting on the socket (reading
    /// it again while it has more), then submits them as one batch, and
    /// then serves the request that ended it, if any.
    async fn gather_appends(
        &mut self,
        mut batch: Vec<IngestAppend>,
        reader: &mut SessionReader,
    ) -> Result<(), Refusal> {
        let mut bytes: usize = batch.iter().map(|a| a.payload.len()).sum();
        let mut after = None;
        while batch.len() < MAX_APPEND_BATCH && bytes < MAX_APPEND_BATCH_BYTES {
            match reader.next().now_or_never() {
                Some(Some(Ok(Incoming::Appends(more)))) => {
                    bytes += more.iter().map(|a| a.payload.len()).sum::<usize>();
                    batch.extend(more);
                }
                Some(Some(next)) => {
                    after = Some(next);
                    break;
                }
                // Nothing more buffered (or the client closed: the read
                // loop will see that next).
                Some(None) | None => break,
            }
        }
        // The appends before a bad frame are stored and answered first.
        self.start_appends(batch).await?;
        match after {
            Some(Ok(Incoming::Request(request))) => self.dispatch(request).await,
            Some(Err(e)) => Err(e.into()),
            Some(Ok(Incoming::Appends(_))) | None => Ok(()),
        }
    }

    /// Whether the session keeps its thread awake, yielding to any other
    /// task, instead of letting it sleep until the answer comes: only for
    /// a producer that waits on each ack, and for at most
    /// [`AWAKE_FOR`] from the append. The answer comes from the writer
    /// after the log's sync; a thread asleep then must be woken to send it
    /// on, which on a virtual CPU adds tens of µs to every round trip.
    fn stays_awake(&self) -> bool {
        self.awaiting_lone
            .is_some_and(|since| since.elapsed() < AWAKE_FOR)
    }

    /// [`Session::authorize`] for a batch of appends.
    fn authorize_appends(&mut self, batch: &[IngestAppend]) -> Result<(), Refusal> {
        if let Err(why) = self.peer.permits_appends() {
            return Err(Refusal::new(ErrorCode::PERMISSION_DENIED, why));
        }
        let target = batch.first().map_or("", |a| &*a.stream);
        self.log_control("Append", target, true);
        Ok(())
    }

    async fn start_appends(&mut self, batch: Vec<IngestAppend>) -> Result<(), Refusal> {
        self.authorize_appends(&batch)?;
        let lone = batch.len() == 1 && self.pending.is_empty();
        self.awaiting_lone = (lone && self.lone_streak).then(Instant::now);
        self.lone_streak = lone;
        // Submitted here, in socket order; only the outcome is awaited in
        // the pipeline. See `Queue::submit_append`.
        let outcomes = self.shared.queue.submit_append(batch).await?;
        self.pending
            .push_back(Box::pin(async move { Ok(coalesce_acks(outcomes.await?)) }));
        Ok(())
    }

    fn start_ack(&mut self, ack: DurableAck) -> Result<(), Refusal> {
        let Some(sub) = &self.subscription else {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                "DurableAck needs an open subscription with a consumer name",
            ));
        };
        let Some(consumer) = sub.consumer.clone() else {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "DurableAck on stream {:?} needs a subscription opened with a consumer name",
                    sub.stream
                ),
            ));
        };
        let stream = sub.stream.clone();
        let queue = self.shared.queue.clone();
        self.pending.push_back(Box::pin(async move {
            queue.ack(&stream, &consumer, ack.through_seq).await?;
            Ok(vec![Response::Acked(ack)])
        }));
        Ok(())
    }

    async fn handle_control(&mut self, request: Request) -> Result<(), Refusal> {
        match request {
            Request::Hello(_) => Err(Refusal::new(
                ErrorCode::HELLO_REQUIRED,
                "Hello was already received on this connection",
            )),
            Request::Subscribe(subscribe) => self.open_subscription(subscribe).await,
            Request::DurableResume(resume) => self.resume_subscription(resume).await,
            Request::ListStreams => {
                let streams = self.shared.queue.list_streams().await?;
                self.send_all(vec![Response::Streams(streams)]).await
            }
            Request::Status => {
                let status = self.status();
                self.send_all(vec![Response::Status(status)]).await
            }
            Request::Verify => {
                let summary = self.shared.queue.verify().await?;
                self.send_all(vec![Response::Verified(summary)]).await
            }
            Request::Storage => {
                let degraded = self.shared.queue.storage_fault().map(|fault| StorageFault {
                    cause: fault.cause,
                    full: fault.full,
                    since_micros: fault
                        .since
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
                });
                let state = StorageState { degraded };
                self.send_all(vec![Response::Storage(state)]).await
            }
            Request::Run(mut spec) => {
                // `[restart] max_restarts` of the config file: the limit of
                // a run whose client set none.
                if spec.max_restarts.is_none() {
                    spec.max_restarts = self.shared.config.default_max_restarts;
                }
                let execution = self.shared.supervisor.run(spec).await?;
                self.send_all(vec![Response::Started { execution }]).await
            }
            Request::ListExecutions { all } => {
                let executions = self.shared.supervisor.list(all);
                self.send_all(vec![Response::Executions(executions)]).await
            }
            Request::Stop {
                execution,
                timeout_ms,
            } => self.stop(&execution, timeout_ms).await,
            Request::ShimHello(hello) => self.shim_hello(hello).await,
            Request::WorkerExited(exited) => self.worker_exited(exited).await,
            Request::CheckpointSave(save) => {
                validate_name("execution", &save.execution)?;
                let meta = self.shared.queue.save_checkpoint(save).await?;
                self.send_all(vec![Response::CheckpointSaved(meta)]).await
            }
            Request::CheckpointLoad { execution } => self.load_checkpoint(&execution).await,
            Request::CheckpointList { execution } => {
                validate_name("execution", &execution)?;
                let list = self.shared.queue.list_checkpoints(&execution).await?;
                self.send_all(vec![Response::Checkpoints(list)]).await
            }
            Request::StepGet { execution, step } => {
                validate_name("execution", &execution)?;
                let result = self.shared.queue.step(&execution, &step).await?;
                self.send_all(vec![Response::StepResult(result)]).await
            }
            Request::StepPut {
                execution,
                step,
                result,
            } => {
                validate_name("execution", &execution)?;
                let kept = self
                    .shared
                    .queue
                    .put_step(&execution, &step, result)
                    .await?;
                self.send_all(vec![Response::StepRecorded(kept)]).await
            }
            Request::Append(_) | Request::DurableAck(_) => Err(Refusal::new(
                ErrorCode::INTERNAL,
                "pipelined request reached the control path",
            )),
        }
    }

    /// The newest valid checkpoint; having none is `NOT_FOUND`, which the
    /// client reports as "no checkpoint" (exit 3).
    async fn load_checkpoint(&mut self, execution: &str) -> Result<(), Refusal> {
        validate_name("execution", execution)?;
        match self.shared.queue.load_checkpoint(execution).await? {
            Some(checkpoint) => self.send_all(vec![Response::Checkpoint(checkpoint)]).await,
            None => Err(Refusal::new(
                ErrorCode::NOT_FOUND,
                format!("execution {execution} has no valid checkpoint"),
            )),
        }
    }

    async fn stop(&mut self, execution: &str, timeout_ms: u64) -> Result<(), Refusal> {
        let timeout = Duration::from_millis(timeout_ms);
        let stopped = tokio::select! {
            // Stopping can take the whole timeout; a daemon shutting down
            // does not wait for it (the stop is recorded and carried on by
            // the next daemon).
            _ = self.shutdown.cancelled() => return Err(Error::ShuttingDown.into()),
            stopped = self.shared.supervisor.stop(execution, timeout) => stopped?,
        };
        self.send_all(vec![Response::Stopped(stopped)]).await
    }

    async fn shim_hello(&mut self, hello: ShimHello) -> Result<(), Refusal> {
        if let Some((execution, attempt)) = &self.shim {
            if *execution != hello.execution || *attempt != hello.attempt {
                return Err(Refusal::new(
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "this connection is the shim of attempt {attempt} of {execution}; \
                         open another connection for another attempt"
                    ),
                ));
            }
        }
        let attached = (hello.execution.clone(), hello.attempt);
        self.shared.supervisor.shim_hello(hello).await?;
        self.shim = Some(attached);
        self.send_all(vec![Response::ShimAccepted]).await
    }

    async fn worker_exited(&mut self, exited: WorkerExited) -> Result<(), Refusal> {
        let is_its_shim = self
            .shim
            .as_ref()
            .is_some_and(|(e, a)| *e == exited.execution && *a == exited.attempt);
        if !is_its_shim {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "WorkerExited for attempt {} of {} needs that attempt's ShimHello first \
                     on the same connection",
                    exited.attempt, exited.execution
                ),
            ));
        }
        self.shared.supervisor.worker_exited(exited).await?;
        self.send_all(vec![Response::ExitRecorded]).await
    }

    async fn open_subscription(&mut self, req: Subscribe) -> Result<(), Refusal> {
        self.check_subscribable(&req.stream, req.consumer.as_deref())?;
        let queue = &self.shared.queue;
        let (first, last) = range_of(queue, &req.stream)?;
        if !self.durable {
            // Plain clients get live frames from now on and no replay.
            let sub = queue.subscribe_live(&req.stream)?;
            return self.attach(sub, req.stream, None, first, last).await;
        }
        let stored_ack = match &req.consumer {
            Some(consumer) => Some(queue.open_consumer(&req.stream, consumer).await?),
            None => None,
        };
        let after = match req.start {
            StartAt::Oldest => first.saturating_sub(1),
            StartAt::Last(n) => last.saturating_sub(n).max(first.saturating_sub(1)),
            StartAt::Now => last,
            StartAt::ConsumerAck => stored_ack.ok_or_else(|| {
                Refusal::new(
                    ErrorCode::INVALID_REQUEST,
                    "StartAt::ConsumerAck needs a consumer name",
                )
            })?,
        };
        let sub = queue.subscribe(&req.stream, after, req.follow)?;
        self.attach(sub, req.stream, req.consumer, first, last)
            .await
    }

    async fn resume_subscription(&mut self, req: DurableResume) -> Result<(), Refusal> {
        if !self.durable {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                "DurableResume needs the durable capability in Hello",
            ));
        }
        self.check_subscribable(&req.stream, req.consumer.as_deref())?;
        let queue = &self.shared.queue;
        let (first, last) = range_of(queue, &req.stream)?;
        if let Some(consumer) = &req.consumer {
            queue.open_consumer(&req.stream, consumer).await?;
        }
        let sub = queue.subscribe(&req.stream, req.acked_through, req.follow)?;
        self.attach(sub, req.stream, req.consumer, first, last)
            .await
    }

    fn check_subscribable(&self, stream: &str, consumer: Option<&str>) -> Result<(), Refusal> {
        if let Some(sub) = &self.subscription {
            return Err(Refusal::new(
                ErrorCode::INVALID_REQUEST,
                format!(
                    "this connection already has a subscription (stream {:?}); open another connection",
                    sub.stream
                ),
            ));
        }
        validate_name("stream", stream)?;
        if let Some(consumer) = consumer {
            validate_name("consumer", consumer)?;
        }
        Ok(())
    }

    /// Starts the pump task for `sub` and confirms the subscription.
    async fn attach(
        &mut self,
        mut sub: Subscription,
        stream: String,
        consumer: Option<String>,
        first_seq: u64,
        last_seq: u64,
    ) -> Result<(), Refusal> {
        sub.encode_as(if self.durable {
            WireForm::Durable
        } else {
            WireForm::Live
        });
        let (tx, events) = mpsc::channel(SUBSCRIPTION_BACKLOG);
        let pump = tokio::spawn(async move {
            loop {
                let event = sub.next().await;
                let last = matches!(event, Ok(SubEvent::End { .. }) | Err(_));
                if tx.send(event).await.is_err() || last {
                    break;
                }
            }
        });
        self.subscription = Some(ActiveSubscription {
            stream,
            consumer,
            durable: self.durable,
            events: Some(events),
            _pump: AbortOnDropHandle::new(pump),
        });
        self.send_all(vec![Response::Subscribed(Subscribed {
            first_seq,
            last_seq,
        })])
        .await
    }

    async fn deliver(&mut self, event: Option<crate::Result<SubEvent>>) -> Result<(), Refusal> {
        let durable = self.subscription.as_ref().is_some_and(|s| s.durable);
        match event {
            Some(Ok(SubEvent::Encoded { wire, .. })) => {
                // Whatever the codec holds goes first; the read's frames
                // then go to the socket as they are.
                self.out.flush().await.map_err(write_failed)?;
                self.out
                    .get_mut()
                    .write_all(&wire)
                    .await
                    .map_err(|e| write_failed(e.into()))
            }
            // A plain (non-durable) client has no seqs to make sense of a
            // gap; it simply sees the next live frame.
            Some(Ok(SubEvent::Gap(_))) if !durable => Ok(()),
            Some(Ok(SubEvent::Gap(gap))) => self.send_all(vec![Response::Gap(gap)]).await,
            Some(Ok(SubEvent::End { last_seq })) => {
                // Nothing more will be delivered, but the session stays
                // open and the consumer may still ack what it received.
                if let Some(sub) = &mut self.subscription {
                    sub.events = None;
                }
                self.send_all(vec![Response::End { last_seq }]).await
            }
            Some(Err(e)) => Err(e.into()),
            // `attach` has every subscription deliver encoded frames;
            // frames as values are for the engine's own readers.
            Some(Ok(SubEvent::Frames(_))) => Err(Refusal::new(
                ErrorCode::INTERNAL,
                "the subscription delivered frames unencoded",
            )),
            None => Err(Refusal::new(
                ErrorCode::INTERNAL,
                "the subscription stopped unexpectedly",
            )),
        }
    }

    fn status(&self) -> StatusInfo {
        let shared = &self.shared;
        StatusInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_secs: shared.started.elapsed().as_secs(),
            socket: shared.config.socket.display().to_string(),
            state_dir: shared.config.state_dir.display().to_string(),
            store_bytes: shared.queue.store_bytes(),
            streams: shared.queue.stream_count(),
            executions: shared.supervisor.count(),
            connections: shared.connections.load(Ordering::Relaxed),
        }
    }

    async fn send_all(&mut self, responses: Vec<Response>) -> Result<(), Refusal> {
        for response in responses {
            self.out.feed(response).await.map_err(write_failed)?;
        }
        self.out.flush().await.map_err(write_failed)
    }

    /// Best effort: the client may already be gone.
    async fn send_error(&mut self, refusal: Refusal) {
        let frame = Response::Error(ErrorFrame {
            code: refusal.code,
            message: refusal.message,
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), self.out.send(frame)).await;
    }
}

/// Waits for the subscription's next event. Only polled while one exists.
async fn recv_event(
    subscription: &mut Option<ActiveSubscription>,
) -> Option<crate::Result<SubEvent>> {
    match subscription.as_mut().and_then(|s| s.events.as_mut()) {
        Some(events) => events.recv().await,
        None => std::future::pending().await,
    }
}

fn range_of(queue: &Queue, stream: &str) -> Result<(u64, u64), Refusal> {
    queue
        .stream_range(stream)
        .ok_or_else(|| Error::StreamNotFound(stream.to_owned()).into())
}

/// A failed write means the client is gone; the refusal is only logged.
fn write_failed(e: tether_protocol::Error) -> Refusal {
    Refusal {
        client_gone: true,
        ..Refusal::new(ErrorCode::INTERNAL, format!("cannot write to client: {e}"))
    }
}

/// One cumulative `Appended` per (stream, producer) of a committed batch,
/// carrying its highest producer seq. Appends of one producer arrive in
/// producer-seq order, so the last outcome of each pair is the highest.
fn coalesce_acks(outcomes: Vec<AppendOutcome>) -> Vec<Response> {
    let mut newest: Vec<AppendOutcome> = Vec::new();
    for outcome in outcomes {
        match newest
            .iter_mut()
            .find(|n| n.stream == outcome.stream && n.producer == outcome.producer)
        {
            Some(n) => *n = outcome,
            None => newest.push(outcome),
        }
    }
    newest
        .into_iter()
        .map(|n| {
            Response::Appended(Appended {
                stream: n.stream.to_string(),
                producer: n.producer.to_string(),
                producer_seq: n.producer_seq,
                seq: n.seq,
            })
        })
        .collect()
}

/// Reads the first frame by hand, so that a Hello of another protocol
/// version is recognised by its leading version field even when the rest
/// of it has a layout this build cannot parse. `Ok(None)`: the client left
/// before sending anything.
async fn read_hello(
    read_half: &mut OwnedReadHalf,
    max_frame_len: usize,
) -> Result<Option<Hello>, Refusal> {
    let mut prefix = [0u8; 4];
    let got = read_full(read_half, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < prefix.len() {
        return Err(tether_protocol::Error::Truncated {
            received: got,
            expected: prefix.len(),
        }
        .into());
    }
    let len = u32::from_be_bytes(prefix) as usize;
    let limit = max_frame_len.min(MAX_HELLO_LEN);
    if len > limit {
        return Err(Refusal::new(
            ErrorCode::FRAME_TOO_LARGE,
            format!("frame of {len} bytes exceeds the maximum of {limit} bytes for a Hello"),
        ));
    }
    let mut body = vec![0u8; len];
    let got = read_full(read_half, &mut body).await?;
    if got < len {
        return Err(tether_protocol::Error::Truncated {
            received: prefix.len() + got,
            expected: prefix.len() + len,
        }
        .into());
    }
    if let Some(version) = peek_hello_version(&body) {
        if version != PROTOCOL_VERSION {
            return Err(Refusal::new(
                ErrorCode::UNSUPPORTED_VERSION,
                format!(
                    "protocol version {version} is not supported; this daemon speaks version {PROTOCOL_VERSION}"
                ),
            ));
        }
    }
    match decode_wire_message::<Request>(&body)? {
        Request::Hello(hello) => Ok(Some(hello)),
        other => Err(Refusal::new(
            ErrorCode::HELLO_REQUIRED,
            format!("the first message must be Hello, got {}", other.name()),
        )),
    }
}

/// Fills `buf` unless the peer closes first; returns how much arrived.
async fn read_full(read_half: &mut OwnedReadHalf, buf: &mut [u8]) -> Result<usize, Refusal> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = read_half.read(&mut buf[filled..]).await.map_err(|e| {
            Refusal::new(
                ErrorCode::MALFORMED,
                format!("cannot read from client: {e}"),
            )
        })?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}
/// What a control request acts on, for its log line.
fn control_target(request: &Request) -> &str {
    match request {
        Request::Run(spec) => spec.name.as_deref().unwrap_or(""),
        Request::Stop { execution, .. } | Request::StepPut { execution, .. } => execution,
        Request::CheckpointSave(save) => &save.execution,
        _ => "",
    }
}
