//! The store: the only module that touches redb.
//!
//! One redb file (`tether.redb` in the state directory) holds every stream.
//! The API is synchronous; callers keep it off async worker threads (the
//! queue's writer thread owns all write transactions, readers use
//! `spawn_blocking`).
//!
//! # Tables
//!
//! | table | key | value |
//! |---|---|---|
//! | `streams` | stream name | postcard [`StreamMeta`] |
//! | `chunks` | (stream id, first seq) | the frames of one group commit, or where the log keeps them (see below) |
//! | `producers` | (stream id, producer) | (newest producer_seq, its stream seq) |
//! | `consumers` | (stream id, consumer) | acked_through |
//! | `meta` | key | u64 (schema version, next stream id, the log's marks) |
//! | `executions` | execution id | encoded manifest (the supervisor's format) |
//! | `checkpoints` | (execution id, checkpoint id) | a [`Record`](crate::checkpoint::Record) |
//! | `steps` | (execution id, step name) | the step's recorded result |
//!
//! A stream's metadata, its frames, its producers' dedupe state and its
//! consumers' acks change in the same write transaction, so after any crash
//! they agree with each other. An execution's manifest is written in the
//! same transaction as the lifecycle frames that announce its change, for
//! the same reason. The store keeps manifests as opaque bytes: their layout
//! belongs to the supervisor.
//!
//! # Chunks
//!
//! The frames one write transaction appends to a stream are stored as one
//! value, a chunk, keyed by the seq of its first frame: a row per frame
//! would cap ingest near redb's own rate of inserts, while a chunk costs
//! one insert per stream per commit. The frame with seq K is in the chunk
//! with the greatest key at or below (stream id, K), found with one reverse
//! range query. A chunk is a `u32` little-endian frame count, then per frame
//! a postcard [`FrameHead`] followed by the payload's bytes.
//!
//! Chunks hold exactly the retained frames: compaction deletes the chunks
//! wholly below the new first seq and rewrites the one that straddles it,
//! under the key of its first retained frame, so that no reader ever needs
//! the stream's metadata to tell retained frames from deleted ones.
//!
//! Reads copy the part of a chunk they return into one buffer and hand out
//! payloads as slices of it: one allocation per chunk read, not per frame.
//!
//! When the write-ahead log goes round (see [`crate::wal`], "Going
//! round"), a logged transaction's chunk value is an [`InLog`] instead:
//! where its bytes are in the log's record, read from there until the
//! writer copies them in as the log comes round. Every reader of chunk
//! values goes through one function, `chunk_bytes`.
//!
//! Schema version 2 introduced chunks; a version 1 file (one row per frame)
//! is refused with a message naming the versions read, not migrated.
//! Version 3 lets a chunk value be an [`InLog`]: a version-2 store is
//! marked 3 when its log first goes round, so that a build reading version
//! 2 only refuses it rather than take such a value for an empty chunk.
//!
//! # Durability
//!
//! [`Store::write`] commits with redb's immediate durability.
//! [`Store::write_logged`] describes the transaction's changes in a record of
//! the write-ahead log (`tether.wal` beside the store, see [`crate::wal`]),
//! appends it, and commits to redb without durability: the caller makes it
//! durable by syncing the log. Any durable commit ([`Store::persist`] when
//! nothing else is due) makes every earlier one durable too, after which
//! no record is needed for a replay. The `meta` table's `wal_applied` is
//! the number of the last record the state includes, written by each
//! logged transaction itself (and, going round, with `wal_resume` and
//! `wal_tail`, by each durable commit); opening the store applies the
//! records above it.
//!
//! # Failures
//!
//! After a failed commit redb refuses further work on the same handle (it
//! cannot know what reached the disk), so [`Store::recover`] reopens the file,
//! letting redb's own recovery bring it back to its last durable commit,
//! and applies the log's records again on top.

use std::collections::HashMap;
use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use bytes::Bytes;
use redb::{
    Database, Durability, Key, ReadTransaction, ReadableDatabase, ReadableTable, Table,
    TableDefinition, Value, WriteTransaction,
};
use serde::{Deserialize, Serialize};
use tether_protocol::{ConsumerInfo, Frame, FrameKind, StreamInfo};

use crate::store_io::{Headroom, Opener, OsOpener, RedbFile};
use crate::syncer::Durable;
use crate::wal::{self, CopyPace, LogReader, Op, RawBytes, RecordBuf, Wal};
use crate::{Error, Result};

/// The layout version this build writes into a new store. A file with a
/// version outside [`OLDEST_SCHEMA_VERSION`]`..=`this is refused rather
/// than misread.
pub const SCHEMA_VERSION: u64 = 3;

/// The oldest layout version this build reads: 2, frames in chunks.
const OLDEST_SCHEMA_VERSION: u64 = 2;

/// The first layout version whose chunk values may name bytes kept in the
/// log (an [`InLog`]), which a build that reads version 2 only would take
/// for an empty chunk. A version-2 store is marked so before its log first
/// goes round; one whose log does not go round stays readable by such a
/// build.
const LOG_KEEPS_CHUNKS_VERSION: u64 = 3;

/// redb's page cache. Bounded so that the daemon's memory does not grow with
/// the store. Small, because every frame passes through it only once on
/// its way to the file: redb keeps up to half of it as a write buffer of
/// pages that non-durable commits left unwritten, and a persist (when the
/// log is full) writes and syncs all of that while the writer waits. On
/// W1, going from 8 to 2 MiB shortened those stalls (the slowest frames
/// around each persist: 6-7 ms against 4-5 ms), cut the daemon's CPU per
/// frame and its peak RSS (28 to 20 MiB), with W0, W2 and replay speed
/// unchanged. A group commit bigger than the buffer (up to 4 MiB) has
/// redb write its pages to the file early, which its commit protocol
/// allows. Readers lose little: the frames they read are in the
/// kernel's page cache anyway. At 64 MiB the daemon had peaked at 168 MiB
/// resident (the cache is many small page buffers).
const CACHE_BYTES: usize = 2 * 1024 * 1024;

const STREAMS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("streams");
const CHUNKS: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("chunks");
const PRODUCERS: TableDefinition<'_, (u64, &str), (u64, u64)> = TableDefinition::new("producers");
const CONSUMERS: TableDefinition<'_, (u64, &str), u64> = TableDefinition::new("consumers");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
const EXECUTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("executions");
const CHECKPOINTS: TableDefinition<'_, (&str, u64), &[u8]> = TableDefinition::new("checkpoints");
const STEPS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("steps");

const META_SCHEMA_VERSION: &str = "schema_version";
const META_NEXT_STREAM_ID: &str = "next_stream_id";
/// The number of the last write-ahead log record this state includes (see
/// [`crate::wal`]); missing means none.
const META_WAL_APPLIED: &str = "wal_applied";
/// Going round (see [`crate::wal`]): where the record after `wal_applied`
/// goes in the log, as of the last durable commit; missing when the log
/// does not go round.
const META_WAL_RESUME: &str = "wal_resume";
/// Going round: the oldest position in the log of a chunk it keeps for
/// the store, as of the last durable commit.
const META_WAL_TAIL: &str = "wal_tail";
/// Going round: the log's capacity, which its positions are counted in
/// (kept while the log goes round, whatever the setting says).
const META_WAL_CAPACITY: &str = "wal_capacity";

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
        Self {
            id,
            first_seq: 1,
            last_seq: 0,
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

/// Everything the writer caches, as committed.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The id the next new stream gets.
    pub next_stream_id: u64,
    pub streams: Vec<(String, StreamMeta)>,
    /// (stream id, producer, state).
    pub producers: Vec<(u64, String, ProducerState)>,
    /// (stream id, consumer, acked_through).
    pub consumers: Vec<(u64, String, u64)>,
}

/// Frames read from one stream in one read transaction, with the stream's
/// retained range as that same transaction saw it.
#[derive(Debug)]
pub struct ReadChunk<S = Vec<(u64, Frame)>> {
    pub first_seq: u64,
    pub last_seq: u64,
    /// Contiguous, ascending, starting at the requested seq; nothing when
    /// the requested seq is below `first_seq` or beyond what may be read.
    pub frames: S,
}

/// What a store read hands the frames it finds to, a chunk's worth at a
/// time. Taking them as ranges of the stored chunk lets a reader that only
/// passes them on (replay encoding them for the socket) copy each payload
/// once, straight from the store's page.
pub trait FrameSink {
    /// Takes `frames`, the wanted frames of `chunk` in seq order (never
    /// empty, and contiguous with those taken before).
    fn take(&mut self, chunk: &[u8], frames: &[StoredFrame]) -> Result<()>;
}

/// One frame found in a stored chunk; its payload is a range of the chunk
/// (checked to lie within it).
#[derive(Debug)]
pub struct StoredFrame {
    pub seq: u64,
    pub ts_micros: u64,
    pub kind: FrameKind,
    pub payload: std::ops::Range<usize>,
}

/// Frames as values: the payloads of one chunk share one copy of the part
/// of the chunk they span.
impl FrameSink for Vec<(u64, Frame)> {
    fn take(&mut self, chunk: &[u8], frames: &[StoredFrame]) -> Result<()> {
        let (Some(lo), Some(hi)) = (frames.first(), frames.last()) else {
            return Ok(());
        };
        let base = lo.payload.start;
        let span = chunk.get(base..hi.payload.end).ok_or_else(|| {
            Error::Storage(format!(
                "frames {}..={} lie outside their chunk",
                lo.seq, hi.seq
            ))
        })?;
        let shared = Bytes::copy_from_slice(span);
        self.extend(frames.iter().map(|f| {
            let payload = shared.slice(f.payload.start - base..f.payload.end - base);
            (
                f.seq,
                Frame {
                    ts_micros: f.ts_micros,
                    kind: f.kind,
                    payload,
                },
            )
        }));
        Ok(())
    }
}

/// Bounds on one [`Store::read_frames`] call. At least one frame is returned
/// when any is available, whatever its size.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    pub max_frames: usize,
    pub max_bytes: usize,
    /// Read nothing beyond this seq.
    pub through_seq: u64,
}

/// What [`WriteTxn::delete_prefix`] shows its caller about each frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    pub seq: u64,
    pub ts_micros: u64,
    pub payload_len: u64,
}

/// The result of [`WriteTxn::delete_prefix`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    pub frames: u64,
    pub bytes: u64,
    /// The first frame that was looked at and kept, if any.
    pub first_kept: Option<FrameInfo>,
}

/// The redb database file.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// `None` once closed, or when reopening after a failure did not work.
    db: RwLock<Option<Database>>,
    closed: AtomicBool,
    /// Set by a failed write: the handle must be reopened before the next one.
    needs_reopen: AtomicBool,
    /// The write-ahead log. Locked after `db` whenever both are.
    wal: Mutex<Wal>,
    /// Reads chunks the log keeps for the store, without its lock.
    log: LogReader,
    /// Opens the store's file and the log's (see [`crate::store_io`]).
    opener: Arc<dyn Opener>,
    /// What is reserved beyond the store file's end, across reopenings.
    headroom: Arc<Headroom>,
}

impl Store {
    /// Opens the store at `path`, creating it when missing. A file that
    /// exists but cannot be opened as a tether store is
    /// [`Error::CorruptStore`]; the daemon must then refuse to start.
    ///
    /// The write-ahead log beside it (`path` with the extension `wal`) is
    /// replayed before anything else happens: what it holds beyond the
    /// store is applied (see the module docs, "Durability").
    pub fn open(path: &Path) -> Result<Store> {
        Self::open_with_log(path, wal::DEFAULT_CAPACITY)
    }

    /// [`Store::open`] with a log of `log_capacity` bytes, unless the log
    /// already goes round: its positions are counted in the capacity it
    /// had when it began to, which it keeps.
    pub fn open_with_log(path: &Path, log_capacity: u64) -> Result<Store> {
        Self::open_with(path, log_capacity, Arc::new(OsOpener))
    }

