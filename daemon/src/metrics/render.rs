//! The Prometheus text of `tether metrics`, built with prometheus-client's
//! encoder (OpenMetrics text, which Prometheus reads) from the counters and
//! from what is read at the time of asking.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tether_protocol::ExecState;

use super::select::{split, OTHER_STREAMS};
use super::Metrics;
use crate::{Error, Result};

/// Every execution state, so that each has a series (0 when none is in it)
/// and a state appearing does not make a series appear from nothing.
const STATES: [ExecState; 9] = [
    ExecState::Pending,
    ExecState::Starting,
    ExecState::Running,
    ExecState::Backoff,
    ExecState::Completed,
    ExecState::Failed,
    ExecState::Cancelled,
    ExecState::Lost,
    ExecState::Waiting,
];

/// What is read at the time of asking, besides the counters.
#[derive(Clone, Debug, Default)]
pub struct Now {
    /// Sessions open.
    pub connections: u64,
    /// The state of every execution kept.
    pub executions: Vec<ExecState>,
    /// Restarts of the executions kept, summed.
    pub restarts: u64,
    /// Whether the store refuses writes now (degraded mode).
    pub degraded: bool,
    /// Questions open, across every execution.
    pub open_questions: u64,
    /// Messages waiting, across every inbox.
    pub inbox_messages: u64,
    /// Frames not yet mirrored, per mirrored stream (`[mirror]`).
    pub mirror_lag: Vec<(String, u64)>,
}

type Labels = Vec<(&'static str, String)>;

/// The whole text: every series, then `# EOF`. `globs` are
/// `[metrics] streams` (see [`super::select`]).
pub fn render(metrics: &Metrics, globs: &[String], now: &Now) -> Result<String> {
    let mut registry = Registry::with_prefix("tether");

    let (shown, rest) = split(metrics.stream_counts(), globs);
    let frames = Family::<Labels, Counter>::default();
    let bytes = Family::<Labels, Counter>::default();
    for (name, counts) in shown
        .into_iter()
        .chain(std::iter::once((OTHER_STREAMS.to_owned(), rest)))
    {
        let labels = vec![("stream", name)];
        frames.get_or_create(&labels).inc_by(counts.frames);
        bytes.get_or_create(&labels).inc_by(counts.bytes);
    }
    registry.register(
        "frames_appended",
        "Frames appended and made durable, per stream (the rest summed as \
         \"(other streams)\")",
        frames,
    );
    registry.register(
        "bytes_appended",
        "Payload bytes appended and made durable, per stream",
        bytes,
    );

    let commits = Counter::<u64>::default();
    commits.inc_by(metrics.commits());
    registry.register("commits", "Group commits of requests", commits);
    registry.register(
        "commit_seconds",
        "Time to apply and commit a batch, the log's sync excluded",
        metrics.commit_seconds(),
    );
    registry.register(
        "fsync_seconds",
        "Time of one fdatasync of the write-ahead log",
        metrics.fsync_seconds(),
    );

    let connections = Gauge::<i64>::default();
    connections.set(gauge(now.connections));
    registry.register("connections", "Client sessions open", connections);

    let executions = Family::<Labels, Gauge>::default();
    for state in STATES {
        let n = now.executions.iter().filter(|s| **s == state).count();
        executions
            .get_or_create(&vec![("state", state.as_str().to_owned())])
            .set(gauge(n as u64));
    }
    registry.register("executions", "Executions kept, by state", executions);

    let restarts = Counter::<u64>::default();
    restarts.inc_by(now.restarts);
    registry.register(
        "restarts",
        "Restarts of the executions kept, summed",
        restarts,
    );

    let open_questions = Gauge::<i64>::default();
    open_questions.set(gauge(now.open_questions));
    registry.register(
        "questions_open",
        "Questions asked and not yet answered or timed out",
        open_questions,
    );
    let inbox_messages = Gauge::<i64>::default();
    inbox_messages.set(gauge(now.inbox_messages));
    registry.register(
        "inbox_messages",
        "Messages waiting in the executions' inboxes",
        inbox_messages,
    );

    let degraded = Gauge::<i64>::default();
    degraded.set(i64::from(now.degraded));
    registry.register(
        "storage_degraded",
        "1 while the store refuses writes (degraded mode), else 0",
        degraded,
    );

    if !now.mirror_lag.is_empty() {
        let lag = Family::<Labels, Gauge>::default();
        for (stream, frames) in &now.mirror_lag {
            lag.get_or_create(&vec![("stream", stream.clone())])
                .set(gauge(*frames));
        }
        registry.register(
            "mirror_lag_frames",
            "Committed frames NATS JetStream has not acknowledged yet, per mirrored stream",
            lag,
        );
    }

    let mut text = String::new();
    encode(&mut text, &registry)
        .map_err(|_| Error::Invariant("the metrics text could not be written".into()))?;
    Ok(text)
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use super::*;

    #[test]
    fn the_text_has_every_series_with_exact_counts() {
        let metrics = Metrics::new();
        metrics.appended([("a", 3, 30), ("b", 1, 4)]);
        metrics.committed(Duration::from_micros(50));
        metrics.synced(Duration::from_micros(70));
        let now = Now {
            connections: 2,
            executions: vec![ExecState::Running, ExecState::Failed, ExecState::Running],
            restarts: 4,
            degraded: true,
            open_questions: 3,
            inbox_messages: 5,
            mirror_lag: vec![("b".into(), 7)],
        };
        let text = render(&metrics, &["a".into()], &now).unwrap();
        for line in [
            "tether_frames_appended_total{stream=\"a\"} 3",
            "tether_frames_appended_total{stream=\"(other streams)\"} 1",
            "tether_bytes_appended_total{stream=\"a\"} 30",
            "tether_bytes_appended_total{stream=\"(other streams)\"} 4",
            "tether_commits_total 1",
            "tether_commit_seconds_count 1",
            "tether_fsync_seconds_count 1",
            "tether_connections 2",
            "tether_executions{state=\"running\"} 2",
            "tether_executions{state=\"failed\"} 1",
            "tether_executions{state=\"lost\"} 0",
            "tether_restarts_total 4",
            "tether_storage_degraded 1",
            "tether_questions_open 3",
            "tether_inbox_messages 5",
            "tether_executions{state=\"waiting\"} 0",
            "tether_mirror_lag_frames{stream=\"b\"} 7",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
