//! The tests of the store as a whole (opening, the log wrapping under
//! writes, reads and crashes, redb's failures as the daemon's errors),
//! and the helpers that the tests of every file of the store share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable};
use tether_protocol::{Frame, FrameKind};

use super::chunk::InLog;
use super::schema::{StreamMeta, CHUNKS, META, META_SCHEMA_VERSION, SCHEMA_VERSION};
use super::{guard_db, storage, ReadLimits, Store, WriteTxn};
use crate::syncer::Durable;
use crate::wal::{CopyPace, Layout};
use crate::{Error, Result};

pub(super) fn frame(payload: &'static [u8]) -> Frame {
    Frame {
        ts_micros: 1_700_000_000_000_000,
        kind: FrameKind::Stdout,
        payload: Bytes::from_static(payload),
    }
}

pub(super) fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("t.redb")).unwrap();
    (dir, store)
}

/// Stores seqs `from..=to` of stream 7 in one transaction (one chunk),
/// each with a payload naming its seq.
pub(super) fn put(store: &Store, from: u64, to: u64) {
    store.write(|txn| put_frames(txn, from, to)).unwrap();
}

/// Frames `from` to `to` of stream 7, each with its seq as timestamp.
pub(super) fn put_frames(txn: &mut WriteTxn<'_>, from: u64, to: u64) -> Result<()> {
    for seq in from..=to {
        let payload = Bytes::from(format!("frame {seq}"));
        let f = Frame {
            ts_micros: seq,
            kind: FrameKind::Data,
            payload,
        };
        txn.put_frame(7, seq, &f)?;
    }
    Ok(())
}

/// Stores stream "s" (id 7) as holding seqs 1 to `last`.
pub(super) fn stream_s_through(store: &Store, last: u64) {
    let meta = StreamMeta {
        id: 7,
        first_seq: 1,
        last_seq: last,
        frames: last,
        bytes: 0,
        created_micros: 0,
    };
    store.write(|txn| txn.put_stream("s", &meta)).unwrap();
}

pub(super) fn frame_of(payload: &[u8]) -> Frame {
    Frame {
        ts_micros: 1,
        kind: FrameKind::Data,
        payload: Bytes::copy_from_slice(payload),
    }
}

/// The store and log files as a crash would leave them now: copied
/// while the store is open, so the copy has the store's last durable
/// commit and whatever the log holds.
pub(super) fn crash_copy(from: &Path, to: &Path, with_log: bool) -> PathBuf {
    let copy = to.join("t.redb");
    std::fs::copy(from, &copy).unwrap();
    if with_log {
        std::fs::copy(from.with_extension("wal"), copy.with_extension("wal")).unwrap();
    }
    copy
}

/// Logs consumer "c" of stream 7 as acked through `through`.
pub(super) fn log_ack(store: &Store, through: u64) -> Durable {
    store
        .write_logged(|txn| txn.put_consumer(7, "c", through), |_| {})
        .unwrap()
        .1
}

pub(super) fn stored_ts(store: &Store, from: u64, to: u64) -> Vec<Option<u64>> {
    (from..=to)
        .map(|seq| store.frame_ts(7, seq).unwrap())
        .collect()
}

/// What [`stored_ts`] of seqs 1 to 10 shows when `kept` are stored
/// with their seq as their timestamp.
pub(super) fn ts_of_only(kept: std::ops::RangeInclusive<u64>) -> Vec<Option<u64>> {
    (1..=10)
        .map(|seq| kept.contains(&seq).then_some(seq))
        .collect()
}

/// The schema version the store file at `path` (closed) says it has.
pub(super) fn stored_version(path: &Path) -> u64 {
    let db = Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let version = meta.get(META_SCHEMA_VERSION).unwrap().unwrap().value();
    version
}

/// Writes `version` into the store file at `path` (closed), as a build
/// of that version would have left it.
pub(super) fn store_version(path: &Path, version: u64) {
    let db = Database::open(path).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(META)
        .unwrap()
        .insert(META_SCHEMA_VERSION, version)
        .unwrap();
    txn.commit().unwrap();
}

/// A log capacity no filesystem has four times over: the log is not
/// prepared, so it does not wrap.
pub(super) const UNPREPARED_LOG: u64 = 1 << 60;

