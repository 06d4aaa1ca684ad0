//! Reaching the daemon: endpoints, one session ([`Connection`]), and the
//! reconnecting [`Link`] that the publisher and the subscriber are built on.
//!
//! An [`Endpoint`] is a local unix socket or a remote daemon over ssh
//! ([`crate::ssh`]). A [`Connection`] is one session: the transport is opened, `Hello` is
//! sent and `HelloOk` awaited. Outgoing requests are encoded into a buffer
//! and written in one go, so that many appends cost one write; responses are
//! read through a length-delimited decoder. Writing and reading are separate
//! halves, so [`Connection::flush_or_recv`] can keep reading answers while a
//! large write is still in progress and neither peer can block the other.
//!
//! A [`Link`] owns the reconnect state machine ([`LinkState`]): it opens a
//! session on demand, and after a failure retries with capped exponential
//! backoff until the retry window (the `--connect-timeout`) runs out, then
//! gives up with [`Error::Unreachable`] naming the endpoint and the last
//! error, or, when the daemon was reached but kept refusing (a full disk),
//! with [`Error::GaveUp`] keeping that refusal.

use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{FutureExt, StreamExt};
use tether_protocol::codec::encode_into;
use tether_protocol::{
    Capabilities, ClientCodec, Hello, HelloOk, Request, Response, DEFAULT_MAX_FRAME_LEN,
    PROTOCOL_VERSION,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_util::codec::FramedRead;

use crate::backoff::{self, Backoff};
use crate::error::{humanize, Error, Result};
use crate::ssh::{SshExit, SshTarget};

/// Default retry window: how long to keep trying to reach the daemon.
pub const DEFAULT_RETRY_WINDOW: Duration = Duration::from_secs(30);
/// A retry window that never runs out, for producers that must not give up
/// while they hold data (a shim whose worker is still running).
pub const RETRY_FOREVER: Duration = Duration::MAX;

/// Upper bound on waiting for `HelloOk` once the transport is open.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Lower bound on the same, so that the last attempt of a retry window
/// still gets a fair chance instead of a zero timeout.
const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);
/// The same over ssh, whose login alone can take a second on a busy host.
const MIN_SSH_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(4);
/// Over ssh, the part of the handshake's time limit that the remote
/// `tether dial-stdio` may spend reaching its daemon's socket; the rest is
/// for ssh itself and `Hello`.
const REMOTE_SHARE_OF_HANDSHAKE: f64 = 0.5;
/// How long a failed write waits for the error frame that may explain it
/// (see `Connection::why_write_failed`): locally it has arrived already;
/// over ssh it may still be on its way.
const WHY_CLOSED_WAIT: Duration = Duration::from_millis(200);

/// Default size of a session's read and write buffers: large enough that
/// one syscall carries hundreds of small frames.
pub const DEFAULT_BUFFER_SIZE: usize = 256 * 1024;

type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Where the daemon listens. The transport stays behind this type, so
/// sessions, links, publishers and subscribers work the same over all of
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Endpoint {
    /// A unix domain socket on this machine.
    Unix(PathBuf),
    /// A daemon on another machine, reached by running `tether dial-stdio`
    /// there over the system `ssh` (see [`crate::ssh`]).
    Ssh(SshTarget),
}

/// An open transport: its two halves and, for ssh, how to learn why it
/// ended.
struct Transport {
    read: ReadHalf,
    write: WriteHalf,
    ssh: Option<SshExit>,
}

impl Endpoint {
    /// The unix socket at `path`.
    pub fn unix(path: impl Into<PathBuf>) -> Self {
        Endpoint::Unix(path.into())
    }

    /// The daemon behind `url`, `ssh://[user@]host[:port][/socket/path]`,
    /// reached with the ssh program named by `$TETHER_SSH` (default `ssh`).
    /// A malformed URL is [`Error::Usage`].
    pub fn ssh(url: &str) -> Result<Self> {
        let target = SshTarget::parse(url)?.with_ssh_command(SshTarget::ssh_command_from_env());
        Ok(Endpoint::Ssh(target))
    }

