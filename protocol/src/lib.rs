//! The tether wire protocol: the messages a client and `tetherd` exchange,
//! and the framing that carries them over a byte stream.
//!
//! * [`frame`] holds the message types. They are pure data: nothing here does
//!   I/O, so the daemon, the CLI, the worker SDK and the fuzzers share them.
//! * [`codec`] is the framing: a big-endian `u32` length prefix followed by a
//!   postcard-encoded message. The maximum frame length is checked before any
//!   buffer is grown for the frame, so a hostile length prefix costs nothing.
//! * [`error`] is the crate's one error type.
//!
//! Postcard is not self-describing: the order of enum variants and struct
//! fields *is* the wire format. The golden-byte tests in `tests/golden.rs`
//! freeze it; a change that moves bytes must bump [`PROTOCOL_VERSION`].

pub mod codec;
pub mod error;
pub mod frame;
pub mod paths;
pub mod time;

pub use codec::{ClientCodec, Codec, ServerCodec};
pub use error::{Error, Result};
pub use frame::*;

/// The protocol version this build speaks. A peer that announces another
/// version in its [`Hello`] is refused with [`ErrorCode::UNSUPPORTED_VERSION`].
pub const PROTOCOL_VERSION: u32 = 1;

/// Default upper bound on one encoded message (length prefix excluded).
pub const DEFAULT_MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// Longest accepted stream, producer or consumer name, in bytes.
pub const MAX_NAME_LEN: usize = 255;
