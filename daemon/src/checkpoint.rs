//! Checkpoints: the stored record, its checksum, and what a new attempt
//! resumes from.
//!
//! A checkpoint is kept in the store's `checkpoints` table under
//! (execution, id) as one postcard [`Record`]. Ids increase per execution;
//! the writer thread assigns them, and in the same write transaction reads
//! the execution stream's last seq into the record and deletes the
//! checkpoints beyond the newest N. Durable steps live in the `steps`
//! table beside them; their values are the worker's bytes as given.
//!
//! Metadata a user keeps with a checkpoint (`--meta K=V`) follows the
//! record as a [`Trailer`] with a CRC-32 of its own. A record without
//! metadata has no trailer, so its bytes are those of a build that knew
//! no metadata: such records, old or new, read as having none, and an
//! older build reading a newer record ignores the trailer.
//!
//! Every record carries a CRC-32 over its header fields and its data. A
//! record whose checksum does not match (or that does not decode at all) is
//! *invalid*: it is listed with `valid: false`, skipped with a warning when
//! loading, and never handed to a worker. Loading and resuming both use the
//! newest valid checkpoint.
//!
//! A durable step keeps the first result recorded under its name, so a
//! resumed attempt gets that result back instead of running the step again.
//!
//! Resuming: every attempt after the first (a restart after a failure, a
//! lost shim, or recovery at start) begins with a commit that, in the same
//! write transaction, looks up the newest valid checkpoint ([`Resume`]) and
//! appends one lifecycle event after "starting attempt N": "resumed from
//! checkpoint K (seq S); frames S+1..T came from the abandoned attempt" (T
//! is the stream's last seq before that event), or "no valid checkpoint;
//! starting fresh" when every stored one is invalid, or nothing when there
//! are none. Only a resumed attempt's `ShimSpec` has `resumed` set, which
//! the shim turns into `TETHER_RESUMED=1`; the worker then loads the
//! checkpoint itself. Nothing in the stream is deleted or rewritten:
//! readers see the abandoned attempt's output, then the event that says
//! where the new attempt took up.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tether_protocol::{Checkpoint, CheckpointFull, CheckpointMeta, CheckpointRef, UserMeta};

use crate::{Error, Result};

/// A running CRC-32 (IEEE 802.3, as zlib and PNG use it), so that a header
/// and a payload stored apart can be checked without copying them
/// together. Computed by `crc32fast`, which uses the CPU's carry-less
/// multiply where it has one: a megabyte in tens of microseconds rather
/// than the milliseconds of a byte-at-a-time table.
#[derive(Clone, Debug, Default)]
pub struct Crc32(crc32fast::Hasher);

impl Crc32 {
    /// A CRC over nothing yet.
    pub fn new() -> Self {
        Self(crc32fast::Hasher::new())
    }

    /// Feeds `bytes`.
    #[must_use]
    pub fn update(mut self, bytes: &[u8]) -> Self {
        self.0.update(bytes);
        self
    }

    /// The CRC of everything fed.
    pub fn finish(self) -> u32 {
        self.0.finalize()
    }
}

/// The CRC-32 (IEEE) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    Crc32::new().update(bytes).finish()
}

/// A stored checkpoint, borrowing its data from the page it was read from.
///
/// Postcard is not self-describing: the field order is the on-disk format.
/// A byte slice and a `Bytes` are both written as a varint length and the
/// bytes, so [`encode_record`] and [`decode_record`] agree.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// The worker's own version of the data's format.
    pub schema_version: u32,
    /// [`record_checksum`] of the other fields.
    pub checksum: u32,
    /// When the checkpoint was committed, microseconds since the Unix epoch.
    pub created_micros: u64,
    /// The execution stream's last seq when the checkpoint was committed.
    pub seq: u64,
    #[serde(borrow, serialize_with = "as_byte_string")]
    pub data: &'a [u8],
}

