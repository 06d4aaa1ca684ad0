//! Descriptors the shim inherited, kept from its worker.
//!
//! A worker starts with stdin, stdout and stderr and nothing else. The shim
//! opens every descriptor of its own with close-on-exec (std and tokio do),
//! and tetherd passes a shim nothing but its three, but a shim started by
//! anyone else (an older daemon, a person debugging) may hold more without
//! the flag, and the worker would get them. So the shim marks every
//! descriptor above 2 close-on-exec before it starts anything.
//!
//! rustix offers no `close_range`, so the descriptors are found by listing
//! `/proc/self/fd`.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use rustix::fs::{Dir, Mode, OFlags};
use rustix::io::{fcntl_getfd, fcntl_setfd, Errno, FdFlags};

/// Marks every open descriptor above 2 close-on-exec; returns how many
/// lacked it. Call it before any other thread starts, so that no
/// descriptor listed is closed meanwhile.
pub fn close_on_exec() -> io::Result<usize> {
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
        if fd > 2 && fd != own && mark(fd)? {
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

    #[test]
    fn a_descriptor_left_open_across_exec_is_marked() {
        // As a parent would leave it: without close-on-exec (std opens
        // with it, so it is cleared here).
        let passed = std::fs::File::open("/dev/null").unwrap();
        fcntl_setfd(&passed, FdFlags::empty()).unwrap();
        assert!(close_on_exec().unwrap() >= 1);
        assert!(fcntl_getfd(&passed).unwrap().contains(FdFlags::CLOEXEC));
    }
}
