//! The client library's errors as napi errors tagged with the class the
//! JavaScript layer throws, by the class the library gives each error
//! (`tether::sdk::ErrorClass`, shared with the Python SDK).
//!
//! Node-API errors carry a fixed set of status codes, so the class rides in
//! the message: `tether:NotFound|no such stream "s"`. `index.js` strips the
//! tag and throws `NotFound('no such stream "s"')`; nothing else ever sees
//! a tagged message.

use tether::sdk::ErrorClass;

/// The tag of a bad argument, thrown as a `TypeError` by `index.js`.
const ARGUMENT: &str = "Argument";

fn tagged(class: &str, message: impl std::fmt::Display) -> napi::Error {
    napi::Error::from_reason(format!("tether:{class}|{message}"))
}

/// A bad argument.
pub fn argument(message: impl std::fmt::Display) -> napi::Error {
    tagged(ARGUMENT, message)
}

/// A client library error, its message the error's own. A misuse the
/// library found (an empty command, a bad variable name) is a bad argument,
/// as it is when `index.js` finds it.
pub fn to_napi(e: tether::Error) -> napi::Error {
    match e {
        tether::Error::Usage(message) => argument(message),
        e => tagged(ErrorClass::of(&e).name(), e),
    }
}

/// A worker SDK error.
pub fn worker_to_napi(e: tether::WorkerError) -> napi::Error {
    tagged(ErrorClass::of_worker(&e).name(), e)
}
