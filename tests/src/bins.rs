//! Locating the executables under test.
//!
//! Cargo puts an integration-test binary in `target/<profile>/deps/` and the
//! package binaries one level up, in `target/<profile>/`. The test package
//! cannot make cargo build another package's binaries, so a missing binary
//! is reported with the command that builds everything.

use std::path::{Path, PathBuf};

/// The `tetherd` daemon executable.
pub fn tetherd() -> PathBuf {
    find("tetherd")
}

/// The `tether` client executable.
pub fn tether() -> PathBuf {
    find("tether")
}

/// The `tether-shim` executable tetherd starts for each worker attempt.
pub fn tether_shim() -> PathBuf {
    find("tether-shim")
}

/// `tether-it-listener`, this package's stand-in for a socket another
/// user listens on.
pub fn listener() -> PathBuf {
    find("tether-it-listener")
}

fn find(name: &str) -> PathBuf {
    let exe = std::env::current_exe()
        .unwrap_or_else(|e| panic!("cannot find the running test executable: {e}"));
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| panic!("test executable {} has no grandparent", exe.display()));
    let path = profile_dir.join(name);
    if !path.is_file() {
        panic!(
            "`{name}` is not built (looked for {}): run `cargo test --workspace`, which \
             builds the tetherd and tether binaries before any test runs",
            path.display()
        );
    }
    path
}
