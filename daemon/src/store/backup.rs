//! Copies of the store's files set aside in the state directory before
//! anything changes them: the damaged files before `tetherd repair`
//! (`damaged-<UTC time>/`), an older store before it is upgraded
//! (`backup-<version>-<UTC time>/`). Each copy is synced, with its
//! directory, before the caller goes on.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use tether_protocol::time::{now_micros, CompactUtc};

use crate::{Error, Result};

/// Copies `files` into a new directory `<prefix>-<UTC time>` of `dir`
/// (`-2`, `-3`... added if that exists), synced; returns the directory.
/// On failure, what was copied is removed again.
pub(super) fn copy_aside(dir: &Path, prefix: &str, files: &[&Path]) -> Result<PathBuf> {
    let stamp = CompactUtc(now_micros());
    let mut to = dir.join(format!("{prefix}-{stamp}"));
    let mut n = 1;
    while to.exists() {
        n += 1;
        to = dir.join(format!("{prefix}-{stamp}-{n}"));
    }
    create_private_dir(&to)?;
    let copied = copy_into(&to, files).and_then(|()| sync_dir(dir));
    if let Err(e) = copied {
        let _ = fs::remove_dir_all(&to);
        return Err(e);
    }
    Ok(to)
}

fn copy_into(to: &Path, files: &[&Path]) -> Result<()> {
    for file in files {
        let Some(name) = file.file_name() else {
            continue;
        };
        let copy = to.join(name);
        fs::copy(file, &copy).map_err(|e| io_error("cannot copy to", &copy, e))?;
        fs::File::open(&copy)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_error("cannot sync", &copy, e))?;
    }
    sync_dir(to)
}

/// Creates `dir`, readable by its owner only.
pub(super) fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io_error("cannot create", dir, e))
}

/// Writes `bytes` as the whole of `path` (mode 0600) and syncs it.
pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .map_err(|e| io_error("cannot write", path, e))
}

/// Syncs `dir`, so that the names made or moved in it last.
pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error("cannot sync the directory", dir, e))
}

pub(super) fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::io(format!("{what} {}", path.display()), e)
}
