//! Reaching the daemon: endpoints, one session ([`Connection`]), and the
//! reconnecting [`Link`] that the publisher and the subscriber are built on.
//!
//! An [`Endpoint`] is a local unix socket or a remote daemon over ssh
//! ([`crate::ssh`]). A [`Connection`] is one session: the transport is
//! opened, `Hello` is sent and `HelloOk` awaited. Outgoing requests are
//! encoded into a buffer and written in one go, so that many appends cost
//! one write; responses are read through a length-delimited decoder.
//! Writing and reading are separate halves, so
//! [`Connection::flush_or_recv`] can keep reading answers while a large
//! write is still in progress and neither peer can block the other.
//!
//! A [`Link`] owns the reconnect state machine ([`LinkState`]): it opens a
//! session on demand, and after a failure retries with capped exponential
//! backoff until the retry window (the `--connect-timeout`) runs out, then
//! gives up with [`Error::Unreachable`] naming the endpoint and the last
//! error, or, when the daemon was reached but kept refusing (a full disk),
//! with [`Error::GaveUp`] keeping that refusal.
//!
//! The files beside this one hold these jobs:
//!
//! * `endpoint`: where the daemon listens, and opening the transport.
//! * `connect`: [`ConnectOptions`] and the [`Connector`], whose handshake
//!   turns a transport into a session.
//! * `connection`: one open session: buffered writes, reads, and why a
//!   write failed.
//! * `link`: the reconnect state machine: outages, backoff, giving up.

mod connect;
mod connection;
mod endpoint;
#[cfg(test)]
mod fake_daemon;
mod link;

use tether_protocol::Response;

use crate::error::Error;

pub use connect::{
    ConnectOptions, Connector, NoDaemonNotice, StorageFaultNotice, DEFAULT_BUFFER_SIZE,
    DEFAULT_RETRY_WINDOW, RETRY_FOREVER,
};
pub use connection::Connection;
pub use endpoint::{connect_unix, Endpoint};
pub use link::{Link, LinkState};

/// An error for a response that does not belong where it arrived.
pub fn unexpected(wanted: &str, got: &Response) -> Error {
    Error::Protocol(format!("expected {wanted}, got {}", got.name()))
}
