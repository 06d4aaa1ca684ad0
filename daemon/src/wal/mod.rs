//! The write-ahead log: a write transaction made durable by one sequential
//! append and an `fdatasync`, instead of by redb's own durable commit.
//!
//! Why: a durable redb commit writes the transaction's pages where they
//! live in the file, with redb's allocator state, and then syncs the file;
//! the writer thread can do nothing else meanwhile. A *logged* transaction
//! is instead described by one record appended here, then committed to redb
//! without durability (this process sees it at once; redb writes it to the
//! file later). The [`Syncer`](crate::syncer::Syncer) thread syncs the log
//! while the writer goes on with the next batch, and only then is the
//! transaction's work published or acknowledged. Every so often redb is
//! made durable itself (a *durable commit*: when the log is full, when the writer
//! is idle, on close, and for any transaction the log cannot describe);
//! after that no record is needed for a replay.
//!
//! # Records
//!
//! `[body length u32 LE][CRC-32 u32 LE of number and body][number u64 LE][body]`.
//! The body is the transaction's changes as postcard [`Op`]s, each one
//! absolute (a value put, a key or key range removed), never relative to
//! what was there. Records are numbered one after another, across durable commits.
//!
//! # Recovery
//!
//! Each logged transaction also stores its record's number in redb
//! ([`Store`](crate::store::Store) keeps it in the `meta` table), so redb's
//! state says which records it holds: exactly those up to that number,
//! whichever commits a crash kept. On open the log is read from its start
//! while each record is intact and numbered one above the one before (a
//! torn write, the zeros of a file that never got that far, or an older
//! record left behind by an earlier run through the file all end it); the
//! records above the stored number are applied again, in order (committed
//! without durability: they stay in the log until the next durable commit). The
//! first record must be at most one above the
//! stored number: if it is further on, records are missing, and the store
//! is refused as corrupt rather than opened with a hole.
//!
//! # Wrapping
//!
//! A log whose file was filled to its capacity when the store opened
//! ([`Wal::prepare`]; not where free space is short) wraps that
//! file, and keeps the frames of its records for the store: a logged
//! transaction stores in redb, for each chunk, only where the record put
//! its bytes (the store's `InLog` value: position, length, CRC-32), so
//! that a frame is written once, into the log, rather than also into
//! redb's pages (which cost W1's writer about a third of its time, most
//! of it the kernel taking fresh pages for a growing file).
//!
//! Positions count every lap (the byte at position `p` is at `p %
//! capacity` in the file), so a position is never reused and a chunk's
//! value names one place in one lap. A record that would pass the file's
//! end goes to its start, a lap on. Records never go more than a lap
//! ahead of the *tail*, the oldest position a chunk value may name as the
//! store holds durably. As the records come within [`COPY_AHEAD`] of a lap
//! ahead of where copying stopped, the writer copies the chunks kept in
//! the records there into redb (each one only if its value still names
//! that very place: compacted or rewritten ones are skipped), committed
//! without durability: a piece at a time when it has nothing else to do,
//! and between batches once the records come within three quarters of
//! that (see [`CopyPace`]); as they come within
//! [`DURABLE_COMMIT_AHEAD`], it commits durably, and the tail moves up
//! to where copying reached. A full log still takes a commit, durably, copying a stretch
//! of chunks in the same transaction.
//!
//! A durable commit stores the *marks*: the last record it holds, where
//! the next one goes, and the tail; a logged commit stores its number
//! and where the next record goes (redb keeps commits made without
//! durability when it is closed cleanly, so any state it comes back with
//! must say where its records end). A replay starts where the next record
//! went, or at the file's start a lap on, and needs exactly the record
//! due there: an older one is the log's end, a newer one a hole. It
//! stores where the records' chunks are, as a logged commit does, and
//! where the next record goes; the records stay until copying passes
//! them. A store that changes between wrapping and not (free space)
//! is committed durably on opening, so that its marks always say how its log was
//! written.
//!
//! Readers take a snapshot of redb and then read the log without its
//! lock, so the records may go over a chunk while it is read: the writer
//! raises the *head* (the end of the record it is writing) before writing
//! and a reader checks it after reading ([`LogReader::read`]); a chunk
//! the head has since passed a lap beyond is read again from a newer
//! snapshot, in which the store has it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::store_io::{FileIo, Opener};
use crate::{Error, Result};

