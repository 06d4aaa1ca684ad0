//! The client library's errors as Python exceptions.

use pyo3::PyErr;
use tether::Error as E;
use tether_protocol::ErrorCode;

use crate::{Error, NotFound, ProtocolError, Refused, StorageError, Unreachable};

/// The exception for a client library error, its message the error's own.
pub fn to_py(e: E) -> PyErr {
    let message = e.to_string();
    match class_of(&e) {
        Class::NotFound => NotFound::new_err(message),
        Class::Unreachable => Unreachable::new_err(message),
        Class::Refused => Refused::new_err(message),
        Class::Storage => StorageError::new_err(message),
        Class::Protocol => ProtocolError::new_err(message),
        Class::Other => Error::new_err(message),
    }
}

/// A worker SDK error as an exception.
pub fn worker_to_py(e: tether::WorkerError) -> PyErr {
    match e {
        tether::WorkerError::Client(e) => to_py(e),
        other => Error::new_err(other.to_string()),
    }
}

enum Class {
    NotFound,
    Unreachable,
    Refused,
    Storage,
    Protocol,
    Other,
}

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
        _ => Class::Other,
    }
}
