//! The changes `tetherd repair` gathers from the old store and the log's
//! records before writing them to the new store in batches, in the order
//! they were made: a later removal must meet the chunks, checkpoints or
//! step results it removes already there.

use redb::{ReadableTable, WriteTransaction};

use super::super::schema::{
    CHECKPOINTS, CHUNKS, INBOX, META, META_NEXT_MESSAGE_ID, META_NEXT_QUESTION_ID, QUESTIONS,
    STEPS, STEP_TIMES,
};
use super::super::storage;
use crate::wal::Op;
use crate::Result;

/// A change to the new store waiting in a batch.
pub(super) enum Change {
    Chunk {
        key: (u64, u64),
        bytes: Vec<u8>,
    },
    RemoveChunksBelow {
        stream_id: u64,
        below: u64,
    },
    Checkpoint {
        execution: String,
        id: u64,
        record: Vec<u8>,
    },
    RemoveCheckpointsBelow {
        execution: String,
        below: u64,
    },
    Step {
        execution: String,
        step: String,
        result: Vec<u8>,
        recorded_micros: u64,
    },
    ClearStep {
        execution: String,
        step: String,
    },
    Question {
        execution: String,
        id: u64,
        record: Vec<u8>,
    },
    InboxPut {
        execution: String,
        id: u64,
        message: Vec<u8>,
    },
    InboxRemoveThrough {
        execution: String,
        through: u64,
    },
    /// A `meta` counter that only grows (the next question or message id).
    Counter {
        key: &'static str,
        value: u64,
    },
}

impl Change {
    /// The change a log op on an execution's checkpoints, steps,
    /// questions or inbox makes; `None` for the ops on streams.
    pub(super) fn of_execution_op(op: Op<'_>) -> Option<Change> {
        Some(match op {
            Op::Checkpoint {
                execution,
                id,
                record,
            } => Change::Checkpoint {
                execution: execution.to_owned(),
                id,
                record: record.0.to_vec(),
            },
            Op::RemoveCheckpointsBelow { execution, below } => Change::RemoveCheckpointsBelow {
                execution: execution.to_owned(),
                below,
            },
            Op::Step {
                execution,
                step,
                result,
                recorded_micros,
            } => Change::Step {
                execution: execution.to_owned(),
                step: step.to_owned(),
                result: result.0.to_vec(),
                recorded_micros,
            },
            Op::ClearStep { execution, step } => Change::ClearStep {
                execution: execution.to_owned(),
                step: step.to_owned(),
            },
            Op::Question {
                execution,
                id,
                record,
            } => Change::Question {
                execution: execution.to_owned(),
                id,
                record: record.0.to_vec(),
            },
            Op::InboxPut {
                execution,
                id,
                message,
            } => Change::InboxPut {
                execution: execution.to_owned(),
                id,
                message: message.0.to_vec(),
            },
            Op::InboxRemoveThrough { execution, through } => Change::InboxRemoveThrough {
                execution: execution.to_owned(),
                through,
            },
            Op::NextQuestionId(value) => Change::Counter {
                key: META_NEXT_QUESTION_ID,
                value,
            },
            Op::NextMessageId(value) => Change::Counter {
                key: META_NEXT_MESSAGE_ID,
                value,
            },
            Op::Stream { .. }
            | Op::Chunk { .. }
            | Op::RemoveChunksBelow { .. }
            | Op::Producer { .. }
            | Op::Consumer { .. }
            | Op::NextStreamId(_) => return None,
        })
    }

    /// The bytes of values it holds, which bound a batch.
    pub(super) fn bytes(&self) -> usize {
        match self {
            Change::Chunk { bytes, .. } => bytes.len(),
            Change::Checkpoint { record, .. } => record.len(),
            Change::Step { result, .. } => result.len(),
            Change::Question { record, .. } => record.len(),
            Change::InboxPut { message, .. } => message.len(),
            Change::RemoveChunksBelow { .. }
            | Change::RemoveCheckpointsBelow { .. }
            | Change::ClearStep { .. }
            | Change::InboxRemoveThrough { .. }
            | Change::Counter { .. } => 0,
        }
    }

    /// The execution whose checkpoint or step result it keeps, if any.
    pub(super) fn execution(&self) -> Option<&str> {
        match self {
            Change::Checkpoint { execution, .. }
            | Change::Step { execution, .. }
            | Change::Question { execution, .. }
            | Change::InboxPut { execution, .. } => Some(execution),
            _ => None,
        }
    }
}

/// Writes `batch` to the new store in `txn`, in order.
pub(super) fn apply(txn: &WriteTransaction, batch: &[Change]) -> Result<()> {
    let mut chunks = txn.open_table(CHUNKS).map_err(storage)?;
    let mut checkpoints = txn.open_table(CHECKPOINTS).map_err(storage)?;
    let mut steps = txn.open_table(STEPS).map_err(storage)?;
    let mut step_times = txn.open_table(STEP_TIMES).map_err(storage)?;
    let mut questions = txn.open_table(QUESTIONS).map_err(storage)?;
    let mut inbox = txn.open_table(INBOX).map_err(storage)?;
    let mut meta = txn.open_table(META).map_err(storage)?;
    for change in batch {
        match change {
            Change::Chunk { key, bytes } => {
                chunks.insert(*key, bytes.as_slice()).map_err(storage)?;
            }
            Change::RemoveChunksBelow { stream_id, below } => chunks
                .retain_in((*stream_id, 0)..(*stream_id, *below), |_, _| false)
                .map_err(storage)?,
            Change::Checkpoint {
                execution,
                id,
                record,
            } => {
                checkpoints
                    .insert((execution.as_str(), *id), record.as_slice())
                    .map_err(storage)?;
            }
            Change::RemoveCheckpointsBelow { execution, below } => {
                let execution = execution.as_str();
                checkpoints
                    .retain_in((execution, 0)..(execution, *below), |_, _| false)
                    .map_err(storage)?;
            }
            Change::Step {
                execution,
                step,
                result,
                recorded_micros,
            } => {
                let key = (execution.as_str(), step.as_str());
                steps.insert(key, result.as_slice()).map_err(storage)?;
                step_times.insert(key, *recorded_micros).map_err(storage)?;
            }
            Change::ClearStep { execution, step } => {
                let key = (execution.as_str(), step.as_str());
                steps.remove(key).map_err(storage)?;
                step_times.remove(key).map_err(storage)?;
            }
            Change::Question {
                execution,
                id,
                record,
            } => {
                questions
                    .insert((execution.as_str(), *id), record.as_slice())
                    .map_err(storage)?;
            }
            Change::InboxPut {
                execution,
                id,
                message,
            } => {
                inbox
                    .insert((execution.as_str(), *id), message.as_slice())
                    .map_err(storage)?;
            }
            Change::InboxRemoveThrough { execution, through } => {
                let execution = execution.as_str();
                inbox
                    .retain_in((execution, 0)..=(execution, *through), |_, _| false)
                    .map_err(storage)?;
            }
            Change::Counter { key, value } => {
                let kept = meta.get(*key).map_err(storage)?.map_or(0, |v| v.value());
                if *value > kept {
                    meta.insert(*key, *value).map_err(storage)?;
                }
            }
        }
    }
    Ok(())
}
