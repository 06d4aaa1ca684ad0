//! The store under a failing disk: a full disk, an I/O error or a torn
//! write at one exact operation, injected under its files with
//! `store_io::FaultyOpener` (feature `test-hooks`), under the store and
//! under the engine (`Queue`, its writer and degraded mode); and a store
//! damaged while closed, which opening refuses without writing a byte, but
//! for a torn tail.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tether_protocol::{Frame, FrameKind};
use tetherd::store::{ReadLimits, Store, StreamMeta};
use tetherd::store_io::{FaultPlan, FaultyOpener, Files, IoOp};
use tetherd::Error;

const NAME: &str = "s";
const STREAM_ID: u64 = 1;
/// Small enough that a few commits wrap it, so that the store keeps
/// chunks in the log as well as in redb.
const LOG: u64 = 128 * 1024;

fn frame(seq: u64) -> Frame {
    Frame {
        ts_micros: 1_700_000_000_000_000 + seq,
        kind: FrameKind::Data,
        payload: Bytes::from(format!("frame-{seq:05}-").repeat(20)),
    }
}

fn open(path: &Path, plan: &Arc<FaultPlan>) -> tetherd::Result<Store> {
    Store::open_with(path, LOG, Arc::new(FaultyOpener::new(plan.clone())))
}

/// Appends frames `meta.last_seq + 1 ..= through` in one logged commit,
/// and syncs the log as the syncer would; `meta` only changes once
/// everything worked.
fn append_through(store: &Store, meta: &mut StreamMeta, through: u64) -> tetherd::Result<()> {
    let mut next = meta.clone();
    store.write_logged(
        |txn| {
            while next.last_seq < through {
                next.last_seq += 1;
                next.frames += 1;
                txn.put_frame(STREAM_ID, next.last_seq, &frame(next.last_seq))?;
            }
            txn.put_stream(NAME, &next)
        },
        |_| {},
    )?;
    store
        .wal_sync_handle()
        .sync()
        .map_err(|e| Error::io("syncing the log", e))?;
    *meta = next;
    Ok(())
}

/// Every frame of the stream, by seq.
fn read_all(store: &Store) -> tetherd::Result<Vec<u64>> {
    let limits = ReadLimits {
        max_frames: usize::MAX,
        max_bytes: usize::MAX,
        through_seq: u64::MAX,
    };
    let read = store.read_frames(NAME, 1, limits)?;
    for (seq, frame) in &read.frames {
        assert_eq!(frame, &self::frame(*seq), "frame {seq} as written");
    }
    Ok(read.frames.into_iter().map(|(seq, _)| seq).collect())
}

fn seqs(through: u64) -> Vec<u64> {
    (1..=through).collect()
}

#[test]
fn a_full_disk_under_a_logged_write_is_disk_full_and_what_was_committed_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    for through in (10..=100).step_by(10) {
        append_through(&store, &mut meta, through).unwrap();
    }
    assert_eq!(read_all(&store).unwrap(), seqs(100));

    // The disk is full: the log's append fails, and so does the durable
    // commit the store falls back to.
    for op in [IoOp::Write, IoOp::SetLen, IoOp::Allocate] {
        plan.fail_all(Files::Any, op, libc::ENOSPC);
    }
    let err = append_through(&store, &mut meta, 110).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
    assert!(
        plan.count(&Files::suffix(".wal"), IoOp::Write) > 0,
        "the log was written to first"
    );
    assert_eq!(meta.last_seq, 100);
    // Everything committed before is still read, the disk still full.
    assert_eq!(read_all(&store).unwrap(), seqs(100));

    // Space again: writes go on where they stopped.
    plan.clear();
    store.recover().unwrap();
    append_through(&store, &mut meta, 110).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(110));
    store.close().unwrap();
    let reopened = open(&path, &plan).unwrap();
    assert_eq!(read_all(&reopened).unwrap(), seqs(110));
}

