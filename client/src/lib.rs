//! The tether client library: reach a `tetherd`, publish to streams and
//! read them back exactly once across reconnects.
//!
//! * [`conn`]: endpoints, one session ([`Connection`]: `Hello`, buffered
//!   writes, reads) and the reconnect state machine ([`Link`]) with its
//!   retry window.
//! * [`backoff`]: capped exponential backoff with jitter, used between
//!   reconnect attempts.
//! * [`publisher`]: a pipelined [`Publisher`] with a window of
//!   unacknowledged frames that it resends, deduplicated by the daemon,
//!   after a lost session.
//! * [`cursor`]: the file a tail keeps its position in.
//! * [`subscriber`]: a [`Subscriber`] that yields every frame exactly once
//!   across reconnects, reports gaps, and acks for durable consumers.
//! * [`shim`]: the per-worker shim that tetherd starts for each attempt of
//!   a supervised worker (the `tether-shim` binary is a thin wrapper).
//! * [`ssh`]: reaching a daemon on another machine by running
//!   `tether dial-stdio` there over the system `ssh`.
//! * [`time`]: RFC 3339 timestamps and short ages for output.
//! * [`worker`]: the worker SDK for supervised programs: [`Worker`]
//!   (emit, checkpoint, restore, durable steps) and [`CheckpointTrigger`].
//! * [`gates`]: human gates and inboxes: ask and await the answer,
//!   answer, list questions, send to and receive from an inbox.
//! * [`json`]: JSON views of the daemon's answers (`--json`, the SDKs).
//! * [`sdk`]: what the Python and Node bindings share: a client that keeps
//!   producer seqs per stream, tails in batches with a cursor file or
//!   consumer acks, and runs, lists and stops workers.
//! * [`error`]: the crate's one error type and its exit codes.
//!
//! Everything is async on tokio. The `tether` binary in this package is a
//! thin command line over this library.

pub mod backoff;
pub mod conn;
pub mod cursor;
pub mod error;
pub mod gates;
pub mod json;
pub mod publisher;
pub mod sdk;
pub mod shim;
pub mod ssh;
pub mod subscriber;
pub use tether_protocol::time;
pub mod worker;

pub use conn::{ConnectOptions, Connection, Connector, Endpoint, Link};
pub use error::{Error, Result};
pub use publisher::{Greeting, Publisher, PublisherOptions};
pub use subscriber::{Event, Start, SubscribeOptions, Subscriber};
pub use worker::{CheckpointTrigger, Error as WorkerError, Worker};
