//! Damage is never silent: before the store writes anything at start, the
//! log's records it relies on are checked, so that damage is told from a
//! log that simply ends where a crash cut it.
//!
//! These are damage, and stop the daemon (exit 65) with nothing changed:
//! one of the two files missing while the other holds data; a log that
//! wraps around cut shorter than its capacity; a record that fails its
//! check with a valid record written after it (found by number, so that
//! damage to a record's length, which hides where the next one starts, is
//! found too); records missing between what the store holds and the log's
//! first; and, when the log wraps around, any record from the oldest one
//! the store reads chunks from up to the replay's start failing its check.
//! The one failure repaired silently is a torn tail: the last record cut
//! short or failing, with nothing valid after it — a write that was never
//! acknowledged.
//!
//! Only the log not yet copied into redb is read (at most its capacity),
//! so start-up time does not grow with what redb holds; redb checks its
//! own commit roots when it opens.

use std::path::Path;

use redb::{ReadableDatabase, ReadableTable};

use super::chunk::InLog;
use super::schema::{
    StreamMeta, CHUNKS, META, META_WAL_APPLIED, META_WAL_CAPACITY, META_WAL_RESUME, META_WAL_TAIL,
    STREAMS,
};
use crate::error::Damage;
use crate::store_io::Opener;
use crate::wal::{Layout, Wal};
use crate::{Error, Result};

/// What the store's durable marks say about its log.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LogMarks {
    /// The last record the store holds.
    pub applied: u64,
    /// Wrapping: where the record after `applied` went.
    pub resume: Option<u64>,
    /// Wrapping: where the oldest chunk the store reads from the log is.
    pub tail: Option<u64>,
    /// Wrapping: the log's capacity.
    pub capacity: Option<u64>,
}

/// Reads the marks in a read transaction: nothing is written.
pub(super) fn read_marks(db: &impl ReadableDatabase) -> Result<LogMarks> {
    let txn = db.begin_read().map_err(super::storage)?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(LogMarks::default()),
        Err(e) => return Err(super::storage(e)),
    };
    let mark = |key| {
        meta.get(key)
            .map(|v| v.map(|v| v.value()))
            .map_err(super::storage)
    };
    Ok(LogMarks {
        applied: mark(META_WAL_APPLIED)?.unwrap_or(0),
        resume: mark(META_WAL_RESUME)?,
        tail: mark(META_WAL_TAIL)?,
        capacity: mark(META_WAL_CAPACITY)?,
    })
}

/// Before either file is opened: one of them missing while the other
/// holds data is damage. `store_has_data`: the store file exists and is
/// not empty. The log's first bytes are read through `opener`.
pub(super) fn verify_both_there(
    store: &Path,
    log: &Path,
    store_has_data: bool,
    opener: &dyn Opener,
) -> Result<()> {
    let log_there = std::fs::symlink_metadata(log).is_ok();
    if store_has_data && !log_there {
        return Err(damaged(
            log,
            None,
            format!(
                "the log is missing while the store {} exists: the commits it held since the \
                 store was last made durable are lost",
                store.display()
            ),
            "every stream's frames after what the store file holds".into(),
        ));
    }
    if !store_has_data && log_there && log_holds_records(log, opener)? {
        return Err(damaged(
            store,
            None,
            format!(
                "the store file is missing (or empty) while the log {} holds records",
                log.display()
            ),
            "every stream: the store file held them".into(),
        ));
    }
    Ok(())
}

/// Whether the log file holds anything but zeros at its start (a record,
/// or what is left of one).
fn log_holds_records(log: &Path, opener: &dyn Opener) -> Result<bool> {
    let cannot = |e| Error::io(format!("cannot read the log {}", log.display()), e);
    let file = opener.open_read(log).map_err(cannot)?;
    let len = usize::try_from(file.len().map_err(cannot)?).map_or(crate::wal::HEADER_LEN, |len| {
        len.min(crate::wal::HEADER_LEN)
    });
    let mut start = vec![0; len];
    file.read_exact_at(&mut start, 0).map_err(cannot)?;
    Ok(start.iter().any(|&b| b != 0))
}

/// After redb opened and before anything is written: the log's records the
/// store relies on verify (see the module docs).
pub(super) fn verify_log(db: &impl ReadableDatabase, log: &Wal) -> Result<()> {
    let marks = read_marks(db)?;
    let path = log.path();
    let layout = Layout::of_resume(marks.resume);
    if let Some(capacity) = marks.capacity.filter(|_| marks.resume.is_some()) {
        if log.file_len() < capacity {
            return Err(damaged(
                path,
                Some(log.file_len()),
                format!(
                    "the log is {} bytes, but the store says it fills {capacity}: it was cut \
                     short",
                    log.file_len()
                ),
                affected(db)?,
            ));
        }
    }
    let replayed = match log.replay(marks.applied, marks.resume, |_, _, _| Ok(())) {
        Ok(replayed) => replayed,
        Err(Error::CorruptStore { detail, .. }) => {
            return Err(damaged(path, None, detail, affected(db)?))
        }
        Err(e) => return Err(e),
    };
    if let Some((number, at)) = replayed.stopped_before {
        return Err(damaged(
            path,
            Some(log.file_offset(at, layout)),
            format!(
                "record {number} fails its check, and the record after it passes: the \
                 commits from record {number} on are lost"
            ),
            affected(db)?,
        ));
    }
    if let Some((number, at)) = replayed.ended_at_damage {
        if let Some((later, later_at)) = log.find_valid_after(at, number, layout)? {
            return Err(damaged(
                path,
                Some(log.file_offset(at, layout)),
                format!(
                    "record {number} fails its check, and record {later} at byte {later_at} \
                     after it passes: the records between were written, maybe acknowledged, \
                     and are lost"
                ),
                affected(db)?,
            ));
        }
        tracing::info!(
            log = %path.display(),
            "record {number} of the log, at byte {}, was cut short by a crash before it \
             was synced (nothing valid follows it); it was never acknowledged and is dropped",
            log.file_offset(at, layout)
        );
    }
    if let (Some(tail), Some(resume)) = (marks.tail, marks.resume) {
        if let Some(at) = log.verify_kept(tail, resume)? {
            let next = log
                .find_valid_after(at, 0, Layout::Wrapping)?
                .map(|(_, next)| next)
                .filter(|&next| next > at);
            return Err(damaged(
                path,
                Some(at),
                "a record whose chunks the store reads from the log fails its check".into(),
                kept_in(db, log, at, next)?,
            ));
        }
    }
    Ok(())
}

