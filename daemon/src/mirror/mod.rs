//! The mirror: committed frames of the streams matching `[mirror] streams`
//! published into NATS JetStream, each exactly once, in seq order per
//! stream (see [`stream`] for how).
//!
//! It reads committed frames through ordinary subscriptions on its own
//! thread, at a lower CPU priority than the daemon's, so producers never
//! wait for NATS, nor for the mirror's share of the CPU. Its position in each stream
//! is the consumer [`CONSUMER`]'s ack, which commits like any other and
//! holds back compaction of what JetStream has not acknowledged.
//!
//! A reload (SIGHUP) with other `[mirror]` settings stops every stream's
//! task and starts again with the new ones.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod nats;
#[cfg(feature = "test-hooks")]
pub mod read_back;
mod stream;

pub use config::{MirrorConfig, MirrorSection};

use crate::engine::Queue;
use crate::metrics::select::glob_matches;

/// The consumer whose ack is the mirror's position in a stream.
pub const CONSUMER: &str = "tether-mirror";

/// The header carrying a frame's seq.
pub const HEADER_SEQ: &str = "Tether-Seq";
/// The header carrying a frame's kind (`data`, `stdout`, ...).
pub const HEADER_KIND: &str = "Tether-Kind";
/// The header carrying when the daemon accepted a frame, in microseconds
/// since the Unix epoch.
pub const HEADER_TS: &str = "Tether-Ts";

/// How often the list of streams is looked at for new ones.
const DISCOVER_EVERY: Duration = Duration::from_millis(250);

/// How many steps of `nice` the mirror's thread runs below the daemon.
/// Mirroring is catch-up work: when the machine is short of CPU, the
/// writer, producers and readers go first and the mirror's lag grows, to
/// be worked off when there is room.
const NICE_STEPS: i32 = 10;

/// Runs `task` on this thread, lowered [`NICE_STEPS`], in a runtime of its
/// own (so that its threads, and the store reads it starts, carry the
/// lower priority).
fn run_below_the_daemon(task: impl std::future::Future<Output = ()>) {
    // On Linux a thread's id names that one thread to setpriority(2).
    let me = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(me)
        .and_then(|now| rustix::process::setpriority_process(me, now + NICE_STEPS));
    if let Err(e) = lowered {
        tracing::debug!("the mirror runs at the daemon's priority: {e}");
    }
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(task),
        Err(e) => tracing::error!("cannot start the mirror's runtime: {e}; nothing is mirrored"),
    }
}

/// One stream's mirror lag, as `status` and `tether metrics` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamLag {
    pub stream: String,
    /// The highest seq JetStream has acknowledged.
    pub mirrored: u64,
    /// The stream's last committed seq.
    pub last: u64,
}

/// The mirror as the rest of the daemon sees it: its settings, NATS's
/// state and each stream's position.
#[derive(Clone, Debug, Default)]
pub struct Mirror {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The settings in force, with the source resolved; `None`: off.
    config: Mutex<Option<(MirrorConfig, String)>>,
    /// Whether NATS is unreachable now.
    down: std::sync::atomic::AtomicBool,
    positions: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
}

/// What `status` shows of the mirror.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MirrorState {
    pub nats_url: String,
    pub jetstream_stream: String,
    pub source: String,
    pub connected: bool,
    pub streams: Vec<StreamLag>,
}

impl Mirror {
    /// Starts the mirror with `config` (off when `None`); returns its
    /// handle and a sender of reloaded settings. It stops with `shutdown`.
    pub fn start(
        queue: Queue,
        config: Option<MirrorConfig>,
        shutdown: CancellationToken,
    ) -> (Mirror, watch::Sender<Option<MirrorConfig>>) {
        let mirror = Mirror::default();
        let (tx, rx) = watch::channel(config);
        let task = mirror.clone().manage(queue, rx, shutdown);
        if let Err(e) = std::thread::Builder::new()
            .name("tether-mirror".into())
            .spawn(move || run_below_the_daemon(task))
        {
            tracing::error!("cannot start the mirror's thread: {e}; nothing is mirrored");
        }
        (mirror, tx)
    }

