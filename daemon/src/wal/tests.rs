//! The tests of the log as a whole (starting again, preparing, wrapping
//! and copying), and the helpers that the tests of every file of
//! the log share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use super::*;
use crate::store_io::OsOpener;

pub(super) fn record(ops: &[Op<'_>]) -> RecordBuf {
    let mut r = RecordBuf::new();
    for op in ops {
        r.push(op).unwrap();
    }
    r
}

pub(super) fn read_all(wal: &Wal, applied: u64) -> Result<(u64, Vec<(u64, usize)>)> {
    let mut seen = Vec::new();
    let replayed = wal.replay(applied, None, |n, _, body| {
        seen.push((n, ops(body).count()));
        Ok(())
    })?;
    Ok((replayed.last, seen))
}

pub(super) fn chunk(stream_id: u64, first_seq: u64, bytes: &[u8]) -> Op<'_> {
    Op::Chunk {
        stream_id,
        first_seq,
        chunk: RawBytes(bytes),
    }
}

pub(super) const PAYLOAD: [u8; 300] = [7; 300];

/// A log of 1 MiB in a new directory holding records 1 to 5, of one
/// chunk each; with the directory and the log's path.
pub(super) fn five_records() -> (tempfile::TempDir, PathBuf, Wal) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.wal");
    let mut wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
    wal.restart(1).unwrap();
    for i in 0..5 {
        wal.append(&mut record(&[chunk(1, i, &PAYLOAD)])).unwrap();
    }
    (dir, path, wal)
}

#[test]
fn a_restart_with_room_to_spare_writes_over_the_old_records() {
    let (_dir, path, mut wal) = five_records();
    let filled = std::fs::metadata(&path).unwrap().len();
    assert!(filled >= ZERO_STEP, "zeros ahead of the records");
    // A temporary directory has four MiB to spare: the file is kept,
    // its blocks in place, and the next records go over the old ones.
    assert!(wal.space_to_spare());
    wal.restart(6).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), filled);
    wal.append(&mut record(&[chunk(1, 60, &PAYLOAD)])).unwrap();
    wal.append(&mut record(&[chunk(1, 61, &PAYLOAD)])).unwrap();
    assert_eq!(read_all(&wal, 5).unwrap(), (7, vec![(6, 1), (7, 1)]));
    // Reopened after a crash, the same: the old third record is not 8.
    let reopened = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
    assert_eq!(read_all(&reopened, 5).unwrap(), (7, vec![(6, 1), (7, 1)]));
    assert_eq!(reopened.filled, filled);
}

#[test]
fn a_prepared_log_is_its_whole_capacity_before_the_first_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.wal");
    let capacity = 3 * ZERO_STEP + 5;
    let mut wal = Wal::open(&path, capacity, &OsOpener).unwrap();
    wal.prepare().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), capacity);
    // Appending writes no zeros and never grows the file: every record
    // goes over blocks already there.
    wal.restart(1).unwrap();
    for i in 0..5 {
        wal.append(&mut record(&[chunk(1, i, &PAYLOAD)])).unwrap();
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), capacity);
    assert_eq!(read_all(&wal, 0).unwrap().0, 5);
    // Preparing again (the next open) changes nothing.
    let mut reopened = Wal::open(&path, capacity, &OsOpener).unwrap();
    reopened.prepare().unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), capacity);
    assert_eq!(read_all(&reopened, 0).unwrap().0, 5);
}

#[test]
fn after_a_restart_the_next_open_reads_nothing() {
    let (_dir, path, mut wal) = five_records();
    wal.restart(6).unwrap();
    let reopened = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
    let replayed = reopened.replay(5, None, |_, _, _| Ok(())).unwrap();
    assert_eq!(
        replayed,
        Replayed {
            last: 5,
            end: 0,
            stopped_before: None,
            ended_at_damage: None,
        }
    );
}

/// A log of 64 KiB wrapping, prepared as a store opens it.
pub(super) fn small_ring() -> (tempfile::TempDir, Wal) {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::open(&dir.path().join("t.wal"), 64 * 1024, &OsOpener).unwrap();
    wal.prepare().unwrap();
    assert_eq!(
        wal.layout(),
        Layout::Wrapping,
        "a temporary directory has room to spare"
    );
    wal.start_wrapping_here();
    (dir, wal)
}

/// A record of one chunk of `len` bytes, each `byte`.
pub(super) fn sized(len: usize, byte: u8) -> RecordBuf {
    let bytes = vec![byte; len];
    record(&[chunk(1, u64::from(byte), &bytes)])
}