    /// [`Store::open_with_log`] with both files opened through `opener`
    /// (tests inject failures there).
    pub fn open_with(path: &Path, log_capacity: u64, opener: Arc<dyn Opener>) -> Result<Store> {
        let existed = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
        let headroom = Arc::new(Headroom::default());
        let db = open_database(path, opener.as_ref(), &headroom)?;
        let round = if existed {
            going_round_with(&db, path)?
        } else {
            None
        };
        let capacity = match round {
            Some(kept) if kept != log_capacity => {
                tracing::warn!(
                    "the log goes round {kept} bytes; the setting of {log_capacity} applies \
                     to a new store"
                );
                kept
            }
            _ => log_capacity,
        };
        let mut log = Wal::open(&path.with_extension("wal"), capacity, opener.as_ref())?;
        if !existed {
            // A new store: a log left beside a store file that was removed
            // belongs to that store, not to this one.
            log.discard()?;
        }
        let store = Store {
            path: path.to_path_buf(),
            db: RwLock::new(Some(db)),
            closed: AtomicBool::new(false),
            needs_reopen: AtomicBool::new(false),
            log: log.reader(),
            wal: Mutex::new(log),
            opener,
            headroom,
        };
        let version = store.init_schema()?;
        if existed {
            let guard = store.handle()?;
            replay(guard_db(&guard)?, &mut store.wal())?;
        }
        if let Err(e) = store.wal().prepare() {
            // Only a head start: zeros are written ahead of the records.
            tracing::warn!("{e}");
        }
        store.settle_log(round.is_some(), version)?;
        Ok(store)
    }