    /// Each mirrored stream's lag, in name order; `None` when the mirror
    /// is off.
    pub fn state(&self, queue: &Queue) -> Option<MirrorState> {
        let (config, source) = lock(&self.inner.config).clone()?;
        let streams = lock(&self.inner.positions)
            .iter()
            .filter_map(|(name, position)| {
                let (_, last) = queue.stream_range(name)?;
                Some(StreamLag {
                    stream: name.clone(),
                    mirrored: position.load(Ordering::Relaxed).min(last),
                    last,
                })
            })
            .collect();
        Some(MirrorState {
            nats_url: config.nats_url,
            jetstream_stream: config.jetstream_stream,
            source,
            connected: !self.inner.down.load(Ordering::Relaxed),
            streams,
        })
    }

    /// Runs the settings in force until they change or the daemon stops.
    async fn manage(
        self,
        queue: Queue,
        mut configs: watch::Receiver<Option<MirrorConfig>>,
        shutdown: CancellationToken,
    ) {
        // Without reloads the sender is gone at once; the settings then
        // stay as they are.
        let mut reloadable = true;
        loop {
            let config = configs.borrow_and_update().clone();
            let stop = shutdown.child_token();
            let running = async {
                match config {
                    Some(config) => self.run(&queue, config, &stop).await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(running);
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = &mut running => return,
                    changed = configs.changed(), if reloadable => match changed {
                        Ok(()) => break,
                        Err(_) => reloadable = false,
                    },
                }
            }
            stop.cancel();
            *lock(&self.inner.config) = None;
            lock(&self.inner.positions).clear();
            tracing::info!("config reload: mirror settings applied");
        }
    }

    /// Mirrors every matching stream with `config` until `stop`.
    async fn run(&self, queue: &Queue, config: MirrorConfig, stop: &CancellationToken) {
        let source = config.source.clone().unwrap_or_else(config::host_name);
        *lock(&self.inner.config) = Some((config.clone(), source.clone()));
        let nats = Arc::new(nats::Nats::new(config.clone()));
        tracing::info!(
            nats = %config.nats_url,
            jetstream_stream = %config.jetstream_stream,
            source = %source,
            "mirroring streams to NATS JetStream"
        );
        let mut tasks = JoinSet::new();
        let mut tick = tokio::time::interval(DISCOVER_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.inner.down.store(nats.is_down(), Ordering::Relaxed);
            while tasks.try_join_next().is_some() {}
            let mut positions = lock(&self.inner.positions);
            // A stream whose task ended was removed; one of its name made
            // since is mirrored afresh.
            positions.retain(|name, _| queue.stream_range(name).is_some());
            for (name, _) in queue.last_seqs() {
                let wanted = config.streams.is_empty()
                    || config.streams.iter().any(|g| glob_matches(g, &name));
                if !wanted || positions.contains_key(&name) {
                    continue;
                }
                let position = Arc::new(AtomicU64::new(0));
                positions.insert(name.clone(), position.clone());
                let mirrored = stream::Mirrored {
                    queue: queue.clone(),
                    nats: nats.clone(),
                    source: source.clone(),
                    subject: config::subject(&config.subject_prefix, &source, &name),
                    stream: name,
                    position,
                };
                tasks.spawn(stream::run(mirrored));
            }
        }
        tasks.shutdown().await;
    }
}

/// What `tether status` shows of the mirror; `None` when it is off.
pub fn info(mirror: &Mirror, queue: &Queue) -> Option<tether_protocol::MirrorInfo> {
    let state = mirror.state(queue)?;
    Some(tether_protocol::MirrorInfo {
        nats_url: state.nats_url,
        jetstream_stream: state.jetstream_stream,
        source: state.source,
        connected: state.connected,
        streams: state
            .streams
            .into_iter()
            .map(|s| tether_protocol::MirrorStreamInfo {
                stream: s.stream,
                mirrored_seq: s.mirrored,
                last_seq: s.last,
            })
            .collect(),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
