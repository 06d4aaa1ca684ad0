//! `tetherd check`: verifies a stopped daemon's store without changing a
//! byte of it. Everything start-up verifies (see [`super::verify`]), and
//! then every stored frame: each stream's chunks decode, follow one
//! another with no seq missing between the stream's first and last, and
//! chunks the log keeps pass their checksums.

use std::path::Path;
use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable};

use super::chunk::{chunk_bytes, ChunkIter, InLog};
use super::overlay::OverlayOpener;
use super::recovery::{open_database, replay};
use super::schema::{check_version, lost_through, recorded_version, StreamMeta, CHUNKS, STREAMS};
use super::verify::{read_marks, verify_both_there, verify_log};
use crate::error::Damage;
use crate::lock::StateLock;
use crate::store_io::{Headroom, OsOpener};
use crate::wal::{self, LogReader, Wal};
use crate::{Error, Result};

/// Checks the store in `state_dir`: a one-line summary when it is whole,
/// [`Error::Damaged`] naming every damaged place otherwise.
pub fn run(state_dir: &Path) -> Result<String> {
    if !state_dir.is_dir() {
        return Err(Error::Config(format!(
            "no state directory {}",
            state_dir.display()
        )));
    }
    // Held while checking, so that no daemon starts on the files meanwhile.
    // A daemon that runs already is [`Error::AlreadyRunning`]: the caller
    // asks that daemon instead (see `tetherd check`).
    let _lock = StateLock::acquire(state_dir)?;
    verify_dir(state_dir)
}

/// [`run`] with the state directory's lock held by the caller.
pub(super) fn verify_dir(state_dir: &Path) -> Result<String> {
    let store = state_dir.join(super::STORE_FILE);
    let log_path = store.with_extension("wal");
    super::repair::refuse_interrupted(state_dir)?;
    let has_data = std::fs::metadata(&store).is_ok_and(|m| m.len() > 0);
    if !has_data {
        verify_both_there(&store, &log_path, false, &OsOpener)?;
        return Ok(format!(
            "ok: {} holds no store yet (0 streams, 0 frames, 0 bytes)",
            state_dir.display()
        ));
    }
    let db = open_under_overlay(&store)?;
    // A newer build's store is refused by name, not misread: its log may
    // hold changes this build cannot decode.
    if let Some(version) = recorded_version(&db)? {
        check_version(&store, version)?;
    }
    verify_both_there(&store, &log_path, true, &OsOpener)?;
    let marks = read_marks(&db)?;
    let capacity = marks.capacity.unwrap_or(wal::DEFAULT_CAPACITY);
    // The log too goes through an overlay: the replay below writes to it
    // (where it goes on after the records it applied), in memory only.
    let overlay = OverlayOpener::new(Arc::new(OsOpener));
    let mut log = Wal::open(&log_path, capacity, &overlay)?;
    match verify_log(&db, &log) {
        Ok(()) => {}
        Err(Error::Damaged(in_log)) => {
            // The store file's own frames are checked all the same, so that
            // every damaged place is named (not the chunks the log keeps:
            // the log's damage covers those).
            let mut places = match verify_frames(&db, &log.reader(), &store) {
                Err(Error::Damaged(place)) => vec![*place],
                Err(Error::DamagedPlaces(places)) => places,
                _ => Vec::new(),
            };
            places.retain(|place| place.file != log_path);
            places.insert(0, *in_log);
            return Err(match places.len() {
                1 => Error::Damaged(Box::new(places.remove(0))),
                _ => Error::DamagedPlaces(places),
            });
        }
        Err(e) => return Err(e),
    }
    // Commits only the log holds (after a crash) are frames too: applied
    // to the store as start-up would, in memory, they are checked with the
    // rest.
    replay(&db, &mut log)?;
    verify_frames(&db, &log.reader(), &store)
}

