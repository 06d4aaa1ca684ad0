//! The listening socket: binding it safely, accepting, and the connection
//! limit.

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::SinkExt;
use tether_protocol::{ErrorCode, ErrorFrame, Response, ServerCodec};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::{self, Shared};
use crate::{Error, Result};

/// How long shutdown waits for connections to finish their in-flight work
/// before it stops waiting (the store is closed cleanly either way).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the daemon's socket at `path` with mode 0600, creating its parent
/// directory (0700) when missing. A socket file left by a dead daemon is
/// replaced; one that a live daemon still accepts on is an error, because
/// the caller holds only its own state directory's lock, not the socket's.
pub fn bind(path: &Path) -> Result<UnixListener> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| {
                Error::io(
                    format!("cannot create socket directory {}", parent.display()),
                    e,
                )
            })?;
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => {
            return Err(Error::Config(format!(
                "socket {} is in use by another daemon",
                path.display()
            )))
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(_) => {
            // Nobody accepts on it: a leftover of a daemon that did not exit
            // cleanly. Removing it is safe because nothing is listening.
            if let Err(e) = std::fs::remove_file(path) {
                if e.kind() != ErrorKind::NotFound {
                    return Err(Error::io(
                        format!("cannot remove stale socket {}", path.display()),
                        e,
                    ));
                }
            }
        }
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| Error::io(format!("cannot bind socket {}", path.display()), e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("cannot set mode of socket {}", path.display()), e))?;
    Ok(listener)
}

/// Accepts connections until `shutdown` is cancelled, then waits (bounded)
/// for the running sessions to finish what they have in flight.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    let limit = Arc::new(Semaphore::new(shared.config.max_connections));
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match limit.clone().try_acquire_owned() {
            Ok(permit) => {
                let shared = shared.clone();
                let shutdown = shutdown.clone();
                tracker.spawn(async move {
                    connection::run(stream, shared, shutdown).await;
                    drop(permit);
                });
            }
            Err(_) => {
                let max = shared.config.max_connections;
                tracker.spawn(refuse(stream, max));
            }
        }
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(DRAIN_TIMEOUT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "{} connections still busy after {DRAIN_TIMEOUT:?}; closing anyway",
            tracker.len()
        );
    }
}

/// Tells a client over the connection limit why it is being turned away.
async fn refuse(stream: UnixStream, max: usize) {
    let mut out = FramedWrite::new(stream, ServerCodec::new());
    let refusal = Response::Error(ErrorFrame {
        code: ErrorCode::TOO_MANY_CONNECTIONS,
        message: format!("the daemon is serving its maximum of {max} connections; try again later"),
    });
    let _ = tokio::time::timeout(Duration::from_secs(1), out.send(refusal)).await;
}
