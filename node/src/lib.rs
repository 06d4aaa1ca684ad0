//! `tether.node`: the Node.js addon over the tether client library.
//!
//! Everything that speaks the protocol, reconnects and resumes is the Rust
//! library; this crate only converts arguments and results and tags errors
//! with the class the JavaScript layer throws. The npm package's `index.js`
//! adds what is easier in JavaScript (JSON, step memoising, the async
//! iterator over a tail).
//!
//! * `client`: `NativeClient` and `NativeTail`, over `tether::sdk`.
//! * `worker`: `NativeWorker`, `NativeCheckpoint`, over `tether::Worker`.
//! * `errors`: the client library's errors, tagged with their class.
//!
//! Every call that waits returns a Promise: its future runs on the tokio
//! runtime napi starts for the addon, never on the JavaScript thread.

mod client;
mod errors;
mod worker;

pub use client::{NativeBatch, NativeClient, NativeRunSpec, NativeTail};
pub use worker::{NativeCheckpoint, NativeWorker};

/// The addon's version, the crate's.
#[napi_derive::napi]
pub fn version() -> String {
    env!("CARGO_PKG_VERSION").to_string()
}
