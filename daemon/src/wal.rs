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
//! made durable itself (a *persist*: when the log is full, when the writer
//! is idle, on close, and for any transaction the log cannot describe);
//! after that no record is needed for a replay.
//!
//! # Records
//!
//! `[body length u32 LE][CRC-32 u32 LE of number and body][number u64 LE][body]`.
//! The body is the transaction's changes as postcard [`Op`]s, each one
//! absolute (a value put, a key or key range removed), never relative to
//! what was there. Records are numbered one after another, across persists.
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
//! without durability: they stay in the log until the next persist). The
//! first record must be at most one above the
//! stored number: if it is further on, records are missing, and the store
//! is refused as corrupt rather than opened with a hole.
//!
//! # Going round
//!
//! A log whose file was filled to its capacity when the store opened
//! ([`Wal::prepare`]; not where free space is short) goes round that
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
//! [`PERSIST_AHEAD`], it persists, and the tail moves up to where copying
//! reached. A full log still takes a commit, durably, copying a stretch
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
//! them. A store that changes between going round and not (free space)
//! is persisted on opening, so that its marks always say how its log was
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

use serde::{Deserialize, Serialize};

use crate::store_io::{FileIo, Opener};
use crate::{Error, Result};

/// The log's size: where it goes round, or (not going round) where a
/// persist starts it again from its beginning. A persist stalls the
/// writer for a few ms (W1's p99 was 2.2–2.8 ms with 64 MiB, four
/// persists per million 256-byte frames, and 1.6–2.0 ms with 256 MiB,
/// one); a replay after a crash reads at most this much (800k frames
/// replayed and served in 0.5 s), and a burst of frames up to about
/// this much is written once.
pub const DEFAULT_CAPACITY: u64 = 256 * 1024 * 1024;

/// Bytes before a record's body: length, checksum, number.
pub const HEADER_LEN: usize = 16;

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

/// Going round: how far ahead of the records the chunks kept in the log
/// are copied into the store, at most (a sixteenth of a smaller log).
/// Small, so that a burst shorter than a lap less this is written once
/// (W1's million frames are about a lap); big enough for the copying to
/// keep ahead in idle time, and for a writer with none to persist seldom
/// (see [`PERSIST_AHEAD`]; at 8 MiB, a sustained W2 ran a sixth slower).
const COPY_AHEAD: u64 = 16 * 1024 * 1024;

/// Going round: the records copied from in one step of copying (at most;
/// a 256th of a smaller log). Small, so that a command arriving while the
/// writer copies in idle time waits little, and copying pressed between
/// batches holds each batch up a little rather than a few a lot.
const COPY_PIECE: u64 = 128 * 1024;

/// When chunks kept in the log are copied into the store (see
/// [`Wal::copy_budget`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPace {
    /// The writer has nothing else to do: a piece at a time.
    Idle,
    /// Between batches: only as much as the records press for.
    Pressed,
}

/// How the log lays its records out in its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// From the file's start on, up to its capacity at most; a persist
    /// starts the log again from its start, and the store holds every
    /// chunk itself.
    Flat,
    /// *Going round*: the file is reused in laps, positions count every
    /// lap, and the records keep the chunks' bytes for the store (see
    /// "Going round" in the module docs).
    Round,
}

impl Layout {
    /// The layout that the store's marks say the log was written in: only
    /// going round do they say where the next record went (`resume`).
    pub fn of_resume(resume: Option<u64>) -> Layout {
        match resume {
            Some(_) => Layout::Round,
            None => Layout::Flat,
        }
    }

    /// Where the byte at log position `pos` is in a file of `capacity`.
    pub fn file_offset(self, pos: u64, capacity: u64) -> u64 {
        match self {
            Layout::Flat => pos,
            Layout::Round => pos % capacity,
        }
    }
}

/// Going round: how near the records may come to chunks copied but not
/// yet durably before the writer persists the store (at most; a 128th of
/// a smaller log). Well within where copying between batches keeps the
/// chunks copied ([`Wal::copy_budget`]): a producer that leaves the
/// writer no idle time has the store persisted every time the records
/// go that difference further (10 MiB; at a smaller difference, a
/// persist after nearly every batch).
const PERSIST_AHEAD: u64 = 2 * 1024 * 1024;

/// What [`ZERO_STEP`] is written from, a piece at a time.
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

/// The largest record buffer kept for reuse: a full batch's (4 MiB of
/// payload) and its frames' heads.
const SPARE_MAX: usize = 5 * 1024 * 1024;

/// One change a logged transaction made, as it is replayed.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    /// A stream's metadata, as stored (postcard `StreamMeta`).
    Stream { name: &'a str, meta: RawBytes<'a> },
    /// A chunk of frames, as stored.
    Chunk {
        stream_id: u64,
        first_seq: u64,
        chunk: RawBytes<'a>,
    },
    /// Every chunk of a stream keyed below `below` removed.
    RemoveChunksBelow { stream_id: u64, below: u64 },
    /// A producer's dedupe state.
    Producer {
        stream_id: u64,
        producer: &'a str,
        producer_seq: u64,
        seq: u64,
    },
    /// A durable consumer's ack.
    Consumer {
        stream_id: u64,
        consumer: &'a str,
        acked_through: u64,
    },
    /// The id the next new stream gets.
    NextStreamId(u64),
}