/// A log small enough to wrap every few dozen commits.
pub(super) const SMALL_LOG: u64 = 128 * 1024;

/// A KiB of payload naming `seq`.
pub(super) fn kib_payload(seq: u64) -> Bytes {
    let mut payload = format!("frame {seq} ").into_bytes();
    payload.resize(1024, b'.');
    Bytes::from(payload)
}

/// Logs frames `from..=to` of stream 7 (a KiB each, see
/// [`kib_payload`]), then tends the log as the writer does between
/// batches: copies a step and commits durably when asked to.
pub(super) fn logged_frames(store: &Store, from: u64, to: u64) {
    store
        .write_logged(
            |txn| {
                for seq in from..=to {
                    let f = Frame {
                        ts_micros: seq,
                        kind: FrameKind::Data,
                        payload: kib_payload(seq),
                    };
                    txn.put_frame(7, seq, &f)?;
                }
                Ok(())
            },
            |_| {},
        )
        .unwrap();
    if store.copy_from_log(CopyPace::BetweenBatches).unwrap() {
        store.commit_durably().unwrap();
    }
}

/// Every frame of stream 7 ("s") from 1 to `last`, read back whole.
pub(super) fn assert_all_frames(store: &Store, last: u64) {
    let mut next = 1;
    while next <= last {
        let read = store
            .read_frames(
                "s",
                next,
                ReadLimits {
                    max_frames: 1000,
                    max_bytes: usize::MAX,
                    through_seq: last,
                },
            )
            .unwrap();
        for (seq, f) in &read.frames {
            assert_eq!(*seq, next);
            assert_eq!(f.payload, kib_payload(next), "frame {next}");
            next += 1;
        }
    }
    assert_eq!(next, last + 1);
}

/// How many of stream 7's chunks the log keeps, and how many the store.
pub(super) fn where_chunks_are(store: &Store) -> (usize, usize) {
    let guard = store.handle().unwrap();
    let txn = guard_db(&guard).unwrap().begin_read().unwrap();
    let chunks = txn.open_table(CHUNKS).unwrap();
    let mut counts = (0, 0);
    for item in chunks.iter().unwrap() {
        let (_, value) = item.unwrap();
        match InLog::parse(value.value()) {
            Some(_) => counts.0 += 1,
            None => counts.1 += 1,
        }
    }
    counts
}

#[test]
fn a_log_whose_store_file_was_removed_is_damage_and_left_as_it_was() {
    //! A store file removed beside a log that holds records once made a
    //! new, empty store and threw the records away without a word.
    let (dir, store) = store();
    let path = dir.path().join("t.redb");
    for through in 1..=3 {
        log_ack(&store, through);
    }
    store.commit_durably().unwrap();
    store.close().unwrap();
    drop(store);
    let log = path.with_extension("wal");
    let before = std::fs::read(&log).unwrap();
    std::fs::remove_file(&path).unwrap();

    let err = Store::open(&path).unwrap_err();
    assert!(err.is_damage(), "{err:?}");
    assert!(
        err.to_string().starts_with(&format!(
            "the store is damaged: {}: the store file is missing (or empty) while the log {} \
             holds records",
            path.display(),
            log.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read(&log).unwrap(), before, "the log was changed");
    assert!(!path.exists(), "a store file was made");
}

#[test]
fn an_older_store_is_copied_aside_then_upgraded_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
    assert_eq!(store.wal().layout(), Layout::Flat);
    logged_frames(&store, 1, 10);
    store.close().unwrap();
    drop(store);
    assert_eq!(stored_version(&path), SCHEMA_VERSION, "a new store");
    // As a build that knows version 2 only left it.
    store_version(&path, 2);
    let files = |dir: &Path| ["t.redb", "t.wal"].map(|name| std::fs::read(dir.join(name)).unwrap());
    let before = files(dir.path());

    // Opened, it is copied as it was into backup-2-<UTC time>/, then
    // marked with this build's version; wrapping, chunk values may
    // then name the log's bytes, and the frames from before read back.
    let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
    let backups: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(backups.len(), 1, "{backups:?}");
    let name = backups[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        name.starts_with("backup-2-") && name.ends_with('Z'),
        "{name}"
    );
    assert!(
        files(&backups[0]) == before,
        "the copy is the store as it was"
    );
    assert_eq!(store.wal().layout(), Layout::Wrapping);
    logged_frames(&store, 11, 20);
    assert_eq!(where_chunks_are(&store).0, 1, "a chunk kept in the log");
    stream_s_through(&store, 20);
    assert_all_frames(&store, 20);
    store.close().unwrap();
    drop(store);
    assert_eq!(stored_version(&path), SCHEMA_VERSION);

    // Once only.
    let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
    store.close().unwrap();
    let dirs = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().is_dir())
        .count();
    assert_eq!(dirs, 1);
}

