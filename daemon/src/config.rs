//! The daemon's settings, with their defaults.

use std::path::PathBuf;
use std::time::Duration;

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
    pub retention: Retention,
}

impl Config {
    /// A config with default limits for the given paths.
    pub fn new(socket: PathBuf, state_dir: PathBuf) -> Self {
        Self {
            socket,
            state_dir,
            max_frame_len: tether_protocol::DEFAULT_MAX_FRAME_LEN,
            max_connections: 4096,
            retention: Retention::default(),
        }
    }

    /// The redb file inside the state directory.
    pub fn store_path(&self) -> PathBuf {
        self.state_dir.join("tether.redb")
    }
}
