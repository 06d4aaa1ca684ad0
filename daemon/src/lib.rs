//! `tetherd`: durable, sequence-numbered streams in redb, served over a unix
//! socket.
//!
//! * [`store`] is the only module that touches redb: tables, transactions,
//!   range reads, compaction batches.
//! * [`engine`] owns the writer thread: it assigns seqs, deduplicates
//!   producers, group-commits appends and acks, compacts off the hot path and
//!   hands committed frames to [`hub`] for live fan-out.
//! * [`wal`] is the write-ahead log in front of redb: a commit is one
//!   synced append; [`syncer`] syncs it, then publishes and answers in
//!   commit order.
//! * [`store_io`] is the one way the log and redb reach their files:
//!   tests fail any single operation there, and redb is kept from running
//!   out of space itself.
//! * [`subscription`] turns "everything after seq K" into a gap-free series
//!   of batches, switching between store reads and live batches.
//! * [`server`] accepts connections; [`access`] judges each peer's
//!   credentials (owner and root, read-only readers group, or refused);
//!   [`slots`] shares out the connection limit; [`connection`] runs one
//!   client's session.
//! * [`supervisor`] runs workers through per-attempt shims: manifests, the
//!   execution state machine, restart policy, process identity and pidfds,
//!   recovery of live shims after a restart.
//! * [`checkpoint`] is the checkpoint record (CRC-32, validity) and what a
//!   restarted attempt resumes from; the engine stores checkpoints and
//!   durable steps, the supervisor resumes attempts from them.
//! * [`notify`] reports readiness, status and watchdog pings to the
//!   service manager; [`activation`] adopts a socket it passed.
//! * [`inherited`] keeps descriptors the daemon inherited from its children.
//! * [`logging`] chooses where log lines go (stderr, JSON, the journal).
//! * [`metrics`] counts what `tether metrics` shows, and serves it over
//!   HTTP when `[metrics] listen` is set.
//! * [`mirror`] publishes committed frames into NATS JetStream, each
//!   exactly once, when `[mirror]` is set.
//! * [`config`], [`lock`], [`shutdown`] and [`error`] do what they say.

pub mod access;
pub mod activation;
pub mod checkpoint;
pub mod config;
pub mod connection;
pub mod degraded;
pub mod engine;
pub mod error;
pub mod gates;
pub mod hub;
pub mod ingest;
pub mod lock;
pub mod logging;
pub mod metrics;
pub mod mirror;
pub mod notify;
pub mod server;
pub mod shutdown;
pub mod slots;
pub mod store;
pub mod store_io;
pub mod subscription;
pub mod supervisor;
pub mod syncer;
pub mod wal;

pub use config::Config;
pub use error::{Error, Result};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

/// Runs the daemon until `shutdown` is cancelled: takes the state
/// directory's lock, opens the store, recovers the executions, binds the
/// socket and serves. On shutdown it stops accepting, lets sessions finish
/// their in-flight commits, stops the supervisor's timers (shims and
/// workers keep running), closes the store and removes the socket.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<()> {
    run_with(config, shutdown, Launch::default()).await
}

/// What the process starting the daemon hands to [`run_with`] besides the
/// config: what the service manager passed, and configs reloaded later.
#[derive(Debug, Default)]
pub struct Launch {
    /// A listening socket passed by socket activation: served instead of
    /// binding [`Config::socket`], and never removed on exit.
    pub activated: Option<activation::Activated>,
    /// Where readiness, status, watchdog pings and stopping are reported.
    pub notifier: Option<notify::Notifier>,
    /// Configs re-read on SIGHUP; the parts that can change live are applied.
    pub reloads: Option<mpsc::UnboundedReceiver<Config>>,
}

