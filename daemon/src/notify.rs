//! Telling the service manager how the daemon is doing: the `sd_notify`
//! datagram protocol on `$NOTIFY_SOCKET`.
//!
//! Each message is one datagram of `KEY=VALUE` lines. `READY=1` is sent
//! once the listening socket accepts connections, `STATUS=` lines say what
//! the daemon is doing, `WATCHDOG=1` is sent at half of `$WATCHDOG_USEC`
//! by a task that first proves the store answers, and `STOPPING=1` as soon
//! as shutdown begins. Without `$NOTIFY_SOCKET` nothing is sent.
//!
//! The variables are read once and removed from the environment, so that
//! shims and workers started later do not inherit them and talk to the
//! service manager in the daemon's name.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

use crate::{Error, Result};

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    watchdog: Option<Duration>,
}

/// What the service manager asked for, read from the environment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NotifyEnv {
    /// `$NOTIFY_SOCKET`: a path, or `@name` for an abstract address.
    pub socket: Option<String>,
    /// `$WATCHDOG_USEC`.
    pub watchdog_usec: Option<String>,
    /// `$WATCHDOG_PID`: when set, the watchdog is meant for that process.
    pub watchdog_pid: Option<String>,
}

impl NotifyEnv {
    /// Reads the variables and removes them from the environment. Call it
    /// before any other thread starts: changing the environment is not
    /// safe while another thread may read it.
    pub fn take_from_process() -> NotifyEnv {
        let take = |name: &str| {
            let value = std::env::var(name).ok().filter(|v| !v.is_empty());
            std::env::remove_var(name);
            value
        };
        NotifyEnv {
            socket: take("NOTIFY_SOCKET"),
            watchdog_usec: take("WATCHDOG_USEC"),
            watchdog_pid: take("WATCHDOG_PID"),
        }
    }

    /// The interval at which `WATCHDOG=1` is due: half of `$WATCHDOG_USEC`,
    /// so that one late ping does not get the daemon killed. `None` when no
    /// watchdog is asked for, or it is meant for another process.
    pub fn watchdog_interval(&self, own_pid: u32) -> Result<Option<Duration>> {
        let Some(usec) = &self.watchdog_usec else {
            return Ok(None);
        };
        if let Some(pid) = &self.watchdog_pid {
            if pid.trim().parse::<u32>().ok() != Some(own_pid) {
                return Ok(None);
            }
        }
        let usec: u64 = usec.trim().parse().map_err(|_| {
            Error::Config(format!(
                "$WATCHDOG_USEC: {usec:?} is not a number of microseconds"
            ))
        })?;
        if usec == 0 {
            return Ok(None);
        }
        Ok(Some(
            Duration::from_micros(usec / 2).max(Duration::from_millis(1)),
        ))
    }
}

impl Notifier {
    /// The notifier the environment asks for, if any.
    pub fn from_env(env: &NotifyEnv) -> Result<Option<Notifier>> {
        let Some(socket) = &env.socket else {
            return Ok(None);
        };
        let mut notifier = Notifier::connect(socket)?;
        notifier.watchdog = env.watchdog_interval(std::process::id())?;
        Ok(Some(notifier))
    }

    /// A notifier sending to `address`: a filesystem path, or `@name` for a
    /// Linux abstract socket address.
    pub fn connect(address: &str) -> Result<Notifier> {
        let addr = parse_address(address)
            .map_err(|e| Error::io(format!("bad $NOTIFY_SOCKET {address:?}"), e))?;
        let socket = UnixDatagram::unbound()
            .map_err(|e| Error::io("cannot create the notification socket", e))?;
        // A full socket buffer must not stall the daemon; a lost status
        // line is harmless and a lost watchdog ping is retried.
        socket
            .set_nonblocking(true)
            .map_err(|e| Error::io("cannot make the notification socket non-blocking", e))?;
        Ok(Notifier {
            socket,
            addr,
            watchdog: None,
        })
    }

    /// How often [`Notifier::watchdog`] must be called; `None` when the
    /// service manager runs no watchdog.
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines) as one datagram.
    pub fn notify(&self, state: &str) -> io::Result<()> {
        self.socket.send_to_addr(state.as_bytes(), &self.addr)?;
        Ok(())
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send_logged(&format!("READY=1\nSTATUS={}", one_line(status)));
    }

    /// A `STATUS=` line.
    pub fn status(&self, status: &str) {
        self.send_logged(&format!("STATUS={}", one_line(status)));
    }

    /// `WATCHDOG=1`: the daemon is alive.
    pub fn watchdog(&self) {
        self.send_logged("WATCHDOG=1");
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send_logged(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
    }

    fn send_logged(&self, state: &str) {
        // Failing to notify never stops the daemon: the service manager
        // acts on what it did not hear (start timeout, watchdog), and the
        // log says why.
        if let Err(e) = self.notify(state) {
            tracing::warn!("cannot notify the service manager ({state:?}): {e}");
        }
    }
}

/// `@name` is an abstract address (the leading `@` stands for the NUL
/// byte); anything else is a path.
fn parse_address(address: &str) -> io::Result<SocketAddr> {
    match address.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes()),
        None if address.starts_with('/') => SocketAddr::from_pathname(address),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "expected an absolute path or an @abstract name",
        )),
    }
}

/// A status is one line of the protocol: newlines inside would start a new
/// `KEY=VALUE` assignment.
fn one_line(status: &str) -> String {
    status.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn env(usec: Option<&str>, pid: Option<&str>) -> NotifyEnv {
        NotifyEnv {
            socket: Some("@x".into()),
            watchdog_usec: usec.map(Into::into),
            watchdog_pid: pid.map(Into::into),
        }
    }

    #[test]
    fn watchdog_interval_is_half_of_watchdog_usec() {
        let e = env(Some("4000000"), None);
        assert_eq!(
            e.watchdog_interval(1).unwrap(),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn watchdog_meant_for_another_pid_is_ignored() {
        assert_eq!(
            env(Some("4000000"), Some("77"))
                .watchdog_interval(78)
                .unwrap(),
            None
        );
        assert!(env(Some("4000000"), Some("78"))
            .watchdog_interval(78)
            .unwrap()
            .is_some());
        assert_eq!(env(None, None).watchdog_interval(1).unwrap(), None);
        assert_eq!(env(Some("0"), None).watchdog_interval(1).unwrap(), None);
    }

    #[test]
    fn bad_watchdog_usec_is_an_error_naming_it() {
        let err = env(Some("soon"), None)
            .watchdog_interval(1)
            .unwrap_err()
            .to_string();
        assert!(err.contains("WATCHDOG_USEC"), "{err}");
    }

    #[test]
    fn abstract_and_path_addresses_both_receive() {
        let name = format!("tetherd-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let receiver = UnixDatagram::bind_addr(&addr).unwrap();
        let notifier = Notifier::connect(&format!("@{name}")).unwrap();
        notifier.ready("serving");
        let mut buf = [0u8; 256];
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let receiver = UnixDatagram::bind(&path).unwrap();
        let notifier = Notifier::connect(path.to_str().unwrap()).unwrap();
        notifier.status("two\nlines");
        let n = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STATUS=two lines");
    }

    #[test]
    fn relative_addresses_are_refused() {
        assert!(Notifier::connect("notify.sock").is_err());
    }
}
