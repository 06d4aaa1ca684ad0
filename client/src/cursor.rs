//! A tail's cursor file (`tether tail --cursor-file`, the SDKs'
//! `cursor_file`): the seq of the last processed frame, as decimal text and
//! a newline.
//!
//! It is replaced atomically (written to a temporary file in the same
//! directory, then renamed over the old one), so a reader or a crash at any
//! moment sees either the old position or the new one, never a torn file.
//! The file is not fsynced: it survives the crash of the process, which is
//! what it is for, but a power loss may bring back an older position.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The stored seq; `None` when the file does not exist or is empty (a
/// fresh start).
pub fn read(path: &Path) -> Result<Option<u64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(cursor_error(path, format!("cannot read it: {e}"), e)),
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(None);
    }
    trimmed.parse::<u64>().map(Some).map_err(|e| {
        cursor_error(
            path,
            format!("expected the seq of the last printed frame, found {trimmed:?}"),
            e,
        )
    })
}

/// Replaces the stored seq with `seq`, atomically.
pub fn write(path: &Path, seq: u64) -> Result<()> {
    let temp = temp_path(path);
    let outcome =
        std::fs::write(&temp, format!("{seq}\n")).and_then(|()| std::fs::rename(&temp, path));
    outcome.map_err(|e| {
        // Best effort: a leftover temporary file is harmless but untidy.
        let _ = std::fs::remove_file(&temp);
        cursor_error(path, format!("cannot update it: {e}"), e)
    })
}

/// A sibling of `path`, so that the rename stays on one file system.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "cursor".into());
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

fn cursor_error(
    path: &Path,
    detail: String,
    source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> Error {
    Error::Cursor {
        path: path.to_owned(),
        detail,
        source: source.into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_missing_or_empty_file_means_no_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cur");
        assert_eq!(read(&path).unwrap(), None);
        std::fs::write(&path, "").unwrap();
        assert_eq!(read(&path).unwrap(), None);
    }

    #[test]
    fn written_positions_read_back_and_replace_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cur");
        write(&path, 42).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "42\n");
        assert_eq!(read(&path).unwrap(), Some(42));
        write(&path, 43).unwrap();
        assert_eq!(read(&path).unwrap(), Some(43));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("cur")],
            "no temp file left"
        );
    }

    #[test]
    fn the_update_is_a_rename_not_an_overwrite_in_place() {
        // A reader holding the old file keeps seeing complete old contents.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cur");
        write(&path, 7).unwrap();
        let old = std::fs::File::open(&path).unwrap();
        write(&path, 1_000_000).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &old, &mut text).unwrap();
        assert_eq!(text, "7\n");
        assert_eq!(read(&path).unwrap(), Some(1_000_000));
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cur");
        std::fs::write(&path, "twelve\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("twelve"), "{err}");
    }

    #[test]
    fn an_unwritable_location_is_an_error_naming_the_file() {
        let path = Path::new("/nonexistent-dir/cur");
        let err = write(path, 1).unwrap_err().to_string();
        assert!(err.contains("/nonexistent-dir/cur"), "{err}");
    }
}
