//! Where the daemon listens ([`Endpoint`]), and opening the transport to
//! it: a unix socket here, or `tether dial-stdio` run over ssh elsewhere.
//!
//! A local socket is trusted only so far ([`connect_unix`]): its directory
//! is judged before connecting (see [`tether_protocol::socket_dir`]), and
//! the process listening on it before anything is sent. Only "no socket"
//! and "nobody accepting" are worth retrying; any other failure to
//! connect (permission denied) is final.

use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tether_protocol::paths;
use tether_protocol::socket_dir::{self, User};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

use crate::error::{Error, Result};
use crate::ssh::{SshExit, SshTarget};

/// Over ssh, the part of the handshake's time limit that the remote
/// `tether dial-stdio` may spend reaching its daemon's socket; the rest is
/// for ssh itself and `Hello`.
const REMOTE_SHARE_OF_HANDSHAKE: f64 = 0.5;

pub(super) type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
pub(super) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

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
pub(super) struct Transport {
    pub(super) read: ReadHalf,
    pub(super) write: WriteHalf,
    pub(super) ssh: Option<SshExit>,
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
    pub(super) async fn open(&self, limit: Duration) -> Result<Transport> {
        match self {
            Endpoint::Unix(path) => {
                let stream = connect_unix(path).await?;
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
                        source: Some(e.into()),
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

/// Connects to the daemon's socket at `path`, trusting it only so far:
///
/// * its directory is judged first, so that nothing connects to a socket
///   another user could have put there ([`Error::Untrusted`]);
/// * "no socket" and "nobody accepting" are [`Error::Io`], to retry; any
///   other failure (permission denied) is [`Error::CannotConnect`], final;
/// * once connected, and before anything is sent, the process listening
///   must run as root, as this user, or as the directory's owner; else
///   [`Error::Untrusted`] names the socket and the uid found.
///
/// Shared by every session and by `tether dial-stdio`.
pub async fn connect_unix(path: &Path) -> Result<UnixStream> {
    let shown = path.display().to_string();
    let judged = judge_dir(path, &shown)?;
    let stream = UnixStream::connect(path)
        .await
        .map_err(|source| connect_failed(&shown, source))?;
    // The directory was missing a moment ago and is there now: judge it
    // before trusting anything that listens in it.
    let owner = match judged {
        Some(owner) => owner,
        None => judge_dir(path, &shown)?.ok_or_else(|| Error::Closed {
            endpoint: shown.clone(),
        })?,
    };
    let peer = stream
        .peer_cred()
        .map_err(|source| Error::Io {
            endpoint: shown.clone(),
            source: source.into(),
        })?
        .uid();
    let me = paths::current_uid();
    if peer != 0 && peer != me && peer != owner {
        let dir = socket_dir::socket_dir(path);
        return Err(Error::Untrusted(format!(
            "refusing the daemon at {shown}: the process listening there runs as {}, who is \
             neither root, nor {} who runs this, nor {} who owns {}; nothing was sent to it",
            User::named(peer),
            User::named(me),
            User::named(owner),
            dir.display()
        )));
    }
    Ok(stream)
}

/// The owner of the socket's directory once it is judged fit, `None` when
/// it does not exist (yet).
fn judge_dir(path: &Path, shown: &str) -> Result<Option<u32>> {
    match paths::from_process(|env| socket_dir::check(path, env)) {
        Ok(owner) => Ok(owner),
        Err(tether_protocol::Error::Io(source)) => Err(connect_failed(shown, source)),
        Err(refused) => Err(Error::Untrusted(refused.to_string())),
    }
}

/// The error for a failed connect: [`Error::Io`] (retried) when there is
/// no socket or nobody accepts on it, or when the daemon's backlog is full
/// for a moment; [`Error::CannotConnect`] (final) for anything else.
fn connect_failed(shown: &str, source: impl Into<Arc<std::io::Error>>) -> Error {
    let source = source.into();
    match source.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused | ErrorKind::WouldBlock => Error::Io {
            endpoint: shown.to_owned(),
            source,
        },
        ErrorKind::PermissionDenied => Error::CannotConnect {
            endpoint: shown.to_owned(),
            reason: format!(
                "permission denied: the socket or its directory does not let {} in",
                User::named(paths::current_uid())
            ),
            source,
        },
        _ => Error::CannotConnect {
            endpoint: shown.to_owned(),
            reason: source.to_string(),
            source,
        },
    }
}
