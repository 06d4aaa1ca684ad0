//! Reaching a daemon on another machine through the system `ssh`.
//!
//! An [`SshTarget`] is parsed from `ssh://[user@]host[:port][/socket/path]`.
//! Opening it runs
//!
//! ```text
//! ssh -o BatchMode=yes [-p PORT] -- [user@]host \
//!     tether [--socket PATH] --connect-timeout DUR dial-stdio
//! ```
//!
//! and the protocol is spoken over the child's stdin and stdout; on the
//! remote side `tether dial-stdio` copies them to and from the daemon's
//! socket. `DUR` is shorter than the local handshake's time limit, so a
//! remote daemon that cannot be reached is reported by the remote side in
//! its own words rather than as a local timeout. Authentication, host keys and encryption are ssh's business: no
//! password prompt is possible (`BatchMode`), so keys or an agent are
//! needed. The program and its leading arguments can be replaced through
//! [`SSH_COMMAND_ENV`] (`TETHER_SSH`), split on whitespace, e.g.
//! `TETHER_SSH="ssh -i ~/.ssh/deploy -o UserKnownHostsFile=/etc/known"`.
//!
//! ssh's stderr is captured rather than shown: when the session ends before
//! the daemon has answered `Hello`, its text (a refused key, a changed host
//! key, a remote `tether` that is missing) is what the user is told,
//! verbatim. Failures that retrying cannot cure end the attempt at once as
//! [`Error::Unreachable`]; the rest (a refused TCP connection, a remote
//! daemon that is restarting) are transient, so a [`crate::Link`] retries
//! them within its window like any lost socket.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;

use crate::error::Error;

/// The environment variable that replaces the `ssh` program (and may add
/// leading arguments to it), split on whitespace.
pub const SSH_COMMAND_ENV: &str = "TETHER_SSH";

/// The program run on the remote side.
const REMOTE_PROGRAM: &str = "tether";

/// How much of ssh's stderr is kept; the rest is read and dropped so that
/// ssh never blocks on a full pipe.
const STDERR_LIMIT: usize = 16 * 1024;

/// How long a session that failed before `HelloOk` is given to exit on its
/// own, so that its stderr is complete, before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Remote exit codes that retrying will not change: `tether` refused the
/// command line (too old to know `dial-stdio`), or the shell could not
/// find or run it.
const PERMANENT_REMOTE_EXITS: [i32; 3] = [2, 126, 127];

/// What the remote `tether dial-stdio` says (exiting 1) when it refuses
/// the remote daemon or its socket: the remote host must change first.
const PERMANENT_REMOTE_MESSAGES: [&str; 3] = [
    "refusing socket directory",
    "refusing the daemon at",
    "permission denied",
];

/// ssh's own messages (it exits 255) for failures that retrying will not
/// cure: the user or the host configuration must change first.
const PERMANENT_SSH_MESSAGES: [&str; 7] = [
    "Permission denied",
    "Host key verification failed",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "Could not resolve hostname",
    "Too many authentication failures",
    "Bad configuration option",
    "Bad port",
];

/// Where to reach a daemon over ssh: `ssh://[user@]host[:port][/socket]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshTarget {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    socket: Option<PathBuf>,
    program: Vec<String>,
}

