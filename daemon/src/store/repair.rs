//! `tetherd repair`: the one way past damage. It copies the store's files
//! to `damaged-<UTC time>/`, builds a new store from every record that
//! verifies (the store file's tables, then the log's records, read on past
//! damage), records each seq range lost so that readers get a gap notice
//! over it, and puts the new files in place of the old ones.
//!
//! A seq is never given twice: each stream goes on above every seq that a
//! surviving record or consumer ack names. Where log records were lost
//! after the last one naming a stream, its last seq is unknown: it skips
//! ahead by the most frames the lost bytes could hold, and that range is
//! recorded lost too.
//!
//! The new store is built in `repair.new/` beside the old one; a `done`
//! file there says it is whole, and only then are the files renamed into
//! place. A repair stopped before that leaves the old files as they were;
//! one stopped while renaming is finished by the next `tetherd repair`,
//! and the daemon refuses to start meanwhile.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::backup::{copy_aside, create_private_dir, io_error, sync_dir, write_synced};
use super::chunk::{chunk_bytes, ChunkIter};
use super::schema::{
    StreamMeta, CHECKPOINTS, CHUNKS, CONSUMERS, EXECUTIONS, INBOX, LOST, META,
    META_NEXT_MESSAGE_ID, META_NEXT_QUESTION_ID, META_NEXT_STREAM_ID, PRODUCERS, QUESTIONS, STEPS,
    STEP_TIMES, STREAMS, TOMBSTONES,
};
use super::txn::commit;
use super::verify::{read_marks, LogMarks};
use super::{check, guard_db, storage, Store, STORE_FILE};
use crate::error::Damage;
use crate::lock::StateLock;
use crate::store_io::OsOpener;
use crate::wal::{self, LogReader, Op, Wal};
use crate::{Error, Result};
use changes::Change;

mod changes;

/// Where the new store is built.
const NEW_DIR: &str = "repair.new";

/// In [`NEW_DIR`]: the new store is whole and goes into place; it holds
/// the repair's report.
const DONE: &str = "done";

/// The fewest bytes of a log record that one frame takes (its head in a
/// chunk: a time, a kind and a length, a byte each at least). Lost bytes
/// held at most their count over this many frames.
const MIN_FRAME_BYTES: u64 = 3;

/// Chunk bytes gathered before they are written to the new store.
const BATCH_BYTES: usize = 16 * 1024 * 1024;

/// Repairs the store in `state_dir` (see the module docs) and returns its
/// report: what was damaged, where the damaged files were copied, and
/// what was lost per stream. A whole store is left as it is.
pub fn run(state_dir: &Path, log_capacity: u64) -> Result<String> {
    if !state_dir.is_dir() {
        return Err(Error::Config(format!(
            "no state directory {}",
            state_dir.display()
        )));
    }
    // A running daemon holds it: [`Error::AlreadyRunning`], nothing done.
    let _lock = StateLock::acquire(state_dir)?;
    if let Some(report) = finish_interrupted(state_dir)? {
        return Ok(format!(
            "finished an interrupted repair: its new store is now in place\n{report}"
        ));
    }
    let store = state_dir.join(STORE_FILE);
    let log = store.with_extension("wal");
    let files: Vec<PathBuf> = [&store, &log]
        .into_iter()
        .filter(|path| fs::symlink_metadata(path).is_ok())
        .cloned()
        .collect();
    if files.is_empty() {
        return Ok(format!(
            "nothing to repair: {} holds no store",
            state_dir.display()
        ));
    }
    let damage = match check::verify_dir(state_dir) {
        Ok(summary) => return Ok(format!("nothing to repair: the store is whole ({summary})")),
        Err(e) if e.is_damage() => e.to_string(),
        Err(e) => return Err(e),
    };
    ensure_room(state_dir, &files)?;
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    let copied = copy_aside(state_dir, "damaged", &paths)?;
    let new_dir = state_dir.join(NEW_DIR);
    if new_dir.exists() {
        fs::remove_dir_all(&new_dir).map_err(|e| io_error("cannot remove", &new_dir, e))?;
    }
    create_private_dir(&new_dir)?;
    let rebuilt = rebuild(&store, &log, &new_dir.join(STORE_FILE), log_capacity)?;
    let report = rebuilt.report(&damage, &copied);
    let done = new_dir.join(DONE);
    write_synced(&done, report.as_bytes())?;
    sync_dir(&new_dir)?;
    put_in_place(state_dir)?;
    Ok(report)
}