/// Bytes written by postcard as one length-prefixed run, not as a sequence
/// of numbers (the same bytes on the wire, a memcpy instead of a loop).
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct RawBytes<'a>(pub &'a [u8]);

impl Serialize for RawBytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawBytes<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        <&'a [u8]>::deserialize(d).map(RawBytes)
    }
}

/// A record being built: the header's room, then the ops.
#[derive(Debug)]
pub struct RecordBuf {
    bytes: Vec<u8>,
}

impl Default for RecordBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordBuf {
    pub fn new() -> Self {
        Self {
            bytes: vec![0; HEADER_LEN],
        }
    }

    /// Empties the record, keeping its buffer.
    fn clear(&mut self) {
        self.bytes.clear();
        self.bytes.resize(HEADER_LEN, 0);
    }

    /// Appends one op to the body.
    pub fn push(&mut self, op: &Op<'_>) -> Result<()> {
        let bytes = std::mem::take(&mut self.bytes);
        self.bytes = postcard::to_extend(op, bytes)
            .map_err(|e| Error::storage("cannot encode a log record", e))?;
        Ok(())
    }

    /// Whether no op was pushed (an op is never encoded as nothing).
    pub fn is_empty(&self) -> bool {
        self.bytes.len() == HEADER_LEN
    }

    /// The record's length with its header.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Fills in the header for record `number` and returns the record.
    fn seal(&mut self, number: u64) -> Result<&[u8]> {
        let body_len = u32::try_from(self.bytes.len() - HEADER_LEN)
            .map_err(|_| Error::Invariant("a log record over 4 GiB".into()))?;
        self.bytes[8..16].copy_from_slice(&number.to_le_bytes());
        let crc = crc32fast::hash(&self.bytes[8..]);
        self.bytes[0..4].copy_from_slice(&body_len.to_le_bytes());
        self.bytes[4..8].copy_from_slice(&crc.to_le_bytes());
        Ok(&self.bytes)
    }
}

/// Decodes the ops of a record's body, in order.
pub fn ops(body: &[u8]) -> impl Iterator<Item = Result<Op<'_>>> {
    let mut rest = body;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match postcard::take_from_bytes::<Op<'_>>(rest) {
            Ok((op, tail)) => {
                rest = tail;
                Some(Ok(op))
            }
            Err(e) => {
                rest = &[];
                Some(Err(Error::storage(
                    "a log record's change cannot be decoded",
                    e,
                )))
            }
        }
    })
}

/// Where a replay stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// The number of the last record read, or the applied one if that is
    /// further.
    pub last: u64,
    /// Where the records read end.
    pub end: u64,
    /// The record the replay stopped at when it failed its check although
    /// the record after it passes: (its number, where it starts). A
    /// crash can leave that (the kernel wrote the later record's page
    /// first, and neither was synced, so neither was acknowledged), and so
    /// can damage to a synced log: the store warns either way.
    pub stopped_before: Option<(u64, u64)>,
    /// The record due when the replay ended, when it was there but failed
    /// its check (its number, where it starts), rather than the log simply
    /// ending (zeros, the file's end, an older record). A crash that cut
    /// the last write short leaves that; so does damage, which then shows
    /// as a valid later record somewhere after it ([`Wal::find_valid_after`]).
    pub ended_at_damage: Option<(u64, u64)>,
}

/// What the bytes at a position of the log hold.
enum Record {
    /// A record whose check passes.
    Valid { number: u64, end: u64 },
    /// A header that could start a record (its length fits the log) but
    /// whose body is cut short or fails the check.
    Damaged { number: u64, end: u64 },
    /// Zeros, the end of the file, or a length past the log's end.
    None,
}

/// What the syncer needs to make appended records durable: the file, and
/// how many bytes were ever appended (a record's *ticket* is that count
/// just after it).
#[derive(Clone, Debug)]
pub struct SyncHandle {
    file: Arc<dyn FileIo>,
    written: Arc<AtomicU64>,
    path: Arc<PathBuf>,
    /// The store's file, read-only, to start its writeback early.
    store: Option<Arc<dyn FileIo>>,
}

impl SyncHandle {
    /// Syncs everything appended so far; returns the ticket it covers.
    pub fn sync(&self) -> io::Result<u64> {
        let covered = self.written.load(Ordering::Acquire);
        self.file.sync_data()?;
        Ok(covered)
    }