/// Which streams and seqs damage to the log can have cost: the frames
/// after what the store file holds of each stream (the log held the
/// commits after it).
fn affected(db: &impl ReadableDatabase) -> Result<String> {
    const SHOWN: usize = 10;
    let txn = db.begin_read().map_err(super::storage)?;
    let streams = match txn.open_table(STREAMS) {
        Ok(streams) => streams,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok("no stream yet".into()),
        Err(e) => return Err(super::storage(e)),
    };
    let mut parts = Vec::new();
    let mut count: usize = 0;
    for item in streams.iter().map_err(super::storage)? {
        let (name, meta) = item.map_err(super::storage)?;
        count += 1;
        if parts.len() < SHOWN {
            let last = postcard::from_bytes::<StreamMeta>(meta.value())
                .map_or_else(|_| "?".to_owned(), |m| m.last_seq.to_string());
            parts.push(format!("{} after seq {last}", name.value()));
        }
    }
    if count == 0 {
        return Ok("the frames of streams created since the store was last made durable".into());
    }
    let more = count.saturating_sub(SHOWN);
    let mut text = format!(
        "frames of each stream after what the store file holds: {}",
        parts.join(", ")
    );
    if more > 0 {
        text.push_str(&format!(" and {more} more streams"));
    }
    Ok(text)
}

/// The frames whose chunks the store reads from the log between file bytes
/// `from` and `to` (the next valid record, or the file's end).
fn kept_in(db: &impl ReadableDatabase, log: &Wal, from: u64, to: Option<u64>) -> Result<String> {
    let txn = db.begin_read().map_err(super::storage)?;
    let chunks = txn.open_table(CHUNKS).map_err(super::storage)?;
    let streams = txn.open_table(STREAMS).map_err(super::storage)?;
    let mut names = std::collections::HashMap::new();
    for item in streams.iter().map_err(super::storage)? {
        let (name, meta) = item.map_err(super::storage)?;
        if let Ok(meta) = postcard::from_bytes::<StreamMeta>(meta.value()) {
            names.insert(meta.id, name.value().to_owned());
        }
    }
    let to = to.unwrap_or(u64::MAX);
    let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
    for item in chunks.iter().map_err(super::storage)? {
        let (key, value) = item.map_err(super::storage)?;
        let Some(in_log) = InLog::parse(value.value()) else {
            continue;
        };
        let at = log.file_offset(in_log.at, Layout::Wrapping);
        if at >= from && at < to {
            let (stream_id, first) = key.value();
            let last = first + u64::from(in_log.count).saturating_sub(1);
            match ranges.last_mut() {
                Some((id, _, end)) if *id == stream_id && *end + 1 == first => *end = last,
                _ => ranges.push((stream_id, first, last)),
            }
        }
    }
    if ranges.is_empty() {
        return Ok("no frame the store still reads from there".into());
    }
    Ok(ranges
        .iter()
        .map(|(id, first, last)| {
            let name = names
                .get(id)
                .map_or_else(|| format!("#{id}"), |n| format!("{n:?}"));
            format!("stream {name} seqs {first}..={last}")
        })
        .collect::<Vec<_>>()
        .join(", "))
}

fn damaged(file: &Path, offset: Option<u64>, what: String, affected: String) -> Error {
    Error::Damaged(Box::new(Damage {
        file: file.to_path_buf(),
        offset,
        what,
        affected,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store_io::{FaultPlan, FaultyOpener, Files, IoOp};

    #[test]
    fn the_logs_first_bytes_are_read_through_the_opener() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("tether.redb");
        let log = dir.path().join("tether.wal");
        std::fs::write(&log, [7u8; 32]).unwrap();
        let plan = FaultPlan::new();
        let opener = FaultyOpener::new(plan.clone());

        // A log with records beside no store file is damage.
        let err = verify_both_there(&store, &log, false, &opener).unwrap_err();
        assert!(matches!(err, Error::Damaged(_)), "{err}");
        assert_eq!(plan.count(&Files::suffix(".wal"), IoOp::Read), 1);

        // A read that fails is told as such, naming the log.
        plan.fail_next(Files::suffix(".wal"), IoOp::Read, libc::EIO);
        let err = verify_both_there(&store, &log, false, &opener).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot read the log {}: Input/output error (os error 5)",
                log.display()
            )
        );
    }
}