    /// Makes the store's durable marks say whether the log goes round, as
    /// [`Wal::prepare`] decided (`marked`: they said it did when the store
    /// was opened): a replay then reads the log the way it was written.
    /// A log going round marks a store of an older `version` with
    /// [`LOG_KEEPS_CHUNKS_VERSION`] first. Only a store that changes over
    /// commits anything.
    fn settle_log(&self, marked: bool, version: u64) -> Result<()> {
        let ring = {
            let mut log = self.wal();
            if log.is_ring() && !marked {
                log.start_round_here();
            }
            log.is_ring()
        };
        let mark_version = ring && version < LOG_KEEPS_CHUNKS_VERSION;
        if ring != marked || mark_version {
            self.write(|txn| {
                if mark_version {
                    txn.meta
                        .get()?
                        .insert(META_SCHEMA_VERSION, LOG_KEEPS_CHUNKS_VERSION)
                        .map_err(storage)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Copies chunks the log keeps for the store into it, when the log's
    /// records are getting near them (see [`crate::wal`], "Going round"):
    /// one step at `pace`, committed without durability. Returns whether
    /// the store should now be persisted, so that the records can go over
    /// them.
    pub fn copy_from_log(&self, pace: CopyPace) -> Result<bool> {
        let guard = self.handle()?;
        let db = guard_db(&guard)?;
        let mut log = self.wal();
        let budget = log.copy_budget(pace);
        if budget > 0 {
            let copied = db.begin_write().map_err(storage).and_then(|mut txn| {
                let mut tables = tables(&txn, &self.log, None);
                match copy_kept_chunks(&mut tables, &log, budget) {
                    Ok(to) => {
                        drop(tables);
                        txn.set_durability(Durability::None).map_err(storage)?;
                        commit(txn).map(|()| to)
                    }
                    Err(e) => {
                        drop(tables);
                        abort(txn);
                        Err(e)
                    }
                }
            });
            match copied {
                Ok(to) => log.copied_to(to),
                Err(e) => {
                    self.needs_reopen.store(true, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok(log.wants_persist())
    }

    /// Going round: whether the log has chunks to copy into the store in
    /// idle time (see [`Store::copy_from_log`]).
    pub fn wants_copying(&self) -> bool {
        self.wal().copy_budget(CopyPace::Idle) > 0
    }

    /// The write-ahead log, for the syncer (see [`Wal::sync_handle`]).
    pub fn wal_sync_handle(&self) -> wal::SyncHandle {
        let store = self.opener.open_read(&self.path).ok();
        self.wal().sync_handle(store)
    }

    /// What is reserved beyond the store file's end for redb to grow into,
    /// so that a write can be refused before redb meets a full disk (see
    /// [`Headroom`]).
    pub fn headroom(&self) -> Arc<Headroom> {
        self.headroom.clone()
    }

    /// The ticket of the last record appended to the write-ahead log.
    pub fn wal_written(&self) -> u64 {
        self.wal().written()
    }

    /// Since when the write-ahead log has held commits the store may not
    /// hold durably; `None` when the store holds every commit itself.
    pub fn unpersisted_since(&self) -> Option<std::time::Instant> {
        self.wal().holding_since()
    }

    fn wal(&self) -> std::sync::MutexGuard<'_, Wal> {
        self.wal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the store file on disk, 0 when it cannot be read.
    pub fn file_size(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }

    /// Creates the tables and checks the schema version; returns it.
    /// Nothing is committed when the version is wrong.
    fn init_schema(&self) -> Result<u64> {
        let guard = self.handle()?;
        let db = guard_db(&guard)?;
        let txn = db.begin_write().map_err(storage)?;
        let version = {
            txn.open_table(STREAMS).map_err(storage)?;
            txn.open_table(CHUNKS).map_err(storage)?;
            txn.open_table(PRODUCERS).map_err(storage)?;
            txn.open_table(CONSUMERS).map_err(storage)?;
            // Added in version 1 without a version bump: such a file
            // simply got the empty table, and older builds ignored it.
            txn.open_table(EXECUTIONS).map_err(storage)?;
            txn.open_table(CHECKPOINTS).map_err(storage)?;
            txn.open_table(STEPS).map_err(storage)?;
            let mut meta = txn.open_table(META).map_err(storage)?;
            let version = meta
                .get(META_SCHEMA_VERSION)
                .map_err(storage)?
                .map(|v| v.value());
            match version {
                Some(known) if (OLDEST_SCHEMA_VERSION..=SCHEMA_VERSION).contains(&known) => {}
                Some(other) => {
                    return Err(Error::CorruptStore {
                        path: self.path.clone(),
                        detail: format!(
                            "schema version {other}; this build reads versions \
                             {OLDEST_SCHEMA_VERSION} to {SCHEMA_VERSION} (version 2 stores frames \
                             in chunks, and older files are not converted; a newer version needs \
                             a newer build)"
                        ),
                    })
                }
                None => {
                    meta.insert(META_SCHEMA_VERSION, SCHEMA_VERSION)
                        .map_err(storage)?;
                    meta.insert(META_NEXT_STREAM_ID, 1).map_err(storage)?;
                }
            }
            version.unwrap_or(SCHEMA_VERSION)
        };
        commit(txn).map(|()| version)
    }

    /// The database handle for one operation. Holding the read guard keeps
    /// [`Store::recover`] and [`Store::close`] from swapping the handle
    /// underneath the operation.
    fn handle(&self) -> Result<RwLockReadGuard<'_, Option<Database>>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        Ok(self.db.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Runs `f` in one write transaction and commits it with
    /// [`Durability::Immediate`]: when this returns `Ok`, everything `f` wrote
    /// is on disk. When `f` or the commit fails nothing of it is stored, and
    /// the handle is marked for [`Store::recover`].
    pub fn write<T>(&self, f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>) -> Result<T> {
        self.write_as(None::<fn(u64)>, f).map(|(value, _)| value)
    }

    /// Runs `f` in one write transaction and commits it through the
    /// write-ahead log when the log can describe everything `f` did (see
    /// [`crate::wal`]): the commit is then durable once the log is synced
    /// through the returned ticket, and this process sees it at once.
    /// Otherwise (a change the log does not describe, or a full log) the
    /// commit is durable when this returns, like [`Store::write`].
    ///
    /// `appended` is told the ticket as soon as the record is in the log,
    /// before redb commits: the log's sync can then run while redb works.
    pub fn write_logged<T>(
        &self,
        f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>,
        appended: impl FnOnce(u64),
    ) -> Result<(T, Durable)> {
        self.write_as(Some(appended), f)
    }

    /// Makes every commit so far durable in the store itself, so that no
    /// record of the log is needed for a replay (it starts again from its
    /// beginning, or, going round, goes on over the chunks copied).
    pub fn persist(&self) -> Result<()> {
        self.write(|_| Ok(()))
    }

    /// Logs the commit when `appended` is given (see [`Store::write_logged`]).
    fn write_as<T>(
        &self,
        appended: Option<impl FnOnce(u64)>,
        f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>,
    ) -> Result<(T, Durable)> {
        let guard = self.handle()?;
        let db = guard_db(&guard)?;
        let result = write_in(db, &mut self.wal(), &self.log, appended, f);
        if result.is_err() {
            self.needs_reopen.store(true, Ordering::Release);
        }
        result
    }

    /// Reopens the database after a failed write, so that the next write
    /// starts from the last commit. A no-op when nothing failed.
    pub fn recover(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() && !self.needs_reopen.load(Ordering::Acquire) {
            return Ok(());
        }
        // redb holds an exclusive lock on the file: the old handle must be
        // gone before the file can be opened again.
        drop(slot.take());
        let db = open_database(&self.path, self.opener.as_ref(), &self.headroom)?;
        // Commits that reached the log but not the store (the one that
        // failed, if its record was written) are applied again.
        replay(&db, &mut self.wal())?;
        *slot = Some(db);
        self.needs_reopen.store(false, Ordering::Release);
        tracing::info!(path = %self.path.display(), "store reopened after a failed write");
        Ok(())
    }

    /// Closes the database. Later operations fail with
    /// [`Error::ShuttingDown`].
    pub fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        match slot.take() {
            Some(db) => db.close().map_err(storage),
            None => Ok(()),
        }
    }

    /// Runs a read. A read that failed because the handle failed (an I/O
    /// error here or in a concurrent commit) is retried once on a reopened
    /// handle, so that reads go on after a failed commit (a full disk).
    fn reading<T>(&self, read: impl Fn() -> Result<T>) -> Result<T> {
        match read() {
            Err(e) if self.needs_reopen.load(Ordering::Acquire) => {
                tracing::debug!("read failed on a failed store handle ({e}); reopening");
                self.recover()?;
                read()
            }
            result => result,
        }
    }

    /// Maps a redb failure met while reading, and marks the handle for
    /// reopening when redb will refuse further work on it.
    fn fail(&self, e: impl Into<redb::Error>) -> Error {
        let e: redb::Error = e.into();
        if matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo) {
            self.needs_reopen.store(true, Ordering::Release);
        }
        storage(e)
    }

    /// Runs `read` in a read transaction of its own (see [`Store::reading`]
    /// for the retry after a failed handle).
    fn read_in<T>(&self, read: impl Fn(&ReadTransaction) -> Result<T>) -> Result<T> {
        self.reading(|| {
            let guard = self.handle()?;
            let txn = guard_db(&guard)?.begin_read().map_err(|e| self.fail(e))?;
            read(&txn)
        })
    }

    /// Shows `each` every row of `table`, in key order, until it fails.
    fn each_row<K: Key + 'static, V: Value + 'static>(
        &self,
        txn: &ReadTransaction,
        table: TableDefinition<'_, K, V>,
        mut each: impl for<'a> FnMut(K::SelfType<'a>, V::SelfType<'a>) -> Result<()>,
    ) -> Result<()> {
        let table = txn.open_table(table).map_err(|e| self.fail(e))?;
        for item in table.iter().map_err(|e| self.fail(e))? {
            let (key, value) = item.map_err(|e| self.fail(e))?;
            each(key.value(), value.value())?;
        }
        Ok(())
    }

    /// [`Error::ExecutionNotFound`] unless `execution` is recorded.
    fn require_execution(&self, txn: &ReadTransaction, execution: &str) -> Result<()> {
        let known = txn
            .open_table(EXECUTIONS)
            .map_err(|e| self.fail(e))?
            .get(execution)
            .map_err(|e| self.fail(e))?
            .is_some();
        if known {
            Ok(())
        } else {
            Err(Error::ExecutionNotFound(execution.to_owned()))
        }
    }

    /// Everything the writer caches, read in one transaction.
    pub fn load(&self) -> Result<Snapshot> {
        self.read_in(|txn| self.load_in(txn))
    }

    fn load_in(&self, txn: &ReadTransaction) -> Result<Snapshot> {
        let mut snapshot = Snapshot {
            next_stream_id: txn
                .open_table(META)
                .map_err(|e| self.fail(e))?
                .get(META_NEXT_STREAM_ID)
                .map_err(|e| self.fail(e))?
                .map_or(1, |v| v.value()),
            ..Snapshot::default()
        };
        self.each_row(txn, STREAMS, |name, value| {
            snapshot
                .streams
                .push((name.to_owned(), decode_meta(name, value)?));
            Ok(())
        })?;
        self.each_row(
            txn,
            PRODUCERS,
            |(stream_id, producer), (producer_seq, seq)| {
                let state = ProducerState { producer_seq, seq };
                snapshot
                    .producers
                    .push((stream_id, producer.to_owned(), state));
                Ok(())
            },
        )?;
        self.each_row(txn, CONSUMERS, |(stream_id, consumer), acked| {
            snapshot
                .consumers
                .push((stream_id, consumer.to_owned(), acked));
            Ok(())
        })?;
        Ok(snapshot)
    }

    /// Reads frames of `stream` from `from_seq` on, within `limits`, together
    /// with the stream's retained range, all from one read transaction.
    pub fn read_frames(
        &self,
        stream: &str,
        from_seq: u64,
        limits: ReadLimits,
    ) -> Result<ReadChunk> {
        self.read_frames_into(stream, from_seq, limits, Vec::new)
    }

    /// [`Store::read_frames`], handing the frames to a sink from `new_sink`
    /// (called again if the read is retried on a reopened store).
    pub fn read_frames_into<S: FrameSink>(
        &self,
        stream: &str,
        from_seq: u64,
        limits: ReadLimits,
        new_sink: impl Fn() -> S,
    ) -> Result<ReadChunk<S>> {
        self.read_unmoved(stream, |txn| {
            self.read_frames_in(txn, stream, from_seq, limits, new_sink())
        })
    }

    /// Runs `read` (of `stream`) in a read transaction of its own, again
    /// on a newer snapshot while it says (`None`) that the log's records
    /// went over a chunk it was reading.
    fn read_unmoved<T>(
        &self,
        stream: &str,
        read: impl Fn(&ReadTransaction) -> Result<Option<T>>,
    ) -> Result<T> {
        for _ in 0..MOVED_RETRIES {
            if let Some(done) = self.read_in(&read)? {
                return Ok(done);
            }
        }
        Err(Error::Storage(format!(
            "reading stream {stream:?}: the chunks kept in the log {} were written over \
             {MOVED_RETRIES} times while being read",
            self.log.path().display()
        )))
    }

    fn read_frames_in<S: FrameSink>(
        &self,
        txn: &ReadTransaction,
        stream: &str,
        from_seq: u64,
        limits: ReadLimits,
        sink: S,
    ) -> Result<Option<ReadChunk<S>>> {
        let meta = txn
            .open_table(STREAMS)
            .map_err(|e| self.fail(e))?
            .get(stream)
            .map_err(|e| self.fail(e))?
            .map(|v| decode_meta(stream, v.value()))
            .transpose()?
            .ok_or_else(|| Error::StreamNotFound(stream.to_owned()))?;
        let mut chunk = ReadChunk {
            first_seq: meta.first_seq,
            last_seq: meta.last_seq,
            frames: sink,
        };
        let through = limits.through_seq.min(meta.last_seq);
        if from_seq < meta.first_seq || from_seq > through {
            return Ok(Some(chunk));
        }
        let table = txn.open_table(CHUNKS).map_err(|e| self.fail(e))?;
        let start = chunk_holding(&table, meta.id, from_seq).map_err(|e| self.fail(e))?;
        let range = table
            .range((meta.id, start.unwrap_or(from_seq))..=(meta.id, through))
            .map_err(|e| self.fail(e))?;
        let mut reader = ChunkReader {
            stream,
            next_seq: from_seq,
            through,
            limits,
            frames: 0,
            bytes: 0,
            wanted: Vec::new(),
        };
        let mut kept = Vec::new();
        for item in range {
            let (key, value) = item.map_err(|e| self.fail(e))?;
            let (_, first) = key.value();
            if first > reader.next_seq {
                return Err(Error::Storage(format!(
                    "stream {stream:?} is missing frame {} (the next stored chunk starts at {first})",
                    reader.next_seq
                )));
            }
            let Some(bytes) = chunk_bytes(value.value(), &self.log, &mut kept, &stream, first)?
            else {
                return Ok(None);
            };
            if reader.take(first, bytes, &mut chunk.frames)? {
                break;
            }
        }
        if reader.frames == 0 {
            return Err(Error::Storage(format!(
                "stream {stream:?} is missing frame {from_seq} (retained {}..={})",
                meta.first_seq, meta.last_seq
            )));
        }
        Ok(Some(chunk))
    }

    /// The timestamp of one frame, `None` when it is not stored.
    pub fn frame_ts(&self, stream_id: u64, seq: u64) -> Result<Option<u64>> {
        self.read_unmoved(&format!("#{stream_id}"), |txn| {
            self.frame_ts_in(txn, stream_id, seq)
        })
    }

    /// `None` when the log went over the chunk while it was read.
    fn frame_ts_in(
        &self,
        txn: &ReadTransaction,
        stream_id: u64,
        seq: u64,
    ) -> Result<Option<Option<u64>>> {
        let table = txn.open_table(CHUNKS).map_err(|e| self.fail(e))?;
        let Some(first) = chunk_holding(&table, stream_id, seq).map_err(|e| self.fail(e))? else {
            return Ok(Some(None));
        };
        let value = table
            .get((stream_id, first))
            .map_err(|e| self.fail(e))?
            .ok_or_else(|| {
                Error::Storage(format!("chunk {first} of stream #{stream_id} vanished"))
            })?;
        let mut kept = Vec::new();
        let stream = format_args!("#{stream_id}");
        let Some(bytes) = chunk_bytes(value.value(), &self.log, &mut kept, &stream, first)? else {
            return Ok(None);
        };
        for f in ChunkIter::new(first, bytes).map_err(|e| corrupt_chunk(stream_id, first, &e))? {
            let f = f.map_err(|e| corrupt_chunk(stream_id, first, &e))?;
            if f.seq == seq {
                return Ok(Some(Some(f.ts_micros)));
            }
        }
        Ok(Some(None))
    }

    /// Every execution manifest, as (execution id, encoded manifest), in id
    /// order.
    pub fn load_executions(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.read_in(|txn| self.load_executions_in(txn))
    }

    fn load_executions_in(&self, txn: &ReadTransaction) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        self.each_row(txn, EXECUTIONS, |id, manifest| {
            out.push((id.to_owned(), manifest.to_vec()));
            Ok(())
        })?;
        Ok(out)
    }

    /// Every stored checkpoint of an execution as `map` makes it from
    /// (id, record), newest first. An unknown execution is
    /// [`Error::ExecutionNotFound`].
    pub fn map_checkpoints<T>(
        &self,
        execution: &str,
        map: impl Fn(u64, &[u8]) -> T,
    ) -> Result<Vec<T>> {
        self.read_in(|txn| {
            let mut out = Vec::new();
            self.scan_checkpoints(txn, execution, |id, record| {
                out.push(map(id, record));
                true
            })?;
            Ok(out)
        })
    }

    /// The first of an execution's checkpoints, newest first, that `pick`
    /// turns into a value. An unknown execution is
    /// [`Error::ExecutionNotFound`].
    pub fn find_checkpoint<T>(
        &self,
        execution: &str,
        pick: impl Fn(u64, &[u8]) -> Option<T>,
    ) -> Result<Option<T>> {
        self.read_in(|txn| {
            let mut found = None;
            self.scan_checkpoints(txn, execution, |id, record| {
                found = pick(id, record);
                found.is_none()
            })?;
            Ok(found)
        })
    }

    fn scan_checkpoints(
        &self,
        txn: &ReadTransaction,
        execution: &str,
        visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<()> {
        self.require_execution(txn, execution)?;
        let table = txn.open_table(CHECKPOINTS).map_err(|e| self.fail(e))?;
        scan_newest_first(&table, execution, visit).map_err(|e| self.fail(e))
    }

    /// For every execution with checkpoints, the first of them, newest
    /// first, that `pick` turns into a value; in execution id order.
    pub fn find_checkpoints_of_all<T>(
        &self,
        pick: impl Fn(&str, u64, &[u8]) -> Option<T>,
    ) -> Result<Vec<(String, T)>> {
        self.read_in(|txn| {
            let checkpoints = txn.open_table(CHECKPOINTS).map_err(|e| self.fail(e))?;
            let mut out = Vec::new();
            self.each_row(txn, EXECUTIONS, |execution, _| {
                let mut found = None;
                scan_newest_first(&checkpoints, execution, |cid, record| {
                    found = pick(execution, cid, record);
                    found.is_none()
                })
                .map_err(|e| self.fail(e))?;
                if let Some(value) = found {
                    out.push((execution.to_owned(), value));
                }
                Ok(())
            })?;
            Ok(out)
        })
    }

    /// The recorded result of a durable step. An unknown execution is
    /// [`Error::ExecutionNotFound`].
    pub fn step(&self, execution: &str, step: &str) -> Result<Option<Vec<u8>>> {
        self.read_in(|txn| {
            self.require_execution(txn, execution)?;
            let value = txn
                .open_table(STEPS)
                .map_err(|e| self.fail(e))?
                .get((execution, step))
                .map_err(|e| self.fail(e))?;
            Ok(value.map(|v| v.value().to_vec()))
        })
    }

    /// One row per stream, with its consumers, in name order.
    pub fn list_streams(&self) -> Result<Vec<StreamInfo>> {
        self.read_in(|txn| self.list_streams_in(txn))
    }

    fn list_streams_in(&self, txn: &ReadTransaction) -> Result<Vec<StreamInfo>> {
        let consumers = txn.open_table(CONSUMERS).map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
        self.each_row(txn, STREAMS, |name, value| {
            let meta = decode_meta(name, value)?;
            let mut info = StreamInfo {
                name: name.to_owned(),
                first_seq: meta.first_seq,
                last_seq: meta.last_seq,
                frames: meta.frames,
                bytes: meta.bytes,
                consumers: Vec::new(),
            };
            for item in consumers
                .range((meta.id, "")..(meta.id + 1, ""))
                .map_err(|e| self.fail(e))?
            {
                let (key, acked) = item.map_err(|e| self.fail(e))?;
                info.consumers.push(ConsumerInfo {
                    name: key.value().1.to_owned(),
                    acked_through: acked.value(),
                });
            }
            out.push(info);
            Ok(())
        })?;
        Ok(out)
    }
}

/// The tables of one write transaction, open for writing.
pub struct WriteTxn<'t> {
    streams: LazyTable<'t, &'static str, &'static [u8]>,
    chunks: LazyTable<'t, (u64, u64), &'static [u8]>,
    /// Frames appended in this transaction, one chunk per stream id,
    /// closed (and logged) when full or before the record is appended;
    /// all but `current`'s.
    pending: HashMap<u64, PendingChunk>,
    /// The stream appended to last and its open chunk, kept out of
    /// `pending`: a batch is mostly runs of one stream, and hashing the id
    /// for every frame was most of a percent of the daemon's time.
    current: Option<(u64, PendingChunk)>,
    /// Chunks closed and logged but not yet in `chunks`, with where their
    /// bytes start in the record: a logged transaction inserts them only
    /// after its record is appended, so that the log's sync runs while
    /// redb stores them (and, when the log goes round, so that their
    /// place in the log is known).
    unstored: Vec<((u64, u64), Vec<u8>, usize)>,
    /// Reads chunks the log keeps for the store.
    log: &'t LogReader,
    producers: LazyTable<'t, (u64, &'static str), (u64, u64)>,
    consumers: LazyTable<'t, (u64, &'static str), u64>,
    meta: LazyTable<'t, &'static str, u64>,
    executions: LazyTable<'t, &'static str, &'static [u8]>,
    checkpoints: LazyTable<'t, (&'static str, u64), &'static [u8]>,
    steps: LazyTable<'t, (&'static str, &'static str), &'static [u8]>,
    /// Reused encoding buffer, so that appending a frame does not allocate.
    scratch: Vec<u8>,
    /// The log record describing this transaction, when it is to be
    /// logged; `None` also while a replay applies one.
    record: Option<RecordBuf>,
    /// A change the log cannot describe was made: the commit must be
    /// durable in the store itself.
    unlogged: bool,
}

impl std::fmt::Debug for WriteTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTxn").finish_non_exhaustive()
    }
}

impl WriteTxn<'_> {
    /// Stores a stream's metadata.
    pub fn put_stream(&mut self, name: &str, meta: &StreamMeta) -> Result<()> {
        self.scratch.clear();
        let bytes = postcard::to_extend(meta, std::mem::take(&mut self.scratch))
            .map_err(|e| Error::Storage(format!("cannot encode stream {name:?}: {e}")))?;
        let result = self.streams.get()?.insert(name, bytes.as_slice()).map(drop);
        let logged = self.log(&Op::Stream {
            name,
            meta: RawBytes(&bytes),
        });
        self.scratch = bytes;
        result.map_err(storage).and(logged)
    }

