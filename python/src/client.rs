//! `Client`, `Tail` and `Frame`: publish to and read streams, and start,
//! list and stop workers. The work is the library's `tether::sdk`; this
//! file converts arguments and results.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyRuntimeWarning, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use tether::conn::ConnectOptions;
use tether::sdk::{self, RunOptions, TailItem, TailOptions};
use tether_protocol::RestartPolicy;

use crate::errors::to_py;
use crate::{block_on, Error};

/// How long a blocking wait for a frame lasts before Python gets to see a
/// pending signal (Ctrl-C); the wait then carries on.
pub(crate) const SIGNAL_CHECK: Duration = Duration::from_millis(200);

/// Frames fetched from the library at once: iteration then hands them out
/// with the GIL held and no async call.
const BATCH: usize = 4096;

/// A connection to a tetherd: `Client(socket=None, host=None, connect_timeout=None)`.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Client {
    inner: sdk::Client,
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
        let endpoint = sdk::Client::endpoint_of(socket, host)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let mut options = ConnectOptions::default();
        if let Some(secs) = connect_timeout {
            options.retry_window = seconds(secs, "connect_timeout")?;
        }
        Ok(Self {
            inner: sdk::Client::new(endpoint, options, "python"),
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
        let inner = &self.inner;
        block_on(py, move || async move {
            inner.publish(&stream, producer.as_deref(), payloads).await
        })?
        .map_err(to_py)
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
        let options = TailOptions {
            stream: stream.clone(),
            follow,
            from_seq,
            last,
            cursor_file,
            consumer,
        };
        let inner = &self.inner;
        let tail = block_on(py, move || inner.tail(options))?.map_err(to_py)?;
        Ok(Tail {
            stream: PyString::new(py, &stream).unbind(),
            state: Mutex::new(TailState {
                tail,
                ready: VecDeque::new(),
                unmarked: None,
            }),
        })
    }

    /// The daemon's status as a dict (the fields of `tether status --json`).
    fn status(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let inner = &self.inner;
        let value = block_on(py, move || inner.status())?.map_err(to_py)?;
        from_json(py, &value)
    }

    /// The streams as a list of dicts (the fields of `tether streams --json`).
    fn streams(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let inner = &self.inner;
        let value = block_on(py, move || inner.streams())?.map_err(to_py)?;
        from_json(py, &value)
    }

    /// Starts a supervised worker; returns its execution id. With `id`,
    /// an execution with that id that exists is left alone and its id
    /// returned.
    #[pyo3(signature = (command, name=None, restart="on-failure", max_restarts=None, deadline=None, cwd=None, env=None, id=None, labels=None, parent=None, max_failures_without_progress=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        py: Python<'_>,
        command: Vec<String>,
        name: Option<String>,
        restart: &str,
        max_restarts: Option<u32>,
        deadline: Option<f64>,
        cwd: Option<PathBuf>,
        env: Option<std::collections::BTreeMap<String, String>>,
        id: Option<String>,
        labels: Option<std::collections::BTreeMap<String, String>>,
        parent: Option<String>,
        max_failures_without_progress: Option<u32>,
    ) -> PyResult<String> {
        let restart = RestartPolicy::from_name(restart).ok_or_else(|| {
            PyValueError::new_err(format!(
                "restart must be \"never\", \"on-failure\" or \"always\", not {restart:?}"
            ))
        })?;
        let deadline = deadline.map(|s| seconds(s, "deadline")).transpose()?;
        let options = RunOptions {
            command,
            name,
            restart,
            max_restarts,
            deadline,
            cwd,
            env: env.unwrap_or_default().into_iter().collect(),
            id,
            labels: labels.unwrap_or_default().into_iter().collect(),
            parent,
            max_failures_without_progress,
            stop_signal: None,
        };
        let inner = &self.inner;
        block_on(py, move || inner.run(options))?.map_err(to_py)
    }

    /// The executions that have not ended (`all`: every one), as dicts
    /// with the fields of `tether ps --json`.
    #[pyo3(signature = (all=false))]
    fn ps(&self, py: Python<'_>, all: bool) -> PyResult<Py<PyAny>> {
        let inner = &self.inner;
        let value = block_on(py, move || inner.ps(all))?.map_err(to_py)?;
        from_json(py, &value)
    }

    /// Stops an execution (SIGTERM, SIGKILL after `timeout` seconds) and
    /// returns it as it ended (a dict as `ps` gives).
    #[pyo3(signature = (id, timeout=10.0))]
    fn stop(&self, py: Python<'_>, id: String, timeout: f64) -> PyResult<Py<PyAny>> {
        let timeout = seconds(timeout, "timeout")?;
        let inner = &self.inner;
        let value =
            block_on(py, move || async move { inner.stop(&id, timeout).await })?.map_err(to_py)?;
        from_json(py, &value)
    }

    /// Starts a new attempt of an ended execution from its newest valid
    /// checkpoint (or checkpoint `checkpoint`) and returns its id.
    #[pyo3(signature = (id, checkpoint=None))]
    fn resume(&self, py: Python<'_>, id: String, checkpoint: Option<u64>) -> PyResult<String> {
        let inner = &self.inner;
        block_on(
            py,
            move || async move { inner.resume(&id, checkpoint).await },
        )?
        .map_err(to_py)
    }

    /// Stops the running attempt (SIGTERM, SIGKILL after `timeout`
    /// seconds) and starts the next at once; returns the execution's id.
    #[pyo3(signature = (id, timeout=10.0))]
    fn restart(&self, py: Python<'_>, id: String, timeout: f64) -> PyResult<String> {
        let timeout = seconds(timeout, "timeout")?;
        let inner = &self.inner;
        block_on(py, move || async move { inner.restart(&id, timeout).await })?.map_err(to_py)
    }

    /// Removes ended executions by id, each with its stream, checkpoints
    /// and steps (`force`: stops live ones first); returns the ids removed.
    #[pyo3(signature = (ids, force=false))]
    fn rm(&self, py: Python<'_>, ids: Vec<String>, force: bool) -> PyResult<Vec<String>> {
        let inner = &self.inner;
        block_on(py, move || async move { inner.rm(ids, force).await })?.map_err(to_py)
    }

    /// Queues `message` (str or bytes) in the inbox of execution `id`;
    /// returns its id once it is durable.
    fn send(&self, py: Python<'_>, id: String, message: &Bound<'_, PyAny>) -> PyResult<u64> {
        let message = message_bytes(message)?;
        let inner = &self.inner;
        block_on(py, move || async move { inner.send(&id, message).await })?.map_err(to_py)
    }

    /// Answers a question of execution `id` (its one open question when
    /// `question` is None); returns the question, closed, as a dict with
    /// the fields of `tether questions --json`.
    #[pyo3(signature = (id, answer, question=None))]
    fn answer(
        &self,
        py: Python<'_>,
        id: String,
        answer: String,
        question: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        let inner = &self.inner;
        let value = block_on(py, move || async move {
            inner.answer(&id, &answer, question).await
        })?
        .map_err(to_py)?;
        from_json(py, &value)
    }

    /// The open questions (every one with `all`), of execution `id` when
    /// given, as dicts with the fields of `tether questions --json`.
    #[pyo3(signature = (all=false, id=None))]
    fn questions(&self, py: Python<'_>, all: bool, id: Option<String>) -> PyResult<Py<PyAny>> {
        let inner = &self.inner;
        let found =
            block_on(py, move || async move { inner.questions(all, id).await })?.map_err(to_py)?;
        from_json(py, &serde_json::Value::Array(found))
    }

    /// Removes ended executions that ended at least `older_than` seconds
    /// ago (`None`: the daemon's `keep_ended`); returns the ids removed.
    #[pyo3(signature = (older_than=None))]
    fn prune(&self, py: Python<'_>, older_than: Option<f64>) -> PyResult<Vec<String>> {
        let older_than = older_than
            .map(|secs| seconds(secs, "older_than"))
            .transpose()?;
        let inner = &self.inner;
        block_on(py, move || async move { inner.prune(older_than).await })?.map_err(to_py)
    }
}