mod reader;
mod record;
mod replay;
mod rewrite;
#[cfg(test)]
mod tests;

pub use reader::{LogReader, SyncHandle};
pub use record::{ops, Op, RawBytes, RecordBuf, HEADER_LEN};
pub use replay::{LostRecords, Replayed, Salvaged};

use replay::Record;

/// The log's size: where it wraps, or (not wrapping) where a durable
/// commit starts it again from its beginning. A durable commit stalls
/// the writer for a few ms (W1's p99 was 2.2–2.8 ms with 64 MiB, four
/// durable commits per million 256-byte frames, and 1.6–2.0 ms with 256 MiB,
/// one); a replay after a crash reads at most this much (800k frames
/// replayed and served in 0.5 s), and a burst of frames up to about
/// this much is written once.
pub const DEFAULT_CAPACITY: u64 = 256 * 1024 * 1024;

/// How far ahead of the records the file is filled with zeros when it was
/// not filled to its capacity beforehand ([`Wal::prepare`]). Syncing a
/// write that extends a file also commits the file's new size and blocks
/// through the filesystem's journal, about twice the cost of syncing an
/// overwrite; writing zeros ahead, a step at a time, lets one sync in many
/// pay that while the rest overwrite blocks already in place.
const ZERO_STEP: u64 = 1024 * 1024;

/// Free space, in log capacities, from which the log keeps its file when
/// it starts again (see [`Wal::restart`]).
const KEEP_FILE_FREE: u64 = 4;

/// Wrapping: how far ahead of the records the chunks kept in the log
/// are copied into the store, at most (a sixteenth of a smaller log).
/// Small, so that a burst shorter than a lap less this is written once
/// (W1's million frames are about a lap); big enough for the copying to
/// keep ahead in idle time, and for a writer with none to commit
/// durably seldom (see [`DURABLE_COMMIT_AHEAD`]; at 8 MiB, a sustained
/// W2 ran a sixth slower).
const COPY_AHEAD: u64 = 16 * 1024 * 1024;

/// Wrapping: the records copied from in one step of copying (at most;
/// a 256th of a smaller log). Small, so that a command arriving while the
/// writer copies in idle time waits little, and copying between batches
/// holds each batch up a little rather than a few a lot.
const COPY_PIECE: u64 = 128 * 1024;

/// When chunks kept in the log are copied into the store (see
/// [`Wal::copy_budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPace {
    /// The writer has nothing else to do: a piece at a time.
    Idle,
    /// Between batches: nothing until the records come near the chunks not
    /// yet copied, then enough to get copying ahead of them again.
    BetweenBatches,
}

/// How the log lays its records out in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// From the file's start on, up to its capacity at most; a durable
    /// commit starts the log again from its start, and the store holds
    /// every chunk itself.
    Flat,
    /// *Wrapping*: the file is reused in laps, positions count every
    /// lap, and the records keep the chunks' bytes for the store (see
    /// "Wrapping" in the module docs).
    Wrapping,
}

impl Layout {
    /// The layout that the store's marks say the log was written in: only
    /// wrapping do they say where the next record went (`resume`).
    pub fn of_resume(resume: Option<u64>) -> Layout {
        match resume {
            Some(_) => Layout::Wrapping,
            None => Layout::Flat,
        }
    }

    /// Where the byte at log position `pos` is in a file of `capacity`.
    pub fn file_offset(self, pos: u64, capacity: u64) -> u64 {
        match self {
            Layout::Flat => pos,
            Layout::Wrapping => pos % capacity,
        }
    }
}