    /// Stores one frame. Frames of one stream appended in one transaction
    /// with consecutive seqs are stored together as one chunk when the
    /// transaction commits.
    pub fn put_frame(&mut self, stream_id: u64, seq: u64, frame: &Frame) -> Result<()> {
        if !matches!(&self.current, Some((id, _)) if *id == stream_id) {
            let chunk = self
                .pending
                .remove(&stream_id)
                .unwrap_or_else(|| PendingChunk::new(seq));
            if let Some((id, before)) = self.current.replace((stream_id, chunk)) {
                self.pending.insert(id, before);
            }
        }
        let Some((_, pending)) = &mut self.current else {
            unreachable!("the stream's chunk was just made current")
        };
        // A chunk is closed before it would outgrow one redb page: the
        // continuation check is for callers that skip seqs (none do today).
        if pending.next_seq() != seq || !pending.has_room_for(frame) {
            let done = std::mem::replace(pending, PendingChunk::new(seq));
            pending.push(frame)?;
            return self.close_chunk(stream_id, done);
        }
        pending.push(frame)
    }

    /// Logs a finished chunk and stores it, or keeps it for
    /// [`WriteTxn::store_chunks`] when the transaction is logged.
    fn close_chunk(&mut self, stream_id: u64, chunk: PendingChunk) -> Result<()> {
        if chunk.count == 0 {
            return Ok(());
        }
        let key = (stream_id, chunk.first_seq);
        let bytes = chunk.finish();
        log_to(
            &mut self.record,
            &Op::Chunk {
                stream_id,
                first_seq: key.1,
                chunk: RawBytes(&bytes),
            },
        )?;
        if let Some(record) = &self.record {
            // The op ends with the chunk's bytes.
            let offset = record.len() - bytes.len();
            self.unstored.push((key, bytes, offset));
            Ok(())
        } else {
            self.chunks
                .get()?
                .insert(key, bytes.as_slice())
                .map(drop)
                .map_err(storage)
        }
    }

    /// Closes the chunks gathered so far (logging them).
    fn flush_chunks(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        for (stream_id, chunk) in self.current.take().into_iter().chain(pending) {
            self.close_chunk(stream_id, chunk)?;
        }
        Ok(())
    }

    /// Closes the chunks gathered so far and writes every logged one to
    /// `chunks`, so that the rest of the transaction (and the commit)
    /// sees them. `kept_at`: where the transaction's record was appended
    /// to a log that goes round, which then keeps the chunks' bytes for
    /// the store (`chunks` gets where they are, see [`InLog`]).
    fn store_chunks(&mut self, kept_at: Option<u64>) -> Result<()> {
        self.flush_chunks()?;
        if self.unstored.is_empty() {
            return Ok(());
        }
        let table = self.chunks.get()?;
        for (key, bytes, offset) in self.unstored.drain(..) {
            let at = kept_at.map(|record_at| record_at + offset as u64);
            put_chunk(table, key, &bytes, at)?;
        }
        Ok(())
    }

    /// Stores a producer's dedupe state.
    pub fn put_producer(
        &mut self,
        stream_id: u64,
        producer: &str,
        state: ProducerState,
    ) -> Result<()> {
        self.producers
            .get()?
            .insert((stream_id, producer), (state.producer_seq, state.seq))
            .map_err(storage)?;
        self.log(&Op::Producer {
            stream_id,
            producer,
            producer_seq: state.producer_seq,
            seq: state.seq,
        })
    }

    /// Adds `op` to the transaction's log record, if it has one.
    fn log(&mut self, op: &Op<'_>) -> Result<()> {
        log_to(&mut self.record, op)
    }

    /// Applies one change of a replayed log record. `kept`: the record's
    /// position and body when the log keeps its chunks for the store
    /// (going round), which then gets where they are, as from
    /// [`WriteTxn::store_chunks`].
    fn apply(&mut self, op: Op<'_>, kept: Option<(u64, &[u8])>) -> Result<()> {
        match op {
            Op::Stream { name, meta } => self.streams.get()?.insert(name, meta.0).map(drop),
            Op::Chunk {
                stream_id,
                first_seq,
                chunk,
            } => {
                let at = kept.map(|(record_at, body)| chunk_position(record_at, body, chunk.0));
                return put_chunk(self.chunks.get()?, (stream_id, first_seq), chunk.0, at);
            }
            Op::RemoveChunksBelow { stream_id, below } => self
                .chunks
                .get()?
                .retain_in((stream_id, 0)..(stream_id, below), |_, _| false),
            Op::Producer {
                stream_id,
                producer,
                producer_seq,
                seq,
            } => self
                .producers
                .get()?
                .insert((stream_id, producer), (producer_seq, seq))
                .map(drop),
            Op::Consumer {
                stream_id,
                consumer,
                acked_through,
            } => self
                .consumers
                .get()?
                .insert((stream_id, consumer), acked_through)
                .map(drop),
            Op::NextStreamId(id) => self.meta.get()?.insert(META_NEXT_STREAM_ID, id).map(drop),
        }
        .map_err(storage)
    }

    /// Stores a durable consumer's ack.
    pub fn put_consumer(
        &mut self,
        stream_id: u64,
        consumer: &str,
        acked_through: u64,
    ) -> Result<()> {
        self.consumers
            .get()?
            .insert((stream_id, consumer), acked_through)
            .map_err(storage)?;
        self.log(&Op::Consumer {
            stream_id,
            consumer,
            acked_through,
        })
    }

    /// Stores an execution's encoded manifest.
    pub fn put_execution(&mut self, id: &str, manifest: &[u8]) -> Result<()> {
        self.unlogged = true;
        self.executions
            .get()?
            .insert(id, manifest)
            .map(drop)
            .map_err(storage)
    }

    /// Whether an execution's manifest is stored, as this transaction sees it.
    pub fn has_execution(&mut self, id: &str) -> Result<bool> {
        Ok(self.executions.get()?.get(id).map_err(storage)?.is_some())
    }

    /// The id of an execution's newest stored checkpoint.
    pub fn newest_checkpoint_id(&mut self, execution: &str) -> Result<Option<u64>> {
        let mut newest = None;
        scan_newest_first(self.checkpoints.get()?, execution, |id, _| {
            newest = Some(id);
            false
        })
        .map_err(storage)?;
        Ok(newest)
    }

    /// Stores checkpoint `id` of an execution (an encoded
    /// [`Record`](crate::checkpoint::Record)).
    pub fn put_checkpoint(&mut self, execution: &str, id: u64, record: &[u8]) -> Result<()> {
        self.unlogged = true;
        self.checkpoints
            .get()?
            .insert((execution, id), record)
            .map(drop)
            .map_err(storage)
    }

    /// Deletes an execution's checkpoints with ids below `first_kept`.
    pub fn delete_checkpoints_before(&mut self, execution: &str, first_kept: u64) -> Result<()> {
        self.unlogged = true;
        self.checkpoints
            .get()?
            .retain_in((execution, 0)..(execution, first_kept), |_, _| false)
            .map_err(storage)
    }

    /// Shows `visit` an execution's stored checkpoints as (id, record),
    /// newest first, until it returns false.
    pub fn visit_checkpoints(
        &mut self,
        execution: &str,
        visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<()> {
        scan_newest_first(self.checkpoints.get()?, execution, visit).map_err(storage)
    }

    /// The recorded result of a durable step.
    pub fn step(&mut self, execution: &str, step: &str) -> Result<Option<Vec<u8>>> {
        let value = self.steps.get()?.get((execution, step)).map_err(storage)?;
        Ok(value.map(|v| v.value().to_vec()))
    }

    /// Records the result of a durable step.
    pub fn put_step(&mut self, execution: &str, step: &str, result: &[u8]) -> Result<()> {
        self.unlogged = true;
        self.steps
            .get()?
            .insert((execution, step), result)
            .map(drop)
            .map_err(storage)
    }

    /// Records the id the next new stream gets.
    pub fn set_next_stream_id(&mut self, id: u64) -> Result<()> {
        self.meta
            .get()?
            .insert(META_NEXT_STREAM_ID, id)
            .map_err(storage)?;
        self.log(&Op::NextStreamId(id))
    }

    /// Deletes frames of a stream from `from_seq` on, in seq order, while
    /// `delete` says yes, looking at no frame beyond `through_seq`. Only a
    /// prefix is ever deleted: the first frame `delete` refuses ends the run.
    /// `from_seq` must be the stream's first retained seq.
    pub fn delete_prefix(
        &mut self,
        stream_id: u64,
        from_seq: u64,
        through_seq: u64,
        delete: impl FnMut(FrameInfo) -> bool,
    ) -> Result<Deleted> {
        self.store_chunks(None)?;
        let out = self.choose_prefix(stream_id, from_seq, through_seq, delete)?;
        if out.frames > 0 {
            self.cut_chunks(stream_id, from_seq + out.frames)?;
        }
        Ok(out)
    }

    /// Shows `delete` the frames from `from_seq` through `through_seq` until
    /// it refuses one; deletes nothing.
    fn choose_prefix(
        &mut self,
        stream_id: u64,
        from_seq: u64,
        through_seq: u64,
        mut delete: impl FnMut(FrameInfo) -> bool,
    ) -> Result<Deleted> {
        let mut out = Deleted::default();
        let Some(start) =
            chunk_holding(self.chunks.get()?, stream_id, from_seq).map_err(storage)?
        else {
            return Ok(out);
        };
        let range = self
            .chunks
            .get()?
            .range((stream_id, start)..=(stream_id, through_seq))
            .map_err(storage)?;
        let mut kept = Vec::new();
        for item in range {
            let (key, value) = item.map_err(storage)?;
            let (_, first) = key.value();
            let corrupt = |e: &postcard::Error| corrupt_chunk(stream_id, first, e);
            let bytes = own_chunk_bytes(value.value(), self.log, &mut kept, stream_id, first)?;
            for f in ChunkIter::new(first, bytes).map_err(|e| corrupt(&e))? {
                let f = f.map_err(|e| corrupt(&e))?;
                if f.seq < from_seq {
                    continue;
                }
                if f.seq > through_seq {
                    return Ok(out);
                }
                let info = FrameInfo {
                    seq: f.seq,
                    ts_micros: f.ts_micros,
                    payload_len: f.payload.len() as u64,
                };
                if !delete(info) {
                    out.first_kept = Some(info);
                    return Ok(out);
                }
                out.frames += 1;
                out.bytes += info.payload_len;
            }
        }
        Ok(out)
    }

    /// Makes `new_first` the stream's first stored seq: deletes the chunks
    /// wholly below it and rewrites the one holding it to start with it.
    fn cut_chunks(&mut self, stream_id: u64, new_first: u64) -> Result<()> {
        let mut straddling = None;
        let mut failure = None;
        self.chunks
            .get()?
            .retain_in(
                (stream_id, 0)..(stream_id, new_first),
                |(_, first), value| {
                    match stored_count(value) {
                        Ok(n) if first + u64::from(n) > new_first => {
                            straddling = Some((first, value.to_vec()));
                        }
                        Ok(_) => {}
                        Err(e) => failure = Some(corrupt_chunk(stream_id, first, &e)),
                    }
                    failure.is_some()
                },
            )
            .map_err(storage)?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.log(&Op::RemoveChunksBelow {
            stream_id,
            below: new_first,
        })?;
        if let Some((first, value)) = straddling {
            let mut kept = Vec::new();
            let bytes = own_chunk_bytes(&value, self.log, &mut kept, stream_id, first)?;
            let rest = chunk_from(first, bytes, new_first)
                .map_err(|e| corrupt_chunk(stream_id, first, &e))?;
            self.chunks
                .get()?
                .insert((stream_id, new_first), rest.as_slice())
                .map_err(storage)?;
            self.log(&Op::Chunk {
                stream_id,
                first_seq: new_first,
                chunk: RawBytes(&rest),
            })?;
        }
        Ok(())
    }
}

/// A table of a write transaction, opened on first use: most
/// transactions touch three or four of the eight, and each opening is a
/// lookup in redb's tree of tables (a tenth of a one-frame commit's work).
struct LazyTable<'t, K: Key + 'static, V: Value + 'static> {
    txn: &'t WriteTransaction,
    definition: TableDefinition<'static, K, V>,
    table: Option<Table<'t, K, V>>,
}

