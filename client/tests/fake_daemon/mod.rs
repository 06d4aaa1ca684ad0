//! The start of a stand-in daemon's session, shared by the tests that
//! script a daemon's answers themselves.

use futures_util::{SinkExt, StreamExt};
use tether_protocol::{Capabilities, HelloOk, Request, Response, ServerCodec, PROTOCOL_VERSION};
use tokio::net::UnixStream;
use tokio_util::codec::Framed;

/// A session on `stream`, once the client's `Hello` is answered; `None`
/// when the client left or sent something else first.
pub async fn greet(stream: UnixStream) -> Option<Framed<UnixStream, ServerCodec>> {
    let mut session = Framed::new(stream, ServerCodec::new());
    let Some(Ok(Request::Hello(_))) = session.next().await else {
        return None;
    };
    let ok = Response::HelloOk(HelloOk {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::DURABLE,
        daemon: "fake".into(),
    });
    session.send(ok).await.ok()?;
    Some(session)
}