    /// The socket `tetherd` uses when given no flags (see
    /// [`tether_protocol::paths::default_socket`]).
    pub fn default_local() -> Self {
        Endpoint::Unix(tether_protocol::paths::from_process(
            tether_protocol::paths::default_socket,
        ))
    }

    /// The socket path, for unix endpoints.
    pub fn socket_path(&self) -> Option<&Path> {
        match self {
            Endpoint::Unix(path) => Some(path),
            Endpoint::Ssh(_) => None,
        }
    }

    /// Opens the transport and splits it into independent halves, for a
    /// handshake that may take up to `limit`. Failing to start ssh at all
    /// is not retried: it is [`Error::Unreachable`] at once.
    async fn open(&self, limit: Duration) -> Result<Transport> {
        match self {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|source| Error::Io {
                        endpoint: self.to_string(),
                        source,
                    })?;
                let (read, write) = stream.into_split();
                Ok(Transport {
                    read: Box::new(read),
                    write: Box::new(write),
                    ssh: None,
                })
            }
            Endpoint::Ssh(target) => {
                // The remote bridge must give up on its socket before the
                // handshake here times out, so that its reason (printed on
                // ssh's stderr) is what the user is told.
                let remote_limit = limit.mul_f64(REMOTE_SHARE_OF_HANDSHAKE);
                let (read, write, exit) =
                    target.open(remote_limit).map_err(|e| Error::Unreachable {
                        endpoint: self.to_string(),
                        waited: Duration::ZERO,
                        last_error: e.to_string(),
                    })?;
                Ok(Transport {
                    read: Box::new(read),
                    write: Box::new(write),
                    ssh: Some(exit),
                })
            }
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "{}", path.display()),
            Endpoint::Ssh(target) => write!(f, "{target}"),
        }
    }
}

/// How sessions are opened and how long reconnecting may take.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// How long to keep retrying before giving up with
    /// [`Error::Unreachable`] (or [`Error::GaveUp`] when the daemon answers
    /// but keeps refusing). Counted from the first failed attempt of an
    /// outage. [`RETRY_FOREVER`] (or any window too long to add to a clock
    /// reading) never gives up.
    pub retry_window: Duration,
    /// Free-form description sent in `Hello` for the daemon's logs.
    pub client: String,
    /// Capabilities to ask for; a session that is not granted all of them
    /// is refused with [`Error::Protocol`].
    pub capabilities: Capabilities,
    /// Largest frame sent or accepted.
    pub max_frame_len: usize,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Largest reconnect delay.
    pub backoff_cap: Duration,
    /// Initial capacity of a session's read and write buffers. They grow
    /// for larger frames; a small value saves memory in processes that
    /// exchange few bytes (a shim reads only acknowledgements).
    pub buffer_size: usize,
    /// Told once when the daemon cannot store (a full disk, a failing
    /// one) while unacknowledged data is kept and retried.
    pub on_storage_fault: StorageFaultNotice,
}

/// What a session owner is told when the daemon cannot store what it
/// sends: once per fault, until something is stored again. By default a
/// `tracing` warning; a command line prints it, a shim writes it to its
/// log.
#[derive(Clone, Default)]
pub struct StorageFaultNotice(Option<std::sync::Arc<SayFault>>);

/// How a [`StorageFaultNotice`] says it.
type SayFault = dyn Fn(&Error) + Send + Sync;

impl StorageFaultNotice {
    /// Calls `say` with the fault.
    pub fn new(say: impl Fn(&Error) + Send + Sync + 'static) -> Self {
        Self(Some(std::sync::Arc::new(say)))
    }

    fn tell(&self, cause: &Error) {
        match &self.0 {
            Some(say) => say(cause),
            None => tracing::warn!("{cause}; keeping unacknowledged data and retrying"),
        }
    }
}

impl fmt::Debug for StorageFaultNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "StorageFaultNotice(custom)"
        } else {
            "StorageFaultNotice(tracing)"
        })
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            retry_window: DEFAULT_RETRY_WINDOW,
            client: format!("tether {}", env!("CARGO_PKG_VERSION")),
            capabilities: Capabilities::DURABLE,
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            backoff_initial: backoff::DEFAULT_INITIAL,
            backoff_cap: backoff::DEFAULT_CAP,
            buffer_size: DEFAULT_BUFFER_SIZE,
            on_storage_fault: StorageFaultNotice::default(),
        }
    }
}

