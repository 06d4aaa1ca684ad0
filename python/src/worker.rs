//! `Worker` and `Checkpoint`: what a program run by `tether run` uses.
//! The Python package wraps these (JSON encoding, the `step` decorator).

use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tether_protocol::{FrameKind, UserMeta};

use crate::client::seconds;
use crate::errors::worker_to_py;
use crate::{block_on, block_on_interruptible};

/// The native worker handle; see `tether.Worker`.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Worker {
    inner: Arc<tether::Worker>,
}

#[pymethods]
impl Worker {
    /// The worker of the execution this process runs as; an error outside
    /// `tether run`.
    #[staticmethod]
    fn from_env() -> PyResult<Self> {
        let inner = tether::Worker::from_env().map_err(worker_to_py)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    #[getter]
    fn execution_id(&self) -> &str {
        self.inner.execution()
    }

    #[getter]
    fn resumed(&self) -> bool {
        self.inner.is_resumed()
    }

    #[getter]
    fn attempt(&self) -> Option<u64> {
        self.inner.attempt()
    }

    /// The newest valid checkpoint, of exactly `schema_version` when one
    /// is given; None when there is none.
    #[pyo3(signature = (schema_version=None))]
    fn load_checkpoint(
        &self,
        py: Python<'_>,
        schema_version: Option<u32>,
    ) -> PyResult<Option<Checkpoint>> {
        let inner = Arc::clone(&self.inner);
        let loaded = block_on(
            py,
            move || async move { inner.load_full(schema_version).await },
        )?
        .map_err(worker_to_py)?;
        let Some(checkpoint) = loaded else {
            return Ok(None);
        };
        let meta = checkpoint.meta;
        Ok(Some(Checkpoint {
            data: PyBytes::new(py, &checkpoint.data).unbind(),
            id: meta.id,
            seq: meta.seq,
            schema_version: meta.schema_version,
            ts: meta.created_micros as f64 / 1e6,
            user_meta: checkpoint.user_meta,
        }))
    }

    /// Saves `data` as the newest checkpoint, with `meta` (key, value
    /// pairs) kept beside it; returns once durable, with the checkpoint's
    /// id.
    #[pyo3(signature = (data, schema_version=0, meta=Vec::new()))]
    fn save_checkpoint(
        &self,
        py: Python<'_>,
        data: Vec<u8>,
        schema_version: u32,
        meta: Vec<(String, String)>,
    ) -> PyResult<u64> {
        let inner = Arc::clone(&self.inner);
        let saved = block_on(py, move || async move {
            inner
                .save_full(Bytes::from(data), schema_version, meta)
                .await
        })?
        .map_err(worker_to_py)?;
        Ok(saved.id)
    }

    /// The recorded result of step `name`, or None.
    fn step_get(&self, py: Python<'_>, name: String) -> PyResult<Option<Py<PyBytes>>> {
        let inner = Arc::clone(&self.inner);
        let got = block_on(py, move || async move { inner.step_get(&name).await })?
            .map_err(worker_to_py)?;
        Ok(got.map(|b| PyBytes::new(py, &b).unbind()))
    }

    /// Records `result` for step `name` unless one is recorded; returns the
    /// result that stands.
    fn step_put(&self, py: Python<'_>, name: String, result: Vec<u8>) -> PyResult<Py<PyBytes>> {
        let inner = Arc::clone(&self.inner);
        let kept = block_on(py, move || async move {
            inner.step_put(&name, Bytes::from(result)).await
        })?
        .map_err(worker_to_py)?;
        Ok(PyBytes::new(py, &kept).unbind())
    }

    /// Forgets the recorded result of step `name`, so that it runs again;
    /// returns how many results were forgotten (0 or 1).
    fn step_clear(&self, py: Python<'_>, name: String) -> PyResult<u64> {
        let inner = Arc::clone(&self.inner);
        block_on(py, move || async move {
            inner.step_clear(vec![name], false).await
        })?
        .map_err(worker_to_py)
    }

    /// Asks a question and waits for its answer (see `tether.Worker.ask`);
    /// None when it timed out with no default.
    #[pyo3(signature = (text, choices=Vec::new(), timeout=None, default=None, key=None))]
    fn ask(
        &self,
        py: Python<'_>,
        text: String,
        choices: Vec<String>,
        timeout: Option<f64>,
        default: Option<String>,
        key: Option<String>,
    ) -> PyResult<Option<String>> {
        let question = tether::gates::Question {
            execution: String::new(),
            text,
            choices,
            timeout: timeout.map(|t| seconds(t, "timeout")).transpose()?,
            default,
            key,
        };
        question
            .check()
            .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
        let inner = Arc::clone(&self.inner);
        block_on_interruptible(py, async move { inner.ask(question).await })?.map_err(worker_to_py)
    }

    /// The next inbox message, waiting up to `timeout` seconds (None:
    /// forever); None when the timeout passed with none. The message
    /// handed over before it is removed from the inbox first.
    #[pyo3(signature = (timeout=None))]
    fn recv(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Message>> {
        let timeout = timeout.map(|t| seconds(t, "timeout")).transpose()?;
        let inner = Arc::clone(&self.inner);
        let got = block_on_interruptible(py, async move { inner.recv(timeout).await })?
            .map_err(worker_to_py)?;
        Ok(got.map(|m| Message {
            id: m.id,
            data: PyBytes::new(py, &m.data).unbind(),
            ts: m.sent_micros as f64 / 1e6,
            sender_uid: m.sender_uid,
        }))
    }

    /// Appends one frame of `kind` (`stdout`, `stderr`, `user`, ...) to
    /// the execution's stream; durable when this returns.
    fn emit(&self, py: Python<'_>, kind: &str, payload: Vec<u8>) -> PyResult<()> {
        let kind = FrameKind::from_name(kind).ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!("unknown frame kind {kind:?}"))
        })?;
        let inner = Arc::clone(&self.inner);
        block_on(py, move || async move { inner.emit(kind, payload).await })?.map_err(worker_to_py)
    }
}

