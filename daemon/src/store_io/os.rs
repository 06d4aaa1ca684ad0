//! The real files: [`std::fs::File`], with the system calls std does not
//! offer (`fallocate`, `fstatvfs`) made through `rustix`.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::{FileIo, Opener};

/// A file of the filesystem.
#[derive(Debug)]
pub struct OsFile {
    file: File,
}

impl OsFile {
    pub fn new(file: File) -> OsFile {
        OsFile { file }
    }
}

impl FileIo for OsFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(&self.file, buf, offset)
    }

    fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(&self.file, data, offset)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        match rustix::fs::fallocate(
            &self.file,
            rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        ) {
            Ok(()) => Ok(()),
            // Filesystems without fallocate (or without KEEP_SIZE) just
            // take blocks as they are written, as before.
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn free_space(&self) -> io::Result<u64> {
        let stat = rustix::fs::fstatvfs(&self.file)?;
        Ok(stat.f_bavail.saturating_mul(stat.f_frsize))
    }

    fn start_writeback(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // Neither std nor rustix offers `sync_file_range`.
        // SAFETY: a plain syscall on a descriptor `self.file` keeps open.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn lock_handle(&self) -> io::Result<Option<File>> {
        self.file.try_clone().map(Some)
    }
}

/// Opens files of the filesystem as [`OsFile`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsOpener;

impl Opener for OsOpener {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        use std::os::unix::fs::OpenOptionsExt;
        // State files are the owner's alone, whatever the directory's mode.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        keep_private(&file, path)?;
        Ok(Arc::new(OsFile::new(file)))
    }

    fn open_read(&self, path: &Path) -> io::Result<Arc<dyn FileIo>> {
        Ok(Arc::new(OsFile::new(File::open(path)?)))
    }
}

/// Narrows a state file that exists with a looser mode than 0600 (made
/// by an older version, or by hand) to 0600, and says so once: afterwards
/// it is 0600. A new file is created 0600 and left as it is. Only files:
/// directories are never chmodded.
pub fn keep_private(file: &File, path: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata()?.permissions().mode() & 0o7777;
    // Anything beyond the owner's own bits: group, others, set-id, sticky.
    if mode & !0o700 == 0 {
        return Ok(());
    }
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot narrow {} to mode 0600: {e}", path.display()),
            )
        })?;
    tracing::warn!(
        "{} had mode {mode:04o}: narrowed to 0600, as state files are the owner's alone",
        path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn an_os_file_reserves_blocks_without_changing_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.redb");
        let file = OsOpener.open(&path).unwrap();
        file.write_all_at(b"abc", 0).unwrap();
        file.allocate(0, 1 << 20).unwrap();
        assert_eq!(file.len().unwrap(), 3);
        file.set_len(4096).unwrap();
        let mut buf = [9u8; 5];
        file.read_exact_at(&mut buf, 1).unwrap();
        assert_eq!(&buf, b"bc\0\0\0");
        file.sync_data().unwrap();
        file.start_writeback().unwrap();
        assert!(file.free_space().unwrap() > 0);
        // Reopening keeps what the file holds; read-only refuses writes.
        let again = OsOpener.open_read(&path).unwrap();
        assert_eq!(again.len().unwrap(), 4096);
        let err = again.write_all_at(b"x", 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
        let mut past = [0u8; 2];
        let eof = again.read_exact_at(&mut past, 4095).unwrap_err();
        assert_eq!(eof.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_state_file_left_open_to_others_is_narrowed_to_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o7777;
        for (name, before, after) in [
            ("loose.redb", 0o644, 0o600),
            ("group.wal", 0o660, 0o600),
            ("strict.redb", 0o400, 0o400),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, b"kept").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(before)).unwrap();
            let file = File::open(&path).unwrap();
            keep_private(&file, &path).unwrap();
            assert_eq!(mode(&path), after, "{name}");
            assert_eq!(std::fs::read(&path).unwrap(), b"kept");
        }
        let path = dir.path().join("opened.redb");
        std::fs::write(&path, b"").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        OsOpener.open(&path).unwrap();
        assert_eq!(mode(&path), 0o600);
    }
}