impl SshTarget {
    /// Parses `ssh://[user@]host[:port][/socket/path]`. An IPv6 address is
    /// written in brackets (`ssh://[::1]:2222`). Without a path the remote
    /// `tether` finds the socket the usual way. The ssh program is the
    /// default (`ssh`) until [`SshTarget::with_ssh_command`].
    pub fn parse(url: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Usage(format!("invalid --host {url:?}: {why}"));
        let rest = url
            .strip_prefix("ssh://")
            .ok_or_else(|| bad("only ssh://[user@]host[:port][/socket/path] is supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(slash) => rest.split_at(slash),
            None => (rest, ""),
        };
        let (user, hostport) = match authority.rsplit_once('@') {
            Some((user, hostport)) => (Some(user), hostport),
            None => (None, authority),
        };
        if let Some(user) = user {
            if user.is_empty() {
                return Err(bad("the user name before '@' is empty"));
            }
            if user.contains(':') {
                return Err(bad(
                    "passwords are not accepted in the URL; use ssh keys or an agent",
                ));
            }
        }
        let (host, port) = split_host_port(hostport).map_err(|why| bad(&why))?;
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        // A host that starts with '-' would be taken for an ssh option.
        if host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("the host name is not valid"));
        }
        if path.contains(['?', '#']) {
            return Err(bad("queries and fragments are not supported"));
        }
        let socket = (path.len() > 1).then(|| PathBuf::from(path));
        Ok(Self {
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port,
            socket,
            program: vec!["ssh".to_owned()],
        })
    }

    /// Replaces the ssh program and its leading arguments. An empty list
    /// keeps the default.
    pub fn with_ssh_command(mut self, program: Vec<String>) -> Self {
        if !program.is_empty() {
            self.program = program;
        }
        self
    }

    /// The ssh command from [`SSH_COMMAND_ENV`], split on whitespace; empty
    /// when it is unset or blank.
    pub fn ssh_command_from_env() -> Vec<String> {
        std::env::var(SSH_COMMAND_ENV)
            .map(|value| value.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The user to log in as, if given.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The host name or address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The ssh port, if given.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The daemon's socket on the remote machine, if given.
    pub fn socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// The full command line: the ssh program and its arguments. The
    /// remote bridge tries to reach its daemon for `connect_timeout`.
    pub fn command_line(&self, connect_timeout: Duration) -> Vec<String> {
        let mut args = self.program.clone();
        args.extend(["-o".to_owned(), "BatchMode=yes".to_owned()]);
        if let Some(port) = self.port {
            args.extend(["-p".to_owned(), port.to_string()]);
        }
        // `--` ends ssh's options, so nothing after it is read as one.
        args.push("--".to_owned());
        args.push(match &self.user {
            Some(user) => format!("{user}@{}", self.host),
            None => self.host.clone(),
        });
        args.push(REMOTE_PROGRAM.to_owned());
        if let Some(socket) = &self.socket {
            // ssh hands the remote command to the login shell as one string,
            // so the path is quoted for that shell.
            args.push("--socket".to_owned());
            args.push(shell_quote(&socket.to_string_lossy()));
        }
        args.push("--connect-timeout".to_owned());
        args.push(format!("{}ms", connect_timeout.as_millis().max(1)));
        args.push("dial-stdio".to_owned());
        args
    }

    /// Starts ssh and returns its stdout (which owns the process: dropping
    /// it kills ssh), its stdin, and a handle to learn how it ended.
    pub(crate) fn open(
        &self,
        connect_timeout: Duration,
    ) -> io::Result<(SshReader, ChildStdin, SshExit)> {
        let line = self.command_line(connect_timeout);
        let (program, args) = line
            .split_first()
            .ok_or_else(|| io::Error::other("the ssh command is empty"))?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // A terminal's Ctrl-C is for tether, which then ends the session
            // in order; ssh must not die of it first and look like a lost
            // connection.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot run `{program}`: {e}")))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(io::Error::other("ssh was started without its pipes"));
        };
        let (stop_tx, stop_rx) = oneshot::channel();
        let (exit_tx, exit_rx) = oneshot::channel();
        let stderr_text = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(watch(
            child,
            stderr,
            Arc::clone(&stderr_text),
            stop_rx,
            exit_tx,
        ));
        let reader = SshReader {
            stdout,
            _stop: stop_tx,
        };
        let exit = SshExit {
            started: Instant::now(),
            report: exit_rx,
            stderr: stderr_text,
        };
        Ok((reader, stdin, exit))
    }
}

impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ssh://")?;
        if let Some(user) = &self.user {
            write!(f, "{user}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        if let Some(socket) = &self.socket {
            write!(f, "{}", socket.display())?;
        }
        Ok(())
    }
}

/// Splits `host[:port]` or `[v6]:port`.
fn split_host_port(hostport: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if let Some(bracketed) = hostport.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or("an IPv6 address lacks its closing ']'")?;
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err("unexpected text after ']'".into()),
            },
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (hostport, None),
        }
    };
    let port = match port {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => return Err(format!("the port {text:?} is not a number from 1 to 65535")),
        },
    };
    Ok((host, port))
}

/// Quotes `text` for a POSIX shell, leaving plain words and paths as they
/// are: fit to paste into a command line.
pub fn shell_quote(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:=@%".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// ssh's stdout, owning the ssh process: dropping it kills ssh (the
/// session is over) and reaps it.
pub(crate) struct SshReader {
    stdout: ChildStdout,
    /// Dropped with the reader; the watcher then kills ssh.
    _stop: oneshot::Sender<()>,
}

impl AsyncRead for SshReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stdout).poll_read(cx, buf)
    }
}

/// How one ssh process ended, learned after the fact.
pub(crate) struct SshExit {
    started: Instant,
    report: oneshot::Receiver<ExitStatus>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl fmt::Debug for SshExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SshExit")
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}

