//! What a session reads besides the requests `ingest` decodes: the Hello,
//! read by hand so that another protocol version is recognised, and the
//! appends already buffered on the socket, gathered into one batch.

use std::time::Duration;

use futures_util::FutureExt;
use tether_protocol::codec::{decode_wire_message, peek_hello_version};
use tether_protocol::{ErrorCode, Hello, Request, PROTOCOL_VERSION};
use tokio::io::AsyncReadExt;
use tokio::net::unix::OwnedReadHalf;

use super::{Refusal, Session};
use crate::ingest::{Incoming, IngestAppend, SessionReader};

/// A client has this long to send its Hello.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A Hello is small; a longer first frame is refused without reading it.
const MAX_HELLO_LEN: usize = 64 * 1024;
/// Appends gathered into one batch from what is already buffered.
const MAX_APPEND_BATCH: usize = 4096;
/// Payload bytes gathered into one batch (give or take one read). What a
/// session has read but not yet handed to the writer is outside the
/// writer's in-flight budget, so this bounds it: a hundred producers that
/// all connect with a full window must not all be read into memory at once.
const MAX_APPEND_BATCH_BYTES: usize = 32 * 1024;

impl Session {
    /// Adds to `batch` the appends already waiting on the socket (reading
    /// it again while it has more), then submits them as one batch, and
    /// then serves the request that ended it, if any.
    pub(super) async fn gather_appends(
        &mut self,
        mut batch: Vec<IngestAppend>,
        reader: &mut SessionReader,
    ) -> Result<(), Refusal> {
        let mut bytes: usize = batch.iter().map(|a| a.payload.len()).sum();
        let mut after = None;
        while batch.len() < MAX_APPEND_BATCH && bytes < MAX_APPEND_BATCH_BYTES {
            match reader.next().now_or_never() {
                Some(Some(Ok(Incoming::Appends(more)))) => {
                    bytes += more.iter().map(|a| a.payload.len()).sum::<usize>();
                    batch.extend(more);
                }
                Some(Some(next)) => {
                    after = Some(next);
                    break;
                }
                // Nothing more buffered (or the client closed: the read
                // loop will see that next).
                Some(None) | None => break,
            }
        }
        // The appends before a bad frame are stored and answered first.
        self.start_appends(batch).await?;
        match after {
            Some(Ok(Incoming::Request(request))) => self.dispatch(request).await,
            Some(Err(e)) => Err(e.into()),
            Some(Ok(Incoming::Appends(_))) | None => Ok(()),
        }
    }
}

/// Reads the first frame by hand, so that a Hello of another protocol
/// version is recognised by its leading version field even when the rest
/// of it has a layout this build cannot parse. `Ok(None)`: the client left
/// before sending anything.
pub(super) async fn read_hello(
    read_half: &mut OwnedReadHalf,
    max_frame_len: usize,
) -> Result<Option<Hello>, Refusal> {
    let mut prefix = [0u8; 4];
    let got = read_full(read_half, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < prefix.len() {
        return Err(tether_protocol::Error::Truncated {
            received: got,
            expected: prefix.len(),
        }
        .into());
    }
    let len = u32::from_be_bytes(prefix) as usize;
    let limit = max_frame_len.min(MAX_HELLO_LEN);
    if len > limit {
        return Err(Refusal::new(
            ErrorCode::FRAME_TOO_LARGE,
            format!("frame of {len} bytes exceeds the maximum of {limit} bytes for a Hello"),
        ));
    }
    // Grown with what arrives, not reserved for what was declared: a
    // thousand connections that each declare a large Hello and stop cost
    // what they sent.
    let mut body = Vec::new();
    read_half
        .take(len as u64)
        .read_to_end(&mut body)
        .await
        .map_err(cannot_read)?;
    if body.len() < len {
        return Err(tether_protocol::Error::Truncated {
            received: prefix.len() + body.len(),
            expected: prefix.len() + len,
        }
        .into());
    }
    if let Some(version) = peek_hello_version(&body) {
        if version != PROTOCOL_VERSION {
            return Err(Refusal::new(
                ErrorCode::UNSUPPORTED_VERSION,
                format!(
                    "protocol version {version} is not supported; this daemon speaks version {PROTOCOL_VERSION}"
                ),
            ));
        }
    }
    match decode_wire_message::<Request>(&body)? {
        Request::Hello(hello) => Ok(Some(hello)),
        other => Err(Refusal::new(
            ErrorCode::HELLO_REQUIRED,
            format!("the first message must be Hello, got {}", other.name()),
        )),
    }
}

/// Fills `buf` unless the peer closes first; returns how much arrived.
async fn read_full(read_half: &mut OwnedReadHalf, buf: &mut [u8]) -> Result<usize, Refusal> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = read_half
            .read(&mut buf[filled..])
            .await
            .map_err(cannot_read)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

fn cannot_read(e: std::io::Error) -> Refusal {
    Refusal::new(
        ErrorCode::MALFORMED,
        format!("cannot read from client: {e}"),
    )
}