/// Refuses to start on a state directory whose repair was stopped while
/// its new store was being put in place: `tetherd repair` finishes it.
pub fn refuse_interrupted(state_dir: &Path) -> Result<()> {
    let done = state_dir.join(NEW_DIR).join(DONE);
    if done.exists() {
        return Err(Error::Damaged(Box::new(Damage {
            file: state_dir.join(STORE_FILE),
            offset: None,
            what: "a repair was stopped while putting its new store in place".into(),
            affected: "the whole store until `tetherd repair` finishes it".into(),
        })));
    }
    Ok(())
}

/// Finishes a repair stopped after its new store was whole: returns that
/// repair's report. A repair stopped before is thrown away (the old files
/// were not touched).
fn finish_interrupted(state_dir: &Path) -> Result<Option<String>> {
    let new_dir = state_dir.join(NEW_DIR);
    let done = new_dir.join(DONE);
    match fs::read_to_string(&done) {
        Ok(report) => {
            put_in_place(state_dir)?;
            Ok(Some(report))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if new_dir.exists() {
                fs::remove_dir_all(&new_dir).map_err(|e| io_error("cannot remove", &new_dir, e))?;
            }
            Ok(None)
        }
        Err(e) => Err(io_error("cannot read", &done, e)),
    }
}

/// Renames the new store's files over the old ones, then removes the
/// build directory. Run again after a stop, it goes on where it was: a
/// file already moved is not in the build directory any more.
fn put_in_place(state_dir: &Path) -> Result<()> {
    let new_dir = state_dir.join(NEW_DIR);
    let new_store = new_dir.join(STORE_FILE);
    for from in [new_store.clone(), new_store.with_extension("wal")] {
        let Some(name) = from.file_name() else {
            continue;
        };
        let to = state_dir.join(name);
        if from.exists() {
            fs::rename(&from, &to).map_err(|e| io_error("cannot move the new file to", &to, e))?;
        }
    }
    sync_dir(state_dir)?;
    fs::remove_dir_all(&new_dir).map_err(|e| io_error("cannot remove", &new_dir, e))?;
    sync_dir(state_dir)
}

