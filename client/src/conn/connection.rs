//! One open session ([`Connection`]): requests encoded into a buffer and
//! written in one go, responses read through a length-delimited decoder,
//! and a failed write explained by the error frame sent before it.

use std::fmt;
use std::time::Duration;

use bytes::BytesMut;
use futures_util::{FutureExt, StreamExt};
use tether_protocol::codec::encode_into;
use tether_protocol::parts::Joiner;
use tether_protocol::{ClientCodec, HelloOk, Request, Response};
use tokio::io::AsyncWriteExt;
use tokio_util::codec::FramedRead;

use super::endpoint::{ReadHalf, WriteHalf};
use crate::error::{Error, Result};

/// How long a failed write waits for the error frame that may explain it
/// (see `Connection::why_write_failed`): locally it has arrived already;
/// over ssh it may still be on its way.
const WHY_CLOSED_WAIT: Duration = Duration::from_millis(200);

/// One open session with the daemon.
pub struct Connection {
    pub(super) endpoint: String,
    pub(super) reader: FramedRead<ReadHalf, ClientCodec>,
    pub(super) writer: WriteHalf,
    /// Encoded requests not yet written to the socket.
    pub(super) out: BytesMut,
    pub(super) max_frame_len: usize,
    pub(super) hello: HelloOk,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("endpoint", &self.endpoint)
            .field("unwritten_bytes", &self.out.len())
            .field("hello", &self.hello)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// The daemon's answer to our `Hello`.
    pub fn hello(&self) -> &HelloOk {
        &self.hello
    }

    /// The endpoint, as shown in messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Encodes `request` into the write buffer. Nothing is sent until
    /// [`Connection::flush`] or [`Connection::flush_or_recv`]. A request too
    /// large for one frame is refused and leaves the buffer unchanged.
    pub fn queue(&mut self, request: &Request) -> Result<()> {
        encode_into(request, &mut self.out, self.max_frame_len)?;
        Ok(())
    }

    /// Bytes queued but not yet written.
    pub fn unwritten(&self) -> usize {
        self.out.len()
    }

    /// Writes everything queued.
    pub async fn flush(&mut self) -> Result<()> {
        let written = match self.writer.write_all_buf(&mut self.out).await {
            Ok(()) => self.writer.flush().await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => Ok(()),
            Err(source) => Err(self.write_failed(source).await),
        }
    }

    /// Writes what is queued, but returns early with a response if one
    /// arrives first (call again to finish writing). `Ok(None)` means
    /// everything is written. Reading while writing is what keeps a large
    /// pipelined write from deadlocking against a daemon that is itself
    /// blocked writing answers to us.
    pub async fn flush_or_recv(&mut self) -> Result<Option<Response>> {
        if self.out.is_empty() {
            return Ok(None);
        }
        while !self.out.is_empty() {
            let written = tokio::select! {
                biased;
                item = self.reader.next() => return self.accept(item).map(Some),
                written = self.writer.write_buf(&mut self.out) => written,
            };
            match written {
                Ok(0) => {
                    let closed = Error::Closed {
                        endpoint: self.endpoint.clone(),
                    };
                    return Err(self.why_write_failed(closed).await);
                }
                Ok(_) => {}
                Err(source) => return Err(self.write_failed(source).await),
            }
        }
        match self.writer.flush().await {
            Ok(()) => Ok(None),
            Err(source) => Err(self.write_failed(source).await),
        }
    }

    /// The error for a write that failed with `source`.
    async fn write_failed(&mut self, source: std::io::Error) -> Error {
        let failed = Error::Io {
            endpoint: self.endpoint.clone(),
            source: source.into(),
        };
        self.why_write_failed(failed).await
    }

    /// A write fails (a broken pipe) when the daemon has closed the
    /// session, which it does after an error frame: that frame, already
    /// received, says why (a full disk, say) where the broken pipe would
    /// read as "cannot reach tetherd". Waits only briefly for it, in case
    /// the session ended without one. Every write of a session comes here
    /// when it fails.
    async fn why_write_failed(&mut self, failed: Error) -> Error {
        self.why_write_failed_within(failed, WHY_CLOSED_WAIT).await
    }