impl SshExit {
    /// Turns `cause`, a session that failed before `HelloOk`, into the
    /// error the user should see: ssh's own words. `session` (the reader
    /// and writer) is dropped, which kills ssh, only after a grace period
    /// in which ssh usually exits by itself, so its stderr is complete.
    pub(crate) async fn explain<S>(self, session: S, cause: Error, endpoint: &str) -> Error {
        let SshExit {
            started,
            mut report,
            stderr,
        } = self;
        let status = match tokio::time::timeout(EXIT_GRACE, &mut report).await {
            Ok(status) => status.ok(),
            Err(_) => {
                drop(session);
                report.await.ok()
            }
        };
        let text = stderr
            .lock()
            .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
            .unwrap_or_default();
        let code = status.and_then(|status| status.code());
        let text = match (text.is_empty(), status) {
            (false, _) => text,
            (true, Some(status)) => format!("ssh ended ({status}) before the daemon answered"),
            (true, None) => return cause,
        };
        if is_permanent(code, &text) {
            Error::Unreachable {
                endpoint: endpoint.to_owned(),
                waited: started.elapsed(),
                last_error: text,
                source: None,
            }
        } else {
            Error::Io {
                endpoint: endpoint.to_owned(),
                source: io::Error::other(text).into(),
            }
        }
    }
}

/// True when an ssh session that ended with `code` and printed `stderr`
/// failed for a reason that retrying will not cure.
fn is_permanent(code: Option<i32>, stderr: &str) -> bool {
    match code {
        Some(255) => PERMANENT_SSH_MESSAGES.iter().any(|m| stderr.contains(m)),
        Some(1) => PERMANENT_REMOTE_MESSAGES.iter().any(|m| stderr.contains(m)),
        Some(code) => PERMANENT_REMOTE_EXITS.contains(&code),
        None => false,
    }
}

/// Owns the ssh process for its whole life: collects its stderr, kills it
/// when the session is dropped, reaps it and reports how it ended.
async fn watch(
    mut child: Child,
    stderr: ChildStderr,
    text: Arc<Mutex<Vec<u8>>>,
    stop: oneshot::Receiver<()>,
    report: oneshot::Sender<ExitStatus>,
) {
    let collect = collect_stderr(stderr, &text);
    let wait = async {
        tokio::select! {
            status = child.wait() => status,
            // The sender lives in the session's reader: the session is over.
            _ = stop => {
                // An already exited ssh makes the kill fail; wait() says how.
                let _ = child.start_kill();
                child.wait().await
            }
        }
    };
    let ((), status) = tokio::join!(collect, wait);
    match status {
        Ok(status) => {
            let stderr = text
                .lock()
                .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
                .unwrap_or_default();
            tracing::debug!(%status, stderr, "ssh ended");
            // Nobody may be listening any more; that is fine.
            let _ = report.send(status);
        }
        Err(e) => tracing::warn!("cannot reap ssh: {e}"),
    }
}

