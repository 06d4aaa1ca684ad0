//! A minimal, blocking protocol client over `std::os::unix::net::UnixStream`.
//!
//! It exists to do what a well-behaved client never would (send garbage,
//! skip the `Hello`, ack the future) and to peek at the daemon's state
//! without going through the CLI under test.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use tether_protocol::codec::{decode_message, encode_frame};
use tether_protocol::parts::Joiner;
use tether_protocol::{
    Append, Capabilities, ErrorFrame, FrameKind, Hello, HelloOk, Request, Response, StatusInfo,
    StreamInfo, PROTOCOL_VERSION,
};

/// How long a read may block before the test fails instead of hanging.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// Upper bound on a response this client accepts, to fail clearly on a
/// corrupt length prefix instead of allocating it.
const MAX_RESPONSE_LEN: usize = 64 * 1024 * 1024;

/// One raw connection to a daemon.
#[derive(Debug)]
pub struct RawConn {
    stream: UnixStream,
}

impl RawConn {
    /// Connects to the daemon at `socket`.
    pub fn connect(socket: &Path) -> io::Result<Self> {
        let stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_write_timeout(Some(READ_TIMEOUT))?;
        Ok(Self { stream })
    }

    /// Connects, panicking on failure.
    pub fn open(socket: &Path) -> Self {
        Self::connect(socket)
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", socket.display()))
    }

    /// A second handle on the same connection, so that one thread can
    /// write requests while another reads responses.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            stream: self.stream.try_clone()?,
        })
    }

    /// Writes raw bytes, whatever they are.
    pub fn send_bytes(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Writes one well-formed request frame.
    pub fn send(&mut self, request: &Request) -> io::Result<()> {
        let frame = encode_frame(request)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        self.stream.write_all(&frame)
    }

    /// Closes the write half: the daemon reads end-of-file after what was
    /// sent.
    pub fn shutdown_write(&mut self) -> io::Result<()> {
        self.stream.shutdown(Shutdown::Write)
    }

    /// Reads one answer, joining one sent in several messages (a long
    /// list) as the client does; `Ok(None)` when the daemon closed the
    /// connection first.
    pub fn recv_answer(&mut self) -> io::Result<Option<Response>> {
        let mut joiner = Joiner::new();
        while let Some(response) = self.recv()? {
            let joined = joiner
                .push(response)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            if joined.is_some() {
                return Ok(joined);
            }
        }
        Ok(None)
    }

    /// Reads one response; `Ok(None)` when the daemon closed the connection
    /// cleanly between frames.
    pub fn recv(&mut self) -> io::Result<Option<Response>> {
        let mut prefix = [0u8; 4];
        if !read_exact_or_eof(&mut self.stream, &mut prefix)? {
            return Ok(None);
        }
        let len = u32::from_be_bytes(prefix) as usize;
        if len > MAX_RESPONSE_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("response length {len} exceeds {MAX_RESPONSE_LEN}"),
            ));
        }
        let mut body = vec![0u8; len];
        self.stream.read_exact(&mut body)?;
        decode_message(&body)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
    }

    /// Reads one response, panicking on end-of-file or an I/O error.
    pub fn expect_response(&mut self) -> Response {
        match self.recv() {
            Ok(Some(response)) => response,
            Ok(None) => panic!("the daemon closed the connection instead of answering"),
            Err(e) => panic!("reading a response failed: {e}"),
        }
    }

    /// Says `Hello` with this build's version and `capabilities`, and
    /// returns the daemon's acceptance.
    pub fn hello(&mut self, capabilities: Capabilities) -> HelloOk {
        let hello = Request::Hello(Hello {
            version: PROTOCOL_VERSION,
            capabilities,
            client: "tether-tests".to_owned(),
        });
        self.send(&hello)
            .unwrap_or_else(|e| panic!("sending Hello failed: {e}"));
        match self.expect_response() {
            Response::HelloOk(ok) => ok,
            other => panic!("expected HelloOk, got {other:?}"),
        }
    }

    /// Reads responses until an error frame, skipping anything else (the
    /// daemon may legitimately send frames before it refuses a request).
    /// Panics when the connection ends without one.
    pub fn expect_error(&mut self) -> ErrorFrame {
        let mut skipped = 0usize;
        loop {
            match self.recv() {
                Ok(Some(Response::Error(error))) => return error,
                Ok(Some(_)) => skipped += 1,
                Ok(None) => panic!(
                    "the daemon closed the connection without an error frame \
                     (after {skipped} other responses)"
                ),
                Err(e) => panic!("reading an error frame failed after {skipped} responses: {e}"),
            }
        }
    }

    /// Asserts that the daemon has closed the connection: nothing more
    /// arrives and the read ends.
    pub fn expect_closed(&mut self) {
        let mut byte = [0u8; 1];
        match self.stream.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => {}
            Ok(_) => panic!("the daemon sent more bytes after its error frame"),
            Err(e) => panic!("expected the daemon to close the connection, got {e}"),
        }
    }
}