#[test]
fn a_log_append_that_fails_commits_nothing_and_leaves_redb_readable() {
    //! A failed log append once fell back to a durable redb commit, which
    //! on a full disk made redb meet the failure too (and then refuse
    //! reads until reopened).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    append_through(&store, &mut meta, 10).unwrap();
    plan.reset_counts();
    plan.fail_next(Files::suffix(".wal"), IoOp::Write, libc::ENOSPC);
    let e = append_through(&store, &mut meta, 20).unwrap_err();
    assert!(matches!(e, Error::DiskFull { .. }), "{e:?}");
    assert_eq!(plan.injected(), 1);
    assert_eq!(
        plan.count(&Files::suffix(".redb"), IoOp::Sync),
        0,
        "redb was not made to commit durably instead"
    );
    assert_eq!(meta.last_seq, 10);
    assert_eq!(read_all(&store).unwrap(), seqs(10));
    // The append's number was given back: the next record follows on.
    append_through(&store, &mut meta, 20).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(20));
    drop(store);
    assert_eq!(read_all(&open(&path, &plan).unwrap()).unwrap(), seqs(20));
}

#[test]
fn the_store_keeps_headroom_and_reports_a_short_disk_before_redb_meets_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    let headroom = store.headroom();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    append_through(&store, &mut meta, 10).unwrap();
    store.commit_durably().unwrap();
    assert!(headroom.headroom() > 0);
    assert!(!headroom.space_short());

    plan.fail_all(Files::suffix(".redb"), IoOp::Allocate, libc::ENOSPC);
    let room = headroom.headroom();
    assert!(headroom.try_reserve(room), "within what is reserved");
    assert!(!headroom.try_reserve(room + 1));
    assert!(headroom.space_short());
    // Reads and writes within the headroom go on.
    append_through(&store, &mut meta, 20).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(20));

    plan.clear();
    assert!(headroom.try_reserve(room + 1));
    assert!(!headroom.space_short());
    // The handle follows the store through a reopening of redb.
    store.recover().unwrap();
    assert!(headroom.try_reserve(1));
}

/// A store holding frames 1 to 50 from five logged commits, synced but
/// not committed durably.
fn fifty(path: &Path, plan: &Arc<FaultPlan>) -> (Store, StreamMeta) {
    let store = open(path, plan).unwrap();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    for through in (10..=50).step_by(10) {
        append_through(&store, &mut meta, through).unwrap();
    }
    (store, meta)
}

/// Fails each write, sync, change of length and reservation of one logged
/// commit and the durable commit after it in turn (with `errno`, or torn), and
/// checks that the store then holds either everything before that commit
/// or everything with it (with it once the log was synced), now, after
/// recovering, and after reopening; and that it takes the next commit
/// once the fault is gone.
fn every_fault_of_one_commit(through: u64, ops: &[IoOp], fault: impl Fn(&FaultPlan, IoOp, u64)) {
    // A clean run, to count the operations.
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let (store, mut meta) = fifty(&dir.path().join("tether.redb"), &plan);
    plan.reset_counts();
    append_through(&store, &mut meta, through).unwrap();
    store.commit_durably().unwrap();
    let counts: Vec<u64> = ops.iter().map(|op| plan.count(&Files::Any, *op)).collect();
    assert!(counts.iter().all(|n| *n > 0), "{ops:?}: {counts:?}");
    drop(store);

    for (&op, count) in ops.iter().zip(counts) {
        for k in 0..count {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("tether.redb");
            let plan = FaultPlan::new();
            let (store, mut meta) = fifty(&path, &plan);
            fault(&plan, op, k);
            let appended = append_through(&store, &mut meta, through);
            if appended.is_ok() {
                // Its failure is the injected one; what the store holds
                // is checked below.
                let _ = store.commit_durably();
            }
            assert!(!plan.pending(), "{op:?} {k} was not reached");
            let held = |what: &str, seqs: Vec<u64>| {
                let held = seqs.len() as u64;
                assert_eq!(seqs, self::seqs(held), "{op:?} {k}, {what}");
                match &appended {
                    Ok(()) => assert_eq!(held, through, "{op:?} {k}, {what}"),
                    Err(_) => assert!(held == 50 || held == through, "{op:?} {k}, {what}"),
                }
            };
            held("read at once", read_all(&store).unwrap());
            store.recover().unwrap();
            held("after recovering", read_all(&store).unwrap());
            store.close().unwrap();
            drop(store);
            let store = open(&path, &plan).unwrap();
            let after = read_all(&store).unwrap();
            held("reopened", after.clone());
            let mut meta = StreamMeta::new(STREAM_ID, 0);
            meta.last_seq = after.len() as u64;
            meta.frames = meta.last_seq;
            append_through(&store, &mut meta, through + 10).unwrap();
            assert_eq!(read_all(&store).unwrap(), seqs(through + 10), "{op:?} {k}");
        }
    }
}