/// Opens sessions to one endpoint with one set of options.
#[derive(Debug, Clone)]
pub struct Connector {
    endpoint: Endpoint,
    options: ConnectOptions,
}

impl Connector {
    /// A connector for `endpoint`.
    pub fn new(endpoint: Endpoint, options: ConnectOptions) -> Self {
        Self { endpoint, options }
    }

    /// The endpoint sessions are opened to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The options sessions are opened with.
    pub fn options(&self) -> &ConnectOptions {
        &self.options
    }

    /// Opens a session, retrying within the retry window.
    pub async fn connect(&self) -> Result<Connection> {
        let mut link = Link::new(self.clone());
        link.establish().await?;
        link.into_connection()
            .ok_or_else(|| Error::Protocol("a fresh link has no session".into()))
    }

    /// Sends one request on a session of its own and returns the answer,
    /// retrying on a new session (within the retry window) if the session
    /// is lost first. For idempotent requests such as `Status`.
    pub async fn request(&self, request: &Request) -> Result<Response> {
        let mut link = Link::new(self.clone());
        loop {
            link.establish().await?;
            let Some(conn) = link.connection() else {
                continue;
            };
            match conn.request(request).await {
                Ok(response) => return Ok(response),
                Err(e) => link.lose(e)?,
            }
        }
    }

    /// One attempt: open the transport, send `Hello`, await `HelloOk`. The
    /// handshake may take up to `budget` (within fixed bounds).
    pub async fn connect_once(&self, budget: Duration) -> Result<Connection> {
        // Over ssh the remote side gets half the limit and must still have
        // time to say why it failed after ssh itself has logged in.
        let min = match self.endpoint {
            Endpoint::Ssh(_) => MIN_SSH_HANDSHAKE_TIMEOUT,
            _ => MIN_HANDSHAKE_TIMEOUT,
        };
        let limit = budget.clamp(min, HANDSHAKE_TIMEOUT);
        match tokio::time::timeout(limit, self.handshake(limit)).await {
            Ok(result) => result,
            Err(_) => Err(Error::Timeout {
                endpoint: self.endpoint.to_string(),
                after: limit,
            }),
        }
    }

    async fn handshake(&self, limit: Duration) -> Result<Connection> {
        let Transport { read, write, ssh } = self.endpoint.open(limit).await?;
        let codec = ClientCodec::with_max_frame_len(self.options.max_frame_len);
        let mut conn = Connection {
            endpoint: self.endpoint.to_string(),
            reader: FramedRead::with_capacity(read, codec, self.options.buffer_size),
            writer: write,
            out: BytesMut::with_capacity(self.options.buffer_size),
            max_frame_len: self.options.max_frame_len,
            hello: HelloOk {
                version: 0,
                capabilities: Capabilities::NONE,
                daemon: String::new(),
            },
        };
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: self.options.capabilities,
            client: self.options.client.clone(),
        });
        let answer = match (conn.request(&hello).await, ssh) {
            (Ok(answer), _) => answer,
            // A transport that ends before `HelloOk` is, over ssh, almost
            // always ssh itself failing: its own words explain it best.
            (Err(e), Some(exit)) if e.is_connection_failure() => {
                return Err(exit.explain(conn, e, &self.endpoint.to_string()).await)
            }
            (Err(e), _) => return Err(e),
        };
        let Response::HelloOk(ok) = answer else {
            return Err(unexpected("HelloOk", &answer));
        };
        if ok.version != PROTOCOL_VERSION {
            return Err(Error::Protocol(format!(
                "tetherd accepted Hello with protocol version {}, this client speaks {}",
                ok.version, PROTOCOL_VERSION
            )));
        }
        if !ok.capabilities.contains(self.options.capabilities) {
            return Err(Error::Protocol(format!(
                "tetherd {} at {} does not offer the capabilities this client needs \
                 (asked for {:#x}, granted {:#x})",
                ok.daemon, self.endpoint, self.options.capabilities.0, ok.capabilities.0
            )));
        }
        conn.hello = ok;
        Ok(conn)
    }
}