    /// Asks the kernel to start writing the store's dirty pages out, and
    /// returns without waiting for them. The store is made durable only by
    /// a persist, which then has little left to write: without this, a
    /// persist after a full log wrote tens of MiB while the writer waited.
    /// Harmless at any moment: the kernel may write those pages whenever it
    /// likes anyway, and the store's own commit protocol allows for it.
    pub fn start_store_writeback(&self) {
        if let Some(store) = &self.store {
            if let Err(e) = store.start_writeback() {
                tracing::debug!("starting the store's writeback failed: {e}");
            }
        }
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle over any file, as if `written` bytes had been appended
    /// to it: for tests of what happens when syncing it fails.
    #[cfg(test)]
    pub fn over(file: Arc<dyn FileIo>, path: &Path, written: u64) -> SyncHandle {
        SyncHandle {
            file,
            written: Arc::new(AtomicU64::new(written)),
            path: Arc::new(path.to_path_buf()),
            store: None,
        }
    }
}

/// Reads chunks the log keeps for the store (see "Going round" in the
/// module docs), from any thread.
#[derive(Clone, Debug)]
pub struct LogReader {
    file: Arc<dyn FileIo>,
    path: Arc<PathBuf>,
    capacity: u64,
    head: Arc<AtomicU64>,
}

impl LogReader {
    /// Reads the `len` bytes kept at position `at` into `buf`. Returns
    /// false when the records may since have gone over them: the store
    /// had copied them by then, and a read of a newer snapshot finds them
    /// there. (The writer raises the head before it writes, and this
    /// looks at it after reading, like a sequence lock.)
    pub fn read(&self, at: u64, len: usize, buf: &mut Vec<u8>) -> Result<bool> {
        let physical = at % self.capacity;
        if physical + len as u64 > self.capacity {
            return Err(Error::Invariant(format!(
                "a chunk kept in the log {} at {at} ({len} bytes) would pass its end",
                self.path.display()
            )));
        }
        buf.clear();
        buf.resize(len, 0);
        self.file.read_exact_at(buf, physical).map_err(|e| {
            Error::io(
                format!(
                    "cannot read a chunk kept in the log {}",
                    self.path.display()
                ),
                e,
            )
        })?;
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(self.head.load(Ordering::SeqCst) <= at + self.capacity)
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

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
    /// Whether the log goes round its file, keeping chunks for the store:
    /// flat until [`Wal::prepare`] decides.
    layout: Layout,
    /// Going round: the oldest position a chunk kept in the log may have,
    /// as the store holds durably. Records go no further than a lap ahead.
    tail: u64,
    /// Going round: how far the chunks kept in the log have been copied
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

    /// The log's size: where it goes round.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Reads chunks kept in the log, from any thread.
    pub fn reader(&self) -> LogReader {
        LogReader {
            file: self.file.clone(),
            path: self.path.clone(),
            capacity: self.capacity,
            head: self.head.clone(),
        }
    }

    /// Whether the log goes round its file, keeping chunks for the store
    /// (decided by [`Wal::prepare`]).
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// For the syncer.
    /// `store` is the store's file (see [`SyncHandle::start_store_writeback`]).
    pub fn sync_handle(&self, store: Option<Arc<dyn FileIo>>) -> SyncHandle {
        SyncHandle {
            file: self.file.clone(),
            written: self.written.clone(),
            path: self.path.clone(),
            store,
        }
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
    /// persist: what was appended before is then no longer needed.
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
    /// A log whose file is then its whole capacity goes round it (see
    /// "Going round" in the module docs) for as long as it is open.
    pub fn prepare(&mut self) -> Result<()> {
        if self.filled < self.capacity && self.space_to_spare() {
            let capacity = self.capacity;
            self.fill_to(capacity)?;
            self.file.sync_data().map_err(|e| {
                Error::io(format!("cannot prepare the log {}", self.path.display()), e)
            })?;
        }
        self.layout = if self.is_filled() {
            Layout::Round
        } else {
            Layout::Flat
        };
        Ok(())
    }

    /// Whether the file is filled to its capacity, so that the log goes
    /// round once prepared: from a store's opening on, its records stay
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

    /// Going round: goes on after a replay from `resume_at` (the store's
    /// durable mark), with chunks kept in the log from `tail` on. `held`:
    /// the replay applied records, which the store does not hold durably.
    pub fn resume_round(&mut self, replayed: Replayed, resume_at: u64, tail: u64, held: bool) {
        self.pos = replayed.end;
        self.next_number = replayed.last + 1;
        self.tail = tail.min(resume_at);
        self.copied = self.tail;
        self.holding_since = held.then(Instant::now);
        self.head.fetch_max(self.pos, Ordering::SeqCst);
    }

    /// Going round from here on, for a store that did not: no chunk is
    /// kept in the log yet, and the next persist stores where it is.
    pub fn start_round_here(&mut self) {
        self.tail = self.pos;
        self.copied = self.pos;
    }

    /// Going round: what a durable commit of the store records, (the last
    /// record it holds, where a replay starts, the oldest chunk the log
    /// keeps for it); `None` when not going round.
    pub fn durable_marks(&self) -> Option<(u64, u64, u64)> {
        (self.layout == Layout::Round).then(|| (self.next_number - 1, self.pos, self.copied))
    }

    /// After a durable commit of the store (which stored
    /// [`Wal::durable_marks`]): no record is needed for a replay any more.
    /// Going round, the log goes on where it is, and the chunks copied
    /// into the store no longer hold the records back; otherwise it starts
    /// again (see [`Wal::restart`]).
    pub fn persisted(&mut self, next_number: u64) -> Result<()> {
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
    fn pressed_ahead(&self) -> u64 {
        self.copy_ahead() / 4 * 3
    }

    /// Going round: how many bytes of records to copy chunks from now (0
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
            CopyPace::Pressed => match (self.pos + self.pressed_ahead()).checked_sub(kept_until) {
                Some(behind) if behind > 0 => behind + piece,
                _ => 0,
            },
        }
    }

    /// Going round: whether a persist would let the records go on further,
    /// and they are getting near the chunks the log still keeps.
    pub fn wants_persist(&self) -> bool {
        self.layout == Layout::Round
            && self.copied > self.tail
            && self.pos + PERSIST_AHEAD.min(self.capacity / 128) > self.tail + self.capacity
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
    /// durably: [`Wal::persisted`] lets the records go over them).
    pub fn copied_to(&mut self, at: u64) {
        self.copied = self.copied.max(at);
    }

    /// Where a record of `len` bytes would start if appended now: after
    /// the last one, or, going round, at the start of the file's next lap
    /// when it does not fit before the file's end; `None` when the log
    /// has no room for it (before its end, or, going round, a lap ahead
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

    /// Going round: where the file's next lap after position `pos` starts.
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
        let context = format!("cannot append to the log {}", self.path.display());
        if crate::error::is_disk_full(&e) {
            Error::DiskFull {
                detail: format!("{context}: {e}"),
                source: Some(e.into()),
            }
        } else {
            Error::storage(context, e)
        }
    }

    /// Shows `apply` each record numbered above `applied`, in order, as
    /// (its number, its position, its body) (see the module docs for where
    /// the log ends). `from`: going round, where the store's durable mark
    /// says the record after `applied` went (it must be there, or at the
    /// start of the file's next lap); `None` reads from the file's start,
    /// skipping records the store holds.
    pub fn replay(
        &self,
        applied: u64,
        from: Option<u64>,
        mut apply: impl FnMut(u64, u64, &[u8]) -> Result<()>,
    ) -> Result<Replayed> {
        let layout = Layout::of_resume(from);
        let mut pos = from.unwrap_or(0);
        let mut last: Option<u64> = None;
        let mut body = Vec::new();
        let mut next_lap = Vec::new();
        let mut stopped_before = None;
        let mut ended_at_damage = None;
        loop {
            let due = last.map_or(applied + 1, |l| l + 1);
            let mut physical = layout.file_offset(pos, self.capacity);
            let mut found = self.read_record(physical, &mut body)?;
            if layout == Layout::Round
                && physical != 0
                && !matches!(found, Record::Valid { number, .. } if number == due)
            {
                // A record that did not fit before the file's end went to
                // its start.
                if let Record::Valid { number, end } = self.read_record(0, &mut next_lap)? {
                    if number == due {
                        pos = self.next_lap(pos);
                        physical = 0;
                        found = Record::Valid { number, end };
                        std::mem::swap(&mut body, &mut next_lap);
                    }
                }
            }
            let (number, end) = match found {
                Record::Valid { number, .. } if last.is_some() && number != due => break,
                // Going round, an older record where the next was due is
                // the log's end.
                Record::Valid { number, .. } if layout == Layout::Round && number < due => break,
                Record::Valid { number, end } => (number, end),
                Record::Damaged { number, end } => {
                    // Reported only when it was the record due and the
                    // next one follows it: otherwise it is the log's end.
                    if number == due
                        && matches!(self.read_record(end, &mut body)?,
                            Record::Valid { number: next, .. } if next == number + 1)
                    {
                        stopped_before = Some((number, pos));
                    } else if number == due {
                        ended_at_damage = Some((number, pos));
                    }
                    break;
                }
                Record::None => break,
            };
            if last.is_none() && number > applied + 1 {
                return Err(Error::CorruptStore {
                    path: self.path.to_path_buf(),
                    detail: format!(
                        "the log starts at record {number}, but the store holds records \
                         through {applied} only: records are missing"
                    ),
                });
            }
            if number > applied {
                apply(number, pos, &body)?;
            }
            last = Some(number);
            pos += end - physical;
        }
        Ok(Replayed {
            last: last.map_or(applied, |l| l.max(applied)),
            end: pos,
            stopped_before,
            ended_at_damage,
        })
    }

    /// Reads the record at `pos` into `body`.
    fn read_record(&self, pos: u64, body: &mut Vec<u8>) -> Result<Record> {
        let mut header = [0u8; HEADER_LEN];
        if pos + HEADER_LEN as u64 > self.capacity || !self.read_exact_at(&mut header, pos)? {
            return Ok(Record::None);
        }
        let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let mut number_bytes = [0u8; 8];
        number_bytes.copy_from_slice(&header[8..16]);
        let number = u64::from_le_bytes(number_bytes);
        let end = pos + HEADER_LEN as u64 + u64::from(body_len);
        if body_len == 0 || end > self.capacity {
            return Ok(Record::None);
        }
        body.resize(body_len as usize, 0);
        if !self.read_exact_at(body, pos + HEADER_LEN as u64)? {
            return Ok(Record::Damaged { number, end });
        }
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&number_bytes);
        hasher.update(body);
        if hasher.finalize() != crc {
            return Ok(Record::Damaged { number, end });
        }
        Ok(Record::Valid { number, end })
    }

