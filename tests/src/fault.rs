//! Helpers of the fault tests: a small tmpfs to fill up, and a stream read
//! back as durable frames over the raw protocol.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for one test, unmounted on drop.
#[derive(Debug)]
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it: `4m`) on
    /// `path`, creating the directory. `Err` when the test may not mount
    /// (not root, or no mount privilege in this container).
    pub fn mount(path: &Path, size: &str) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        let options = format!("size={size},mode=0700");
        run_mount(&["-t", "tmpfs", "-o", &options, "tmpfs", path_str(path)?])?;
        Ok(Self {
            path: path.to_owned(),
        })
    }

    /// Grows (or shrinks) the mounted tmpfs in place; the files stay.
    pub fn resize(&self, size: &str) {
        let options = format!("remount,size={size}");
        run_mount(&["-o", &options, path_str(&self.path).unwrap()])
            .unwrap_or_else(|e| panic!("cannot resize the tmpfs to {size}: {e}"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy, so that a process the test left behind cannot keep it busy.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

fn path_str(path: &Path) -> io::Result<&str> {
    path.to_str()
        .ok_or_else(|| io::Error::other(format!("{} is not UTF-8", path.display())))
}

fn run_mount(args: &[&str]) -> io::Result<()> {
    let out = Command::new("mount").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "mount {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// True when the tests run as root (and so may mount and raise limits).
#[allow(unsafe_code)]
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() == 0 }
}
