//! Helpers that the tests of every file of the seam share.

use std::io;

pub(super) const ENOSPC: i32 = libc::ENOSPC;
pub(super) const EIO: i32 = libc::EIO;

pub(super) fn errno(r: io::Result<()>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}