/// A message as `send` takes it: str (as UTF-8) or bytes.
fn message_bytes(message: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(text) = message.cast::<PyString>() {
        return Ok(Bytes::copy_from_slice(text.to_cow()?.as_bytes()));
    }
    if let Ok(bytes) = message.cast::<PyBytes>() {
        return Ok(Bytes::copy_from_slice(bytes.as_bytes()));
    }
    Err(PyTypeError::new_err("a message must be str or bytes"))
}

/// A number of seconds as a duration; `what` names the argument.
pub(crate) fn seconds(secs: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs)
        .map_err(|_| PyValueError::new_err(format!("{what} must be a number of seconds >= 0")))
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
    stream: Py<PyString>,
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
            self.stream.bind(py).to_string(),
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
    /// Shared by every frame this tail yields.
    stream: Py<PyString>,
    /// Locked by one `__next__` at a time; a second thread gets an error
    /// rather than waiting with the GIL held.
    state: Mutex<TailState>,
}

#[derive(Debug)]
struct TailState {
    tail: sdk::Tail,
    /// Fetched, not yet yielded.
    ready: VecDeque<TailItem>,
    /// The seq of the frame last yielded, not yet marked processed.
    unmarked: Option<u64>,
}

/// What one bounded wait for more frames found.
enum Fetched {
    /// Items were added to `ready`.
    Some,
    /// Nothing came within the wait.
    Waited,
    /// The tail has ended.
    End,
}

