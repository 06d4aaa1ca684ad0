//! Hooks for tests of the daemon's handling of damaged files, built only
//! with the `test-hooks` feature so that a release build cannot damage a
//! store.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::schema::{StreamMeta, CHECKPOINTS, CHUNKS, STREAMS};
use super::storage;
use super::txn::commit;
use super::Store;
use crate::{Error, Result};

/// Damages checkpoint `id` of `execution` in the store file at `path`: one
/// byte of its stored data is flipped and its checksum left as it was, so
/// that it must be found invalid. The file must not be open in a running
/// daemon. For tests of corruption handling only.
#[doc(hidden)]
pub fn corrupt_checkpoint_for_tests(path: &Path, execution: &str, id: u64) -> Result<()> {
    // A checkpoint saved just before a crash may be in the log alone: the
    // store is opened first (applying the log) and committed durably, so
    // that the file holds it and no later replay puts it back whole.
    let store = Store::open(path)?;
    store.commit_durably()?;
    store.close()?;
    drop(store);
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

/// Deletes the chunk of `stream` that starts at `first_seq` from the store
/// file at `path`, leaving the stream's metadata as it was: the stream's
/// seqs then jump over that chunk's, as no crash can leave them. The file
/// must not be open in a running daemon. For tests of damage only.
#[doc(hidden)]
pub fn remove_chunk_for_tests(path: &Path, stream: &str, first_seq: u64) -> Result<()> {
    let db = Database::create(path).map_err(storage)?;
    let txn = db.begin_write().map_err(storage)?;
    {
        let streams = txn.open_table(STREAMS).map_err(storage)?;
        let meta = streams.get(stream).map_err(storage)?.ok_or_else(|| {
            Error::InvalidRequest(format!("no stream {stream:?} in {}", path.display()))
        })?;
        let meta: StreamMeta = postcard::from_bytes(meta.value())
            .map_err(|e| Error::storage("decoding a stream's metadata", e))?;
        let mut chunks = txn.open_table(CHUNKS).map_err(storage)?;
        if chunks
            .remove((meta.id, first_seq))
            .map_err(storage)?
            .is_none()
        {
            return Err(Error::InvalidRequest(format!(
                "no chunk of {stream:?} starts at seq {first_seq} in {}",
                path.display()
            )));
        }
    }
    commit(txn)?;
    db.close().map_err(storage)
}