/// One open session with the daemon.
pub struct Connection {
    endpoint: String,
    reader: FramedRead<ReadHalf, ClientCodec>,
    writer: WriteHalf,
    /// Encoded requests not yet written to the socket.
    out: BytesMut,
    max_frame_len: usize,
    hello: HelloOk,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("unwritten_bytes", &self.out.len())
            .field("hello", &self.hello)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The daemon's answer to our `Hello`.
    pub fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The endpoint, as shown in messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Encodes `request` into the write buffer. Nothing is sent until
    /// [`Connection::flush`] or [`Connection::flush_or_recv`]. A request too
    /// large for one frame is refused and leaves the buffer unchanged.
    pub fn queue(&mut self, request: &Request) -> Result<()> {
        encode_into(request, &mut self.out, self.max_frame_len)?;
        Ok(())
    }

    /// Bytes queued but not yet written.
    pub fn unwritten(&self) -> usize {
        self.out.len()
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> Result<()> {
        let written = match self.writer.write_all_buf(&mut self.out).await {
            Ok(()) => self.writer.flush().await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => Ok(()),
            Err(source) => Err(self.write_failed(source).await),
        }
    }

    /// Writes what is queued, but returns early with a response if one
    /// arrives first (call again to finish writing). `Ok(None)` means
    /// everything is written. Reading while writing is what keeps a large
    /// pipelined write from deadlocking against a daemon that is itself
    /// blocked writing answers to us.
    pub async fn flush_or_recv(&mut self) -> Result<Option<Response>> {
        if self.out.is_empty() {
            return Ok(None);
        }
        while !self.out.is_empty() {
            let written = tokio::select! {
                biased;
                item = self.reader.next() => return self.accept(item).map(Some),
                written = self.writer.write_buf(&mut self.out) => written,
            };
            match written {
                Ok(0) => {
                    let closed = Error::Closed {
                        endpoint: self.endpoint.clone(),
                    };
                    return Err(self.why_write_failed(closed).await);
                }
                Ok(_) => {}
                Err(source) => return Err(self.write_failed(source).await),
            }
        }
        match self.writer.flush().await {
            Ok(()) => Ok(None),
            Err(source) => Err(self.write_failed(source).await),
        }
    }

    /// The error for a write that failed with `source`.
    async fn write_failed(&mut self, source: std::io::Error) -> Error {
        let failed = Error::Io {
            endpoint: self.endpoint.clone(),
            source,
        };
        self.why_write_failed(failed).await
    }

    /// A write fails (a broken pipe) when the daemon has closed the
    /// session, which it does after an error frame: that frame, already
    /// received, says why (a full disk, say) where the broken pipe would
    /// read as "cannot reach tetherd". Waits only briefly for it, in case
    /// the session ended without one. Every write of a session comes here
    /// when it fails.
    async fn why_write_failed(&mut self, failed: Error) -> Error {
        self.why_write_failed_within(failed, WHY_CLOSED_WAIT).await
    }

    /// [`Connection::why_write_failed`], waiting at most `wait`.
    async fn why_write_failed_within(&mut self, failed: Error, wait: Duration) -> Error {
        match tokio::time::timeout(wait, self.reader.next()).await {
            Ok(item @ Some(Ok(Response::Error(_)))) => self.accept(item).err().unwrap_or(failed),
            _ => failed,
        }
    }

    /// Waits for the next response. An error frame from the daemon becomes
    /// [`Error::Daemon`]; the end of the stream becomes [`Error::Closed`].
    /// Cancel-safe: dropping the future loses no response.
    pub async fn recv(&mut self) -> Result<Response> {
        let item = self.reader.next().await;
        self.accept(item)
    }

    /// A response that is already available without waiting, if any.
    pub fn try_recv(&mut self) -> Option<Result<Response>> {
        let item = self.reader.next().now_or_never()?;
        Some(self.accept(item))
    }

    /// Sends `request` and waits for the next response.
    pub async fn request(&mut self, request: &Request) -> Result<Response> {
        self.queue(request)?;
        if let Some(early) = self.flush_or_recv().await? {
            return Ok(early);
        }
        self.recv().await
    }

    fn accept(
        &self,
        item: Option<std::result::Result<Response, tether_protocol::Error>>,
    ) -> Result<Response> {
        match item {
            None => Err(Error::Closed {
                endpoint: self.endpoint.clone(),
            }),
            Some(Err(tether_protocol::Error::Io(source))) => Err(Error::Io {
                endpoint: self.endpoint.clone(),
                source,
            }),
            Some(Err(e)) => Err(Error::Codec(e)),
            Some(Ok(Response::Error(frame))) => Err(Error::Daemon {
                code: frame.code,
                message: frame.message,
            }),
            Some(Ok(response)) => Ok(response),
        }
    }
}

/// An error for a response that does not belong where it arrived.
pub(crate) fn unexpected(wanted: &str, got: &Response) -> Error {
    Error::Protocol(format!("expected {wanted}, got {}", got.name()))
}

/// True for a daemon that is up but cannot store (disk full, store error):
/// worth telling the user, unlike a daemon restarting.
fn is_storage_fault(cause: &Error) -> bool {
    matches!(
        cause,
        Error::Daemon { code, .. }
            if *code == tether_protocol::ErrorCode::STORAGE_FULL
                || *code == tether_protocol::ErrorCode::STORAGE
    )
}

/// Where a [`Link`] stands.
#[derive(Debug)]
pub enum LinkState {
    /// No session has been attempted yet.
    Idle,
    /// A session is open.
    Up(Connection),
    /// The last session or attempt failed with this (transient) error;
    /// the next attempt waits for the backoff first.
    Down(Error),
}

/// A reconnecting session: the reconnect state machine shared by the
/// publisher and the subscriber.
///
/// An outage starts with the first failure (a failed attempt or a lost
/// session), not with the last success, so a session that sat idle for an
/// hour still gets a full retry window when it breaks. The outage ends only
/// when the owner reports that a session did useful work
/// ([`Link::recovered`] or [`Link::progressed`]), so a daemon that accepts
/// sessions but keeps refusing requests transiently (disk full) is given up
/// on after the window too, rather than retried forever.
#[derive(Debug)]
pub struct Link {
    connector: Connector,
    state: LinkState,
    backoff: Backoff,
    outage_since: Option<Instant>,
    /// When the next attempt of the current outage is due. Kept across
    /// calls so that an [`Link::establish`] dropped while waiting (say, in
    /// `select!`) resumes the same wait instead of drawing a new, longer
    /// backoff delay every time it is polled anew.
    retry_at: Option<Instant>,
    /// The connection attempt in progress, kept for the same reason: a
    /// handshake dropped half-way would otherwise start over, and one that
    /// is interrupted often enough would never finish.
    attempt: Option<Attempt>,
    /// The daemon's storage fault was told since the last progress: a
    /// fault that outlasts many sessions is told once.
    fault_told: bool,
}

/// A connection attempt (transport and handshake) in progress.
struct Attempt(Pin<Box<dyn Future<Output = Result<Connection>> + Send>>);

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Attempt")
    }
}

