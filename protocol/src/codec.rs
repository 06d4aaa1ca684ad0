//! Length-delimited framing for postcard messages.
//!
//! Each frame is a big-endian `u32` length followed by that many bytes of one
//! postcard-encoded message. The decoder reads the prefix, refuses a length
//! over the limit *before* growing its buffer, waits for the rest (an
//! incomplete frame is `Ok(None)`, not an error), growing its buffer only
//! as the rest arrives, and only then parses.

use std::marker::PhantomData;

use bytes::{Buf, BufMut, BytesMut};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio_util::codec::{Decoder, Encoder};

use crate::{
    AppendStampedView, AppendView, Error, FrameView, Message, Request, Response,
    DEFAULT_MAX_FRAME_LEN,
};

/// Encodes `Out` and decodes `In`, each as one length-delimited frame.
#[derive(Debug)]
pub struct Codec<In, Out> {
    max_frame_len: usize,
    _types: PhantomData<fn(Out) -> In>,
}

/// The client's side: sends [`Request`], receives [`Response`].
pub type ClientCodec = Codec<Response, Request>;
/// The daemon's side: sends [`Response`], receives [`Request`].
pub type ServerCodec = Codec<Request, Response>;

impl<In, Out> Codec<In, Out> {
    /// A codec with the default maximum frame length.
    pub fn new() -> Self {
        Self::with_max_frame_len(DEFAULT_MAX_FRAME_LEN)
    }

    /// A codec that refuses frames longer than `max_frame_len` bytes.
    pub fn with_max_frame_len(max_frame_len: usize) -> Self {
        Self {
            max_frame_len: max_frame_len.min(u32::MAX as usize),
            _types: PhantomData,
        }
    }

    /// The largest frame this codec accepts or produces.
    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }
}

impl<In, Out> Default for Codec<In, Out> {
    fn default() -> Self {
        Self::new()
    }
}

impl<In, Out> Clone for Codec<In, Out> {
    fn clone(&self) -> Self {
        Self::with_max_frame_len(self.max_frame_len)
    }
}

impl<In: Message, Out> Decoder for Codec<In, Out> {
    type Item = In;
    type Error = Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, Error> {
        let Some(len) = poll_frame(src, self.max_frame_len)? else {
            return Ok(None);
        };
        src.advance(PREFIX_LEN);
        let body = src.split_to(len - PREFIX_LEN);
        decode_wire_message(&body).map(Some)
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<In>, Error> {
        if let Some(item) = self.decode(src)? {
            return Ok(Some(item));
        }
        match src.is_empty() {
            true => Ok(None),
            false => Err(truncated(src)),
        }
    }
}

/// The bytes in front of every frame body: its length, a big-endian `u32`.
pub const PREFIX_LEN: usize = 4;

/// The length of the first frame in `src`, prefix included, once all of it
/// is there; `Ok(None)` while it is not. A length over `max` is refused
/// before anything else, so a peer cannot make the reader wait for (or
/// grow a buffer to) more than `max` bytes.
pub fn complete_frame_len(src: &[u8], max: usize) -> Result<Option<usize>, Error> {
    let Some(total) = declared_frame_len(src) else {
        return Ok(None);
    };
    let len = total - PREFIX_LEN;
    if len > max {
        return Err(Error::FrameTooLarge { len, max });
    }
    Ok((src.len() >= total).then_some(total))
}

/// The length, prefix included, that the first frame in `src` says it has
/// (not checked against any limit); `None` until its prefix has arrived.
pub fn declared_frame_len(src: &[u8]) -> Option<usize> {
    let prefix = src.get(..PREFIX_LEN)?;
    let mut len_bytes = [0u8; PREFIX_LEN];
    len_bytes.copy_from_slice(prefix);
    Some(PREFIX_LEN + u32::from_be_bytes(len_bytes) as usize)
}

/// [`complete_frame_len`] for a decoder's buffer: while the frame is
/// incomplete, makes room for more of it with [`reserve_for_frame`].
pub fn poll_frame(src: &mut BytesMut, max: usize) -> Result<Option<usize>, Error> {
    let complete = complete_frame_len(src, max)?;
    if complete.is_none() {
        if let Some(total) = declared_frame_len(src) {
            reserve_for_frame(src, total);
        }
    }
    Ok(complete)
}

/// The least a buffer holding part of a frame grows by: a few reads' worth.
const MIN_GROWTH: usize = 32 * 1024;

/// Makes room in `src`, which holds the start of a frame of `total` bytes
/// (prefix included) and nothing after it, once it has no room left: as
/// much again as has arrived (at least `MIN_GROWTH`), never past the
/// frame's end. So memory follows what the peer has sent, not what it
/// declared, while a large frame is copied only a few times as it grows
/// (each byte about once on average). A small frame gets room for all of
/// itself at once, and is read in one go.
pub fn reserve_for_frame(src: &mut BytesMut, total: usize) {
    if src.capacity() > src.len() || src.capacity() >= total {
        return;
    }
    let step = src.len().max(MIN_GROWTH);
    let target = total.min(src.len().saturating_add(step));
    // Room already allocated before the frame (frames taken from the front
    // of a read buffer leave it) is used first, as a plain `reserve` would.
    if src.try_reclaim(target - src.len()) {
        return;
    }
    // Otherwise a buffer of exactly this size: `reserve` may round up to
    // twice the old one, which could pass the frame's end.
    let mut grown = BytesMut::with_capacity(target);
    grown.extend_from_slice(src);
    *src = grown;
}

/// The variant index a message body starts with (see [`Message`]), once
/// its bytes have arrived: `Ok(None)` while they have not all, an error
/// when they are no varint at all. Lets a reader judge a message by its
/// kind before the rest of it arrives.
pub fn peek_kind(body: &[u8]) -> Result<Option<u32>, Error> {
    match postcard::take_from_bytes::<u32>(body) {
        Ok((kind, _)) => Ok(Some(kind)),
        Err(postcard::Error::DeserializeUnexpectedEnd) => Ok(None),
        Err(e) => Err(Error::Malformed(e)),
    }
}

/// The error for a stream that ended inside a frame (`src` holds what
/// arrived of it): names how much of it arrived.
pub fn truncated(src: &[u8]) -> Error {
    Error::Truncated {
        received: src.len(),
        expected: declared_frame_len(src).unwrap_or(PREFIX_LEN),
    }
}

impl<In, Out: Serialize> Encoder<Out> for Codec<In, Out> {
    type Error = Error;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), Error> {
        encode_into(&item, dst, self.max_frame_len)
    }
}

