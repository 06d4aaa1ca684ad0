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
//!
//! A publisher may open every session with a [`Greeting`]: a request sent
//! before any frame is resent, whose answer is awaited. A shim uses it to
//! say which worker it supervises (`ShimHello`) each time it reconnects.
//!
//! Two ways to drive it. [`Publisher::publish`] waits for room in the
//! window and so suits a plain loop. A producer that must keep doing other
//! things meanwhile (reading several pipes) checks [`Publisher::has_room`],
//! hands frames over with [`Publisher::push`], which never waits, and runs
//! [`Publisher::progress`], which is cancel-safe, in a `select!` loop.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use tether_protocol::codec::encode_into;
use tether_protocol::{
    max_payload_len, validate_name, Append, AppendStamped, Capabilities, FrameKind, Request,
    Response,
};

use crate::conn::{unexpected, Connection, Connector, Link};
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

/// A request that opens every session of a [`Publisher`], before any frame
/// is (re)sent.
#[derive(Debug, Clone)]
pub struct Greeting {
    /// The request, sent unchanged on every new session.
    pub request: Request,
    /// True for the answer that accepts it. Any other answer is a protocol
    /// violation; an error frame with a permanent code becomes
    /// [`Error::Refused`].
    pub accepts: fn(&Response) -> bool,
}

/// How a [`Publisher`] behaves.
#[derive(Debug, Clone)]
pub struct PublisherOptions {
    /// Unacknowledged frames allowed in flight.
    pub window: usize,
    /// Unacknowledged payload bytes allowed in flight (at least one frame
    /// is always allowed).
    pub max_unacked_bytes: usize,
    /// The kind frames carry when none is given ([`Publisher::publish`]).
    pub kind: FrameKind,
    /// Sent first on every session, if set.
    pub greeting: Option<Greeting>,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_unacked_bytes: DEFAULT_MAX_UNACKED_BYTES,
            kind: FrameKind::Data,
            greeting: None,
        }
    }
}

/// How far the current session is from carrying appends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Just opened: the greeting (if any) has not been queued yet.
    Fresh,
    /// The greeting is queued or sent; its answer has not arrived.
    Greeting,
    /// Appends may flow; every unacknowledged frame has been queued on it.
    Ready,
}

/// One frame waiting for its acknowledgement.
#[derive(Debug)]
struct Unacked {
    producer_seq: u64,
    kind: FrameKind,
    payload: Bytes,
    /// When the producer read the frame, sent to a daemon that takes it.
    ts_micros: Option<u64>,
}

/// Publishes frames to one stream as one producer. See the module docs.
#[derive(Debug)]
pub struct Publisher {
    link: Link,
    phase: Phase,
    stream: String,
    producer: String,
    options: PublisherOptions,
    /// Unacknowledged frames in producer-seq order.
    pending: VecDeque<Unacked>,
    pending_bytes: usize,
    /// Highest producer seq handed to the publisher.
    last_producer_seq: u64,
    /// Highest producer seq the daemon confirmed durable.
    acked_through: u64,
    max_payload: usize,
    /// Sessions that became ready (greeted) so far.
    sessions: u64,
    /// `FlushOutput` asks received and not yet taken, with the session
    /// (by [`Publisher::sessions`]) each came on.
    flush_asks: Vec<FlushAsk>,
}