impl Link {
    /// A link that connects on the first [`Link::establish`].
    pub fn new(connector: Connector) -> Self {
        let backoff = Backoff::new(
            connector.options.backoff_initial,
            connector.options.backoff_cap,
        );
        Self {
            connector,
            state: LinkState::Idle,
            backoff,
            outage_since: None,
            retry_at: None,
            attempt: None,
            fault_told: false,
        }
    }

    /// The connector sessions are opened with.
    pub fn connector(&self) -> &Connector {
        &self.connector
    }

    /// The current state.
    pub fn state(&self) -> &LinkState {
        &self.state
    }

    /// The open session, if there is one.
    pub fn connection(&mut self) -> Option<&mut Connection> {
        match &mut self.state {
            LinkState::Up(conn) => Some(conn),
            _ => None,
        }
    }

    /// Gives up the link, keeping its open session if there is one.
    pub fn into_connection(self) -> Option<Connection> {
        match self.state {
            LinkState::Up(conn) => Some(conn),
            _ => None,
        }
    }

    /// Makes sure a session is open. Returns `true` when it is a new one,
    /// on which the owner must restore its state (resubscribe, resend).
    ///
    /// Cancel-safe: dropping the future keeps the wait or the connection
    /// attempt in progress, and the next call resumes it.
    pub async fn establish(&mut self) -> Result<bool> {
        if let LinkState::Up(_) = self.state {
            return Ok(false);
        }
        loop {
            if self.attempt.is_none() {
                if let LinkState::Down(_) = self.state {
                    let now = Instant::now();
                    let since = *self.outage_since.get_or_insert(now);
                    let deadline = self.deadline_after(since);
                    if deadline.is_some_and(|deadline| now >= deadline) {
                        return Err(self.give_up());
                    }
                    let wake = match self.retry_at {
                        Some(wake) => wake,
                        None => {
                            let wake = now + self.backoff.next_delay();
                            let wake = deadline.map_or(wake, |deadline| wake.min(deadline));
                            self.retry_at = Some(wake);
                            wake
                        }
                    };
                    tokio::time::sleep_until(wake.into()).await;
                    self.retry_at = None;
                }
                let budget = match self
                    .outage_since
                    .and_then(|since| self.deadline_after(since))
                {
                    Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                    None => self.connector.options.retry_window,
                };
                let connector = self.connector.clone();
                self.attempt = Some(Attempt(Box::pin(async move {
                    connector.connect_once(budget).await
                })));
            }
            let Some(attempt) = self.attempt.as_mut() else {
                continue;
            };
            let outcome = attempt.0.as_mut().await;
            self.attempt = None;
            match outcome {
                Ok(conn) => {
                    self.state = LinkState::Up(conn);
                    return Ok(true);
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(endpoint = %self.connector.endpoint, "connect failed: {e}");
                    self.outage_since.get_or_insert_with(Instant::now);
                    if !self.keeps_earlier_cause(&e) {
                        self.state = LinkState::Down(e);
                    }
                }
                Err(e) => {
                    self.state = LinkState::Idle;
                    self.outage_since = None;
                    return Err(e);
                }
            }
        }
    }

