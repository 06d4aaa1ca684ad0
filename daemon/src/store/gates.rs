//! Questions and inboxes in the store: the write transaction's changes
//! (each logged as its own op, so that they commit with group commit like
//! appends) and their replay, and the reads the daemon starts from.

use tether_protocol::InboxMessage;

use super::schema::{INBOX, META, META_NEXT_MESSAGE_ID, META_NEXT_QUESTION_ID, QUESTIONS};
use super::txn::WriteTxn;
use super::{storage, Store};
use crate::wal::{Op, RawBytes};
use crate::{Error, Result};

/// What a message costs in an answer besides its data, at most: its id,
/// time and sender, as varints, and its data's length.
pub const MESSAGE_OVERHEAD: usize = 40;

/// What the store holds of questions and inboxes, read once at start.
#[derive(Debug, Default)]
pub struct GatesSnapshot {
    /// (execution id, question id, encoded record), in key order.
    pub questions: Vec<(String, u64, Vec<u8>)>,
    /// How many messages wait in each execution's inbox.
    pub inbox_counts: Vec<(String, u64)>,
    /// The id the next question gets.
    pub next_question_id: u64,
    /// The id the next inbox message gets.
    pub next_message_id: u64,
}

impl WriteTxn<'_> {
    /// Stores a question's record (asked, or closed).
    pub fn put_question(&mut self, execution: &str, id: u64, record: &[u8]) -> Result<()> {
        self.take_room(execution.len() + record.len() + 8)?;
        self.questions
            .get()?
            .insert((execution, id), record)
            .map_err(storage)?;
        self.log(&Op::Question {
            execution,
            id,
            record: RawBytes(record),
        })
    }

    /// Records the id the next question gets.
    pub fn set_next_question_id(&mut self, id: u64) -> Result<()> {
        self.meta
            .get()?
            .insert(META_NEXT_QUESTION_ID, id)
            .map_err(storage)?;
        self.log(&Op::NextQuestionId(id))
    }

    /// Queues an encoded message in an execution's inbox.
    pub fn put_inbox(&mut self, execution: &str, id: u64, message: &[u8]) -> Result<()> {
        self.take_room(execution.len() + message.len() + 8)?;
        self.inbox
            .get()?
            .insert((execution, id), message)
            .map_err(storage)?;
        self.log(&Op::InboxPut {
            execution,
            id,
            message: RawBytes(message),
        })
    }

    /// Records the id the next inbox message gets.
    pub fn set_next_message_id(&mut self, id: u64) -> Result<()> {
        self.meta
            .get()?
            .insert(META_NEXT_MESSAGE_ID, id)
            .map_err(storage)?;
        self.log(&Op::NextMessageId(id))
    }

    /// Removes the messages of an execution's inbox with ids up to
    /// `through`; returns how many there were.
    pub fn remove_inbox_through(&mut self, execution: &str, through: u64) -> Result<u64> {
        let removed = self.drop_inbox_through(execution, through)?;
        if removed > 0 {
            self.log(&Op::InboxRemoveThrough { execution, through })?;
        }
        Ok(removed)
    }

    fn drop_inbox_through(&mut self, execution: &str, through: u64) -> Result<u64> {
        let mut removed = 0;
        self.inbox
            .get()?
            .retain_in((execution, 0)..=(execution, through), |_, _| {
                removed += 1;
                false
            })
            .map_err(storage)?;
        Ok(removed)
    }

    /// Removes every question and inbox message of an execution, with
    /// [`WriteTxn::remove_execution`] (a durable commit, so not logged).
    pub(super) fn remove_gates_of(&mut self, execution: &str) -> Result<()> {
        self.questions
            .get()?
            .retain_in((execution, 0)..=(execution, u64::MAX), |_, _| false)
            .map_err(storage)?;
        self.inbox
            .get()?
            .retain_in((execution, 0)..=(execution, u64::MAX), |_, _| false)
            .map_err(storage)
    }

    /// Applies one replayed op of questions or inboxes; `false` for any
    /// other op.
    pub(super) fn apply_gate_op(&mut self, op: &Op<'_>) -> Result<bool> {
        match *op {
            Op::Question {
                execution,
                id,
                record,
            } => self
                .questions
                .get()?
                .insert((execution, id), record.0)
                .map(drop)
                .map_err(storage)?,
            Op::NextQuestionId(id) => self
                .meta
                .get()?
                .insert(META_NEXT_QUESTION_ID, id)
                .map(drop)
                .map_err(storage)?,
            Op::InboxPut {
                execution,
                id,
                message,
            } => self
                .inbox
                .get()?
                .insert((execution, id), message.0)
                .map(drop)
                .map_err(storage)?,
            Op::InboxRemoveThrough { execution, through } => {
                self.drop_inbox_through(execution, through)?;
            }
            Op::NextMessageId(id) => self
                .meta
                .get()?
                .insert(META_NEXT_MESSAGE_ID, id)
                .map(drop)
                .map_err(storage)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Store {
    /// Every question, the inbox counts and the next ids, as committed.
    pub fn load_gates(&self) -> Result<GatesSnapshot> {
        self.read_in(|txn| {
            let meta = txn.open_table(META).map_err(|e| self.fail(e))?;
            let counter = |key: &str| -> Result<u64> {
                let value = meta.get(key).map_err(|e| self.fail(e))?;
                Ok(value.map_or(1, |v| v.value()))
            };
            let mut snapshot = GatesSnapshot {
                next_question_id: counter(META_NEXT_QUESTION_ID)?,
                next_message_id: counter(META_NEXT_MESSAGE_ID)?,
                ..GatesSnapshot::default()
            };
            self.each_row(txn, QUESTIONS, |(execution, id), record| {
                snapshot
                    .questions
                    .push((execution.to_owned(), id, record.to_vec()));
                Ok(())
            })?;
            let counts = &mut snapshot.inbox_counts;
            self.each_row(txn, INBOX, |(execution, _), _| {
                match counts.last_mut() {
                    Some((last, n)) if last == execution => *n += 1,
                    _ => counts.push((execution.to_owned(), 1)),
                }
                Ok(())
            })?;
            Ok(snapshot)
        })
    }

    /// The oldest messages of an execution's inbox: at most `max`, and no
    /// more than `max_bytes` together, counting [`MESSAGE_OVERHEAD`] each
    /// (but always the first).
    pub fn inbox(&self, execution: &str, max: usize, max_bytes: usize) -> Result<Vec<InboxMessage>> {
        self.read_in(|txn| {
            let table = txn.open_table(INBOX).map_err(|e| self.fail(e))?;
            let range = table
                .range((execution, 0)..=(execution, u64::MAX))
                .map_err(|e| self.fail(e))?;
            let mut out = Vec::new();
            let mut bytes = 0;
            for item in range {
                let (key, value) = item.map_err(|e| self.fail(e))?;
                let (_, id) = key.value();
                let message: InboxMessage = postcard::from_bytes(value.value()).map_err(|e| {
                    Error::storage(
                        format!("message {id} of execution {execution}'s inbox does not decode"),
                        e,
                    )
                })?;
                bytes += message.data.len() + MESSAGE_OVERHEAD;
                if out.len() >= max || (!out.is_empty() && bytes > max_bytes) {
                    break;
                }
                out.push(message);
            }
            Ok(out)
        })
    }
}
