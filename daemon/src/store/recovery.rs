//! Opening the redb file and bringing it up to date: redb's own recovery
//! (a damaged file refused, not touched) and the replay of the log's
//! records the store does not hold, shared by opening the store and by
//! reopening it after a failed write.

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use super::schema::{META, META_WAL_APPLIED, META_WAL_CAPACITY, META_WAL_RESUME, META_WAL_TAIL};
use super::storage;
use super::txn::{abort, commit, tables};
use crate::error::{is_disk_full, StorageSource};
use crate::store_io::{Headroom, Opener, RedbFile};
use crate::wal::{self, Wal};
use crate::{Error, Result};

/// redb's page cache. Bounded so that the daemon's memory does not grow with
/// the store. Small, because every frame passes through it only once on
/// its way to the file: redb keeps up to half of it as a write buffer of
/// pages that non-durable commits left unwritten, and a durable commit (when the
/// log is full) writes and syncs all of that while the writer waits. On
/// W1, going from 8 to 2 MiB shortened those stalls (the slowest frames
/// around each durable commit: 6-7 ms against 4-5 ms), cut the daemon's CPU per
/// frame and its peak RSS (28 to 20 MiB), with W0, W2 and replay speed
/// unchanged. A group commit bigger than the buffer (up to 4 MiB) has
/// redb write its pages to the file early, which its commit protocol
/// allows. Readers lose little: the frames they read are in the
/// kernel's page cache anyway. At 64 MiB the daemon had peaked at 168 MiB
/// resident (the cache is many small page buffers).
const CACHE_BYTES: usize = 2 * 1024 * 1024;

/// Applies what the log holds beyond the store (see [`crate::wal`]) and
/// returns how many records that was. The replay is committed without
/// durability and the log goes on after the records it applied: they stay
/// in the log until the next durable commit (wrapping, until copying has
/// passed them: the replay stores where their chunks are, as a logged
/// commit does, rather than the bytes). So a replay needs no disk space:
/// on a full disk the store still opens, with everything acknowledged,
/// and reads go on.
pub(super) fn replay(db: &Database, log: &mut Wal) -> Result<u64> {
    let reader = log.reader();
    let mut txn = db.begin_write().map_err(storage)?;
    let replayed = {
        let mut tables = tables(&txn, &reader, None);
        let meta = tables.meta.get()?;
        let mark = |key| meta.get(key).map(|v| v.map(|v| v.value())).map_err(storage);
        let applied = mark(META_WAL_APPLIED)?.unwrap_or(0);
        let resume = mark(META_WAL_RESUME)?;
        let tail = mark(META_WAL_TAIL)?;
        // Wrapping, the records stay in the log until copying has
        // passed them: only where each chunk's bytes are goes into the
        // store (a chunk its commit stored whole, the rest of one cut by
        // compaction, is then kept in the log like any other).
        let keeps = resume.is_some() && log.is_filled();
        log.replay(applied, resume, |_, record_at, body| {
            for op in wal::ops(body) {
                tables.apply(op?, keeps.then_some((record_at, body)))?;
            }
            Ok(())
        })
        .and_then(|replayed| {
            if let Some((number, at)) = replayed.stopped_before {
                tracing::warn!(
                    log = %log.path().display(),
                    "record {number} of the log, at byte {at}, fails its check although \
                     the record after it passes; the replay ends before it. Either a \
                     crash cut its write short before it was synced (then it was never \
                     acknowledged) or the log was damaged since (then the commits from \
                     record {number} on are lost)"
                );
            }
            if replayed.last > applied {
                let meta = tables.meta.get()?;
                meta.insert(META_WAL_APPLIED, replayed.last)
                    .map_err(storage)?;
                // As a logged commit does (see `write_in`): a state that
                // keeps this one must not send a replay back to an older
                // place, from which the records would go over these.
                if resume.is_some() {
                    meta.insert(META_WAL_RESUME, replayed.end)
                        .map_err(storage)?;
                }
            }
            Ok((applied, replayed, resume.map(|at| (at, tail.unwrap_or(at)))))
        })
    };
    match replayed {
        Ok((applied, replayed, wrapping)) => {
            let held = replayed.last > applied;
            if held {
                txn.set_durability(Durability::None).map_err(storage)?;
                commit(txn)?;
                tracing::info!(
                    log = %log.path().display(),
                    records = replayed.last - applied,
                    "applied the log's commits the store did not hold"
                );
            } else {
                txn.abort().map_err(storage)?;
            }
            match wrapping {
                Some((resume, tail)) => log.resume_wrapping(replayed, resume, tail, held),
                None if held => log.resume(replayed),
                None => log.restart(applied + 1)?,
            }
            Ok(replayed.last - applied)
        }
        Err(e) => {
            abort(txn);
            Err(e)
        }
    }
}

