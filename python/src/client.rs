//! `Client`, `Tail` and `Frame`: publish to and read streams.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeWarning, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use tether::conn::ConnectOptions;
use tether::{cursor, Connector, Endpoint, Event, Publisher, PublisherOptions};
use tether::{Start, SubscribeOptions, Subscriber};
use tether_protocol::{FrameKind, Request, Response};

use crate::errors::to_py;
use crate::{block_on, Error};

/// How long a blocking wait for a frame lasts before Python gets to see a
/// pending signal (Ctrl-C); the wait then carries on.
const SIGNAL_CHECK: Duration = Duration::from_millis(200);

/// A publisher and the producer seq its next frame gets.
#[derive(Debug)]
struct Producing {
    publisher: Publisher,
    next_seq: u64,
}

/// A connection to a tetherd: `Client(socket=None, host=None, connect_timeout=None)`.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Client {
    connector: Connector,
    /// One publisher per (stream, producer), kept so that producer seqs go
    /// on increasing from one `publish` call to the next.
    publishers: Mutex<HashMap<(String, String), Producing>>,
    /// The producer name used when `publish` is given none.
    default_producer: String,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (socket=None, host=None, connect_timeout=None))]
    fn new(
        socket: Option<PathBuf>,
        host: Option<&str>,
        connect_timeout: Option<f64>,
    ) -> PyResult<Self> {
        let endpoint = match (socket, host) {
            (Some(_), Some(_)) => {
                return Err(PyValueError::new_err("give socket or host, not both"));
            }
            (Some(path), None) => Endpoint::unix(path),
            (None, Some(url)) => Endpoint::ssh(url).map_err(to_py)?,
            (None, None) => Endpoint::default_local(),
        };
        let mut options = ConnectOptions {
            client: format!("tether-python {}", env!("CARGO_PKG_VERSION")),
            ..ConnectOptions::default()
        };
        if let Some(secs) = connect_timeout {
            options.retry_window = Duration::try_from_secs_f64(secs).map_err(|_| {
                PyValueError::new_err("connect_timeout must be a number of seconds >= 0")
            })?;
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        Ok(Self {
            connector: Connector::new(endpoint, options),
            publishers: Mutex::new(HashMap::new()),
            default_producer: format!("python-{}-{nanos}", std::process::id()),
        })
    }

    /// Appends each item (str or bytes) as one frame of kind `data` and
    /// returns once all are durable. Producer seqs count the items this
    /// client published as `producer` to `stream`, from 1: a program that is
    /// run again and publishes the same items as the same producer stores
    /// nothing twice.
    #[pyo3(signature = (stream, items, producer=None))]
    fn publish(
        &self,
        py: Python<'_>,
        stream: String,
        items: &Bound<'_, PyAny>,
        producer: Option<String>,
    ) -> PyResult<()> {
        let payloads = payloads(items)?;
        let producer = producer.unwrap_or_else(|| self.default_producer.clone());
        let mut publishers = lock(&self.publishers)?;
        let key = (stream, producer);
        if !publishers.contains_key(&key) {
            let publisher = Publisher::new(
                self.connector.clone(),
                key.0.clone(),
                key.1.clone(),
                PublisherOptions::default(),
            )
            .map_err(to_py)?;
            let producing = Producing {
                publisher,
                next_seq: 1,
            };
            publishers.insert(key.clone(), producing);
        }
        let Some(producing) = publishers.get_mut(&key) else {
            return Err(Error::new_err("publisher vanished"));
        };
        let outcome = block_on(py, move || async move {
            for payload in payloads {
                let seq = producing.next_seq;
                producing.publisher.publish(seq, payload).await?;
                producing.next_seq += 1;
            }
            producing.publisher.flush().await
        })?;
        outcome.map_err(to_py)
    }

    /// Reads `stream`; see `tether.Client.tail` in the stubs.
    #[pyo3(signature = (stream, follow=false, from_seq=None, last=None, cursor_file=None, consumer=None))]
    #[allow(clippy::too_many_arguments)]
    fn tail(
        &self,
        py: Python<'_>,
        stream: String,
        follow: bool,
        from_seq: Option<u64>,
        last: Option<u64>,
        cursor_file: Option<PathBuf>,
        consumer: Option<String>,
    ) -> PyResult<Tail> {
        if from_seq.is_some() && last.is_some() {
            return Err(PyValueError::new_err("give from_seq or last, not both"));
        }
        let stored = match &cursor_file {
            Some(path) => cursor::read(path).map_err(to_py)?,
            None => None,
        };
        // The precedence of `tether tail`.
        let start = if let Some(seq) = stored {
            Start::After(seq)
        } else if let Some(seq) = from_seq {
            Start::After(seq.saturating_sub(1))
        } else if let Some(n) = last {
            Start::Last(n)
        } else if consumer.is_some() {
            Start::ConsumerAck
        } else {
            Start::Oldest
        };
        let acks = consumer.is_some();
        let options = SubscribeOptions {
            stream: stream.clone(),
            start,
            follow,
            consumer,
        };
        let connector = self.connector.clone();
        let sub = block_on(py, move || Subscriber::open(connector, options))?.map_err(to_py)?;
        Ok(Tail {
            stream: stream.clone(),
            state: tokio::sync::Mutex::new(TailState {
                sub: Some(sub),
                stream,
                cursor_file,
                acks,
                unsaved: None,
            }),
        })
    }

    /// The daemon's status as a dict (the fields of `tether status --json`).
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let connector = self.connector.clone();
        let (status, storage) = block_on(py, move || async move {
            let status = connector.request(&Request::Status).await?;
            // A daemon that predates the storage report refuses it.
            let storage = connector.request(&Request::Storage).await.ok();
            Ok::<_, tether::Error>((status, storage))
        })?
        .map_err(to_py)?;
        let Response::Status(status) = status else {
            return Err(crate::ProtocolError::new_err(
                "the daemon did not answer Status with its status",
            ));
        };
        let mut object = serde_json::to_value(&status).map_err(json_error)?;
        if let (Some(map), Some(Response::Storage(storage))) = (object.as_object_mut(), storage) {
            map.insert(
                "storage".into(),
                serde_json::to_value(&storage).map_err(json_error)?,
            );
        }
        from_json(py, &object)
    }

    /// The streams as a list of dicts (the fields of `tether streams --json`).
    fn streams(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let connector = self.connector.clone();
        let response = block_on(py, move || async move {
            connector.request(&Request::ListStreams).await
        })?
        .map_err(to_py)?;
        let Response::Streams(streams) = response else {
            return Err(crate::ProtocolError::new_err(
                "the daemon did not answer ListStreams with a stream list",
            ));
        };
        from_json(py, &serde_json::to_value(&streams).map_err(json_error)?)
    }
}

