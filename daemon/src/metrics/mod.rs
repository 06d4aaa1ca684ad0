//! What `tether metrics` (and `[metrics] listen`) shows: counts, never
//! payloads, in the Prometheus text format.
//!
//! The hot path stays cheap: frames and bytes are counted once per
//! commit, after it is durable (one short lock for the whole commit, not
//! one per frame), commits in an atomic, and the two latency histograms
//! take one observation per commit and per sync of the log. Everything
//! else (connections, executions, storage state) is read when asked.
//!
//! * [`Metrics`]: the counters the engine and the syncer update.
//! * [`render`]: the text, built with prometheus-client's encoder.
//! * [`select`]: which streams get a series of their own.
//! * [`http`]: the optional HTTP listener.

pub mod http;
pub mod render;
pub mod select;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

pub use render::{render, Now};

use crate::connection::Shared;
use crate::Result;

/// The text of `tether metrics` for the daemon that `shared` serves.
pub fn text_of(shared: &Shared) -> Result<String> {
    let executions = shared.supervisor.list(true);
    let now = Now {
        connections: shared.connections.load(Ordering::Relaxed),
        restarts: executions.iter().map(|e| u64::from(e.restarts)).sum(),
        executions: executions.into_iter().map(|e| e.state).collect(),
        degraded: shared.queue.storage_fault().is_some(),
        open_questions: shared.queue.gates().open_count(),
        inbox_messages: shared.queue.gates().inbox_total(),
        mirror_lag: shared
            .mirror
            .state(&shared.queue)
            .map(|m| {
                m.streams
                    .into_iter()
                    .map(|s| (s.stream, s.last - s.mirrored))
                    .collect()
            })
            .unwrap_or_default(),
    };
    render(shared.queue.metrics(), &shared.config.metrics.streams, &now)
}

/// Frames and payload bytes appended to one stream since the daemon
/// started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamCounts {
    pub frames: u64,
    pub bytes: u64,
}

/// The counters updated as the daemon works. Shared by the engine (through
/// `QueueOptions`) and read by [`render`].
#[derive(Debug)]
pub struct Metrics {
    streams: Mutex<HashMap<String, StreamCounts>>,
    commits: AtomicU64,
    commit_seconds: Histogram,
    fsync_seconds: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            streams: Mutex::new(HashMap::new()),
            commits: AtomicU64::new(0),
            commit_seconds: latency_histogram(),
            fsync_seconds: latency_histogram(),
        }
    }

    /// Counts a durable commit's frames of each stream: `(stream, frames,
    /// payload bytes)`.
    pub fn appended<'a>(&self, per_stream: impl IntoIterator<Item = (&'a str, u64, u64)>) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        for (stream, frames, bytes) in per_stream {
            if frames == 0 {
                continue;
            }
            // Looked up by reference first: a stream's name is copied once,
            // when it is first counted.
            let counts = match streams.get_mut(stream) {
                Some(counts) => counts,
                None => streams.entry(stream.to_owned()).or_default(),
            };
            counts.frames += frames;
            counts.bytes += bytes;
        }
    }

    /// Counts one commit of a batch of requests, and how long it took to
    /// apply and commit (the log's sync excluded: see [`Metrics::synced`]).
    pub fn committed(&self, took: Duration) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// Records how long one `fdatasync` of the log took.
    pub fn synced(&self, took: Duration) {
        self.fsync_seconds.observe(took.as_secs_f64());
    }

    /// The counts of every stream appended to since the start.
    pub fn stream_counts(&self) -> Vec<(String, StreamCounts)> {
        let streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }

    /// Commits made since the start.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The commit latency histogram (clones share its counts).
    pub fn commit_seconds(&self) -> Histogram {
        self.commit_seconds.clone()
    }

    /// The log sync latency histogram (clones share its counts).
    pub fn fsync_seconds(&self) -> Histogram {
        self.fsync_seconds.clone()
    }
}

/// Buckets from 10 µs to about 2.6 s, doubling: a commit or a sync on a
/// fast disk takes tens of µs, on a slow or loaded one hundreds of ms.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 19))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn appends_are_summed_per_stream() {
        let metrics = Metrics::new();
        metrics.appended([("a", 2, 10), ("b", 1, 3)]);
        metrics.appended([("a", 1, 5), ("c", 0, 0)]);
        let mut counts = metrics.stream_counts();
        counts.sort();
        assert_eq!(
            counts,
            vec![
                (
                    "a".into(),
                    StreamCounts {
                        frames: 3,
                        bytes: 15
                    }
                ),
                (
                    "b".into(),
                    StreamCounts {
                        frames: 1,
                        bytes: 3
                    }
                ),
            ]
        );
    }
}
