//! The daemon's settings, with their defaults, and the layers that set
//! them: the TOML config file ([`file`]), then `TETHER_*` environment
//! variables, then command-line flags (applied by `main`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub mod file;

pub use file::{ConfigSource, FileConfig};

/// The file name of the shim program looked for next to the daemon.
/// How long ended executions are kept by default: thirty days.
pub const DEFAULT_KEEP_ENDED: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

pub const SHIM_NAME: &str = "tether-shim";

/// Mode of a socket the daemon binds itself: only its own user may connect.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// The tracing filter used when neither the file nor `TETHER_LOG` sets one.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// Per-stream retention limits. A frame is deleted when any limit is
/// exceeded, oldest first, whether or not durable consumers have acked it
/// (a consumer that falls behind retention gets a gap notice, never a
/// silent gap). `None` means no limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retention {
    pub max_frames: Option<u64>,
    pub max_bytes: Option<u64>,
    pub max_age: Option<Duration>,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            max_frames: Some(10_000_000),
            max_bytes: Some(1 << 30),
            max_age: Some(Duration::from_secs(30 * 24 * 3600)),
        }
    }
}

/// Everything `run` needs to know.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where to listen.
    pub socket: PathBuf,
    /// Directory of the store file and the instance lock.
    pub state_dir: PathBuf,
    /// Largest accepted message, length prefix excluded.
    pub max_frame_len: usize,
    /// Connections served at once; one more is refused with an error frame.
    pub max_connections: usize,
    /// Connections one uid other than root and the daemon's own may hold;
    /// `None`: a quarter of `max_connections` (see [`crate::slots`]).
    pub max_connections_per_uid: Option<usize>,
    /// The bytes of partly received messages held across connections;
    /// past it, those that have sent the least are closed. Below
    /// `max_frame_len`, a message that large can never arrive.
    pub max_partial_bytes: usize,
    pub retention: Retention,
    /// The shim program started for every worker attempt; `None` means
    /// `tether-shim` next to the daemon's own executable.
    pub shim: Option<PathBuf>,
    /// Checkpoints kept per execution, newest first (at least 1).
    pub checkpoint_keep: usize,
    /// How long an ended execution is kept before it is removed with its
    /// stream, counted from when it ended; `None` keeps them all.
    pub keep_ended: Option<std::time::Duration>,
    /// Largest checkpoint accepted, in bytes.
    pub max_checkpoint_bytes: usize,
    /// Permission bits of a socket the daemon binds itself (an inherited
    /// one keeps what the socket unit gave it).
    pub socket_mode: u32,
    /// Group given to a socket the daemon binds itself; `None` keeps the
    /// daemon's own group.
    pub socket_group: Option<String>,
    /// The group whose members may read (tail, list, status) but not act;
    /// a name or a numeric gid. `None`: only the daemon's own user and root
    /// are served. See [`crate::access`].
    pub readers_group: Option<String>,
    /// Groups (names or numeric gids) whose members may answer questions
    /// (`tether answer`) and read, as readers do. See [`crate::access`].
    pub answerers: Vec<String>,
    /// Messages one execution's inbox holds at most (`tether send`).
    pub inbox_max_messages: u64,
    /// The tracing filter (`info`, `debug`, `tetherd=trace,info`, ...).
    pub log_level: String,
    /// Restarts allowed to a run that did not say; `None` is unlimited.
    pub default_max_restarts: Option<u32>,
    /// Failures without progress in a row that end a run that did not
    /// say; `None` is the built-in default (5).
    pub default_max_failures_without_progress: Option<u32>,
    /// The write-ahead log's size in bytes. A log that wraps keeps
    /// the size it had when it started to (see [`crate::wal`]).
    pub log_capacity: u64,
    /// How log lines are written (see [`LogFormat`]).
    pub log_format: LogFormat,
    /// What `tether metrics` shows, and where else it is served.
    pub metrics: MetricsConfig,
    /// `[mirror]`: where frames are mirrored; `None`: not mirrored.
    pub mirror: Option<crate::mirror::MirrorConfig>,
}

/// How the daemon writes its log lines.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Text lines to stderr, or the journal's own records under systemd.
    #[default]
    Text,
    /// One JSON object per line, to stderr.
    Json,
}

/// `[metrics]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsConfig {
    /// Globs of the streams shown one by one; empty: the busiest (see
    /// [`crate::metrics::select`]).
    pub streams: Vec<String>,
    /// Where to serve the metrics over HTTP at `/metrics`; `None`: not
    /// served over HTTP.
    pub listen: Option<SocketAddr>,
}

/// `[inbox] max_messages` unless set.
pub const DEFAULT_INBOX_MAX_MESSAGES: u64 = 10_000;

impl Config {
    /// A config with default limits for the given paths.
    pub fn new(socket: PathBuf, state_dir: PathBuf) -> Self {
        Self {
            socket,
            state_dir,
            max_frame_len: tether_protocol::DEFAULT_MAX_FRAME_LEN,
            max_connections: 4096,
            max_connections_per_uid: None,
            max_partial_bytes: crate::ingest::DEFAULT_MAX_PARTIAL_BYTES,
            retention: Retention::default(),
            shim: None,
            checkpoint_keep: 10,
            keep_ended: Some(DEFAULT_KEEP_ENDED),
            max_checkpoint_bytes: 8 * 1024 * 1024,
            socket_mode: DEFAULT_SOCKET_MODE,
            socket_group: None,
            readers_group: None,
            answerers: Vec::new(),
            inbox_max_messages: DEFAULT_INBOX_MAX_MESSAGES,
            log_level: DEFAULT_LOG_LEVEL.to_owned(),
            default_max_restarts: None,
            default_max_failures_without_progress: None,
            log_capacity: crate::wal::DEFAULT_CAPACITY,
            log_format: LogFormat::Text,
            metrics: MetricsConfig::default(),
            mirror: None,
        }
    }

    /// The shim program: [`Config::shim`], else `tether-shim` in the
    /// directory of the running executable.
    pub fn shim_program(&self) -> std::io::Result<PathBuf> {
        if let Some(shim) = &self.shim {
            return Ok(shim.clone());
        }
        let exe = std::env::current_exe()?;
        let dir = exe.parent().ok_or_else(|| {
            std::io::Error::other(format!("executable {} has no directory", exe.display()))
        })?;
        Ok(dir.join(SHIM_NAME))
    }

    /// Where shims' own diagnostics go, one log file per execution.
    pub fn shim_log_dir(&self) -> PathBuf {
        self.state_dir.join("shims")
    }

    /// The redb file inside the state directory.
    pub fn store_path(&self) -> PathBuf {
        self.state_dir.join(crate::store::STORE_FILE)
    }
}
