//! The reconnect state machine ([`Link`], [`LinkState`]): a session opened
//! on demand, opened again after a failure with capped exponential backoff,
//! and given up on once an outage outlasts the retry window.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use tether_protocol::ErrorCode;

use super::{Connection, Connector, Endpoint};
use crate::backoff::Backoff;
use crate::error::{humanize, Error, Result};

/// True for a daemon that is up but cannot store (disk full, store error):
/// worth telling the user, unlike a daemon restarting.
fn is_storage_fault(cause: &Error) -> bool {
    matches!(
        cause,
        Error::Daemon { code, .. }
            if *code == ErrorCode::STORAGE_FULL
                || *code == ErrorCode::STORAGE
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
    /// A session was open at some point, or the owner was told that no
    /// daemon answered: either way the "no daemon" notice is not due.
    no_daemon_told: bool,
    /// A session was open at some point. Until then, a daemon refusing at
    /// its connection limit is an answer to give the user at once; after,
    /// it is an outage to ride out like any other.
    was_up: bool,
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
            no_daemon_told: false,
            was_up: false,
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
                    self.no_daemon_told = true;
                    self.was_up = true;
                    return Ok(true);
                }
                Err(e)
                    if !self.was_up && e.daemon_code() == Some(ErrorCode::TOO_MANY_CONNECTIONS) =>
                {
                    self.state = LinkState::Idle;
                    self.outage_since = None;
                    return Err(e);
                }
                Err(e) if e.is_transient() => {
                    tracing::debug!(endpoint = %self.connector.endpoint, "connect failed: {e}");
                    if !self.no_daemon_told && e.is_no_daemon() {
                        // Said once, at the first attempt: whoever runs a
                        // command with no daemon learns why it waits.
                        self.no_daemon_told = true;
                        let options = &self.connector.options;
                        options
                            .on_no_daemon
                            .tell(&self.connector.endpoint, options.retry_window);
                    }
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
                source: Some(Box::new(cause)),
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

    use std::time::Duration;

    use futures_util::{SinkExt, StreamExt};
    use tether_protocol::ErrorCode;

    use super::*;
    use crate::conn::fake_daemon::{accept_session, connector, disk_full, hello_ok, listening};
    use crate::conn::{ConnectOptions, RETRY_FOREVER};

    #[test]
    fn over_ssh_a_late_timeout_does_not_hide_the_cause_the_remote_gave() {
        let explained = || Error::Io {
            endpoint: "ssh://h/x.sock".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "x.sock: No such file")
                .into(),
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
}
