//! One client's session: Hello, then requests until the client leaves, the
//! daemon shuts down, or a request is refused. This file holds the session
//! and its loop; the files beside it hold its jobs:
//!
//! * `read`: the Hello, read by hand, and appends gathered into batches.
//! * `dispatch`: each request authorized, then served or pipelined.
//! * `subscribe`: the session's subscription, streamed to the socket.
//! * `write`: answers and error frames, written to the socket.
//! * `parts`: answers too large for one message, split into several.
//!
//! Appends and acks are pipelined: each becomes a future in an ordered set,
//! so the session keeps reading while earlier commits are in flight and
//! still answers in request order. Consecutive appends already buffered on
//! the socket are handed to the queue as one batch. Other requests first let
//! the pipeline drain, which keeps every answer in order without bookkeeping.

mod dispatch;
mod gates;
mod parts;
mod read;
mod subscribe;
mod write;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use futures_util::stream::FuturesOrdered;
use futures_util::StreamExt;
use tether_protocol::{
    Capabilities, ErrorCode, Hello, HelloOk, Response, ServerCodec, PROTOCOL_VERSION,
};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;

use crate::access::Peer;
use crate::engine::Queue;
use crate::ingest::{Incoming, PartialBudget, SessionCodec, SessionReader};
use crate::supervisor::Supervisor;
use crate::{Config, Error};

use read::{read_hello, HELLO_TIMEOUT};
use subscribe::{recv_event, ActiveSubscription};
use write::WRITE_BATCH_BYTES;

/// What every session shares.
#[derive(Debug)]
pub struct Shared {
    pub queue: Queue,
    pub supervisor: Supervisor,
    pub config: Config,
    /// The bytes of partly received messages across sessions
    /// (`max_partial_bytes`).
    pub partials: Arc<PartialBudget>,
    pub started: Instant,
    /// Sessions currently open (for `tether status`).
    pub connections: AtomicU64,
    /// The NATS mirror (for `tether status` and metrics).
    pub mirror: crate::mirror::Mirror,
}

/// Append or ack batches in flight per session before it stops reading.
const MAX_PIPELINE: usize = 64;

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

/// Serves one connection, whose `peer` passed its check, to its end.
/// Never panics on input; every failure is answered with an error frame
/// (when the socket still takes one) and logged.
pub async fn run(stream: UnixStream, shared: Arc<Shared>, shutdown: CancellationToken, peer: Peer) {
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let (read_half, write_half) = stream.into_split();
    let mut out = FramedWrite::new(
        write_half,
        ServerCodec::with_max_frame_len(shared.config.max_frame_len),
    );
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
        peer,
        logged_writes: false,
        lone_streak: false,
        awaiting_lone: None,
        checkpoint_parts: BytesMut::new(),
        takes_flush: false,
        flush_asks: None,
        flush_waiting: BTreeMap::new(),
        next_flush_token: 0,
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
    /// Appends and acks come by the thousand: only the session's first is
    /// logged with the peer's identity.
    logged_writes: bool,
    /// Whether the last batch of appends was a lone append with nothing
    /// else in flight: a producer that waits on each ack.
    lone_streak: bool,
    /// When such a producer's append, now in flight, was submitted, if
    /// the session stays awake for its answer (see `Session::stays_awake`).
    awaiting_lone: Option<Instant>,
    /// The leading pieces of a checkpoint too large for one message, for
    /// the `CheckpointSave` that ends it (see `parts`).
    checkpoint_parts: BytesMut,
    /// The client was granted `OUTPUT_FLUSH`: as a shim, it is asked to
    /// flush output through before its execution's checkpoints are saved.
    takes_flush: bool,
    /// Asks to pass on to this session's shim, once it is accepted.
    flush_asks: Option<mpsc::Receiver<oneshot::Sender<()>>>,
    /// Asks sent to the shim and not yet answered, by token.
    flush_waiting: BTreeMap<u64, oneshot::Sender<()>>,
    next_flush_token: u64,
}

/// Flush asks a shim may have unanswered; beyond it the oldest is given
/// up (its saver waits no longer).
const MAX_FLUSH_WAITING: usize = 64;

/// The next flush ask for this session's shim; never, without one.
async fn recv_flush_ask(
    asks: &mut Option<mpsc::Receiver<oneshot::Sender<()>>>,
) -> Option<oneshot::Sender<()>> {
    match asks {
        Some(asks) => asks.recv().await,
        None => std::future::pending().await,
    }
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
        self.accept_hello(&hello).await?;

        let codec = SessionCodec::new(self.shared.config.max_frame_len);
        let charge = self.shared.partials.charge();
        let mut reader = SessionReader::new(read_half, codec, self.peer.clone(), charge);
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
                ask = recv_flush_ask(&mut self.flush_asks), if self.flush_asks.is_some() => {
                    match ask {
                        Some(done) => self.ask_flush(done).await?,
                        // Another session of the shim took over.
                        None => self.flush_asks = None,
                    }
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

    /// Passes a flush ask on to this session's shim.
    async fn ask_flush(&mut self, done: oneshot::Sender<()>) -> Result<(), Refusal> {
        let token = self.next_flush_token;
        self.next_flush_token += 1;
        self.flush_waiting.insert(token, done);
        if self.flush_waiting.len() > MAX_FLUSH_WAITING {
            self.flush_waiting.pop_first();
        }
        self.send_all(vec![Response::FlushOutput { token }]).await
    }

    /// The shim has flushed through the ask `token`: its saver goes on.
    /// The appends it made before are stored, because this request, like
    /// every one but appends and acks, waited for the pipeline to drain.
    fn output_flushed(&mut self, token: u64) {
        if let Some(done) = self.flush_waiting.remove(&token) {
            let _ = done.send(());
        }
    }

    async fn accept_hello(&mut self, hello: &Hello) -> Result<(), Refusal> {
        let granted = hello.capabilities.intersect(Capabilities::ALL);
        self.durable = granted.contains(Capabilities::DURABLE);
        self.takes_flush = granted.contains(Capabilities::OUTPUT_FLUSH);
        tracing::debug!(client = %hello.client, durable = self.durable, "session opened");
        let ok = Response::HelloOk(HelloOk {
            version: PROTOCOL_VERSION,
            capabilities: granted,
            daemon: env!("CARGO_PKG_VERSION").to_owned(),
        });
        self.send_all(vec![ok]).await
    }
}
