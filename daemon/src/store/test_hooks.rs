//! Hooks for tests of the daemon's handling of damaged files, built only
//! with the `test-hooks` feature so that a release build cannot damage a
//! store.

use std::path::Path;

use redb::{Database, ReadableTable};

use super::schema::CHECKPOINTS;
use super::storage;
use super::txn::commit;
use crate::{Error, Result};

/// Damages checkpoint `id` of `execution` in the store file at `path`: one
/// byte of its stored data is flipped and its checksum left as it was, so
/// that it must be found invalid. The file must not be open in a running
/// daemon. For tests of corruption handling only.
#[doc(hidden)]
pub fn corrupt_checkpoint_for_tests(path: &Path, execution: &str, id: u64) -> Result<()> {
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
