//! Descriptors a process inherited, kept from the programs it starts.
//!
//! A worker starts with stdin, stdout and stderr and nothing else. Both
//! tetherd and the shim open every descriptor of their own with
//! close-on-exec, but whoever started them may have left others open
//! without it (a shell's `exec 10<file`, a parent's pipe), and `fork` +
//! `exec` would pass those on: from the daemon to every shim, from a shim
//! to its worker. So each marks every inherited descriptor above 2
//! close-on-exec at start, before any thread exists. (The daemon keeps the
//! service manager's sockets, `$LISTEN_FDS`, out of it: it adopts them.)
//!
//! rustix offers no `close_range`, so the descriptors are found by listing
//! `/proc/self/fd`.

use std::io;
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use rustix::fs::{Dir, Mode, OFlags};
use rustix::io::{fcntl_getfd, fcntl_setfd, Errno, FdFlags};

/// Marks every open descriptor above 2, except those in `keep`,
/// close-on-exec; returns how many lacked it. Call it before any other
/// thread starts, so that no descriptor listed is closed meanwhile.
pub fn close_on_exec_except(keep: Range<RawFd>) -> io::Result<usize> {
    let listing = rustix::fs::open(
        "/proc/self/fd",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io::Error::new(e.kind(), format!("cannot list /proc/self/fd: {e}")))?;
    let mut dir = Dir::new(listing)?;
    let own = dir.fd()?.as_raw_fd();
    let mut marked = 0;
    while let Some(entry) = dir.read() {
        let entry = entry?;
        // "." and ".." are not numbers.
        let Some(fd) = entry
            .file_name()
            .to_str()
            .ok()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        if fd <= 2 || fd == own || keep.contains(&fd) {
            continue;
        }
        if mark(fd)? {
            marked += 1;
        }
    }
    Ok(marked)
}

/// Sets close-on-exec on `fd`; `false` when it was set already.
#[allow(unsafe_code)]
fn mark(fd: RawFd) -> io::Result<bool> {
    // SAFETY: `fd` was listed in /proc/self/fd while the listing stays
    // open, so it is an open descriptor of this process, and no other
    // thread runs yet to close it while it is borrowed here for two
    // `fcntl` calls that change nothing but its close-on-exec flag. (Where
    // threads do run, in unit tests, a number closed meanwhile fails with
    // EBADF, and one reused meanwhile was opened close-on-exec already.)
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let flags = match fcntl_getfd(borrowed) {
        Ok(flags) => flags,
        // Closed since it was listed: only where threads run already
        // (unit tests); it is then passed on to nobody.
        Err(e) if e == Errno::BADF => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    if flags.contains(FdFlags::CLOEXEC) {
        return Ok(false);
    }
    fcntl_setfd(borrowed, flags | FdFlags::CLOEXEC)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn close_on_exec(file: &std::fs::File) -> bool {
        fcntl_getfd(file).unwrap().contains(FdFlags::CLOEXEC)
    }

    #[test]
    fn inherited_descriptors_are_marked_but_kept_ones_are_not() {
        // Two descriptors as a parent would leave them: without
        // close-on-exec (std opens with it, so it is cleared here).
        let passed = std::fs::File::open("/dev/null").unwrap();
        let kept = std::fs::File::open("/dev/null").unwrap();
        for file in [&passed, &kept] {
            fcntl_setfd(file, FdFlags::empty()).unwrap();
        }
        let kept_fd = kept.as_raw_fd();
        let marked = close_on_exec_except(kept_fd..kept_fd + 1).unwrap();
        assert!(marked >= 1, "{marked}");
        assert!(close_on_exec(&passed));
        assert!(!close_on_exec(&kept));
        // Marking again finds nothing new among these.
        close_on_exec_except(kept_fd..kept_fd + 1).unwrap();
        assert!(!close_on_exec(&kept));
    }
}
