//! Where the daemon listens ([`Endpoint`]), and opening the transport to
//! it: a unix socket here, or `tether dial-stdio` run over ssh elsewhere.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

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
