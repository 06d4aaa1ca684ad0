//! A pipelined, reconnecting producer for one stream.
//!
//! Appends are written without waiting for answers, up to a window of
//! unacknowledged frames. The daemon's `Appended` is cumulative: it says
//! that every append of this producer up to `producer_seq` is durable, so
//! one answer may release many frames. Frames stay in the window until that
//! answer arrives. After a lost session (or a transient refusal such as a
//! full disk) the publisher backs off, reconnects and resends every
//! unacknowledged frame in order with the same producer name and producer
//! seqs; the daemon deduplicates on (producer, producer seq), so a resend
//! never stores a second copy.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use tether_protocol::codec::encode_into;
use tether_protocol::{validate_name, Append, FrameKind, Request, Response};

use crate::conn::{unexpected, Connector, Link};
use crate::error::{Error, Result};

/// Default number of unacknowledged frames in flight.
pub const DEFAULT_WINDOW: usize = 1024;
/// Default bound on the payload bytes of unacknowledged frames, so that a
/// window of large frames cannot hold gigabytes.
pub const DEFAULT_MAX_UNACKED_BYTES: usize = 64 * 1024 * 1024;
/// Queued bytes after which appends are written without waiting for more:
/// large enough for one write to carry hundreds of small frames.
const WRITE_CHUNK: usize = 128 * 1024;
/// Room for the length varint of a payload up to 2^35 bytes.
const MAX_LEN_VARINT: usize = 5;

/// How a [`Publisher`] behaves.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// Unacknowledged frames allowed in flight.
    pub window: usize,
    /// Unacknowledged payload bytes allowed in flight (at least one frame
    /// is always allowed).
    pub max_unacked_bytes: usize,
    /// The kind every published frame carries.
    pub kind: FrameKind,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_unacked_bytes: DEFAULT_MAX_UNACKED_BYTES,
            kind: FrameKind::Data,
        }
    }
}

/// Publishes frames to one stream as one producer. See the module docs.
#[derive(Debug)]
pub struct Publisher {
    link: Link,
    stream: String,
    producer: String,
    options: PublisherOptions,
    /// Unacknowledged frames in producer-seq order.
    pending: VecDeque<(u64, Bytes)>,
    pending_bytes: usize,
    /// Highest producer seq handed to [`Publisher::publish`].
    last_producer_seq: u64,
    /// Highest producer seq the daemon confirmed durable.
    acked_through: u64,
    max_payload: usize,
}

impl Publisher {
    /// A publisher for `stream` as `producer`. Connects lazily, on the first
    /// write; call [`Publisher::connect`] to fail early instead.
    pub fn new(
        connector: Connector,
        stream: impl Into<String>,
        producer: impl Into<String>,
        options: PublisherOptions,
    ) -> Result<Self> {
        let stream = stream.into();
        let producer = producer.into();
        validate_name("stream", &stream)?;
        validate_name("producer", &producer)?;
        let max_payload = max_payload(&stream, &producer, &options, &connector)?;
        Ok(Self {
            link: Link::new(connector),
            stream,
            producer,
            options: PublisherOptions {
                window: options.window.max(1),
                ..options
            },
            pending: VecDeque::new(),
            pending_bytes: 0,
            last_producer_seq: 0,
            acked_through: 0,
            max_payload,
        })
    }

    /// Opens the session now (retrying within the retry window).
    pub async fn connect(&mut self) -> Result<()> {
        self.ensure_session().await
    }

    /// The largest payload one frame can carry for this stream and producer.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }

    /// The stream published to.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The producer name appends carry.
    pub fn producer(&self) -> &str {
        &self.producer
    }

    /// Frames published but not yet confirmed durable.
    pub fn unacknowledged(&self) -> usize {
        self.pending.len()
    }

    /// The highest producer seq the daemon has confirmed durable (0 for
    /// none). Everything at or below it is stored.
    pub fn acked_through(&self) -> u64 {
        self.acked_through
    }

    /// Queues one frame. `producer_seq` must be above every earlier one;
    /// gaps are allowed. Waits only when the window is full. The frame is
    /// durable once [`Publisher::acked_through`] reaches `producer_seq`,
    /// which [`Publisher::flush`] waits for.
    pub async fn publish(&mut self, producer_seq: u64, payload: Bytes) -> Result<()> {
        if producer_seq <= self.last_producer_seq {
            return Err(Error::Usage(format!(
                "producer seq {producer_seq} is not above the previous one, {}",
                self.last_producer_seq
            )));
        }
        if payload.len() > self.max_payload {
            return Err(Error::PayloadTooLarge {
                len: payload.len(),
                max: self.max_payload,
            });
        }
        while self.window_full(payload.len()) {
            self.pump().await?;
        }
        self.last_producer_seq = producer_seq;
        self.pending_bytes += payload.len();
        self.pending.push_back((producer_seq, payload));
        let Self {
            link,
            pending,
            stream,
            producer,
            options,
            ..
        } = self;
        let buffered = match (link.connection(), pending.back()) {
            (Some(conn), Some((seq, payload))) => {
                conn.queue(&append(stream, producer, options.kind, *seq, payload))?;
                conn.unwritten()
            }
            // Without a session the frame waits in the window and is sent
            // when one is (re)established.
            _ => 0,
        };
        if buffered >= WRITE_CHUNK {
            self.send().await?;
        }
        Ok(())
    }

