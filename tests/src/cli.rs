//! Running a command to completion, with stdin, captured output and a
//! deadline.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::process::wait_timeout;

/// What a finished command did.
#[derive(Debug)]
pub struct Output {
    /// Exit code; `None` when a signal ended the process.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Time from spawn to exit.
    pub elapsed: Duration,
    /// The command line, for failure messages.
    pub command: String,
}

impl Output {
    /// Asserts the exit code, showing the command and its stderr otherwise.
    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(
            self.code,
            Some(code),
            "`{}` exited with {:?}, expected {code}\nstdout:\n{}\nstderr:\n{}",
            self.command,
            self.code,
            self.stdout,
            self.stderr
        );
        self
    }

    /// Asserts exit code 0.
    pub fn assert_success(&self) -> &Self {
        self.assert_code(0)
    }
}

/// Runs `cmd` with `stdin` as its input; panics when it has not exited
/// after `timeout` (killing it first).
pub fn run(mut cmd: Command, stdin: &[u8], timeout: Duration) -> Output {
    let command = format!("{cmd:?}");
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot spawn `{command}`: {e}"));

    let input = stdin.to_vec();
    let mut child_stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let Some(pipe) = child_stdin.as_mut() {
            // A child that exits without reading all its input is allowed;
            // its exit code says whether that was right.
            let _ = pipe.write_all(&input);
        }
    });
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());

    let Some(status) = wait_timeout(&mut child, timeout) else {
        let _ = child.kill();
        let _ = child.wait();
        let err = join(stderr);
        panic!("`{command}` did not exit within {timeout:?}; stderr so far:\n{err}");
    };
    let elapsed = start.elapsed();
    let _ = writer.join();
    Output {
        code: status.code(),
        stdout: join(stdout),
        stderr: join(stderr),
        elapsed,
        command,
    }
}

/// Reads a pipe to its end on its own thread, so that neither pipe can fill
/// up and stall the child while the other is being read.
fn drain(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut buf);
        }
        buf
    })
}

fn join(handle: JoinHandle<Vec<u8>>) -> String {
    let bytes = handle.join().unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}
