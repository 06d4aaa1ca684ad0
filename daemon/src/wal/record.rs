//! A record's bytes (see [`crate::wal`], "Records"): its header, and its
//! body, the changes as postcard [`Op`]s.

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Bytes before a record's body: length, checksum, number.
pub const HEADER_LEN: usize = 16;

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
    /// A checkpoint of an execution, as stored (an encoded
    /// [`Record`](crate::checkpoint::Record)). Added in store version 4,
    /// as are the ops after it: an older build cannot decode them.
    Checkpoint {
        execution: &'a str,
        id: u64,
        record: RawBytes<'a>,
    },
    /// Every checkpoint of an execution with an id below `below` removed.
    RemoveCheckpointsBelow { execution: &'a str, below: u64 },
    /// A durable step's result, and when it was recorded.
    Step {
        execution: &'a str,
        step: &'a str,
        result: RawBytes<'a>,
        recorded_micros: u64,
    },
    /// A durable step's result forgotten.
    ClearStep { execution: &'a str, step: &'a str },
    /// A question, as stored (an encoded
    /// [`QuestionRecord`](crate::gates::QuestionRecord)): asked, or
    /// closed. Added in store version 5, as are the ops after it.
    Question {
        execution: &'a str,
        id: u64,
        record: RawBytes<'a>,
    },
    /// The id the next question gets.
    NextQuestionId(u64),
    /// A message queued in an execution's inbox, as stored (an encoded
    /// [`InboxMessage`](tether_protocol::InboxMessage)).
    InboxPut {
        execution: &'a str,
        id: u64,
        message: RawBytes<'a>,
    },
    /// Every message of an execution's inbox with an id up to `through`
    /// removed.
    InboxRemoveThrough { execution: &'a str, through: u64 },
    /// The id the next inbox message gets.
    NextMessageId(u64),
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
    pub(super) bytes: Vec<u8>,
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
    pub(super) fn clear(&mut self) {
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
    pub(super) fn seal(&mut self, number: u64) -> Result<&[u8]> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::wal::tests::{chunk, record};

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
            Op::Checkpoint {
                execution: "e",
                id: 5,
                record: RawBytes(b"ck"),
            },
            Op::RemoveCheckpointsBelow {
                execution: "e",
                below: 3,
            },
            Op::Step {
                execution: "e",
                step: "fetch",
                result: RawBytes(b"ok"),
                recorded_micros: 11,
            },
            Op::ClearStep {
                execution: "e",
                step: "fetch",
            },
            Op::Question {
                execution: "e",
                id: 1,
                record: RawBytes(b"q"),
            },
            Op::NextQuestionId(2),
            Op::InboxPut {
                execution: "e",
                id: 7,
                message: RawBytes(b"m"),
            },
            Op::InboxRemoveThrough {
                execution: "e",
                through: 7,
            },
            Op::NextMessageId(8),
        ];
        let r = record(&all);
        let decoded: Vec<Op<'_>> = ops(&r.bytes[HEADER_LEN..]).collect::<Result<_>>().unwrap();
        assert_eq!(decoded, all);
        // An op's variant index is its first byte on disk: the ops of
        // versions 4 and 5 come after every older one, which keep theirs.
        let tags: Vec<u8> = all
            .iter()
            .map(|op| postcard::to_allocvec(op).unwrap()[0])
            .collect();
        assert_eq!(tags, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
    }
}
