//! Reading a session's requests off its socket, with appends read in place.
//!
//! Appends come by the thousand with the same stream and producer. Decoded
//! one by one into [`tether_protocol::Append`] each would cost three
//! allocations (two names and a payload). Instead [`SessionCodec`] takes
//! every complete append already buffered as one batch: each read in place
//! ([`AppendView`]), names shared as `Arc<str>` with the append before it,
//! and payloads copied into one buffer per run of one stream, which the
//! frames then slice.
//!
//! One buffer per run, not per batch and not the read buffer itself: a
//! live frame held by a slow follower keeps its whole buffer alive, and
//! follower budgets count payload bytes. A buffer holding only its own
//! stream's frames of one batch keeps what a held frame pins to that
//! batch's frames of the stream the follower reads.
//!
//! Since nothing decoded points into the bytes read, sessions need no read
//! buffer of their own: [`SessionReader`] reads into one buffer per thread,
//! decodes everything complete in it, and keeps only an incomplete last
//! frame. Reads can then be large (far fewer reads and wakeups per frame
//! for a busy producer) while a thousand idle sessions cost nothing.
//!
//! What a peer declares is not trusted beyond the frame limit: a frame
//! that does not arrive within one read grows its session's buffer only
//! with what arrives, is counted in the [`PartialBudget`] shared by every
//! session, and must keep arriving ([`STALL_TIMEOUT`]). A peer that may not
//! send a request of the kind a frame begins with is refused as soon as
//! that kind has arrived, before the rest of its body is read.

mod budget;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tether_protocol::codec::{
    complete_frame_len, declared_frame_len, decode_any_append_view, decode_wire_message, peek_kind,
    reserve_for_frame, truncated, PREFIX_LEN,
};
use tether_protocol::{
    validate_name, Append, AppendStamped, AppendView, Error, FrameKind, Request,
};
use tokio::net::unix::OwnedReadHalf;
use tokio::time::{Instant, Sleep};
use tokio_util::codec::Decoder;

pub use budget::{Charge, PartialBudget, DEFAULT_MAX_PARTIAL_BYTES};

use crate::access::{Access, Peer};

/// Appends taken from the buffer at once. A session gathers several such
/// batches into one for the writer; these bound what one adds to it.
const MAX_BATCH_FRAMES: usize = 1024;
/// Payload bytes taken from the buffer at once (plus one frame).
const MAX_BATCH_BYTES: usize = 16 * 1024;

/// One append on its way to the writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngestAppend {
    /// Shared with the other appends of the session to the same stream.
    pub stream: Arc<str>,
    /// Shared like `stream`.
    pub producer: Arc<str>,
    pub producer_seq: u64,
    pub kind: FrameKind,
    /// A slice of a buffer shared with the other appends of its run.
    pub payload: Bytes,
    /// When the producer read the frame (an `AppendStamped`); `None` for a
    /// plain append, stamped with the daemon's time of the commit.
    pub ts_micros: Option<u64>,
}

impl From<Append> for IngestAppend {
    fn from(a: Append) -> Self {
        Self {
            stream: a.stream.into(),
            producer: a.producer.into(),
            producer_seq: a.producer_seq,
            kind: a.kind,
            payload: a.payload,
            ts_micros: None,
        }
    }
}

impl From<AppendStamped> for IngestAppend {
    fn from(a: AppendStamped) -> Self {
        Self {
            stream: a.stream.into(),
            producer: a.producer.into(),
            producer_seq: a.producer_seq,
            kind: a.kind,
            payload: a.payload,
            ts_micros: Some(a.ts_micros),
        }
    }
}

impl IngestAppend {
    /// Whether `other` comes from the same producer to the same stream.
    /// (`Arc`'s `==` compares pointers first: shared names cost nothing.)
    pub fn same_writer(&self, other: &Self) -> bool {
        self.stream == other.stream && self.producer == other.producer
    }
}