/// The capacity of the log of the store in `db`, when it wraps.
pub(super) fn wrapping_capacity(db: &Database, path: &Path) -> Result<Option<u64>> {
    let corrupt = |e: redb::Error| Error::CorruptStore {
        path: path.to_path_buf(),
        detail: e.to_string(),
        source: Some(e.into()),
    };
    let txn = db.begin_read().map_err(|e| corrupt(e.into()))?;
    let meta = match txn.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(corrupt(e.into())),
    };
    let capacity = meta
        .get(META_WAL_CAPACITY)
        .map_err(|e| corrupt(e.into()))?
        .map(|v| v.value());
    Ok(capacity)
}

/// Opens (or creates) the database file through `opener`, reserving
/// blocks ahead of its end through `headroom` (see [`RedbFile`]), mapping
/// failures on an existing file to [`Error::CorruptStore`].
pub(super) fn open_database(
    path: &Path,
    opener: &dyn Opener,
    headroom: &Arc<Headroom>,
) -> Result<Database> {
    let existed = std::fs::metadata(path)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    let mut builder = Database::builder();
    builder.set_cache_size(CACHE_BYTES);
    // redb may panic on a file that was damaged outside of it; such a file
    // must stop the daemon with a message naming it, not with a panic.
    let opened = match opener
        .open(path)
        .and_then(|file| RedbFile::with_headroom(file, headroom))
    {
        Ok(backend) => {
            panic::catch_unwind(AssertUnwindSafe(|| builder.create_with_backend(backend)))
        }
        // As redb reports a file it cannot open itself.
        Err(e) => Ok(Err(redb::DatabaseError::from(e))),
    };
    let corrupt = |detail: String, source: Option<StorageSource>| Error::CorruptStore {
        path: path.to_path_buf(),
        detail,
        source,
    };
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e @ redb::DatabaseError::DatabaseAlreadyOpen)) => Err(Error::storage(
            format!(
                "store {} is already open in another process",
                path.display()
            ),
            redb::Error::from(e),
        )),
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))) => {
            if is_disk_full(&e) {
                Err(Error::DiskFull {
                    detail: format!("opening {}: {e}", path.display()),
                    source: Some(e.into()),
                })
            } else if existed && e.kind() != io::ErrorKind::PermissionDenied {
                Err(corrupt(e.to_string(), Some(e.into())))
            } else {
                Err(Error::io(
                    format!("cannot open store {}", path.display()),
                    e,
                ))
            }
        }
        Ok(Err(e)) if existed => Err(corrupt(e.to_string(), Some(redb::Error::from(e).into()))),
        Ok(Err(e)) => Err(storage(e)),
        Err(panic) => Err(corrupt(panic_message(&panic), None)),
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown failure".to_owned());
    format!("redb failed while opening it: {text}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::store::tests::{
        assert_all_frames, crash_copy, log_ack, logged_frames, put, put_frames, stored_ts,
        stream_s_through, ts_of_only, where_chunks_are, SMALL_LOG, UNPREPARED_LOG,
    };
    use crate::store::Store;
    use crate::syncer::Durable;

    #[test]
    fn logged_commits_only_the_log_holds_are_replayed_after_a_crash() {
        for capacity in [wal::DEFAULT_CAPACITY, UNPREPARED_LOG] {
            replayed_after_a_crash(capacity);
        }
    }

    /// [`logged_commits_only_the_log_holds_are_replayed_after_a_crash`]
    /// with a log of `capacity`.
    fn replayed_after_a_crash(capacity: u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, capacity).unwrap();
        put(&store, 1, 4);
        let logged = |from: u64, to: u64| {
            store
                .write_logged(
                    |txn| {
                        put_frames(txn, from, to)?;
                        txn.put_consumer(7, "c", to)
                    },
                    |_| {},
                )
                .unwrap()
                .1
        };
        assert!(matches!(logged(5, 8), Durable::Logged(_)));
        let (deleted, durable) = store
            .write_logged(
                |txn| txn.delete_prefix(7, 1, 8, |info| info.seq < 6),
                |_| {},
            )
            .unwrap();
        assert_eq!(
            (deleted.frames, matches!(durable, Durable::Logged(_))),
            (5, true)
        );
        assert!(matches!(logged(9, 10), Durable::Logged(_)));
        let expected = ts_of_only(6..=10);
        assert_eq!(stored_ts(&store, 1, 10), expected);

        // Without the log the logged commits would be lost: that is
        // damage, refused naming the log...
        let bare = tempfile::tempdir().unwrap();
        let without = crash_copy(&path, bare.path(), false);
        let err = Store::open_with_log(&without, capacity).unwrap_err();
        assert!(
            err.is_damage() && err.to_string().contains("the log is missing"),
            "{err}"
        );
        // ...with it, the store comes back exactly as it was, deletion
        // and rewritten chunk included.
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), true);
        let recovered = Store::open_with_log(&copy, capacity).unwrap();
        assert_eq!(stored_ts(&recovered, 1, 10), expected);
        let consumers = recovered.load().unwrap().consumers;
        assert_eq!(consumers, vec![(7, "c".to_owned(), 10)]);
        // New logged commits follow on from the replayed ones, which stay
        // in the log until a durable commit: a second crash keeps all of them.
        assert!(matches!(log_ack(&recovered, 11), Durable::Logged(_)));
        let again = tempfile::tempdir().unwrap();
        let twice = Store::open_with_log(&crash_copy(&copy, again.path(), true), capacity).unwrap();
        assert_eq!(stored_ts(&twice, 1, 10), expected);
        assert_eq!(
            twice.load().unwrap().consumers,
            vec![(7, "c".to_owned(), 11)]
        );
        // Once committed durably, the store holds them itself: not wrapping,
        // the log starts again (its first record's header is zeroed) and a
        // replay reads nothing; wrapping, the log goes on keeping their
        // chunks (its records stay until copying has passed them).
        recovered.commit_durably().unwrap();
        let durable = tempfile::tempdir().unwrap();
        let bare = crash_copy(&copy, durable.path(), true);
        let bare = Store::open_with_log(&bare, capacity).unwrap();
        assert_eq!(stored_ts(&bare, 1, 10), expected);
        assert_eq!(
            bare.load().unwrap().consumers,
            vec![(7, "c".to_owned(), 11)]
        );
    }

    #[test]
    fn a_log_that_does_not_join_the_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), false);
        // The store from before the log began (say, restored from a
        // backup) with a log that has since wrapped: where its next
        // record was due, a record numbered further on.
        let mut seq = 1;
        while seq < 3 * SMALL_LOG / 1024 {
            logged_frames(&store, seq, seq + 9);
            seq += 10;
        }
        store.close().unwrap();
        std::fs::copy(path.with_extension("wal"), copy.with_extension("wal")).unwrap();
        let err = Store::open_with_log(&copy, SMALL_LOG).unwrap_err();
        let text = err.to_string();
        assert!(
            err.is_damage() && text.contains("t.wal") && text.contains("through 0"),
            "{text}"
        );
    }

    #[test]
    fn a_replay_of_a_wrapping_log_leaves_the_chunks_where_the_log_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        stream_s_through(&store, 0);
        logged_frames(&store, 1, 10);
        logged_frames(&store, 11, 20);
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), true);
        drop(store);

        // The crash lost both commits in redb; the replay puts back where
        // their chunks are in the log, not their bytes.
        let store = Store::open_with_log(&copy, SMALL_LOG).unwrap();
        assert_eq!(where_chunks_are(&store), (2, 0));
        // Closed before anything else was written (redb keeps the replay,
        // which was not durable) and opened again.
        store.close().unwrap();
        drop(store);
        let store = Store::open_with_log(&copy, SMALL_LOG).unwrap();
        stream_s_through(&store, 20);
        assert_all_frames(&store, 20);
        // The log goes on after them, three laps: they are copied
        // when it wraps back to them, and nothing goes over them before.
        let mut last = 20;
        while last < 3 * SMALL_LOG / 1024 {
            logged_frames(&store, last + 1, last + 10);
            last += 10;
        }
        stream_s_through(&store, last);
        assert_all_frames(&store, last);
        // Crashed again without a durable commit since the replay, and closed
        // without one: each comes back whole.
        let again = tempfile::tempdir().unwrap();
        let second = crash_copy(&copy, again.path(), true);
        store.close().unwrap();
        drop(store);
        for path in [&second, &copy] {
            let store = Store::open_with_log(path, SMALL_LOG).unwrap();
            stream_s_through(&store, last);
            assert_all_frames(&store, last);
        }

        // A log that does not wrap starts again after a durable commit: its
        // replay stores the bytes.
        let flat = tempfile::tempdir().unwrap();
        let path = flat.path().join("t.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        logged_frames(&store, 1, 10);
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), true);
        drop(store);
        let store = Store::open_with_log(&copy, UNPREPARED_LOG).unwrap();
        assert_eq!(where_chunks_are(&store), (0, 1));
        stream_s_through(&store, 10);
        assert_all_frames(&store, 10);
    }

    #[test]
    fn a_store_closed_without_a_durable_commit_goes_on_after_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        for round in 0..3 {
            let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
            let from = round * 10 + 1;
            logged_frames(&store, from, from + 9);
            store.close().unwrap();
        }
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        let ts: Vec<Option<u64>> = (1..=30)
            .map(|seq| store.frame_ts(7, seq).unwrap())
            .collect();
        assert_eq!(ts, (1..=30).map(Some).collect::<Vec<_>>());
    }

    #[test]
    fn garbage_file_is_a_corrupt_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
        std::fs::write(path.with_extension("wal"), b"").unwrap();
        let before = std::fs::read(&path).unwrap();
        let err = match Store::open(&path) {
            Err(err @ Error::CorruptStore { .. }) => err,
            other => panic!("expected CorruptStore, got {other:?}"),
        };
        let Error::CorruptStore {
            path: p, detail, ..
        } = &err
        else {
            unreachable!()
        };
        assert_eq!(p, &path);
        // redb's error stays the source, not only its words.
        let source = std::error::Error::source(&err).expect("redb's error as the source");
        assert_eq!(&source.to_string(), detail);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "a corrupt store is left untouched"
        );
    }
}
