//! The store's layout on disk: its tables, the keys of its `meta` table,
//! the schema versions this build reads and writes, and the creation of
//! the tables in a new file, kept together so that a change of layout is
//! made in one place.

use std::path::Path;

use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::txn::commit;
use super::{guard_db, storage, Store};
use crate::{Error, Result};

/// The layout version this build writes into a new store. A file with a
/// version outside [`OLDEST_SCHEMA_VERSION`]`..=`this is refused rather
/// than misread. Version 4: the log describes checkpoints and step
/// results (see [`crate::wal::Op`]), which a build reading version 3
/// could not decode in a replay. Version 5: questions and inboxes, and
/// the log's ops for them.
pub const SCHEMA_VERSION: u64 = 5;

/// The oldest layout version this build reads: 2, frames in chunks.
const OLDEST_SCHEMA_VERSION: u64 = 2;

pub(super) const STREAMS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("streams");
pub(super) const CHUNKS: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("chunks");
pub(super) const PRODUCERS: TableDefinition<'_, (u64, &str), (u64, u64)> =
    TableDefinition::new("producers");
pub(super) const CONSUMERS: TableDefinition<'_, (u64, &str), u64> =
    TableDefinition::new("consumers");
pub(super) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
pub(super) const EXECUTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("executions");
pub(super) const CHECKPOINTS: TableDefinition<'_, (&str, u64), &[u8]> =
    TableDefinition::new("checkpoints");
pub(super) const STEPS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("steps");
/// When each step result in `steps` was recorded, microseconds since the
/// Unix epoch. A table of its own, so that `steps` keeps the worker's
/// bytes as they were: a store written before it has no such table (or
/// no row for older steps), and those steps list with no time.
pub(super) const STEP_TIMES: TableDefinition<'_, (&str, &str), u64> =
    TableDefinition::new("step_times");

/// Seq ranges `tetherd repair` found lost: (stream id, first seq) to the
/// range's last seq. Readers get a gap notice over them; `check` accepts
/// them. Only a repaired store has the table: a build that does not know
/// it reads the store as before and finds the holes.
pub(super) const LOST: TableDefinition<'_, (u64, u64), u64> = TableDefinition::new("lost");

/// Removed streams' last seqs, by name: a stream created again under a
/// name in this table starts above its seq, so that no seq of a name is
/// ever given twice and a reader's saved position never silently skips.
/// Written only by durable commits (see `WriteTxn::remove_stream`).
pub(super) const TOMBSTONES: TableDefinition<'_, &str, u64> = TableDefinition::new("tombstones");

/// Questions (`tether ask`), by (execution id, question id): an encoded
/// [`QuestionRecord`](crate::gates::QuestionRecord). Version 5.
pub(super) const QUESTIONS: TableDefinition<'_, (&str, u64), &[u8]> =
    TableDefinition::new("questions");
/// Inbox messages (`tether send`), by (execution id, message id): an
/// encoded [`InboxMessage`](tether_protocol::InboxMessage). Version 5.
pub(super) const INBOX: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("inbox");

pub(super) const META_SCHEMA_VERSION: &str = "schema_version";
pub(super) const META_NEXT_STREAM_ID: &str = "next_stream_id";
/// The number of the last write-ahead log record this state includes (see
/// [`crate::wal`]); missing means none.
pub(super) const META_WAL_APPLIED: &str = "wal_applied";
/// Wrapping (see [`crate::wal`]): where the record after `wal_applied`
/// goes in the log, as of the last durable commit; missing when the log
/// does not wrap.
pub(super) const META_WAL_RESUME: &str = "wal_resume";
/// Wrapping: the oldest position in the log of a chunk it keeps for
/// the store, as of the last durable commit.
pub(super) const META_WAL_TAIL: &str = "wal_tail";
/// The id the next question gets (ids are never reused).
pub(super) const META_NEXT_QUESTION_ID: &str = "next_question_id";
/// The id the next inbox message gets (ids are never reused).
pub(super) const META_NEXT_MESSAGE_ID: &str = "next_message_id";
/// Wrapping: the log's capacity, which its positions are counted in
/// (kept while the log wraps, whatever the setting says).
pub(super) const META_WAL_CAPACITY: &str = "wal_capacity";

/// Per-stream bookkeeping, stored beside the frames it describes.
///
/// Postcard is not self-describing: the field order is the on-disk format.
/// Invariants: the retained frames are exactly `first_seq..=last_seq`
/// (`first_seq == last_seq + 1` when none are), `frames` counts them and
/// `bytes` sums their payload lengths.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StreamMeta {
    /// Internal id, used in the other tables' keys so that names are stored once.
    pub id: u64,
    /// First retained seq.
    pub first_seq: u64,
    /// Last seq ever assigned; 0 before the first frame.
    pub last_seq: u64,
    /// Retained frames.
    pub frames: u64,
    /// Retained payload bytes.
    pub bytes: u64,
    /// When the stream was created, microseconds since the Unix epoch.
    pub created_micros: u64,
}