/// Wrapping: how near the records may come to chunks copied but not
/// yet durably before the writer commits the store durably (at most; a
/// 128th of a smaller log). Well within where copying between batches keeps the
/// chunks copied ([`Wal::copy_budget`]): a producer that leaves the
/// writer no idle time has the store committed durably every time the
/// records go that difference further (10 MiB; at a smaller difference,
/// a durable commit after nearly every batch).
const DURABLE_COMMIT_AHEAD: u64 = 2 * 1024 * 1024;

/// What [`ZERO_STEP`] is written from, a piece at a time.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The largest record buffer kept for reuse: a full batch's (4 MiB of
/// payload) and its frames' heads.
const SPARE_MAX: usize = 5 * 1024 * 1024;

/// The log file, open for appending records.
#[derive(Debug)]
pub struct Wal {
    file: Arc<dyn FileIo>,
    path: Arc<PathBuf>,
    capacity: u64,
    /// Where the next record goes.
    pos: u64,
    /// The file's length: bytes up to here exist on disk (records, old
    /// records or zeros), so writing there changes no metadata.
    filled: u64,
    /// The number the next record gets.
    next_number: u64,
    /// Since when the log has held a record the store may not hold
    /// durably: from the first append (or replay) after a restart.
    holding_since: Option<Instant>,
    written: Arc<AtomicU64>,
    /// The last record's buffer, kept for the next: a record is often
    /// hundreds of KiB, and growing a fresh one each time cost page faults.
    spare: Option<RecordBuf>,
    /// Whether the log wraps its file, keeping chunks for the store:
    /// flat until [`Wal::prepare`] decides.
    layout: Layout,
    /// Wrapping: the oldest position a chunk kept in the log may have,
    /// as the store holds durably. Records go no further than a lap ahead.
    tail: u64,
    /// Wrapping: how far the chunks kept in the log have been copied
    /// into the store, durably or not (at or after `tail`).
    copied: u64,
    /// The end of the last record whose writing began, for readers of
    /// chunks kept in the log (see [`LogReader::read`]).
    head: Arc<AtomicU64>,
}

impl Wal {
    /// Opens (or creates) the log at `path`, through `opener`. Appending
    /// starts at its beginning with `next_number` once [`Wal::restart`] is
    /// called; until then it holds what the last run left, for
    /// [`Wal::replay`].
    pub fn open(path: &Path, capacity: u64, opener: &dyn Opener) -> Result<Wal> {
        let file = opener
            .open(path)
            .map_err(|e| Error::io(format!("cannot open the log {}", path.display()), e))?;
        Self::over(file, path, capacity)
    }

    /// Opens the log at `path` only to read it (`tetherd check`): nothing
    /// is created or written.
    pub fn open_read(path: &Path, capacity: u64, opener: &dyn Opener) -> Result<Wal> {
        let file = opener
            .open_read(path)
            .map_err(|e| Error::io(format!("cannot open the log {}", path.display()), e))?;
        Self::over(file, path, capacity)
    }