/// Writes a slice as one byte string (a length and a copy) rather than as
/// a sequence of separately encoded bytes; the encoding is the same.
fn as_byte_string<S: serde::Serializer>(data: &&[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(data)
}

/// The checksum a record stores: CRC-32 over the header fields (little
/// endian) and the data, so that a damaged header is caught as well as
/// damaged data.
pub fn record_checksum(schema_version: u32, created_micros: u64, seq: u64, data: &[u8]) -> u32 {
    Crc32::new()
        .update(&schema_version.to_le_bytes())
        .update(&created_micros.to_le_bytes())
        .update(&seq.to_le_bytes())
        .update(data)
        .finish()
}

/// What follows a record that has user metadata.
#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
struct Trailer {
    user_meta: UserMeta,
    /// [`trailer_checksum`] of `user_meta`.
    checksum: u32,
}

/// CRC-32 over the metadata's keys and values, each preceded by its
/// length (little endian), so that moving bytes from a key to a value is
/// caught.
fn trailer_checksum(user_meta: &UserMeta) -> u32 {
    let mut crc = Crc32::new();
    for (key, value) in user_meta {
        crc = crc
            .update(&(key.len() as u64).to_le_bytes())
            .update(key.as_bytes())
            .update(&(value.len() as u64).to_le_bytes())
            .update(value.as_bytes());
    }
    crc.finish()
}

/// The stored form of a new checkpoint, with its checksum, and its user
/// metadata (if any) in a trailer.
pub fn encode_record(
    schema_version: u32,
    created_micros: u64,
    seq: u64,
    data: &[u8],
    user_meta: &UserMeta,
) -> Result<Vec<u8>> {
    let record = Record {
        schema_version,
        checksum: record_checksum(schema_version, created_micros, seq, data),
        created_micros,
        seq,
        data,
    };
    // Room for the header's varints, so that the data is copied once.
    let buf = Vec::with_capacity(data.len() + 32);
    let buf = postcard::to_extend(&record, buf)
        .map_err(|e| Error::storage("cannot encode a checkpoint", e))?;
    if user_meta.is_empty() {
        return Ok(buf);
    }
    let trailer = Trailer {
        user_meta: user_meta.clone(),
        checksum: trailer_checksum(user_meta),
    };
    postcard::to_extend(&trailer, buf)
        .map_err(|e| Error::storage("cannot encode a checkpoint's metadata", e))
}

/// Decodes a stored record; `None` when it does not even decode.
pub fn decode_record(bytes: &[u8]) -> Option<Record<'_>> {
    postcard::take_from_bytes(bytes)
        .ok()
        .map(|(record, _)| record)
}

/// The user metadata after a record: empty when there is no trailer,
/// `None` when there is one that does not decode or check.
fn decode_trailer(bytes: &[u8]) -> Option<UserMeta> {
    let (_, rest) = postcard::take_from_bytes::<Record<'_>>(bytes).ok()?;
    if rest.is_empty() {
        return Some(UserMeta::new());
    }
    match postcard::take_from_bytes::<Trailer>(rest) {
        Ok((trailer, [])) if trailer.checksum == trailer_checksum(&trailer.user_meta) => {
            Some(trailer.user_meta)
        }
        _ => None,
    }
}

/// What one stored record is: its listing, and its data when it is valid.
#[derive(Debug)]
pub struct Inspected<'a> {
    pub meta: CheckpointMeta,
    /// What was saved with `--meta`; empty for an invalid record.
    pub user_meta: UserMeta,
    /// `Some` exactly when `meta.valid`.
    pub data: Option<&'a [u8]>,
}

/// Looks at the record stored as checkpoint `id`. A record that does not
/// decode is listed with its raw size and zeros for what cannot be read.
pub fn inspect(id: u64, bytes: &[u8]) -> Inspected<'_> {
    let Some(record) = decode_record(bytes) else {
        return Inspected {
            meta: CheckpointMeta {
                id,
                seq: 0,
                schema_version: 0,
                size: bytes.len() as u64,
                created_micros: 0,
                valid: false,
            },
            user_meta: UserMeta::new(),
            data: None,
        };
    };
    let trailer = decode_trailer(bytes);
    let valid = trailer.is_some()
        && record.checksum
            == record_checksum(
                record.schema_version,
                record.created_micros,
                record.seq,
                record.data,
            );
    Inspected {
        meta: CheckpointMeta {
            id,
            seq: record.seq,
            schema_version: record.schema_version,
            size: record.data.len() as u64,
            created_micros: record.created_micros,
            valid,
        },
        user_meta: trailer.filter(|_| valid).unwrap_or_default(),
        data: valid.then_some(record.data),
    }
}