/// [`run`], with what a service manager passed and a source of reloaded
/// configs. Sends `READY=1` once the socket accepts, `WATCHDOG=1` while
/// the store answers, and `STOPPING=1` as soon as `shutdown` is cancelled.
pub async fn run_with(
    mut config: Config,
    shutdown: CancellationToken,
    launch: Launch,
) -> Result<()> {
    let notifier = launch.notifier.map(Arc::new);
    let status = |text: &str| {
        if let Some(n) = &notifier {
            n.status(text);
        }
    };
    status("opening the store");
    // Reloaded configs are compared with the one the daemon was started
    // with, before the socket path below is replaced.
    let started_with = config.clone();
    if let Some(path) = launch.activated.as_ref().and_then(|a| a.path.as_ref()) {
        // Shims and workers are told the socket that is really served.
        if *path != config.socket {
            tracing::info!(
                "serving the inherited socket {} instead of {}",
                path.display(),
                config.socket.display()
            );
            config.socket = path.clone();
        }
    }
    create_private_dir(&config.state_dir)?;
    let _lock = lock::StateLock::acquire(&config.state_dir)?;
    store::repair::refuse_interrupted(&config.state_dir)?;
    let queue_options = engine::QueueOptions {
        retention: config.retention.clone(),
        checkpoint_keep: config.checkpoint_keep,
        max_checkpoint_bytes: config.max_checkpoint_bytes,
        log_capacity: config.log_capacity,
        metrics: Arc::new(metrics::Metrics::new()),
        ..engine::QueueOptions::default()
    };
    let store_path = config.store_path();
    let queue =
        tokio::task::spawn_blocking(move || engine::Queue::open(&store_path, queue_options))
            .await
            .map_err(|e| Error::storage("store opening task failed", e))??;
    status("recovering executions");
    let settings = supervisor::Settings::from_config(&config)?;
    // Executions are recovered before the socket accepts anything, so that
    // a reconnecting shim always finds its execution.
    let supervisor =
        supervisor::Supervisor::start(queue.clone(), settings, CancellationToken::new()).await?;
    let inherited = launch.activated.is_some();
    let listener = listen(&config, launch.activated)?;
    let metrics_listener = match config.metrics.listen {
        Some(addr) => Some(metrics::http::bind(addr).await?),
        None => None,
    };
    tracing::info!(
        socket = %config.socket.display(),
        state_dir = %config.state_dir.display(),
        inherited,
        "tetherd {} listening",
        env!("CARGO_PKG_VERSION")
    );
    // The mirror reads committed frames on its own tasks; it stops with
    // the daemon, before the store closes.
    let mirror_stop = CancellationToken::new();
    let _mirror_stop = mirror_stop.clone().drop_guard();
    let (mirror, mirror_configs) =
        mirror::Mirror::start(queue.clone(), config.mirror.clone(), mirror_stop.clone());
    let socket = config.socket.clone();
    let keep_ended = config.keep_ended;
    let shared = Arc::new(connection::Shared {
        queue: queue.clone(),
        supervisor: supervisor.clone(),
        partials: ingest::PartialBudget::new(config.max_partial_bytes),
        config,
        started: Instant::now(),
        connections: AtomicU64::new(0),
        mirror,
    });
    let _helpers = notifier.as_ref().map(|n| {
        let ready = format!("serving on {}", socket.display());
        n.ready(&ready);
        service_tasks(n.clone(), &queue, &shutdown)
    });
    let _reloads = launch.reloads.map(|rx| {
        let task = apply_reloads(queue.clone(), started_with, rx, mirror_configs);
        AbortOnDropHandle::new(tokio::spawn(task))
    });
    let _metrics_http = metrics_listener.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!("serving metrics at http://{addr}/metrics");
        }
        let task = metrics::http::serve(listener, shared.clone(), shutdown.clone());
        AbortOnDropHandle::new(tokio::spawn(task))
    });
    let _timeouts = AbortOnDropHandle::new(tokio::spawn(gates::timeouts::run(
        queue.clone(),
        shutdown.clone(),
    )));
    let _sweep = keep_ended.map(|keep| {
        let task = supervisor.clone().sweep_ended(keep, shutdown.clone());
        AbortOnDropHandle::new(tokio::spawn(task))
    });
    let serving = server::serve(listener, shared, shutdown.clone());
    tokio::pin!(serving);
    tokio::select! {
        // Serving ends only on shutdown, and then both branches are ready:
        // the shutdown branch must win, or STOPPING=1 would be skipped.
        biased;
        () = shutdown.cancelled() => {
            // Said here, by the task that owns shutdown, so that it is sent
            // exactly once and before the drain, however quick that is.
            if let Some(n) = &notifier {
                n.stopping("stopping: finishing the commits in flight");
            }
            serving.await;
        }
        () = &mut serving => {}
    }
    supervisor.close().await;
    mirror_stop.cancel();
    let closed = queue.close().await;
    // An inherited socket belongs to the service manager, which keeps it
    // open across restarts: removing its file would strand it.
    if !inherited {
        if let Err(e) = std::fs::remove_file(&socket) {
            tracing::debug!("could not remove socket {}: {e}", socket.display());
        }
    }
    closed?;
    tracing::info!("tetherd stopped");
    Ok(())
}

