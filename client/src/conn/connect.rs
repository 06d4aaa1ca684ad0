//! Opening a session: the [`ConnectOptions`], the [`StorageFaultNotice`]
//! among them, and the [`Connector`], whose handshake sends `Hello` and
//! checks the `HelloOk`.

use std::fmt;
use std::time::Duration;

use bytes::BytesMut;
use tether_protocol::{
    Capabilities, ClientCodec, Hello, HelloOk, Request, Response, DEFAULT_MAX_FRAME_LEN,
    PROTOCOL_VERSION,
};
use tokio_util::codec::FramedRead;

use super::endpoint::Transport;
use super::{unexpected, Connection, Endpoint, Link};
use crate::backoff;
use crate::error::{Error, Result};

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

/// Default size of a session's read and write buffers: large enough that
/// one syscall carries hundreds of small frames.
pub const DEFAULT_BUFFER_SIZE: usize = 256 * 1024;

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
    /// Told once when the first attempt of a link that never had a session
    /// finds no daemon (no socket, nobody accepting), before it retries
    /// quietly.
    pub on_no_daemon: NoDaemonNotice,
}

/// What a link's owner is told when its first attempt finds no daemon:
/// the endpoint and the retry window in force. By default nothing but a
/// `tracing` debug line (the final error names the socket anyway); the
/// command line prints a hint on how to start one.
#[derive(Clone, Default)]
pub struct NoDaemonNotice(Option<std::sync::Arc<SayNoDaemon>>);

/// How a [`NoDaemonNotice`] says it.
type SayNoDaemon = dyn Fn(&Endpoint, Duration) + Send + Sync;

impl NoDaemonNotice {
    /// Calls `say` with the endpoint and the retry window.
    pub fn new(say: impl Fn(&Endpoint, Duration) + Send + Sync + 'static) -> Self {
        Self(Some(std::sync::Arc::new(say)))
    }

    pub(super) fn tell(&self, endpoint: &Endpoint, window: Duration) {
        match &self.0 {
            Some(say) => say(endpoint, window),
            None => tracing::debug!(%endpoint, "no daemon yet; retrying"),
        }
    }
}

impl fmt::Debug for NoDaemonNotice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "NoDaemonNotice(custom)"
        } else {
            "NoDaemonNotice(tracing)"
        })
    }
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

    pub(super) fn tell(&self, cause: &Error) {
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
            on_no_daemon: NoDaemonNotice::default(),
        }
    }
}

/// Opens sessions to one endpoint with one set of options.
#[derive(Debug, Clone)]
pub struct Connector {
    pub(super) endpoint: Endpoint,
    pub(super) options: ConnectOptions,
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
        // `APPEND_STAMPED` and `OUTPUT_FLUSH` are asked for on top of what
        // is needed: a daemon that predates them ignores the bits, and a
        // publisher then sends plain appends (see `Connection::hello`) and
        // a shim is never asked to flush.
        let asked = Capabilities(
            self.options.capabilities.0
                | Capabilities::APPEND_STAMPED.0
                | Capabilities::OUTPUT_FLUSH.0,
        );
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities: asked,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use futures_util::SinkExt;
    use tether_protocol::{ErrorCode, ErrorFrame, ServerCodec};
    use tokio_util::codec::Framed;

    use super::*;
    use crate::conn::fake_daemon::{accept_session, connector, listening};

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

    #[tokio::test]
    async fn a_refusal_sent_at_accept_before_hello_is_reported_and_not_retried() {
        let (_dir, path, listener) = listening("d.sock");
        // The daemon refuses a peer as soon as it accepts it, reads
        // nothing and closes: the Hello may meet a closed socket.
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut framed = Framed::new(stream, ServerCodec::new());
            framed
                .send(Response::Error(ErrorFrame {
                    code: ErrorCode::PERMISSION_DENIED,
                    message: "permission denied: uid 1 is not allowed".into(),
                }))
                .await
                .unwrap();
            drop(framed);
            listener
        });
        // A window far longer than the deadline: a refusal that were
        // retried would not finish in time.
        let connector = connector(&path, Duration::from_secs(600));
        let err = tokio::time::timeout(Duration::from_secs(60), connector.connect())
            .await
            .expect("the refusal ends the attempt at once")
            .unwrap_err();
        assert_eq!(err.daemon_code(), Some(ErrorCode::PERMISSION_DENIED));
        assert_eq!(
            err.to_string(),
            "permission denied: uid 1 is not allowed (permission_denied)"
        );
        assert_eq!(err.exit_code(), 1);
        server.await.unwrap();
    }
}
