//! Process identity from procfs: a pid names a process only together with
//! its start time, because pids are recycled. The start time is field 22 of
//! `/proc/PID/stat` (clock ticks since boot), and it means something only
//! within one boot, named by `/proc/sys/kernel/random/boot_id`.

use std::io;

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks
/// after boot.
pub fn start_ticks(pid: u32) -> io::Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path)?;
    parse_start_ticks(&stat).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{path} has no start time in field 22"),
        )
    })
}

/// The start time in a `/proc/PID/stat` line. The command name (field 2)
/// is in parentheses and may itself contain spaces and parentheses, so
/// fields are counted from the last `)`: the first field after it is
/// field 3.
pub fn parse_start_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}

/// This boot's id, without its trailing newline.
pub fn boot_id() -> io::Result<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(id.trim().to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_start_time_is_counted_from_the_last_parenthesis() {
        let stat = "4242 (we)ird ) name) S 1 4242 4242 0 -1 4194560 180 0 0 0 \
                    1 2 0 0 20 0 1 0 987654 1234567 100 18446744073709551615";
        assert_eq!(parse_start_ticks(stat), Some(987_654));
        assert_eq!(parse_start_ticks("1 (x) S 1 2"), None);
        assert_eq!(parse_start_ticks("no parenthesis"), None);
    }

    #[test]
    fn this_process_has_a_start_time_and_the_boot_has_an_id() {
        let ticks = start_ticks(std::process::id()).unwrap();
        assert!(ticks > 0);
        let again = start_ticks(std::process::id()).unwrap();
        assert_eq!(ticks, again, "a process's start time never changes");
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id:?}");
        assert!(!id.ends_with('\n'));
    }
}
