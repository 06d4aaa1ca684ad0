//! One test's private world: a temporary directory holding the socket, the
//! state directory and every output file, plus `tether` command lines that
//! point at them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use crate::bins;
use crate::cli::{self, Output};
use crate::daemon::Daemon;
use crate::process::Background;

/// `--connect-timeout` given to every client by default: long enough to
/// ride out a daemon restart on a slow machine.
pub const CONNECT_TIMEOUT: &str = "20s";

/// Deadline for a `tether` command that is expected to finish.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A temporary directory under `/tmp` with a short name, because a unix
/// socket path must fit in 108 bytes.
#[derive(Debug)]
pub struct Sandbox {
    dir: TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    /// Creates the directory (removed again on drop).
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tt")
            .tempdir_in("/tmp")
            .unwrap_or_else(|e| panic!("cannot create a temporary directory in /tmp: {e}"));
        Self { dir }
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon's socket path.
    pub fn socket(&self) -> PathBuf {
        self.path().join("s")
    }

    /// The daemon's state directory.
    pub fn state_dir(&self) -> PathBuf {
        self.path().join("state")
    }

    /// A path for a file of the test's own.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path().join(name)
    }

    /// Starts a daemon on this sandbox's socket and state directory.
    pub fn start_daemon(&self) -> Daemon {
        Daemon::start(&self.socket(), &self.state_dir(), self.path())
    }

    /// A daemon with `env` set for it (and its restarts).
    pub fn start_daemon_with_env(&self, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_with_env(&self.socket(), &self.state_dir(), self.path(), env)
    }

    /// A daemon with `args` added to its command line (and its restarts').
    pub fn start_daemon_with_args(&self, args: &[&str]) -> Daemon {
        Daemon::start_with_args(&self.socket(), &self.state_dir(), self.path(), args)
    }

    /// A daemon started by a shell that runs `prelude` first (see
    /// [`Daemon::start_after_shell`]).
    pub fn start_daemon_after_shell(&self, prelude: &str) -> Daemon {
        Daemon::start_after_shell(&self.socket(), &self.state_dir(), self.path(), prelude)
    }

    /// `tether --socket S --connect-timeout 20s ARGS...`.
    pub fn tether(&self, args: &[&str]) -> Command {
        self.tether_with_timeout(CONNECT_TIMEOUT, args)
    }

    /// `tether --socket S --connect-timeout TIMEOUT ARGS...`.
    pub fn tether_with_timeout(&self, connect_timeout: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(bins::tether());
        cmd.arg("--socket")
            .arg(self.socket())
            .arg("--connect-timeout")
            .arg(connect_timeout)
            .args(args)
            // The sandbox's flags must be the only source of paths.
            .env_remove("TETHER_SOCKET")
            .env_remove("TETHER_HOST")
            .env_remove("TETHER_STATE_DIR");
        cmd
    }

    /// Runs `tether ARGS...` with empty stdin to completion.
    pub fn run(&self, args: &[&str]) -> Output {
        cli::run(self.tether(args), b"", RUN_TIMEOUT)
    }

    /// Runs `tether ARGS...` with `stdin` to completion.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &[u8]) -> Output {
        cli::run(self.tether(args), stdin, RUN_TIMEOUT)
    }

    /// Publishes `input` (one frame per line) to `stream`, asserting that
    /// `tether publish` exits 0 with no output on stdout.
    pub fn publish(&self, stream: &str, input: &str) {
        let out = self.run_with_stdin(&["publish", stream], input.as_bytes());
        out.assert_success();
        assert_eq!(out.stdout, "", "`tether publish` wrote to stdout");
    }

    /// Starts `tether ARGS...` in the background, its output in
    /// `NAME.out`/`NAME.err` in the sandbox.
    pub fn spawn(&self, name: &str, args: &[&str]) -> Background {
        Background::spawn(name, self.tether(args), self.path())
    }
}
