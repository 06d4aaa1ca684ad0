//! The listening socket: binding it safely, accepting, and admitting each
//! connection: its peer's credentials judged (see [`crate::access`]), then
//! a slot taken (see [`crate::slots`]). A peer that is refused, or that
//! finds no slot, is answered at once with the reason and closed, without
//! its Hello being read.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use tether_protocol::{ErrorCode, ErrorFrame, Response, ServerCodec};
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::FramedWrite;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::{Access, Policy};
use crate::connection::{self, Shared};
use crate::slots::{Limits, Slots};
use crate::{Error, Result};

/// How long shutdown waits for connections to finish their in-flight work
/// before it stops waiting (the store is closed cleanly either way).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the daemon's socket at `path`.
///
/// The socket's directory is created when missing, with each directory
/// made here 0700, or 0750 with the group the socket is shared with (the
/// readers' group, or `group`) when the socket lets a group in. An
/// existing directory is never chmodded. Then the directory is judged
/// ([`tether_protocol::socket_dir`]): one that others could write to, or a
/// default one in a shared place that another user made, is refused.
///
/// A socket file left by a dead daemon is replaced; one that a live daemon
/// still accepts on is an error, because the caller holds only its own
/// state directory's lock, not the socket's. Then the socket gets `mode`
/// (with the group's read and write added when `readers` is set, since
/// readers could not connect otherwise) and the group: `group`, else the
/// readers' group.
pub fn bind_with(
    path: &Path,
    mode: u32,
    group: Option<&str>,
    readers: Option<&str>,
) -> Result<UnixListener> {
    let mode = if readers.is_some() {
        mode | 0o060
    } else {
        mode
    };
    let gid = group.or(readers).map(resolve_group).transpose()?;
    let shared_gid = gid.filter(|_| mode & 0o060 != 0);
    let dir = tether_protocol::socket_dir::socket_dir(path);
    create_socket_dirs(dir, shared_gid)?;
    let checked =
        tether_protocol::paths::from_process(|env| tether_protocol::socket_dir::check(path, env))
            .map_err(|e| match e {
            tether_protocol::Error::Io(e) => Error::io(
                format!("cannot look at socket directory {}", dir.display()),
                e,
            ),
            refused => Error::Protocol(refused),
        })?;
    if checked.is_none() {
        return Err(Error::Config(format!(
            "socket directory {} does not exist and could not be made \
             (a symbolic link to nowhere?)",
            dir.display()
        )));
    }
    // Only a socket is ever replaced: `--socket` naming any other file
    // is a mistake, and removing that file would lose it.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(Error::Config(format!(
                "{} exists and is not a socket; refusing to replace it (choose another --socket)",
                path.display()
            )));
        }
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io(format!("cannot set mode of socket {}", path.display()), e))?;
    if let Some(gid) = gid {
        chown_group(path, gid)?;
    }
    Ok(listener)
}

/// Creates `dir` and its missing parents, one at a time, so that exactly
/// the directories made here get their mode: 0700, or 0750 with the group
/// `shared_gid`. A directory that exists (even one another process made a
/// moment ago) is left as it is, for the check after this to judge.
fn create_socket_dirs(dir: &Path, shared_gid: Option<u32>) -> Result<()> {
    let missing: Vec<&Path> = dir
        .ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .collect();
    let mode = if shared_gid.is_some() { 0o750 } else { 0o700 };
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(Error::io(
                    format!("cannot create socket directory {}", d.display()),
                    e,
                ))
            }
        }
        // The umask may have taken bits away; the mode is the contract's.
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).map_err(|e| {
            Error::io(
                format!("cannot set mode of socket directory {}", d.display()),
                e,
            )
        })?;
        if let Some(gid) = shared_gid {
            chown_group(d, gid)?;
        }
    }
    Ok(())
}

/// Gives `path` the group `gid`, keeping its owner.
fn chown_group(path: &Path, gid: u32) -> Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
        .map_err(|e| Error::io(format!("cannot give {} the group {gid}", path.display()), e))
}

/// A group name or numeric gid as a gid. Names are looked up through the
/// system's name services (`/etc/group`, LDAP, ...).
fn resolve_group(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    uzers::get_group_by_name(group)
        .map(|g| g.gid())
        .ok_or_else(|| {
            Error::Config(format!(
                "socket.group: the system knows no group {group:?} (give its numeric gid instead)"
            ))
        })
}

/// Descriptors kept free for everything but sessions: the store, the lock,
/// shims' pidfds and log files, and the moment a connection over the limit
/// is held open to be refused.
const RESERVED_FDS: u64 = 128;

/// Sessions served at once: the configured limit, lowered to what the
/// process's descriptor limit `fds` leaves room for. A connection beyond
/// the descriptor limit cannot even be accepted (EMFILE), so its client
/// would wait without an answer instead of being refused clearly.
fn session_limit(configured: usize, fds: Option<u64>) -> usize {
    let Some(fds) = fds else {
        return configured;
    };
    let fit = usize::try_from(fds.saturating_sub(RESERVED_FDS))
        .unwrap_or(usize::MAX)
        .max(1);
    if fit < configured {
        tracing::warn!(
            "serving at most {fit} connections instead of {configured}: \
             the open-file limit is {fds} (raise it with LimitNOFILE= or ulimit -n)"
        );
    }
    configured.min(fit)
}