    /// Reads `buf.len()` bytes at `pos`; false at the end of the file.
    fn read_exact_at(&self, buf: &mut [u8], pos: u64) -> Result<bool> {
        match self.file.read_exact_at(buf, pos) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
            Err(e) => Err(Error::io(
                format!("cannot read the log {}", self.path.display()),
                e,
            )),
        }
    }
}

/// After a failed sync (see [`crate::degraded`]).
impl Wal {
    /// Writes the bytes the store may still need from the log again, as
    /// this process sees them, and syncs the file. After a failed
    /// `fdatasync` the kernel may have dropped the pages it could not
    /// write while still showing them to reads, so a later sync that
    /// succeeds says nothing about them: only writing them again makes
    /// them dirty, and so synced, once more. Going round, that is from the
    /// tail (the oldest chunk the store may name) to the records' end;
    /// otherwise from the file's start.
    pub fn rewrite(&self) -> Result<()> {
        let (from, to) = match self.layout {
            Layout::Flat => (0, self.pos),
            Layout::Round => (self.tail, self.pos),
        };
        let mut buf = vec![0u8; REWRITE_PIECE];
        let mut at = from;
        while at < to {
            let physical = self.layout.file_offset(at, self.capacity);
            // A piece never crosses the file's end: going round, the next
            // lap's bytes start again at 0.
            let room = match self.layout {
                Layout::Flat => u64::MAX,
                Layout::Round => self.capacity - physical,
            };
            let len = (to - at).min(REWRITE_PIECE as u64).min(room) as usize;
            let piece = &mut buf[..len];
            self.file
                .read_exact_at(piece, physical)
                .map_err(|e| self.rewrite_error("cannot read it back", e))?;
            self.file
                .write_all_at(piece, physical)
                .map_err(|e| self.rewrite_error("cannot write it again", e))?;
            at += len as u64;
        }
        self.file
            .sync_data()
            .map_err(|e| self.rewrite_error("cannot sync it", e))
    }

