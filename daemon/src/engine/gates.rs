//! Questions and inboxes through the writer: a question is stored with
//! its `ask` or `answer` frame in one commit, and messages are queued and
//! removed with group commit, like appends (see [`crate::gates`], which
//! decides what to change; this only writes it).

use bytes::Bytes;
use tether_protocol::{Frame, FrameKind, InboxMessage};

use super::apply::{put_new_frame, Staged};
use super::commands::{Outcome, Reply, Request};
use super::writer::Writer;
use super::Queue;
use crate::gates::QuestionRecord;
use crate::store::WriteTxn;
use crate::{Error, Result};

/// A change to questions or an inbox, decided by [`crate::gates`].
#[derive(Debug)]
pub enum GateChange {
    /// Store a question. With `frame`, first append it (an `ask` frame's
    /// seq goes into the question, an `answer` frame's into its outcome).
    /// `next_id`: the next question id, when this one is new.
    Question {
        record: Box<QuestionRecord>,
        frame: Option<(FrameKind, Bytes)>,
        next_id: Option<u64>,
    },
    /// Queue a message; `next_id` is the id after it.
    Send {
        execution: String,
        message: InboxMessage,
        next_id: u64,
    },
    /// Remove the messages of an execution's inbox up to `through`.
    Dequeue { execution: String, through: u64 },
}

impl GateChange {
    /// (frames, payload bytes) it adds to a commit.
    pub(super) fn weight(&self) -> (usize, usize) {
        match self {
            GateChange::Question { frame, .. } => (1, frame.as_ref().map_or(0, |(_, p)| p.len())),
            GateChange::Send { message, .. } => (1, message.data.len()),
            GateChange::Dequeue { .. } => (1, 0),
        }
    }
}

/// What a [`GateChange`] did.
#[derive(Debug)]
pub enum GateOutcome {
    /// The question as stored (with its frame's seq).
    Question(Box<QuestionRecord>),
    /// The message was queued.
    Queued,
    /// How many messages were removed.
    Dequeued(u64),
}

impl Writer {
    pub(super) fn apply_gate(
        &mut self,
        txn: &mut WriteTxn<'_>,
        change: GateChange,
        ts: u64,
        staged: &mut Staged,
    ) -> Result<Result<Outcome>> {
        let execution = match &change {
            GateChange::Question { record, .. } => record.info.execution.clone(),
            GateChange::Send { execution, .. } | GateChange::Dequeue { execution, .. } => {
                execution.clone()
            }
        };
        if !txn.has_execution(&execution)? {
            return Ok(Err(Error::ExecutionNotFound(execution)));
        }
        let outcome = match change {
            GateChange::Question {
                mut record,
                frame,
                next_id,
            } => {
                if let Some((kind, payload)) = frame {
                    let stream = self.stream_or_create(&execution, ts, staged);
                    let frame = Frame {
                        ts_micros: ts,
                        kind,
                        payload,
                    };
                    let seq = put_new_frame(txn, stream, frame, staged.frames_of(&execution))?;
                    match (&mut record.info.outcome, kind) {
                        (Some(outcome), FrameKind::Answer) => outcome.seq = seq,
                        _ => record.info.seq = seq,
                    }
                }
                txn.put_question(&execution, record.info.id, &record.encode()?)?;
                if let Some(next) = next_id {
                    txn.set_next_question_id(next)?;
                }
                GateOutcome::Question(record)
            }
            GateChange::Send {
                message, next_id, ..
            } => {
                let bytes = postcard::to_allocvec(&message).map_err(|e| {
                    Error::storage(format!("cannot encode message {}", message.id), e)
                })?;
                txn.put_inbox(&execution, message.id, &bytes)?;
                txn.set_next_message_id(next_id)?;
                GateOutcome::Queued
            }
            GateChange::Dequeue { through, .. } => {
                GateOutcome::Dequeued(txn.remove_inbox_through(&execution, through)?)
            }
        };
        Ok(Ok(Outcome::Gate(outcome)))
    }
}

impl Queue {
    /// Commits a change to questions or an inbox; resolves once durable.
    pub async fn gate(&self, change: GateChange) -> Result<GateOutcome> {
        self.call(Request::Gate(change), Reply::Gate).await
    }

    /// The oldest messages of an execution's inbox (see
    /// [`crate::store::Store::inbox`]), once what was read is durable.
    pub async fn inbox(
        &self,
        execution: &str,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<InboxMessage>> {
        let execution = execution.to_owned();
        self.read_durable(move |store| store.inbox(&execution, max, max_bytes))
            .await
    }

    /// Questions and inbox counts in memory.
    pub fn gates(&self) -> &crate::gates::Gates {
        &self.inner.gates
    }
}