/// Checks the stream and producer names of a batch, and that no append is
/// of the kind only the daemon writes. A name shared with the append before
/// it was checked with that one.
pub fn validate(appends: &[IngestAppend]) -> Result<(), Error> {
    let mut previous: Option<&IngestAppend> = None;
    for a in appends {
        if a.kind.is_reserved() {
            return Err(Error::ReservedKind {
                kind: a.kind.as_str(),
            });
        }
        if previous.is_none_or(|p| p.stream != a.stream) {
            validate_name("stream", &a.stream)?;
        }
        if previous.is_none_or(|p| p.producer != a.producer) {
            validate_name("producer", &a.producer)?;
        }
        previous = Some(a);
    }
    Ok(())
}

/// What a session reads: a batch of appends, or any other request.
// One `Incoming` lives at a time per session, moved straight into
// dispatch, so the size of `Request`'s largest variant (a run spec) costs
// nothing worth an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Incoming {
    /// Never empty.
    Appends(Vec<IngestAppend>),
    Request(Request),
}

/// The daemon's side of a session: decodes [`Incoming`] (and, unlike
/// [`tether_protocol::ServerCodec`], batches appends; see the module doc).
/// The end of the stream is [`SessionReader`]'s to judge.
#[derive(Debug)]
pub struct SessionCodec {
    max_frame_len: usize,
    /// The newest stream and producer names, handed out again while the
    /// appends keep naming them.
    stream: Option<Arc<str>>,
    producer: Option<Arc<str>>,
}

impl SessionCodec {
    pub fn new(max_frame_len: usize) -> Self {
        Self {
            max_frame_len: max_frame_len.min(u32::MAX as usize),
            stream: None,
            producer: None,
        }
    }