/// Refuses, with nothing changed, when the copy of `files` and a new
/// store as large cannot both fit on the disk of `state_dir`.
fn ensure_room(state_dir: &Path, files: &[PathBuf]) -> Result<()> {
    let size: u64 = files
        .iter()
        .map(|f| fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    let needed = size.saturating_mul(2);
    let stat = rustix::fs::statvfs(state_dir)
        .map_err(|e| io_error("cannot read the free space of", state_dir, e.into()))?;
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    if free < needed {
        return Err(Error::DiskFull {
            detail: format!(
                "repair needs {needed} bytes free in {} (a copy of the damaged files, {size} \
                 bytes, and a new store at most as large) and {free} are; nothing was changed",
                state_dir.display()
            ),
            source: None,
        });
    }
    Ok(())
}

/// What the new store got, and what was lost on the way.
#[derive(Debug, Default)]
struct Rebuilt {
    /// Seq ranges lost, per stream name.
    lost: BTreeMap<String, Vec<(u64, u64)>>,
    /// What else was lost, in sentences.
    notes: Vec<String>,
    /// The store file could not be read at all: streams the log does not
    /// name are lost without a trace.
    store_lost: bool,
    streams: u64,
    frames: u64,
    bytes: u64,
}

impl Rebuilt {
    fn report(&self, damage: &str, copied: &Path) -> String {
        let mut out = format!(
            "{damage}\ncopied the damaged files to {}\n",
            copied.display()
        );
        if self.lost.is_empty() {
            if !self.store_lost {
                out.push_str("lost: no frame of any stream\n");
            }
        } else {
            out.push_str("lost, per stream:\n");
            for (name, ranges) in &self.lost {
                let ranges: Vec<String> = ranges
                    .iter()
                    .map(|&(first, last)| {
                        if first == last {
                            format!("{first}")
                        } else {
                            format!("{first}..{last}")
                        }
                    })
                    .collect();
                out.push_str(&format!("  {name}: seqs {}\n", ranges.join(", ")));
            }
        }
        for note in &self.notes {
            out.push_str(&format!("lost: {note}\n"));
        }
        out.push_str(&format!(
            "repaired: {} streams, {} frames, {} bytes kept",
            self.streams, self.frames, self.bytes
        ));
        out
    }
}

/// Builds the new store at `new_path` from what verifies of the store
/// file `old_store` and the log `old_log`.
fn rebuild(
    old_store: &Path,
    old_log: &Path,
    new_path: &Path,
    log_capacity: u64,
) -> Result<Rebuilt> {
    let new = Store::open_with_log(new_path, log_capacity)?;
    let mut build = Build::new(&new);
    let has_data = fs::metadata(old_store).is_ok_and(|m| m.len() > 0);
    let old_db = if has_data {
        match check::open_under_overlay(old_store) {
            Ok(db) => Some(db),
            Err(e) => {
                build.notes.push(format!(
                    "the store file could not be opened ({e}): every frame it held but the \
                     log did not, and every stream the log does not name"
                ));
                build.store_lost = true;
                None
            }
        }
    } else {
        None
    };
    let marks = match old_db.as_ref().map(read_marks).transpose() {
        Ok(marks) => marks.unwrap_or_default(),
        Err(e) => {
            build.notes.push(format!(
                "the store's marks for its log could not be read ({e}): the log was read \
                 from its start"
            ));
            LogMarks::default()
        }
    };
    let capacity = marks.capacity.unwrap_or(log_capacity);
    let log = match Wal::open_read(old_log, capacity, &OsOpener) {
        Ok(log) => Some(log),
        Err(e) => {
            if old_db.is_some() {
                build.notes.push(format!("the log could not be read ({e})"));
            }
            None
        }
    };
    if let Some(db) = &old_db {
        build.copy_store(db, log.as_ref().map(Wal::reader))?;
    }
    // Where the last seq of a stream may have been lost with the log:
    // (the number of the last record lost, the bytes lost).
    let doubt = match &log {
        Some(log) => {
            let salvaged = log.salvage(marks.applied, marks.resume, |number, body| {
                build.apply_record(number, body)
            })?;
            let bytes: u64 = salvaged.lost.iter().map(|l| l.bytes).sum();
            salvaged.lost.last().map(|l| (l.last, bytes))
        }
        // The records the store did not hold are gone, however many.
        None if old_db.is_some() => Some((u64::MAX, capacity)),
        None => None,
    };
    build.flush()?;
    let rebuilt = build.finish(doubt)?;
    new.close()?;
    Ok(rebuilt)
}

/// The new store being built.
struct Build<'s> {
    new: &'s Store,
    /// Every stream by id: its name and its latest metadata.
    streams: HashMap<u64, (String, StreamMeta)>,
    /// The number of the last log record that named each stream.
    named_in: HashMap<u64, u64>,
    producers: BTreeMap<(u64, String), (u64, u64)>,
    consumers: BTreeMap<(u64, String), u64>,
    next_stream_id: u64,
    batch: Vec<Change>,
    batch_bytes: usize,
    /// The stream ids chunks were written for.
    chunk_ids: std::collections::BTreeSet<u64>,
    notes: Vec<String>,
    store_lost: bool,
    /// The executions whose manifests the old store file held.
    executions: std::collections::BTreeSet<String>,
    /// The executions the log's records keep checkpoints or steps of.
    logged_executions: std::collections::BTreeSet<String>,
}