    /// A failure of [`Wal::rewrite`], worded as the syncer words a failed
    /// sync: `I/O error on FILE: what: ...`.
    fn rewrite_error(&self, what: &str, e: io::Error) -> Error {
        let context = format!("I/O error on {}: {what}", self.path.display());
        if crate::error::is_disk_full(&e) {
            Error::DiskFull {
                detail: format!("{context}: {e}"),
                source: Some(e.into()),
            }
        } else {
            Error::storage(context, e)
        }
    }
}

impl Wal {
    /// Makes sure a record of `bytes` can be written next: not going
    /// round, the file is filled with zeros past where it would end (as
    /// its append would), so that a full disk is found here rather than
    /// by a commit.
    pub fn make_room(&mut self, bytes: u64) -> Result<()> {
        if self.layout == Layout::Round {
            return Ok(());
        }
        let end = (self.pos + bytes).min(self.capacity);
        if end > self.filled {
            self.fill_to(end)?;
        }
        Ok(())
    }
}

/// Checks for damage (see `crate::store::verify`), reading only.
impl Wal {
    /// The bytes the log file holds.
    pub fn file_len(&self) -> u64 {
        self.filled
    }

    /// Where the byte at log position `pos` is in the file, laid out as
    /// `layout` (as the store's marks say: checks run before
    /// [`Wal::prepare`] decides it for this run).
    pub fn file_offset(&self, pos: u64, layout: Layout) -> u64 {
        layout.file_offset(pos, self.capacity)
    }

    /// Searches the file, from just after the record at position `pos` to
    /// where it comes back round (or its end), for a record that passes
    /// its check and is numbered above `above` (and not absurdly so):
    /// (its number, its byte in the file). Only asked after a record
    /// failed its check: a valid later record after it means the failed
    /// one was damaged rather than cut short by a crash, even when the
    /// damage hid where the next record starts. Reads the file in pieces;
    /// a candidate header is checked in full only when its number and
    /// length are plausible.
    pub fn find_valid_after(
        &self,
        pos: u64,
        above: u64,
        layout: Layout,
    ) -> Result<Option<(u64, u64)>> {
        self.find_valid_from(self.file_offset(pos, layout) + 1, above, layout)
    }

    /// [`Wal::find_valid_after`] from the file's byte `start` on, that
    /// byte included.
    fn find_valid_from(
        &self,
        start: u64,
        above: u64,
        layout: Layout,
    ) -> Result<Option<(u64, u64)>> {
        let end = self.filled.min(self.capacity);
        let ranges = match layout {
            Layout::Flat => vec![(start, end)],
            Layout::Round => vec![(start, end), (0, start.saturating_sub(1))],
        };
        let mut piece = vec![0u8; SCAN_PIECE + HEADER_LEN];
        let mut body = Vec::new();
        for (from, to) in ranges {
            let mut at = from;
            while at + HEADER_LEN as u64 <= to {
                let len = ((to - at) as usize).min(piece.len());
                if !self.read_exact_at(&mut piece[..len], at)? {
                    break;
                }
                let last_start = len.saturating_sub(HEADER_LEN).min(SCAN_PIECE - 1);
                let mut i = 0;
                while i <= last_start {
                    let header = &piece[i..i + HEADER_LEN];
                    if header[..4] == [0; 4] {
                        // A record's length is not 0, so one of its first
                        // four bytes is not either: skip zeros (a log
                        // filled ahead is mostly zeros) to three bytes
                        // before the next byte that is not.
                        let next = piece[i..=last_start + 3]
                            .iter()
                            .position(|&b| b != 0)
                            .map_or(last_start + 1, |n| i + n.saturating_sub(3).max(1));
                        i = next;
                        continue;
                    }
                    let body_len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                    let mut number = [0u8; 8];
                    number.copy_from_slice(&header[8..16]);
                    let number = u64::from_le_bytes(number);
                    let plausible = body_len > 0
                        && number > above
                        && number - above <= PLAUSIBLE_NUMBERS_AHEAD
                        && at + i as u64 + HEADER_LEN as u64 + u64::from(body_len) <= to;
                    if plausible {
                        let candidate = at + i as u64;
                        if let Record::Valid { number, .. } =
                            self.read_record(candidate, &mut body)?
                        {
                            return Ok(Some((number, candidate)));
                        }
                    }
                    i += 1;
                }
                at += SCAN_PIECE as u64;
            }
        }
        Ok(None)
    }