/// Logs a checkpoint that is skipped because it is invalid.
pub fn warn_invalid(execution: &str, id: u64) {
    tracing::warn!(
        execution,
        "checkpoint {id} of {execution} fails its checksum; skipping it for an older one"
    );
}

/// The checkpoint to hand out for the record stored as `id`, when it is
/// valid; an invalid one is logged.
pub fn loadable(execution: &str, id: u64, bytes: &[u8]) -> Option<Checkpoint> {
    let inspected = inspect(id, bytes);
    match inspected.data {
        Some(data) => Some(Checkpoint {
            data: Bytes::copy_from_slice(data),
            meta: inspected.meta,
        }),
        None => {
            warn_invalid(execution, id);
            None
        }
    }
}

/// [`loadable`] with the user metadata, when the record is valid and of
/// `schema_version` if one is asked for. A record of another version is
/// passed over in silence; an invalid one is logged.
pub fn loadable_full(
    execution: &str,
    id: u64,
    bytes: &[u8],
    schema_version: Option<u32>,
) -> Option<CheckpointFull> {
    let inspected = inspect(id, bytes);
    let Some(data) = inspected.data else {
        warn_invalid(execution, id);
        return None;
    };
    if schema_version.is_some_and(|v| v != inspected.meta.schema_version) {
        return None;
    }
    Some(CheckpointFull {
        meta: inspected.meta,
        user_meta: inspected.user_meta,
        data: Bytes::copy_from_slice(data),
    })
}

/// What `ps` shows of a valid checkpoint.
pub fn reference(meta: &CheckpointMeta) -> CheckpointRef {
    CheckpointRef {
        seq: meta.seq,
        created_micros: meta.created_micros,
    }
}

/// The refusal of a checkpoint (or step result) over the size limit.
pub fn too_large(what: &str, size: usize, limit: usize) -> Error {
    Error::InvalidRequest(format!(
        "{what} of {size} bytes exceeds the limit of {limit} bytes"
    ))
}

/// Longest durable step name accepted, in bytes.
pub const MAX_STEP_NAME: usize = 1024;

/// Checks a durable step's name: 1 to [`MAX_STEP_NAME`] bytes. Any text is
/// allowed otherwise (it is only ever a key).
pub fn validate_step_name(step: &str) -> Result<()> {
    if step.is_empty() || step.len() > MAX_STEP_NAME {
        return Err(Error::InvalidRequest(format!(
            "step name of {} bytes: it must be 1 to {MAX_STEP_NAME} bytes",
            step.len()
        )));
    }
    Ok(())
}

/// What a new attempt of an execution resumes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The execution has no checkpoint: the attempt starts fresh, and no
    /// frame says so (nothing was lost).
    Fresh,
    /// Checkpoints exist but none is valid: the attempt starts fresh.
    NoValid,
    /// The attempt resumes from `checkpoint`, taken at stream seq `seq`;
    /// frames `seq + 1 ..= through` came from the abandoned attempt (and the
    /// lifecycle events since).
    From {
        checkpoint: u64,
        seq: u64,
        through: u64,
    },
}

impl Resume {
    /// Whether the worker is told it resumes (`TETHER_RESUMED=1`).
    pub fn resumed(&self) -> bool {
        matches!(self, Resume::From { .. })
    }

