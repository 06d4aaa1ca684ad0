//! A `tetherd` process under test: start, wait until it serves, crash it
//! with `kill -9`, restart it on the same state, stop it with SIGTERM.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::mem::{self, Memory};
use crate::process::{read_lossy, send_signal, wait_timeout, Signal};
use crate::{bins, raw};

/// How long a daemon may take from spawn to serving. Generous: debug
/// builds on a loaded two-core machine, plus store recovery after a crash.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The `tetherd` command line for `socket` and `state_dir`.
pub fn command(socket: &Path, state_dir: &Path) -> Command {
    let mut cmd = Command::new(bins::tetherd());
    cmd.arg("--socket")
        .arg(socket)
        .arg("--state-dir")
        .arg(state_dir)
        .stdin(Stdio::null());
    cmd
}

/// A running daemon. Every incarnation (after each restart) logs to its own
/// file; all of them are printed when a test fails. Dropping it kills the
/// process.
#[derive(Debug)]
pub struct Daemon {
    socket: PathBuf,
    state_dir: PathBuf,
    log_dir: PathBuf,
    child: Option<Child>,
    incarnations: u32,
    /// Variables set for every incarnation.
    env: Vec<(String, String)>,
    /// Flags added to every incarnation's command line.
    args: Vec<String>,
    /// Shell commands run before `exec tetherd`, in the shell that becomes
    /// the daemon (see [`Daemon::start_after_shell`]).
    shell_prelude: Option<String>,
}

impl Daemon {
    /// Starts a daemon and waits until it answers a `Status` request.
    pub fn start(socket: &Path, state_dir: &Path, log_dir: &Path) -> Self {
        Self::start_with_env(socket, state_dir, log_dir, &[])
    }

    /// [`Daemon::start`] with `env` set for it and every restart.
    pub fn start_with_env(
        socket: &Path,
        state_dir: &Path,
        log_dir: &Path,
        env: &[(&str, &str)],
    ) -> Self {
        let mut daemon = Self::new(socket, state_dir, log_dir, env);
        daemon.spawn_and_wait();
        daemon
    }

    /// [`Daemon::start`] with `args` added to its command line (and every
    /// restart's).
    pub fn start_with_args(socket: &Path, state_dir: &Path, log_dir: &Path, args: &[&str]) -> Self {
        let mut daemon = Self::new(socket, state_dir, log_dir, &[]);
        daemon.args = args.iter().map(|a| (*a).to_owned()).collect();
        daemon.spawn_and_wait();
        daemon
    }

    /// [`Daemon::start`] by a shell that runs `prelude` and then `exec`s
    /// tetherd (as every restart does): the daemon keeps the shell's pid
    /// and gets what the prelude left it, such as open descriptors
    /// (`exec 10</dev/null`).
    pub fn start_after_shell(
        socket: &Path,
        state_dir: &Path,
        log_dir: &Path,
        prelude: &str,
    ) -> Self {
        let mut daemon = Self::new(socket, state_dir, log_dir, &[]);
        daemon.shell_prelude = Some(prelude.to_owned());
        daemon.spawn_and_wait();
        daemon
    }

    fn new(socket: &Path, state_dir: &Path, log_dir: &Path, env: &[(&str, &str)]) -> Self {
        Self {
            socket: socket.to_owned(),
            state_dir: state_dir.to_owned(),
            log_dir: log_dir.to_owned(),
            child: None,
            incarnations: 0,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            args: Vec::new(),
            shell_prelude: None,
        }
    }

    /// The socket it listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The pid of the current incarnation.
    pub fn pid(&self) -> u32 {
        self.child().id()
    }

    /// Crashes the daemon: SIGKILL, then reaps it.
    pub fn kill9(&mut self) {
        let mut child = self.take_child();
        child
            .kill()
            .unwrap_or_else(|e| panic!("cannot kill -9 tetherd: {e}"));
        let _ = child.wait();
    }

    /// Starts a new incarnation on the same socket and state directory and
    /// waits until it serves.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a daemon that is running");
        self.spawn_and_wait();
    }

    /// Sends SIGTERM and waits (up to 30 s) for the daemon to exit.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.take_child();
        send_signal(child.id(), Signal::Term);
        match wait_timeout(&mut child, Duration::from_secs(30)) {
            Some(status) => status,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("tetherd ignored SIGTERM for 30 s; logs:\n{}", self.logs());
            }
        }
    }

    /// The current incarnation's memory use.
    pub fn memory(&self) -> Memory {
        mem::read(self.pid()).unwrap_or_else(|e| panic!("cannot read tetherd's memory: {e}"))
    }

    /// The logs (stderr) of every incarnation, oldest first.
    pub fn logs(&self) -> String {
        (1..=self.incarnations)
            .map(|n| {
                let path = self.log_path(n);
                format!("--- tetherd #{n} ---\n{}", read_lossy(&path))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log_path(&self, incarnation: u32) -> PathBuf {
        self.log_dir.join(format!("tetherd-{incarnation}.log"))
    }

    fn child(&self) -> &Child {
        self.child
            .as_ref()
            .unwrap_or_else(|| panic!("tetherd is not running"))
    }

    fn take_child(&mut self) -> Child {
        self.child
            .take()
            .unwrap_or_else(|| panic!("tetherd is not running"))
    }

    fn spawn_and_wait(&mut self) {
        self.incarnations += 1;
        let log_path = self.log_path(self.incarnations);
        let log = File::create(&log_path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log_path.display()));
        let mut cmd = command(&self.socket, &self.state_dir);
        cmd.args(&self.args);
        if let Some(prelude) = &self.shell_prelude {
            // `$0` and `$@` are tetherd and its arguments, passed as they
            // are rather than quoted into the script.
            let mut shell = Command::new("bash");
            shell
                .arg("-c")
                .arg(format!("{prelude}\nexec \"$0\" \"$@\""))
                .arg(cmd.get_program())
                .args(cmd.get_args())
                .stdin(Stdio::null());
            cmd = shell;
        }
        cmd.stdout(Stdio::null())
            .stderr(log)
            .envs(self.env.iter().cloned());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn tetherd: {e}"));
        self.child = Some(child);
        self.wait_ready();
    }

    /// Polls with `Hello` + `Status` until this incarnation answers. The pid
    /// check makes sure the answer does not come from some other daemon.
    fn wait_ready(&mut self) {
        let start = Instant::now();
        let pid = self.pid();
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    panic!(
                        "tetherd exited with {status} before serving; logs:\n{}",
                        self.logs()
                    );
                }
            }
            match raw::status(&self.socket) {
                Ok(info) if info.pid == pid => return,
                Ok(info) => panic!(
                    "a daemon with pid {} answered on {}, expected pid {pid}",
                    info.pid,
                    self.socket.display()
                ),
                Err(_) if start.elapsed() > READY_TIMEOUT => panic!(
                    "tetherd did not serve within {READY_TIMEOUT:?}; logs:\n{}",
                    self.logs()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
    }
}
