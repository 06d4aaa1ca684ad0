//! Message types. Pure data: no I/O, no clocks, no allocation policy.
//!
//! A connection carries [`Request`]s from the client and [`Response`]s from
//! the daemon. The first request must be [`Request::Hello`]; the daemon
//! answers [`Response::HelloOk`] or [`Response::Error`]. Those two variants,
//! and the leading `version` field of [`Hello`], keep their positions in every
//! future version so that any two versions can at least refuse each other
//! clearly.
//!
//! Every [`Response::Error`] ends the session: the daemon closes the
//! connection after sending it.

mod checkpoint;
mod gates;
mod mirror;
mod request;
mod response;
mod supervision;

pub use checkpoint::*;
pub use gates::*;
pub use mirror::*;
pub use request::*;
pub use response::*;
pub use supervision::*;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Error, MAX_NAME_LEN};

/// Optional protocol features, announced by the client in [`Hello`] and
/// confirmed (intersected) by the daemon in [`HelloOk`]. Unknown bits are
/// ignored so that newer clients can talk to older daemons.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub struct Capabilities(pub u64);

impl Capabilities {
    /// No optional features.
    pub const NONE: Self = Self(0);
    /// Durable delivery: subscriptions replay from the store and every frame
    /// arrives as [`Response::Durable`] with its seq. Without it a subscriber
    /// gets [`Response::Live`] frames from the moment it subscribed, no replay.
    pub const DURABLE: Self = Self(1 << 0);
    /// The daemon takes [`Request::AppendStamped`]. A producer asks for it
    /// without needing it: granted, it sends its own times; not granted (an
    /// older daemon), plain appends.
    pub const APPEND_STAMPED: Self = Self(1 << 1);
    /// The client takes [`Response::FlushOutput`] on a shim session and
    /// answers it with [`Request::OutputFlushed`]. Asked for by every
    /// client; only a shim's session is ever sent one.
    pub const OUTPUT_FLUSH: Self = Self(1 << 2);
    /// Every capability this build understands.
    pub const ALL: Self = Self(Self::DURABLE.0 | Self::APPEND_STAMPED.0 | Self::OUTPUT_FLUSH.0);

    /// True when every bit of `other` is set in `self`.
    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The capabilities both sides support.
    pub fn intersect(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

/// What produced a frame. Shown by `tether tail --json` as a lowercase word.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A line published with `tether publish` or the client library.
    Data,
    /// A line a supervised worker wrote to stdout.
    Stdout,
    /// A line a supervised worker wrote to stderr.
    Stderr,
    /// A lifecycle event written by the daemon ("started pid 123"); no
    /// client may append one.
    Event,
    /// An event a worker wrote through an SDK (`w.event`), a JSON payload.
    User,
    /// A question was asked (`tether ask`): a JSON object with the
    /// question's id, text, choices, key, default and timeout. The
    /// daemon's alone, as `Event` is.
    Ask,
    /// A question was closed (`tether answer`, or its timeout): a JSON
    /// object with the question's id, the answer and who gave it. The
    /// daemon's alone.
    Answer,
}

impl FrameKind {
    /// The lowercase name used in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Data => "data",
            FrameKind::Stdout => "stdout",
            FrameKind::Stderr => "stderr",
            FrameKind::Event => "event",
            FrameKind::User => "user",
            FrameKind::Ask => "ask",
            FrameKind::Answer => "answer",
        }
    }

    /// True for the kinds only the daemon writes (`event`, `ask`,
    /// `answer`): an append of one is refused.
    pub fn is_reserved(self) -> bool {
        matches!(self, FrameKind::Event | FrameKind::Ask | FrameKind::Answer)
    }

    /// The kind [`FrameKind::as_str`] spells `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Data,
            Self::Stdout,
            Self::Stderr,
            Self::Event,
            Self::User,
            Self::Ask,
            Self::Answer,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == name)
    }
}

/// One stored frame: what a producer appended plus the daemon's timestamp.
/// Its seq travels beside it (in [`Durable`]) rather than inside it, because
/// the seq is the store's key, not part of the value.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// When the daemon accepted the frame, microseconds since the Unix epoch.
    pub ts_micros: u64,
    pub kind: FrameKind,
    pub payload: Bytes,
}

/// A [`Frame`] borrowing its payload: the same bytes on the wire. The
/// daemon writes stored frames this way straight from the store's pages,
/// without building a `Frame` around each payload first; a reader can take
/// one in place from the bytes it read ([`decode_durable_view`]).
///
/// [`decode_durable_view`]: crate::codec::decode_durable_view
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameView<'a> {
    pub ts_micros: u64,
    pub kind: FrameKind,
    /// Written as one byte string, as `Bytes` is (a `&[u8]` on its own
    /// would go byte by byte, to the same bytes, slowly).
    #[serde(serialize_with = "byte_string")]
    pub payload: &'a [u8],
}

impl Frame {
    /// This frame, borrowed.
    pub fn view(&self) -> FrameView<'_> {
        FrameView {
            ts_micros: self.ts_micros,
            kind: self.kind,
            payload: &self.payload,
        }
    }
}

fn byte_string<S: serde::Serializer>(bytes: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(bytes)
}

/// A top-level message of the protocol: an enum whose variant index is the
/// first varint of every frame body. Variants are only ever appended, so a
/// peer that sends an index at or above [`Message::KINDS`] is newer than
/// this build, and is told so rather than that its bytes are malformed.
pub trait Message: serde::de::DeserializeOwned {
    /// How errors name it.
    const NAME: &'static str;
    /// The variant indexes this build knows: `0..KINDS`.
    const KINDS: u32;
}

impl Message for Request {
    const NAME: &'static str = "request";
    const KINDS: u32 = 43;
}

impl Message for Response {
    const NAME: &'static str = "response";
    const KINDS: u32 = 46;
}

/// Checks a stream, producer or consumer name: 1 to [`MAX_NAME_LEN`] bytes,
/// no control characters, no whitespace (so names survive shell and table
/// output unquoted).
pub fn validate_name(what: &'static str, name: &str) -> Result<(), Error> {
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > MAX_NAME_LEN {
        "it is longer than 255 bytes"
    } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        "it contains whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        what,
        name: name.to_owned(),
        why,
    })
}
