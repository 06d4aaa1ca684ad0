//! `[metrics] listen`: the same text as `tether metrics`, over HTTP at
//! `/metrics`, for a Prometheus server to scrape. Off unless configured.
//! It shows counts and stream names only, never a payload; every other
//! path is 404, and any method but GET and HEAD is 405.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::connection::Shared;
use crate::{Error, Result};

/// The content type of the OpenMetrics text that prometheus-client writes.
const CONTENT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Binds `addr`; an address in use or not allowed is an error at start-up
/// rather than a listener silently missing.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::io(format!("cannot listen for metrics on {addr}"), e))
}

/// Serves scrapes on `listener` until `shutdown` is cancelled, then waits
/// for the scrapes in progress.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    let tracker = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, most likely: keep serving once some
                // are given back, without spinning meanwhile.
                tracing::warn!("metrics listener: cannot accept a connection: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let service = service_fn(move |request| answer(request, shared.clone()));
            let connection = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!("metrics listener: a connection failed: {e}");
                    }
                }
                _ = shutdown.cancelled() => connection.as_mut().graceful_shutdown(),
            }
        });
    }
    tracker.close();
    tracker.wait().await;
}

async fn answer(
    request: Request<Incoming>,
    shared: Arc<Shared>,
) -> std::result::Result<Response<Full<Bytes>>, Infallible> {
    if request.uri().path() != "/metrics" {
        return Ok(plain(StatusCode::NOT_FOUND, "not found: try /metrics\n"));
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(response);
    }
    match super::text_of(&shared) {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT));
            Ok(response)
        }
        Err(e) => Ok(plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot gather the metrics: {e}\n"),
        )),
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(text.to_owned())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}