    /// [`Connection::why_write_failed`], waiting at most `wait`.
    async fn why_write_failed_within(&mut self, failed: Error, wait: Duration) -> Error {
        match tokio::time::timeout(wait, self.reader.next()).await {
            Ok(item @ Some(Ok(Response::Error(_)))) => self.accept(item).err().unwrap_or(failed),
            _ => failed,
        }
    }

    /// Waits for the next response. An error frame from the daemon becomes
    /// [`Error::Daemon`]; the end of the stream becomes [`Error::Closed`].
    /// Cancel-safe: dropping the future loses no response.
    pub async fn recv(&mut self) -> Result<Response> {
        let item = self.reader.next().await;
        self.accept(item)
    }

    /// A response that is already available without waiting, if any.
    pub fn try_recv(&mut self) -> Option<Result<Response>> {
        let item = self.reader.next().now_or_never()?;
        Some(self.accept(item))
    }

    /// Sends `request` and waits for its answer. An answer the daemon sent
    /// in several messages (a long list, a large checkpoint) is returned
    /// joined, as one (see [`tether_protocol::parts`]).
    pub async fn request(&mut self, request: &Request) -> Result<Response> {
        self.request_after(&[], request).await
    }

    /// Sends `leading`, which the daemon does not answer, then `request`,
    /// and waits for the answer to `request`, joined like
    /// [`Connection::request`]'s.
    pub async fn request_after(
        &mut self,
        leading: &[Request],
        request: &Request,
    ) -> Result<Response> {
        for lead in leading {
            self.queue(lead)?;
        }
        self.queue(request)?;
        let mut joiner = Joiner::new();
        loop {
            let response = match self.flush_or_recv().await? {
                Some(early) => early,
                None => self.recv().await?,
            };
            if let Some(answer) = joiner.push(response)? {
                return Ok(answer);
            }
        }
    }

    fn accept(
        &self,
        item: Option<std::result::Result<Response, tether_protocol::Error>>,
    ) -> Result<Response> {
        match item {
            None => Err(Error::Closed {
                endpoint: self.endpoint.clone(),
            }),
            Some(Err(tether_protocol::Error::Io(source))) => Err(Error::Io {
                endpoint: self.endpoint.clone(),
                source,
            }),
            Some(Err(e)) => Err(Error::Codec(e)),
            Some(Ok(Response::Error(frame))) => Err(Error::Daemon {
                code: frame.code,
                message: frame.message,
            }),
            Some(Ok(response)) => Ok(response),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use futures_util::SinkExt;
    use tether_protocol::ErrorCode;

    use super::*;
    use crate::conn::fake_daemon::{accept_session, connector, disk_full, hello_ok, listening};

    #[tokio::test]
    async fn a_write_the_daemon_closed_on_is_explained_by_its_error_frame() {
        let (_dir, path, listener) = listening("d.sock");
        // The first session ends with an error frame, the second without.
        let server = tokio::spawn(async move {
            for refusal in [Some(disk_full()), None] {
                let mut framed = accept_session(&listener).await;
                framed.send(hello_ok("d")).await.unwrap();
                if let Some(refusal) = refusal {
                    framed.send(refusal).await.unwrap();
                }
            }
        });
        let broken_pipe = || Error::Io {
            endpoint: "d.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::BrokenPipe).into(),
        };
        let connector = connector(&path, Duration::from_secs(5));
        let mut refused = connector.connect().await.unwrap();
        let mut closed = connector.connect().await.unwrap();
        server.await.unwrap();

        let why = refused.why_write_failed(broken_pipe()).await;
        assert_eq!(why.daemon_code(), Some(ErrorCode::STORAGE_FULL));
        assert_eq!(why.to_string(), "disk full (storage_full)");
        // Given an hour, it must still return at the end of the stream
        // rather than wait for a frame that cannot come.
        let hour = Duration::from_secs(3600);
        let why = tokio::time::timeout(
            Duration::from_secs(60),
            closed.why_write_failed_within(broken_pipe(), hour),
        )
        .await
        .expect("waited for a frame after the end of the stream");
        assert!(
            matches!(&why, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::BrokenPipe),
            "{why}"
        );
    }
}