    fn over(file: Arc<dyn FileIo>, path: &Path, capacity: u64) -> Result<Wal> {
        let filled = file
            .len()
            .map_err(|e| Error::io(format!("cannot read the log {}", path.display()), e))?;
        Ok(Wal {
            filled,
            file,
            path: Arc::new(path.to_path_buf()),
            capacity: capacity.max(HEADER_LEN as u64 + 1),
            pos: 0,
            next_number: 1,
            holding_since: None,
            written: Arc::new(AtomicU64::new(0)),
            spare: None,
            layout: Layout::Flat,
            tail: 0,
            copied: 0,
            head: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The log's size: where it wraps.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Whether the log wraps its file, keeping chunks for the store
    /// (decided by [`Wal::prepare`]).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An empty record to build, reusing the last one's buffer.
    pub fn take_buf(&mut self) -> RecordBuf {
        match self.spare.take() {
            Some(mut record) => {
                record.clear();
                record
            }
            None => RecordBuf::new(),
        }
    }

    /// Keeps `record`'s buffer for the next one, unless it grew unusually
    /// large (one huge frame), so that it holds no more memory than a
    /// usual batch's.
    pub fn give_back(&mut self, record: RecordBuf) {
        if record.bytes.capacity() <= SPARE_MAX {
            self.spare = Some(record);
        }
    }

    /// The number the next appended record gets.
    pub fn next_number(&self) -> u64 {
        self.next_number
    }

    /// The ticket of the last record appended.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Since when the log has held commits the store may not hold durably
    /// (appended or replayed since the last restart); `None` when empty.
    pub fn holding_since(&self) -> Option<Instant> {
        self.holding_since
    }

    /// Empties the log; the next record gets `next_number`. Only after a
    /// durable commit: what was appended before is then no longer needed.
    ///
    /// Appending starts again at the file's beginning, over the records
    /// already there (a replay stops at the first of them: its number is
    /// lower). Keeping the file's blocks spares the next run through it
    /// the zeros written ahead, which every sync would also have to write
    /// out. But where free space is short the file is cut to nothing, so
    /// that the log holds no disk space the store might need (on a full
    /// disk the next append is refused at once, rather than taken into
    /// space the log had reserved).
    pub fn restart(&mut self, next_number: u64) -> Result<()> {
        let cut = self.filled > 0 && !self.space_to_spare();
        self.start_at(next_number, cut)
    }

    /// Empties the log and its file, for a new store: the records a store
    /// that was removed left in it are not this one's, and its numbers
    /// start again from 1, so they could follow the new records.
    pub fn discard(&mut self) -> Result<()> {
        self.start_at(1, true)
    }

    fn start_at(&mut self, next_number: u64, cut: bool) -> Result<()> {
        if cut && self.filled > 0 {
            self.filled = 0;
            self.file.set_len(0).map_err(|e| {
                Error::io(format!("cannot empty the log {}", self.path.display()), e)
            })?;
        } else if self.pos > 0 {
            // The file is kept: zeros over the first record's header end
            // the next replay at once, instead of after reading (and
            // checking) every record of the run before, all of them held
            // by the store. Not synced: if a crash loses them, that replay
            // reads those records and applies none.
            self.file
                .write_all_at(&ZEROS[..HEADER_LEN], 0)
                .map_err(|e| {
                    Error::io(format!("cannot empty the log {}", self.path.display()), e)
                })?;
        }
        self.pos = 0;
        self.next_number = next_number;
        self.holding_since = None;
        Ok(())
    }

    /// Fills the file with zeros to the log's capacity and syncs it, when
    /// the filesystem has room to spare for it (see [`Wal::restart`]).
    /// Called when the store is opened: every sync then overwrites blocks
    /// already in place, where zeros written ahead while appending made a
    /// new store's first pass through the log write every byte twice (W1
    /// on a new store, four alternated pairs: e2e p99 1.6–2.1 against
    /// 2.5–3.4 ms, and a higher rate in three).
    ///
    /// A log whose file is then its whole capacity wraps it (see
    /// "Wrapping" in the module docs) for as long as it is open.
    pub fn prepare(&mut self) -> Result<()> {
        if self.filled < self.capacity && self.space_to_spare() {
            let capacity = self.capacity;
            self.fill_to(capacity)?;
            self.file.sync_data().map_err(|e| {
                Error::io(format!("cannot prepare the log {}", self.path.display()), e)
            })?;
        }
        self.layout = if self.is_filled() {
            Layout::Wrapping
        } else {
            Layout::Flat
        };
        Ok(())
    }

    /// Whether the file is filled to its capacity, so that the log wraps
    /// once prepared: from a store's opening on, its records stay
    /// where they are until copying has passed them.
    pub fn is_filled(&self) -> bool {
        self.filled >= self.capacity
    }

    /// Whether the filesystem has room enough that the log may keep its
    /// file: [`KEEP_FILE_FREE`] times its capacity. No when that cannot be
    /// told.
    fn space_to_spare(&self) -> bool {
        self.file
            .free_space()
            .is_ok_and(|free| free >= self.capacity.saturating_mul(KEEP_FILE_FREE))
    }

    /// Goes on appending after the records a replay found (see
    /// [`Replayed`]), which the store does not hold durably yet.
    pub fn resume(&mut self, replayed: Replayed) {
        self.pos = replayed.end;
        self.next_number = replayed.last + 1;
        self.holding_since = Some(Instant::now());
        self.head.fetch_max(self.pos, Ordering::SeqCst);
    }

    /// Wrapping: goes on after a replay from `resume_at` (the store's
    /// durable mark), with chunks kept in the log from `tail` on. `held`:
    /// the replay applied records, which the store does not hold durably.
    pub fn resume_wrapping(&mut self, replayed: Replayed, resume_at: u64, tail: u64, held: bool) {
        self.pos = replayed.end;
        self.next_number = replayed.last + 1;
        self.tail = tail.min(resume_at);
        self.copied = self.tail;
        self.holding_since = held.then(Instant::now);
        self.head.fetch_max(self.pos, Ordering::SeqCst);
    }

    /// Wrapping from here on, for a store that did not: no chunk is
    /// kept in the log yet, and the next durable commit stores where it is.
    pub fn start_wrapping_here(&mut self) {
        self.tail = self.pos;
        self.copied = self.pos;
    }

    /// Wrapping: what a durable commit of the store records, (the last
    /// record it holds, where a replay starts, the oldest chunk the log
    /// keeps for it); `None` when not wrapping.
    pub fn durable_marks(&self) -> Option<(u64, u64, u64)> {
        (self.layout == Layout::Wrapping).then(|| (self.next_number - 1, self.pos, self.copied))
    }

    /// After a durable commit of the store (which stored
    /// [`Wal::durable_marks`]): no record is needed for a replay any more.
    /// Wrapping, the log goes on where it is, and the chunks copied
    /// into the store no longer hold the records back; otherwise it starts
    /// again (see [`Wal::restart`]).
    pub fn committed_durably(&mut self, next_number: u64) -> Result<()> {
        if self.layout == Layout::Flat {
            return self.restart(next_number);
        }
        self.tail = self.copied;
        self.holding_since = None;
        Ok(())
    }

    /// [`COPY_AHEAD`] for this log's capacity.
    pub fn copy_ahead(&self) -> u64 {
        COPY_AHEAD.min(self.capacity / 16)
    }

    /// How far ahead of the records copying is kept between batches:
    /// three quarters of [`Wal::copy_ahead`].
    fn between_batches_ahead(&self) -> u64 {
        self.copy_ahead() / 4 * 3
    }

    /// Wrapping: how many bytes of records to copy chunks from now (0
    /// for none), at `pace`. Idle, a piece of what brings the copying
    /// [`COPY_AHEAD`] ahead of the records; between batches, only once
    /// the records are within three quarters of that, what brings it
    /// back there and a piece more.
    pub fn copy_budget(&self, pace: CopyPace) -> u64 {
        if self.layout == Layout::Flat {
            return 0;
        }
        let piece = COPY_PIECE.min(self.capacity / 256);
        let kept_until = self.copied + self.capacity;
        match pace {
            CopyPace::Idle => (self.pos + self.copy_ahead())
                .saturating_sub(kept_until)
                .min(piece),
            CopyPace::BetweenBatches => {
                match (self.pos + self.between_batches_ahead()).checked_sub(kept_until) {
                    Some(behind) if behind > 0 => behind + piece,
                    _ => 0,
                }
            }
        }
    }

    /// Wrapping: whether a durable commit would let the records go on further,
    /// and they are getting near the chunks the log still keeps.
    pub fn wants_durable_commit(&self) -> bool {
        self.layout == Layout::Wrapping
            && self.copied > self.tail
            && self.pos + DURABLE_COMMIT_AHEAD.min(self.capacity / 128) > self.tail + self.capacity
    }

    /// Shows `each` the records from where copying stopped on, as (their
    /// position, body), about `budget` bytes of them (never past the last
    /// record appended), and returns where that ends: the caller copies
    /// the chunks they keep for the store and then calls
    /// [`Wal::copied_to`]. A position with no record is the end of its
    /// lap: the next record went to the file's start.
    pub fn records_to_copy(
        &self,
        budget: u64,
        mut each: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<u64> {
        let mut at = self.copied;
        let stop = self.copied.saturating_add(budget).min(self.pos);
        let mut body = Vec::new();
        while at < stop {
            let physical = at % self.capacity;
            match self.read_record(physical, &mut body)? {
                Record::Valid { end, .. } => {
                    each(at, &body)?;
                    at += end - physical;
                }
                Record::Damaged { .. } | Record::None => {
                    at = self.next_lap(at).min(self.pos);
                }
            }
        }
        Ok(at)
    }

    /// Chunks kept in records before `at` are in the store now (not yet
    /// durably: [`Wal::committed_durably`] lets the records go over them).
    pub fn copied_to(&mut self, at: u64) {
        self.copied = self.copied.max(at);
    }

    /// Where a record of `len` bytes would start if appended now: after
    /// the last one, or, wrapping, at the start of the file's next lap
    /// when it does not fit before the file's end; `None` when the log
    /// has no room for it (before its end, or, wrapping, a lap ahead
    /// of the chunks it still keeps for the store).
    pub fn place(&self, len: u64) -> Option<u64> {
        if self.layout == Layout::Flat {
            return (self.pos + len <= self.capacity).then_some(self.pos);
        }
        let start = if self.pos % self.capacity + len <= self.capacity {
            self.pos
        } else {
            self.next_lap(self.pos)
        };
        (start + len <= self.tail + self.capacity).then_some(start)
    }

    /// Wrapping: where the file's next lap after position `pos` starts.
    fn next_lap(&self, pos: u64) -> u64 {
        pos - pos % self.capacity + self.capacity
    }

    /// Appends `record` as the next numbered record (not synced), at
    /// [`Wal::place`]. Returns its ticket. The caller checked that it has
    /// a place. A record that fails to be written gives its number back.
    pub fn append(&mut self, record: &mut RecordBuf) -> Result<u64> {
        let appended = self.append_numbered(record);
        if appended.is_err() {
            // The transaction it describes is not committed: the number
            // goes to the next record, so that the log's numbers keep
            // following the store's.
            self.next_number -= 1;
        }
        appended
    }

    fn append_numbered(&mut self, record: &mut RecordBuf) -> Result<u64> {
        let number = self.next_number;
        self.next_number += 1;
        let len = record.len() as u64;
        let start = self
            .place(len)
            .ok_or_else(|| Error::Invariant("a log record with no room left in the log".into()))?;
        if self.layout == Layout::Flat && start + len > self.filled {
            self.fill_to(start + len)?;
        }
        let bytes = record.seal(number)?;
        // Before the bytes change: a reader of a chunk kept there checks
        // this after reading (see `LogReader::read`).
        self.head.fetch_max(start + len, Ordering::SeqCst);
        let physical = self.layout.file_offset(start, self.capacity);
        self.file
            .write_all_at(bytes, physical)
            .map_err(|e| self.write_error(e))?;
        self.pos = start + len;
        self.holding_since.get_or_insert_with(Instant::now);
        Ok(self.written.fetch_add(len, Ordering::AcqRel) + len)
    }

    /// Writes zeros from the end of the file to at least `end` (a step
    /// more, within the capacity).
    fn fill_to(&mut self, end: u64) -> Result<()> {
        let target = end.max(self.filled + ZERO_STEP).min(self.capacity).max(end);
        while self.filled < target {
            let piece = (target - self.filled).min(ZEROS.len() as u64) as usize;
            self.file
                .write_all_at(&ZEROS[..piece], self.filled)
                .map_err(|e| self.write_error(e))?;
            self.filled += piece as u64;
        }
        Ok(())
    }

    fn write_error(&self, e: io::Error) -> Error {
        Error::write_failed(
            format!("cannot append to the log {}", self.path.display()),
            e,
        )
    }
}
