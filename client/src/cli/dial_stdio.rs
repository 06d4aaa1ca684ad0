//! `tether dial-stdio`: bridges stdin and stdout to the local daemon's
//! socket, byte for byte. It is what `--host ssh://` runs on the remote
//! machine, so the protocol (including `Hello`) passes through untouched and
//! the daemon sees an ordinary local connection.
//!
//! The socket is retried with backoff within `--connect-timeout` (a daemon
//! that is restarting comes back), then the bridge exits 4. A socket the
//! local checks refuse (its directory, the process listening, permission
//! denied) ends it at once with exit 1. Once connected,
//! it copies both ways until the daemon closes the connection or stdin ends;
//! at the end of stdin the socket's write side is shut down and answers
//! still on their way are passed on for a short while.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tether::backoff::Backoff;
use tether::conn::connect_unix;
use tether::{Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::Context;

/// Bytes moved per read, either way.
const CHUNK: usize = 64 * 1024;
/// Chunks read from stdin that may wait for the socket.
const QUEUED_CHUNKS: usize = 4;
/// After stdin ends, how long the daemon's last answers are still passed on.
const DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Runs `tether dial-stdio`.
pub async fn run(ctx: &Context) -> Result<()> {
    let Some(path) = ctx.endpoint.socket_path() else {
        return Err(Error::Usage(
            "dial-stdio bridges to a daemon on this machine; --host does not apply".into(),
        ));
    };
    let stream = connect(path, ctx.connect_timeout).await?;
    bridge(stream, path).await
}

/// Connects to the socket, retrying within `window` while there is no
/// daemon. The same checks as every local session apply (see
/// [`connect_unix`]); what they refuse, and permission denied, end the
/// bridge at once.
async fn connect(path: &Path, window: Duration) -> Result<UnixStream> {
    let started = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        match connect_unix(path).await {
            Ok(stream) => return Ok(stream),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) if started.elapsed() >= window => {
                let last_error = match &e {
                    Error::Io { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                return Err(Error::Unreachable {
                    endpoint: path.display().to_string(),
                    waited: window,
                    last_error,
                    source: Some(Box::new(e)),
                });
            }
            Err(e) => {
                tracing::debug!("cannot connect to {}: {e}", path.display());
                let left = window.saturating_sub(started.elapsed());
                tokio::time::sleep(backoff.next_delay().min(left)).await;
            }
        }
    }
}

/// Copies stdin to the socket and the socket to stdout until one side ends.
async fn bridge(stream: UnixStream, path: &Path) -> Result<()> {
    let (from_daemon, to_daemon) = stream.into_split();
    let (tx, rx) = mpsc::channel(QUEUED_CHUNKS);
    read_stdin_on_a_thread(tx)?;
    let mut downstream = Box::pin(daemon_to_stdout(from_daemon, path));
    tokio::select! {
        // The daemon closed the connection (or stdout did): nothing more
        // can be answered, so the bridge is done.
        done = &mut downstream => return done,
        up = stdin_to_daemon(rx, to_daemon, path) => up?,
    }
    // stdin ended and the daemon was told so; pass on what it still sends.
    match tokio::time::timeout(DRAIN_GRACE, downstream).await {
        Ok(done) => done,
        Err(_) => Ok(()),
    }
}

/// Reads stdin on a plain thread. A blocked read of stdin cannot be
/// cancelled; on a thread of its own it never holds up the exit, which
/// tokio's blocking pool would.
fn read_stdin_on_a_thread(tx: mpsc::Sender<std::io::Result<Bytes>>) -> Result<()> {
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; CHUNK];
            loop {
                let chunk = match stdin.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = chunk.is_err();
                if tx.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        })
        .map(drop)
        .map_err(|source| Error::Local {
            context: "cannot start the thread that reads stdin".into(),
            source,
        })
}

/// Forwards stdin's chunks to the daemon; at the end of stdin, shuts down
/// the socket's write side so the daemon sees the end too.
async fn stdin_to_daemon(
    mut rx: mpsc::Receiver<std::io::Result<Bytes>>,
    mut to_daemon: OwnedWriteHalf,
    path: &Path,
) -> Result<()> {
    let io = |source: std::io::Error| Error::Io {
        endpoint: path.display().to_string(),
        source: source.into(),
    };
    while let Some(chunk) = rx.recv().await {
        let chunk = chunk.map_err(|source| Error::Local {
            context: "cannot read stdin".into(),
            source,
        })?;
        to_daemon.write_all(&chunk).await.map_err(io)?;
    }
    to_daemon.shutdown().await.map_err(io)
}

/// Forwards the daemon's bytes to stdout until the daemon closes. A closed
/// stdout ends the bridge quietly: whoever read it has gone.
async fn daemon_to_stdout(mut from_daemon: OwnedReadHalf, path: &Path) -> Result<()> {
    let mut stdout = tokio::io::stdout();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from_daemon
            .read(&mut buf)
            .await
            .map_err(|source| Error::Io {
                endpoint: path.display().to_string(),
                source: source.into(),
            })?;
        if n == 0 {
            return Ok(());
        }
        let written = async {
            stdout.write_all(&buf[..n]).await?;
            stdout.flush().await
        };
        match written.await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(source) => {
                return Err(Error::Local {
                    context: "cannot write to stdout".into(),
                    source,
                })
            }
        }
    }
}