/// Parses one message body (without its length prefix). The whole body
/// must be the message: bytes left over mean a layout this build does not
/// know, which must not pass for the message it happens to begin with.
pub fn decode_message<T: DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    take_whole(body, short_type_name::<T>)
}

/// `body` parsed as one `T`, which must take all of it; `message` says how a
/// refusal of leftover bytes names it. A function, because working the name
/// out costs a string search that every frame would otherwise pay.
fn take_whole<'a, T: Deserialize<'a>>(
    body: &'a [u8],
    message: fn() -> &'static str,
) -> Result<T, Error> {
    let (value, rest) = postcard::take_from_bytes(body).map_err(Error::Malformed)?;
    if !rest.is_empty() {
        return Err(Error::TrailingBytes {
            message: message(),
            extra: rest.len(),
        });
    }
    Ok(value)
}

/// Parses one [`Message`] body, like [`decode_message`], and names an
/// unknown message type as such.
pub fn decode_wire_message<T: Message>(body: &[u8]) -> Result<T, Error> {
    decode_message(body).map_err(|e| match e {
        Error::Malformed(_) => unknown_kind::<T>(body).unwrap_or(e),
        e => e,
    })
}

/// Reads a [`Request`] body in place when it is an `Append`, with the same
/// checks as [`decode_wire_message`]; `Ok(None)` when it is any other
/// request (or no request at all), which that function then decodes.
pub fn decode_append_view(body: &[u8]) -> Result<Option<AppendView<'_>>, Error> {
    match postcard::take_from_bytes::<u32>(body) {
        Ok((Request::APPEND_KIND, rest)) => take_whole(rest, short_type_name::<Request>).map(Some),
        _ => Ok(None),
    }
}

/// [`decode_append_view`] for both kinds of append: an `Append`, or an
/// `AppendStamped` with its time. `Ok(None)` for any other request.
pub fn decode_any_append_view(body: &[u8]) -> Result<Option<(AppendView<'_>, Option<u64>)>, Error> {
    match postcard::take_from_bytes::<u32>(body) {
        Ok((Request::APPEND_KIND, rest)) => {
            take_whole(rest, short_type_name::<Request>).map(|view| Some((view, None)))
        }
        Ok((Request::APPEND_STAMPED_KIND, rest)) => take_whole(rest, short_type_name::<Request>)
            .map(|view: AppendStampedView<'_>| Some((view.append(), Some(view.ts_micros)))),
        _ => Ok(None),
    }
}

/// Reads a [`Response`] body in place when it is a `Durable`: its seq and
/// its frame, the payload borrowed from `body`. `Ok(None)` when it is any
/// other response, which [`decode_wire_message`] then decodes. For a reader
/// that looks at each frame once and keeps none of them.
pub fn decode_durable_view(body: &[u8]) -> Result<Option<(u64, FrameView<'_>)>, Error> {
    match postcard::take_from_bytes::<u32>(body) {
        Ok((Response::DURABLE_KIND, rest)) => {
            take_whole(rest, short_type_name::<Response>).map(Some)
        }
        _ => Ok(None),
    }
}

/// [`Error::UnknownMessage`] when the body starts with a variant index
/// this build does not know.
fn unknown_kind<T: Message>(body: &[u8]) -> Option<Error> {
    let (kind, _): (u32, &[u8]) = postcard::take_from_bytes(body).ok()?;
    (kind >= T::KINDS).then(|| Error::UnknownMessage {
        message: T::NAME,
        kind,
        last: T::KINDS - 1,
    })
}

/// `Request` for `tether_protocol::frame::Request`: what an error names.
fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    full.rsplit("::").next().unwrap_or(full)
}