/// What a small commit and the durable commit after it do: the store's file
/// does not grow.
const SMALL: [IoOp; 2] = [IoOp::Write, IoOp::Sync];

/// A commit too big for the log, which grows the store's file.
#[test]
fn growing_the_store_short_of_space_at_any_point_keeps_it_whole() {
    let growth = [IoOp::Sync, IoOp::SetLen, IoOp::Allocate];
    every_fault_of_one_commit(8000, &growth, |plan, op, k| {
        plan.fail_nth(Files::Any, op, k, libc::ENOSPC)
    });
}

#[test]
fn an_io_error_at_any_point_of_a_commit_keeps_the_store_whole() {
    every_fault_of_one_commit(60, &SMALL, |plan, op, k| {
        plan.fail_nth(Files::Any, op, k, libc::EIO)
    });
}

#[test]
fn a_full_disk_at_any_point_of_a_commit_keeps_the_store_whole() {
    every_fault_of_one_commit(60, &SMALL, |plan, op, k| {
        plan.fail_nth(Files::Any, op, k, libc::ENOSPC)
    });
}

#[test]
fn a_torn_write_at_any_point_of_a_commit_keeps_the_store_whole() {
    every_fault_of_one_commit(60, &SMALL, |plan, op, k| match op {
        IoOp::Write => plan.tear_nth_write(Files::Any, k),
        _ => plan.fail_nth(Files::Any, op, k, libc::EIO),
    });
}

// Damage is never silent: a store damaged while it was closed is refused
// at opening, with both files left as they were; a torn tail is not
// damage.

/// A record of the log: (its byte in the file, its number, its body's
/// length). Read from byte 0 while each passes its check and follows the
/// one before (see `tetherd::wal`, "Records").
fn log_records(log: &Path) -> Vec<(u64, u64, u64)> {
    let data = std::fs::read(log).unwrap();
    let mut records: Vec<(u64, u64, u64)> = Vec::new();
    let mut at = 0usize;
    while at + 16 <= data.len() {
        let body_len = u32::from_le_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().unwrap());
        let number = u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
        let end = at + 16 + body_len;
        if body_len == 0 || end > data.len() || crc32fast::hash(&data[at + 8..end]) != crc {
            break;
        }
        if records.last().is_some_and(|(_, n, _)| n + 1 != number) {
            break;
        }
        records.push((at as u64, number, body_len as u64));
        at = end;
    }
    records
}

/// The files of a store as a crash left them: frames 1 to 30 from three
/// logged commits the store then committed durably (their chunks stay in the log,
/// which wraps), and 31 to 60 from three more that only the log
/// holds. Returns the store file's path in a copy taken while the store
/// was open, as `kill -9` would leave it.
fn crashed_store(dir: &Path) -> PathBuf {
    let live = dir.join("live");
    let crash = dir.join("crash");
    std::fs::create_dir(&live).unwrap();
    std::fs::create_dir(&crash).unwrap();
    let plan = FaultPlan::new();
    let store = open(&live.join("tether.redb"), &plan).unwrap();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    for through in [10, 20, 30] {
        append_through(&store, &mut meta, through).unwrap();
    }
    store.commit_durably().unwrap();
    for through in [40, 50, 60] {
        append_through(&store, &mut meta, through).unwrap();
    }
    for name in ["tether.redb", "tether.wal"] {
        std::fs::copy(live.join(name), crash.join(name)).unwrap();
    }
    drop(store);
    let path = crash.join("tether.redb");
    assert_eq!(
        log_records(&path.with_extension("wal")).len(),
        6,
        "one record per logged commit"
    );
    path
}