impl<'t, K: Key + 'static, V: Value + 'static> LazyTable<'t, K, V> {
    fn new(txn: &'t WriteTransaction, definition: TableDefinition<'static, K, V>) -> Self {
        LazyTable {
            txn,
            definition,
            table: None,
        }
    }

    fn get(&mut self) -> Result<&mut Table<'t, K, V>> {
        let table = match self.table.take() {
            Some(table) => table,
            None => self.txn.open_table(self.definition).map_err(storage)?,
        };
        Ok(self.table.insert(table))
    }
}

/// The tables of `txn`, for writing; each is opened when first used.
fn tables<'t>(
    txn: &'t WriteTransaction,
    log: &'t LogReader,
    record: Option<RecordBuf>,
) -> WriteTxn<'t> {
    WriteTxn {
        log,
        streams: LazyTable::new(txn, STREAMS),
        chunks: LazyTable::new(txn, CHUNKS),
        pending: HashMap::new(),
        current: None,
        unstored: Vec::new(),
        producers: LazyTable::new(txn, PRODUCERS),
        consumers: LazyTable::new(txn, CONSUMERS),
        meta: LazyTable::new(txn, META),
        executions: LazyTable::new(txn, EXECUTIONS),
        checkpoints: LazyTable::new(txn, CHECKPOINTS),
        steps: LazyTable::new(txn, STEPS),
        scratch: Vec::new(),
        record,
        unlogged: false,
    }
}

/// Runs `f` in one write transaction and commits it: through the log when
/// `appended` is given and the log can describe it and has room, else
/// durably (after which the log starts again, or, going round, goes on
/// past the chunks it kept that are now in the store).
fn write_in<T>(
    db: &Database,
    log: &mut Wal,
    reader: &LogReader,
    appended: Option<impl FnOnce(u64)>,
    f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>,
) -> Result<(T, Durable)> {
    let mut txn = db.begin_write().map_err(storage)?;
    let mut tables = tables(&txn, reader, appended.is_some().then(|| log.take_buf()));
    let mut full = false;
    let outcome = f(&mut tables)
        .and_then(|value| tables.flush_chunks().map(|()| value))
        .and_then(|value| {
            // The record's number goes into the state it describes, so
            // that a replay knows the store already holds it.
            let record = match tables.record.take() {
                Some(record) if !tables.unlogged => {
                    let len = record.len() as u64;
                    let at = log.place(len);
                    full = at.is_none();
                    match at {
                        Some(at) if !record.is_empty() => {
                            let meta = tables.meta.get()?;
                            meta.insert(META_WAL_APPLIED, log.next_number())
                                .map_err(storage)?;
                            // Going round, where the next record goes too:
                            // a state with this commit in it (redb may keep
                            // it) must not send a replay back to an older
                            // place.
                            if log.is_ring() {
                                meta.insert(META_WAL_RESUME, at + len).map_err(storage)?;
                            }
                        }
                        _ => {}
                    }
                    at.map(|at| (record, at))
                }
                _ => None,
            };
            Ok((value, record))
        });
    let (value, record) = match outcome {
        Ok(done) => done,
        Err(e) => {
            drop(tables);
            abort(txn);
            return Err(e);
        }
    };
    let mut durable = Durable::Committed;
    let mut kept_at = None;
    if let Some((mut record, at)) = record {
        let ticket = if record.is_empty() {
            // Nothing changed; answering still waits for what came before.
            Ok(log.written())
        } else {
            log.append(&mut record)
        };
        log.give_back(record);
        match ticket {
            Ok(ticket) => {
                if let Some(appended) = appended {
                    appended(ticket);
                }
                durable = Durable::Logged(ticket);
                kept_at = log.is_ring().then_some(at);
            }
            // The store itself can still take it: commit durably, below.
            Err(e) => tracing::warn!("{e}; committing to the store directly"),
        }
    }
    // After the append: the log's sync (which `appended` may have started)
    // runs while redb stores the frames.
    let mut stored = tables.store_chunks(kept_at);
    // A logged commit is made durable by the log's sync; any other by
    // redb itself, after which the log is no longer needed for a replay.
    let logged = matches!(durable, Durable::Logged(_));
    let mut copied = None;
    if stored.is_ok() && !logged {
        stored = durable_marks(&mut tables, log, full).map(|to| copied = to);
    }
    drop(tables);
    if let Err(e) = stored {
        abort(txn);
        return Err(e);
    }
    let durability = if logged {
        Durability::None
    } else {
        Durability::Immediate
    };
    txn.set_durability(durability).map_err(storage)?;
    commit(txn)?;
    if !logged {
        if let Some(to) = copied {
            log.copied_to(to);
        }
        log.persisted(log.next_number())?;
    }
    Ok((value, durable))
}

/// Writes into a durable commit what the log needs of it (see
/// [`Wal::durable_marks`]): going round, the last record the store holds,
/// where the next goes and where the chunks the log keeps start; when the
/// log was `full`, a stretch of those chunks is copied into the store
/// first, so that the records can go on. Not going round, a store that
/// did clears those marks. Returns where copying reached, if it moved.
fn durable_marks(tables: &mut WriteTxn<'_>, log: &Wal, full: bool) -> Result<Option<u64>> {
    let copied = if full && log.is_ring() {
        Some(copy_kept_chunks(tables, log, 2 * log.copy_ahead())?)
    } else {
        None
    };
    let meta = tables.meta.get()?;
    match log.durable_marks() {
        Some((applied, resume, tail)) => {
            let tail = copied.unwrap_or(tail);
            meta.insert(META_WAL_APPLIED, applied).map_err(storage)?;
            meta.insert(META_WAL_RESUME, resume).map_err(storage)?;
            meta.insert(META_WAL_TAIL, tail).map_err(storage)?;
            meta.insert(META_WAL_CAPACITY, log.capacity())
                .map_err(storage)?;
        }
        None => {
            meta.remove(META_WAL_RESUME).map_err(storage)?;
            meta.remove(META_WAL_TAIL).map_err(storage)?;
            meta.remove(META_WAL_CAPACITY).map_err(storage)?;
        }
    }
    Ok(copied)
}

/// Copies into `chunks` each chunk that a record within about `budget`
/// bytes of where copying stopped keeps for the store (the chunk's value
/// still says it is there, see [`InLog`]); returns where that ends.
fn copy_kept_chunks(tables: &mut WriteTxn<'_>, log: &Wal, budget: u64) -> Result<u64> {
    log.records_to_copy(budget, |record_at, body| {
        for op in wal::ops(body) {
            let Op::Chunk {
                stream_id,
                first_seq,
                chunk,
            } = op?
            else {
                continue;
            };
            let at = chunk_position(record_at, body, chunk.0);
            let table = tables.chunks.get()?;
            let kept_here = table
                .get((stream_id, first_seq))
                .map_err(storage)?
                .and_then(|value| InLog::parse(value.value()))
                .is_some_and(|r| r.at == at && r.len as usize == chunk.0.len());
            if kept_here {
                table
                    .insert((stream_id, first_seq), chunk.0)
                    .map_err(storage)?;
            }
        }
        Ok(())
    })
}

/// Stores chunk `key`: its `bytes`, or, when the log keeps them at
/// `kept_at`, where they are there (an [`InLog`]).
fn put_chunk(
    table: &mut Table<'_, (u64, u64), &'static [u8]>,
    key: (u64, u64),
    bytes: &[u8],
    kept_at: Option<u64>,
) -> Result<()> {
    let reference;
    let value = match kept_at {
        Some(at) => {
            reference = InLog::of(at, bytes)?.encode();
            &reference[..]
        }
        None => bytes,
    };
    table.insert(key, value).map(drop).map_err(storage)
}

/// Where in the log `chunk`, a slice of the `body` of the record at
/// `record_at`, is.
fn chunk_position(record_at: u64, body: &[u8], chunk: &[u8]) -> u64 {
    let offset = wal::HEADER_LEN + (chunk.as_ptr() as usize - body.as_ptr() as usize);
    record_at + offset as u64
}

/// Aborts a transaction that failed. Dropping it would abort it too;
/// aborting explicitly reports a failure to do so.
fn abort(txn: WriteTransaction) {
    if let Err(e) = txn.abort() {
        tracing::warn!("aborting a failed write transaction: {e}");
    }
}