    /// The appends at the front of `src`, read in place, and how many
    /// bytes they took. Stops before the first frame that is incomplete,
    /// is not an append or is bad: the next call starts with it (so a bad
    /// frame fails on its own, after the good ones before it are served).
    fn views<'a>(&self, src: &'a [u8]) -> Result<(Vec<Stamped<'a>>, usize), Error> {
        let mut views = Vec::new();
        let (mut taken, mut bytes) = (0, 0);
        while views.len() < MAX_BATCH_FRAMES && bytes < MAX_BATCH_BYTES {
            match next_append(&src[taken..], self.max_frame_len) {
                Ok(Some((view, len))) => {
                    bytes += view.0.payload.len();
                    taken += len;
                    views.push(view);
                }
                Ok(None) => break,
                Err(e) if views.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok((views, taken))
    }

    /// Owned appends from `views`: names shared, payloads copied into one
    /// buffer per run of one stream.
    fn own(&mut self, views: &[Stamped<'_>]) -> Vec<IngestAppend> {
        let mut appends = Vec::with_capacity(views.len());
        let mut rest = views;
        while let Some((first, _)) = rest.first() {
            let run_len = rest
                .iter()
                .position(|(v, _)| v.stream != first.stream)
                .unwrap_or(rest.len());
            let (run, after) = rest.split_at(run_len);
            rest = after;
            let mut buffer =
                BytesMut::with_capacity(run.iter().map(|(v, _)| v.payload.len()).sum());
            for (v, _) in run {
                buffer.extend_from_slice(v.payload);
            }
            let mut payloads = buffer.freeze();
            for &(v, ts_micros) in run {
                appends.push(IngestAppend {
                    stream: shared(&mut self.stream, v.stream),
                    producer: shared(&mut self.producer, v.producer),
                    producer_seq: v.producer_seq,
                    kind: v.kind,
                    payload: payloads.split_to(v.payload.len()),
                    ts_micros,
                });
            }
        }
        appends
    }
}

/// An append read in place, with its producer's time when it was stamped.
type Stamped<'a> = (AppendView<'a>, Option<u64>);

/// The append (plain or stamped) at the front of `src` and its length on
/// the wire; `Ok(None)` when the first frame is incomplete or is another
/// request.
fn next_append(src: &[u8], max_frame_len: usize) -> Result<Option<(Stamped<'_>, usize)>, Error> {
    let Some(len) = complete_frame_len(src, max_frame_len)? else {
        return Ok(None);
    };
    Ok(decode_any_append_view(&src[PREFIX_LEN..len])?.map(|view| (view, len)))
}

/// `name` as the `Arc` in `newest` when it is that name; otherwise as a new
/// one, which becomes the newest.
fn shared(newest: &mut Option<Arc<str>>, name: &str) -> Arc<str> {
    match newest {
        Some(arc) if **arc == *name => arc.clone(),
        _ => newest.insert(Arc::from(name)).clone(),
    }
}

impl Decoder for SessionCodec {
    type Item = Incoming;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Incoming>, Error> {
        // No reserving for an incomplete frame here: `SessionReader` knows
        // which buffer it will finish in.
        let Some(len) = complete_frame_len(src, self.max_frame_len)? else {
            return Ok(None);
        };
        let (views, taken) = match self.views(src) {
            Ok(read) => read,
            Err(e) => {
                // Consumed whole, like the protocol's decoder does, so the
                // buffer stays on a frame boundary.
                src.advance(len);
                return Err(e);
            }
        };
        if views.is_empty() {
            src.advance(PREFIX_LEN);
            let body = src.split_to(len - PREFIX_LEN);
            return decode_wire_message(&body).map(|r| Some(Incoming::Request(r)));
        }
        let appends = self.own(&views);
        src.advance(taken);
        Ok(Some(Incoming::Appends(appends)))
    }
}

/// What one read from a socket may bring.
const READ_BYTES: usize = 32 * 1024;
/// An incomplete frame up to this size is carried over through the thread's
/// buffer; a longer one is read into the session's own buffer until it is
/// complete, so that a large frame arriving slowly is not copied over and
/// over. Only a longer one counts in the [`PartialBudget`]: this much per
/// session is bounded by the connection limit.
const MAX_CARRIED: usize = 4 * 1024;

/// A session that has sent part of a frame and then nothing for this long
/// is closed. Between frames a session may idle for ever.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

thread_local! {
    /// The read buffer of every session served on this thread.
    static SCRATCH: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// Decoded items a session holds at most. A read of many tiny requests
/// decodes into far more memory than it took on the wire; what is beyond
/// this stays undecoded in the session's own buffer until it is taken.
const MAX_READY: usize = 64;

/// The requests of one session, read off its socket (see the module doc).
#[derive(Debug)]
pub struct SessionReader {
    socket: OwnedReadHalf,
    codec: SessionCodec,
    /// Who sends: a frame of a kind it may not send is refused early.
    peer: Peer,
    /// What `partial` holds beyond [`MAX_CARRIED`], as counted across
    /// sessions.
    charge: Charge,
    /// What was read and not yet decoded: usually nothing, or the start of
    /// a frame that has not all arrived.
    partial: BytesMut,
    /// Decoded and not yet taken, in order.
    ready: VecDeque<Result<Incoming, crate::Error>>,
    /// The client closed its side.
    eof: bool,
    /// A read or a frame failed; the error is the last item in `ready`.
    failed: bool,
    /// Bytes read so far.
    arrived: u64,
    /// When the last bytes arrived that left `partial` holding part of a
    /// frame.
    last_arrival: Instant,
    /// Fires at or after `last_arrival + stall_timeout` while a frame is
    /// partly here. Moved on only when it fires (not at every read), so a
    /// busy session seldom touches the timer.
    stall: Option<Pin<Box<Sleep>>>,
    stall_timeout: Duration,
}

/// What ends a wait for the socket.
enum Woken {
    Readable,
    Failed(io::Error),
    /// Closed to keep partly received messages within the budget.
    Evicted,
    /// The stall timer fired: the session may have stalled.
    Stall,
}

impl SessionReader {
    pub fn new(socket: OwnedReadHalf, codec: SessionCodec, peer: Peer, charge: Charge) -> Self {
        Self {
            socket,
            codec,
            peer,
            charge,
            partial: BytesMut::new(),
            ready: VecDeque::new(),
            eof: false,
            failed: false,
            arrived: 0,
            last_arrival: Instant::now(),
            stall: None,
            stall_timeout: STALL_TIMEOUT,
        }
    }

    /// The next request (or batch of appends); `None` once the client has
    /// closed its side and everything it sent was taken, or after an error.
    /// Cancel-safe: only the wait for the socket to become readable is ever
    /// interrupted.
    pub async fn next(&mut self) -> Option<Result<Incoming, crate::Error>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(item);
            }
            if self.failed {
                return None;
            }
            // Frames left from an earlier read come before any more reading.
            let mut partial = std::mem::take(&mut self.partial);
            self.decode(&mut partial);
            self.partial = partial;
            if !self.ready.is_empty() {
                continue;
            }
            if self.eof {
                if self.partial.is_empty() {
                    return None;
                }
                let e = truncated(&self.partial);
                self.partial.clear();
                self.fail(e.into());
                continue;
            }
            match self.wait().await {
                Woken::Readable => self.read_and_decode(),
                Woken::Failed(e) => self.fail(Error::from(e).into()),
                Woken::Evicted => {
                    let e = self.charge.over(self.charge.held());
                    self.fail(e);
                }
                Woken::Stall => self.stall_check(),
            }
        }
    }

    /// Waits for the socket, for this session to be closed to make room,
    /// or, while a frame is partly here, for the stall timer.
    async fn wait(&mut self) -> Woken {
        let mid_frame = !self.partial.is_empty();
        if mid_frame && self.stall.is_none() {
            let due = self.last_arrival + self.stall_timeout;
            self.stall = Some(Box::pin(tokio::time::sleep_until(due)));
        }
        let stall = &mut self.stall;
        tokio::select! {
            readable = self.socket.readable() => match readable {
                Ok(()) => Woken::Readable,
                Err(e) => Woken::Failed(e),
            },
            () = self.charge.evicted() => Woken::Evicted,
            () = fired(stall), if mid_frame => Woken::Stall,
        }
    }

    /// The stall timer fired: moves it on if bytes came since it was set;
    /// otherwise reads once more (the session may not have read for a
    /// while, with the bytes waiting), and ends the session if nothing came.
    fn stall_check(&mut self) {
        let due = self.last_arrival + self.stall_timeout;
        if Instant::now() < due {
            if let Some(timer) = &mut self.stall {
                timer.as_mut().reset(due);
            }
            return;
        }
        self.stall = None;
        let before = self.arrived;
        self.read_and_decode();
        if self.arrived == before && !self.failed {
            let expected = declared_frame_len(&self.partial).unwrap_or(PREFIX_LEN);
            self.fail(crate::Error::Stalled {
                received: self.partial.len(),
                expected,
                after: self.stall_timeout,
            });
        }
    }

    /// One read, then what is complete decoded into `ready`.
    fn read_and_decode(&mut self) {
        let before = self.arrived;
        if self.partial.len() > MAX_CARRIED {
            let mut partial = std::mem::take(&mut self.partial);
            // Room for more of the frame (its length was checked against
            // the limit when it started), read in place to its end.
            if let Some(total) = declared_frame_len(&partial) {
                reserve_for_frame(&mut partial, total);
            }
            self.read_into(&mut partial);
            self.partial = partial;
        } else {
            SCRATCH.with_borrow_mut(|scratch| {
                scratch.clear();
                scratch.reserve(READ_BYTES);
                scratch.extend_from_slice(&self.partial);
                if self.partial.capacity() > 2 * MAX_CARRIED {
                    // Left from a large frame: a session idles with no buffer.
                    self.partial = BytesMut::new();
                } else {
                    self.partial.clear();
                }
                self.read_into(scratch);
                self.partial.extend_from_slice(scratch);
            });
        }
        if self.arrived != before && !self.partial.is_empty() {
            self.last_arrival = Instant::now();
        }
        self.count_partial();
    }

    /// Counts what `partial` holds beyond [`MAX_CARRIED`] in the budget.
    fn count_partial(&mut self) {
        let held = match self.partial.len() {
            n if n > MAX_CARRIED => n,
            _ => 0,
        };
        if held != self.charge.held() && !self.failed {
            if let Err(e) = self.charge.set(held) {
                self.fail(e);
            }
        }
    }

    /// Reads into `buffer`, then decodes from it.
    fn read_into(&mut self, buffer: &mut BytesMut) {
        if buffer.len() == buffer.capacity() {
            // A read into no room would read nothing and look like the end.
            buffer.reserve(READ_BYTES);
        }
        match self.socket.try_read_buf(buffer) {
            Ok(0) => self.eof = true,
            Ok(n) => self.arrived += n as u64,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return self.fail(Error::from(e).into()),
        }
        self.decode(buffer);
    }

    /// Decodes the complete frames at the front of `buffer` into `ready`,
    /// while it has room; then judges the kind of a frame left incomplete.
    fn decode(&mut self, buffer: &mut BytesMut) {
        while !self.failed && self.ready.len() < MAX_READY {
            match self.codec.decode(buffer) {
                Ok(Some(item)) => self.ready.push_back(Ok(item)),
                Ok(None) => return self.judge_incomplete(buffer),
                Err(e) => self.fail(e.into()),
            }
        }
    }

    /// Refuses the incomplete frame at the front of `buffer` as soon as its
    /// kind shows that the peer may not send it: its body is never read.
    /// (A complete frame is authorized when it is served.)
    fn judge_incomplete(&mut self, buffer: &[u8]) {
        if self.peer.access == Access::Full || buffer.len() <= PREFIX_LEN {
            return;
        }
        match peek_kind(&buffer[PREFIX_LEN..]) {
            Ok(None) => {}
            Ok(Some(kind)) => {
                if let Err(why) = self.peer.permits_kind(kind) {
                    self.fail(crate::Error::PermissionDenied(why));
                }
            }
            Err(e) => self.fail(e.into()),
        }
    }

    /// Ends the session's requests with `e`, after those decoded before it.
    fn fail(&mut self, e: crate::Error) {
        self.ready.push_back(Err(e));
        self.failed = true;
    }
}