/// Both files' bytes (`None`: the file does not exist).
fn files_of(path: &Path) -> [Option<Vec<u8>>; 2] {
    [path.to_path_buf(), path.with_extension("wal")].map(|p| std::fs::read(p).ok())
}

fn flip(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x5a;
    std::fs::write(path, bytes).unwrap();
}

/// Opens the damaged store at `path`: the error is damage, and neither
/// file changed, nor was anything written, synced, cut or grown.
fn refused(path: &Path) -> Error {
    let before = files_of(path);
    let plan = FaultPlan::new();
    let err = match open(path, &plan) {
        Ok(_) => panic!("a damaged store was opened"),
        Err(e) => e,
    };
    assert!(err.is_damage(), "not damage: {err:?}");
    for op in [IoOp::Write, IoOp::Sync, IoOp::SetLen, IoOp::Allocate] {
        assert_eq!(plan.count(&Files::Any, op), 0, "{op:?} on a damaged store");
    }
    assert!(
        files_of(path) == before,
        "opening changed the damaged files"
    );
    err
}

/// The damage `err` names.
fn damage(err: Error) -> tetherd::error::Damage {
    match err {
        Error::Damaged(damage) => *damage,
        other => panic!("expected Error::Damaged, got {other:?}"),
    }
}

#[test]
fn a_record_failing_before_a_valid_one_in_the_replay_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    // The first of the commits only the log holds.
    let (at, number, len) = log_records(&log)[3];
    flip(&log, at + 16 + len / 2);
    let damage = damage(refused(&path));
    assert_eq!((damage.file, damage.offset), (log, Some(at)));
    assert!(
        damage.what.starts_with(&format!(
            "record {number} fails its check, and the record after it passes"
        )),
        "{}",
        damage.what
    );
}

#[test]
fn a_record_whose_chunks_the_store_reads_from_the_log_failing_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    // Committed durably: the store holds where its chunk is in the log.
    let (at, _, len) = log_records(&log)[1];
    flip(&log, at + 16 + len / 2);
    let damage = damage(refused(&path));
    assert_eq!((damage.file, damage.offset), (log, Some(at)));
    assert_eq!(
        damage.what,
        "a record whose chunks the store reads from the log fails its check"
    );
    assert_eq!(damage.affected, format!("stream {NAME:?} seqs 11..=20"));
}

#[test]
fn the_first_records_length_damaged_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    assert_eq!(log_records(&log)[0].0, 0);
    flip(&log, 2);
    let damage = damage(refused(&path));
    assert_eq!((damage.file, damage.offset), (log, Some(0)));
}

#[test]
fn a_log_cut_to_nothing_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    std::fs::File::options()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    let damage = damage(refused(&path));
    assert_eq!((damage.file, damage.offset), (log, Some(0)));
    assert!(damage.what.contains("cut short"), "{}", damage.what);
}

#[test]
fn a_missing_log_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    std::fs::remove_file(&log).unwrap();
    let damage = damage(refused(&path));
    assert_eq!(damage.file, log);
    assert!(damage.what.contains("missing"), "{}", damage.what);
}

#[test]
fn a_missing_store_file_beside_a_log_with_records_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    std::fs::remove_file(&path).unwrap();
    let damage = damage(refused(&path));
    assert_eq!(damage.file, path);
    assert!(damage.what.contains("missing"), "{}", damage.what);
}

#[test]
fn a_store_file_with_damaged_pages_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    for at in (0..len).step_by(64 * 1024) {
        flip(&path, at);
    }
    match refused(&path) {
        Error::CorruptStore { path: named, .. } => assert_eq!(named, path),
        other => panic!("expected Error::CorruptStore, got {other:?}"),
    }
}

