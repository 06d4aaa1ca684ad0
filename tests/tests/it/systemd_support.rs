//! Playing the service manager for the `systemd_*` tests: starting
//! `tetherd` with extra flags and environment, with an inherited listening
//! socket (socket activation), and waiting until it serves.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tether_tests::process::{read_lossy, send_signal, wait_timeout};
use tether_tests::{bins, raw, Sandbox, Signal};

/// How long a daemon may take from spawn to serving.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// `tetherd --socket S --state-dir D ARGS...` for the sandbox, with no
/// inherited service-manager variables and its stderr in `LOG`.
pub fn tetherd(sb: &Sandbox, log: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bins::tetherd());
    cmd.arg("--socket")
        .arg(sb.socket())
        .arg("--state-dir")
        .arg(sb.state_dir())
        .args(args);
    for var in [
        "NOTIFY_SOCKET",
        "WATCHDOG_USEC",
        "WATCHDOG_PID",
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "TETHER_CONFIG",
        "TETHER_LOG",
    ] {
        cmd.env_remove(var);
    }
    // A config file of the machine running the tests must not leak in
    // (root reads /etc/tether unless the service manager names a directory).
    cmd.env("CONFIGURATION_DIRECTORY", sb.path().join("no-config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(&sb.file(log)));
    cmd
}

/// `tetherd` started the way systemd starts a socket-activated service:
/// `listener` becomes descriptor 3, `LISTEN_PID` is the daemon's own pid,
/// `LISTEN_FDS=1` and `LISTEN_FDNAMES=tether`. The shell hands the socket
/// over (stdin, then 3) and execs the daemon, so its pid is the daemon's.
pub fn activated(sb: &Sandbox, log: &str, listener: &UnixListener) -> Command {
    let inner = tetherd(sb, log, &[]);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(
            "exec 3<&0 0</dev/null; LISTEN_PID=$$; LISTEN_FDS=1; LISTEN_FDNAMES=tether; \
             export LISTEN_PID LISTEN_FDS LISTEN_FDNAMES; exec \"$0\" \"$@\"",
        )
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => cmd.env(key, value),
            None => cmd.env_remove(key),
        };
    }
    let fd: OwnedFd = listener
        .try_clone()
        .expect("cannot duplicate the listening socket")
        .into();
    cmd.stdin(Stdio::from(fd))
        .stdout(Stdio::null())
        .stderr(log_file(&sb.file(log)));
    cmd
}

/// One running `tetherd`; killed when dropped, its log printed if the
/// test is failing.
#[derive(Debug)]
pub struct Tetherd {
    child: Option<Child>,
    log: PathBuf,
}

impl Tetherd {
    /// Spawns `cmd` (from [`tetherd`] or [`activated`], logging to `log`).
    pub fn spawn(mut cmd: Command, sb: &Sandbox, log: &str) -> Self {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn tetherd ({cmd:?}): {e}"));
        Self {
            child: Some(child),
            log: sb.file(log),
        }
    }

    /// Spawns `cmd` and waits until this very process answers on `socket`.
    pub fn start(cmd: Command, sb: &Sandbox, log: &str) -> Self {
        let mut daemon = Self::spawn(cmd, sb, log);
        daemon.wait_ready(&sb.socket());
        daemon
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        read_lossy(&self.log)
    }

    /// Polls with `Hello` + `Status` until this process answers.
    pub fn wait_ready(&mut self, socket: &Path) {
        let start = Instant::now();
        let pid = self.pid();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "tetherd exited with {status} before serving:\n{}",
                    self.log()
                );
            }
            match raw::status(socket) {
                Ok(info) if info.pid == pid => return,
                Ok(info) => panic!("pid {} answered, expected {pid}", info.pid),
                Err(_) if start.elapsed() > READY_TIMEOUT => {
                    panic!("tetherd did not serve in time:\n{}", self.log())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: Signal) {
        send_signal(self.pid(), signal);
    }

    /// Sends SIGHUP (through kill(1): the support library's signals do
    /// not include it).
    pub fn hup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.pid().to_string()])
            .status()
            .expect("cannot run kill");
        assert!(status.success(), "kill -HUP {} failed", self.pid());
    }

    /// `kill -9`, then reaps it.
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("tetherd is not running");
        child.kill().expect("cannot kill tetherd");
        let _ = child.wait();
    }

    /// Waits (bounded) for the daemon to exit.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("tetherd is not running");
        match wait_timeout(&mut child, timeout) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tetherd did not exit within {timeout:?}:\n{}", self.log());
            }
        }
    }

    fn child(&self) -> &Child {
        self.child.as_ref().expect("tetherd is not running")
    }
}

impl Drop for Tetherd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), read_lossy(&self.log));
        }
    }
}

fn log_file(path: &Path) -> File {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()))
}
