//! Socket activation: serving a listening socket handed over by the
//! service manager (`$LISTEN_PID`, `$LISTEN_FDS`, `$LISTEN_FDNAMES`; the
//! descriptors start at 3).
//!
//! The service manager keeps the socket open while the daemon restarts, so
//! connections made in between wait in the kernel's backlog and are served
//! by the next daemon: no client sees a refused connection. For the same
//! reason the daemon never removes an inherited socket's file.
//!
//! The variables are read once and removed from the environment, and every
//! inherited descriptor is either adopted with close-on-exec or closed, so
//! that shims and workers inherit neither.

use std::ops::Range;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use crate::{Error, Result};

/// The first inherited descriptor (after stdin, stdout and stderr).
pub const LISTEN_FDS_START: RawFd = 3;

/// The name the socket unit gives our socket (`FileDescriptorName=`).
/// When several descriptors are passed, the one with this name is served.
pub const FD_NAME: &str = "tether";

/// What the service manager passed, read from the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListenEnv {
    /// `$LISTEN_PID`.
    pub pid: Option<String>,
    /// `$LISTEN_FDS`.
    pub fds: Option<String>,
    /// `$LISTEN_FDNAMES`, colon-separated.
    pub names: Option<String>,
}

/// A listening socket inherited from the service manager.
#[derive(Debug)]
pub struct Activated {
    /// The socket, already listening.
    pub listener: UnixListener,
    /// The path it is bound to, when it has one.
    pub path: Option<PathBuf>,
}

impl ListenEnv {
    /// Reads the variables and removes them from the environment. Call it
    /// before any other thread starts: changing the environment is not
    /// safe while another thread may read it.
    pub fn take_from_process() -> ListenEnv {
        let take = |name: &str| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty());
            std::env::remove_var(name);
            value
        };
        ListenEnv {
            pid: take("LISTEN_PID"),
            fds: take("LISTEN_FDS"),
            names: take("LISTEN_FDNAMES"),
        }
    }

    /// Which inherited descriptor to serve, as an offset from
    /// [`LISTEN_FDS_START`], and how many were passed. `None` when nothing
    /// was passed to this process (no `$LISTEN_FDS`, or `$LISTEN_PID` names
    /// another process: the variables were inherited, not meant for us).
    pub fn choose(&self, own_pid: u32) -> Result<Option<(usize, usize)>> {
        let Some(fds) = &self.fds else {
            return Ok(None);
        };
        let Some(pid) = &self.pid else {
            return Ok(None);
        };
        if pid.trim().parse::<u32>().ok() != Some(own_pid) {
            return Ok(None);
        }
        let count: usize = fds.trim().parse().map_err(|_| {
            Error::Config(format!("$LISTEN_FDS: {fds:?} is not a number of sockets"))
        })?;
        if count == 0 {
            return Ok(None);
        }
        let names: Vec<&str> = self
            .names
            .as_deref()
            .map(|n| n.split(':').collect())
            .unwrap_or_default();
        if let Some(i) = names.iter().take(count).position(|n| *n == FD_NAME) {
            return Ok(Some((i, count)));
        }
        if count == 1 {
            return Ok(Some((0, count)));
        }
        Err(Error::Config(format!(
            "$LISTEN_FDS: {count} sockets were passed ({}) and none is named {FD_NAME:?}; \
             set FileDescriptorName={FD_NAME} on the daemon's socket",
            self.names.as_deref().unwrap_or("no $LISTEN_FDNAMES")
        )))
    }

    /// The descriptors passed to this process (`LISTEN_FDS_START..`), left
    /// to [`ListenEnv::activate`]; empty when none were.
    pub fn passed(&self) -> Range<RawFd> {
        let count = match self.choose(std::process::id()) {
            Ok(Some((_, count))) => RawFd::try_from(count).unwrap_or(RawFd::MAX),
            // A bad count is refused by `activate`, before anything runs.
            Ok(None) | Err(_) => 0,
        };
        LISTEN_FDS_START..LISTEN_FDS_START.saturating_add(count)
    }

    /// The socket to serve, if the environment passes one: adopts it and
    /// closes every other inherited descriptor.
    pub fn activate(&self) -> Result<Option<Activated>> {
        let Some((chosen, count)) = self.choose(std::process::id())? else {
            return Ok(None);
        };
        let mut listener = None;
        for i in 0..count {
            let fd = adopt(LISTEN_FDS_START + i as RawFd, count)?;
            if i == chosen {
                listener = Some(fd);
            }
            // Descriptors not chosen are dropped here, which closes them.
        }
        let Some(fd) = listener else {
            return Ok(None);
        };
        // A duplicate made by std carries close-on-exec, which the
        // inherited descriptor lacks; dropping the original closes fd 3 so
        // that no shim or worker inherits the listening socket.
        let fd = fd
            .try_clone()
            .map_err(|e| Error::io("cannot duplicate the inherited socket", e))?;
        let listener = UnixListener::from(fd);
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("the inherited descriptor is not a listening unix socket", e))?;
        Ok(Some(Activated {
            path: addr.as_pathname().map(PathBuf::from),
            listener,
        }))
    }
}

/// Takes ownership of inherited descriptor `fd`.
#[allow(unsafe_code)]
fn adopt(fd: RawFd, count: usize) -> Result<OwnedFd> {
    // Check that the descriptor is open before claiming it: adopting a
    // closed number would later close whatever reuses it.
    let path = format!("/proc/self/fd/{fd}");
    std::fs::symlink_metadata(&path).map_err(|e| {
        Error::io(
            format!("$LISTEN_FDS={count} but descriptor {fd} is not open"),
            e,
        )
    })?;
    // SAFETY: `$LISTEN_PID` names this process, so the service manager
    // handed descriptors 3.. to it for it to own; nothing else in the
    // daemon knows these numbers, and the variables were removed from the
    // environment before this runs, so each is adopted once.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn env(pid: &str, fds: &str, names: Option<&str>) -> ListenEnv {
        ListenEnv {
            pid: Some(pid.into()),
            fds: Some(fds.into()),
            names: names.map(Into::into),
        }
    }

    #[test]
    fn nothing_passed_means_bind_ourselves() {
        assert_eq!(ListenEnv::default().choose(5).unwrap(), None);
        assert_eq!(env("5", "0", None).choose(5).unwrap(), None);
    }

    #[test]
    fn sockets_for_another_pid_are_not_ours() {
        assert_eq!(env("4", "1", None).choose(5).unwrap(), None);
    }

    #[test]
    fn a_single_socket_is_served() {
        assert_eq!(env("5", "1", None).choose(5).unwrap(), Some((0, 1)));
    }

    #[test]
    fn among_several_the_named_one_is_served() {
        let e = env("5", "3", Some("other:tether:more"));
        assert_eq!(e.choose(5).unwrap(), Some((1, 3)));
        let err = env("5", "2", Some("a:b"))
            .choose(5)
            .unwrap_err()
            .to_string();
        assert!(err.contains("FileDescriptorName"), "{err}");
    }

    #[test]
    fn a_bad_count_is_an_error_naming_it() {
        let err = env("5", "many", None).choose(5).unwrap_err().to_string();
        assert!(err.contains("LISTEN_FDS"), "{err}");
    }
}