#[test]
fn a_store_file_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    match refused(&path) {
        Error::CorruptStore { path: named, .. } => assert_eq!(named, path),
        other => panic!("expected Error::CorruptStore, got {other:?}"),
    }
}

#[test]
fn a_torn_tail_is_dropped_and_every_commit_before_it_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_store(dir.path());
    let log = path.with_extension("wal");
    let (at, _, len) = *log_records(&log).last().unwrap();
    // The second half of the last commit's record never reached the disk.
    let mut bytes = std::fs::read(&log).unwrap();
    bytes[(at + 16 + len / 2) as usize..(at + 16 + len) as usize].fill(0);
    std::fs::write(&log, bytes).unwrap();
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(50));
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    meta.last_seq = 50;
    meta.frames = 50;
    append_through(&store, &mut meta, 70).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(70));
    store.close().unwrap();
    drop(store);
    assert_eq!(read_all(&open(&path, &plan).unwrap()).unwrap(), seqs(70));
}

#[test]
fn a_full_disk_refuses_writes_before_redb_meets_it_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    let headroom = store.headroom();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    for through in (10..=50).step_by(10) {
        append_through(&store, &mut meta, through).unwrap();
    }
    store.commit_durably().unwrap();

    // The disk is full: no block can be reserved any more. A commit
    // bigger than what is reserved is refused before redb sees it.
    plan.fail_all(Files::Any, IoOp::Allocate, libc::ENOSPC);
    plan.reset_counts();
    let big = 50 + 20_000;
    let err = append_through(&store, &mut meta, big).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
    assert!(
        err.to_string()
            .ends_with("No space left on device (os error 28)"),
        "{err}"
    );
    assert_eq!(
        plan.count(&Files::suffix(".wal"), IoOp::Write),
        0,
        "refused before its record was appended"
    );
    assert!(!headroom.redb_failed(), "redb never met the full disk");
    // A failed append to the log leaves redb as it was, too.
    plan.fail_next(Files::suffix(".wal"), IoOp::Write, libc::ENOSPC);
    let err = append_through(&store, &mut meta, 60).unwrap_err();
    assert!(matches!(err, Error::DiskFull { .. }), "{err:?}");
    assert!(!headroom.redb_failed());

    // Every read is served from what is stored, and there is nothing to
    // reopen: the handle (and what it keeps reserved) stays.
    let reserved = headroom.headroom();
    assert!(reserved > 0);
    assert_eq!(read_all(&store).unwrap(), seqs(50));
    store.recover().unwrap();
    assert_eq!(headroom.headroom(), reserved, "not reopened");
    assert_eq!(read_all(&store).unwrap(), seqs(50));

    // Space again: writes go on where they stopped.
    plan.clear();
    append_through(&store, &mut meta, big).unwrap();
    assert_eq!(read_all(&store).unwrap(), seqs(big));
    store.close().unwrap();
    drop(store);
    assert_eq!(read_all(&open(&path, &plan).unwrap()).unwrap(), seqs(big));
}

