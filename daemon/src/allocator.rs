//! The daemon's memory allocator: mimalloc, told to hand freed memory back
//! to the system within a few milliseconds.
//!
//! Why not the system allocator: on the hot path frames are allocated on
//! the session threads and freed on the writer thread (or the other way
//! round). glibc's malloc takes an arena lock for every such free and
//! consolidates its bins often; that was about a quarter of the session
//! threads' CPU time. With mimalloc the daemon's CPU per frame drops by a
//! fifth on W1 and by a third on W2 (see README, Performance).
//!
//! Why the purge delay: mimalloc keeps freed pages for a second by default
//! before returning them, which raised the daemon's peak resident memory
//! under W2 from 56 to 66 MiB. At 10 ms it is back to 55 MiB. Shorter is
//! slower where large buffers come and go: at 2 ms, replays (a buffer of
//! about 150 KiB per store read) paid for faulting freshly purged pages
//! back in. Transparent huge pages are off (the `no_thp` feature): with them W1
//! peaked at 70 MiB instead of 30.
//!
//! This module belongs to the `tetherd` binary, not the library: embedding
//! programs and the tests keep their own allocator.

use libmimalloc_sys::{mi_option_set, mi_option_t};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h's `mi_option_e`, which the `-sys`
/// crate does not name. The enum only ever grows at its end (deprecated
/// entries keep their place), so the index is stable; a test checks it
/// against the option's unique default.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// Milliseconds mimalloc keeps freed memory before giving it back.
const PURGE_DELAY_MS: std::os::raw::c_long = 10;

/// Applies the allocator settings. Called first thing in `main`.
pub fn configure() {
    #[allow(unsafe_code)]
    // SAFETY: mi_option_set only stores a value in mimalloc's option table,
    // which it reads atomically; any option index and value are accepted.
    unsafe {
        mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libmimalloc_sys::mi_option_get;

    fn purge_delay_ms() -> std::os::raw::c_long {
        #[allow(unsafe_code)]
        // SAFETY: mi_option_get only reads mimalloc's option table.
        unsafe {
            mi_option_get(MI_OPTION_PURGE_DELAY)
        }
    }

    #[test]
    fn the_option_index_is_the_purge_delay() {
        // 1000 ms is the purge delay's default and no other option's: if
        // the index named another option, this would fail. Nothing in this
        // test binary calls `configure`.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(purge_delay_ms(), 1000);
        }
        configure();
        assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
    }
}