#[test]
fn wrapping_a_record_that_does_not_fit_goes_to_the_files_start() {
    let (_dir, mut wal) = small_ring();
    let mut starts = Vec::new();
    for byte in 1..=3 {
        let mut r = sized(20 * 1024, byte);
        starts.push(wal.place(r.len() as u64).unwrap());
        wal.append(&mut r).unwrap();
    }
    let len = starts[1];
    assert_eq!(starts, vec![0, len, 2 * len]);
    // The fourth would pass the file's end: it goes to its start, a
    // lap on, but only once the chunks the log keeps there are copied.
    assert_eq!(wal.place(len), None);
    let mut seen = Vec::new();
    let to = wal
        .records_to_copy(len, |at, body| {
            seen.push((at, ops(body).count()));
            Ok(())
        })
        .unwrap();
    assert_eq!((seen, to), (vec![(0, 1)], len));
    wal.copied_to(to);
    assert_eq!(wal.place(len), None, "copied, but not yet durably");
    assert_eq!(wal.durable_marks(), Some((3, 3 * len, len)));
    wal.committed_durably(4).unwrap();
    assert_eq!(wal.place(len), Some(64 * 1024));
    wal.append(&mut sized(20 * 1024, 4)).unwrap();

    // A replay from the second record finds the fourth at the start.
    let mut replayed = Vec::new();
    let end = wal
        .replay(1, Some(len), |n, _, body| {
            let Ok(Op::Chunk { first_seq, .. }) = ops(body).next().unwrap() else {
                panic!("not a chunk");
            };
            replayed.push((n, first_seq));
            Ok(())
        })
        .unwrap();
    assert_eq!(replayed, vec![(2, 2), (3, 3), (4, 4)]);
    assert_eq!(end.last, 4);
    assert_eq!(end.end, 64 * 1024 + len);
    // Copying goes on past the third record's lap end to the fourth.
    let mut seen = Vec::new();
    wal.copied_to(len);
    let to = wal
        .records_to_copy(u64::MAX, |at, _| {
            seen.push(at);
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, vec![len, 2 * len, 64 * 1024]);
    assert_eq!(to, 64 * 1024 + len);
}

#[test]
fn copying_waits_for_idle_time_until_the_records_come_near() {
    let (_dir, mut wal) = small_ring();
    let capacity = 64 * 1024;
    let ahead = wal.copy_ahead();
    let piece = capacity / 256;
    let append_until = |wal: &mut Wal, near: u64| {
        while wal.pos + near <= capacity {
            wal.append(&mut sized(500, 1)).unwrap();
        }
    };
    append_until(&mut wal, 2 * ahead);
    assert_eq!(wal.copy_budget(CopyPace::Idle), 0, "far from the lap's end");
    assert_eq!(wal.copy_budget(CopyPace::BetweenBatches), 0);
    // Within COPY_AHEAD: a piece at a time, in idle time only.
    append_until(&mut wal, ahead);
    let wanted = wal.pos + ahead - capacity;
    assert_eq!(wal.copy_budget(CopyPace::Idle), wanted.min(piece));
    assert_eq!(wal.copy_budget(CopyPace::BetweenBatches), 0);
    // Within three quarters of it, between batches too: what brings
    // the copying back there, and a piece more.
    let near = ahead / 4 * 3;
    append_until(&mut wal, near);
    let behind = wal.pos + near - capacity;
    assert_eq!(wal.copy_budget(CopyPace::BetweenBatches), behind + piece);
    let to = wal.records_to_copy(behind + piece, |_, _| Ok(())).unwrap();
    wal.copied_to(to);
    assert_eq!(wal.copy_budget(CopyPace::BetweenBatches), 0);
    assert!(
        wal.copy_budget(CopyPace::Idle) > 0,
        "idle time copies on up to COPY_AHEAD ahead"
    );
    // Not wrapping: nothing is ever copied.
    let dir = tempfile::tempdir().unwrap();
    let mut flat = Wal::open(&dir.path().join("f.wal"), capacity, &OsOpener).unwrap();
    for _ in 0..100 {
        flat.append(&mut sized(500, 1)).unwrap();
    }
    assert_eq!(flat.copy_budget(CopyPace::Idle), 0);
    assert_eq!(flat.copy_budget(CopyPace::BetweenBatches), 0);
}

#[test]
fn a_producer_that_leaves_no_idle_time_has_the_store_committed_durably_every_few_records() {
    // As the writer tends the log between batches, with no idle time
    // to copy in: two laps of 500-byte records.
    let (_dir, mut wal) = small_ring();
    let (mut records, mut durable_commits) = (0, 0);
    while wal.pos < 3 * 64 * 1024 {
        let mut r = sized(500, 1);
        assert!(wal.place(r.len() as u64).is_some(), "the log ran full");
        wal.append(&mut r).unwrap();
        records += 1;
        let budget = wal.copy_budget(CopyPace::BetweenBatches);
        if budget > 0 {
            let to = wal.records_to_copy(budget, |_, _| Ok(())).unwrap();
            wal.copied_to(to);
        }
        if wal.wants_durable_commit() {
            wal.committed_durably(wal.next_number()).unwrap();
            durable_commits += 1;
        }
    }
    assert!(durable_commits > 0);
    assert!(
        records >= 4 * durable_commits,
        "{durable_commits} durable commits for {records} records"
    );
}