/// Reads ssh's stderr to its end, keeping the first [`STDERR_LIMIT`] bytes.
async fn collect_stderr(mut stderr: ChildStderr, into: &Mutex<Vec<u8>>) {
    let mut chunk = [0u8; 4096];
    loop {
        match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Ok(mut kept) = into.lock() {
                    let room = STDERR_LIMIT.saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_full_url_is_parsed_into_its_parts() {
        let t = SshTarget::parse("ssh://ops@db1.example:2222/run/tether/tether.sock").unwrap();
        assert_eq!(t.user(), Some("ops"));
        assert_eq!(t.host(), "db1.example");
        assert_eq!(t.port(), Some(2222));
        assert_eq!(t.socket(), Some(Path::new("/run/tether/tether.sock")));
        assert_eq!(
            t.to_string(),
            "ssh://ops@db1.example:2222/run/tether/tether.sock"
        );
    }

    #[test]
    fn a_bare_host_uses_the_remote_defaults() {
        let t = SshTarget::parse("ssh://box").unwrap();
        assert_eq!((t.user(), t.port(), t.socket()), (None, None, None));
        assert_eq!(
            t.command_line(Duration::from_millis(1500)),
            [
                "ssh",
                "-o",
                "BatchMode=yes",
                "--",
                "box",
                "tether",
                "--connect-timeout",
                "1500ms",
                "dial-stdio"
            ]
        );
        assert_eq!(SshTarget::parse("ssh://box/").unwrap().socket(), None);
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let t = SshTarget::parse("ssh://root@[::1]:22/s.sock").unwrap();
        assert_eq!(t.host(), "::1");
        assert_eq!(t.port(), Some(22));
        assert_eq!(t.to_string(), "ssh://root@[::1]:22/s.sock");
    }

    #[test]
    fn the_command_line_passes_port_user_and_quoted_socket() {
        let t = SshTarget::parse("ssh://u@h:7/tmp/my dir/t.sock")
            .unwrap()
            .with_ssh_command(vec!["ssh".into(), "-i".into(), "key".into()]);
        assert_eq!(
            t.command_line(Duration::from_secs(5)),
            [
                "ssh",
                "-i",
                "key",
                "-o",
                "BatchMode=yes",
                "-p",
                "7",
                "--",
                "u@h",
                "tether",
                "--socket",
                "'/tmp/my dir/t.sock'",
                "--connect-timeout",
                "5000ms",
                "dial-stdio"
            ]
        );
    }

    #[test]
    fn bad_urls_are_usage_errors_saying_why() {
        for (url, why) in [
            ("tcp://h:1", "only ssh://"),
            ("ssh://", "host is empty"),
            ("ssh://u:pw@h", "passwords"),
            ("ssh://h:0", "1 to 65535"),
            ("ssh://h:x", "1 to 65535"),
            ("ssh://-oProxyCommand=x", "not valid"),
            ("ssh://@h", "user name"),
            ("ssh://[::1", "closing"),
            ("ssh://h/s?x=1", "queries"),
        ] {
            let err = SshTarget::parse(url).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{url}");
            assert!(err.to_string().contains(why), "{url}: {err}");
        }
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("/run/t.sock"), "/run/t.sock");
        assert_eq!(shell_quote("/a b"), "'/a b'");
        assert_eq!(shell_quote("/it's"), r"'/it'\''s'");
    }

    #[test]
    fn auth_and_host_key_failures_are_permanent_network_ones_are_not() {
        assert!(is_permanent(
            Some(255),
            "root@h: Permission denied (publickey)."
        ));
        assert!(is_permanent(Some(255), "Host key verification failed."));
        assert!(is_permanent(Some(127), "bash: tether: command not found"));
        assert!(!is_permanent(
            Some(255),
            "ssh: connect to host h port 22: Connection refused"
        ));
        assert!(!is_permanent(Some(4), "cannot reach tetherd"));
        assert!(is_permanent(
            Some(1),
            "tether: refusing socket directory /tmp/tether-7: it is owned by uid 8, not by uid 7"
        ));
        assert!(!is_permanent(
            Some(1),
            "tether: lost the connection to the daemon"
        ));
        assert!(!is_permanent(None, ""));
    }

    #[tokio::test]
    async fn a_session_that_dies_early_reports_its_stderr() {
        let t = SshTarget::parse("ssh://h").unwrap().with_ssh_command(vec![
            "sh".into(),
            "-c".into(),
            "echo 'h: Permission denied (publickey).' >&2; exit 255".into(),
        ]);
        let (reader, writer, exit) = t.open(Duration::from_secs(1)).unwrap();
        let cause = Error::Closed {
            endpoint: t.to_string(),
        };
        let err = exit.explain((reader, writer), cause, "ssh://h").await;
        assert_eq!(err.exit_code(), 4);
        assert!(!err.is_transient());
        assert!(
            err.to_string()
                .ends_with("h: Permission denied (publickey)."),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_transient_and_keeps_the_text() {
        let t = SshTarget::parse("ssh://h").unwrap().with_ssh_command(vec![
            "sh".into(),
            "-c".into(),
            "echo 'ssh: connect to host h port 22: Connection refused' >&2; exit 255".into(),
        ]);
        let (reader, writer, exit) = t.open(Duration::from_secs(1)).unwrap();
        let cause = Error::Closed {
            endpoint: t.to_string(),
        };
        let err = exit.explain((reader, writer), cause, "ssh://h").await;
        assert!(err.is_transient() && err.is_connection_failure());
        assert!(err.to_string().contains("Connection refused"), "{err}");
    }

    #[tokio::test]
    async fn a_missing_ssh_program_is_named() {
        let t = SshTarget::parse("ssh://h")
            .unwrap()
            .with_ssh_command(vec!["/nonexistent/ssh".into()]);
        let err = t.open(Duration::from_secs(1)).err().unwrap();
        assert!(err.to_string().contains("/nonexistent/ssh"), "{err}");
    }
}
