//! A fake daemon for the tests of this module: its socket, its sessions,
//! and the answers it gives.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::StreamExt;
use tether_protocol::{
    Capabilities, ErrorCode, ErrorFrame, HelloOk, Response, ServerCodec, PROTOCOL_VERSION,
};
use tokio_util::codec::Framed;

use super::{ConnectOptions, Connector, Endpoint};

/// A fake daemon's socket, bound in a new temporary directory.
pub(super) fn listening(name: &str) -> (tempfile::TempDir, PathBuf, tokio::net::UnixListener) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    (dir, path, listener)
}

/// A fake daemon's next session, once its client has sent Hello.
pub(super) async fn accept_session(
    listener: &tokio::net::UnixListener,
) -> Framed<tokio::net::UnixStream, ServerCodec> {
    let (stream, _) = listener.accept().await.unwrap();
    let mut framed = Framed::new(stream, ServerCodec::new());
    let _hello = framed.next().await;
    framed
}

/// A fake daemon's answer to Hello.
pub(super) fn hello_ok(daemon: &str) -> Response {
    Response::HelloOk(HelloOk {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::DURABLE,
        daemon: daemon.into(),
    })
}

/// A fake daemon's refusal for a full disk.
pub(super) fn disk_full() -> Response {
    Response::Error(ErrorFrame {
        code: ErrorCode::STORAGE_FULL,
        message: "disk full".into(),
    })
}

/// A connector to the socket at `path`, giving up after `window`.
pub(super) fn connector(path: &Path, window: Duration) -> Connector {
    Connector::new(
        Endpoint::unix(path),
        ConnectOptions {
            retry_window: window,
            ..ConnectOptions::default()
        },
    )
}
