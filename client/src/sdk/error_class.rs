//! [`ErrorClass`]: which exception an SDK raises for an error, so that
//! Python and Node name the same failure the same way.

use tether_protocol::ErrorCode;

use crate::error::Error;
use crate::worker::Error as WorkerError;

/// The SDKs' exception classes (all under one base class, `Error` in
/// Python and `TetherError` in Node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// No such stream, execution, checkpoint or step.
    NotFound,
    /// No daemon could be reached (or trusted) within the retry window.
    Unreachable,
    /// The daemon refused the request.
    Refused,
    /// The daemon could not store (a full or failing disk).
    Storage,
    /// The daemon sent something the protocol does not allow.
    Protocol,
    /// Anything else (a misuse, a local file).
    Other,
}

impl ErrorClass {
    /// The class of a client library error.
    pub fn of(e: &Error) -> Self {
        if let Some(code) = e.daemon_code() {
            return match code {
                ErrorCode::NOT_FOUND => Self::NotFound,
                ErrorCode::STORAGE | ErrorCode::STORAGE_FULL => Self::Storage,
                ErrorCode::UNSUPPORTED_VERSION
                | ErrorCode::MALFORMED
                | ErrorCode::FRAME_TOO_LARGE
                | ErrorCode::HELLO_REQUIRED => Self::Protocol,
                _ => Self::Refused,
            };
        }
        match e {
            // Nothing was exchanged with a daemon: none could be reached
            // (or trusted), or the session was lost for good.
            Error::Unreachable { .. }
            | Error::CannotConnect { .. }
            | Error::Untrusted(_)
            | Error::Io { .. }
            | Error::Closed { .. }
            | Error::Timeout { .. } => Self::Unreachable,
            Error::GaveUp { cause, .. } => Self::of(cause),
            Error::Codec(_) | Error::Protocol(_) | Error::Resync { .. } => Self::Protocol,
            _ => Self::Other,
        }
    }

    /// The class of a worker SDK error: the crate's error, so as
    /// [`ErrorClass::of`].
    pub fn of_worker(e: &WorkerError) -> Self {
        Self::of(e)
    }

    /// The class's name in both SDKs (`NotFound`, `StorageError`, ...),
    /// `Error` for [`ErrorClass::Other`].
    pub fn name(self) -> &'static str {
        match self {
            Self::NotFound => "NotFound",
            Self::Unreachable => "Unreachable",
            Self::Refused => "Refused",
            Self::Storage => "StorageError",
            Self::Protocol => "ProtocolError",
            Self::Other => "Error",
        }
    }
}