    /// Going round: checks that the records from `tail` (where the oldest
    /// chunk the store reads from the log is) up to `resume` (where the
    /// record after the last one the store holds goes) are whole and
    /// numbered one after another: the store reads their chunks. A record
    /// that did not fit before the file's end went to its start, leaving
    /// stale bytes behind it, which are not damage. Returns the byte of
    /// the file where a record is missing or fails its check.
    pub fn verify_kept(&self, tail: u64, resume: u64) -> Result<Option<u64>> {
        let mut at = tail;
        let mut expected: Option<u64> = None;
        let mut body = Vec::new();
        while at < resume {
            let physical = at % self.capacity;
            match self.read_record(physical, &mut body)? {
                Record::Valid { number, end } if expected.is_none_or(|e| e == number) => {
                    expected = Some(number + 1);
                    at += end - physical;
                }
                _ => {
                    // Stale bytes up to the file's end, if the next
                    // record is at the next lap's start.
                    let next = self.next_lap(at);
                    if next > resume {
                        return Ok(Some(physical));
                    }
                    match self.read_record(0, &mut body)? {
                        Record::Valid { number, end } if expected.is_none_or(|e| e == number) => {
                            expected = Some(number + 1);
                            at = next + end;
                        }
                        _ => return Ok(Some(physical)),
                    }
                }
            }
        }
        Ok(None)
    }
}

/// Records lost to damage, as [`Wal::salvage`] found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LostRecords {
    /// The first record number missing.
    pub first: u64,
    /// The last record number missing.
    pub last: u64,
    /// The bytes of the log they took: the most their frames can have been.
    pub bytes: u64,
}

/// What [`Wal::salvage`] read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Salvaged {
    /// The number of the last record read, or the applied one.
    pub last: u64,
    /// The records that were lost between those read, in order.
    pub lost: Vec<LostRecords>,
}

/// Reading past damage (`tetherd repair`).
impl Wal {
    /// Hands `apply` every record numbered above `applied` that passes its
    /// check, in order, as [`Wal::replay`] does from `from`, but going on
    /// past damage: after a record that fails its check (or where the
    /// log seems to end), the file is searched for a later record, and
    /// reading goes on from there. The records skipped are returned. A
    /// failing last record with nothing valid after it is a torn tail, as
    /// at start-up, and is not counted lost.
    pub fn salvage(
        &self,
        applied: u64,
        from: Option<u64>,
        mut apply: impl FnMut(u64, &[u8]) -> Result<()>,
    ) -> Result<Salvaged> {
        let mut salvaged = Salvaged {
            last: applied,
            lost: Vec::new(),
        };
        let mut from = from;
        loop {
            // Once a later record was found, reading goes on from it as
            // from a durable mark: going round.
            let layout = Layout::of_resume(from);
            let start = from.unwrap_or(0);
            // Where reading stopped, and the first byte that may hold a
            // later record.
            let (stopped, search) =
                match self.replay(salvaged.last, from, |number, _, body| apply(number, body)) {
                    Ok(replayed) => {
                        salvaged.last = replayed.last;
                        let at = replayed
                            .stopped_before
                            .or(replayed.ended_at_damage)
                            .map_or(replayed.end, |(_, at)| at);
                        let at = self.file_offset(at, layout);
                        (at, at + 1)
                    }
                    // The first record there is numbered past the one due:
                    // the records between are missing.
                    Err(Error::CorruptStore { .. }) => {
                        let at = self.file_offset(start, Layout::Round);
                        (at, at)
                    }
                    Err(e) => return Err(e),
                };
            let Some((number, at)) = self.find_valid_from(search, salvaged.last, layout)? else {
                return Ok(salvaged);
            };
            let bytes = if at > stopped {
                at - stopped
            } else {
                self.capacity - stopped + at
            };
            if number > salvaged.last + 1 {
                salvaged.lost.push(LostRecords {
                    first: salvaged.last + 1,
                    last: number - 1,
                    bytes,
                });
            }
            salvaged.last = number - 1;
            from = Some(at);
        }
    }
}

/// How much of the file [`Wal::find_valid_after`] reads at a time.
const SCAN_PIECE: usize = 1024 * 1024;

/// How far above the record that failed a later record's number may be
/// and still be taken for one (a header's number field is 8 bytes: any
/// bytes at all would otherwise pass as a number above it).
const PLAUSIBLE_NUMBERS_AHEAD: u64 = 1 << 32;

