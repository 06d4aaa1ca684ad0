//! The store: the only module that touches redb. This file holds the
//! [`Store`] handle (opening, writing, recovering, closing) and the API
//! the rest of the daemon uses, re-exported from the files beside it.
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
//! a postcard `FrameHead` followed by the payload's bytes.
//!
//! Chunks hold exactly the retained frames: compaction deletes the chunks
//! wholly below the new first seq and rewrites the one that straddles it,
//! under the key of its first retained frame, so that no reader ever needs
//! the stream's metadata to tell retained frames from deleted ones.
//!
//! Reads copy the part of a chunk they return into one buffer and hand out
//! payloads as slices of it: one allocation per chunk read, not per frame.
//!
//! When the write-ahead log wraps (see [`crate::wal`], "Wrapping"),
//! a logged transaction's chunk value is an
//! [`InLog`](chunk::InLog) instead: where its bytes are in the log's
//! record, read from there until the writer copies them in as the log
//! wraps back to them. Every reader of chunk values goes through one function,
//! `chunk_bytes`.
//!
//! Schema version 2 introduced chunks; a version 1 file (one row per frame)
//! is refused with a message naming the versions read, not migrated, and
//! so is a newer one. Version 3 lets a chunk value be an
//! [`InLog`](chunk::InLog), which a build reading version 2 would take
//! for an empty chunk. Version 4 logs checkpoints and step results
//! (see "Durability"), whose records a build reading version 3 could not
//! decode. An older store is copied to `backup-<version>-<UTC time>/`
//! beside it, then marked with this build's version, when it is opened.
//!
//! # Durability
//!
//! [`Store::write`] commits with redb's immediate durability.
//! [`Store::write_logged`] describes the transaction's changes in a record of
//! the write-ahead log (`tether.wal` beside the store, see [`crate::wal`]),
//! appends it, and commits to redb without durability: the caller makes it
//! durable by syncing the log. Any durable commit ([`Store::commit_durably`] when
//! nothing else is due) makes every earlier one durable too, after which
//! no record is needed for a replay. The `meta` table's `wal_applied` is
//! the number of the last record the state includes, written by each
//! logged transaction itself (and, wrapping, with `wal_resume` and
//! `wal_tail`, by each durable commit); opening the store applies the
//! records above it.
//!
//! The log describes streams, frames, producers' and consumers' state,
//! checkpoints (their removal too) and step results: saving a checkpoint
//! costs one sequential append shared with other commands, not a durable
//! commit's scattered page writes and sync. An execution's manifest is
//! not logged: a transaction that writes one commits durably.
//!
//! # Failures
//!
//! redb must not meet a full disk: after any failure of its file it
//! refuses all further work on the handle, reads included, until the file
//! is opened again, and opening it again on a full disk may fail too. So
//! every write first asks [`Store::make_room`] for the blocks it may take
//! (see [`crate::store_io::Headroom`]), and is refused there, with
//! [`Error::DiskFull`], while redb still works.
//!
//! When redb failed anyway (an I/O error), or a commit failed after its
//! record was appended to the log, [`Store::recover`] reopens the file,
//! letting redb's own recovery bring it back to its last durable commit,
//! and applies the log's records again on top. A write that failed before
//! reaching redb (the log's append, or one refused for room) leaves the
//! handle as it was: reads go on from it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use redb::{Database, Durability};

use crate::error::{is_disk_full, StorageSource};
use crate::store_io::{Headroom, Opener, OsOpener};
use crate::syncer::Durable;
use crate::wal::{self, CopyPace, Layout, LogReader, Wal};
use crate::{Error, Result};

mod backup;
pub mod check;
mod chunk;
mod compaction;
mod gates;
mod overlay;
mod read;
mod recovery;
pub mod repair;
mod schema;
#[cfg(feature = "test-hooks")]
mod test_hooks;
#[cfg(test)]
mod tests;
mod txn;
mod verify;

pub use chunk::{FrameSink, StoredFrame};
pub use compaction::{Deleted, FrameInfo};
pub use gates::GatesSnapshot;
pub use read::{ReadChunk, ReadLimits, Snapshot};
pub use schema::{ProducerState, StreamMeta, SCHEMA_VERSION};
#[cfg(feature = "test-hooks")]
pub use test_hooks::{corrupt_checkpoint_for_tests, remove_chunk_for_tests};
pub use txn::WriteTxn;