/// The items of `publish` as payloads: a list (or any iterable) of str or
/// bytes, but not one str or bytes, which would be split.
fn payloads(items: &Bound<'_, PyAny>) -> PyResult<Vec<Bytes>> {
    if items.is_instance_of::<PyString>() || items.is_instance_of::<PyBytes>() {
        return Err(PyTypeError::new_err(
            "publish takes a list of str or bytes; wrap a single item in a list",
        ));
    }
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        if let Ok(b) = item.cast::<PyBytes>() {
            out.push(Bytes::copy_from_slice(b.as_bytes()));
        } else if let Ok(s) = item.cast::<PyString>() {
            out.push(Bytes::copy_from_slice(s.to_cow()?.as_bytes()));
        } else {
            return Err(PyTypeError::new_err(format!(
                "publish items must be str or bytes, not {}",
                item.get_type().name()?
            )));
        }
    }
    Ok(out)
}

/// One stored frame.
#[derive(Debug)]
#[pyclass(frozen, get_all, module = "tether._native")]
pub struct Frame {
    /// The stream it belongs to.
    stream: String,
    /// Its seq in the stream.
    seq: u64,
    /// When it was stored (for a worker line: read), seconds since the epoch.
    ts: f64,
    /// The same, in microseconds.
    ts_micros: u64,
    /// `data`, `stdout`, `stderr` or `event`.
    kind: &'static str,
    /// The payload as stored.
    payload: Py<PyBytes>,
}

#[pymethods]
impl Frame {
    /// The payload as text (invalid UTF-8 replaced).
    #[getter]
    fn text(&self, py: Python<'_>) -> String {
        String::from_utf8_lossy(self.payload.as_bytes(py)).into_owned()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Frame(stream={:?}, seq={}, kind={:?}, payload={:?})",
            self.stream,
            self.seq,
            self.kind,
            String::from_utf8_lossy(self.payload.as_bytes(py))
        )
    }
}

/// The iterator `Client.tail` returns.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Tail {
    stream: String,
    /// An async lock: it is held across the wait for the next frame.
    state: tokio::sync::Mutex<TailState>,
}

#[derive(Debug)]
struct TailState {
    /// `None` once closed.
    sub: Option<Subscriber>,
    stream: String,
    cursor_file: Option<PathBuf>,
    acks: bool,
    /// The seq of the frame last yielded, not yet recorded as processed.
    unsaved: Option<u64>,
}

