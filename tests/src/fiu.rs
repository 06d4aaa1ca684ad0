//! Failing system calls on demand with libfiu (Debian's `fiu-utils`):
//! `fiu-run -x` starts a program with libfiu's POSIX wrappers preloaded and
//! a control pipe, and `fiu-ctrl` then makes a wrapped call fail, or work
//! again, in that running process.
//!
//! A [`Fiu`] gives the environment `fiu-run` gives a program, asked of
//! `fiu-run` itself, so that a daemon started with it (see
//! `Sandbox::start_daemon_with_env`) runs exactly as under `fiu-run`; its
//! control pipes are in the test's own directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli;

/// How long a `fiu-ctrl` command may take: it waits for the process's
/// answer on the control pipe.
const CTRL_TIMEOUT: Duration = Duration::from_secs(30);

/// libfiu's failure point of `fdatasync(2)`.
pub const FDATASYNC: &str = "posix/io/sync/fdatasync";

/// libfiu, ready to start programs under it and to steer them.
#[derive(Debug)]
pub struct Fiu {
    fifo_prefix: PathBuf,
}

impl Fiu {
    /// `None` when `fiu-run` or `fiu-ctrl` is not installed. The control
    /// pipes of programs started with [`Fiu::env`] are `DIR/fiu-PID.in`
    /// and `DIR/fiu-PID.out`.
    pub fn new(dir: &Path) -> Option<Self> {
        if !(on_path("fiu-run") && on_path("fiu-ctrl")) {
            return None;
        }
        Some(Self {
            fifo_prefix: dir.join("fiu"),
        })
    }

    /// The variables `fiu-run -x` sets for the program it starts
    /// (`LD_PRELOAD`, `FIU_CTRL_FIFO`, `FIU_ENABLE`), with no failure point
    /// enabled yet.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut cmd = Command::new("fiu-run");
        cmd.arg("-x")
            .arg("-f")
            .arg(&self.fifo_prefix)
            .arg("env")
            .arg("-0");
        let out = cli::run(cmd, b"", CTRL_TIMEOUT);
        out.assert_success();
        let env: Vec<(String, String)> = out
            .stdout
            .split('\0')
            .filter_map(|entry| entry.split_once('='))
            .filter(|(name, _)| *name == "LD_PRELOAD" || name.starts_with("FIU_"))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect();
        assert!(
            env.iter().any(|(name, _)| name == "LD_PRELOAD"),
            "`fiu-run -x env` set no LD_PRELOAD:\n{}",
            out.stdout.replace('\0', "\n")
        );
        env
    }

    /// Makes every call behind failure point `name` in process `pid` fail
    /// with `errno`.
    pub fn enable(&self, pid: u32, name: &str, errno: i32) {
        self.ctrl(pid, &format!("enable name={name},failinfo={errno}"));
    }

    /// Lets the calls behind failure point `name` in process `pid` through
    /// again.
    pub fn disable(&self, pid: u32, name: &str) {
        self.ctrl(pid, &format!("disable name={name}"));
    }

    /// Sends `command` to process `pid` over its control pipe and waits
    /// for its answer.
    fn ctrl(&self, pid: u32, command: &str) {
        let mut cmd = Command::new("fiu-ctrl");
        cmd.arg("-f")
            .arg(&self.fifo_prefix)
            .arg("-c")
            .arg(command)
            .arg(pid.to_string());
        let out = cli::run(cmd, b"", CTRL_TIMEOUT);
        assert_eq!(
            out.code,
            Some(0),
            "`fiu-ctrl -c '{command}' {pid}` failed ({:?}):\n{}{}",
            out.code,
            out.stdout,
            out.stderr
        );
    }
}

/// True when `program` is an executable file in a directory on `PATH`.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program)).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
    })
}
