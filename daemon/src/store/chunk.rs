//! The chunk: how the frames of one commit to a stream are encoded as one
//! value and read back, and how a value that names bytes the log keeps
//! (an [`InLog`]) is told from one that holds them, so that every reader
//! and writer of `chunks` decodes them the same way.

use bytes::Bytes;
use redb::ReadableTable;
use serde::{Deserialize, Serialize};
use tether_protocol::{Frame, FrameKind};

use crate::wal::LogReader;
use crate::{Error, Result};

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
            Error::Invariant(format!(
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
pub(super) struct PendingChunk {
    pub(super) first_seq: u64,
    pub(super) count: u32,
    bytes: Vec<u8>,
}

impl PendingChunk {
    pub(super) fn new(first_seq: u64) -> Self {
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
    pub(super) fn next_seq(&self) -> u64 {
        self.first_seq + u64::from(self.count)
    }

    /// Whether `frame` still fits under [`CHUNK_MAX_BYTES`]. An empty chunk
    /// takes any frame, however big.
    pub(super) fn has_room_for(&self, frame: &Frame) -> bool {
        self.count == 0
            || self.bytes.len() + FRAME_HEAD_MAX_LEN + frame.payload.len() <= CHUNK_MAX_BYTES
    }

    pub(super) fn push(&mut self, frame: &Frame) -> Result<()> {
        let head = FrameHead {
            ts_micros: frame.ts_micros,
            kind: frame.kind,
            len: frame.payload.len() as u64,
        };
        let bytes = std::mem::take(&mut self.bytes);
        self.bytes = postcard::to_extend(&head, bytes)
            .map_err(|e| Error::storage("cannot encode frame", e))?;
        self.bytes.extend_from_slice(&frame.payload);
        self.count = self
            .count
            .checked_add(1)
            .ok_or_else(|| Error::Invariant("too many frames in one transaction".into()))?;
        Ok(())
    }

    /// The stored form: the count, then the frames.
    pub(super) fn finish(mut self) -> Vec<u8> {
        self.bytes[..COUNT_LEN].copy_from_slice(&self.count.to_le_bytes());
        self.bytes
    }
}

/// The key (first seq) of the chunk that would hold `seq`: the greatest at
/// or below it. The chunk may end before `seq`.
pub(super) fn chunk_holding(
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

/// The value of a chunk whose bytes the log keeps (see [`crate::wal`],
/// "Wrapping"): their position in the log, their length and CRC-32,
/// and the chunk's frame count. Told from a chunk by its first four bytes,
/// a frame count of zero, which no chunk has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct InLog {
    pub(super) at: u64,
    pub(super) len: u32,
    crc: u32,
    pub(super) count: u32,
}

/// The bytes of an [`InLog`] value: zero, count, position, length, CRC.
const IN_LOG_LEN: usize = 24;

impl InLog {
    /// Where `chunk`, kept in the log at `at`, is.
    pub(super) fn of(at: u64, chunk: &[u8]) -> Result<InLog> {
        let count = chunk_len(chunk).map_err(|e| Error::storage("a chunk built wrong", e))?;
        let len = u32::try_from(chunk.len())
            .map_err(|_| Error::Invariant("a chunk over 4 GiB".into()))?;
        Ok(InLog {
            at,
            len,
            crc: crc32fast::hash(chunk),
            count,
        })
    }

    pub(super) fn parse(value: &[u8]) -> Option<InLog> {
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

    pub(super) fn encode(&self) -> [u8; IN_LOG_LEN] {
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
pub(super) fn chunk_bytes<'b>(
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
        return Err(Error::Invariant(format!(
            "chunk {first} of stream {stream} is kept in the log {} at {}, but the bytes \
             there fail their check: the log was damaged or replaced",
            log.path().display(),
            in_log.at
        )));
    }
    Ok(Some(kept))
}

/// How many frames the chunk stored as `value` holds.
pub(super) fn stored_count(value: &[u8]) -> std::result::Result<u32, postcard::Error> {
    match InLog::parse(value) {
        Some(in_log) => Ok(in_log.count),
        None => chunk_len(value),
    }
}

/// [`chunk_bytes`] in the writer's own transaction: only the writer
/// appends, so the log cannot go over a chunk while it reads it, and if
/// it did that would be a bug, reported rather than worked round.
pub(super) fn own_chunk_bytes<'b>(
    value: &'b [u8],
    log: &LogReader,
    kept: &'b mut Vec<u8>,
    stream_id: u64,
    first: u64,
) -> Result<&'b [u8]> {
    chunk_bytes(value, log, kept, &format_args!("#{stream_id}"), first)?.ok_or_else(|| {
        Error::Invariant(format!(
            "a chunk of stream #{stream_id} kept in the log was written over while the \
             writer read it"
        ))
    })
}

/// The chunk that holds the frames of `chunk` (whose first seq is `first`)
/// from `from_seq` on.
pub(super) fn chunk_from(
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
pub(super) struct ChunkIter<'a> {
    chunk: &'a [u8],
    /// Where the next frame's head starts.
    pos: usize,
    next_seq: u64,
    remaining: u32,
}

impl<'a> ChunkIter<'a> {
    pub(super) fn new(first: u64, chunk: &'a [u8]) -> std::result::Result<Self, postcard::Error> {
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

pub(super) fn corrupt_frame(stream: &str, chunk: u64, e: &postcard::Error) -> Error {
    Error::storage(
        format!("stored chunk {chunk} of stream {stream} is unreadable"),
        e.clone(),
    )
}

pub(super) fn corrupt_chunk(stream_id: u64, chunk: u64, e: &postcard::Error) -> Error {
    corrupt_frame(&format!("#{stream_id}"), chunk, e)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::os::unix::fs::FileExt;

    use redb::ReadableDatabase;

    use super::*;
    use crate::store::schema::CHUNKS;
    use crate::store::tests::{frame, frame_of, logged_frames, store, SMALL_LOG};
    use crate::store::{guard_db, Store};

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
    fn a_chunk_whose_bytes_in_the_log_were_damaged_is_an_error_naming_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let store = Store::open_with_log(&path, SMALL_LOG).unwrap();
        logged_frames(&store, 1, 10);
        store.commit_durably().unwrap();
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
}
