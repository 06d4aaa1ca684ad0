//! A pseudo-terminal for a worker's stdout and stderr (`tether run --pty`).
//!
//! C stdio buffers a whole block when stdout is a pipe and flushes each
//! line when it is a terminal, so a worker on a terminal shows its output
//! as it happens. The shim opens a pseudo-terminal, gives its terminal end
//! to the worker as both stdout and stderr, keeps the other end (the
//! *master*) and reads it like a pipe. The terminal is raw: output is not
//! rewritten (no `\r` before each `\n`).
//!
//! Once the worker and everything it started have closed the terminal end,
//! reading the master fails with EIO rather than returning end of file:
//! that is the normal end of the output, and [`Master`] reports it as end
//! of file. The master is opened close-on-exec and the terminal end is
//! only ever the worker's fds 1 and 2, so the worker inherits nothing more
//! than with pipes.

use std::fs::File;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::{Mode, OFlags};
use rustix::pty::OpenptFlags;
use rustix::termios::OptionalActions;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::unix::pipe;

/// The shim's end of a worker's pseudo-terminal, read without blocking.
#[derive(Debug)]
pub struct Master {
    /// Read as tokio reads a pipe's end: a non-blocking descriptor polled
    /// for readability, which is what the master is too.
    reader: pipe::Receiver,
}

/// Opens a pseudo-terminal: the shim's end, registered with the runtime,
/// and the worker's end, raw, to hand to the worker as stdout and stderr.
/// Must run inside a tokio runtime (tokio panics otherwise).
pub fn open() -> io::Result<(Master, File)> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)
            .map_err(|e| context("cannot open a pseudo-terminal", e))?;
    rustix::pty::grantpt(&master).map_err(|e| context("cannot grant the pseudo-terminal", e))?;
    rustix::pty::unlockpt(&master).map_err(|e| context("cannot unlock the pseudo-terminal", e))?;
    let name = rustix::pty::ptsname(&master, Vec::new())
        .map_err(|e| context("cannot name the pseudo-terminal", e))?;
    // NOCTTY: the worker's output goes to the terminal, but it does not
    // become the worker's controlling terminal (no SIGHUP when it closes).
    let terminal = rustix::fs::open(
        name.as_c_str(),
        OFlags::RDWR | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| context("cannot open the terminal end of the pseudo-terminal", e))?;
    let mut termios = rustix::termios::tcgetattr(&terminal)
        .map_err(|e| context("cannot read the pseudo-terminal's settings", e))?;
    termios.make_raw();
    rustix::termios::tcsetattr(&terminal, OptionalActions::Now, &termios)
        .map_err(|e| context("cannot make the pseudo-terminal raw", e))?;
    rustix::io::ioctl_fionbio(&master, true)
        .map_err(|e| context("cannot make the pseudo-terminal non-blocking", e))?;
    let master = Master {
        reader: pipe::Receiver::from_owned_fd_unchecked(master)?,
    };
    Ok((master, File::from(terminal)))
}

fn context(what: &str, e: rustix::io::Errno) -> io::Error {
    let e = io::Error::from(e);
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl AsyncRead for Master {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.reader).poll_read(cx, buf) {
            // Every terminal end is closed: the output has ended.
            Poll::Ready(Err(e))
                if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) =>
            {
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::{IsTerminal, Write};

    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn lines_arrive_unchanged_and_closing_the_terminal_ends_the_output() {
        let (mut master, mut terminal) = open().unwrap();
        assert!(terminal.is_terminal());
        terminal.write_all(b"one\ntwo\n").unwrap();
        drop(terminal);
        let mut out = Vec::new();
        master.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, b"one\ntwo\n", "no \\r added, end of file at EIO");
    }
}
