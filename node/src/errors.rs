//! The client library's errors as napi errors tagged with the class the
//! JavaScript layer throws.
//!
//! Node-API errors carry a fixed set of status codes, so the class rides in
//! the message: `tether:NotFound|no such stream "s"`. `index.js` strips the
//! tag and throws `NotFound("no such stream \"s\"")`; nothing else ever
//! sees a tagged message.

use tether::Error as E;
use tether_protocol::ErrorCode;

/// The class an error is thrown as in JavaScript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The base class, `TetherError`.
    Base,
    NotFound,
    Unreachable,
    Refused,
    Storage,
    Protocol,
    /// A bad argument: thrown as `TypeError`/`RangeError` by `index.js`.
    Argument,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::Base => "TetherError",
            Class::NotFound => "NotFound",
            Class::Unreachable => "Unreachable",
            Class::Refused => "Refused",
            Class::Storage => "StorageError",
            Class::Protocol => "ProtocolError",
            Class::Argument => "Argument",
        }
    }
}

/// A napi error of `class` saying `message`.
pub fn tagged(class: Class, message: impl std::fmt::Display) -> napi::Error {
    napi::Error::from_reason(format!("tether:{}|{message}", class.name()))
}

/// A bad argument.
pub fn argument(message: impl std::fmt::Display) -> napi::Error {
    tagged(Class::Argument, message)
}

/// A client library error, its message the error's own.
pub fn to_napi(e: E) -> napi::Error {
    tagged(class_of(&e), &e)
}

/// A worker SDK error.
pub fn worker_to_napi(e: tether::WorkerError) -> napi::Error {
    match e {
        tether::WorkerError::Client(e) => to_napi(e),
        other => tagged(Class::Base, other),
    }
}

/// The same mapping as the Python SDK's (`python/src/errors.rs`).
fn class_of(e: &E) -> Class {
    if let Some(code) = e.daemon_code() {
        return match code {
            ErrorCode::NOT_FOUND => Class::NotFound,
            ErrorCode::STORAGE | ErrorCode::STORAGE_FULL => Class::Storage,
            ErrorCode::UNSUPPORTED_VERSION
            | ErrorCode::MALFORMED
            | ErrorCode::FRAME_TOO_LARGE
            | ErrorCode::HELLO_REQUIRED => Class::Protocol,
            _ => Class::Refused,
        };
    }
    match e {
        // Nothing was exchanged with a daemon: none could be reached (or
        // trusted), or the session was lost for good.
        E::Unreachable { .. }
        | E::CannotConnect { .. }
        | E::Untrusted(_)
        | E::Io { .. }
        | E::Closed { .. }
        | E::Timeout { .. } => Class::Unreachable,
        E::GaveUp { cause, .. } => class_of(cause),
        E::Codec(_) | E::Protocol(_) | E::Resync { .. } => Class::Protocol,
        _ => Class::Base,
    }
}
