//! The commands the [`Queue`](super::Queue) handle sends the writer: the
//! requests, what each weighs against the batch bounds and the in-flight
//! budget, and the replies that carry each outcome back to its caller.

use bytes::Bytes;
use tether_protocol::{CheckpointMeta, CheckpointSave, UserMeta};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use super::AppendOutcome;
use crate::checkpoint::Resume;
use crate::config::Retention;
use crate::ingest::IngestAppend;
use crate::{Error, Result};

#[derive(Debug)]
pub(super) struct Command {
    pub(super) request: Request,
    pub(super) reply: Reply,
    /// Its share of [`IN_FLIGHT_BUDGET`](super::IN_FLIGHT_BUDGET), given
    /// back once it is answered.
    pub(super) in_flight: OwnedSemaphorePermit,
}

#[derive(Debug)]
pub(super) enum Request {
    Append(Vec<IngestAppend>),
    OpenConsumer {
        stream: String,
        consumer: String,
    },
    Ack {
        stream: String,
        consumer: String,
        through_seq: u64,
    },
    Record {
        execution: String,
        manifest: Vec<u8>,
        events: Vec<Bytes>,
        /// Also look up and announce what a new attempt resumes from.
        resume: bool,
        /// `tether resume --checkpoint`: the attempt resumes from this
        /// checkpoint, copied as the newest, rather than the newest valid one.
        from_checkpoint: Option<u64>,
    },
    SaveCheckpoint {
        save: CheckpointSave,
        user_meta: UserMeta,
    },
    PutStep {
        execution: String,
        step: String,
        result: Bytes,
    },
    /// Forget the named steps, or every one when `steps` is `None`.
    ClearSteps {
        execution: String,
        steps: Option<Vec<String>>,
    },
    /// Remove executions (manifest, checkpoints, steps and the stream of
    /// the same name) and streams; names not found are skipped.
    Remove {
        executions: Vec<String>,
        streams: Vec<String>,
    },
    /// A question recorded or closed, or an inbox changed.
    Gate(super::gates::GateChange),
    Compact,
    /// Handled by the writer without a transaction.
    SetRetention(Retention),
}

impl Request {
    /// (frames, payload bytes) this request adds to a commit.
    pub(super) fn weight(&self) -> (usize, usize) {
        match self {
            Request::Append(appends) => {
                (appends.len(), appends.iter().map(|a| a.payload.len()).sum())
            }
            Request::OpenConsumer { .. } | Request::Ack { .. } => (1, 0),
            Request::Record {
                manifest, events, ..
            } => (
                events.len() + 1,
                manifest.len() + events.iter().map(Bytes::len).sum::<usize>(),
            ),
            Request::SaveCheckpoint { save, .. } => (1, save.data.len()),
            Request::PutStep { result, .. } => (1, result.len()),
            Request::ClearSteps { .. } => (1, 0),
            Request::Remove {
                executions,
                streams,
            } => (executions.len() + streams.len(), 0),
            Request::Gate(change) => change.weight(),
            Request::Compact | Request::SetRetention(_) => (0, 0),
        }
    }
}

#[derive(Debug)]
pub(super) enum Reply {
    Append(oneshot::Sender<Result<Vec<AppendOutcome>>>),
    OpenConsumer(oneshot::Sender<Result<u64>>),
    Ack(oneshot::Sender<Result<()>>),
    Record(oneshot::Sender<Result<Recorded>>),
    Checkpoint(oneshot::Sender<Result<CheckpointMeta>>),
    Step(oneshot::Sender<Result<Bytes>>),
    Cleared(oneshot::Sender<Result<u64>>),
    Removed(oneshot::Sender<Result<Removed>>),
    Compact(oneshot::Sender<Result<()>>),
    Gate(oneshot::Sender<Result<super::gates::GateOutcome>>),
}

/// What a removal found and removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The executions that had a manifest.
    pub executions: Vec<String>,
    /// The streams that existed, with their last seq (now a tombstone).
    pub streams: Vec<(String, u64)>,
}

/// What recording an execution change returns.
#[derive(Debug)]
pub(super) struct Recorded {
    /// The stream's last seq after the commit.
    pub(super) last_seq: u64,
    /// What the new attempt resumes from, when that was asked for.
    pub(super) resume: Option<Resume>,
}

#[derive(Debug)]
pub(super) enum Outcome {
    Appended(Vec<AppendOutcome>),
    Consumer(u64),
    /// An execution was recorded.
    Recorded(Recorded),
    /// A checkpoint was saved.
    Checkpoint(CheckpointMeta),
    /// A durable step's kept result.
    Step(Bytes),
    /// How many step results were forgotten.
    Cleared(u64),
    /// What a removal found.
    Removed(Removed),
    /// A question or an inbox changed.
    Gate(super::gates::GateOutcome),
    /// An ack or a compaction finished.
    Done,
}

impl Reply {
    /// Answers the caller. A caller that went away is not an error: the
    /// work is committed either way and a resend is deduplicated.
    pub(super) fn send(self, result: Result<Outcome>) {
        match (self, result) {
            (Reply::Append(tx), Ok(Outcome::Appended(v))) => {
                let _ = tx.send(Ok(v));
            }
            (Reply::OpenConsumer(tx), Ok(Outcome::Consumer(a))) => {
                let _ = tx.send(Ok(a));
            }
            (Reply::Record(tx), Ok(Outcome::Recorded(recorded))) => {
                let _ = tx.send(Ok(recorded));
            }
            (Reply::Checkpoint(tx), Ok(Outcome::Checkpoint(meta))) => {
                let _ = tx.send(Ok(meta));
            }
            (Reply::Step(tx), Ok(Outcome::Step(result))) => {
                let _ = tx.send(Ok(result));
            }
            (Reply::Cleared(tx), Ok(Outcome::Cleared(n))) => {
                let _ = tx.send(Ok(n));
            }
            (Reply::Removed(tx), Ok(Outcome::Removed(removed))) => {
                let _ = tx.send(Ok(removed));
            }
            (Reply::Gate(tx), Ok(Outcome::Gate(outcome))) => {
                let _ = tx.send(Ok(outcome));
            }
            (Reply::Ack(tx) | Reply::Compact(tx), Ok(Outcome::Done)) => {
                let _ = tx.send(Ok(()));
            }
            (reply, Ok(_)) => reply.fail(Error::Invariant(
                "internal error: answer of the wrong kind".into(),
            )),
            (reply, Err(e)) => reply.fail(e),
        }
    }

    pub(super) fn fail(self, e: Error) {
        // Ignored for the reason given in `send`.
        let _ = match self {
            Reply::Append(tx) => tx.send(Err(e)).is_ok(),
            Reply::OpenConsumer(tx) => tx.send(Err(e)).is_ok(),
            Reply::Record(tx) => tx.send(Err(e)).is_ok(),
            Reply::Checkpoint(tx) => tx.send(Err(e)).is_ok(),
            Reply::Step(tx) => tx.send(Err(e)).is_ok(),
            Reply::Cleared(tx) => tx.send(Err(e)).is_ok(),
            Reply::Removed(tx) => tx.send(Err(e)).is_ok(),
            Reply::Ack(tx) | Reply::Compact(tx) => tx.send(Err(e)).is_ok(),
            Reply::Gate(tx) => tx.send(Err(e)).is_ok(),
        };
    }
}