#[test]
fn a_failing_store_file_is_reopened_for_reads_once_a_while_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tether.redb");
    let plan = FaultPlan::new();
    let store = open(&path, &plan).unwrap();
    let headroom = store.headroom();
    let mut meta = StreamMeta::new(STREAM_ID, 0);
    append_through(&store, &mut meta, 50).unwrap();

    // redb's durable commit fails to sync: redb refuses all work after it.
    plan.fail_next(Files::suffix(".redb"), IoOp::Sync, libc::EIO);
    let err = store.commit_durably().unwrap_err();
    assert!(headroom.redb_failed());
    // Named as the contract words a failing device: the file, then why.
    let fault = tetherd::degraded::Fault::of(&err).expect("a storage fault");
    assert!(!fault.full);
    assert!(
        fault
            .cause
            .starts_with(&format!("I/O error on {}: ", path.display()))
            && fault.cause.ends_with("Input/output error (os error 5)"),
        "{}",
        fault.cause
    );

    // Reads go on (from what redb still has, or from a handle a read
    // reopened), and the writer's retry reopens it for writes.
    assert_eq!(read_all(&store).unwrap(), seqs(50));
    store.recover().unwrap();
    assert!(!headroom.redb_failed());
    append_through(&store, &mut meta, 60).unwrap();

    // Failing again soon after a reopening, reads that fail do not reopen
    // it again (each would drop the only handle, and on a failing disk
    // fail as often); the writer's retry does.
    plan.fail_all(Files::suffix(".redb"), IoOp::Read, libc::EIO);
    plan.fail_next(Files::suffix(".redb"), IoOp::Sync, libc::EIO);
    store.commit_durably().unwrap_err();
    for _ in 0..3 {
        let _ = read_all(&store);
        assert!(headroom.redb_failed(), "reopened by a read again at once");
    }
    plan.clear();
    store.recover().unwrap();
    assert!(!headroom.redb_failed());
    assert_eq!(read_all(&store).unwrap(), seqs(60));
}

// The engine over a failing disk: the same faults, met by `Queue`, the
// writer, its degraded mode and its retries.

/// Producer `P`'s frames `pseqs` of stream [`NAME`].
fn engine_appends(pseqs: std::ops::RangeInclusive<u64>) -> Vec<tether_protocol::Append> {
    pseqs
        .map(|pseq| tether_protocol::Append {
            stream: NAME.into(),
            producer: "P".into(),
            producer_seq: pseq,
            kind: FrameKind::Data,
            payload: Bytes::from(format!("P-{pseq:04}")),
        })
        .collect()
}

fn engine_open(path: &Path, plan: &Arc<FaultPlan>) -> tetherd::engine::Queue {
    let opts = tetherd::engine::QueueOptions {
        log_capacity: LOG,
        opener: Arc::new(FaultyOpener::new(plan.clone())),
        ..tetherd::engine::QueueOptions::default()
    };
    tetherd::engine::Queue::open(path, opts).unwrap()
}