/// Opens the store file without writing to it: through an overlay, so
/// that redb may recover a file its last run did not close (which writes)
/// in memory only.
pub(super) fn open_under_overlay(store: &Path) -> Result<redb::Database> {
    let overlay = OverlayOpener::new(Arc::new(OsOpener));
    open_database(store, &overlay, &Arc::new(Headroom::default()))
}

#[derive(Debug, Default)]
struct Totals {
    streams: u64,
    frames: u64,
    bytes: u64,
}

/// Reads every chunk of every stream (those the log keeps through
/// `reader`) in one snapshot of the store file `store_file`: the summary
/// line when all is whole, or every damaged place found (the first of
/// each stream), naming the stream and seqs.
pub(super) fn verify_frames(
    db: &impl ReadableDatabase,
    reader: &LogReader,
    store_file: &Path,
) -> Result<String> {
    let txn = db.begin_read().map_err(super::storage)?;
    let streams = txn.open_table(STREAMS).map_err(super::storage)?;
    let chunks = txn.open_table(CHUNKS).map_err(super::storage)?;
    // Past the seqs from `seq` on that a repair recorded lost.
    let past_lost = |id: u64, seq: u64| -> Result<u64> {
        let last = lost_through(&txn, id, seq).map_err(super::storage)?;
        Ok(last.map_or(seq, |last| last + 1))
    };
    let store_file = store_file.to_path_buf();
    let mut totals = Totals::default();
    let mut kept = Vec::new();
    // Every damaged place, one per stream at most: a stream's frames past
    // its first damage are not checked.
    let mut found = Vec::new();
    'streams: for item in streams.iter().map_err(super::storage)? {
        let (name, meta) = item.map_err(super::storage)?;
        let name = name.value().to_owned();
        let meta: StreamMeta = match postcard::from_bytes(meta.value()) {
            Ok(meta) => meta,
            Err(e) => {
                found.push(damage(
                    &store_file,
                    format!("the metadata of stream {name:?} does not decode: {e}"),
                    format!("the whole stream {name:?}"),
                ));
                continue;
            }
        };
        totals.streams += 1;
        let mut next = meta.first_seq;
        let range = chunks
            .range((meta.id, 0)..=(meta.id, u64::MAX))
            .map_err(super::storage)?;
        for chunk in range {
            let (key, value) = chunk.map_err(super::storage)?;
            let first = key.value().1;
            let value = value.value();
            let in_log = InLog::parse(value).map(|r| (r.at, r.len));
            let from_first = format!("stream {name:?} seqs from {first}");
            let bytes = match chunk_bytes(value, reader, &mut kept, &name, first) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => {
                    let file = if in_log.is_some() {
                        reader.path()
                    } else {
                        &store_file
                    };
                    found.push(damage(file, e.to_string(), from_first));
                    continue 'streams;
                }
            };
            let iter = match ChunkIter::new(first, bytes) {
                Ok(iter) => iter,
                Err(e) => {
                    found.push(damage(
                        &store_file,
                        format!("chunk {first} of stream {name:?} does not decode: {e}"),
                        from_first,
                    ));
                    continue 'streams;
                }
            };
            for frame in iter {
                let frame = match frame {
                    Ok(frame) => frame,
                    Err(e) => {
                        found.push(damage(
                            &store_file,
                            format!(
                                "a frame of chunk {first} of stream {name:?} does not decode: {e}"
                            ),
                            from_first,
                        ));
                        continue 'streams;
                    }
                };
                // A chunk cut by compaction may start before the first
                // seq kept; frames below it are not the stream's any more.
                if frame.seq < meta.first_seq {
                    continue;
                }
                if frame.seq > next {
                    next = past_lost(meta.id, next)?.min(frame.seq);
                }
                if frame.seq != next {
                    found.push(damage(
                        &store_file,
                        format!(
                            "stream {name:?} goes from seq {} to seq {}",
                            next.saturating_sub(1),
                            frame.seq
                        ),
                        format!("stream {name:?} seqs {next}..={}", frame.seq - 1),
                    ));
                    continue 'streams;
                }
                next += 1;
                totals.frames += 1;
                totals.bytes += frame.payload.len() as u64;
            }
        }
        if next <= meta.last_seq {
            next = past_lost(meta.id, next)?.min(meta.last_seq + 1);
        }
        if next != meta.last_seq + 1 {
            found.push(damage(
                &store_file,
                format!(
                    "stream {name:?} ends at seq {}, but its metadata says {}",
                    next.saturating_sub(1),
                    meta.last_seq
                ),
                format!("stream {name:?} seqs {next}..={}", meta.last_seq),
            ));
        }
    }
    match found.len() {
        0 => Ok(format!(
            "ok: {} streams, {} frames, {} bytes",
            totals.streams, totals.frames, totals.bytes
        )),
        1 => Err(Error::Damaged(Box::new(found.remove(0)))),
        _ => Err(Error::DamagedPlaces(found)),
    }
}