/// A saved checkpoint.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Checkpoint {
    /// The checkpoint's bytes.
    #[pyo3(get)]
    data: Py<PyBytes>,
    /// Increasing per execution.
    #[pyo3(get)]
    id: u64,
    /// The execution stream's last seq when it was saved.
    #[pyo3(get)]
    seq: u64,
    #[pyo3(get)]
    schema_version: u32,
    /// When it was saved, seconds since the epoch.
    #[pyo3(get)]
    ts: f64,
    /// The metadata saved with it, in the order given; read as `meta`.
    user_meta: UserMeta,
}

#[pymethods]
impl Checkpoint {
    /// The metadata saved with the checkpoint, as a new dict (a key given
    /// twice keeps its last value).
    #[getter]
    fn meta<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (key, value) in &self.user_meta {
            dict.set_item(key, value)?;
        }
        Ok(dict)
    }

    /// The data decoded as JSON.
    fn json(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let data = self.data.bind(py);
        Ok(py.import("json")?.call_method1("loads", (data,))?.unbind())
    }

    fn __repr__(&self) -> String {
        format!(
            "Checkpoint(id={}, seq={}, schema_version={})",
            self.id, self.seq, self.schema_version
        )
    }
}

/// A message from the execution's inbox.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Message {
    /// Unique in the daemon, rising in the order messages were sent.
    #[pyo3(get)]
    id: u64,
    /// The message's bytes.
    #[pyo3(get)]
    data: Py<PyBytes>,
    /// When it was sent, seconds since the epoch.
    #[pyo3(get)]
    ts: f64,
    /// The uid of the sender.
    #[pyo3(get)]
    sender_uid: u32,
}

#[pymethods]
impl Message {
    /// The data as text (UTF-8, invalid bytes replaced).
    #[getter]
    fn text(&self, py: Python<'_>) -> String {
        String::from_utf8_lossy(self.data.bind(py).as_bytes()).into_owned()
    }

    fn __repr__(&self) -> String {
        format!("Message(id={})", self.id)
    }
}
