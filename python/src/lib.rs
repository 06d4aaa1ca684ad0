//! `tether._native`: the Python extension over the tether client library.
//!
//! Everything that speaks the protocol, reconnects and resumes is the Rust
//! library; this crate only converts arguments and results and maps errors
//! to Python exceptions. The Python package (`python/tether/`) adds what is
//! easier in Python (JSON encoding, the `step` decorator).
//!
//! Blocking calls release the GIL and run the library's async code on one
//! tokio runtime owned by the module.

use std::future::Future;
use std::sync::OnceLock;

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tokio::runtime::Runtime;

mod client;
mod errors;
mod worker;

create_exception!(
    _native,
    Error,
    PyException,
    "Base class of every tether error."
);
create_exception!(
    _native,
    NotFound,
    Error,
    "No such stream, execution or checkpoint."
);
create_exception!(
    _native,
    Unreachable,
    Error,
    "The daemon could not be reached within the retry window."
);
create_exception!(_native, Refused, Error, "The daemon refused the request.");
create_exception!(
    _native,
    StorageError,
    Error,
    "The daemon could not store (a full or failing disk)."
);
create_exception!(
    _native,
    ProtocolError,
    Error,
    "The daemon sent something the protocol does not allow."
);

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The module's runtime, started on first use. Two worker threads: the
/// calling Python thread drives `block_on`, so these only run the timers and
/// the I/O driver.
fn runtime() -> PyResult<&'static Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("tether-io")
        .enable_all()
        .build()
        .map_err(|e| Error::new_err(format!("cannot start the I/O runtime: {e}")))?;
    // Another thread may have won the race; its runtime is as good.
    let _ = RUNTIME.set(rt);
    RUNTIME
        .get()
        .ok_or_else(|| Error::new_err("the I/O runtime is not available"))
}

/// Runs the future `make` returns to completion with the GIL released.
/// The future is made on the releasing side, so it need not be `Send`
/// (it may hold a lock guard across an await).
fn block_on<M, F>(py: Python<'_>, make: M) -> PyResult<F::Output>
where
    M: FnOnce() -> F + Send,
    F: Future,
    F::Output: Send,
{
    let rt = runtime()?;
    Ok(py.detach(|| rt.block_on(make())))
}

/// Like [`block_on`], for waits that may last hours (a question's
/// answer, an inbox message): the GIL is taken back every
/// [`client::SIGNAL_CHECK`] to let Python act on a pending signal, so
/// Ctrl-C interrupts the wait (and drops it) instead of going unheard.
fn block_on_interruptible<F>(py: Python<'_>, future: F) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let rt = runtime()?;
    let mut future = std::pin::pin!(future);
    loop {
        // The timer is made inside `block_on`: it needs the runtime's
        // context, which this (Python's) thread has only there.
        let slice = async { tokio::time::timeout(client::SIGNAL_CHECK, future.as_mut()).await };
        let sliced = py.detach(|| rt.block_on(slice));
        match sliced {
            Ok(output) => return Ok(output),
            Err(_) => py.check_signals()?,
        }
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("Unreachable", py.get_type::<Unreachable>())?;
    m.add("Refused", py.get_type::<Refused>())?;
    m.add("StorageError", py.get_type::<StorageError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add_class::<client::Client>()?;
    m.add_class::<client::Tail>()?;
    m.add_class::<client::Frame>()?;
    m.add_class::<worker::Worker>()?;
    m.add_class::<worker::Checkpoint>()?;
    m.add_class::<worker::Message>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
