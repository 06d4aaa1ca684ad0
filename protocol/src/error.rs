//! The protocol crate's error type.

use std::sync::Arc;

/// Everything that can go wrong while framing or parsing a message, or
/// when judging a socket's directory.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The length prefix announced a frame larger than the configured limit.
    /// Raised before any buffer is grown for it.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },

    /// The byte stream ended in the middle of a frame.
    #[error("truncated frame: the connection ended after {received} of {expected} bytes")]
    Truncated { received: usize, expected: usize },

    /// A complete frame arrived but its bytes are not a valid message.
    #[error("malformed message: {0}")]
    Malformed(postcard::Error),

    /// A message parsed, but bytes were left over after it: the peer and
    /// this build disagree about the message's layout.
    #[error("malformed message: {extra} bytes left over after a {message} message")]
    TrailingBytes { message: &'static str, extra: usize },

    /// The message's type is one this build does not know: the peer is a
    /// newer build that added it.
    #[error(
        "unknown {message} type {kind}: this build knows types 0 to {last}; \
         the peer is newer than this build"
    )]
    UnknownMessage {
        message: &'static str,
        kind: u32,
        last: u32,
    },

    /// A message could not be encoded (for example a payload over the limit).
    #[error("cannot encode message: {0}")]
    Encode(postcard::Error),

    /// A name (stream, producer, consumer) is empty, too long or contains
    /// characters that would make output ambiguous.
    #[error("invalid {what} name {name:?}: {why}")]
    InvalidName {
        what: &'static str,
        name: String,
        why: &'static str,
    },

    /// An append of a kind only the daemon writes.
    #[error(
        "frames of kind {kind} are written only by tetherd (lifecycle events, \
         questions and answers); a worker's own events are kind user"
    )]
    ReservedKind { kind: &'static str },

    /// A part of an answer sent in several messages was followed by a
    /// message that does not continue it.
    #[error("a {part} message was followed by {got}, not the rest of its answer")]
    UnfinishedAnswer {
        part: &'static str,
        got: &'static str,
    },

    /// A socket's directory that must not be used: another user could
    /// put a socket in it (see [`crate::socket_dir`]).
    #[error("refusing socket directory {}: {why}", dir.display())]
    UnsafeSocketDir {
        dir: std::path::PathBuf,
        why: String,
    },

    /// The underlying byte stream failed. Shared, so that the error can
    /// be cloned for everyone waiting on the same stream.
    #[error(transparent)]
    Io(Arc<std::io::Error>),
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

/// Result with the protocol [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
