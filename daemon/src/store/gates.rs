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
    pub fn inbox(
        &self,
        execution: &str,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<InboxMessage>> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use bytes::Bytes;
    use redb::Database;

    use super::*;
    use crate::store::schema::SCHEMA_VERSION;
    use crate::store::tests::{crash_copy, store_version, stored_version, UNPREPARED_LOG};
    use crate::syncer::Durable;
    use crate::wal;

    fn message(id: u64, data: &'static str) -> Vec<u8> {
        postcard::to_allocvec(&InboxMessage {
            id,
            sent_micros: 5,
            sender_uid: 1000,
            data: Bytes::from_static(data.as_bytes()),
        })
        .unwrap()
    }

    fn ids(store: &Store, execution: &str) -> Vec<u64> {
        let messages = store.inbox(execution, 100, usize::MAX).unwrap();
        messages.iter().map(|m| m.id).collect()
    }

    #[test]
    fn questions_and_inboxes_logged_only_are_replayed_after_a_crash() {
        for capacity in [wal::DEFAULT_CAPACITY, UNPREPARED_LOG] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("t.redb");
            let store = Store::open_with_log(&path, capacity).unwrap();
            let (_, durable) = store
                .write_logged(
                    |txn| {
                        txn.put_question("e", 1, b"asked")?;
                        txn.set_next_question_id(2)?;
                        for id in 1..=3 {
                            txn.put_inbox("e", id, &message(id, "m"))?;
                        }
                        txn.set_next_message_id(4)
                    },
                    |_| {},
                )
                .unwrap();
            assert!(matches!(durable, Durable::Logged(_)));
            let (removed, durable) = store
                .write_logged(
                    |txn| {
                        txn.put_question("e", 1, b"answered")?;
                        txn.remove_inbox_through("e", 2)
                    },
                    |_| {},
                )
                .unwrap();
            assert_eq!((removed, matches!(durable, Durable::Logged(_))), (2, true));

            // No durable commit since: only the log has them.
            let crashed = tempfile::tempdir().unwrap();
            let copy =
                Store::open_with_log(&crash_copy(&path, crashed.path(), true), capacity).unwrap();
            let gates = copy.load_gates().unwrap();
            assert_eq!(gates.questions, vec![("e".into(), 1, b"answered".to_vec())]);
            assert_eq!(gates.inbox_counts, vec![("e".into(), 1)]);
            assert_eq!((gates.next_question_id, gates.next_message_id), (2, 4));
            assert_eq!(ids(&copy, "e"), [3]);
        }
    }

    #[test]
    fn removing_an_execution_takes_its_questions_and_inbox() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb")).unwrap();
        store
            .write(|txn| {
                for execution in ["a", "b"] {
                    txn.put_execution(execution, b"m")?;
                    txn.put_question(execution, 1, b"q")?;
                    txn.put_inbox(execution, 1, &message(1, "m"))?;
                }
                Ok(())
            })
            .unwrap();
        store.write(|txn| txn.remove_execution("a")).unwrap();
        let gates = store.load_gates().unwrap();
        assert_eq!(gates.questions, vec![("b".into(), 1, b"q".to_vec())]);
        assert_eq!(gates.inbox_counts, vec![("b".into(), 1)]);
    }

    #[test]
    fn the_inbox_is_read_oldest_first_within_the_bounds_but_always_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb")).unwrap();
        store
            .write(|txn| {
                for id in [4, 2, 9] {
                    txn.put_inbox("e", id, &message(id, "0123456789"))?;
                }
                txn.put_inbox("f", 1, &message(1, "other"))
            })
            .unwrap();
        assert_eq!(ids(&store, "e"), [2, 4, 9]);
        let two = store.inbox("e", 2, usize::MAX).unwrap();
        assert_eq!(two.iter().map(|m| m.id).collect::<Vec<_>>(), [2, 4]);
        let one = store.inbox("e", 10, 1).unwrap();
        assert_eq!(one.iter().map(|m| m.id).collect::<Vec<_>>(), [2]);
        assert!(store.inbox("none", 10, usize::MAX).unwrap().is_empty());
    }

    #[test]
    fn a_version_4_store_is_upgraded_and_gets_the_new_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        store.close().unwrap();
        drop(store);
        // As a build of version 4 left it: without the tables of version 5.
        {
            let db = Database::open(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.delete_table(QUESTIONS).unwrap();
            txn.delete_table(INBOX).unwrap();
            txn.commit().unwrap();
        }
        store_version(&path, 4);

        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        let backups: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("backup-4-"))
            .collect();
        assert_eq!(backups.len(), 1, "{backups:?}");
        let gates = store.load_gates().unwrap();
        assert!(gates.questions.is_empty() && gates.inbox_counts.is_empty());
        assert_eq!((gates.next_question_id, gates.next_message_id), (1, 1));
        store
            .write_logged(|txn| txn.put_question("e", 1, b"q"), |_| {})
            .unwrap();
        store.close().unwrap();
        drop(store);
        assert_eq!(stored_version(&path), SCHEMA_VERSION);
        assert_eq!(SCHEMA_VERSION, 5);
    }
}