/// The socket to serve: the inherited one, else one bound at
/// [`Config::socket`] with the configured mode and group.
fn listen(
    config: &Config,
    activated: Option<activation::Activated>,
) -> Result<tokio::net::UnixListener> {
    let Some(activated) = activated else {
        // Answerers must be able to connect as readers do: without a
        // readers group, the first answerers group shares the socket.
        let shared_with = config
            .readers_group
            .as_deref()
            .or(config.answerers.first().map(String::as_str));
        return server::bind_with(
            &config.socket,
            config.socket_mode,
            config.socket_group.as_deref(),
            shared_with,
        );
    };
    let listener = activated.listener;
    listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("cannot make the inherited socket non-blocking", e))?;
    tokio::net::UnixListener::from_std(listener)
        .map_err(|e| Error::io("cannot serve the inherited socket", e))
}

/// Starts the task that keeps the service manager informed while the
/// daemon runs: the watchdog, when one is asked for. It ends when the
/// returned handles are dropped. (`STOPPING=1` is sent by `run_with`.)
fn service_tasks(
    notifier: Arc<notify::Notifier>,
    queue: &engine::Queue,
    shutdown: &CancellationToken,
) -> Vec<AbortOnDropHandle<()>> {
    let mut tasks = Vec::new();
    if let Some(every) = notifier.watchdog_interval() {
        let task = watchdog(notifier, queue.clone(), every, shutdown.clone());
        tasks.push(AbortOnDropHandle::new(tokio::spawn(task)));
    }
    tasks
}

/// Sends `WATCHDOG=1` every `every`, but only after a round trip through
/// the store's writer came back in time: a daemon whose writer is stuck
/// stops pinging, and the service manager restarts it.
async fn watchdog(
    notifier: Arc<notify::Notifier>,
    queue: engine::Queue,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        match tokio::time::timeout(every, queue.compact()).await {
            // A full disk is answered by a working writer: the daemon is
            // alive and still serves reads, so it must not be restarted.
            Ok(Ok(())) | Ok(Err(Error::DiskFull { .. })) => notifier.watchdog(),
            Ok(Err(e)) => tracing::warn!("watchdog: the store failed its check: {e}"),
            Err(_) => tracing::warn!("watchdog: the store did not answer within {every:?}"),
        }
    }
}

/// Applies reloaded configs: the log level was already applied by the
/// caller; what can only change at a restart is logged as not applied.
async fn apply_reloads(
    queue: engine::Queue,
    mut current: Config,
    mut reloads: mpsc::UnboundedReceiver<Config>,
    mirror: tokio::sync::watch::Sender<Option<mirror::MirrorConfig>>,
) {
    while let Some(new) = reloads.recv().await {
        if new.mirror != current.mirror {
            mirror.send_replace(new.mirror.clone());
        }
        for key in current.needs_restart(&new) {
            tracing::warn!("config reload: {key} changed, but it takes effect only at a restart");
        }
        if new.retention != current.retention {
            apply_retention(&queue, &new.retention).await;
        }
        current = new;
    }
}

/// Puts new retention limits in force.
async fn apply_retention(queue: &engine::Queue, retention: &config::Retention) {
    match queue.set_retention(retention.clone()).await {
        Ok(()) => tracing::info!(?retention, "config reload: retention applied"),
        Err(e) => tracing::warn!("config reload: cannot apply the new retention: {e}"),
    }
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