/// How much of the log [`Wal::rewrite`] reads and writes at a time.
const REWRITE_PIECE: usize = 1024 * 1024;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::store_io::OsOpener;

    fn record(ops: &[Op<'_>]) -> RecordBuf {
        let mut r = RecordBuf::new();
        for op in ops {
            r.push(op).unwrap();
        }
        r
    }

    fn read_all(wal: &Wal, applied: u64) -> Result<(u64, Vec<(u64, usize)>)> {
        let mut seen = Vec::new();
        let replayed = wal.replay(applied, None, |n, _, body| {
            seen.push((n, ops(body).count()));
            Ok(())
        })?;
        Ok((replayed.last, seen))
    }

    fn chunk(stream_id: u64, first_seq: u64, bytes: &[u8]) -> Op<'_> {
        Op::Chunk {
            stream_id,
            first_seq,
            chunk: RawBytes(bytes),
        }
    }

    #[test]
    fn records_come_back_in_order_from_above_the_applied_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.wal");
        let mut wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        wal.restart(5).unwrap();
        for i in 0..4u64 {
            let payload = vec![i as u8; 100];
            let mut r = record(&[chunk(1, i * 10 + 1, &payload), Op::NextStreamId(i)]);
            wal.append(&mut r).unwrap();
        }
        let wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        assert_eq!(
            read_all(&wal, 4).unwrap(),
            (8, vec![(5, 2), (6, 2), (7, 2), (8, 2)])
        );
        assert_eq!(read_all(&wal, 6).unwrap(), (8, vec![(7, 2), (8, 2)]));
        assert_eq!(read_all(&wal, 8).unwrap(), (8, vec![]));
        assert_eq!(read_all(&wal, 20).unwrap(), (20, vec![]));
        let err = read_all(&wal, 2).unwrap_err();
        assert!(
            err.to_string().contains("starts at record 5") && err.to_string().contains("through 2"),
            "{err}"
        );
    }

    #[test]
    fn ops_round_trip() {
        let meta = [1u8, 2, 3];
        let all = [
            Op::Stream {
                name: "s",
                meta: RawBytes(&meta),
            },
            chunk(3, 9, b"abc"),
            Op::RemoveChunksBelow {
                stream_id: 3,
                below: 7,
            },
            Op::Producer {
                stream_id: 3,
                producer: "p",
                producer_seq: 4,
                seq: 9,
            },
            Op::Consumer {
                stream_id: 3,
                consumer: "c",
                acked_through: 8,
            },
            Op::NextStreamId(4),
        ];
        let r = record(&all);
        let decoded: Vec<Op<'_>> = ops(&r.bytes[HEADER_LEN..]).collect::<Result<_>>().unwrap();
        assert_eq!(decoded, all);
    }

    const PAYLOAD: [u8; 300] = [7; 300];

    /// A log of 1 MiB in a new directory holding records 1 to 5, of one
    /// chunk each; with the directory and the log's path.
    fn five_records() -> (tempfile::TempDir, PathBuf, Wal) {
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
    fn salvage_reads_on_past_damaged_records_and_names_them() {
        let (_dir, path, written) = five_records();
        drop(written);
        let record_len = (HEADER_LEN + wal_body_len()) as u64;
        let flip = |at: u64| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut byte = [0u8];
            file.read_exact_at(&mut byte, at).unwrap();
            file.write_all_at(&[byte[0] ^ 0xff], at).unwrap();
        };
        // Record 2's body and record 4's length: both fail, and the
        // records after each are found by searching on.
        flip(record_len + HEADER_LEN as u64 + 10);
        flip(3 * record_len + 1);
        let wal = Wal::open(&path, 1 << 20, &OsOpener).unwrap();
        let mut seen = Vec::new();
        let salvaged = wal
            .salvage(0, None, |number, _| {
                seen.push(number);
                Ok(())
            })
            .unwrap();
        assert_eq!(seen, vec![1, 3, 5]);
        assert_eq!(
            salvaged,
            Salvaged {
                last: 5,
                lost: vec![
                    LostRecords {
                        first: 2,
                        last: 2,
                        bytes: record_len
                    },
                    LostRecords {
                        first: 4,
                        last: 4,
                        bytes: record_len
                    },
                ],
            }
        );
        // From above the applied record, nothing before it counts.
        let salvaged = wal.salvage(3, None, |_, _| Ok(())).unwrap();
        assert_eq!(salvaged.lost.len(), 1);
        assert_eq!(salvaged.last, 5);
    }

    /// The body length of each of [`five_records`]' records.
    fn wal_body_len() -> usize {
        record(&[chunk(1, 0, &PAYLOAD)]).len() - HEADER_LEN
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

    /// Flips one byte of the body of the `index`th of [`five_records`].
    fn damage_record(path: &Path, wal: &Wal, index: u64) -> u64 {
        let all = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(all.last, 5);
        let at = all.end / 5 * index;
        let file = OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(&[0xff], at + HEADER_LEN as u64 + 5)
            .unwrap();
        at
    }

    #[test]
    fn a_damaged_record_with_a_good_one_after_it_is_reported() {
        let (_dir, path, wal) = five_records();
        let at = damage_record(&path, &wal, 2);
        let replayed = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(replayed.last, 2);
        assert_eq!(replayed.end, at);
        assert_eq!(replayed.stopped_before, Some((3, at)));
    }

    #[test]
    fn a_damaged_last_record_is_a_torn_tail_and_not_reported() {
        let (_dir, path, wal) = five_records();
        let at = damage_record(&path, &wal, 4);
        let replayed = wal.replay(0, None, |_, _, _| Ok(())).unwrap();
        assert_eq!(
            replayed,
            Replayed {
                last: 4,
                end: at,
                stopped_before: None,
                ended_at_damage: Some((5, at)),
            }
        );
    }

    #[test]
    fn a_torn_or_stale_tail_ends_the_log() {
        let (_dir, path, mut wal) = five_records();
        // Two new records over the old ones, as after a crash whose replay
        // went on from the start.
        wal.resume(Replayed {
            last: 5,
            end: 0,
            stopped_before: None,
            ended_at_damage: None,
        });
        wal.append(&mut record(&[chunk(1, 50, &PAYLOAD)])).unwrap();
        wal.append(&mut record(&[chunk(1, 51, &PAYLOAD)])).unwrap();
        // The old third record follows them, numbered 3: not 8.
        assert_eq!(read_all(&wal, 5).unwrap(), (7, vec![(6, 1), (7, 1)]));

        // A torn second record: its last byte never made it.
        let second_end = wal.pos;
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[0xAA], second_end - 1).unwrap();
        assert_eq!(read_all(&wal, 5).unwrap(), (6, vec![(6, 1)]));
        // Zeros where nothing was written end it too.
        file.set_len(0).unwrap();
        file.set_len(4096).unwrap();
        assert_eq!(read_all(&wal, 5).unwrap(), (5, vec![]));
    }

    /// A log of 64 KiB going round, prepared as a store opens it.
    fn small_ring() -> (tempfile::TempDir, Wal) {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(&dir.path().join("t.wal"), 64 * 1024, &OsOpener).unwrap();
        wal.prepare().unwrap();
        assert_eq!(
            wal.layout(),
            Layout::Round,
            "a temporary directory has room to spare"
        );
        wal.start_round_here();
        (dir, wal)
    }

    /// A record of one chunk of `len` bytes, each `byte`.
    fn sized(len: usize, byte: u8) -> RecordBuf {
        let bytes = vec![byte; len];
        record(&[chunk(1, u64::from(byte), &bytes)])
    }

    #[test]
    fn going_round_a_record_that_does_not_fit_goes_to_the_files_start() {
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
        wal.persisted(4).unwrap();
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
    fn copying_waits_for_idle_time_until_the_records_press() {
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
        assert_eq!(wal.copy_budget(CopyPace::Pressed), 0);
        // Within COPY_AHEAD: a piece at a time, in idle time only.
        append_until(&mut wal, ahead);
        let wanted = wal.pos + ahead - capacity;
        assert_eq!(wal.copy_budget(CopyPace::Idle), wanted.min(piece));
        assert_eq!(wal.copy_budget(CopyPace::Pressed), 0);
        // Within three quarters of it, between batches too: what brings
        // the copying back there, and a piece more.
        let pressed = ahead / 4 * 3;
        append_until(&mut wal, pressed);
        let behind = wal.pos + pressed - capacity;
        assert_eq!(wal.copy_budget(CopyPace::Pressed), behind + piece);
        let to = wal.records_to_copy(behind + piece, |_, _| Ok(())).unwrap();
        wal.copied_to(to);
        assert_eq!(wal.copy_budget(CopyPace::Pressed), 0);
        assert!(
            wal.copy_budget(CopyPace::Idle) > 0,
            "idle time copies on up to COPY_AHEAD ahead"
        );
        // Not going round: nothing is ever copied.
        let dir = tempfile::tempdir().unwrap();
        let mut flat = Wal::open(&dir.path().join("f.wal"), capacity, &OsOpener).unwrap();
        for _ in 0..100 {
            flat.append(&mut sized(500, 1)).unwrap();
        }
        assert_eq!(flat.copy_budget(CopyPace::Idle), 0);
        assert_eq!(flat.copy_budget(CopyPace::Pressed), 0);
    }

    #[test]
    fn a_producer_that_leaves_no_idle_time_has_the_store_persisted_every_few_records() {
        // As the writer tends the log between batches, with no idle time
        // to copy in: two laps of 500-byte records.
        let (_dir, mut wal) = small_ring();
        let (mut records, mut persists) = (0, 0);
        while wal.pos < 3 * 64 * 1024 {
            let mut r = sized(500, 1);
            assert!(wal.place(r.len() as u64).is_some(), "the log ran full");
            wal.append(&mut r).unwrap();
            records += 1;
            let budget = wal.copy_budget(CopyPace::Pressed);
            if budget > 0 {
                let to = wal.records_to_copy(budget, |_, _| Ok(())).unwrap();
                wal.copied_to(to);
            }
            if wal.wants_persist() {
                wal.persisted(wal.next_number()).unwrap();
                persists += 1;
            }
        }
        assert!(persists > 0);
        assert!(
            records >= 4 * persists,
            "{persists} persists for {records} records"
        );
    }

    #[test]
    fn a_reader_is_told_when_the_records_went_over_what_it_read() {
        let (_dir, mut wal) = small_ring();
        let reader = wal.reader();
        wal.append(&mut sized(1000, 9)).unwrap();
        let mut buf = Vec::new();
        assert!(reader.read(100, 10, &mut buf).unwrap());
        assert_eq!(buf, vec![9; 10]);
        // Records a lap on, over the same bytes.
        let mut at = wal.pos;
        while at < 64 * 1024 + 200 {
            wal.copied_to(wal.pos);
            wal.persisted(wal.next_number()).unwrap();
            wal.append(&mut sized(1000, 8)).unwrap();
            at = wal.pos;
        }
        assert!(!reader.read(100, 10, &mut buf).unwrap());
        // A read past the file's end is refused, naming the log.
        let err = reader.read(64 * 1024 - 5, 10, &mut buf).unwrap_err();
        assert!(err.to_string().contains("t.wal"), "{err}");
    }
}
