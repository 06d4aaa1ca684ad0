//! Starting the worker and reading how it ended.
//!
//! The worker gets the spec's program, arguments, working directory and
//! environment: the spec's variables alone when the spec says they are the
//! whole environment, else added to the shim's own. `PYTHONUNBUFFERED=1`
//! is added unless that environment sets it, so that Python shows output as
//! it happens. Then `TETHER_EXECUTION_ID`, `TETHER_SOCKET`, `TETHER_ATTEMPT`
//! (1, 2, ...), and only when the spec says so `TETHER_RESUMED=1` and
//! `TETHER_LAST_EXIT`; these are set last so that the spec's variables
//! cannot fake them. Its stdin is /dev/null and its stdout and stderr are
//! pipes held by the shim, or one pseudo-terminal ([`super::pty`]). The
//! shim is its parent and reaps it.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;

use tether_protocol::{ExitStatus, ShimSpecFull};
use tokio::process::{Child, ChildStderr, ChildStdout, Command};

use super::{procfs, pty};

/// A running worker and its output pipes.
#[derive(Debug)]
pub struct Worker {
    /// The child process, reaped through tokio.
    pub child: Child,
    /// Its pid.
    pub pid: u32,
    /// Its start time (field 22 of /proc/PID/stat); 0 if procfs could not
    /// tell, which the daemon will not match to any process.
    pub start_ticks: u64,
    /// Where its output is read.
    pub output: Output,
}

/// The shim's ends of a worker's stdout and stderr.
#[derive(Debug)]
pub enum Output {
    /// Two pipes.
    Pipes {
        stdout: ChildStdout,
        stderr: ChildStderr,
    },
    /// One pseudo-terminal for both.
    Pty(pty::Master),
}

/// Starts the worker. The error is the reason reported as `SpawnFailed`.
pub fn spawn(full: &ShimSpecFull) -> Result<Worker, String> {
    let spec = &full.spec;
    let Some((program, args)) = spec.command.split_first() else {
        return Err("the command is empty".into());
    };
    if let Some(cwd) = &spec.cwd {
        // Checked first because a failed chdir in the child is reported as
        // a bare "No such file or directory", as if the program were missing.
        check_dir(Path::new(cwd))?;
    }
    let mut command = Command::new(program);
    if full.whole_env {
        command.env_clear();
    }
    let python_set = spec.env.iter().any(|(k, _)| k == "PYTHONUNBUFFERED")
        || (!full.whole_env && std::env::var_os("PYTHONUNBUFFERED").is_some());
    if !python_set {
        command.env("PYTHONUNBUFFERED", "1");
    }
    let master = if full.pty {
        let (master, terminal) = pty::open().map_err(|e| e.to_string())?;
        let second = terminal
            .try_clone()
            .map_err(|e| format!("cannot share the pseudo-terminal: {e}"))?;
        command.stdout(terminal).stderr(second);
        Some(master)
    } else {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        None
    };
    command
        .args(args)
        .stdin(Stdio::null())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .env("TETHER_EXECUTION_ID", &spec.execution)
        .env("TETHER_SOCKET", &spec.socket)
        .env("TETHER_ATTEMPT", spec.attempt.to_string());
    if spec.resumed {
        command.env("TETHER_RESUMED", "1");
    } else {
        command.env_remove("TETHER_RESUMED");
    }
    match &full.last_exit {
        Some(last) => command.env("TETHER_LAST_EXIT", last),
        None => command.env_remove("TETHER_LAST_EXIT"),
    };
    if let Some(cwd) = &spec.cwd {
        command.current_dir(cwd);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    // The command holds the shim's copies of the terminal end; dropped
    // here, so that the output ends when the worker's copies close.
    drop(command);
    let output = match master {
        Some(master) => Some(Output::Pty(master)),
        None => match (child.stdout.take(), child.stderr.take()) {
            (Some(stdout), Some(stderr)) => Some(Output::Pipes { stdout, stderr }),
            _ => None,
        },
    };
    let (Some(pid), Some(output)) = (child.id(), output) else {
        // Cannot happen for a child spawned with piped output that has
        // not been waited for; reported rather than assumed.
        let _ = child.start_kill();
        return Err(format!("{program:?} started without its pipes or pid"));
    };
    let start_ticks = procfs::start_ticks(pid).unwrap_or(0);
    Ok(Worker {
        child,
        pid,
        start_ticks,
        output,
    })
}

fn check_dir(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(format!(
            "cannot use {} as the working directory: it is not a directory",
            dir.display()
        )),
        Err(e) => Err(format!(
            "cannot use {} as the working directory: {e}",
            dir.display()
        )),
    }
}

/// How a reaped worker ended, in the protocol's terms.
pub fn exit_status(status: std::process::ExitStatus) -> ExitStatus {
    if let Some(code) = status.code() {
        ExitStatus::Code(code)
    } else if let Some(signal) = status.signal() {
        ExitStatus::Signal(signal)
    } else {
        // A reaped child has either exited or been killed; stopped and
        // continued states are never reported by `wait` without WUNTRACED.
        ExitStatus::Code(status.into_raw())
    }
}

/// A short description for the shim's log: `exit code 3`, `signal 9`.
pub fn describe(status: &ExitStatus) -> String {
    match status {
        ExitStatus::Code(code) => format!("exit code {code}"),
        ExitStatus::Signal(signal) => format!("signal {signal}"),
        ExitStatus::SpawnFailed(reason) => format!("spawn failed: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn raw_wait_statuses_map_to_codes_and_signals() {
        // Raw wait(2) statuses: exit code in the second byte, or the
        // killing signal in the low seven bits.
        let exited = std::process::ExitStatus::from_raw(3 << 8);
        assert_eq!(exit_status(exited), ExitStatus::Code(3));
        let killed = std::process::ExitStatus::from_raw(9);
        assert_eq!(exit_status(killed), ExitStatus::Signal(9));
        assert_eq!(describe(&ExitStatus::Signal(9)), "signal 9");
    }

    fn spec(command: &[&str], cwd: Option<&str>) -> ShimSpecFull {
        ShimSpecFull {
            spec: tether_protocol::ShimSpec {
                execution: "e-aaaaaa".into(),
                attempt: 1,
                socket: "/s.sock".into(),
                command: command.iter().map(|s| s.to_string()).collect(),
                cwd: cwd.map(str::to_owned),
                env: vec![],
                resumed: false,
                max_line: 100,
            },
            whole_env: false,
            pty: false,
            last_exit: None,
        }
    }

    #[tokio::test]
    async fn spawn_failures_say_what_was_wrong() {
        let err = spawn(&spec(&[], None)).unwrap_err();
        assert_eq!(err, "the command is empty");
        let err = spawn(&spec(&["/nonexistent/program"], None)).unwrap_err();
        assert!(err.contains("/nonexistent/program"), "{err}");
        assert!(err.contains("No such file"), "{err}");
        let err = spawn(&spec(&["true"], Some("/nonexistent/dir"))).unwrap_err();
        assert!(err.contains("working directory"), "{err}");
    }

    #[tokio::test]
    async fn a_spawned_worker_is_identified_and_reaped() {
        let mut worker = spawn(&spec(&["sh", "-c", "exit 7"], Some("/"))).unwrap();
        assert!(worker.start_ticks > 0);
        let status = worker.child.wait().await.unwrap();
        assert_eq!(exit_status(status), ExitStatus::Code(7));
    }
}
