//! The NATS JetStream mirror, as `tether status` shows it.

// One module in several files: the message types name each other freely.
use super::*;

/// Answer to [`Request::MirrorStatus`] when the daemon mirrors.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MirrorInfo {
    /// The NATS server(s) mirrored to.
    pub nats_url: String,
    /// The JetStream stream the subjects belong to.
    pub jetstream_stream: String,
    /// The second part of every subject (`PREFIX.SOURCE.STREAM`).
    pub source: String,
    /// False while NATS is unreachable.
    pub connected: bool,
    /// Every mirrored stream, in name order.
    pub streams: Vec<MirrorStreamInfo>,
}

/// One mirrored stream's position.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct MirrorStreamInfo {
    pub stream: String,
    /// The highest seq JetStream has acknowledged.
    pub mirrored_seq: u64,
    /// The stream's last committed seq; the lag is the difference.
    pub last_seq: u64,
}
