//! Writing to the socket: answers, fed in bulk and flushed once, and the
//! error frame that ends a session.

use std::time::Duration;

use futures_util::SinkExt;
use tether_protocol::{ErrorCode, ErrorFrame, Response};

use super::{Refusal, Session};

/// What a session buffers before it writes to its socket.
pub(super) const WRITE_BATCH_BYTES: usize = 32 * 1024;

impl Session {
    pub(super) async fn send_all(&mut self, responses: Vec<Response>) -> Result<(), Refusal> {
        for response in responses {
            self.out.feed(response).await.map_err(send_failed)?;
        }
        self.out.flush().await.map_err(write_failed)
    }

    /// The largest message the session sends or reads, length prefix
    /// excluded: larger answers go in parts (see `parts`).
    pub(super) fn max_frame_len(&self) -> usize {
        self.out.encoder().max_frame_len()
    }

    /// Best effort: the client may already be gone.
    pub(super) async fn send_error(&mut self, refusal: Refusal) {
        let frame = Response::Error(ErrorFrame {
            code: refusal.code,
            message: refusal.message,
        });
        let _ = tokio::time::timeout(Duration::from_secs(1), self.out.send(frame)).await;
    }
}

/// Feeding an answer fails when the socket does, or when the answer does
/// not fit in one message (the codec refuses it whole, writing nothing of
/// it): the client is told that one, and the session ends as after any
/// refusal.
fn send_failed(e: tether_protocol::Error) -> Refusal {
    match e {
        tether_protocol::Error::Io(_) => write_failed(e),
        e => Refusal::new(ErrorCode::FRAME_TOO_LARGE, format!("cannot answer: {e}")),
    }
}

/// A failed write means the client is gone; the refusal is only logged.
pub(super) fn write_failed(e: tether_protocol::Error) -> Refusal {
    Refusal {
        client_gone: true,
        ..Refusal::new(ErrorCode::INTERNAL, format!("cannot write to client: {e}"))
    }
}