use recovery::{open_database, replay, wrapping_capacity};
use txn::{abort, commit, copy_kept_chunks, tables, write_in};

/// The redb database file.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// `None` once closed, or when reopening after a failure did not work.
    db: RwLock<Option<Database>>,
    closed: AtomicBool,
    /// Set by a write that failed after its record was appended to the log
    /// (or a read that redb failed): the handle must be reopened, and the
    /// log replayed, before the next write. (redb failing itself is seen
    /// in [`Headroom::redb_failed`].)
    needs_reopen: AtomicBool,
    /// When the handle was last reopened, or tried to be: readers reopen
    /// a failed handle at most once every [`REOPEN_EVERY`].
    reopened_at: Mutex<Option<Instant>>,
    /// The payload bytes of the last batch of frames a write asked room
    /// for ([`Store::make_room_for`]): what the store must have room for
    /// again before it is called writable ([`Store::room_again`]).
    last_batch: AtomicU64,
    /// The log's [`Wal::written`] at the last durable commit, and the
    /// bytes of records replayed when the store was opened until then:
    /// with the log's `written` now, the most that a replay on a reopened
    /// handle applies, for the room it asks first.
    durable_at: AtomicU64,
    replayed_at_open: AtomicU64,
    /// What the commits made without durability since the last durable
    /// one asked room for, at most [`WRITE_BUFFER`]: their pages may still
    /// be in redb's write buffer, and any later write may have to write
    /// them out, so every write asks room for them too.
    owed: AtomicU64,
    /// The write-ahead log. Locked after `db` whenever both are.
    wal: Mutex<Wal>,
    /// Reads chunks the log keeps for the store, without its lock.
    log: LogReader,
    /// Opens the store's file and the log's (see [`crate::store_io`]).
    opener: Arc<dyn Opener>,
    /// What is reserved beyond the store file's end, across reopenings.
    headroom: Arc<Headroom>,
}

/// Verifies the log against the store's marks without writing a byte:
/// redb is opened through an overlay (see [`overlay`]), since after a
/// crash it recovers the file first, which writes to it.
fn verify_before_writing(
    path: &Path,
    log_path: &Path,
    log_capacity: u64,
    opener: &Arc<dyn Opener>,
) -> Result<()> {
    let overlay = overlay::OverlayOpener::new(opener.clone());
    let probe = open_database(path, &overlay, &Arc::new(Headroom::default()))?;
    verify::verify_both_there(path, log_path, true, opener.as_ref())?;
    let capacity = wrapping_capacity(&probe, path)?.unwrap_or(log_capacity);
    let log = Wal::open_read(log_path, capacity, opener.as_ref())?;
    let verified = verify::verify_log(&probe, &log);
    drop(log);
    let version = schema::recorded_version(&probe);
    probe.close().map_err(storage)?;
    verified?;
    if let Some(version) = version? {
        schema::check_version(path, version)?;
        if version < SCHEMA_VERSION {
            // Upgraded in place (see `init_schema`), so first copied as it
            // is, for an older build or for a way back.
            let dir = path.parent().unwrap_or(Path::new("."));
            let kept = backup::copy_aside(dir, &format!("backup-{version}"), &[path, log_path])
                .map_err(|e| match e {
                    Error::Io { context, source } => Error::io(
                        format!("before upgrading the store from version {version}, {context}"),
                        source,
                    ),
                    other => other,
                })?;
            tracing::info!(
                "upgrading the store from version {version} to {SCHEMA_VERSION}; a copy of it \
                 as it was is in {}",
                kept.display()
            );
        }
    }
    // The store verified: what redb's recovery and clean close wrote over
    // the file in memory is written to it, so that opening it again does
    // not recover it a second time.
    overlay
        .write_through(path)
        .map_err(|e| Error::io(format!("cannot write the store {}", path.display()), e))
}