/// Appends `item` to `dst` as one frame (prefix and body). On error `dst` is
/// left as it was.
pub fn encode_into<T: Serialize>(item: &T, dst: &mut BytesMut, max: usize) -> Result<(), Error> {
    let start = dst.len();
    dst.put_u32(0);
    if let Err(e) = postcard::serialize_with_flavor(item, Append(dst)) {
        dst.truncate(start);
        return Err(Error::Encode(e));
    }
    let len = dst.len() - start - PREFIX_LEN;
    if len > max {
        dst.truncate(start);
        return Err(Error::FrameTooLarge { len, max });
    }
    // `len <= max <= u32::MAX` was checked above.
    dst[start..start + PREFIX_LEN].copy_from_slice(&(len as u32).to_be_bytes());
    Ok(())
}

/// The length of `item`'s encoding, without its length prefix, worked out
/// without writing it anywhere: for splitting an answer into messages that
/// each fit the maximum.
pub fn encoded_len<T: Serialize + ?Sized>(item: &T) -> Result<usize, Error> {
    postcard::serialize_with_flavor(item, Count(0)).map_err(Error::Encode)
}

/// A postcard flavor that only counts the bytes.
struct Count(usize);

impl postcard::ser_flavors::Flavor for Count {
    type Output = usize;

    fn try_push(&mut self, _: u8) -> postcard::Result<()> {
        self.0 += 1;
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0 += bytes.len();
        Ok(())
    }

    fn finalize(self) -> postcard::Result<usize> {
        Ok(self.0)
    }
}

/// postcard's output straight into a `BytesMut`: a varint or a payload is
/// one `extend_from_slice`, not a trip through `io::Write`.
struct Append<'a>(&'a mut BytesMut);

impl postcard::ser_flavors::Flavor for Append<'_> {
    type Output = ();

    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.put_u8(byte);
        Ok(())
    }

    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        self.0.extend_from_slice(bytes);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// Appends `Response::Durable(Durable { seq, frame })` as one frame, the
/// frame borrowed: the same bytes as [`encode_into`] gives for the owned
/// response.
pub fn encode_durable(seq: u64, frame: FrameView<'_>, dst: &mut BytesMut) -> Result<(), Error> {
    // An enum variant is its index, then its fields.
    encode_into(
        &(Response::DURABLE_KIND, seq, frame),
        dst,
        u32::MAX as usize,
    )
}

/// Appends `Request::Append` as one frame, its names and payload borrowed:
/// the same bytes as [`encode_into`] gives for the owned request.
pub fn encode_append(append: AppendView<'_>, dst: &mut BytesMut, max: usize) -> Result<(), Error> {
    encode_into(&(Request::APPEND_KIND, append), dst, max)
}

/// Appends `Response::Live(frame)` as one frame, like [`encode_durable`].
pub fn encode_live(frame: FrameView<'_>, dst: &mut BytesMut) -> Result<(), Error> {
    encode_into(&(Response::LIVE_KIND, frame), dst, u32::MAX as usize)
}

/// Reads just the protocol version from a `Hello` body, even when the rest
/// of it is in a layout this build does not know. Returns `None` when the
/// body is not a `Hello` at all.
pub fn peek_hello_version(body: &[u8]) -> Option<u32> {
    // Variant 0 (`Hello`) is a single varint 0, then `version` as a varint.
    let (variant, rest): (u32, &[u8]) = postcard::take_from_bytes(body).ok()?;
    if variant != 0 {
        return None;
    }
    let (version, _): (u32, &[u8]) = postcard::take_from_bytes(rest).ok()?;
    Some(version)
}

/// Convenience for tests and tools: one message as a standalone frame.
pub fn encode_frame<T: Serialize>(item: &T) -> Result<BytesMut, Error> {
    let mut buf = BytesMut::new();
    encode_into(item, &mut buf, u32::MAX as usize)?;
    Ok(buf)
}

// Keep the aliases honest: both directions must be encodable and decodable.
const _: fn() = || {
    fn assert_codec<T: Decoder + Encoder<U>, U>() {}
    assert_codec::<ClientCodec, Request>();
    assert_codec::<ServerCodec, Response>();
};