/// The daemon's ask to flush output through now (`Response::FlushOutput`),
/// answered with [`Publisher::answer_flush`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushAsk {
    /// The ask's token, returned in the answer.
    pub token: u64,
    /// The session it came on: an answer on another would mean nothing.
    pub session: u64,
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
        let max_payload = max_payload(&stream, &producer, &connector)?;
        Ok(Self {
            link: Link::new(connector),
            phase: Phase::Fresh,
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
            sessions: 0,
            flush_asks: Vec::new(),
        })
    }

    /// Opens the session now (retrying within the retry window), greeting
    /// the daemon if a greeting is set.
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

    /// Sessions that have been opened and greeted so far: 1 after the
    /// first, and one more after every reconnect.
    pub fn sessions(&self) -> u64 {
        self.sessions
    }

    /// The daemon's asks to flush output through now, received since the
    /// last call (see [`FlushAsk`]).
    pub fn take_flush_asks(&mut self) -> Vec<FlushAsk> {
        std::mem::take(&mut self.flush_asks)
    }

    /// Answers `ask` with `Request::OutputFlushed`, to be written with the
    /// next progress, if its session is still the current one. The caller
    /// answers only once every frame it pushed before the ask is
    /// acknowledged ([`Publisher::acked_through`]).
    pub fn answer_flush(&mut self, ask: FlushAsk) -> Result<()> {
        if self.phase != Phase::Ready || ask.session != self.sessions {
            return Ok(());
        }
        if let Some(conn) = self.link.connection() {
            conn.queue(&Request::OutputFlushed { token: ask.token })?;
        }
        Ok(())
    }

    /// True while the window can take another frame without waiting.
    pub fn has_room(&self) -> bool {
        !self.window_full(0)
    }

    /// Queues one frame of the default kind. `producer_seq` must be above
    /// every earlier one; gaps are allowed. Waits only when the window is
    /// full. The frame is durable once [`Publisher::acked_through`] reaches
    /// `producer_seq`, which [`Publisher::flush`] waits for.
    pub async fn publish(&mut self, producer_seq: u64, payload: Bytes) -> Result<()> {
        self.publish_kind(producer_seq, self.options.kind, payload)
            .await
    }

    /// [`Publisher::publish`] with the frame's kind given.
    pub async fn publish_kind(
        &mut self,
        producer_seq: u64,
        kind: FrameKind,
        payload: Bytes,
    ) -> Result<()> {
        self.check(producer_seq, &payload)?;
        while self.window_full(payload.len()) {
            self.pump().await?;
        }
        let buffered = self.enqueue(producer_seq, kind, payload, None)?;
        if buffered >= WRITE_CHUNK {
            self.send().await?;
        }
        Ok(())
    }

    /// Queues one frame without waiting, even when the window is full: the
    /// caller bounds the window by checking [`Publisher::has_room`] before
    /// producing more. The frame is written by the next
    /// [`Publisher::progress`], [`Publisher::send`] or [`Publisher::flush`].
    pub fn push(&mut self, producer_seq: u64, kind: FrameKind, payload: Bytes) -> Result<()> {
        self.check(producer_seq, &payload)?;
        self.enqueue(producer_seq, kind, payload, None)?;
        Ok(())
    }

    /// [`Publisher::push`] with the time the frame was read (microseconds
    /// since the Unix epoch), which the daemon stores as the frame's time
    /// when it takes stamped appends. A frame resent after an outage keeps
    /// it, so lines read while the daemon was down keep their own times.
    pub fn push_stamped(
        &mut self,
        producer_seq: u64,
        kind: FrameKind,
        payload: Bytes,
        ts_micros: u64,
    ) -> Result<()> {
        self.check(producer_seq, &payload)?;
        self.enqueue(producer_seq, kind, payload, Some(ts_micros))?;
        Ok(())
    }

    /// Makes progress and returns: (re)connects and greets if needed,
    /// writes what is queued, and takes in one answer. Without anything
    /// to write it waits for the daemon, which notices a lost session (and
    /// reconnects) even while no frames flow.
    ///
    /// Cancel-safe: dropped at any await point, nothing is lost and the
    /// next call carries on where this one stopped.
    pub async fn progress(&mut self) -> Result<()> {
        self.pump().await
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
                Err(e) => self.lose(e)?,
            }
        }
        while let Some(conn) = self.link.connection() {
            match conn.try_recv() {
                None => break,
                Some(Ok(response)) => self.absorb(response)?,
                Some(Err(e)) => self.lose(e)?,
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

    /// Waits until every published frame is durable, then sends `request`
    /// on that same session and returns the answer that `accepts` takes.
    /// If the session is lost first, it reconnects (greeting again) and
    /// sends `request` again, so the daemon must treat a repeat as done.
    /// Not cancel-safe: a dropped call may have sent `request` or not.
    pub async fn finish(
        &mut self,
        request: &Request,
        accepts: fn(&Response) -> bool,
    ) -> Result<Response> {
        loop {
            self.flush().await?;
            self.ensure_session().await?;
            let Some(conn) = self.link.connection() else {
                continue;
            };
            conn.queue(request)?;
            match await_answer(conn, request.name(), accepts).await {
                Ok(answer) => return Ok(answer),
                Err(e) => self.lose(e)?,
            }
        }
    }

    fn check(&self, producer_seq: u64, payload: &Bytes) -> Result<()> {
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
        Ok(())
    }

    /// Adds a checked frame to the window and, on a ready session, to the
    /// write buffer. Returns the bytes now waiting in the write buffer.
    fn enqueue(
        &mut self,
        producer_seq: u64,
        kind: FrameKind,
        payload: Bytes,
        ts_micros: Option<u64>,
    ) -> Result<usize> {
        self.last_producer_seq = producer_seq;
        self.pending_bytes += payload.len();
        self.pending.push_back(Unacked {
            producer_seq,
            kind,
            payload,
            ts_micros,
        });
        if self.phase != Phase::Ready {
            // The frame waits in the window and is sent once a session is
            // (re)established and greeted.
            return Ok(0);
        }
        let Self {
            link,
            pending,
            stream,
            producer,
            ..
        } = self;
        match (link.connection(), pending.back()) {
            (Some(conn), Some(frame)) => {
                let stamped = takes_stamps(conn);
                conn.queue(&append(stream, producer, frame, stamped))?;
                Ok(conn.unwritten())
            }
            _ => Ok(0),
        }
    }

    fn window_full(&self, incoming: usize) -> bool {
        !self.pending.is_empty()
            && (self.pending.len() >= self.options.window
                || self.pending_bytes + incoming > self.options.max_unacked_bytes)
    }

    /// Makes sure a ready session is open: connects, greets and, on a new
    /// session, queues every unacknowledged frame again, in order. Each
    /// step is recorded in `phase` before the next await, which keeps this
    /// cancel-safe.
    async fn ensure_session(&mut self) -> Result<()> {
        loop {
            if self.link.establish().await? {
                self.phase = Phase::Fresh;
            }
            match self.phase {
                Phase::Ready => return Ok(()),
                Phase::Fresh => match &self.options.greeting {
                    None => self.become_ready()?,
                    Some(greeting) => {
                        let request = greeting.request.clone();
                        if let Some(conn) = self.link.connection() {
                            conn.queue(&request)?;
                            self.phase = Phase::Greeting;
                        }
                    }
                },
                Phase::Greeting => self.await_greeting().await?,
            }
        }
    }

    /// Writes the queued greeting and waits for its answer.
    async fn await_greeting(&mut self) -> Result<()> {
        let Some(greeting) = &self.options.greeting else {
            return self.become_ready();
        };
        let accepts = greeting.accepts;
        let name = greeting.request.name();
        let Some(conn) = self.link.connection() else {
            return Ok(());
        };
        match await_answer(conn, name, accepts).await {
            Ok(_) => {
                // Being accepted ends the outage, but is not progress: a
                // daemon that takes the greeting and then cannot store
                // (a full disk) must not be asked again at once, over and
                // over. The first frame it acknowledges resets the backoff.
                self.link.recovered();
                self.become_ready()
            }
            Err(Error::Daemon { code, message }) if !code.is_transient() => {
                self.lose(Error::Refused {
                    request: name,
                    code,
                    message,
                })
            }
            Err(e) => self.lose(e),
        }
    }

    /// The session may carry appends: queue every unacknowledged frame.
    fn become_ready(&mut self) -> Result<()> {
        let Self {
            link,
            pending,
            stream,
            producer,
            ..
        } = self;
        if let Some(conn) = link.connection() {
            let stamped = takes_stamps(conn);
            for frame in pending.iter() {
                conn.queue(&append(stream, producer, frame, stamped))?;
            }
            self.phase = Phase::Ready;
            self.sessions += 1;
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
            Err(e) => self.lose(e),
        }
    }

    /// Applies one answer: a cumulative `Appended` releases every frame up
    /// to its producer seq.
    fn absorb(&mut self, response: Response) -> Result<()> {
        if let Response::FlushOutput { token } = response {
            self.flush_asks.push(FlushAsk {
                token,
                session: self.sessions,
            });
            return Ok(());
        }
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
        while let Some(frame) = self.pending.front() {
            if frame.producer_seq > appended.producer_seq {
                break;
            }
            self.pending_bytes -= frame.payload.len();
            self.pending.pop_front();
            released = true;
        }
        self.acked_through = self.acked_through.max(appended.producer_seq);
        if released {
            self.link.progressed();
        }
        Ok(())
    }

    /// Records a lost session; the next session starts with the greeting.
    fn lose(&mut self, cause: Error) -> Result<()> {
        self.phase = Phase::Fresh;
        self.link.lose(cause)
    }
}

/// Writes what is queued and reads answers until one that `accepts` takes.
/// Late acknowledgements of appends are skipped; anything else is a
/// protocol violation.
async fn await_answer(
    conn: &mut Connection,
    request: &str,
    accepts: fn(&Response) -> bool,
) -> Result<Response> {
    loop {
        let response = match conn.flush_or_recv().await? {
            Some(response) => response,
            None => conn.recv().await?,
        };
        if accepts(&response) {
            return Ok(response);
        }
        // An ask to flush output while greeting or finishing goes
        // unanswered: the daemon waits for it only so long.
        if !matches!(
            response,
            Response::Appended(_) | Response::FlushOutput { .. }
        ) {
            return Err(Error::Protocol(format!(
                "unexpected {} in answer to {request}",
                response.name()
            )));
        }
    }
}

/// Whether the daemon of `conn` takes [`Request::AppendStamped`].
fn takes_stamps(conn: &Connection) -> bool {
    conn.hello()
        .capabilities
        .contains(Capabilities::APPEND_STAMPED)
}

/// The request that sends `frame`: stamped with its time when it has one
/// and the daemon takes it (`stamped`), else a plain append.
fn append(stream: &str, producer: &str, frame: &Unacked, stamped: bool) -> Request {
    if let (Some(ts_micros), true) = (frame.ts_micros, stamped) {
        return Request::AppendStamped(AppendStamped {
            stream: stream.to_owned(),
            producer: producer.to_owned(),
            producer_seq: frame.producer_seq,
            kind: frame.kind,
            payload: frame.payload.clone(),
            ts_micros,
        });
    }
    Request::Append(Append {
        stream: stream.to_owned(),
        producer: producer.to_owned(),
        producer_seq: frame.producer_seq,
        kind: frame.kind,
        payload: frame.payload.clone(),
    })
}

/// The largest payload whose `Append` still fits in one frame, computed
/// from the encoding of an empty one with the widest producer seq, and
/// that the daemon takes (see [`tether_protocol::FRAME_ENVELOPE`]).
fn max_payload(stream: &str, producer: &str, connector: &Connector) -> Result<usize> {
    let mut buf = BytesMut::new();
    let empty = Unacked {
        producer_seq: u64::MAX,
        kind: FrameKind::Data,
        payload: Bytes::new(),
        ts_micros: Some(u64::MAX),
    };
    // Stamped with the widest time: the longer of the two requests.
    encode_into(
        &append(stream, producer, &empty, true),
        &mut buf,
        usize::MAX,
    )?;
    // The buffer holds the 4-byte length prefix, then the body whose last
    // byte is the empty payload's length varint. Every kind encodes as one
    // byte, so the kind does not change the overhead.
    let overhead = buf.len().saturating_sub(4 + 1) + MAX_LEN_VARINT;
    let max_frame = connector.options().max_frame_len;
    let fits = max_frame.checked_sub(overhead).ok_or_else(|| {
        Error::Usage(format!(
            "a maximum frame length of {max_frame} bytes leaves no room for a payload"
        ))
    })?;
    // The daemon takes payloads of the maximum less a fixed envelope
    // whatever the names, so that it can deliver each in one message.
    Ok(fits.min(max_payload_len(max_frame)))
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
        let big = Unacked {
            producer_seq: u64::MAX,
            kind: FrameKind::Stderr,
            payload: Bytes::from(vec![b'x'; max]),
            ts_micros: Some(u64::MAX),
        };
        encode_into(&append("s", "p", &big, true), &mut buf, 4096).unwrap();
        // What the daemon takes: the maximum less the fixed envelope.
        assert_eq!(max, 4096 - tether_protocol::FRAME_ENVELOPE);
    }

    #[test]
    fn invalid_names_are_refused_up_front() {
        let connector = Connector::new(Endpoint::unix("/unused"), ConnectOptions::default());
        let err =
            Publisher::new(connector, "has space", "p", PublisherOptions::default()).unwrap_err();
        assert!(err.to_string().contains("whitespace"), "{err}");
    }
}
