//! The read paths: everything [`Store`] answers from a read transaction of
//! its own (the writer's cache, frames, executions, checkpoints, steps,
//! the list of streams), with the retry that keeps reads going after a
//! failed commit or while the log goes over chunks it kept.

use std::sync::atomic::Ordering;

use redb::{Key, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, Value};
use tether_protocol::{ConsumerInfo, Frame, StepInfo, StreamInfo};

use super::chunk::{
    chunk_bytes, chunk_holding, corrupt_chunk, corrupt_frame, ChunkIter, FrameSink, StoredFrame,
};
use super::schema::{
    lost_through, ProducerState, StreamMeta, CHECKPOINTS, CHUNKS, CONSUMERS, EXECUTIONS, META,
    META_NEXT_STREAM_ID, PRODUCERS, STEPS, STEP_TIMES, STREAMS, TOMBSTONES,
};
use super::{guard_db, storage, Store};
use crate::{Error, Result};

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
    /// (name, last seq) of each removed stream.
    pub tombstones: Vec<(String, u64)>,
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

/// Bounds on one [`Store::read_frames`] call. At least one frame is returned
/// when any is available, whatever its size.
#[derive(Clone, Copy, Debug)]
pub struct ReadLimits {
    pub max_frames: usize,
    pub max_bytes: usize,
    /// Read nothing beyond this seq.
    pub through_seq: u64,
}

impl Store {
    /// Runs a read. A read that failed because redb failed (an I/O error
    /// here or in a concurrent commit) is retried once on a reopened
    /// handle, reopened at most once a while whoever asks (see
    /// [`Store::reopen_for_reads`]).
    fn reading<T>(&self, read: impl Fn() -> Result<T>) -> Result<T> {
        match read() {
            Err(
                e @ (Error::Storage { .. }
                | Error::Invariant(_)
                | Error::Refused(_)
                | Error::Io { .. }),
            ) if self.handle_failed() => {
                tracing::debug!("read failed on a failed store handle ({e}); reopening");
                if self.reopen_for_reads()? {
                    read()
                } else {
                    Err(e)
                }
            }
            result => result,
        }
    }

    /// Maps a redb failure met while reading, and marks the handle for
    /// reopening when redb will refuse further work on it.
    pub(super) fn fail(&self, e: impl Into<redb::Error>) -> Error {
        let e: redb::Error = e.into();
        if matches!(e, redb::Error::Io(_) | redb::Error::PreviousIo) {
            self.needs_reopen.store(true, Ordering::Release);
        }
        storage(e)
    }

    /// Runs `read` in a read transaction of its own (see [`Store::reading`]
    /// for the retry after a failed handle).
    pub(super) fn read_in<T>(&self, read: impl Fn(&ReadTransaction) -> Result<T>) -> Result<T> {
        self.reading(|| {
            let guard = self.handle()?;
            let txn = guard_db(&guard)?.begin_read().map_err(|e| self.fail(e))?;
            read(&txn)
        })
    }