impl<'s> Build<'s> {
    fn new(new: &'s Store) -> Self {
        Build {
            new,
            streams: HashMap::new(),
            named_in: HashMap::new(),
            producers: BTreeMap::new(),
            consumers: BTreeMap::new(),
            next_stream_id: 1,
            batch: Vec::new(),
            batch_bytes: 0,
            chunk_ids: std::collections::BTreeSet::new(),
            notes: Vec::new(),
            store_lost: false,
            executions: std::collections::BTreeSet::new(),
            logged_executions: std::collections::BTreeSet::new(),
        }
    }

    /// Copies what can be read of the old store file: every stream's
    /// metadata and every chunk that verifies (chunks kept in the old log
    /// read through `log`), and the other tables whole.
    fn copy_store(&mut self, db: &Database, log: Option<LogReader>) -> Result<()> {
        let txn = db.begin_read().map_err(storage)?;
        let mut ids = Vec::new();
        self.read_table(
            &txn,
            STREAMS,
            "streams",
            |build, name, meta| match postcard::from_bytes::<StreamMeta>(meta) {
                Ok(meta) => {
                    ids.push(meta.id);
                    build.streams.insert(meta.id, (name.to_owned(), meta));
                }
                Err(e) => build.notes.push(format!(
                    "stream {name:?}: its metadata does not decode ({e}); its frames were \
                     dropped"
                )),
            },
        );
        match txn.open_table(CHUNKS) {
            Ok(chunks) => self.copy_chunks(&chunks, &ids, log.as_ref())?,
            Err(e) => self
                .notes
                .push(format!("the store's chunks could not be read ({e})")),
        }
        self.read_table(&txn, PRODUCERS, "producers", |build, (id, name), state| {
            build.producers.insert((id, name.to_owned()), state);
        });
        self.read_table(&txn, CONSUMERS, "consumers", |build, (id, name), acked| {
            build.consumers.insert((id, name.to_owned()), acked);
        });
        let mut next = None;
        let mut counters = Vec::new();
        self.read_table(&txn, META, "meta", |_, key, value| {
            if key == META_NEXT_STREAM_ID {
                next = Some(value);
            }
            if key == META_NEXT_QUESTION_ID || key == META_NEXT_MESSAGE_ID {
                counters.push((key.to_owned(), value));
            }
        });
        self.next_stream_id = self.next_stream_id.max(next.unwrap_or(1));
        // Executions, checkpoints and step results, whole.
        let mut executions = Vec::new();
        self.read_table(&txn, EXECUTIONS, "executions", |build, id, manifest| {
            build.executions.insert(id.to_owned());
            executions.push((id.to_owned(), manifest.to_vec()));
        });
        let mut checkpoints = Vec::new();
        self.read_table(&txn, CHECKPOINTS, "checkpoints", |_, (id, n), record| {
            checkpoints.push((id.to_owned(), n, record.to_vec()));
        });
        let mut steps = Vec::new();
        self.read_table(&txn, STEPS, "step results", |_, (id, step), result| {
            steps.push((id.to_owned(), step.to_owned(), result.to_vec()));
        });
        let mut step_times = Vec::new();
        self.read_table(&txn, STEP_TIMES, "step times", |_, (id, step), ts| {
            step_times.push((id.to_owned(), step.to_owned(), ts));
        });
        // Questions and inboxes, whole.
        let mut questions = Vec::new();
        self.read_table(&txn, QUESTIONS, "questions", |_, (id, n), record| {
            questions.push((id.to_owned(), n, record.to_vec()));
        });
        let mut inbox = Vec::new();
        self.read_table(&txn, INBOX, "inbox", |_, (id, n), message| {
            inbox.push((id.to_owned(), n, message.to_vec()));
        });
        // Removed streams' last seqs: a stream created again goes on
        // above them after the repair too.
        let mut tombstones = Vec::new();
        self.read_table(&txn, TOMBSTONES, "tombstones", |_, name, last_seq| {
            tombstones.push((name.to_owned(), last_seq));
        });
        self.write(|txn| {
            let mut table = txn.open_table(TOMBSTONES).map_err(storage)?;
            for (name, last_seq) in &tombstones {
                table.insert(name.as_str(), *last_seq).map_err(storage)?;
            }
            let mut table = txn.open_table(EXECUTIONS).map_err(storage)?;
            for (id, manifest) in &executions {
                table
                    .insert(id.as_str(), manifest.as_slice())
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(CHECKPOINTS).map_err(storage)?;
            for (id, n, record) in &checkpoints {
                table
                    .insert((id.as_str(), *n), record.as_slice())
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(STEPS).map_err(storage)?;
            for (id, step, result) in &steps {
                table
                    .insert((id.as_str(), step.as_str()), result.as_slice())
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(STEP_TIMES).map_err(storage)?;
            for (id, step, ts) in &step_times {
                table
                    .insert((id.as_str(), step.as_str()), *ts)
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(QUESTIONS).map_err(storage)?;
            for (id, n, record) in &questions {
                table
                    .insert((id.as_str(), *n), record.as_slice())
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(INBOX).map_err(storage)?;
            for (id, n, message) in &inbox {
                table
                    .insert((id.as_str(), *n), message.as_slice())
                    .map_err(storage)?;
            }
            let mut table = txn.open_table(META).map_err(storage)?;
            for (key, value) in &counters {
                table.insert(key.as_str(), *value).map_err(storage)?;
            }
            Ok(())
        })
    }

    /// Copies every chunk of the streams `ids` in the old store's
    /// `chunks` that verifies (those the old log keeps read through `log`,
    /// if it could be opened). A stream's chunks behind a page that fails
    /// to read are lost, noted.
    fn copy_chunks(
        &mut self,
        chunks: &redb::ReadOnlyTable<(u64, u64), &[u8]>,
        ids: &[u64],
        log: Option<&LogReader>,
    ) -> Result<()> {
        let mut kept = Vec::new();
        for &id in ids {
            let range = match chunks.range((id, 0)..=(id, u64::MAX)) {
                Ok(range) => range,
                Err(e) => {
                    self.note_unreadable(id, &e.to_string());
                    continue;
                }
            };
            for item in range {
                let (key, value) = match item {
                    Ok(item) => item,
                    Err(e) => {
                        self.note_unreadable(id, &e.to_string());
                        break;
                    }
                };
                let (_, first) = key.value();
                let bytes = match log {
                    Some(log) => chunk_bytes(value.value(), log, &mut kept, &"", first)
                        .ok()
                        .flatten(),
                    None => super::chunk::InLog::parse(value.value())
                        .is_none()
                        .then_some(value.value()),
                };
                if let Some(bytes) = bytes.filter(|b| chunk_verifies(first, b)) {
                    let bytes = bytes.to_vec();
                    self.push(Change::Chunk {
                        key: (id, first),
                        bytes,
                    })?;
                }
            }
        }
        Ok(())
    }

    fn note_unreadable(&mut self, id: u64, why: &str) {
        let name = self
            .streams
            .get(&id)
            .map_or_else(|| format!("#{id}"), |(name, _)| format!("{name:?}"));
        self.notes.push(format!(
            "stream {name}: some of its chunks could not be read ({why})"
        ));
    }

    /// Hands every entry of the old store's `table` that reads to `each`;
    /// an entry that does not read ends the table, noted.
    fn read_table<K, V>(
        &mut self,
        txn: &redb::ReadTransaction,
        table: TableDefinition<'_, K, V>,
        what: &str,
        mut each: impl FnMut(&mut Self, K::SelfType<'_>, V::SelfType<'_>),
    ) where
        K: redb::Key + 'static,
        V: redb::Value + 'static,
    {
        let table = match txn.open_table(table) {
            Ok(table) => table,
            Err(redb::TableError::TableDoesNotExist(_)) => return,
            Err(e) => {
                self.notes
                    .push(format!("the store's {what} could not be read ({e})"));
                return;
            }
        };
        let iter = match table.iter() {
            Ok(iter) => iter,
            Err(e) => {
                self.notes
                    .push(format!("the store's {what} could not be read ({e})"));
                return;
            }
        };
        for item in iter {
            match item {
                Ok((key, value)) => each(self, key.value(), value.value()),
                Err(e) => {
                    self.notes.push(format!(
                        "some of the store's {what} could not be read ({e})"
                    ));
                    return;
                }
            }
        }
    }

    /// Applies one log record's changes: chunks that verify go into the
    /// new store, the rest is gathered.
    fn apply_record(&mut self, number: u64, body: &[u8]) -> Result<()> {
        for op in wal::ops(body) {
            let op = match op {
                Ok(op) => op,
                Err(e) => {
                    self.notes.push(format!(
                        "a change in log record {number} does not decode ({e})"
                    ));
                    break;
                }
            };
            match op {
                Op::Stream { name, meta } => match postcard::from_bytes::<StreamMeta>(meta.0) {
                    Ok(meta) => {
                        self.named_in.insert(meta.id, number);
                        self.streams.insert(meta.id, (name.to_owned(), meta));
                    }
                    Err(e) => self.notes.push(format!(
                        "stream {name:?}: its metadata in log record {number} does not decode \
                         ({e})"
                    )),
                },
                Op::Chunk {
                    stream_id,
                    first_seq,
                    chunk,
                } => {
                    if chunk_verifies(first_seq, chunk.0) {
                        self.push(Change::Chunk {
                            key: (stream_id, first_seq),
                            bytes: chunk.0.to_vec(),
                        })?;
                    }
                }
                Op::RemoveChunksBelow { stream_id, below } => {
                    self.push(Change::RemoveChunksBelow { stream_id, below })?;
                }
                Op::Producer {
                    stream_id,
                    producer,
                    producer_seq,
                    seq,
                } => {
                    self.producers
                        .insert((stream_id, producer.to_owned()), (producer_seq, seq));
                }
                Op::Consumer {
                    stream_id,
                    consumer,
                    acked_through,
                } => {
                    self.consumers
                        .insert((stream_id, consumer.to_owned()), acked_through);
                }
                Op::NextStreamId(id) => self.next_stream_id = self.next_stream_id.max(id),
                // Kept as recorded: a checkpoint that fails its checksum
                // is listed as invalid and never handed out, as in the
                // daemon.
                op @ (Op::Checkpoint { .. }
                | Op::RemoveCheckpointsBelow { .. }
                | Op::Step { .. }
                | Op::ClearStep { .. }
                | Op::Question { .. }
                | Op::NextQuestionId(_)
                | Op::InboxPut { .. }
                | Op::InboxRemoveThrough { .. }
                | Op::NextMessageId(_)) => {
                    if let Some(change) = Change::of_execution_op(op) {
                        self.push(change)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn push(&mut self, change: Change) -> Result<()> {
        if let Some(execution) = change.execution() {
            if !self.logged_executions.contains(execution) {
                self.logged_executions.insert(execution.to_owned());
            }
        }
        if let Change::Chunk { key, .. } = &change {
            self.chunk_ids.insert(key.0);
        }
        self.batch_bytes += change.bytes();
        self.batch.push(change);
        if self.batch_bytes >= BATCH_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the batch to the new store.
    fn flush(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        if batch.is_empty() {
            return Ok(());
        }
        self.write(|txn| changes::apply(txn, &batch))
    }

    /// One write transaction on the new store, committed without
    /// durability: the last one (see [`Build::finish`]) makes them all
    /// durable, and a repair stopped before that is started over.
    fn write(&self, f: impl FnOnce(&redb::WriteTransaction) -> Result<()>) -> Result<()> {
        self.write_as(redb::Durability::None, f)
    }

    fn write_as(
        &self,
        durability: redb::Durability,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<()>,
    ) -> Result<()> {
        let guard = self.new.handle()?;
        let db = guard_db(&guard)?;
        let mut txn = db.begin_write().map_err(storage)?;
        txn.set_durability(durability).map_err(storage)?;
        match f(&txn) {
            Ok(()) => commit(txn),
            Err(e) => {
                super::txn::abort(txn);
                Err(e)
            }
        }
    }

    /// Settles every stream: its frames counted, the seqs missing between
    /// its first and last recorded lost, its last seq above every seq
    /// named anywhere (and further ahead when `doubt`, the number of the
    /// last log record lost and the bytes lost, says records naming it may
    /// be gone); chunks of streams whose name was lost dropped.
    fn finish(mut self, doubt: Option<(u64, u64)>) -> Result<Rebuilt> {
        let mut rebuilt = Rebuilt {
            notes: std::mem::take(&mut self.notes),
            store_lost: self.store_lost,
            ..Rebuilt::default()
        };
        for execution in self.logged_executions.difference(&self.executions) {
            rebuilt.notes.push(format!(
                "the manifest of execution {execution} (only the store file held it); its \
                 checkpoints and step results in the log were kept"
            ));
        }
        let skip = doubt.map_or(0, |(_, bytes)| bytes / MIN_FRAME_BYTES + 1);
        let mut named: Vec<(u64, (String, StreamMeta))> = self.streams.drain().collect();
        named.sort_by_key(|(id, _)| *id);
        let mut settled = Vec::new();
        for (id, (name, mut meta)) in named {
            let present = self.present(id, meta.first_seq)?;
            let mut last = meta.last_seq.max(present.last);
            for ((stream, _), &(_, seq)) in &self.producers {
                if *stream == id {
                    last = last.max(seq);
                }
            }
            for ((stream, _), &acked) in &self.consumers {
                if *stream == id {
                    last = last.max(acked);
                }
            }
            let in_doubt =
                doubt.is_some_and(|(lost, _)| self.named_in.get(&id).is_none_or(|&n| n < lost));
            if in_doubt {
                last = last.saturating_add(skip);
            }
            let mut lost = present.holes;
            let tail_from = present.last.max(meta.first_seq.saturating_sub(1)) + 1;
            if tail_from <= last {
                lost.push((tail_from, last));
            }
            meta.last_seq = last;
            meta.frames = present.frames;
            meta.bytes = present.bytes;
            rebuilt.streams += 1;
            rebuilt.frames += present.frames;
            rebuilt.bytes += present.bytes;
            self.next_stream_id = self.next_stream_id.max(id + 1);
            if !lost.is_empty() {
                rebuilt.lost.insert(name.clone(), lost.clone());
            }
            settled.push((id, name, meta, lost));
        }
        let known: std::collections::HashSet<u64> =
            settled.iter().map(|(id, _, _, _)| *id).collect();
        let orphans = self.orphans(&known)?;
        for (id, frames) in &orphans {
            rebuilt.notes.push(format!(
                "{frames} frames of stream #{id}, whose name was lost with the records that \
                 named it"
            ));
        }
        self.write_as(redb::Durability::Immediate, |txn| {
            let mut streams = txn.open_table(STREAMS).map_err(storage)?;
            let mut lost_table = txn.open_table(LOST).map_err(storage)?;
            for (id, name, meta, lost) in &settled {
                let bytes = postcard::to_allocvec(meta)
                    .map_err(|e| Error::storage(format!("cannot encode stream {name:?}"), e))?;
                streams
                    .insert(name.as_str(), bytes.as_slice())
                    .map_err(storage)?;
                for &(first, last) in lost {
                    lost_table.insert((*id, first), last).map_err(storage)?;
                }
            }
            let mut chunks = txn.open_table(CHUNKS).map_err(storage)?;
            for (id, _) in &orphans {
                chunks
                    .retain_in((*id, 0)..=(*id, u64::MAX), |_, _| false)
                    .map_err(storage)?;
            }
            let mut producers = txn.open_table(PRODUCERS).map_err(storage)?;
            for ((id, name), &(producer_seq, seq)) in &self.producers {
                if known.contains(id) {
                    producers
                        .insert((*id, name.as_str()), (producer_seq, seq))
                        .map_err(storage)?;
                }
            }
            let mut consumers = txn.open_table(CONSUMERS).map_err(storage)?;
            for ((id, name), &acked) in &self.consumers {
                if known.contains(id) {
                    consumers
                        .insert((*id, name.as_str()), acked)
                        .map_err(storage)?;
                }
            }
            txn.open_table(META)
                .map_err(storage)?
                .insert(META_NEXT_STREAM_ID, self.next_stream_id)
                .map_err(storage)?;
            Ok(())
        })?;
        Ok(rebuilt)
    }

    /// The frames of stream `id` the new store holds from `first_seq` on:
    /// how many, their bytes, the last seq, and the ranges missing
    /// between them.
    fn present(&self, id: u64, first_seq: u64) -> Result<Present> {
        let guard = self.new.handle()?;
        let db = guard_db(&guard)?;
        let txn = db.begin_read().map_err(storage)?;
        let chunks = txn.open_table(CHUNKS).map_err(storage)?;
        let mut present = Present {
            last: 0,
            frames: 0,
            bytes: 0,
            holes: Vec::new(),
        };
        let mut next = first_seq;
        for item in chunks.range((id, 0)..=(id, u64::MAX)).map_err(storage)? {
            let (key, value) = item.map_err(storage)?;
            let first = key.value().1;
            let Ok(iter) = ChunkIter::new(first, value.value()) else {
                continue;
            };
            for frame in iter.flatten() {
                if frame.seq < next {
                    continue;
                }
                if frame.seq > next {
                    present.holes.push((next, frame.seq - 1));
                }
                next = frame.seq + 1;
                present.last = frame.seq;
                present.frames += 1;
                present.bytes += frame.payload.len() as u64;
            }
        }
        Ok(present)
    }

    /// The stream ids of the new store's chunks that no stream names, with
    /// their frame counts (only the ids chunks were written for are looked
    /// at, not the whole table again).
    fn orphans(&self, known: &std::collections::HashSet<u64>) -> Result<Vec<(u64, u64)>> {
        let guard = self.new.handle()?;
        let db = guard_db(&guard)?;
        let txn = db.begin_read().map_err(storage)?;
        let chunks = txn.open_table(CHUNKS).map_err(storage)?;
        let mut orphans = Vec::new();
        for &id in self.chunk_ids.iter().filter(|id| !known.contains(id)) {
            let mut frames = 0;
            for item in chunks.range((id, 0)..=(id, u64::MAX)).map_err(storage)? {
                let (key, value) = item.map_err(storage)?;
                frames +=
                    ChunkIter::new(key.value().1, value.value()).map_or(0, |i| i.count() as u64);
            }
            if frames > 0 {
                orphans.push((id, frames));
            }
        }
        Ok(orphans)
    }
}

/// What [`Build::present`] found of one stream.
struct Present {
    last: u64,
    frames: u64,
    bytes: u64,
    holes: Vec<(u64, u64)>,
}

/// Whether every frame of `chunk` (first seq `first`) decodes.
fn chunk_verifies(first: u64, chunk: &[u8]) -> bool {
    ChunkIter::new(first, chunk).is_ok_and(|mut frames| frames.all(|f| f.is_ok()))
}