impl StreamMeta {
    /// A new, empty stream.
    pub fn new(id: u64, created_micros: u64) -> Self {
        Self::after(id, created_micros, 0)
    }

    /// A new, empty stream whose first seq will be `after + 1`: `after` is
    /// the tombstone a removed stream of the same name left.
    pub fn after(id: u64, created_micros: u64, after: u64) -> Self {
        Self {
            id,
            first_seq: after + 1,
            last_seq: after,
            frames: 0,
            bytes: 0,
            created_micros,
        }
    }
}

/// A producer's dedupe state on one stream: the newest `producer_seq` stored
/// and the stream seq it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerState {
    pub producer_seq: u64,
    pub seq: u64,
}

impl Store {
    /// Creates the tables and checks the schema version, marking an older
    /// store (set aside when it was opened) with this build's. Nothing is
    /// committed when the version is one this build cannot read.
    pub(super) fn init_schema(&self) -> Result<()> {
        let guard = self.handle()?;
        let db = guard_db(&guard)?;
        let txn = db.begin_write().map_err(storage)?;
        {
            txn.open_table(STREAMS).map_err(storage)?;
            txn.open_table(CHUNKS).map_err(storage)?;
            txn.open_table(PRODUCERS).map_err(storage)?;
            txn.open_table(CONSUMERS).map_err(storage)?;
            // Added in version 1 without a version bump: such a file
            // simply got the empty table, and older builds ignored it.
            txn.open_table(EXECUTIONS).map_err(storage)?;
            txn.open_table(CHECKPOINTS).map_err(storage)?;
            txn.open_table(STEPS).map_err(storage)?;
            txn.open_table(TOMBSTONES).map_err(storage)?;
            txn.open_table(QUESTIONS).map_err(storage)?;
            txn.open_table(INBOX).map_err(storage)?;
            let mut meta = txn.open_table(META).map_err(storage)?;
            let version = meta
                .get(META_SCHEMA_VERSION)
                .map_err(storage)?
                .map(|v| v.value());
            match version {
                Some(SCHEMA_VERSION) => {}
                // Older, and set aside when the store was opened: upgraded.
                Some(known) => {
                    check_version(&self.path, known)?;
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(storage)?;
                }
                None => {
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(storage)?;
                    meta.insert(META_NEXT_STREAM_ID, 1).map_err(storage)?;
                }
            }
        }
        commit(txn)
    }
}

/// The layout version the store `db` records, if it records one.
pub(super) fn recorded_version(db: &impl ReadableDatabase) -> Result<Option<u64>> {
    let txn = db.begin_read().map_err(storage)?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(storage(e)),
    };
    let version = meta
        .get(META_SCHEMA_VERSION)
        .map_err(storage)?
        .map(|v| v.value());
    Ok(version)
}

/// The last seq of the range `tetherd repair` recorded lost in stream
/// `id` that holds `seq`, if one does (a store never repaired has no such
/// table).
pub(super) fn lost_through(
    txn: &redb::ReadTransaction,
    id: u64,
    seq: u64,
) -> std::result::Result<Option<u64>, redb::Error> {
    let lost = match txn.open_table(LOST) {
        Ok(lost) => lost,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let last = lost
        .range((id, 0)..=(id, seq))?
        .next_back()
        .transpose()?
        .map(|(_, last)| last.value());
    Ok(last.filter(|&last| last >= seq))
}

/// Refuses a store at `path` of a layout `version` this build cannot read
/// (exit 65: it is not this build's to change), naming both versions.
pub(super) fn check_version(path: &Path, version: u64) -> Result<()> {
    if (OLDEST_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&version) {
        return Ok(());
    }
    let why = if version > SCHEMA_VERSION {
        "a newer tetherd wrote it: run that one; this one changes nothing"
    } else {
        "version 2 began storing frames in chunks, and older files are not converted"
    };
    Err(Error::CorruptStore {
        path: path.to_path_buf(),
        detail: format!(
            "schema version {version}; this build reads versions {OLDEST_SCHEMA_VERSION} to \
             {SCHEMA_VERSION} ({why})"
        ),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store::tests::{store_version, stored_version, SMALL_LOG};

    #[test]
    fn a_store_of_an_unknown_schema_version_is_refused_naming_the_versions_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        store.close().unwrap();
        drop(store);
        for version in [1, 6] {
            store_version(&path, version);
            let err = Store::open_with_log(&path, SMALL_LOG).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::CorruptStore { .. }), "{text}");
            assert!(
                text.contains(&format!("schema version {version};")),
                "{text}"
            );
            assert!(text.contains("reads versions 2 to 5"), "{text}");
            assert_eq!(stored_version(&path), version, "nothing committed");
        }
    }
}
