//! Starting a shim: its own session, its spec on stdin, its log file.
//!
//! The shim runs in a session of its own (`setsid` between fork and exec),
//! so that neither a signal to the daemon's process group nor systemd's
//! `KillMode=process` reaches it: the daemon can restart while the shim and
//! its worker go on. Its stdin is a pipe carrying exactly one codec frame, a
//! [`ShimSpecFull`], and then closed. Its stdout and stderr are appended to
//! `<state_dir>/shims/<execution>.log`, for the shim's own diagnostics; the
//! worker's output never goes there.
//!
//! The daemon opens every descriptor of its own with `O_CLOEXEC` (the Rust
//! standard library, tokio and the pidfd syscall all do) and marks those it
//! inherited so at start ([`crate::inherited`]), so a shim inherits nothing
//! but these three: in particular not the state directory's lock, which
//! would otherwise outlive the daemon.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tether_protocol::ShimSpecFull;
use tokio::io::AsyncWriteExt;

/// How long a new shim has to read its spec.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Variables that describe the daemon's own service and must not leak to
/// workers (a worker must not notify systemd or adopt its sockets as if it
/// were the daemon). `JOURNAL_STREAM` names the daemon's stderr, which a
/// shim's is not; `INVOCATION_ID` names the daemon's own service run.
const SERVICE_VARIABLES: [&str; 8] = [
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "JOURNAL_STREAM",
    "INVOCATION_ID",
];

/// Where and how shims are started.
#[derive(Clone, Debug)]
pub struct Launcher {
    /// The shim program.
    pub program: PathBuf,
    /// The directory of the shims' log files.
    pub log_dir: PathBuf,
}

impl Launcher {
    /// Starts a shim for `spec` and hands it its spec. The child is not
    /// reaped here: the caller watches it and waits for it.
    pub async fn start(&self, spec: &ShimSpecFull) -> io::Result<Child> {
        let frame = tether_protocol::codec::encode_frame(spec)
            .map_err(|e| io::Error::other(format!("cannot encode the shim's spec: {e}")))?;
        let launcher = self.clone();
        let (execution, attempt) = (spec.spec.execution.clone(), spec.spec.attempt);
        // Fork and exec wait for the child's exec to succeed or fail; keep
        // that off the async workers.
        let mut child = tokio::task::spawn_blocking(move || launcher.spawn(&execution, attempt))
            .await
            .map_err(|e| io::Error::other(format!("the shim spawning task failed: {e}")))??;
        if let Err(e) = hand_over(&mut child, &frame).await {
            // A shim that cannot take its spec will never connect; end it
            // now (it is our unreaped child, so its pid is still its own).
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        Ok(child)
    }

    fn spawn(&self, execution: &str, attempt: u32) -> io::Result<Child> {
        let log = self.open_log(execution)?;
        let mut command = Command::new(&self.program);
        command
            .arg(execution)
            .arg(attempt.to_string())
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log);
        for name in SERVICE_VARIABLES {
            command.env_remove(name);
        }
        new_session_on_exec(&mut command);
        command.spawn().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start the shim {}: {e}", self.program.display()),
            )
        })
    }

    fn open_log(&self, execution: &str) -> io::Result<std::fs::File> {
        let context = |what: &str, path: &Path, e: io::Error| {
            io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display()))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.log_dir)
            .map_err(|e| context("create the shim log directory", &self.log_dir, e))?;
        let path = self.log_path(execution);
        let log = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| context("open the shim log", &path, e))?;
        crate::store_io::keep_private(&log, &path)?;
        Ok(log)
    }

    /// The log file of `execution`'s shims.
    pub fn log_path(&self, execution: &str) -> PathBuf {
        self.log_dir.join(format!("{execution}.log"))
    }
}

/// Writes the spec frame to the shim's stdin and closes it, without
/// blocking a thread on a shim that does not read.
async fn hand_over(child: &mut Child, frame: &[u8]) -> io::Result<()> {
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("the shim has no stdin pipe"))?;
    let mut pipe = tokio::net::unix::pipe::Sender::from_owned_fd(stdin.into())?;
    let written = tokio::time::timeout(HANDOVER_TIMEOUT, async {
        pipe.write_all(frame).await?;
        pipe.flush().await
    })
    .await;
    match written {
        Ok(result) => result
            .map_err(|e| io::Error::new(e.kind(), format!("cannot hand the shim its spec: {e}"))),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the shim did not read its spec within {HANDOVER_TIMEOUT:?}"),
        )),
    }
}

#[allow(unsafe_code)]
fn new_session_on_exec(command: &mut Command) {
    // SAFETY: the hook runs in the forked child before exec, where only
    // async-signal-safe calls are allowed. rustix's setsid is the bare
    // setsid(2) system call, which is one, and an `io::Error` made from
    // its errno does not allocate.
    unsafe {
        command.pre_exec(|| {
            rustix::process::setsid()?;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::supervisor::procfs;

    fn spec() -> ShimSpecFull {
        ShimSpecFull {
            spec: tether_protocol::ShimSpec {
                execution: "t-aaaaaa".into(),
                attempt: 1,
                socket: "/nonexistent.sock".into(),
                command: vec!["true".into()],
                cwd: None,
                env: Vec::new(),
                resumed: false,
                max_line: 1024,
            },
            whole_env: false,
            pty: false,
            last_exit: None,
        }
    }

    #[tokio::test]
    async fn shim_gets_its_spec_its_own_session_and_a_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("shim.sh");
        let out = dir.path().join("spec.bin");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho \"args $1 $2\"\ncat > {}\necho done >&2\n",
                out.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let launcher = Launcher {
            program: script,
            log_dir: dir.path().join("shims"),
        };
        let mut child = launcher.start(&spec()).await.unwrap();
        let stat = procfs::stat(child.id()).unwrap();
        assert_eq!(
            stat.session,
            child.id(),
            "the shim leads a session of its own"
        );
        assert!(child.wait().unwrap().success());
        let frame = std::fs::read(&out).unwrap();
        assert_eq!(
            &frame[..],
            &tether_protocol::codec::encode_frame(&spec()).unwrap()[..]
        );
        let log = std::fs::read_to_string(launcher.log_path("t-aaaaaa")).unwrap();
        assert_eq!(log, "args t-aaaaaa 1\ndone\n");
    }

    #[tokio::test]
    async fn a_missing_shim_program_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = Launcher {
            program: dir.path().join("no-such-shim"),
            log_dir: dir.path().join("shims"),
        };
        let e = launcher.start(&spec()).await.unwrap_err();
        assert!(e.to_string().contains("no-such-shim"), "{e}");
    }
}