fn damage(file: &Path, what: String, affected: String) -> Damage {
    Damage {
        file: file.to_path_buf(),
        offset: None,
        what,
        affected,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use redb::Database;

    use super::*;
    use crate::store::tests::{frame_of, store_version, stored_version, UNPREPARED_LOG};
    use crate::store::Store;

    #[test]
    fn check_reports_a_seq_that_does_not_follow_the_one_before() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        // Two chunks, seqs 1 to 3 and 5 to 6: seq 4 is nowhere, and no
        // repair recorded it lost.
        store
            .write(|txn| {
                for seq in [1, 2, 3, 5, 6] {
                    txn.put_frame(1, seq, &frame_of(b"x"))?;
                }
                let mut meta = StreamMeta::new(1, 0);
                meta.last_seq = 6;
                meta.frames = 5;
                meta.bytes = 5;
                txn.put_stream("a", &meta)
            })
            .unwrap();
        store.close().unwrap();
        drop(store);
        let err = run(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Damaged(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            format!(
                "the store is damaged: {}: stream \"a\" goes from seq 3 to seq 5; affected: \
                 stream \"a\" seqs 4..=4. Nothing was changed",
                path.display()
            )
        );
    }

    #[test]
    fn check_refuses_a_newer_store_naming_both_versions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        store.close().unwrap();
        drop(store);
        store_version(&path, 6);
        let err = run(dir.path()).unwrap_err();
        assert!(matches!(err, Error::CorruptStore { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("schema version 6; this build reads versions 2 to 5 (a newer"),
            "{text}"
        );
        assert_eq!(stored_version(&path), 6, "nothing changed");
    }

    #[test]
    fn check_names_every_damaged_stream() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        for (id, name) in [(1, "a"), (2, "b"), (3, "c")] {
            store
                .write(|txn| {
                    for seq in 1..=3 {
                        txn.put_frame(id, seq, &frame_of(b"x"))?;
                    }
                    let mut meta = StreamMeta::new(id, 0);
                    meta.last_seq = 3;
                    meta.frames = 3;
                    meta.bytes = 3;
                    txn.put_stream(name, &meta)
                })
                .unwrap();
        }
        store.close().unwrap();
        drop(store);
        assert_eq!(run(dir.path()).unwrap(), "ok: 3 streams, 9 frames, 9 bytes");

        // Streams a and c get a chunk that does not decode.
        let db = Database::open(&path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut chunks = txn.open_table(CHUNKS).unwrap();
            for id in [1, 3] {
                chunks.insert((id, 1), &[9u8, 9, 9, 9, 9][..]).unwrap();
            }
        }
        txn.commit().unwrap();
        drop(db);
        let err = run(dir.path()).unwrap_err();
        let text = err.to_string();
        assert!(err.is_damage(), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "the store is damaged in 2 places:", "{text}");
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[1].contains("chunk 1 of stream \"a\""), "{text}");
        assert!(lines[2].contains("chunk 1 of stream \"c\""), "{text}");
    }
}