impl TailState {
    /// Waits at most `wait` (with the GIL released) for up to `max` more
    /// items and adds them to `ready`.
    fn fetch(&mut self, py: Python<'_>, max: usize, wait: Duration) -> PyResult<Fetched> {
        let tail = &mut self.tail;
        let fetched = block_on(py, move || async move {
            tokio::time::timeout(wait, tail.next_batch(max)).await
        })?;
        match fetched {
            Err(_waited) => Ok(Fetched::Waited),
            Ok(Ok(Some(batch))) => {
                self.ready.extend(batch);
                Ok(Fetched::Some)
            }
            Ok(Ok(None)) => Ok(Fetched::End),
            Ok(Err(e)) => Err(to_py(e)),
        }
    }

    /// Marks the frame last yielded as processed (cursor file, ack).
    fn mark(&mut self) -> tether::Result<()> {
        match self.unmarked.take() {
            Some(seq) if self.tail.records_progress() => self.tail.mark_processed(seq),
            _ => Ok(()),
        }
    }
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
        let mut state = self.lock()?;
        state.mark().map_err(to_py)?;
        loop {
            match state.ready.pop_front() {
                Some(TailItem::Frame { seq, frame }) => {
                    state.unmarked = Some(seq);
                    return Ok(Some(self.frame(py, seq, &frame)));
                }
                Some(TailItem::Gap(message)) => warn_gap(py, &message)?,
                None => match state.fetch(py, BATCH, SIGNAL_CHECK)? {
                    Fetched::Some => {}
                    Fetched::Waited => py.check_signals()?,
                    Fetched::End => return Ok(None),
                },
            }
        }
    }

    /// For `tether.aio`: up to `max` frames, waiting at most `wait`
    /// seconds for the first (an empty list when none came); None at the
    /// end. Marks nothing processed: the caller calls `_mark`.
    #[pyo3(signature = (max, wait))]
    fn _take(&self, py: Python<'_>, max: usize, wait: f64) -> PyResult<Option<Vec<Frame>>> {
        let wait = seconds(wait, "wait")?;
        let mut state = self.lock()?;
        if state.ready.is_empty() {
            match state.fetch(py, max, wait)? {
                Fetched::Some => {}
                Fetched::Waited => return Ok(Some(Vec::new())),
                Fetched::End => return Ok(None),
            }
        }
        let mut frames = Vec::new();
        while frames.len() < max.max(1) {
            match state.ready.pop_front() {
                Some(TailItem::Frame { seq, frame }) => frames.push(self.frame(py, seq, &frame)),
                Some(TailItem::Gap(message)) => warn_gap(py, &message)?,
                None => break,
            }
        }
        Ok(Some(frames))
    }

    /// For `tether.aio`: records every frame through `seq` as processed.
    fn _mark(&self, seq: u64) -> PyResult<()> {
        let mut state = self.lock()?;
        if state.tail.records_progress() {
            state.tail.mark_processed(seq).map_err(to_py)?;
        }
        Ok(())
    }

    /// True when processed frames are recorded (a cursor file or a
    /// consumer), so `_mark` has work to do.
    #[getter]
    fn _records_progress(&self) -> PyResult<bool> {
        Ok(self.lock()?.tail.records_progress())
    }

    /// Records the last frame yielded as processed and ends the
    /// subscription (for a consumer: once its ack is durable).
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let mut state = self.lock()?;
        state.mark().map_err(to_py)?;
        state.ready.clear();
        let tail = &mut state.tail;
        block_on(py, move || tail.close())?.map_err(to_py)
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
            let mut state = self.lock()?;
            state.unmarked = None;
            state.ready.clear();
            state.tail.abandon();
            return Ok(false);
        }
        self.close(py)?;
        Ok(false)
    }
}

impl Tail {
    fn frame(&self, py: Python<'_>, seq: u64, frame: &tether_protocol::Frame) -> Frame {
        Frame {
            stream: self.stream.clone_ref(py),
            seq,
            ts: frame.ts_micros as f64 / 1e6,
            ts_micros: frame.ts_micros,
            kind: frame.kind.as_str(),
            payload: PyBytes::new(py, &frame.payload).unbind(),
        }
    }

    fn lock(&self) -> PyResult<std::sync::MutexGuard<'_, TailState>> {
        match self.state.try_lock() {
            Ok(state) => Ok(state),
            Err(std::sync::TryLockError::WouldBlock) => Err(Error::new_err(
                "this tail is being read by another thread; give each thread its own",
            )),
            Err(std::sync::TryLockError::Poisoned(_)) => Err(Error::new_err(
                "an earlier read of this tail failed while holding it",
            )),
        }
    }
}

/// A gap notice as a `RuntimeWarning`.
fn warn_gap(py: Python<'_>, message: &str) -> PyResult<()> {
    let warning = py.get_type::<PyRuntimeWarning>();
    PyErr::warn(py, &warning, &std::ffi::CString::new(message)?, 1)
}

/// A JSON value as Python objects, through the `json` module.
pub fn from_json(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = value.to_string();
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}