    /// The end of the retry window of an outage that began at `since`;
    /// `None` when the window is too long to end (never give up).
    fn deadline_after(&self, since: Instant) -> Option<Instant> {
        since.checked_add(self.connector.options.retry_window)
    }

    /// Records that the session failed with `cause`. A transient cause
    /// leaves the link down, to be re-established; any other cause is
    /// handed back for the owner to return.
    pub fn lose(&mut self, cause: Error) -> Result<()> {
        if cause.is_transient() {
            tracing::debug!(endpoint = %self.connector.endpoint, "session lost: {cause}");
            if !self.fault_told && is_storage_fault(&cause) {
                // A full disk can last; say so once rather than retrying
                // in silence (nothing unacknowledged is dropped), and not
                // again for each session it refuses.
                self.fault_told = true;
                self.connector.options.on_storage_fault.tell(&cause);
            }
            self.outage_since.get_or_insert_with(Instant::now);
            self.state = LinkState::Down(cause);
            Ok(())
        } else {
            self.state = LinkState::Idle;
            Err(cause)
        }
    }

    /// The session is working again: the outage (and its retry window) is
    /// over, but the backoff keeps growing, so a peer that keeps failing
    /// right after accepting is not hammered.
    pub fn recovered(&mut self) {
        self.outage_since = None;
    }

    /// Real progress was made: the outage is over and the backoff restarts
    /// from its initial delay.
    pub fn progressed(&mut self) {
        self.outage_since = None;
        self.fault_told = false;
        self.backoff.reset();
    }

    /// Ends an outage whose window ran out: the error to return.
    /// Over ssh, an attempt that timed out says less than an earlier one
    /// the remote side explained (say, its daemon's socket is missing): on
    /// a loaded host the ssh login alone can outlast a late attempt's
    /// shorter time limit. The explained cause is kept as the one to
    /// report.
    fn keeps_earlier_cause(&self, new: &Error) -> bool {
        matches!(self.connector.endpoint, Endpoint::Ssh(_))
            && matches!(new, Error::Timeout { .. })
            && matches!(&self.state, LinkState::Down(earlier) if !matches!(earlier, Error::Timeout { .. }))
    }