/// The soft limit on open files (`RLIMIT_NOFILE`); `None` when unlimited.
fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// How long a refusal may take to write. A new connection's send buffer
/// is empty, so the frame goes at once; this only bounds the unexpected.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Accepts connections until `shutdown` is cancelled, then waits (bounded)
/// for the running sessions to finish what they have in flight.
pub async fn serve(listener: UnixListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    let max = session_limit(shared.config.max_connections, open_file_limit());
    let slots = Slots::new(Limits::new(max, shared.config.max_connections_per_uid));
    let policy = Policy::for_this_process(shared.config.readers_group.clone())
        .with_answerers(shared.config.answerers.clone());
    let refusals = Arc::new(RefusalLog::default());
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
        // Admission runs off the accept loop: judging a peer may wait on
        // the name services.
        tracker.spawn(admit(
            stream,
            shared.clone(),
            shutdown.clone(),
            policy.clone(),
            slots.clone(),
            refusals.clone(),
        ));
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

/// Judges a new connection's peer, takes a slot for it and serves its
/// session; or refuses it at once, holding no slot.
async fn admit(
    stream: UnixStream,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    policy: Policy,
    slots: Arc<Slots>,
    refusals: Arc<RefusalLog>,
) {
    let peer = policy.identify(&stream).await;
    if peer.access == Access::Denied {
        let denial = policy.denial(&peer);
        match refusals.due(peer.uid(), Instant::now()) {
            Some(0) => {
                tracing::warn!(code = %ErrorCode::PERMISSION_DENIED, "refusing connection: {denial}");
            }
            Some(more) => tracing::warn!(
                code = %ErrorCode::PERMISSION_DENIED,
                "refusing connection: {denial} ({more} more of this uid refused since the last line)"
            ),
            None => tracing::debug!("refusing connection: {denial}"),
        }
        refuse(stream, ErrorCode::PERMISSION_DENIED, denial).await;
        return;
    }
    let slot = match slots.take(peer.uid(), policy.is_privileged(peer.uid())) {
        Ok(slot) => slot,
        Err(full) => {
            let why = full.describe(&peer);
            tracing::debug!(code = %ErrorCode::TOO_MANY_CONNECTIONS, "refusing connection: {why}");
            refuse(stream, ErrorCode::TOO_MANY_CONNECTIONS, why).await;
            return;
        }
    };
    connection::run(stream, shared, shutdown, peer).await;
    drop(slot);
}

/// How often a refused uid is logged at most.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(60);

/// Refusals of a uid, logged at most once per [`REFUSAL_LOG_EVERY`]: a
/// user who opens connections by the thousand must not fill the journal,
/// whose own rate limit would then drop the daemon's other lines.
#[derive(Debug, Default)]
struct RefusalLog {
    /// Per uid: when it was last logged, and its refusals not logged since.
    seen: Mutex<HashMap<u32, (Instant, u64)>>,
}

impl RefusalLog {
    /// `Some(n)` when a refusal of `uid` at `now` is to be logged, with the
    /// `n` refusals left out since the last line; `None` to leave it out.
    fn due(&self, uid: u32, now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match seen.get_mut(&uid) {
            Some((last, skipped)) if now.duration_since(*last) < REFUSAL_LOG_EVERY => {
                *skipped += 1;
                None
            }
            Some((last, skipped)) => {
                *last = now;
                Some(std::mem::take(skipped))
            }
            None => {
                seen.insert(uid, (now, 0));
                Some(0)
            }
        }
    }
}

/// Tells a client why it is turned away, then closes the connection: the
/// write side first, so that the client reads the end of the stream after
/// the frame.
async fn refuse(stream: UnixStream, code: ErrorCode, message: String) {
    let mut out = FramedWrite::new(stream, ServerCodec::new());
    let refusal = Response::Error(ErrorFrame { code, message });
    if let Ok(Ok(())) = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, out.send(refusal)).await {
        let _ = out.get_mut().shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_session_limit_leaves_room_under_the_open_file_limit() {
        assert_eq!(
            session_limit(4096, Some(1024)),
            1024 - RESERVED_FDS as usize
        );
        assert_eq!(session_limit(100, Some(1024)), 100);
        assert_eq!(session_limit(4096, Some(u64::MAX)), 4096);
        assert_eq!(session_limit(4096, None), 4096);
        // A limit too small for the reserve still serves one session.
        assert_eq!(session_limit(4096, Some(10)), 1);
    }

    #[test]
    fn the_open_file_limit_can_be_read() {
        assert!(open_file_limit().is_some_and(|n| n > 0));
    }

    #[test]
    fn a_refused_uid_is_logged_once_a_minute_with_what_was_left_out() {
        let log = RefusalLog::default();
        let start = Instant::now();
        assert_eq!(log.due(1001, start), Some(0));
        assert_eq!(log.due(1001, start + Duration::from_secs(1)), None);
        assert_eq!(log.due(1001, start + Duration::from_secs(59)), None);
        // Another uid has its own minute.
        assert_eq!(log.due(1002, start + Duration::from_secs(2)), Some(0));
        assert_eq!(log.due(1001, start + REFUSAL_LOG_EVERY), Some(2));
        assert_eq!(log.due(1001, start + REFUSAL_LOG_EVERY * 2), Some(0));
    }
}
