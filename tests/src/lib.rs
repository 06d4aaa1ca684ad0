//! Support for tether's black-box integration tests: everything here drives
//! real `tetherd` and `tether` processes over real unix sockets and real redb
//! files, and never links the daemon or the client library.
//!
//! * [`bins`] finds the executables cargo built next to the test binary.
//! * [`sandbox`] is one test's private directory: socket path, state
//!   directory, output files, and the `tether` command line pointed at them.
//! * [`daemon`] starts a daemon, waits until it serves, `kill -9`s it,
//!   restarts it on the same state, or stops it with SIGTERM.
//! * [`cli`] runs a `tether` command to completion with a deadline.
//! * [`process`] runs long-lived processes with their output in files,
//!   feeds their stdin from a thread, and sends them signals.
//! * [`remote`] starts a throwaway `sshd` for `--host ssh://` tests and
//!   creates the extra local users of the access tests.
//! * [`raw`] is a minimal protocol client over a blocking `UnixStream`, for
//!   sending bad input and for peeking at stream state.
//! * [`damage`] parses the write-ahead log, damages store files on purpose
//!   and proves afterwards that nothing changed a byte of them.
//! * [`fault`] mounts a small tmpfs to fill up, for the disk-full tests.
//! * [`fiu`] makes system calls of a running daemon fail on demand
//!   (libfiu), for the failing-device tests.
//! * [`soak`] is the crash-loop soak shared by the CI test and
//!   `scripts/soak.sh`.
//! * [`mem`] reads a process's resident memory from `/proc/PID/status`.
//! * [`procs`] looks at processes the tests did not spawn (shims, workers)
//!   through `/proc`, and reaps orphans.
//! * [`supervise`] runs supervised workers and reads their executions and
//!   streams; it kills leftover shims and workers when a test ends.
//! * [`text`] builds numbered input lines and compares large outputs.
//! * [`wait`] polls a condition with a deadline.
//!
//! Support code panics on failure: a setup step that fails is a failed test,
//! and the panic message says which step and why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod bins;
pub mod cli;
pub mod daemon;
pub mod damage;
pub mod fault;
pub mod fiu;
pub mod mem;
pub mod process;
pub mod procs;
pub mod raw;
pub mod remote;
pub mod sandbox;
pub mod soak;
pub mod supervise;
pub mod text;
pub mod wait;

pub use cli::Output;
pub use daemon::Daemon;
pub use process::{Background, Signal, StdinFeeder};
pub use raw::RawConn;
pub use sandbox::Sandbox;