    fn give_up(&mut self) -> Error {
        let state = std::mem::replace(&mut self.state, LinkState::Idle);
        self.outage_since = None;
        self.retry_at = None;
        self.attempt = None;
        let cause = match state {
            LinkState::Down(cause) => cause,
            _ => Error::Closed {
                endpoint: self.connector.endpoint.to_string(),
            },
        };
        let waited = self.connector.options.retry_window;
        if cause.is_connection_failure() {
            Error::Unreachable {
                endpoint: self.connector.endpoint.to_string(),
                waited,
                last_error: cause_text(&cause),
            }
        } else {
            // The daemon was reached but kept refusing: say that this is
            // the end of retrying, not just one more refusal like those
            // already reported.
            Error::GaveUp {
                waited,
                cause: Box::new(cause),
            }
        }
    }
}

/// The part of a connection failure worth repeating after "cannot reach
/// tetherd at X": the OS error, not our own wrapping of it.
fn cause_text(cause: &Error) -> String {
    match cause {
        Error::Io { source, .. } => source.to_string(),
        Error::Closed { .. } => "the daemon closed the connection".into(),
        Error::Timeout { after, .. } => format!("no answer to Hello within {}", humanize(*after)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use futures_util::SinkExt;
    use tether_protocol::{ErrorCode, ErrorFrame, ServerCodec};
    use tokio_util::codec::Framed;

    use super::*;

    /// A fake daemon's socket, bound in a new temporary directory.
    fn listening(name: &str) -> (tempfile::TempDir, PathBuf, tokio::net::UnixListener) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        (dir, path, listener)
    }

    /// A fake daemon's next session, once its client has sent Hello.
    async fn accept_session(
        listener: &tokio::net::UnixListener,
    ) -> Framed<tokio::net::UnixStream, ServerCodec> {
        let (stream, _) = listener.accept().await.unwrap();
        let mut framed = Framed::new(stream, ServerCodec::new());
        let _hello = framed.next().await;
        framed
    }

    /// A fake daemon's answer to Hello.
    fn hello_ok(daemon: &str) -> Response {
        Response::HelloOk(HelloOk {
            version: PROTOCOL_VERSION,
            capabilities: Capabilities::DURABLE,
            daemon: daemon.into(),
        })
    }

    /// A fake daemon's refusal for a full disk.
    fn disk_full() -> Response {
        Response::Error(ErrorFrame {
            code: ErrorCode::STORAGE_FULL,
            message: "disk full".into(),
        })
    }

    fn connector(path: &Path, window: Duration) -> Connector {
        Connector::new(
            Endpoint::unix(path),
            ConnectOptions {
                retry_window: window,
                ..ConnectOptions::default()
            },
        )
    }

    #[test]
    fn over_ssh_a_late_timeout_does_not_hide_the_cause_the_remote_gave() {
        let explained = || Error::Io {
            endpoint: "ssh://h/x.sock".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "x.sock: No such file"),
        };
        let timeout = Error::Timeout {
            endpoint: "ssh://h/x.sock".into(),
            after: Duration::from_secs(4),
        };
        let options = ConnectOptions::default();
        let mut ssh = Link::new(Connector::new(
            Endpoint::ssh("ssh://h/x.sock").unwrap(),
            options.clone(),
        ));
        ssh.state = LinkState::Down(explained());
        assert!(ssh.keeps_earlier_cause(&timeout));
        assert!(!ssh.keeps_earlier_cause(&explained()));
        ssh.state = LinkState::Down(Error::Timeout {
            endpoint: "ssh://h/x.sock".into(),
            after: Duration::from_secs(4),
        });
        assert!(!ssh.keeps_earlier_cause(&timeout));

        let mut local = Link::new(Connector::new(Endpoint::unix("/x.sock"), options));
        local.state = LinkState::Down(explained());
        assert!(!local.keeps_earlier_cause(&timeout));
    }

    #[tokio::test]
    async fn missing_socket_gives_up_after_the_window_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let started = Instant::now();
        let err = connector(&path, Duration::from_millis(150))
            .connect()
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(150));
        assert_eq!(err.exit_code(), 4);
        let text = err.to_string();
        assert!(text.contains(&path.display().to_string()), "{text}");
        assert!(text.contains("No such file or directory"), "{text}");
    }

    #[tokio::test]
    async fn a_window_of_forever_keeps_trying_until_the_daemon_appears() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("late.sock");
        let late = path.clone();
        let server = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let listener = tokio::net::UnixListener::bind(&late).unwrap();
            let mut framed = accept_session(&listener).await;
            framed.send(hello_ok("late")).await.unwrap();
            // Hold the session open until the client has seen the answer.
            let _ = framed.next().await;
        });
        let connector = Connector::new(
            Endpoint::unix(&path),
            ConnectOptions {
                retry_window: RETRY_FOREVER,
                backoff_initial: Duration::from_millis(5),
                backoff_cap: Duration::from_millis(50),
                ..ConnectOptions::default()
            },
        );
        let mut link = Link::new(connector);
        // Polling `establish` in short slices, as `select!` does, must still
        // connect: each slice resumes the same wait instead of starting a
        // new, longer one.
        let sliced = async {
            loop {
                let slice = tokio::time::timeout(Duration::from_millis(3), link.establish());
                if let Ok(result) = slice.await {
                    assert!(result.unwrap());
                    break;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(10), sliced)
            .await
            .expect("connected once the socket appeared");
        assert_eq!(link.connection().unwrap().hello().daemon, "late");
        drop(link);
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_daemon_that_keeps_refusing_is_given_up_on_after_the_window_with_its_reason() {
        let (_dir, path, listener) = listening("full.sock");
        let server = tokio::spawn(async move {
            loop {
                let mut framed = accept_session(&listener).await;
                let _ = framed.send(disk_full()).await;
            }
        });
        let started = Instant::now();
        let err = connector(&path, Duration::from_millis(300))
            .connect()
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert_eq!(
            err.to_string(),
            "gave up after 300ms: disk full (storage_full)"
        );
        assert_eq!(err.exit_code(), 1);
        assert_eq!(err.daemon_code(), Some(ErrorCode::STORAGE_FULL));
        server.abort();
    }

    #[tokio::test]
    async fn a_write_the_daemon_closed_on_is_explained_by_its_error_frame() {
        let (_dir, path, listener) = listening("d.sock");
        // The first session ends with an error frame, the second without.
        let server = tokio::spawn(async move {
            for refusal in [Some(disk_full()), None] {
                let mut framed = accept_session(&listener).await;
                framed.send(hello_ok("d")).await.unwrap();
                if let Some(refusal) = refusal {
                    framed.send(refusal).await.unwrap();
                }
            }
        });
        let broken_pipe = || Error::Io {
            endpoint: "d.sock".into(),
            source: std::io::ErrorKind::BrokenPipe.into(),
        };
        let connector = connector(&path, Duration::from_secs(5));
        let mut refused = connector.connect().await.unwrap();
        let mut closed = connector.connect().await.unwrap();
        server.await.unwrap();

        let why = refused.why_write_failed(broken_pipe()).await;
        assert_eq!(why.daemon_code(), Some(ErrorCode::STORAGE_FULL));
        assert_eq!(why.to_string(), "disk full (storage_full)");
        // Given an hour, it must still return at the end of the stream
        // rather than wait for a frame that cannot come.
        let hour = Duration::from_secs(3600);
        let why = tokio::time::timeout(
            Duration::from_secs(60),
            closed.why_write_failed_within(broken_pipe(), hour),
        )
        .await
        .expect("waited for a frame after the end of the stream");
        assert!(
            matches!(&why, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_peer_that_answers_hello_with_an_error_is_refused_at_once() {
        let (_dir, path, listener) = listening("d.sock");
        let server = tokio::spawn(async move {
            let mut framed = accept_session(&listener).await;
            framed
                .send(Response::Error(ErrorFrame {
                    code: ErrorCode::UNSUPPORTED_VERSION,
                    message: "protocol version 1 is not supported".into(),
                }))
                .await
                .unwrap();
        });
        let err = connector(&path, Duration::from_secs(5))
            .connect()
            .await
            .unwrap_err();
        assert_eq!(err.daemon_code(), Some(ErrorCode::UNSUPPORTED_VERSION));
        assert!(err.to_string().contains("not supported"));
        server.await.unwrap();
    }
}