impl RawConn {
    /// Bytes written on this connection that the daemon has not read yet.
    #[allow(unsafe_code)]
    pub fn unread_by_peer(&self) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: the descriptor is open for the lifetime of `self`, and
        // SIOCOUTQ writes one `int` to the pointer it is given.
        let ret = unsafe {
            libc::ioctl(
                self.stream.as_raw_fd(),
                libc::TIOCOUTQ,
                std::ptr::addr_of_mut!(queued),
            )
        };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        usize::try_from(queued).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    /// True while the daemon has neither answered nor closed: nothing to
    /// read, without waiting. (When there is something, a byte of it is
    /// taken: for asserting quiet, not for reading on after.)
    pub fn is_quiet(&self) -> bool {
        let mut byte = [0u8; 1];
        self.stream
            .set_nonblocking(true)
            .unwrap_or_else(|e| panic!("cannot make the socket non-blocking: {e}"));
        let peeked = (&self.stream).read(&mut byte);
        self.stream
            .set_nonblocking(false)
            .unwrap_or_else(|e| panic!("cannot make the socket blocking: {e}"));
        matches!(peeked, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// One `Append` frame to `stream` whose body is about `len` bytes (its
/// payload fills what the envelope leaves): for sending part of it.
pub fn append_frame(stream: &str, len: usize) -> Vec<u8> {
    let append = Request::Append(Append {
        stream: stream.to_owned(),
        producer: "p".to_owned(),
        producer_seq: 1,
        kind: FrameKind::Data,
        payload: vec![b'x'; len.saturating_sub(64)].into(),
    });
    encode_frame(&append)
        .unwrap_or_else(|e| panic!("cannot encode an append: {e}"))
        .to_vec()
}

/// Fills `buf`, or returns `Ok(false)` on end-of-file before its first byte.
fn read_exact_or_eof(stream: &mut UnixStream, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match stream.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a length prefix",
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Asks the daemon at `socket` for its status; `Err` while it cannot be
/// reached or does not answer properly.
pub fn status(socket: &Path) -> io::Result<StatusInfo> {
    let mut conn = RawConn::connect(socket)?;
    handshake(&mut conn)?;
    conn.send(&Request::Status)?;
    match conn.recv()? {
        Some(Response::Status(info)) => Ok(info),
        other => Err(unexpected("Status", &other)),
    }
}

/// Lists the daemon's streams.
pub fn list_streams(socket: &Path) -> io::Result<Vec<StreamInfo>> {
    let mut conn = RawConn::connect(socket)?;
    handshake(&mut conn)?;
    conn.send(&Request::ListStreams)?;
    match conn.recv_answer()? {
        Some(Response::Streams(streams)) => Ok(streams),
        other => Err(unexpected("Streams", &other)),
    }
}

/// The named stream's info, `None` while it does not exist or the daemon
/// cannot be reached (for polling through restarts).
pub fn stream_info(socket: &Path, name: &str) -> Option<StreamInfo> {
    list_streams(socket)
        .ok()?
        .into_iter()
        .find(|s| s.name == name)
}

/// Asserts that `stream` holds exactly seqs 1..=`frames`: checked right
/// after a publisher exits 0, it tells a lost line from a slow reader.
pub fn assert_stored(socket: &Path, stream: &str, frames: u64) {
    let info = list_streams(socket)
        .unwrap_or_else(|e| panic!("cannot list streams: {e}"))
        .into_iter()
        .find(|s| s.name == stream)
        .unwrap_or_else(|| panic!("stream {stream} does not exist"));
    assert_eq!(
        (info.first_seq, info.last_seq, info.frames),
        (1, frames, frames),
        "stream {stream} should hold seqs 1..={frames} after the publisher exited 0: {info:?}"
    );
}

/// The stream's last seq, 0 while it does not exist or the daemon is down.
pub fn last_seq(socket: &Path, name: &str) -> u64 {
    stream_info(socket, name).map_or(0, |s| s.last_seq)
}

fn handshake(conn: &mut RawConn) -> io::Result<()> {
    conn.send(&Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::NONE,
        client: "tether-tests".to_owned(),
    }))?;
    match conn.recv()? {
        Some(Response::HelloOk(_)) => Ok(()),
        other => Err(unexpected("HelloOk", &other)),
    }
}

fn unexpected(wanted: &str, got: &Option<Response>) -> io::Error {
    io::Error::other(format!("expected {wanted}, got {got:?}"))
}
