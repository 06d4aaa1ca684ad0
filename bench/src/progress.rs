//! A one-line progress indicator on stderr, drawn only when stderr is a
//! terminal so that redirected output stays clean.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

/// How often the line is redrawn.
const REDRAW: Duration = Duration::from_millis(200);
const BAR_WIDTH: usize = 30;

/// A counter the workload bumps, and the task that draws it. Dropping it
/// stops the drawing and clears the line.
#[derive(Debug)]
pub struct Progress {
    done: Arc<AtomicU64>,
    drawer: Option<JoinHandle<()>>,
}

impl Progress {
    /// Starts drawing `label` and a bar towards `total` (when stderr is a
    /// terminal; otherwise it only counts).
    pub fn start(label: String, total: u64) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let drawer = std::io::stderr().is_terminal().then(|| {
            let done = done.clone();
            tokio::spawn(async move {
                loop {
                    draw(&label, done.load(Ordering::Relaxed), total);
                    tokio::time::sleep(REDRAW).await;
                }
            })
        });
        Progress { done, drawer }
    }

    /// Sets how many of the total are done.
    pub fn set(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    /// The count itself, for workloads whose many tasks add to it.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(drawer) = self.drawer.take() {
            drawer.abort();
            // Erase the line so that the table row lands on a clean one.
            let mut err = std::io::stderr();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
        }
    }
}

fn draw(label: &str, done: u64, total: u64) {
    let fraction = if total == 0 {
        1.0
    } else {
        (done as f64 / total as f64).min(1.0)
    };
    let filled = (fraction * BAR_WIDTH as f64) as usize;
    let bar: String = "#".repeat(filled) + &"-".repeat(BAR_WIDTH - filled);
    let mut err = std::io::stderr();
    let _ = write!(
        err,
        "\r{label} [{bar}] {:>3.0}% {done}/{total}",
        fraction * 100.0
    );
    let _ = err.flush();
}
