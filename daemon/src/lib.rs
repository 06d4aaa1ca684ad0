//! `tetherd`: durable, sequence-numbered streams in redb, served over a unix
//! socket.
//!
//! * [`store`] is the only module that touches redb: tables, transactions,
//!   range reads, compaction batches.
//! * [`queue`] owns the writer thread: it assigns seqs, deduplicates
//!   producers, group-commits appends and acks, compacts off the hot path and
//!   hands committed frames to [`hub`] for live fan-out.
//! * [`subscription`] turns "everything after seq K" into a gap-free series
//!   of batches, switching between store reads and live batches.
//! * [`server`] accepts connections; [`connection`] runs one client's session.
//! * [`supervisor`] runs workers through per-attempt shims: manifests, the
//!   execution state machine, restart policy, process identity and pidfds,
//!   recovery of live shims after a restart.
//! * [`config`], [`lock`], [`shutdown`] and [`error`] do what they say.

pub mod config;
pub mod connection;
pub mod error;
pub mod hub;
pub mod lock;
pub mod queue;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod subscription;
pub mod supervisor;

pub use config::Config;
pub use error::{Error, Result};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

/// Runs the daemon until `shutdown` is cancelled: takes the state
/// directory's lock, opens the store, recovers the executions, binds the
/// socket and serves. On shutdown it stops accepting, lets sessions finish
/// their in-flight commits, stops the supervisor's timers (shims and
/// workers keep running), closes the store and removes the socket.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    create_private_dir(&config.state_dir)?;
    let _lock = lock::StateLock::acquire(&config.state_dir)?;
    let queue_options = queue::QueueOptions {
        retention: config.retention.clone(),
        ..queue::QueueOptions::default()
    };
    let store_path = config.store_path();
    let queue = tokio::task::spawn_blocking(move || queue::Queue::open(&store_path, queue_options))
        .await
        .map_err(|e| Error::Storage(format!("store opening task failed: {e}")))??;
    let settings = supervisor::Settings::from_config(&config)?;
    // Executions are recovered before the socket accepts anything, so that
    // a reconnecting shim always finds its execution.
    let supervisor =
        supervisor::Supervisor::start(queue.clone(), settings, CancellationToken::new()).await?;
    let listener = server::bind(&config.socket)?;
    tracing::info!(
        socket = %config.socket.display(),
        state_dir = %config.state_dir.display(),
        "tetherd {} listening",
        env!("CARGO_PKG_VERSION")
    );
    let socket = config.socket.clone();
    let shared = Arc::new(connection::Shared {
        queue: queue.clone(),
        supervisor: supervisor.clone(),
        config,
        started: Instant::now(),
        connections: AtomicU64::new(0),
    });
    server::serve(listener, shared, shutdown).await;
    supervisor.close().await;
    let closed = queue.close().await;
    if let Err(e) = std::fs::remove_file(&socket) {
        tracing::debug!("could not remove socket {}: {e}", socket.display());
    }
    closed?;
    tracing::info!("tetherd stopped");
    Ok(())
}

/// Creates `dir` (mode 0700 for what it creates) when missing.
fn create_private_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| {
            Error::io(
                format!("cannot create state directory {}", dir.display()),
                e,
            )
        })
}