/// Applies what the log holds beyond the store (see [`crate::wal`]) and
/// returns how many records that was. The replay is committed without
/// durability and the log goes on after the records it applied: they stay
/// in the log until the next persist (going round, until copying has
/// passed them: the replay stores where their chunks are, as a logged
/// commit does, rather than the bytes). So a replay needs no disk space:
/// on a full disk the store still opens, with everything acknowledged,
/// and reads go on.
fn replay(db: &Database, log: &mut Wal) -> Result<u64> {
    let reader = log.reader();
    let mut txn = db.begin_write().map_err(storage)?;
    let replayed = {
        let mut tables = tables(&txn, &reader, None);
        let meta = tables.meta.get()?;
        let mark = |key| meta.get(key).map(|v| v.map(|v| v.value())).map_err(storage);
        let applied = mark(META_WAL_APPLIED)?.unwrap_or(0);
        let resume = mark(META_WAL_RESUME)?;
        let tail = mark(META_WAL_TAIL)?;
        // Going round, the records stay in the log until copying has
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
        Ok((applied, replayed, round)) => {
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
            match round {
                Some((resume, tail)) => log.resume_round(replayed, resume, tail, held),
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

/// The capacity of the log of the store in `db`, when it goes round.
fn going_round_with(db: &Database, path: &Path) -> Result<Option<u64>> {
    let corrupt = |e: redb::Error| Error::CorruptStore {
        path: path.to_path_buf(),
        detail: e.to_string(),
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

fn commit(txn: WriteTransaction) -> Result<()> {
    txn.commit().map_err(storage)
}

/// Shows `visit` the checkpoints of `execution` in `table` as (id, record),
/// newest first, until it returns false.
fn scan_newest_first(
    table: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    execution: &str,
    mut visit: impl FnMut(u64, &[u8]) -> bool,
) -> std::result::Result<(), redb::StorageError> {
    for item in table.range((execution, 0)..=(execution, u64::MAX))?.rev() {
        let (key, value) = item?;
        if !visit(key.value().1, value.value()) {
            break;
        }
    }
    Ok(())
}

/// Damages checkpoint `id` of `execution` in the store file at `path`: one
/// byte of its stored data is flipped and its checksum left as it was, so
/// that it must be found invalid. The file must not be open in a running
/// daemon. For tests of corruption handling only.
#[doc(hidden)]
pub fn corrupt_checkpoint_for_tests(path: &Path, execution: &str, id: u64) -> Result<()> {
    let db = Database::create(path).map_err(storage)?;
    let txn = db.begin_write().map_err(storage)?;
    {
        let mut table = txn.open_table(CHECKPOINTS).map_err(storage)?;
        let mut record = table
            .get((execution, id))
            .map_err(storage)?
            .map(|v| v.value().to_vec())
            .ok_or_else(|| {
                Error::InvalidRequest(format!(
                    "no checkpoint {id} of {execution} in {}",
                    path.display()
                ))
            })?;
        // The data is the record's tail (see `checkpoint::Record`); with no
        // data the flipped byte is its length, which breaks decoding.
        if let Some(last) = record.last_mut() {
            *last ^= 0xFF;
        }
        table
            .insert((execution, id), record.as_slice())
            .map_err(storage)?;
    }
    commit(txn)?;
    db.close().map_err(storage)
}

fn guard_db<'g>(guard: &'g RwLockReadGuard<'_, Option<Database>>) -> Result<&'g Database> {
    guard.as_ref().ok_or_else(|| {
        Error::Storage(
            "the store is unavailable: reopening it after a failed write did not work".into(),
        )
    })
}

/// Opens (or creates) the database file through `opener`, reserving
/// blocks ahead of its end through `headroom` (see [`RedbFile`]), mapping
/// failures on an existing file to [`Error::CorruptStore`].
fn open_database(path: &Path, opener: &dyn Opener, headroom: &Arc<Headroom>) -> Result<Database> {
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
    let corrupt = |detail: String| Error::CorruptStore {
        path: path.to_path_buf(),
        detail,
    };
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => Err(Error::Storage(format!(
            "store {} is already open in another process",
            path.display()
        ))),
        Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))) => {
            if is_disk_full(&e) {
                Err(Error::DiskFull {
                    detail: format!("opening {}: {e}", path.display()),
                })
            } else if existed && e.kind() != io::ErrorKind::PermissionDenied {
                Err(corrupt(e.to_string()))
            } else {
                Err(Error::io(
                    format!("cannot open store {}", path.display()),
                    e,
                ))
            }
        }
        Ok(Err(e)) if existed => Err(corrupt(e.to_string())),
        Ok(Err(e)) => Err(storage(e)),
        Err(panic) => Err(corrupt(panic_message(&panic))),
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

/// Maps any redb failure to the daemon's error: a full disk (or quota) is
/// [`Error::DiskFull`], so that producers can tell it from other failures.
fn storage(e: impl Into<redb::Error>) -> Error {
    let e: redb::Error = e.into();
    match &e {
        redb::Error::Io(io) if is_disk_full(io) => Error::DiskFull {
            detail: io.to_string(),
        },
        redb::Error::DatabaseClosed => Error::ShuttingDown,
        _ => Error::Storage(e.to_string()),
    }
}

pub(crate) fn is_disk_full(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    ) || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What precedes each payload in a chunk. Postcard is not self-describing:
/// the field order is the on-disk format.
#[derive(Serialize, Deserialize)]
struct FrameHead {
    ts_micros: u64,
    kind: FrameKind,
    len: u64,
}

/// Bytes of the frame count at the start of every chunk.
const COUNT_LEN: usize = 4;

/// The most a chunk holds (unless one frame alone is bigger). Readers fetch
/// whole chunks, so a small cap keeps a read of a few frames cheap and the
/// memory a reader holds small. It is one 64 KiB redb page less the leaf's
/// own bytes (a 4-byte header, a 4-byte value length and the 16-byte key):
/// redb sizes pages in powers of two, so a single byte more would make the
/// chunk's page, and the bytes written for it, twice as big.
const CHUNK_MAX_BYTES: usize = 64 * 1024 - 24;

/// The most bytes a [`FrameHead`] takes encoded: two u64 varints of at most
/// ten bytes and the kind.
const FRAME_HEAD_MAX_LEN: usize = 24;

/// The frames of one stream appended in one transaction, encoded as the
/// chunk they will be stored as.
#[derive(Debug)]
struct PendingChunk {
    first_seq: u64,
    count: u32,
    bytes: Vec<u8>,
}

impl PendingChunk {
    fn new(first_seq: u64) -> Self {
        Self {
            first_seq,
            count: 0,
            bytes: {
                let mut bytes = Vec::with_capacity(CHUNK_MAX_BYTES);
                bytes.resize(COUNT_LEN, 0);
                bytes
            },
        }
    }

    /// The seq the next frame pushed gets.
    fn next_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count)
    }

    /// Whether `frame` still fits under [`CHUNK_MAX_BYTES`]. An empty chunk
    /// takes any frame, however big.
    fn has_room_for(&self, frame: &Frame) -> bool {
        self.count == 0
            || self.bytes.len() + FRAME_HEAD_MAX_LEN + frame.payload.len() <= CHUNK_MAX_BYTES
    }

    fn push(&mut self, frame: &Frame) -> Result<()> {
        let head = FrameHead {
            ts_micros: frame.ts_micros,
            kind: frame.kind,
            len: frame.payload.len() as u64,
        };
        let bytes = std::mem::take(&mut self.bytes);
        self.bytes = postcard::to_extend(&head, bytes)
            .map_err(|e| Error::Storage(format!("cannot encode frame: {e}")))?;
        self.bytes.extend_from_slice(&frame.payload);
        self.count = self
            .count
            .checked_add(1)
            .ok_or_else(|| Error::Storage("too many frames in one transaction".into()))?;
        Ok(())
    }

    /// The stored form: the count, then the frames.
    fn finish(mut self) -> Vec<u8> {
        self.bytes[..COUNT_LEN].copy_from_slice(&self.count.to_le_bytes());
        self.bytes
    }
}

/// Adds `op` to a transaction's log record, if it has one (a function of
/// the record alone, for callers that hold other fields of the
/// transaction).
fn log_to(record: &mut Option<RecordBuf>, op: &Op<'_>) -> Result<()> {
    match record {
        Some(record) => record.push(op),
        None => Ok(()),
    }
}

/// The key (first seq) of the chunk that would hold `seq`: the greatest at
/// or below it. The chunk may end before `seq`.
fn chunk_holding(
    table: &impl ReadableTable<(u64, u64), &'static [u8]>,
    stream_id: u64,
    seq: u64,
) -> std::result::Result<Option<u64>, redb::StorageError> {
    let mut range = table.range((stream_id, 0)..=(stream_id, seq))?;
    match range.next_back() {
        Some(item) => Ok(Some(item?.0.value().1)),
        None => Ok(None),
    }
}

/// How many frames a chunk holds.
fn chunk_len(chunk: &[u8]) -> std::result::Result<u32, postcard::Error> {
    chunk
        .get(..COUNT_LEN)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(postcard::Error::DeserializeUnexpectedEnd)
}

/// How many times a read starts again, on a newer snapshot, when the
/// log's records went over chunks it kept while they were read (the store
/// has copied them by then, so once is all it takes unless the log goes
/// round again meanwhile).
const MOVED_RETRIES: usize = 4;

/// The value of a chunk whose bytes the log keeps (see [`crate::wal`],
/// "Going round"): their position in the log, their length and CRC-32,
/// and the chunk's frame count. Told from a chunk by its first four bytes,
/// a frame count of zero, which no chunk has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InLog {
    at: u64,
    len: u32,
    crc: u32,
    count: u32,
}

/// The bytes of an [`InLog`] value: zero, count, position, length, CRC.
const IN_LOG_LEN: usize = 24;

impl InLog {
    /// Where `chunk`, kept in the log at `at`, is.
    fn of(at: u64, chunk: &[u8]) -> Result<InLog> {
        let count =
            chunk_len(chunk).map_err(|e| Error::Storage(format!("a chunk built wrong: {e}")))?;
        let len =
            u32::try_from(chunk.len()).map_err(|_| Error::Storage("a chunk over 4 GiB".into()))?;
        Ok(InLog {
            at,
            len,
            crc: crc32fast::hash(chunk),
            count,
        })
    }

    fn parse(value: &[u8]) -> Option<InLog> {
        if value.len() != IN_LOG_LEN || value[..COUNT_LEN] != [0; COUNT_LEN] {
            return None;
        }
        let u32_at = |i: usize| {
            value
                .get(i..i + 4)
                .and_then(|b| b.try_into().ok())
                .map(u32::from_le_bytes)
        };
        let at = value
            .get(12..20)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)?;
        Some(InLog {
            count: u32_at(4)?,
            at,
            len: u32_at(8)?,
            crc: u32_at(20)?,
        })
    }

    fn encode(&self) -> [u8; IN_LOG_LEN] {
        let mut out = [0; IN_LOG_LEN];
        out[4..8].copy_from_slice(&self.count.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..20].copy_from_slice(&self.at.to_le_bytes());
        out[20..24].copy_from_slice(&self.crc.to_le_bytes());
        out
    }
}

/// The bytes of the chunk stored as `value` (its first seq `first`, of
/// `stream`): the value itself, or what the log keeps for it, read into
/// `kept`. `None` when the log's records went over those bytes after this
/// snapshot was taken: a newer one has them in the store.
fn chunk_bytes<'b>(
    value: &'b [u8],
    log: &LogReader,
    kept: &'b mut Vec<u8>,
    stream: &dyn std::fmt::Display,
    first: u64,
) -> Result<Option<&'b [u8]>> {
    let Some(in_log) = InLog::parse(value) else {
        return Ok(Some(value));
    };
    if !log.read(in_log.at, in_log.len as usize, kept)? {
        return Ok(None);
    }
    if crc32fast::hash(kept) != in_log.crc {
        return Err(Error::Storage(format!(
            "chunk {first} of stream {stream} is kept in the log {} at {}, but the bytes \
             there fail their check: the log was damaged or replaced",
            log.path().display(),
            in_log.at
        )));
    }
    Ok(Some(kept))
}

/// How many frames the chunk stored as `value` holds.
fn stored_count(value: &[u8]) -> std::result::Result<u32, postcard::Error> {
    match InLog::parse(value) {
        Some(in_log) => Ok(in_log.count),
        None => chunk_len(value),
    }
}

/// [`chunk_bytes`] in the writer's own transaction: only the writer
/// appends, so the log cannot go over a chunk while it reads it, and if
/// it did that would be a bug, reported rather than worked round.
fn own_chunk_bytes<'b>(
    value: &'b [u8],
    log: &LogReader,
    kept: &'b mut Vec<u8>,
    stream_id: u64,
    first: u64,
) -> Result<&'b [u8]> {
    chunk_bytes(value, log, kept, &format_args!("#{stream_id}"), first)?.ok_or_else(|| {
        Error::Storage(format!(
            "a chunk of stream #{stream_id} kept in the log was written over while the \
             writer read it"
        ))
    })
}

/// The chunk that holds the frames of `chunk` (whose first seq is `first`)
/// from `from_seq` on.
fn chunk_from(
    first: u64,
    chunk: &[u8],
    from_seq: u64,
) -> std::result::Result<Vec<u8>, postcard::Error> {
    let iter = ChunkIter::new(first, chunk)?;
    let mut count = iter.remaining;
    let mut start = COUNT_LEN;
    for f in iter {
        let f = f?;
        if f.seq >= from_seq {
            break;
        }
        count -= 1;
        start = f.payload.end;
    }
    let mut out = Vec::with_capacity(COUNT_LEN + chunk.len() - start);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&chunk[start..]);
    Ok(out)
}

/// The frames of a chunk in order, without copying anything.
#[derive(Debug)]
struct ChunkIter<'a> {
    chunk: &'a [u8],
    /// Where the next frame's head starts.
    pos: usize,
    next_seq: u64,
    remaining: u32,
}

impl<'a> ChunkIter<'a> {
    fn new(first: u64, chunk: &'a [u8]) -> std::result::Result<Self, postcard::Error> {
        Ok(Self {
            remaining: chunk_len(chunk)?,
            chunk,
            pos: COUNT_LEN,
            next_seq: first,
        })
    }

    fn read(&mut self) -> std::result::Result<StoredFrame, postcard::Error> {
        let rest = self
            .chunk
            .get(self.pos..)
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        let (head, after) = postcard::take_from_bytes::<FrameHead>(rest)?;
        let start = self.chunk.len() - after.len();
        let end = usize::try_from(head.len)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|&end| end <= self.chunk.len())
            .ok_or(postcard::Error::DeserializeUnexpectedEnd)?;
        self.pos = end;
        Ok(StoredFrame {
            seq: self.next_seq,
            ts_micros: head.ts_micros,
            kind: head.kind,
            payload: start..end,
        })
    }
}

impl Iterator for ChunkIter<'_> {
    type Item = std::result::Result<StoredFrame, postcard::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        let frame = self.read();
        // A damaged chunk yields its error once and then nothing.
        self.remaining = if frame.is_ok() { self.remaining - 1 } else { 0 };
        self.next_seq += 1;
        Some(frame)
    }
}

/// Gathers frames for one [`Store::read_frames_into`] call, chunk after
/// chunk.
struct ChunkReader<'s> {
    stream: &'s str,
    next_seq: u64,
    through: u64,
    limits: ReadLimits,
    /// Frames and payload bytes gathered so far.
    frames: usize,
    bytes: usize,
    /// The wanted frames of the chunk at hand; kept for the next chunk's.
    wanted: Vec<StoredFrame>,
}