impl TailState {
    /// Records the last yielded frame as processed: in the cursor file and,
    /// for a consumer, as its ack.
    fn commit(&mut self) -> tether::Result<()> {
        let Some(seq) = self.unsaved.take() else {
            return Ok(());
        };
        if let Some(path) = &self.cursor_file {
            cursor::write(path, seq)?;
        }
        if let (true, Some(sub)) = (self.acks, self.sub.as_mut()) {
            sub.ack(seq)?;
        }
        Ok(())
    }

    /// Commits, waits until the consumer's ack is durable, and ends.
    async fn finish(&mut self) -> tether::Result<()> {
        self.commit()?;
        if let Some(mut sub) = self.sub.take() {
            if self.acks {
                sub.wait_acked().await?;
            }
        }
        Ok(())
    }
}

/// What one bounded wait for the next event found.
enum Next {
    Frame(u64, tether_protocol::Frame),
    Gap(String),
    End,
    Waiting,
}

#[pymethods]
impl Tail {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next frame. Asking for it records the previous one as processed
    /// (cursor file, consumer ack): a frame is recorded only once the loop
    /// body that got it has finished.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Frame>> {
        loop {
            let next = block_on(py, move || async move {
                let mut state = self.state.lock().await;
                state.commit().map_err(|e| e.to_string())?;
                let Some(sub) = state.sub.as_mut() else {
                    return Ok(Ok(Next::End));
                };
                let next = match tokio::time::timeout(SIGNAL_CHECK, sub.next()).await {
                    Err(_) => return Ok(Ok(Next::Waiting)),
                    Ok(next) => next,
                };
                let next = match next {
                    Ok(Some(Event::Frame { seq, frame })) => {
                        state.unsaved = Some(seq);
                        Next::Frame(seq, frame)
                    }
                    Ok(Some(Event::Gap(gap))) => Next::Gap(gap_message(&state.stream, &gap)),
                    Ok(Some(Event::End { .. }) | None) => {
                        if let Err(e) = state.finish().await {
                            return Ok(Err(e));
                        }
                        Next::End
                    }
                    Err(e) => return Ok(Err(e)),
                };
                Ok::<_, String>(Ok(next))
            })?;
            let next = next.map_err(Error::new_err)?.map_err(to_py)?;
            match next {
                Next::Frame(seq, frame) => {
                    let stream = self.stream.clone();
                    return Ok(Some(Frame {
                        stream,
                        seq,
                        ts: frame.ts_micros as f64 / 1e6,
                        ts_micros: frame.ts_micros,
                        kind: kind_name(frame.kind),
                        payload: PyBytes::new(py, &frame.payload).unbind(),
                    }));
                }
                Next::Gap(message) => {
                    let warning = py.get_type::<PyRuntimeWarning>();
                    PyErr::warn(py, &warning, &std::ffi::CString::new(message)?, 1)?;
                }
                Next::End => return Ok(None),
                Next::Waiting => py.check_signals()?,
            }
        }
    }

    /// Records the last frame yielded as processed and ends the
    /// subscription (for a consumer: once its ack is durable).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let outcome = block_on(py, move || async move {
            let mut state = self.state.lock().await;
            Ok::<_, String>(state.finish().await)
        })?;
        outcome.map_err(Error::new_err)?.map_err(to_py)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Closes, recording the last frame only when the block did not raise:
    /// a frame whose processing failed is read again next time.
    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyAny>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if exc_type.is_some_and(|t| !t.is_none()) {
            let mut state = self.state.blocking_lock();
            state.unsaved = None;
            state.sub = None;
            return Ok(false);
        }
        self.close(py)?;
        Ok(false)
    }
}

fn kind_name(kind: FrameKind) -> &'static str {
    kind.as_str()
}

/// Locks `m`; a poisoned lock (a panic while it was held) is an error.
pub fn lock<T>(m: &Mutex<T>) -> PyResult<MutexGuard<'_, T>> {
    m.lock()
        .map_err(|_| Error::new_err("an earlier call failed while holding this object"))
}

fn json_error(e: serde_json::Error) -> PyErr {
    crate::ProtocolError::new_err(format!("cannot render the daemon's answer: {e}"))
}

/// A JSON value as Python objects, through the `json` module.
pub fn from_json(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = value.to_string();
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// `stream S: frames 5..9 were compacted or lost; continuing at 10`, as
/// `tether tail` says it.
fn gap_message(stream: &str, gap: &tether_protocol::Gap) -> String {
    let last_missing = gap.first_available.saturating_sub(1);
    let what = if last_missing <= gap.requested {
        format!("frame {} was", gap.requested)
    } else {
        format!("frames {}..{last_missing} were", gap.requested)
    };
    format!(
        "stream {stream}: {what} compacted or lost; continuing at {}",
        gap.first_available
    )
}