    /// Shows `each` every row of `table`, in key order, until it fails.
    pub(super) fn each_row<K: Key + 'static, V: Value + 'static>(
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
        self.each_row(txn, TOMBSTONES, |name, last_seq| {
            snapshot.tombstones.push((name.to_owned(), last_seq));
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
        Err(Error::Invariant(format!(
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
                if reader.frames > 0 {
                    // The frames up to a lost range; the next read meets it.
                    break;
                }
                return self.past_lost(txn, stream, &meta, from_seq, chunk);
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
            return self.past_lost(txn, stream, &meta, from_seq, chunk);
        }
        Ok(Some(chunk))
    }

    /// A read of `stream` from `from_seq` that found no frame there: when
    /// `tetherd repair` recorded the seq lost, `chunk` empty with its first
    /// seq just past the lost range (the reader's gap notice), else the
    /// frame is missing for no known reason, which is an error.
    fn past_lost<S>(
        &self,
        txn: &ReadTransaction,
        stream: &str,
        meta: &StreamMeta,
        from_seq: u64,
        mut chunk: ReadChunk<S>,
    ) -> Result<Option<ReadChunk<S>>> {
        match lost_through(txn, meta.id, from_seq).map_err(|e| self.fail(e))? {
            Some(last) => {
                chunk.first_seq = last + 1;
                Ok(Some(chunk))
            }
            None => Err(Error::Invariant(format!(
                "stream {stream:?} is missing frame {from_seq} (retained {}..={})",
                meta.first_seq, meta.last_seq
            ))),
        }
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
                Error::Invariant(format!("chunk {first} of stream #{stream_id} vanished"))
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
    /// (id, record), newest first. An unknown execution with none is
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
    /// turns into a value. An unknown execution with none is
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

    /// An execution with no checkpoint must be known; one with checkpoints
    /// need not be: `tetherd repair` keeps those the log holds even when
    /// the manifest, which only the store file held, was lost.
    fn scan_checkpoints(
        &self,
        txn: &ReadTransaction,
        execution: &str,
        mut visit: impl FnMut(u64, &[u8]) -> bool,
    ) -> Result<()> {
        let table = txn.open_table(CHECKPOINTS).map_err(|e| self.fail(e))?;
        let mut any = false;
        scan_newest_first(&table, execution, |id, record| {
            any = true;
            visit(id, record)
        })
        .map_err(|e| self.fail(e))?;
        if !any {
            self.require_execution(txn, execution)?;
        }
        Ok(())
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

    /// The recorded result of a durable step. An unknown execution with
    /// no such step is [`Error::ExecutionNotFound`].
    pub fn step(&self, execution: &str, step: &str) -> Result<Option<Vec<u8>>> {
        self.read_in(|txn| {
            // Known or not, as for checkpoints (see `scan_checkpoints`).
            let value = txn
                .open_table(STEPS)
                .map_err(|e| self.fail(e))?
                .get((execution, step))
                .map_err(|e| self.fail(e))?;
            if value.is_none() {
                self.require_execution(txn, execution)?;
            }
            Ok(value.map(|v| v.value().to_vec()))
        })
    }

    /// The steps recorded for an execution, in name order. An unknown
    /// execution with none is [`Error::ExecutionNotFound`].
    pub fn list_steps(&self, execution: &str) -> Result<Vec<StepInfo>> {
        self.read_in(|txn| {
            let steps = txn.open_table(STEPS).map_err(|e| self.fail(e))?;
            // A store from before step times has no such table.
            let times = match txn.open_table(STEP_TIMES) {
                Ok(times) => Some(times),
                Err(redb::TableError::TableDoesNotExist(_)) => None,
                Err(e) => return Err(self.fail(e)),
            };
            let mut out = Vec::new();
            for item in steps.range((execution, "")..).map_err(|e| self.fail(e))? {
                let (key, value) = item.map_err(|e| self.fail(e))?;
                let (id, name) = key.value();
                if id != execution {
                    break;
                }
                let recorded_micros = match &times {
                    Some(times) => times
                        .get((id, name))
                        .map_err(|e| self.fail(e))?
                        .map_or(0, |t| t.value()),
                    None => 0,
                };
                out.push(StepInfo {
                    name: name.to_owned(),
                    size: value.value().len() as u64,
                    recorded_micros,
                });
            }
            if out.is_empty() {
                self.require_execution(txn, execution)?;
            }
            Ok(out)
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

/// Shows `visit` the checkpoints of `execution` in `table` as (id, record),
/// newest first, until it returns false.
pub(super) fn scan_newest_first(
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

/// How many times a read starts again, on a newer snapshot, when the
/// log's records went over chunks it kept while they were read (the store
/// has copied them by then, so once is all it takes unless the log wraps
/// again meanwhile).
const MOVED_RETRIES: usize = 4;

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

fn decode_meta(stream: &str, bytes: &[u8]) -> Result<StreamMeta> {
    postcard::from_bytes(bytes)
        .map_err(|e| Error::storage(format!("metadata of stream {stream:?} is unreadable"), e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use bytes::Bytes;

    use super::*;
    use crate::store::tests::{
        kib_payload, logged_frames, put, store, stream_s_through, where_chunks_are, SMALL_LOG,
    };

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
        // log) and has taken the first chunk, the log wraps past the
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
                    let wrap_log = || {
                        let mut seq = 21;
                        while seq < 21 + 2 * SMALL_LOG / 1024 {
                            logged_frames(&store, seq, seq + 9);
                            seq += 10;
                        }
                    };
                    Interrupted {
                        frames: Vec::new(),
                        first_take: (attempts.get() == 1)
                            .then(|| Box::new(wrap_log) as Box<dyn FnOnce()>),
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
}