impl ChunkReader<'_> {
    /// Hands the wanted frames of `chunk` (first seq `first`) to `sink`;
    /// true when the read is complete.
    fn take(&mut self, first: u64, chunk: &[u8], sink: &mut impl FrameSink) -> Result<bool> {
        let corrupt = |e: &postcard::Error| corrupt_frame(self.stream, first, e);
        self.wanted.clear();
        let mut done = false;
        for f in ChunkIter::new(first, chunk).map_err(|e| corrupt(&e))? {
            let f = f.map_err(|e| corrupt(&e))?;
            if f.seq < self.next_seq {
                continue;
            }
            if f.seq > self.through {
                done = true;
                break;
            }
            self.bytes += f.payload.len();
            self.frames += 1;
            self.next_seq = f.seq + 1;
            self.wanted.push(f);
            if self.frames >= self.limits.max_frames || self.bytes >= self.limits.max_bytes {
                done = true;
                break;
            }
        }
        done |= self.next_seq > self.through;
        if !self.wanted.is_empty() {
            sink.take(chunk, &self.wanted)?;
        }
        Ok(done)
    }
}

fn corrupt_frame(stream: &str, chunk: u64, e: &postcard::Error) -> Error {
    Error::Storage(format!(
        "stored chunk {chunk} of stream {stream} is unreadable: {e}"
    ))
}

fn corrupt_chunk(stream_id: u64, chunk: u64, e: &postcard::Error) -> Error {
    corrupt_frame(&format!("#{stream_id}"), chunk, e)
}