#[test]
fn chunks_kept_in_the_log_stay_readable_as_it_wraps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.redb");
    let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
    assert_eq!(store.wal().layout(), Layout::Wrapping);
    logged_frames(&store, 1, 10);
    stream_s_through(&store, 10);
    // The commit's chunk is where its record is, not in the store.
    assert_eq!(where_chunks_are(&store), (1, 0));
    assert_all_frames(&store, 10);

    // Four laps, crash copies taken along the way.
    let mut last = 10;
    let mut crashes = Vec::new();
    while last < 4 * SMALL_LOG / 1024 {
        logged_frames(&store, last + 1, last + 10);
        last += 10;
        if last % 70 == 0 {
            let crashed = tempfile::tempdir().unwrap();
            let copy = crash_copy(&path, crashed.path(), true);
            crashes.push((crashed, copy, last));
        }
    }
    stream_s_through(&store, last);
    assert_all_frames(&store, last);
    let (in_log, in_store) = where_chunks_are(&store);
    assert!(
        in_log > 0 && in_store > 0,
        "{in_log} in the log, {in_store} copied"
    );

    // Each crash copy comes back with every frame it had logged (its
    // stream's metadata says 10: the frames after it are read by seq).
    for (_dir, copy, logged) in crashes {
        let reopened = Store::open_with_log(&copy, SMALL_LOG).unwrap();
        let ts: Vec<Option<u64>> = (1..=logged)
            .map(|seq| reopened.frame_ts(7, seq).unwrap())
            .collect();
        let expected: Vec<Option<u64>> = (1..=logged).map(Some).collect();
        assert_eq!(ts, expected, "crash copy after frame {logged}");
    }
    store.close().unwrap();
    drop(store);
    // Reopened after a clean close, and going on from there.
    let reopened = Store::open_with_log(&path, SMALL_LOG).unwrap();
    assert_all_frames(&reopened, last);
    logged_frames(&reopened, last + 1, last + 10);
    assert_eq!(reopened.frame_ts(7, last + 10).unwrap(), Some(last + 10));
}

#[test]
fn enospc_is_disk_full() {
    let e = io::Error::from_raw_os_error(libc::ENOSPC);
    assert!(matches!(
        storage(redb::StorageError::Io(e)),
        Error::DiskFull { .. }
    ));
    let e = io::Error::from_raw_os_error(libc::EIO);
    let failed = storage(redb::StorageError::Io(e));
    assert!(matches!(failed, Error::Storage { .. }), "{failed:?}");
    assert_eq!(
        failed.to_string(),
        "storage error: I/O error: Input/output error (os error 5)"
    );
}

#[test]
fn a_storage_error_keeps_the_io_error_under_it() {
    //! Storage errors used to keep only the words of the failure under
    //! them, losing its kind and OS error.
    use std::error::Error as _;

    for e in [
        storage(redb::StorageError::Io(io::Error::from_raw_os_error(
            libc::EIO,
        ))),
        storage(redb::StorageError::Io(io::Error::from_raw_os_error(
            libc::ENOSPC,
        ))),
    ] {
        let io = std::iter::successors(e.source(), |e| (*e).source())
            .find_map(|e| e.downcast_ref::<io::Error>())
            .unwrap_or_else(|| panic!("no I/O error under {e:?}"));
        assert!(matches!(
            io.raw_os_error(),
            Some(libc::EIO) | Some(libc::ENOSPC)
        ));
        assert_eq!(
            crate::error::is_disk_full(&e),
            matches!(e, Error::DiskFull { .. })
        );
    }
}