/// Resolves when the timer fires; never without one.
async fn fired(timer: &mut Option<Pin<Box<Sleep>>>) {
    match timer {
        Some(timer) => timer.as_mut().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use futures_util::FutureExt;
    use tether_protocol::codec::encode_frame;

    use super::*;

    fn append(stream: &str, producer: &str, seq: u64, payload: &[u8]) -> Request {
        Request::Append(Append {
            stream: stream.into(),
            producer: producer.into(),
            producer_seq: seq,
            kind: FrameKind::Data,
            payload: Bytes::copy_from_slice(payload),
        })
    }

    fn wire(requests: &[Request]) -> BytesMut {
        let mut src = BytesMut::new();
        for r in requests {
            src.extend_from_slice(&encode_frame(r).unwrap());
        }
        src
    }

    fn appends(incoming: Option<Incoming>) -> Vec<IngestAppend> {
        match incoming {
            Some(Incoming::Appends(a)) => a,
            other => panic!("expected appends, got {other:?}"),
        }
    }

    /// The batch as (stream, producer, producer seq, payload).
    fn fields(batch: &[IngestAppend]) -> Vec<(&str, &str, u64, &[u8])> {
        batch
            .iter()
            .map(|a| (&*a.stream, &*a.producer, a.producer_seq, &a.payload[..]))
            .collect()
    }

    #[test]
    fn buffered_appends_come_as_one_batch_then_the_next_request() {
        let mut src = wire(&[
            append("a", "p", 1, b"one"),
            append("a", "p", 2, b""),
            append("b", "q", 1, b"three"),
            Request::Status,
            append("a", "p", 3, b"four"),
        ]);
        let mut codec = SessionCodec::new(1024);
        let batch = appends(codec.decode(&mut src).unwrap());
        assert_eq!(
            fields(&batch),
            [
                ("a", "p", 1, &b"one"[..]),
                ("a", "p", 2, b""),
                ("b", "q", 1, b"three"),
            ]
        );
        assert!(matches!(
            codec.decode(&mut src).unwrap(),
            Some(Incoming::Request(Request::Status))
        ));
        let batch = appends(codec.decode(&mut src).unwrap());
        assert_eq!(fields(&batch), [("a", "p", 3, &b"four"[..])]);
        assert!(src.is_empty());
        assert!(codec.decode(&mut src).unwrap().is_none());
    }

    /// The point of reading in place: one name per session while it stays
    /// the same, one payload buffer per run of a stream.
    #[test]
    fn names_are_shared_and_payloads_share_one_buffer_per_run() {
        let mut codec = SessionCodec::new(1024);
        let mut src = wire(&[
            append("a", "p", 1, b"xy"),
            append("a", "p", 2, b"z"),
            append("b", "p", 1, b"w"),
        ]);
        let first = appends(codec.decode(&mut src).unwrap());
        let mut src = wire(&[append("b", "p", 2, b"v")]);
        let second = appends(codec.decode(&mut src).unwrap());

        assert!(Arc::ptr_eq(&first[0].stream, &first[1].stream));
        assert!(Arc::ptr_eq(&first[0].producer, &first[2].producer));
        assert!(Arc::ptr_eq(&first[2].stream, &second[0].stream));
        // Stream a's two payloads are neighbours in one buffer; b's is not in it.
        assert_eq!(
            first[0].payload.as_ptr().wrapping_add(2),
            first[1].payload.as_ptr()
        );
        assert_ne!(
            first[1].payload.as_ptr().wrapping_add(1),
            first[2].payload.as_ptr()
        );
    }

    #[test]
    fn an_incomplete_append_waits_for_the_rest() {
        let whole = wire(&[append("a", "p", 1, b"one"), append("a", "p", 2, b"two")]);
        let first_len = encode_frame(&append("a", "p", 1, b"one")).unwrap().len();
        let mut codec = SessionCodec::new(1024);
        let mut src = BytesMut::from(&whole[..whole.len() - 1]);
        assert_eq!(appends(codec.decode(&mut src).unwrap()).len(), 1);
        assert_eq!(src.len(), whole.len() - 1 - first_len);
        assert!(codec.decode(&mut src).unwrap().is_none());
        src.extend_from_slice(&whole[whole.len() - 1..]);
        let batch = appends(codec.decode(&mut src).unwrap());
        assert_eq!(fields(&batch), [("a", "p", 2, &b"two"[..])]);
    }

    /// The good appends before a bad frame are served; the bad frame then
    /// fails on its own, with the error the protocol's decoder gives it.
    #[test]
    fn a_bad_frame_fails_after_the_appends_before_it() {
        let good = encode_frame(&append("a", "p", 1, b"one")).unwrap();
        let mut bad = encode_frame(&append("a", "p", 2, b"two")).unwrap().to_vec();
        bad.push(0);
        let len = u32::try_from(bad.len() - PREFIX_LEN).unwrap();
        bad[..PREFIX_LEN].copy_from_slice(&len.to_be_bytes());
        let mut src = BytesMut::from(&good[..]);
        src.extend_from_slice(&bad);

        let mut codec = SessionCodec::new(1024);
        assert_eq!(appends(codec.decode(&mut src).unwrap()).len(), 1);
        assert_eq!(
            codec.decode(&mut src).unwrap_err().to_string(),
            "malformed message: 1 bytes left over after a Request message"
        );
    }

    #[test]
    fn a_batch_stops_at_its_payload_budget() {
        let payload = vec![b'x'; 1000];
        let requests: Vec<Request> = (1..=40).map(|i| append("a", "p", i, &payload)).collect();
        let mut src = wire(&requests);
        let mut codec = SessionCodec::new(1 << 20);
        let mut sizes = Vec::new();
        while !src.is_empty() {
            sizes.push(appends(codec.decode(&mut src).unwrap()).len());
        }
        let full = MAX_BATCH_BYTES.div_ceil(1000);
        assert_eq!(sizes, [full, full, 40 - 2 * full]);
    }

    #[test]
    fn an_oversized_frame_is_refused_before_it_arrives() {
        let mut src = wire(&[append("a", "p", 1, &[0; 100])]);
        src.truncate(10);
        let err = SessionCodec::new(50).decode(&mut src).unwrap_err();
        assert!(matches!(err, Error::FrameTooLarge { max: 50, .. }), "{err}");
    }

    /// A reader over one end of a socket pair, and the other end.
    fn reader() -> (SessionReader, tokio::net::UnixStream) {
        reader_for(Access::Full, &PartialBudget::new(usize::MAX))
    }

    /// [`reader`] for a peer with `access`, counted in `budget`.
    fn reader_for(
        access: Access,
        budget: &Arc<PartialBudget>,
    ) -> (SessionReader, tokio::net::UnixStream) {
        let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
        let (read_half, _write_half) = ours.into_split();
        let peer = Peer {
            cred: None,
            access,
            user: None,
        };
        // The write half of our end is not needed; dropping it does not
        // shut the socket down.
        let codec = SessionCodec::new(32 << 20);
        (
            SessionReader::new(read_half, codec, peer, budget.charge()),
            theirs,
        )
    }

    /// The start of a 16 MiB append: its prefix, kind and names.
    fn large_append_start() -> Vec<u8> {
        let whole = encode_frame(&append("a", "p", 1, &vec![0; 16 << 20])).unwrap();
        whole[..64].to_vec()
    }

    /// A peer that sends part of a frame and then nothing is cut off after
    /// the stall timeout, saying how much of it arrived.
    #[tokio::test]
    async fn a_frame_that_stops_arriving_ends_the_session() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        reader.stall_timeout = Duration::from_millis(200);
        let start = large_append_start();
        peer.write_all(&start).await.unwrap();
        let err = reader.next().await.unwrap().unwrap_err();
        let expected = declared_frame_len(&start).unwrap();
        assert_eq!(
            err.to_string(),
            format!(
                "the connection sent 64 of the {expected} bytes of a message, then nothing \
                 for 200ms"
            )
        );
        assert!(reader.next().await.is_none());
    }

    /// A peer that idles between frames is not stalled: it is served
    /// whenever it sends again.
    #[tokio::test]
    async fn an_idle_session_between_frames_is_kept() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        reader.stall_timeout = Duration::from_millis(100);
        peer.write_all(&wire(&[Request::Status])).await.unwrap();
        assert!(matches!(
            reader.next().await,
            Some(Ok(Incoming::Request(Request::Status)))
        ));
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            peer.write_all(&wire(&[Request::ListStreams]))
                .await
                .unwrap();
            peer
        });
        assert!(matches!(
            reader.next().await,
            Some(Ok(Incoming::Request(Request::ListStreams)))
        ));
        drop(later.await.unwrap());
    }

    /// A reader that starts an append is refused once the append's kind
    /// has arrived, with the words a whole append would get.
    #[tokio::test]
    async fn a_reader_starting_an_append_is_refused_before_its_body() {
        use tokio::io::AsyncWriteExt;
        let budget = PartialBudget::new(usize::MAX);
        let (mut reader, mut peer) = reader_for(Access::ReadOnly, &budget);
        let start = large_append_start();
        peer.write_all(&start[..PREFIX_LEN + 1]).await.unwrap();
        let err = reader.next().await.unwrap().unwrap_err();
        assert!(matches!(err, crate::Error::PermissionDenied(_)), "{err}");
        let whole = Peer {
            cred: None,
            access: Access::ReadOnly,
            user: None,
        };
        assert_eq!(Err(err.to_string()), whole.permits_appends());
        assert!(reader.next().await.is_none());
    }

    /// A large frame is counted while it arrives, and no longer once it
    /// is complete; a session over the budget is closed.
    #[tokio::test]
    async fn a_large_frame_is_counted_while_it_arrives() {
        use tokio::io::AsyncWriteExt;
        let budget = PartialBudget::new(1 << 20);
        let (mut reader, mut peer) = reader_for(Access::Full, &budget);
        let frame = encode_frame(&append("a", "p", 1, &[7; 100_000])).unwrap();
        peer.write_all(&frame[..50_000]).await.unwrap();
        while budget.used() < 50_000 {
            assert!(reader.next().now_or_never().is_none());
            tokio::task::yield_now().await;
        }
        assert_eq!(budget.used(), 50_000);
        peer.write_all(&frame[50_000..]).await.unwrap();
        let got = appends(reader.next().await.map(Result::unwrap));
        assert_eq!(got[0].payload.len(), 100_000);
        assert_eq!(budget.used(), 0);

        let mut big = budget.charge();
        big.set((1 << 20) - 10_000).unwrap();
        peer.write_all(&frame[..20_000]).await.unwrap();
        let err = reader.next().await.unwrap().unwrap_err();
        assert!(
            matches!(err, crate::Error::OverPartialBudget { held: 20_000, .. }),
            "{err}"
        );
        assert_eq!(budget.used(), (1 << 20) - 10_000);
    }

    /// A frame larger than what is carried over arrives in small pieces,
    /// with appends before and after it: all come out whole and in order.
    #[tokio::test]
    async fn a_large_frame_arriving_in_pieces_is_read_whole() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        let big = vec![7u8; 3 * MAX_CARRIED + 11];
        let bytes = wire(&[
            append("a", "p", 1, b"one"),
            append("a", "p", 2, &big),
            append("a", "p", 3, b"three"),
        ]);
        let writer = tokio::spawn(async move {
            for piece in bytes.chunks(1000) {
                peer.write_all(piece).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            peer
        });
        let mut got = Vec::new();
        while got.len() < 3 {
            got.extend(appends(reader.next().await.map(Result::unwrap)));
        }
        let seqs: Vec<u64> = got.iter().map(|a| a.producer_seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        assert_eq!(&got[1].payload[..], &big[..]);
        assert_eq!(&got[2].payload[..], b"three");
        drop(writer.await.unwrap());
        assert!(reader.next().await.is_none());
    }

    /// What arrived before a client closed inside a frame is served, then
    /// the truncation is named, then nothing more.
    #[tokio::test]
    async fn a_client_closing_inside_a_frame_ends_with_truncated() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        let bytes = wire(&[append("a", "p", 1, b"one"), append("a", "p", 2, b"two")]);
        peer.write_all(&bytes[..bytes.len() - 3]).await.unwrap();
        drop(peer);
        let mut got = Vec::new();
        let err = loop {
            match reader.next().await {
                Some(Ok(item)) => got.extend(appends(Some(item))),
                Some(Err(e)) => break e,
                None => panic!("ended without naming the truncated frame"),
            }
        };
        assert_eq!(fields(&got), [("a", "p", 1, &b"one"[..])]);
        let second = encode_frame(&append("a", "p", 2, b"two")).unwrap();
        assert_eq!(
            err.to_string(),
            truncated(&second[..second.len() - 3]).to_string()
        );
        assert!(reader.next().await.is_none());
    }

    /// Many tiny requests in one read are decoded a few at a time, all
    /// served in order, the rest kept undecoded in the meantime.
    #[tokio::test]
    async fn a_flood_of_tiny_requests_is_decoded_a_few_at_a_time() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        let flood: Vec<Request> = (0..1000)
            .map(|i| match i % 2 {
                0 => Request::Status,
                _ => Request::ListStreams,
            })
            .collect();
        peer.write_all(&wire(&flood)).await.unwrap();
        drop(peer);
        let mut got = Vec::new();
        while let Some(item) = reader.next().await {
            assert!(reader.ready.len() < MAX_READY);
            match item.unwrap() {
                Incoming::Request(r) => got.push(r),
                other => panic!("expected a request, got {other:?}"),
            }
        }
        assert_eq!(got, flood);
    }

    #[tokio::test]
    async fn a_clean_close_between_frames_is_the_end() {
        use tokio::io::AsyncWriteExt;
        let (mut reader, mut peer) = reader();
        peer.write_all(&wire(&[Request::Status])).await.unwrap();
        drop(peer);
        assert!(matches!(
            reader.next().await,
            Some(Ok(Incoming::Request(Request::Status)))
        ));
        assert!(reader.next().await.is_none());
    }

    #[test]
    fn validate_checks_each_new_name() {
        let a = |stream: &str, producer: &str| {
            IngestAppend::from(Append {
                stream: stream.into(),
                producer: producer.into(),
                producer_seq: 1,
                kind: FrameKind::Data,
                payload: Bytes::new(),
            })
        };
        assert!(validate(&[a("s", "p"), a("s", "p")]).is_ok());
        let err = validate(&[a("s", "p"), a("s", "bad name")]).unwrap_err();
        assert!(err.to_string().contains("bad name"), "{err}");
        let err = validate(&[a("", "p")]).unwrap_err();
        assert!(err.to_string().contains("stream"), "{err}");
    }

    #[test]
    fn validate_refuses_the_daemons_own_kind() {
        let append = |kind| {
            IngestAppend::from(Append {
                stream: "s".into(),
                producer: "p".into(),
                producer_seq: 1,
                kind,
                payload: Bytes::new(),
            })
        };
        assert!(validate(&[append(FrameKind::User)]).is_ok());
        let err = validate(&[append(FrameKind::Data), append(FrameKind::Event)]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "frames of kind event are written only by tetherd (lifecycle events, \
             questions and answers); a worker's own events are kind user"
        );
        let err = validate(&[append(FrameKind::Answer)]).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("frames of kind answer are written only"));
    }
}