fn decode_meta(stream: &str, bytes: &[u8]) -> Result<StreamMeta> {
    postcard::from_bytes(bytes)
        .map_err(|e| Error::Storage(format!("metadata of stream {stream:?} is unreadable: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::Read;
    use std::os::unix::fs::FileExt;

    use super::*;

    fn frame(payload: &'static [u8]) -> Frame {
        Frame {
            ts_micros: 1_700_000_000_000_000,
            kind: FrameKind::Stdout,
            payload: Bytes::from_static(payload),
        }
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb")).unwrap();
        (dir, store)
    }

    /// Stores seqs `from..=to` of stream 7 in one transaction (one chunk),
    /// each with a payload naming its seq.
    fn put(store: &Store, from: u64, to: u64) {
        store.write(|txn| put_frames(txn, from, to)).unwrap();
    }

    /// Frames `from` to `to` of stream 7, each with its seq as timestamp.
    fn put_frames(txn: &mut WriteTxn<'_>, from: u64, to: u64) -> Result<()> {
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
    fn stream_s_through(store: &Store, last: u64) {
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

    #[test]
    fn a_chunk_gives_back_the_frames_written() {
        let mut chunk = PendingChunk::new(5);
        chunk.push(&frame(b"hello \x00 world")).unwrap();
        chunk.push(&frame(b"")).unwrap();
        let bytes = chunk.finish();
        let frames: Vec<StoredFrame> = ChunkIter::new(5, &bytes)
            .unwrap()
            .map(|f| f.unwrap())
            .collect();
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].seq, 5);
        assert_eq!(&bytes[frames[0].payload.clone()], b"hello \x00 world");
        assert_eq!(frames[1].seq, 6);
        assert!(frames[1].payload.is_empty());
        assert_eq!(frames[1].kind, FrameKind::Stdout);
        assert!(ChunkIter::new(1, &bytes[..bytes.len() - 3])
            .unwrap()
            .any(|f| f.is_err()));
    }

    #[test]
    fn chunk_from_keeps_the_tail() {
        let mut chunk = PendingChunk::new(1);
        for p in [&b"a"[..], b"bb", b"ccc"] {
            chunk.push(&frame_of(p)).unwrap();
        }
        let tail = chunk_from(1, &chunk.finish(), 2).unwrap();
        let seqs: Vec<(u64, usize)> = ChunkIter::new(2, &tail)
            .unwrap()
            .map(|f| f.map(|f| (f.seq, f.payload.len())).unwrap())
            .collect();
        assert_eq!(seqs, vec![(2, 2), (3, 3)]);
    }

    fn frame_of(payload: &[u8]) -> Frame {
        Frame {
            ts_micros: 1,
            kind: FrameKind::Data,
            payload: Bytes::copy_from_slice(payload),
        }
    }

    #[test]
    fn reads_cross_chunks_and_start_inside_one() {
        let (_dir, store) = store();
        stream_s_through(&store, 10);
        put(&store, 1, 4);
        put(&store, 5, 5);
        put(&store, 6, 10);
        let limits = ReadLimits {
            max_frames: 100,
            max_bytes: usize::MAX,
            through_seq: 8,
        };
        let read = store.read_frames("s", 3, limits).unwrap();
        let seqs: Vec<u64> = read.frames.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![3, 4, 5, 6, 7, 8]);
        for (seq, f) in &read.frames {
            assert_eq!(f.payload, Bytes::from(format!("frame {seq}")));
            assert_eq!(f.ts_micros, *seq);
        }
        let limits = ReadLimits {
            max_frames: 3,
            ..limits
        };
        let read = store.read_frames("s", 4, limits).unwrap();
        let seqs: Vec<u64> = read.frames.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, vec![4, 5, 6]);
    }

    #[test]
    fn streams_taking_turns_in_one_transaction_keep_their_own_frames() {
        let (_dir, store) = store();
        let meta = |id| StreamMeta {
            id,
            first_seq: 1,
            last_seq: 6,
            frames: 6,
            bytes: 0,
            created_micros: 0,
        };
        store
            .write(|txn| {
                txn.put_stream("a", &meta(1))?;
                txn.put_stream("b", &meta(2))?;
                // a 1-2, b 1-3, a 3-4, b 4-6, a 5-6: each switch puts the
                // other stream's chunk aside and takes it up again.
                for (id, from, to) in [(1, 1, 2), (2, 1, 3), (1, 3, 4), (2, 4, 6), (1, 5, 6)] {
                    for seq in from..=to {
                        let payload = Bytes::from(format!("{id}:{seq}"));
                        txn.put_frame(id, seq, &frame_of(&payload))?;
                    }
                }
                Ok(())
            })
            .unwrap();
        let limits = ReadLimits {
            max_frames: 100,
            max_bytes: usize::MAX,
            through_seq: 6,
        };
        for (name, id) in [("a", 1), ("b", 2)] {
            let read = store.read_frames(name, 1, limits).unwrap();
            let got: Vec<(u64, Bytes)> = read
                .frames
                .into_iter()
                .map(|(s, f)| (s, f.payload))
                .collect();
            let want: Vec<(u64, Bytes)> = (1..=6)
                .map(|seq| (seq, Bytes::from(format!("{id}:{seq}"))))
                .collect();
            assert_eq!(got, want, "stream {name}");
        }
    }

    #[test]
    fn chunks_fit_one_page_and_a_big_frame_stands_alone() {
        let (_dir, store) = store();
        let small = Bytes::from(vec![b's'; 256]);
        let big = Bytes::from(vec![b'B'; 100 * 1024]);
        store
            .write(|txn| {
                for seq in 1..=1000 {
                    let payload = if seq == 600 {
                        big.clone()
                    } else {
                        small.clone()
                    };
                    txn.put_frame(7, seq, &frame_of(&payload))?;
                }
                Ok(())
            })
            .unwrap();
        let guard = store.handle().unwrap();
        let txn = guard_db(&guard).unwrap().begin_read().unwrap();
        let chunks = txn.open_table(CHUNKS).unwrap();
        let mut next = 1;
        for item in chunks.iter().unwrap() {
            let (key, value) = item.unwrap();
            let (first, bytes) = (key.value().1, value.value());
            assert_eq!(first, next, "chunks are contiguous");
            let count = u64::from(chunk_len(bytes).unwrap());
            if (first..first + count).contains(&600) {
                assert_eq!((first, count), (600, 1), "the big frame is alone");
            } else {
                assert!(bytes.len() <= CHUNK_MAX_BYTES, "{} bytes", bytes.len());
                assert!(
                    bytes.len() > CHUNK_MAX_BYTES - 300
                        || first + count == 600
                        || first + count == 1001
                );
            }
            next = first + count;
        }
        assert_eq!(next, 1001);
    }

    #[test]
    fn compaction_deletes_whole_chunks_and_rewrites_a_straddling_one() {
        let (_dir, store) = store();
        put(&store, 1, 4);
        put(&store, 5, 8);
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 1, 8, |info| info.seq < 6))
            .unwrap();
        assert_eq!(deleted.frames, 5);
        assert_eq!(deleted.first_kept.map(|i| i.seq), Some(6));
        for seq in 1..=5 {
            assert_eq!(store.frame_ts(7, seq).unwrap(), None, "seq {seq}");
        }
        assert_eq!(store.frame_ts(7, 6).unwrap(), Some(6));
        assert_eq!(store.frame_ts(7, 8).unwrap(), Some(8));
        assert_eq!(store.frame_ts(7, 9).unwrap(), None);
        // The next compaction starts at the rewritten chunk's first frame.
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 6, 8, |_| true))
            .unwrap();
        assert_eq!(deleted.frames, 3);
        assert_eq!(store.frame_ts(7, 8).unwrap(), None);
    }

    /// The store and log files as a crash would leave them now: copied
    /// while the store is open, so the copy has the store's last durable
    /// commit and whatever the log holds.
    fn crash_copy(from: &Path, to: &Path, with_log: bool) -> PathBuf {
        let copy = to.join("t.redb");
        std::fs::copy(from, &copy).unwrap();
        if with_log {
            std::fs::copy(from.with_extension("wal"), copy.with_extension("wal")).unwrap();
        }
        copy
    }

    /// Logs consumer "c" of stream 7 as acked through `through`.
    fn log_ack(store: &Store, through: u64) -> Durable {
        store
            .write_logged(|txn| txn.put_consumer(7, "c", through), |_| {})
            .unwrap()
            .1
    }

    fn stored_ts(store: &Store, from: u64, to: u64) -> Vec<Option<u64>> {
        (from..=to)
            .map(|seq| store.frame_ts(7, seq).unwrap())
            .collect()
    }

    /// What [`stored_ts`] of seqs 1 to 10 shows when `kept` are stored
    /// with their seq as their timestamp.
    fn ts_of_only(kept: std::ops::RangeInclusive<u64>) -> Vec<Option<u64>> {
        (1..=10)
            .map(|seq| kept.contains(&seq).then_some(seq))
            .collect()
    }

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
        let round = store.wal().is_ring();
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

        // Without the log, the crash loses every logged commit...
        let bare = tempfile::tempdir().unwrap();
        let without =
            Store::open_with_log(&crash_copy(&path, bare.path(), false), capacity).unwrap();
        assert_eq!(stored_ts(&without, 1, 10), ts_of_only(1..=4));
        // ...with it, the store comes back exactly as it was, deletion
        // and rewritten chunk included.
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), true);
        let recovered = Store::open_with_log(&copy, capacity).unwrap();
        assert_eq!(stored_ts(&recovered, 1, 10), expected);
        let consumers = recovered.load().unwrap().consumers;
        assert_eq!(consumers, vec![(7, "c".to_owned(), 10)]);
        // New logged commits follow on from the replayed ones, which stay
        // in the log until a persist: a second crash keeps all of them.
        assert!(matches!(log_ack(&recovered, 11), Durable::Logged(_)));
        let again = tempfile::tempdir().unwrap();
        let twice = Store::open_with_log(&crash_copy(&copy, again.path(), true), capacity).unwrap();
        assert_eq!(stored_ts(&twice, 1, 10), expected);
        assert_eq!(
            twice.load().unwrap().consumers,
            vec![(7, "c".to_owned(), 11)]
        );
        // Once persisted, the store holds them without the log; going
        // round, the log goes on keeping their chunks (its records stay
        // until copying has passed them), so the store comes back with it.
        recovered.persist().unwrap();
        let persisted = tempfile::tempdir().unwrap();
        let bare = crash_copy(&copy, persisted.path(), round);
        let bare = Store::open_with_log(&bare, capacity).unwrap();
        assert_eq!(stored_ts(&bare, 1, 10), expected);
        assert_eq!(
            bare.load().unwrap().consumers,
            vec![(7, "c".to_owned(), 11)]
        );
    }

    #[test]
    fn a_new_store_does_not_take_the_log_of_a_removed_one() {
        let (dir, store) = store();
        let path = dir.path().join("t.redb");
        for through in 1..=3 {
            log_ack(&store, through);
        }
        store.persist().unwrap();
        store.close().unwrap();
        drop(store);
        // The records stay in the log's file, which was kept for reuse.
        let log = path.with_extension("wal");
        assert!(std::fs::metadata(&log).unwrap().len() > 0);
        std::fs::remove_file(&path).unwrap();

        let store = Store::open(&path).unwrap();
        // Emptied, then prepared: zeros where the old records were.
        let mut start = vec![1u8; 4096];
        std::fs::File::open(&log)
            .unwrap()
            .read_exact(&mut start)
            .unwrap();
        assert!(start.iter().all(|&b| b == 0), "old records in the log");
        log_ack(&store, 9);
        // Had the old records stayed, the removed store's second and third
        // (numbered 2 and 3, the same size) would follow the new first.
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), true);
        let reopened = Store::open(&copy).unwrap();
        assert_eq!(
            reopened.load().unwrap().consumers,
            vec![(7, "c".to_owned(), 9)]
        );
    }

    /// The schema version the store file at `path` (closed) says it has.
    fn stored_version(path: &Path) -> u64 {
        let db = Database::open(path).unwrap();
        let txn = db.begin_read().unwrap();
        let meta = txn.open_table(META).unwrap();
        let version = meta.get(META_SCHEMA_VERSION).unwrap().unwrap().value();
        version
    }

    /// Writes `version` into the store file at `path` (closed), as a build
    /// of that version would have left it.
    fn store_version(path: &Path, version: u64) {
        let db = Database::open(path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META)
            .unwrap()
            .insert(META_SCHEMA_VERSION, version)
            .unwrap();
        txn.commit().unwrap();
    }

    /// A log capacity no filesystem has four times over: the log is not
    /// prepared, so it does not go round.
    const UNPREPARED_LOG: u64 = 1 << 60;

    #[test]
    fn a_store_of_an_unknown_schema_version_is_refused_naming_the_versions_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        store.close().unwrap();
        drop(store);
        for version in [1, 4] {
            store_version(&path, version);
            let err = Store::open_with_log(&path, SMALL_LOG).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, Error::CorruptStore { .. }), "{text}");
            assert!(
                text.contains(&format!("schema version {version};")),
                "{text}"
            );
            assert!(text.contains("reads versions 2 to 3"), "{text}");
            assert_eq!(stored_version(&path), version, "nothing committed");
        }
    }

    #[test]
    fn a_version_2_store_is_marked_3_when_its_log_first_goes_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        assert!(!store.wal().is_ring());
        logged_frames(&store, 1, 10);
        store.close().unwrap();
        drop(store);
        assert_eq!(stored_version(&path), SCHEMA_VERSION, "a new store");
        // As a build that knows version 2 only left it.
        store_version(&path, 2);

        // Its log still not going round, it stays readable by such a build.
        let store = Store::open_with_log(&path, UNPREPARED_LOG).unwrap();
        logged_frames(&store, 11, 20);
        store.close().unwrap();
        drop(store);
        assert_eq!(stored_version(&path), 2);

        // Going round, chunk values may name the log's bytes: version 3,
        // and the frames from before read back whole.
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        assert!(store.wal().is_ring());
        logged_frames(&store, 21, 30);
        assert_eq!(where_chunks_are(&store).0, 1, "a chunk kept in the log");
        stream_s_through(&store, 30);
        assert_all_frames(&store, 30);
        store.close().unwrap();
        drop(store);
        assert_eq!(stored_version(&path), 3);
    }

    #[test]
    fn a_log_that_does_not_join_the_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        let crashed = tempfile::tempdir().unwrap();
        let copy = crash_copy(&path, crashed.path(), false);
        // The store from before the log began (say, restored from a
        // backup) with a log that has since gone round: where its next
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
            matches!(err, Error::CorruptStore { .. })
                && text.contains("t.wal")
                && text.contains("through 0"),
            "{text}"
        );
    }

    /// A log small enough to go round every few dozen commits.
    const SMALL_LOG: u64 = 128 * 1024;

    /// A KiB of payload naming `seq`.
    fn kib_payload(seq: u64) -> Bytes {
        let mut payload = format!("frame {seq} ").into_bytes();
        payload.resize(1024, b'.');
        Bytes::from(payload)
    }

    /// Logs frames `from..=to` of stream 7 (a KiB each, see
    /// [`kib_payload`]), then tends the log as the writer does between
    /// batches: copies a step and persists when asked to.
    fn logged_frames(store: &Store, from: u64, to: u64) {
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
        if store.copy_from_log(CopyPace::Pressed).unwrap() {
            store.persist().unwrap();
        }
    }

    /// Every frame of stream 7 ("s") from 1 to `last`, read back whole.
    fn assert_all_frames(store: &Store, last: u64) {
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
    fn where_chunks_are(store: &Store) -> (usize, usize) {
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
    fn chunks_kept_in_the_log_stay_readable_as_it_goes_round() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        assert!(store.wal().is_ring());
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
    fn a_replay_going_round_leaves_the_chunks_where_the_log_keeps_them() {
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
        // The log goes on after them, round three laps: they are copied
        // when it comes round to them, and nothing goes over them before.
        let mut last = 20;
        while last < 3 * SMALL_LOG / 1024 {
            logged_frames(&store, last + 1, last + 10);
            last += 10;
        }
        stream_s_through(&store, last);
        assert_all_frames(&store, last);
        // Crashed again without a persist since the replay, and closed
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

        // A log that does not go round starts again after a persist: its
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

    /// Frames as values, running `first_take` once, at its first chunk.
    struct Interrupted<'a> {
        frames: Vec<(u64, Frame)>,
        first_take: Option<Box<dyn FnOnce() + 'a>>,
    }

    impl FrameSink for Interrupted<'_> {
        fn take(&mut self, chunk: &[u8], frames: &[StoredFrame]) -> Result<()> {
            if let Some(run) = self.first_take.take() {
                run();
            }
            self.frames.take(chunk, frames)
        }
    }

    #[test]
    fn a_read_whose_chunks_the_log_went_over_meanwhile_reads_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_log(&dir.path().join("t.redb"), SMALL_LOG).unwrap();
        stream_s_through(&store, 20);
        logged_frames(&store, 1, 10);
        logged_frames(&store, 11, 20);
        assert_eq!(where_chunks_are(&store), (2, 0));
        // While the first attempt holds its snapshot (both chunks in the
        // log) and has taken the first chunk, the log goes round past the
        // second: the store copies it, and the records go over it.
        let attempts = std::cell::Cell::new(0);
        let read = store
            .read_frames_into(
                "s",
                1,
                ReadLimits {
                    max_frames: 100,
                    max_bytes: usize::MAX,
                    through_seq: 20,
                },
                || {
                    attempts.set(attempts.get() + 1);
                    let go_round = || {
                        let mut seq = 21;
                        while seq < 21 + 2 * SMALL_LOG / 1024 {
                            logged_frames(&store, seq, seq + 9);
                            seq += 10;
                        }
                    };
                    Interrupted {
                        frames: Vec::new(),
                        first_take: (attempts.get() == 1)
                            .then(|| Box::new(go_round) as Box<dyn FnOnce()>),
                    }
                },
            )
            .unwrap();
        assert_eq!(attempts.get(), 2);
        let seqs: Vec<u64> = read.frames.frames.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, (1..=20).collect::<Vec<_>>());
        for (seq, f) in &read.frames.frames {
            assert_eq!(f.payload, kib_payload(*seq));
        }
    }

    #[test]
    fn a_store_closed_without_a_persist_goes_on_after_its_records() {
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
    fn compaction_cuts_a_chunk_the_log_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_log(&dir.path().join("t.redb"), SMALL_LOG).unwrap();
        logged_frames(&store, 1, 10);
        assert_eq!(where_chunks_are(&store), (1, 0));
        let (deleted, _) = store
            .write_logged(
                |txn| txn.delete_prefix(7, 1, 10, |info| info.seq < 4),
                |_| {},
            )
            .unwrap();
        assert_eq!(deleted.frames, 3);
        // The rest was rewritten into the store, starting at seq 4.
        assert_eq!(where_chunks_are(&store), (0, 1));
        let ts: Vec<Option<u64>> = (1..=10)
            .map(|seq| store.frame_ts(7, seq).unwrap())
            .collect();
        assert_eq!(ts, ts_of_only(4..=10));
    }

    #[test]
    fn a_chunk_whose_bytes_in_the_log_were_damaged_is_an_error_naming_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        logged_frames(&store, 1, 10);
        store.persist().unwrap();
        let at = {
            let guard = store.handle().unwrap();
            let txn = guard_db(&guard).unwrap().begin_read().unwrap();
            let chunks = txn.open_table(CHUNKS).unwrap();
            let value = chunks.get((7, 1)).unwrap().unwrap();
            InLog::parse(value.value()).unwrap().at
        };
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(path.with_extension("wal"))
            .unwrap();
        log.write_all_at(b"XX", at % SMALL_LOG + 100).unwrap();
        let err = store.frame_ts(7, 3).unwrap_err().to_string();
        assert!(
            err.contains("t.wal") && err.contains("fail their check"),
            "{err}"
        );
    }

    #[test]
    fn frames_put_and_deleted_in_one_transaction() {
        let (_dir, store) = store();
        let deleted = store
            .write(|txn| {
                for seq in 1..=3 {
                    txn.put_frame(7, seq, &frame(b"x"))?;
                }
                txn.delete_prefix(7, 1, 3, |info| info.seq == 1)
            })
            .unwrap();
        assert_eq!(deleted.frames, 1);
        assert_eq!(store.frame_ts(7, 1).unwrap(), None);
        assert!(store.frame_ts(7, 2).unwrap().is_some());
    }

    #[test]
    fn a_logged_transaction_deleting_frames_it_put_replays_alike() {
        // Its chunks go into redb only after the record is appended: the
        // deletion must still see them, in the record's order.
        let (dir, store) = store();
        let path = dir.path().join("t.redb");
        let (deleted, durable) = store
            .write_logged(
                |txn| {
                    put_frames(txn, 1, 3)?;
                    txn.delete_prefix(7, 1, 3, |info| info.seq == 1)
                },
                |_| {},
            )
            .unwrap();
        assert_eq!(
            (deleted.frames, matches!(durable, Durable::Logged(_))),
            (1, true)
        );
        assert_eq!(stored_ts(&store, 1, 10), ts_of_only(2..=3));
        let crashed = tempfile::tempdir().unwrap();
        let recovered = Store::open(&crash_copy(&path, crashed.path(), true)).unwrap();
        assert_eq!(stored_ts(&recovered, 1, 10), ts_of_only(2..=3));
    }

    #[test]
    fn enospc_is_disk_full() {
        let e = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(matches!(
            storage(redb::StorageError::Io(e)),
            Error::DiskFull { .. }
        ));
        let e = io::Error::from_raw_os_error(libc::EIO);
        assert!(matches!(
            storage(redb::StorageError::Io(e)),
            Error::Storage(_)
        ));
    }

    #[test]
    fn delete_prefix_stops_at_the_first_kept_frame() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb")).unwrap();
        store
            .write(|txn| {
                for seq in 1..=10 {
                    txn.put_frame(7, seq, &frame(b"abc"))?;
                }
                Ok(())
            })
            .unwrap();
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 1, 10, |info| info.seq != 4 && info.seq < 8))
            .unwrap();
        assert_eq!(deleted.frames, 3);
        assert_eq!(deleted.bytes, 9);
        assert_eq!(deleted.first_kept.map(|i| i.seq), Some(4));
        assert_eq!(store.frame_ts(7, 3).unwrap(), None);
        assert!(store.frame_ts(7, 4).unwrap().is_some());
        assert!(store.frame_ts(7, 9).unwrap().is_some());
    }

    #[test]
    fn garbage_file_is_a_corrupt_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        std::fs::write(&path, vec![0x5a; 64 * 1024]).unwrap();
        let before = std::fs::read(&path).unwrap();
        match Store::open(&path) {
            Err(Error::CorruptStore { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected CorruptStore, got {other:?}"),
        }
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "a corrupt store is left untouched"
        );
    }
}