    /// The lifecycle frame announcing it, if any.
    pub fn event(&self) -> Option<String> {
        match self {
            Resume::Fresh => None,
            Resume::NoValid => Some("no valid checkpoint; starting fresh".to_owned()),
            Resume::From {
                checkpoint,
                seq,
                through,
            } => Some(format!(
                "resumed from checkpoint {checkpoint} (seq {seq}); frames {}..{through} came \
                 from the abandoned attempt",
                seq + 1
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
        assert_eq!(
            Crc32::new().update(b"1234").update(b"56789").finish(),
            0xCBF4_3926,
            "feeding in pieces gives the same CRC"
        );
    }

    #[test]
    fn a_record_round_trips_and_is_valid() {
        let bytes = encode_record(3, 1_700_000_000_000_000, 42, b"state", &vec![]).unwrap();
        let record = decode_record(&bytes).unwrap();
        assert_eq!(record.schema_version, 3);
        assert_eq!(record.seq, 42);
        assert_eq!(record.data, b"state");
        let inspected = inspect(7, &bytes);
        assert!(inspected.meta.valid);
        assert_eq!(inspected.meta.id, 7);
        assert_eq!(inspected.meta.size, 5);
        assert_eq!(inspected.data, Some(&b"state"[..]));
    }

    #[test]
    fn the_record_format_is_frozen() {
        let bytes = encode_record(1, 2, 3, b"ab", &vec![]).unwrap();
        let checksum = record_checksum(1, 2, 3, b"ab").to_le_bytes();
        // schema 1, checksum as a varint, created 2, seq 3, len 2, "ab".
        let mut expected = vec![1];
        expected.extend(postcard::to_allocvec(&u32::from_le_bytes(checksum)).unwrap());
        expected.extend([2, 3, 2, b'a', b'b']);
        assert_eq!(bytes, expected);
    }

    #[test]
    fn a_flipped_byte_anywhere_makes_the_record_invalid() {
        let meta = vec![("model".to_owned(), "m1".to_owned())];
        for bytes in [
            encode_record(2, 99, 5, b"some checkpoint data", &vec![]).unwrap(),
            encode_record(2, 99, 5, b"some checkpoint data", &meta).unwrap(),
        ] {
            a_flipped_byte_anywhere_makes_invalid(&bytes);
        }
    }

    fn a_flipped_byte_anywhere_makes_invalid(bytes: &[u8]) {
        for i in 0..bytes.len() {
            let mut damaged = bytes.to_vec();
            damaged[i] ^= 0x01;
            let inspected = inspect(1, &damaged);
            assert!(!inspected.meta.valid, "byte {i} flipped went unnoticed");
            assert_eq!(inspected.data, None);
        }
        assert!(loadable("x", 1, bytes).is_some());
        assert!(loadable("x", 1, &bytes[..bytes.len() - 1]).is_none());
    }

    #[test]
    fn user_metadata_rides_in_a_trailer_that_old_records_lack() {
        let meta = vec![
            ("model".to_owned(), "m1".to_owned()),
            ("k".to_owned(), "v=w".to_owned()),
        ];
        let plain = encode_record(2, 99, 5, b"data", &vec![]).unwrap();
        let with = encode_record(2, 99, 5, b"data", &meta).unwrap();
        assert!(with.starts_with(&plain), "the trailer only follows");
        assert_eq!(inspect(1, &plain).user_meta, UserMeta::new());
        let inspected = inspect(1, &with);
        assert!(inspected.meta.valid);
        assert_eq!(inspected.user_meta, meta);
        let full = loadable_full("x", 1, &with, Some(2)).unwrap();
        assert_eq!((full.user_meta, &full.data[..]), (meta, &b"data"[..]));
        assert!(loadable_full("x", 1, &with, Some(3)).is_none());
        assert!(loadable_full("x", 1, &with, None).is_some());
    }

    #[test]
    fn resume_events_name_the_checkpoint_and_the_abandoned_frames() {
        let from = Resume::From {
            checkpoint: 4,
            seq: 17,
            through: 23,
        };
        assert!(from.resumed());
        assert_eq!(
            from.event().unwrap(),
            "resumed from checkpoint 4 (seq 17); frames 18..23 came from the abandoned attempt"
        );
        assert!(!Resume::NoValid.resumed());
        assert_eq!(
            Resume::NoValid.event().unwrap(),
            "no valid checkpoint; starting fresh"
        );
        assert_eq!(Resume::Fresh.event(), None);
    }

    #[test]
    fn step_names_are_bounded() {
        assert!(validate_step_name("step 3: fetch").is_ok());
        assert!(validate_step_name("").is_err());
        assert!(validate_step_name(&"x".repeat(MAX_STEP_NAME + 1)).is_err());
    }
}
