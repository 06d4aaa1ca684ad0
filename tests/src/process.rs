//! Long-lived child processes: output captured in files, stdin fed from a
//! thread, signals, and waits with deadlines.
//!
//! Output goes to files rather than pipes so that a stopped or slow reader
//! of ours can never apply back-pressure to the process under test, and so
//! that the output can be measured (by size) while the process runs.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The signals the tests send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Term,
    Int,
    Kill,
    Stop,
    Cont,
}

impl Signal {
    fn number(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Int => libc::SIGINT,
            Signal::Kill => libc::SIGKILL,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to process `pid`.
///
/// Only call this for a child that has not been reaped yet: until it is
/// waited for, its pid cannot be reused, so the signal reaches the process
/// meant (or a zombie, harmlessly).
#[allow(unsafe_code)]
pub fn send_signal(pid: u32, signal: Signal) {
    let target =
        libc::pid_t::try_from(pid).unwrap_or_else(|_| panic!("pid {pid} does not fit in pid_t"));
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::kill(target, signal.number()) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        panic!("cannot send {signal:?} to pid {pid}: {err}");
    }
}

/// Waits up to `timeout` for `child` to exit.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if start.elapsed() > timeout => return None,
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("cannot wait for pid {}: {e}", child.id()),
        }
    }
}

/// A process running in the background with stdout and stderr in files.
/// Dropping it kills the process if it is still running and, when the test
/// is failing, prints its stderr to help explain why.
#[derive(Debug)]
pub struct Background {
    name: String,
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
    status: Option<ExitStatus>,
}

impl Background {
    /// Spawns `cmd` with stdin piped (see [`Background::take_stdin`]) and
    /// its output in `DIR/NAME.out` and `DIR/NAME.err`.
    pub fn spawn(name: &str, mut cmd: Command, dir: &Path) -> Self {
        let stdout = dir.join(format!("{name}.out"));
        let stderr = dir.join(format!("{name}.err"));
        cmd.stdin(Stdio::piped())
            .stdout(create(&stdout))
            .stderr(create(&stderr));
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot spawn {name} ({cmd:?}): {e}"));
        Self {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
            status: None,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The write end of the process's stdin. Dropping it closes stdin.
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.child
            .stdin
            .take()
            .unwrap_or_else(|| panic!("stdin of {} was already taken", self.name))
    }

    /// Closes the process's stdin (if not taken), so it reads end-of-file.
    pub fn close_stdin(&mut self) {
        self.child.stdin.take();
    }

    /// Sends `signal` to the process, which must not have been reaped.
    pub fn signal(&self, signal: Signal) {
        assert!(
            self.status.is_none(),
            "{} already exited; not sending {signal:?}",
            self.name
        );
        send_signal(self.pid(), signal);
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.poll().is_none()
    }

    /// The exit status, if the process has exited.
    pub fn poll(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self
                .child
                .try_wait()
                .unwrap_or_else(|e| panic!("cannot wait for {}: {e}", self.name));
        }
        self.status
    }

    /// Waits up to `timeout` for the process to exit; panics (with its
    /// stderr) when it does not.
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        match wait_timeout(&mut self.child, timeout) {
            Some(status) => {
                self.status = Some(status);
                status
            }
            None => panic!(
                "{} did not exit within {timeout:?}; stderr:\n{}",
                self.name,
                self.stderr()
            ),
        }
    }

    /// Waits up to `timeout` and asserts the process exited with `code`.
    pub fn assert_exit(&mut self, code: i32, timeout: Duration) {
        let status = self.wait(timeout);
        assert_eq!(
            status.code(),
            Some(code),
            "{} exited with {status}, expected code {code}; stderr:\n{}",
            self.name,
            self.stderr()
        );
    }

    /// Everything the process has written to stdout so far.
    pub fn stdout(&self) -> String {
        read_lossy(&self.stdout)
    }

    /// Everything the process has written to stderr so far.
    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr)
    }

    /// Waits until the process has written at least `len` bytes to stdout;
    /// panics after `timeout` saying how far it got.
    pub fn wait_stdout_len(&mut self, len: u64, timeout: Duration) {
        let start = Instant::now();
        loop {
            let written = self.stdout_len();
            if written >= len {
                return;
            }
            if start.elapsed() > timeout {
                let state = match self.poll() {
                    Some(status) => format!("exited with {status}"),
                    None => "still running".to_owned(),
                };
                panic!(
                    "{} wrote {written} of {len} bytes to stdout within {timeout:?} ({state})",
                    self.name
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many bytes the process has written to stdout so far.
    pub fn stdout_len(&self) -> u64 {
        file_len(&self.stdout)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.poll().is_none() {
            // Reaching here means the test did not finish with this process,
            // so it is failing already; a kill error changes nothing.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- stderr of {} ---\n{}", self.name, self.stderr());
        }
    }
}

/// Writes chunks to a child's stdin from its own thread, so that the test
/// can decide when each chunk goes in without ever blocking on the pipe.
#[derive(Debug)]
pub struct StdinFeeder {
    chunks: Option<mpsc::Sender<Vec<u8>>>,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl StdinFeeder {
    /// Starts feeding `stdin`.
    pub fn new(mut stdin: ChildStdin) -> Self {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let thread = std::thread::spawn(move || {
            for chunk in rx {
                stdin.write_all(&chunk)?;
            }
            // Dropping `stdin` here closes the pipe: end of input.
            Ok(())
        });
        Self {
            chunks: Some(tx),
            thread: Some(thread),
        }
    }

    /// Queues `chunk` to be written after the ones before it.
    pub fn feed(&self, chunk: impl Into<Vec<u8>>) {
        if let Some(tx) = &self.chunks {
            // A send fails only when the writer stopped on a write error,
            // which `finish` reports.
            let _ = tx.send(chunk.into());
        }
    }

    /// Closes stdin after every queued chunk and waits for the writes.
    /// Panics when a write failed (the child closed its stdin early).
    pub fn finish(mut self) {
        self.chunks.take();
        if let Some(thread) = self.thread.take() {
            match thread.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => panic!("writing the child's stdin failed: {e}"),
                Err(_) => panic!("the stdin writer thread panicked"),
            }
        }
    }
}

/// Opens (truncating) an output file for a child.
fn create(path: &Path) -> File {
    File::create(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()))
}

/// The file's contents, with invalid UTF-8 replaced (it shows up in diffs).
pub fn read_lossy(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => panic!("cannot read {}: {e}", path.display()),
    }
}

/// The file's length in bytes; 0 when it does not exist yet.
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}
