//! The tether wire protocol: the messages a client and `tetherd` exchange,
//! and the framing that carries them over a byte stream.
//!
//! * [`frame`] holds the message types. They are pure data: nothing here does
//!   I/O, so the daemon, the CLI, the worker SDK and the fuzzers share them.
//! * [`codec`] is the framing: a big-endian `u32` length prefix followed by a
//!   postcard-encoded message. The maximum frame length is checked before any
//!   buffer is grown for the frame, so a hostile length prefix costs nothing.
//! * [`parts`] joins an answer that came in several messages.
//! * [`error`] is the crate's one error type.
//! * [`paths`] and [`socket_dir`]: where the socket is, and whether its
//!   directory can be trusted; [`inherited`]: descriptors kept from child
//!   processes. Shared by both binaries; the only code of this crate that
//!   touches the operating system.
//!
//! Postcard is not self-describing: the order of enum variants and struct
//! fields *is* the wire format. The golden-byte tests in `tests/golden.rs`
//! freeze it; a change that moves bytes must bump [`PROTOCOL_VERSION`].

pub mod codec;
pub mod error;
pub mod frame;
pub mod inherited;
pub mod parts;
pub mod paths;
pub mod socket_dir;
pub mod time;

pub use codec::{ClientCodec, Codec, ServerCodec};
pub use error::{Error, Result};
pub use frame::*;

/// The protocol version this build speaks. A peer that announces another
/// version in its [`Hello`] is refused with [`ErrorCode::UNSUPPORTED_VERSION`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Default upper bound on one encoded message (length prefix excluded).
pub const DEFAULT_MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// Room a message keeps around a frame's payload: a payload may use the
/// maximum message size less this, so that any message carrying it (an
/// `Append`, with two names of [`MAX_NAME_LEN`] bytes; a `Durable` or `Live`
/// frame delivered to a reader) fits in that maximum too.
pub const FRAME_ENVELOPE: usize = 1024;

/// The largest payload a frame may carry under a maximum message size of
/// `max_frame_len` bytes (see [`FRAME_ENVELOPE`]).
pub fn max_payload_len(max_frame_len: usize) -> usize {
    max_frame_len.saturating_sub(FRAME_ENVELOPE)
}

/// Longest accepted stream, producer or consumer name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Most arguments plus environment variables a run may carry, so that its
/// spec always fits in one message to the daemon and one to the shim.
pub const MAX_RUN_ITEMS: usize = 4096;

/// Most bytes of arguments, environment and directory a run may carry.
pub const MAX_RUN_BYTES: usize = 1024 * 1024;