/// What every write asks to have reserved for the store file's blocks
/// beyond what it adds itself (see [`Store::make_room`]): the pages a
/// commit rewrites besides its data (the paths to what it changed in each
/// table, redb's own tables).
const MIN_ROOM: u64 = 256 * 1024;

/// The store file's name in the state directory; the log's is the same
/// with the extension `wal`.
pub const STORE_FILE: &str = "tether.redb";

/// The most pages commits made without durability may leave in redb's
/// write buffer, to be written by a later commit (half of its page cache,
/// `CACHE_BYTES` in `recovery`).
const WRITE_BUFFER: u64 = 1024 * 1024;

/// How often readers may reopen a handle that redb failed (see
/// [`Store::reopen_for_reads`]): as often as degraded mode retries, so
/// that reads failing on it, and retried by their clients, do not reopen
/// the store over and over.
const REOPEN_EVERY: Duration = crate::degraded::RETRY_EVERY;

/// Bytes of a log record beyond the payloads of the frames it holds, at
/// most, as a share of them, and per record: for [`Store::room_again`].
const RECORD_OVERHEAD_SHARE: u64 = 4;
const RECORD_OVERHEAD: u64 = 64 * 1024;

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
    /// already wraps: its positions are counted in the capacity it
    /// had when it began to, which it keeps.
    pub fn open_with_log(path: &Path, log_capacity: u64) -> Result<Store> {
        Self::open_with(path, log_capacity, Arc::new(OsOpener))
    }

    /// [`Store::open_with_log`] with both files opened through `opener`
    /// (tests inject failures there).
    pub fn open_with(path: &Path, log_capacity: u64, opener: Arc<dyn Opener>) -> Result<Store> {
        let existed = std::fs::metadata(path).is_ok_and(|m| m.len() > 0);
        let log_path = path.with_extension("wal");
        // Damage stops the daemon before anything is written (see
        // `verify`): first the files, then the log's records.
        if existed {
            verify_before_writing(path, &log_path, log_capacity, &opener)?;
        } else {
            verify::verify_both_there(path, &log_path, false, opener.as_ref())?;
        }
        let headroom = Arc::new(Headroom::default());
        let db = open_database(path, opener.as_ref(), &headroom)?;
        let wrapping = if existed {
            wrapping_capacity(&db, path)?
        } else {
            None
        };
        let capacity = match wrapping {
            Some(kept) if kept != log_capacity => {
                tracing::warn!(
                    "the log wraps around in {kept} bytes; the setting of {log_capacity} applies \
                     to a new store"
                );
                kept
            }
            _ => log_capacity,
        };
        let mut log = Wal::open(&log_path, capacity, opener.as_ref())?;
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
            reopened_at: Mutex::new(None),
            last_batch: AtomicU64::new(0),
            durable_at: AtomicU64::new(0),
            replayed_at_open: AtomicU64::new(0),
            owed: AtomicU64::new(0),
            log: log.reader(),
            wal: Mutex::new(log),
            opener,
            headroom,
        };
        store.init_schema()?;
        if existed {
            // Not wrapping, the records' frames go into redb's pages;
            // wrapping, only where they are, a few bytes each.
            let records = if wrapping.is_some() {
                0
            } else {
                store.log_len()
            };
            store.replayed_at_open.store(records, Ordering::Release);
            // On a full disk the store still opens, to serve reads: a
            // replay that finds no room goes on all the same (most of it
            // stays in redb's write buffer until the next commit, which
            // asks for room itself).
            if let Err(e) = store.make_room(records) {
                tracing::warn!("replaying the log with little room left: {e}");
            }
            let guard = store.handle()?;
            replay(guard_db(&guard)?, &mut store.wal())?;
            store.owe(records);
        }
        if let Err(e) = store.wal().prepare() {
            // Only a head start: zeros are written ahead of the records.
            tracing::warn!("{e}");
        }
        store.settle_log(wrapping.is_some())?;
        Ok(store)
    }

    /// Makes the store's durable marks say whether the log wraps, as
    /// [`Wal::prepare`] decided (`marked`: they said it did when the store
    /// was opened): a replay then reads the log the way it was written.
    /// Only a store that changes over commits anything.
    fn settle_log(&self, marked: bool) -> Result<()> {
        let wrapping = {
            let mut log = self.wal();
            let wrapping = log.layout() == Layout::Wrapping;
            if wrapping && !marked {
                log.start_wrapping_here();
            }
            wrapping
        };
        if wrapping != marked {
            self.write(|_| Ok(()))?;
        }
        Ok(())
    }

    /// Copies chunks the log keeps for the store into it, when the log's
    /// records are getting near them (see [`crate::wal`], "Wrapping"):
    /// one step at `pace`, committed without durability. Returns whether
    /// the store should now be committed durably, so that the records can go over
    /// them.
    pub fn copy_from_log(&self, pace: CopyPace) -> Result<bool> {
        let guard = self.handle()?;
        let db = guard_db(&guard)?;
        let mut log = self.wal();
        let budget = log.copy_budget(pace);
        if budget > 0 {
            // The chunks copied are written into redb's own pages.
            self.make_room(budget.saturating_mul(2))?;
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
                Ok(to) => {
                    self.owe(budget.saturating_mul(2));
                    log.copied_to(to);
                }
                // redb's own failure, if it was one, is seen by
                // `Store::recover`; a copy refused before reaching redb
                // leaves the handle as it was.
                Err(e) => return Err(self.on_file(e)),
            }
        }
        Ok(log.wants_durable_commit())
    }

    /// Wrapping: whether the log has chunks to copy into the store in
    /// idle time (see [`Store::copy_from_log`]).
    pub fn wants_copying(&self) -> bool {
        self.wal().copy_budget(CopyPace::Idle) > 0
    }

    /// The write-ahead log, for the syncer (see [`Wal::sync_handle`]).
    pub fn wal_sync_handle(&self) -> wal::SyncHandle {
        let store = self.opener.open_read(&self.path).ok();
        self.wal().sync_handle(store)
    }

    /// Refuses, with [`Error::DiskFull`], a write that could take `bytes`
    /// more blocks for the store file's pages (and [`MIN_ROOM`] besides,
    /// and what earlier commits may have left to write, see
    /// `owed`) when the disk has no room for that: checked before
    /// the write, so that redb never meets a full disk itself (it then
    /// refuses reads too until it is reopened, and reopening may need
    /// space as well). The blocks stay reserved for redb until it takes
    /// them (see [`Headroom`]); cheap while they already are.
    pub fn make_room(&self, bytes: u64) -> Result<()> {
        let want = bytes
            .saturating_add(MIN_ROOM)
            .saturating_add(self.owed.load(Ordering::Acquire));
        self.headroom.reserve(want).map_err(|e| {
            tracing::debug!(
                want,
                reserved = self.headroom.headroom(),
                owed = self.owed.load(Ordering::Acquire),
                "no room for a write of the store: {e}"
            );
            if self.closed.load(Ordering::Acquire) {
                Error::ShuttingDown
            } else if is_disk_full(&e) {
                Error::DiskFull {
                    detail: format!(
                        "no room left on its disk for {} to take {} KiB more: {e}",
                        self.path.display(),
                        want.div_ceil(1024)
                    ),
                    source: Some(e.into()),
                }
            } else {
                Error::storage(
                    format!(
                        "I/O error on {}: cannot reserve blocks for it",
                        self.path.display()
                    ),
                    e,
                )
            }
        })
    }

    /// Reads every stored frame and checks it, as `tetherd check` does
    /// with the daemon stopped: the summary line, or the damage found.
    /// One read snapshot; the log's own records are checked at start.
    pub fn verify(&self) -> Result<String> {
        let guard = self.handle()?;
        check::verify_frames(guard_db(&guard)?, &self.log, &self.path)
    }

    /// [`Store::make_room`] for a batch of frames with `payload` bytes:
    /// not wrapping, a logged commit writes them into redb's own pages,
    /// which may take up to twice as many bytes (pages of a leaf split
    /// half full; a value of several pages placed on a boundary of its
    /// size). Remembered for [`Store::room_again`].
    pub fn make_room_for(&self, payload: u64) -> Result<()> {
        self.last_batch.store(payload, Ordering::Release);
        self.make_room(payload.saturating_mul(2))
    }

    /// Whether a write like the last batch of frames (see
    /// [`Store::make_room_for`]; at most `cap` payload bytes) would now
    /// find room, checked as the write does, so that a refusal here names
    /// the cause the write would meet: room reserved for the store file,
    /// then, not wrapping, room in the log's file for its record (see
    /// [`Wal::make_room`]). Degraded mode asks before it calls the store
    /// writable: a write that fails again at once would be refused to
    /// producers after they were told it works.
    pub fn room_again(&self, cap: u64) -> Result<()> {
        let batch = self.last_batch.load(Ordering::Acquire).min(cap);
        self.make_room(batch.saturating_mul(2))?;
        let record = batch + batch / RECORD_OVERHEAD_SHARE + RECORD_OVERHEAD;
        self.wal().make_room(record)
    }

    /// Notes a commit made without durability that asked room for `bytes`
    /// (see `owed`).
    fn owe(&self, bytes: u64) {
        let add = bytes.saturating_add(MIN_ROOM);
        let _ = self
            .owed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |owed| {
                Some(owed.saturating_add(add).min(WRITE_BUFFER))
            });
    }

    /// The log file's length: at least the bytes of the records a replay
    /// on opening applies, for the room it asks first.
    fn log_len(&self) -> u64 {
        std::fs::metadata(self.path.with_extension("wal")).map_or(0, |m| m.len())
    }

    /// The most bytes of records a replay on a reopened handle applies:
    /// those appended since the last durable commit, and, before the
    /// first, those replayed on opening.
    fn not_durable_bytes(&self, log: &Wal) -> u64 {
        let since = log
            .written()
            .saturating_sub(self.durable_at.load(Ordering::Acquire));
        since.saturating_add(self.replayed_at_open.load(Ordering::Acquire))
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

    /// Writes what the store may need of the log again and syncs it, after
    /// a failed sync (see [`Wal::rewrite`]).
    pub fn rewrite_log(&self) -> Result<()> {
        self.wal().rewrite()
    }

    /// Whether the log can take a record of `bytes`: wrapping it always
    /// can; otherwise its file must be able to grow to hold it (see
    /// [`Wal::make_room`]).
    pub fn log_has_room(&self, bytes: u64) -> Result<()> {
        self.wal().make_room(bytes)
    }

    /// Since when the write-ahead log has held commits the store may not
    /// hold durably; `None` when the store holds every commit itself.
    pub fn not_durable_since(&self) -> Option<std::time::Instant> {
        self.wal().holding_since()
    }

    fn wal(&self) -> std::sync::MutexGuard<'_, Wal> {
        self.wal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The bytes of every file of the store: redb's file and the log.
    /// A file that cannot be read counts as empty: the size is shown, not
    /// relied on.
    pub fn file_size(&self) -> u64 {
        [self.path.clone(), self.path.with_extension("wal")]
            .iter()
            .map(|path| std::fs::metadata(path).map_or(0, |m| m.len()))
            .sum()
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
    /// beginning, or, wrapping, goes on over the chunks copied).
    pub fn commit_durably(&self) -> Result<()> {
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
        self.make_room(0)?;
        let mut log = self.wal();
        let before = log.written();
        let asked = AtomicU64::new(0);
        let result = write_in(db, &mut log, &self.log, appended, f, &|bytes| {
            asked.fetch_max(bytes, Ordering::Relaxed);
            self.make_room(bytes)
        });
        match &result {
            Ok((_, Durable::Committed)) => {
                self.durable_at.store(log.written(), Ordering::Release);
                self.replayed_at_open.store(0, Ordering::Release);
                self.owed.store(0, Ordering::Release);
            }
            Ok(_) => self.owe(asked.into_inner()),
            // A record appended for a commit that then failed is in the log
            // but not in redb: a replay on a reopened handle puts it there,
            // as a crash would. (redb failing itself is seen by `recover`.)
            Err(_) if log.written() != before => {
                self.needs_reopen.store(true, Ordering::Release);
            }
            Err(_) => {}
        }
        result.map_err(|e| self.on_file(e))
    }

    /// Whether the handle must be reopened before the next write: redb
    /// failed (see [`Headroom::redb_failed`]), or a commit failed after
    /// its record was appended.
    pub(super) fn handle_failed(&self) -> bool {
        self.needs_reopen.load(Ordering::Acquire) || self.headroom.redb_failed()
    }

    /// Words a failure of redb's file as the contract does, `I/O error on
    /// FILE: ...`, so that degraded mode shows it so.
    fn on_file(&self, e: Error) -> Error {
        match e {
            Error::Storage {
                source: source @ StorageSource::Redb(_),
                ..
            } if self.headroom.redb_failed() => {
                Error::storage(format!("I/O error on {}", self.path.display()), source)
            }
            e => e,
        }
    }

    /// Reopens the database when the handle failed (see
    /// [`Store::handle_failed`]), so that the next write starts from the
    /// last commit. A no-op otherwise: a write that failed before
    /// reaching redb leaves a handle that reads and writes as before, and
    /// closing it would make redb write (its allocator state) on what may
    /// be a full disk.
    pub fn recover(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        if slot.is_some() && !self.handle_failed() {
            return Ok(());
        }
        *self
            .reopened_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        // redb holds an exclusive lock on the file: the old handle must be
        // gone before the file can be opened again. A handle redb failed
        // writes nothing as it closes.
        drop(slot.take());
        let db = open_database(&self.path, self.opener.as_ref(), &self.headroom)?;
        // Commits that reached the log but not the store (the one that
        // failed, if its record was written) are applied again, with room
        // for them first: a handle that met a full disk at once would be
        // of no use to readers either.
        let mut log = self.wal();
        let records = self.not_durable_bytes(&log);
        // A new handle has nothing buffered yet.
        self.owed.store(0, Ordering::Release);
        self.make_room(records)?;
        replay(&db, &mut log)?;
        drop(log);
        self.owe(records);
        *slot = Some(db);
        self.needs_reopen.store(false, Ordering::Release);
        tracing::info!(path = %self.path.display(), "store reopened after a failed write");
        Ok(())
    }

    /// For a read that failed on a failed handle: reopens it (see
    /// [`Store::recover`]) unless that was done or tried within the last
    /// [`REOPEN_EVERY`]; returns whether it was. Readers retrying a read
    /// must not reopen the store each time: each reopening drops the only
    /// handle, and on a failing disk it fails as often.
    pub(super) fn reopen_for_reads(&self) -> Result<bool> {
        {
            let mut at = self
                .reopened_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if at.is_some_and(|t| t.elapsed() < REOPEN_EVERY) {
                return Ok(false);
            }
            *at = Some(Instant::now());
        }
        self.recover().map(|()| true)
    }

    /// Closes the database. Later operations fail with
    /// [`Error::ShuttingDown`].
    pub fn close(&self) -> Result<()> {
        let mut slot = self.db.write().unwrap_or_else(PoisonError::into_inner);
        // redb writes its allocator state as it closes: with room for it,
        // or it leaves the file for a repair on the next opening.
        if slot.is_some() && !self.closed.load(Ordering::Acquire) {
            if let Err(e) = self.make_room(0) {
                tracing::debug!("closing the store with little room left: {e}");
            }
        }
        self.closed.store(true, Ordering::Release);
        match slot.take() {
            Some(db) => db.close().map_err(storage),
            None => Ok(()),
        }
    }
}

fn guard_db<'g>(guard: &'g RwLockReadGuard<'_, Option<Database>>) -> Result<&'g Database> {
    guard.as_ref().ok_or_else(|| {
        Error::Refused(
            "the store is unavailable: reopening it after a failed write did not work".into(),
        )
    })
}

/// Maps any redb failure to the daemon's error: a full disk (or quota) is
/// [`Error::DiskFull`], so that producers can tell it from other failures.
fn storage(e: impl Into<redb::Error>) -> Error {
    let e: redb::Error = e.into();
    match &e {
        redb::Error::Io(io) if is_disk_full(io) => Error::DiskFull {
            detail: io.to_string(),
            source: Some(e.into()),
        },
        redb::Error::DatabaseClosed => Error::ShuttingDown,
        redb::Error::Io(_) => Error::storage("I/O error", e),
        _ => Error::storage("redb", e),
    }
}
