//! Resident memory of a process, from `/proc/PID/status`.

use std::io;

/// A process's memory use, in KiB, as the kernel reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `VmRSS`: resident set size now.
    pub rss_kib: u64,
    /// `VmHWM`: the peak resident set size over the process's life.
    pub hwm_kib: u64,
}

impl Memory {
    /// The larger of the two readings, in MiB (rounded down).
    pub fn peak_mib(&self) -> u64 {
        self.rss_kib.max(self.hwm_kib) / 1024
    }
}

/// Reads `VmRSS` and `VmHWM` of process `pid`.
pub fn read(pid: u32) -> io::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mut mem = Memory::default();
    for line in status.lines() {
        if let Some(v) = line.strip_prefix("VmRSS:") {
            mem.rss_kib = parse_kib(v)?;
        } else if let Some(v) = line.strip_prefix("VmHWM:") {
            mem.hwm_kib = parse_kib(v)?;
        }
    }
    Ok(mem)
}

/// Parses a `/proc` size such as `"   12345 kB"`.
fn parse_kib(value: &str) -> io::Result<u64> {
    let number = value.trim().trim_end_matches("kB").trim();
    number.parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected /proc size {value:?}: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parses_proc_sizes_in_kib() {
        assert_eq!(parse_kib("\t   12345 kB").unwrap(), 12345);
    }

    #[test]
    fn reads_own_memory() {
        let mem = read(std::process::id()).unwrap();
        assert!(mem.rss_kib > 0 && mem.hwm_kib >= mem.rss_kib, "{mem:?}");
    }
}
