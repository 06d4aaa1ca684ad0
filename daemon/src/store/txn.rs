//! The write transaction: [`WriteTxn`], the tables a change opens as it
//! needs them, and the commit through the log or durably (with the marks
//! the log needs), so that every way of changing the store goes through
//! one transaction type.

use std::collections::HashMap;

use redb::{
    Database, Durability, Key, ReadableTable, Table, TableDefinition, Value, WriteTransaction,
};
use tether_protocol::Frame;

use super::chunk::{InLog, PendingChunk};
use super::read::scan_newest_first;
use super::schema::{
    ProducerState, StreamMeta, CHECKPOINTS, CHUNKS, CONSUMERS, EXECUTIONS, META,
    META_NEXT_STREAM_ID, META_WAL_APPLIED, META_WAL_CAPACITY, META_WAL_RESUME, META_WAL_TAIL,
    PRODUCERS, STEPS, STEP_TIMES, STREAMS,
};
use super::schema::{INBOX, LOST, QUESTIONS, TOMBSTONES};
use super::storage;
use crate::syncer::Durable;
use crate::wal::{self, Layout, LogReader, Op, RawBytes, RecordBuf, Wal};
use crate::{Error, Result};

/// The tables of one write transaction, open for writing.
pub struct WriteTxn<'t> {
    streams: LazyTable<'t, &'static str, &'static [u8]>,
    pub(super) chunks: LazyTable<'t, (u64, u64), &'static [u8]>,
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
    /// redb stores them (and, when the log wraps, so that their
    /// place in the log is known).
    unstored: Vec<((u64, u64), Vec<u8>, usize)>,
    /// Reads chunks the log keeps for the store.
    pub(super) log: &'t LogReader,
    producers: LazyTable<'t, (u64, &'static str), (u64, u64)>,
    consumers: LazyTable<'t, (u64, &'static str), u64>,
    pub(super) meta: LazyTable<'t, &'static str, u64>,
    executions: LazyTable<'t, &'static str, &'static [u8]>,
    checkpoints: LazyTable<'t, (&'static str, u64), &'static [u8]>,
    steps: LazyTable<'t, (&'static str, &'static str), &'static [u8]>,
    step_times: LazyTable<'t, (&'static str, &'static str), u64>,
    tombstones: LazyTable<'t, &'static str, u64>,
    lost: LazyTable<'t, (u64, u64), u64>,
    pub(super) questions: LazyTable<'t, (&'static str, u64), &'static [u8]>,
    pub(super) inbox: LazyTable<'t, (&'static str, u64), &'static [u8]>,
    /// Reused encoding buffer, so that appending a frame does not allocate.
    scratch: Vec<u8>,
    /// The log record describing this transaction, when it is to be
    /// logged; `None` also while a replay applies one.
    record: Option<RecordBuf>,
    /// A change the log cannot describe was made: the commit must be
    /// durable in the store itself.
    unlogged: bool,
    /// Asked for room for the blocks redb may take before values go into
    /// it (see `Store::make_room`), so that redb never meets a full disk
    /// (a checkpoint of megabytes is refused before redb writes any of
    /// it); `None` where the caller made room for the whole transaction.
    room: Option<&'t dyn Fn(u64) -> Result<()>>,
    /// Bytes of values this transaction has put into redb so far.
    stored: u64,
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
            .map_err(|e| Error::storage(format!("cannot encode stream {name:?}"), e))?;
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
        if self.record.is_none() {
            self.take_room(bytes.len())?;
        }
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
    /// to a log that wraps, which then keeps the chunks' bytes for
    /// the store (`chunks` gets where they are, see [`InLog`]).
    pub(super) fn store_chunks(&mut self, kept_at: Option<u64>) -> Result<()> {
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
    pub(super) fn log(&mut self, op: &Op<'_>) -> Result<()> {
        log_to(&mut self.record, op)
    }

    /// Asks for room for `bytes` more of values before they go into redb:
    /// for twice the transaction's running total (a leaf split leaves its
    /// pages half full, and a value of several pages is placed on a
    /// boundary of its size).
    pub(super) fn take_room(&mut self, bytes: usize) -> Result<()> {
        self.stored = self.stored.saturating_add(bytes as u64);
        match self.room {
            Some(room) => room(self.stored.saturating_mul(2)),
            None => Ok(()),
        }
    }

    /// Applies one change of a replayed log record. `kept`: the record's
    /// position and body when the log keeps its chunks for the store
    /// (wrapping), which then gets where they are, as from
    /// [`WriteTxn::store_chunks`].
    pub(super) fn apply(&mut self, op: Op<'_>, kept: Option<(u64, &[u8])>) -> Result<()> {
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
            Op::Checkpoint {
                execution,
                id,
                record,
            } => self
                .checkpoints
                .get()?
                .insert((execution, id), record.0)
                .map(drop),
            Op::RemoveCheckpointsBelow { execution, below } => self
                .checkpoints
                .get()?
                .retain_in((execution, 0)..(execution, below), |_, _| false),
            Op::Step {
                execution,
                step,
                result,
                recorded_micros,
            } => return self.store_step(execution, step, result.0, recorded_micros),
            Op::ClearStep { execution, step } => {
                return self.remove_step(execution, step).map(drop)
            }
            op @ (Op::Question { .. }
            | Op::NextQuestionId(_)
            | Op::InboxPut { .. }
            | Op::InboxRemoveThrough { .. }
            | Op::NextMessageId(_)) => return self.apply_gate_op(&op).map(drop),
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
        self.take_room(id.len() + manifest.len())?;
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
        self.take_room(execution.len() + record.len())?;
        self.checkpoints
            .get()?
            .insert((execution, id), record)
            .map_err(storage)?;
        self.log(&Op::Checkpoint {
            execution,
            id,
            record: RawBytes(record),
        })
    }

    /// Deletes an execution's checkpoints with ids below `first_kept`.
    pub fn delete_checkpoints_before(&mut self, execution: &str, first_kept: u64) -> Result<()> {
        self.checkpoints
            .get()?
            .retain_in((execution, 0)..(execution, first_kept), |_, _| false)
            .map_err(storage)?;
        self.log(&Op::RemoveCheckpointsBelow {
            execution,
            below: first_kept,
        })
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

    /// Records the result of a durable step, and when it was recorded.
    pub fn put_step(&mut self, execution: &str, step: &str, result: &[u8], ts: u64) -> Result<()> {
        self.take_room(2 * (execution.len() + step.len()) + result.len() + 8)?;
        self.store_step(execution, step, result, ts)?;
        self.log(&Op::Step {
            execution,
            step,
            result: RawBytes(result),
            recorded_micros: ts,
        })
    }

    /// Writes a step's result and its time, for [`WriteTxn::put_step`]
    /// and a replay.
    fn store_step(&mut self, execution: &str, step: &str, result: &[u8], ts: u64) -> Result<()> {
        self.steps
            .get()?
            .insert((execution, step), result)
            .map_err(storage)?;
        self.step_times
            .get()?
            .insert((execution, step), ts)
            .map(drop)
            .map_err(storage)
    }

    /// Removes a step's result and its time; returns whether it had one.
    fn remove_step(&mut self, execution: &str, step: &str) -> Result<bool> {
        let removed = self
            .steps
            .get()?
            .remove((execution, step))
            .map_err(storage)?
            .is_some();
        self.step_times
            .get()?
            .remove((execution, step))
            .map_err(storage)?;
        Ok(removed)
    }

    /// Forgets the named step results of an execution, or all of them
    /// when `names` is `None`; returns how many were recorded.
    pub fn clear_steps(&mut self, execution: &str, names: Option<&[String]>) -> Result<u64> {
        let names: Vec<String> = match names {
            Some(names) => names.to_vec(),
            None => {
                let steps = self.steps.get()?;
                let mut all = Vec::new();
                for item in steps.range((execution, "")..).map_err(storage)? {
                    let (key, _) = item.map_err(storage)?;
                    let (id, step) = key.value();
                    if id != execution {
                        break;
                    }
                    all.push(step.to_owned());
                }
                all
            }
        };
        let mut cleared = 0;
        for name in &names {
            // Only a step that was recorded needs its removal replayed.
            if self.remove_step(execution, name)? {
                cleared += 1;
                self.log(&Op::ClearStep {
                    execution,
                    step: name,
                })?;
            }
        }
        Ok(cleared)
    }

    /// The last seq of the removed stream `name`, if one was removed.
    pub fn tombstone(&mut self, name: &str) -> Result<Option<u64>> {
        let value = self.tombstones.get()?.get(name).map_err(storage)?;
        Ok(value.map(|v| v.value()))
    }

    /// Removes stream `name` (whose id is `stream_id`) with its frames,
    /// producers, consumers and lost ranges, and leaves a tombstone of
    /// `last_seq`. The log has no change for it: the commit is made
    /// durable in the store, which is then whole without the records
    /// before it, so that a replay cannot bring the stream back. Frames
    /// of the stream this transaction appended are dropped with it.
    pub fn remove_stream(&mut self, name: &str, stream_id: u64, last_seq: u64) -> Result<()> {
        self.unlogged = true;
        self.pending.remove(&stream_id);
        if matches!(&self.current, Some((id, _)) if *id == stream_id) {
            self.current = None;
        }
        self.unstored.retain(|((id, _), _, _)| *id != stream_id);
        self.streams.get()?.remove(name).map_err(storage)?;
        let all = (stream_id, 0)..=(stream_id, u64::MAX);
        self.chunks
            .get()?
            .retain_in(all.clone(), |_, _| false)
            .map_err(storage)?;
        self.lost
            .get()?
            .retain_in(all, |_, _| false)
            .map_err(storage)?;
        self.producers
            .get()?
            .retain_in((stream_id, "")..(stream_id + 1, ""), |_, _| false)
            .map_err(storage)?;
        self.consumers
            .get()?
            .retain_in((stream_id, "")..(stream_id + 1, ""), |_, _| false)
            .map_err(storage)?;
        let kept = self.tombstone(name)?.unwrap_or(0);
        self.tombstones
            .get()?
            .insert(name, kept.max(last_seq))
            .map_err(storage)?;
        Ok(())
    }

    /// Removes an execution's manifest, checkpoints, step results,
    /// questions and inbox (its stream is removed apart, by
    /// [`WriteTxn::remove_stream`]).
    /// Durable in the store, as that is. Returns whether it had a manifest.
    pub fn remove_execution(&mut self, id: &str) -> Result<bool> {
        self.unlogged = true;
        let had = self
            .executions
            .get()?
            .remove(id)
            .map_err(storage)?
            .is_some();
        self.checkpoints
            .get()?
            .retain_in((id, 0)..=(id, u64::MAX), |_, _| false)
            .map_err(storage)?;
        self.clear_steps(id, None)?;
        self.remove_gates_of(id)?;
        Ok(had)
    }

    /// Records the id the next new stream gets.
    pub fn set_next_stream_id(&mut self, id: u64) -> Result<()> {
        self.meta
            .get()?
            .insert(META_NEXT_STREAM_ID, id)
            .map_err(storage)?;
        self.log(&Op::NextStreamId(id))
    }
}

/// A table of a write transaction, opened on first use: most
/// transactions touch three or four of the eight, and each opening is a
/// lookup in redb's tree of tables (a tenth of a one-frame commit's work).
pub(super) struct LazyTable<'t, K: Key + 'static, V: Value + 'static> {
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

    pub(super) fn get(&mut self) -> Result<&mut Table<'t, K, V>> {
        let table = match self.table.take() {
            Some(table) => table,
            None => self.txn.open_table(self.definition).map_err(storage)?,
        };
        Ok(self.table.insert(table))
    }
}

