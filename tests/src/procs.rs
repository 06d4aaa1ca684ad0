//! Other people's processes, seen through `/proc`: parents, liveness,
//! start times, and the few system calls the supervision tests need
//! (signalling a process we did not spawn, becoming a child subreaper so
//! that orphans can be reaped, steering the next pid).
//!
//! A process that has exited but not been reaped (a zombie) counts as not
//! running: in some containers nobody reaps orphans, and a zombie can do no
//! harm to the test.

use std::io;
use std::time::{Duration, Instant};

/// The fields of `/proc/PID/stat` the tests look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The command name (field 2, without its parentheses).
    pub comm: String,
    /// The one-letter state (field 3): `R`, `S`, `D`, `Z`, ...
    pub state: char,
    /// The parent's pid (field 4).
    pub ppid: u32,
    /// The session id (field 6).
    pub session: u32,
    /// The start time in clock ticks after boot (field 22).
    pub start_ticks: u64,
}

/// Reads `/proc/PID/stat`; `None` when there is no such process.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses a `/proc/PID/stat` line. The command name may hold spaces and
/// parentheses, so the fields after it are found from its last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_owned();
    // Fields 3 onwards; index 0 is field 3.
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).copied();
    Some(Stat {
        comm,
        state: field(3)?.chars().next()?,
        ppid: field(4)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
    })
}

/// True while `pid` names a process that has not exited.
pub fn is_running(pid: u32) -> bool {
    stat(pid).is_some_and(|s| !matches!(s.state, 'Z' | 'X' | 'x'))
}

/// The parent of `pid`, panicking when `pid` is gone.
pub fn parent_of(pid: u32) -> u32 {
    stat(pid)
        .unwrap_or_else(|| panic!("pid {pid} is gone; cannot find its parent"))
        .ppid
}

/// Waits up to `timeout` for `pid` to stop running; false if it still runs.
pub fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let start = Instant::now();
    while is_running(pid) {
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Every pid in `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The environment of `pid` as `NAME=VALUE` strings; empty when it cannot
/// be read (gone, or another user's).
pub fn environ(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|bytes| {
            bytes
                .split(|&b| b == 0)
                .filter(|v| !v.is_empty())
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Where the file descriptor `fd` of `pid` points, if it can be read.
pub fn fd_target(pid: u32, fd: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()
}

/// Sends SIGKILL to `pid`. A process that is already gone is not an
/// error. Only for processes the test identified a moment ago: a pid
/// cannot be reused while its process is a zombie, and the tests kill
/// processes whose identity they just checked.
#[allow(unsafe_code)]
pub fn kill9(pid: u32) -> io::Result<()> {
    let target = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    let rc = unsafe { libc::kill(target, libc::SIGKILL) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(err)
}

/// Makes this test process a child subreaper: orphans among its
/// descendants (a shim whose daemon was killed, a worker whose shim was
/// killed) are re-parented to it instead of to init, so that it can reap
/// them and free their pids. Not inherited by children.
#[allow(unsafe_code)]
pub fn become_subreaper() -> io::Result<()> {
    let (option, on): (libc::c_int, libc::c_ulong) = (libc::PR_SET_CHILD_SUBREAPER, 1);
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag; no pointers.
    let rc = unsafe {
        libc::prctl(
            option,
            on,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reaps `pid`, a child of this process (possibly an adopted orphan), once
/// it has exited; false when it has not exited within `timeout` or is not
/// our child.
pub fn reap(pid: u32, timeout: Duration) -> bool {
    let start = Instant::now();
    loop {
        match try_reap(pid) {
            Ok(true) => return true,
            Ok(false) if start.elapsed() < timeout => std::thread::sleep(Duration::from_millis(10)),
            Ok(false) | Err(_) => return false,
        }
    }
}

#[allow(unsafe_code)]
fn try_reap(pid: u32) -> io::Result<bool> {
    let target = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    let mut status: libc::c_int = 0;
    // SAFETY: waitpid writes one c_int through a pointer to a live local.
    let rc = unsafe { libc::waitpid(target, &mut status, libc::WNOHANG) };
    match rc {
        0 => Ok(false),
        r if r == target => Ok(true),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Asks the kernel to hand out `pid` to the next process created, by
/// writing `pid - 1` to `/proc/sys/kernel/ns_last_pid` (needs root in the
/// pid namespace). Another process created in between takes it instead,
/// so callers check the pid they got and try again.
pub fn steer_next_pid(pid: u32) -> io::Result<()> {
    std::fs::write(
        "/proc/sys/kernel/ns_last_pid",
        pid.saturating_sub(1).to_string(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parses_a_stat_line_whose_name_has_spaces_and_parentheses() {
        let line = "123 (a b) c)) S 45 123 123 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 98765 1 2";
        let s = parse_stat(line).unwrap();
        assert_eq!(s.comm, "a b) c)");
        assert_eq!(
            (s.state, s.ppid, s.session, s.start_ticks),
            ('S', 45, 123, 98765)
        );
    }

    #[test]
    fn sees_itself_running_with_its_parent() {
        let me = std::process::id();
        assert!(is_running(me));
        assert_eq!(parent_of(me), std::os::unix::process::parent_id());
    }
}