/// Every stored frame of the stream, as (seq, payload), read as a
/// subscriber reads them.
async fn engine_read(queue: &tetherd::engine::Queue) -> Vec<(u64, String)> {
    use tetherd::subscription::SubEvent;
    let mut sub = queue.subscribe(NAME, 0, false).unwrap();
    let mut frames = Vec::new();
    loop {
        match sub.next().await.unwrap() {
            SubEvent::Frames(batch) => frames.extend(
                batch
                    .into_iter()
                    .map(|(seq, f)| (seq, String::from_utf8(f.payload.to_vec()).unwrap())),
            ),
            SubEvent::End { .. } => return frames,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn engine_frames(seqs: std::ops::RangeInclusive<u64>) -> Vec<(u64, String)> {
    seqs.map(|seq| (seq, format!("P-{seq:04}"))).collect()
}

/// A write that puts its first half down, then fails with EIO.
const TORN: i32 = 0;

/// For each write and sync of one append's commit in turn, failed with
/// ENOSPC, with EIO, and (a write) torn: the append is not acknowledged and says why, the
/// frames acknowledged before are read back meanwhile, and once the
/// fault is gone the resent append is stored, once, by the writer's own
/// retry, with nothing acknowledged lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_acknowledges_no_failed_write_serves_reads_and_recovers() {
    // A clean run, to count the append's operations.
    let dir = tempfile::tempdir().unwrap();
    let plan = FaultPlan::new();
    let queue = engine_open(&dir.path().join("tether.redb"), &plan);
    queue.append(engine_appends(1..=10)).await.unwrap();
    plan.reset_counts();
    queue.append(engine_appends(11..=20)).await.unwrap();
    let ops = [IoOp::Write, IoOp::Sync];
    let counts: Vec<u64> = ops.iter().map(|op| plan.count(&Files::Any, *op)).collect();
    assert!(counts.iter().all(|n| *n > 0), "{ops:?}: {counts:?}");
    queue.close().await.unwrap();

    for (&op, count) in ops.iter().zip(counts) {
        for k in 0..count {
            for errno in [libc::ENOSPC, libc::EIO, TORN] {
                if errno == TORN && op != IoOp::Write {
                    continue;
                }
                let what = format!("{op:?} {k} failing with errno {errno} (0: torn)");
                let dir = tempfile::tempdir().unwrap();
                let plan = FaultPlan::new();
                let queue = engine_open(&dir.path().join("tether.redb"), &plan);
                queue.append(engine_appends(1..=10)).await.unwrap();
                if errno == TORN {
                    plan.tear_nth_write(Files::Any, k);
                } else {
                    plan.fail_nth(Files::Any, op, k, errno);
                }
                let failed = queue.append(engine_appends(11..=20)).await;
                assert!(!plan.pending(), "{what}: not reached");
                let err = failed.expect_err(&what);
                // A failed sync is an I/O error on the log, whatever its
                // errno: the pages it wrote are not trusted.
                let (code, words) = match (op, errno) {
                    (IoOp::Write, libc::ENOSPC) => (
                        tether_protocol::ErrorCode::STORAGE_FULL,
                        "No space left on device (os error 28)",
                    ),
                    (_, libc::ENOSPC) => (
                        tether_protocol::ErrorCode::STORAGE,
                        "No space left on device (os error 28)",
                    ),
                    _ => (
                        tether_protocol::ErrorCode::STORAGE,
                        "Input/output error (os error 5)",
                    ),
                };
                assert_eq!(err.code(), code, "{what}: {err}");
                assert!(err.to_string().ends_with(words), "{what}: {err}");

                // Reads go on from what is stored; while the fault lasts,
                // the store is degraded and appends are refused.
                assert_eq!(engine_read(&queue).await, engine_frames(1..=10), "{what}");
                let lasting = if errno == TORN { libc::EIO } else { errno };
                plan.fail_all(Files::Any, op, lasting);
                let refused = queue.append(engine_appends(11..=20)).await;
                assert!(refused.is_err(), "{what}: stored while failing");
                // A failed sync is met by the syncer, and the writer
                // learns of it after the answer.
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while queue.storage_fault().is_none() {
                    assert!(std::time::Instant::now() < deadline, "{what}: not degraded");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                assert!(
                    queue.append(engine_appends(11..=20)).await.is_err(),
                    "{what}: stored while degraded"
                );
                assert_eq!(engine_read(&queue).await, engine_frames(1..=10), "{what}");

                // The fault ends: the writer's retry (the first within
                // 1 s, then every 5 s) clears it, and the resent frames
                // are stored once.
                plan.clear();
                let deadline = std::time::Instant::now() + Duration::from_secs(15);
                let stored = loop {
                    match queue.append(engine_appends(11..=20)).await {
                        Ok(stored) => break stored,
                        Err(e) => assert!(
                            std::time::Instant::now() < deadline,
                            "{what}: not writable 15 s after the fault ended: {e}"
                        ),
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                // Stored now, or found stored: after a failed sync the
                // writer writes the log's records again and syncs them
                // (`Wal::rewrite`), which may keep the failed commit's.
                // Either way each frame is there once.
                let fresh: Vec<(u64, bool)> = (11..=20).map(|seq| (seq, false)).collect();
                let found: Vec<(u64, bool)> = (11..=20).map(|_| (20, true)).collect();
                let outcomes: Vec<(u64, bool)> =
                    stored.iter().map(|o| (o.seq, o.duplicate)).collect();
                assert!(
                    outcomes == fresh || outcomes == found,
                    "{what}: {outcomes:?}"
                );
                assert!(queue.storage_fault().is_none(), "{what}: still degraded");
                assert_eq!(engine_read(&queue).await, engine_frames(1..=20), "{what}");
                queue.close().await.unwrap();
            }
        }
    }
}