    /// Writes every queued append now, without waiting for them to be
    /// acknowledged, and takes in the acknowledgements already received.
    /// Call it when no more frames are coming for a while, so that they do
    /// not sit in the buffer.
    pub async fn send(&mut self) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        loop {
            self.ensure_session().await?;
            let Some(conn) = self.link.connection() else {
                continue;
            };
            match conn.flush_or_recv().await {
                Ok(None) => break,
                Ok(Some(response)) => self.absorb(response)?,
                Err(e) => self.link.lose(e)?,
            }
        }
        while let Some(conn) = self.link.connection() {
            match conn.try_recv() {
                None => break,
                Some(Ok(response)) => self.absorb(response)?,
                Some(Err(e)) => self.link.lose(e)?,
            }
        }
        Ok(())
    }

    /// Waits until every published frame is durable, reconnecting and
    /// resending as needed.
    pub async fn flush(&mut self) -> Result<()> {
        self.send().await?;
        while !self.pending.is_empty() {
            self.pump().await?;
        }
        Ok(())
    }

    fn window_full(&self, incoming: usize) -> bool {
        !self.pending.is_empty()
            && (self.pending.len() >= self.options.window
                || self.pending_bytes + incoming > self.options.max_unacked_bytes)
    }

    /// Makes sure a session is open; on a new one, queues every
    /// unacknowledged frame again, in order.
    async fn ensure_session(&mut self) -> Result<()> {
        if !self.link.establish().await? {
            return Ok(());
        }
        let Self {
            link,
            pending,
            stream,
            producer,
            options,
            ..
        } = self;
        if let Some(conn) = link.connection() {
            for (seq, payload) in pending.iter() {
                conn.queue(&append(stream, producer, options.kind, *seq, payload))?;
            }
        }
        Ok(())
    }

    /// Makes progress: writes what is queued and takes in at least one
    /// answer, or records a lost session (to be re-established next time).
    async fn pump(&mut self) -> Result<()> {
        self.ensure_session().await?;
        let Some(conn) = self.link.connection() else {
            return Ok(());
        };
        let answer = match conn.flush_or_recv().await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => conn.recv().await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(response) => self.absorb(response),
            Err(e) => self.link.lose(e),
        }
    }

    /// Applies one answer: a cumulative `Appended` releases every frame up
    /// to its producer seq.
    fn absorb(&mut self, response: Response) -> Result<()> {
        let Response::Appended(appended) = response else {
            return Err(unexpected("Appended", &response));
        };
        if appended.stream != self.stream || appended.producer != self.producer {
            return Err(Error::Protocol(format!(
                "Appended for stream {:?} producer {:?} on the session of stream {:?} producer {:?}",
                appended.stream, appended.producer, self.stream, self.producer
            )));
        }
        let mut released = false;
        while let Some((seq, payload)) = self.pending.front() {
            if *seq > appended.producer_seq {
                break;
            }
            self.pending_bytes -= payload.len();
            self.pending.pop_front();
            released = true;
        }
        self.acked_through = self.acked_through.max(appended.producer_seq);
        if released {
            self.link.progressed();
        }
        Ok(())
    }
}

fn append(stream: &str, producer: &str, kind: FrameKind, seq: u64, payload: &Bytes) -> Request {
    Request::Append(Append {
        stream: stream.to_owned(),
        producer: producer.to_owned(),
        producer_seq: seq,
        kind,
        payload: payload.clone(),
    })
}

/// The largest payload whose `Append` still fits in one frame, computed
/// from the encoding of an empty one with the widest producer seq.
fn max_payload(
    stream: &str,
    producer: &str,
    options: &PublisherOptions,
    connector: &Connector,
) -> Result<usize> {
    let mut buf = BytesMut::new();
    let empty = append(stream, producer, options.kind, u64::MAX, &Bytes::new());
    encode_into(&empty, &mut buf, usize::MAX)?;
    // The buffer holds the 4-byte length prefix, then the body whose last
    // byte is the empty payload's length varint.
    let overhead = buf.len().saturating_sub(4 + 1) + MAX_LEN_VARINT;
    let max_frame = connector.options().max_frame_len;
    max_frame.checked_sub(overhead).ok_or_else(|| {
        Error::Usage(format!(
            "a maximum frame length of {max_frame} bytes leaves no room for a payload"
        ))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::conn::{ConnectOptions, Endpoint};

    #[test]
    fn the_largest_payload_fits_in_one_frame_and_one_more_byte_may_not() {
        let connector = Connector::new(
            Endpoint::unix("/unused"),
            ConnectOptions {
                max_frame_len: 4096,
                ..ConnectOptions::default()
            },
        );
        let publisher = Publisher::new(connector, "s", "p", PublisherOptions::default()).unwrap();
        let max = publisher.max_payload();
        let mut buf = BytesMut::new();
        let big = append(
            "s",
            "p",
            FrameKind::Data,
            u64::MAX,
            &Bytes::from(vec![b'x'; max]),
        );
        encode_into(&big, &mut buf, 4096).unwrap();
        assert!(max > 4000, "overhead should be small, max payload is {max}");
    }

    #[test]
    fn invalid_names_are_refused_up_front() {
        let connector = Connector::new(Endpoint::unix("/unused"), ConnectOptions::default());
        let err =
            Publisher::new(connector, "has space", "p", PublisherOptions::default()).unwrap_err();
        assert!(err.to_string().contains("whitespace"), "{err}");
    }
}
