//! `Worker` and `Checkpoint`: what a program run by `tether run` uses.
//! The Python package wraps these (JSON encoding, the `step` decorator).

use std::sync::Arc;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tether_protocol::FrameKind;

use crate::errors::worker_to_py;
use crate::{block_on, Error};

/// The variable with the attempt number, when the daemon sets one.
const ENV_ATTEMPT: &str = "TETHER_ATTEMPT";

/// The native worker handle; see `tether.Worker`.
#[derive(Debug)]
#[pyclass(frozen, module = "tether._native")]
pub struct Worker {
    inner: Arc<tether::Worker>,
    attempt: Option<u64>,
}

#[pymethods]
impl Worker {
    /// The worker of the execution this process runs as; an error outside
    /// `tether run`.
    #[staticmethod]
    fn from_env() -> PyResult<Self> {
        let inner = tether::Worker::from_env().map_err(worker_to_py)?;
        let attempt = std::env::var(ENV_ATTEMPT)
            .ok()
            .and_then(|v| v.trim().parse().ok());
        Ok(Self {
            inner: Arc::new(inner),
            attempt,
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
        self.attempt
    }

    /// The newest valid checkpoint, or None. With `schema_version`, a
    /// newest checkpoint of another version is an error rather than data
    /// the caller might misread.
    #[pyo3(signature = (schema_version=None))]
    fn load_checkpoint(
        &self,
        py: Python<'_>,
        schema_version: Option<u32>,
    ) -> PyResult<Option<Checkpoint>> {
        let inner = Arc::clone(&self.inner);
        let loaded =
            block_on(py, move || async move { inner.load_bytes().await })?.map_err(worker_to_py)?;
        let Some(checkpoint) = loaded else {
            return Ok(None);
        };
        let meta = checkpoint.meta;
        if let Some(expected) = schema_version {
            if meta.schema_version != expected {
                return Err(Error::new_err(format!(
                    "the newest checkpoint has schema version {}, this worker expects {expected}",
                    meta.schema_version
                )));
            }
        }
        Ok(Some(Checkpoint {
            data: PyBytes::new(py, &checkpoint.data).unbind(),
            id: meta.id,
            seq: meta.seq,
            schema_version: meta.schema_version,
            ts: meta.created_micros as f64 / 1e6,
        }))
    }

    /// Saves `data` as the newest checkpoint; returns once durable, with
    /// the checkpoint's id.
    #[pyo3(signature = (data, schema_version=0))]
    fn save_checkpoint(&self, py: Python<'_>, data: Vec<u8>, schema_version: u32) -> PyResult<u64> {
        let inner = Arc::clone(&self.inner);
        let meta = block_on(py, move || async move {
            inner.save_bytes(Bytes::from(data), schema_version).await
        })?
        .map_err(worker_to_py)?;
        Ok(meta.id)
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

    /// Appends one frame of `kind` (`stdout`, `stderr` or `event`) to the
    /// execution's stream; durable when this returns.
    fn emit(&self, py: Python<'_>, kind: &str, payload: Vec<u8>) -> PyResult<()> {
        let kind = match kind {
            "stdout" => FrameKind::Stdout,
            "stderr" => FrameKind::Stderr,
            "event" => FrameKind::Event,
            other => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "unknown frame kind {other:?}"
                )))
            }
        };
        let inner = Arc::clone(&self.inner);
        block_on(py, move || async move { inner.emit(kind, payload).await })?.map_err(worker_to_py)
    }
}

/// A saved checkpoint.
#[derive(Debug)]
#[pyclass(frozen, get_all, module = "tether._native")]
pub struct Checkpoint {
    /// The checkpoint's bytes.
    data: Py<PyBytes>,
    /// Increasing per execution.
    id: u64,
    /// The execution stream's last seq when it was saved.
    seq: u64,
    schema_version: u32,
    /// When it was saved, seconds since the epoch.
    ts: f64,
}

#[pymethods]
impl Checkpoint {
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