/// The tables of `txn`, for writing; each is opened when first used.
pub(super) fn tables<'t>(
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
        step_times: LazyTable::new(txn, STEP_TIMES),
        tombstones: LazyTable::new(txn, TOMBSTONES),
        lost: LazyTable::new(txn, LOST),
        questions: LazyTable::new(txn, QUESTIONS),
        inbox: LazyTable::new(txn, INBOX),
        scratch: Vec::new(),
        record,
        unlogged: false,
        room: None,
        stored: 0,
    }
}

/// Runs `f` in one write transaction and commits it: through the log when
/// `appended` is given and the log can describe it and has room, else
/// durably (after which the log starts again, or, wrapping, goes on
/// past the chunks it kept that are now in the store).
///
/// `room` is asked for room for the blocks redb may take before values go
/// into it (see `Store::make_room`); the frames of a logged commit, before
/// its record is appended, so that a refusal leaves nothing in the log
/// that redb does not hold.
pub(super) fn write_in<T>(
    db: &Database,
    log: &mut Wal,
    reader: &LogReader,
    appended: Option<impl FnOnce(u64)>,
    f: impl FnOnce(&mut WriteTxn<'_>) -> Result<T>,
    room: &dyn Fn(u64) -> Result<()>,
) -> Result<(T, Durable)> {
    let mut txn = db.begin_write().map_err(storage)?;
    let mut tables = tables(&txn, reader, appended.is_some().then(|| log.take_buf()));
    tables.room = Some(room);
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
                            // Wrapping, where the next record goes too:
                            // a state with this commit in it (redb may keep
                            // it) must not send a replay back to an older
                            // place.
                            if log.layout() == Layout::Wrapping {
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
    // The chunks a logged commit stores after its append: room first.
    let unstored: usize = tables
        .unstored
        .iter()
        .map(|(_, bytes, _)| bytes.len())
        .sum();
    let outcome = outcome.and_then(|done| tables.take_room(unstored).map(|()| done));
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
                kept_at = (log.layout() == Layout::Wrapping).then_some(at);
            }
            // Not committed to the store directly instead: on a full disk
            // that would make redb meet the failure too, and redb then
            // refuses reads until it is reopened. The writer enters
            // degraded mode and tries again later (see `crate::degraded`).
            Err(e) => {
                drop(tables);
                abort(txn);
                return Err(e);
            }
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
        log.committed_durably(log.next_number())?;
    }
    Ok((value, durable))
}

/// Writes into a durable commit what the log needs of it (see
/// [`Wal::durable_marks`]): wrapping, the last record the store holds,
/// where the next goes and where the chunks the log keeps start; when the
/// log was `full`, a stretch of those chunks is copied into the store
/// first, so that the records can go on. Not wrapping, a store that
/// did clears those marks. Returns where copying reached, if it moved.
fn durable_marks(tables: &mut WriteTxn<'_>, log: &Wal, full: bool) -> Result<Option<u64>> {
    let copied = if full && log.layout() == Layout::Wrapping {
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
pub(super) fn copy_kept_chunks(tables: &mut WriteTxn<'_>, log: &Wal, budget: u64) -> Result<u64> {
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
                tables.take_room(chunk.0.len())?;
                tables
                    .chunks
                    .get()?
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
pub(super) fn abort(txn: WriteTransaction) {
    if let Err(e) = txn.abort() {
        tracing::debug!("aborting a failed write transaction: {e}");
    }
}

pub(super) fn commit(txn: WriteTransaction) -> Result<()> {
    txn.commit().map_err(storage)
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use bytes::Bytes;

    use super::*;
    use crate::store::tests::{frame_of, store};
    use crate::store::ReadLimits;

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
}
