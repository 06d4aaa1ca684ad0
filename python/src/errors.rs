//! The client library's errors as Python exceptions, by the class the
//! library gives each error.

use pyo3::PyErr;
use tether::sdk::ErrorClass;

use crate::{Error, NotFound, ProtocolError, Refused, StorageError, Unreachable};

/// The exception for a client library error, its message the error's own.
pub fn to_py(e: tether::Error) -> PyErr {
    raise(ErrorClass::of(&e), e.to_string())
}

/// A worker SDK error as an exception.
pub fn worker_to_py(e: tether::WorkerError) -> PyErr {
    raise(ErrorClass::of_worker(&e), e.to_string())
}

fn raise(class: ErrorClass, message: String) -> PyErr {
    match class {
        ErrorClass::NotFound => NotFound::new_err(message),
        ErrorClass::Unreachable => Unreachable::new_err(message),
        ErrorClass::Refused => Refused::new_err(message),
        ErrorClass::Storage => StorageError::new_err(message),
        ErrorClass::Protocol => ProtocolError::new_err(message),
        ErrorClass::Other => Error::new_err(message),
    }
}
