//! Process identity and signals that cannot hit the wrong process.
//!
//! A pid alone names a process only while it lives: once it is reaped the
//! kernel may give the number to any new process. So a process is named by
//! its pid *and* its start time (field 22 of `/proc/PID/stat`, in clock
//! ticks since boot) within one boot (`/proc/sys/kernel/random/boot_id`).
//!
//! Signals go through a pidfd. [`Pidfd::open_verified`] opens the pidfd
//! *first* and checks the start time *after*: the pidfd pins the process it
//! was opened for, so once the check passes the pidfd is known to be the
//! right process, and a signal sent through it can never reach a process
//! that later got the same pid.
//!
//! `pidfd_open` and `poll` go through rustix. Two calls need `unsafe`, each
//! in one small function with the reason it is sound: `pidfd_send_signal`
//! with flags (rustix offers it without, and without signal 0), and
//! registering a borrowed pidfd with tokio's reactor.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Pid, PidfdFlags};

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// A process named so that a recycled pid cannot pass for it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessId {
    pub pid: u32,
    /// Field 22 of `/proc/PID/stat`: start time in clock ticks after boot.
    pub start_ticks: u64,
}

/// The fields of `/proc/PID/stat` the supervisor uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// Field 5: the process group.
    pub pgrp: u32,
    /// Field 6: the session.
    pub session: u32,
    /// Field 22: start time in clock ticks after boot.
    pub start_ticks: u64,
    /// Fields 14 and 15: user and system CPU time, in clock ticks.
    pub cpu_ticks: u64,
}

/// Reads `/proc/PID/stat`. `NotFound` when there is no such process.
pub fn stat(pid: u32) -> io::Result<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has an unexpected layout"),
        )
    })
}

/// Field 22 of `/proc/PID/stat`.
pub fn start_ticks(pid: u32) -> io::Result<u64> {
    stat(pid).map(|s| s.start_ticks)
}

/// The identity of a running process, `NotFound` when there is none.
pub fn identify(pid: u32) -> io::Result<ProcessId> {
    Ok(ProcessId {
        pid,
        start_ticks: start_ticks(pid)?,
    })
}

fn parse_stat(text: &str) -> Option<Stat> {
    // Field 2, the command name, is in parentheses and may itself contain
    // spaces and parentheses; everything after the *last* ')' is plain
    // space-separated fields, starting with field 3.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied();
    let utime: u64 = field(14)?.parse().ok()?;
    let stime: u64 = field(15)?.parse().ok()?;
    Some(Stat {
        pgrp: field(5)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        start_ticks: field(22)?.parse().ok()?,
        cpu_ticks: utime.saturating_add(stime),
    })
}

/// Clock ticks per second in what /proc reports (`USER_HZ`). The kernel
/// fixes it at 100 for user space on every architecture tether runs on,
/// whatever its internal tick rate, so it need not be asked for.
const USER_HZ: u64 = 100;

/// What a running process costs the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// CPU time over the process's life so far, in tenths of a percent of
    /// one core (as ps(1) shows it: 1000 is one core kept busy throughout).
    pub cpu_per_mille: u32,
    /// Resident memory, in bytes.
    pub rss_bytes: u64,
}

/// The use of the machine by `id`, or `None` when that process is gone
/// (its pid ended, or now names another process).
pub fn usage(id: ProcessId) -> Option<Usage> {
    let stat = stat(id.pid).ok()?;
    if stat.start_ticks != id.start_ticks {
        return None;
    }
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", id.pid)).ok()?;
    Some(Usage {
        cpu_per_mille: cpu_per_mille(stat, uptime_ticks(&uptime)?),
        rss_bytes: rss_bytes(&status)?,
    })
}

/// The first field of `/proc/uptime` (seconds since boot, with
/// hundredths), in clock ticks.
fn uptime_ticks(text: &str) -> Option<u64> {
    let seconds = text.split_ascii_whitespace().next()?;
    let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, "0"));
    let hundredths: u64 = format!("{fraction:0<2}").get(..2)?.parse().ok()?;
    let whole: u64 = whole.parse().ok()?;
    Some(whole.saturating_mul(USER_HZ) + hundredths * USER_HZ / 100)
}

/// CPU ticks per tick of life, in tenths of a percent.
fn cpu_per_mille(stat: Stat, now_ticks: u64) -> u32 {
    let lived = now_ticks.saturating_sub(stat.start_ticks).max(1);
    let per_mille = stat.cpu_ticks.saturating_mul(1000) / lived;
    u32::try_from(per_mille).unwrap_or(u32::MAX)
}

/// `VmRSS` of `/proc/PID/status`, which the kernel writes in kB.
fn rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

pub use tether_protocol::signal_name;

/// This boot's id, from `/proc/sys/kernel/random/boot_id`.
pub fn boot_id() -> io::Result<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    Ok(id.trim().to_owned())
}

/// A process file descriptor: a handle on one process that stays valid
/// (and keeps naming that process) after it exits and its pid is reused.
#[derive(Debug)]
pub struct Pidfd {
    fd: OwnedFd,
    pid: u32,
}

impl Pidfd {
    /// Opens a pidfd for `pid`. Fails with `NotFound` (ESRCH) when there is
    /// no such process. Only sound for a pid that cannot have been reused
    /// since it was learned: an unreaped child, or followed by a start-time
    /// check as in [`Pidfd::open_verified`].
    pub fn open(pid: u32) -> io::Result<Pidfd> {
        let raw = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
        // The kernel sets close-on-exec on it, so shims do not inherit it.
        let fd = rustix::process::pidfd_open(raw, PidfdFlags::empty())?;
        Ok(Pidfd { fd, pid })
    }

    /// Opens a pidfd for `id.pid` and keeps it only when the process it
    /// pins has the recorded start time. `Ok(None)` when the process is
    /// gone or the pid now belongs to another process.
    pub fn open_verified(id: ProcessId) -> io::Result<Option<Pidfd>> {
        let pidfd = match Pidfd::open(id.pid) {
            Ok(p) => p,
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        // The pidfd now pins whatever process has this pid; the check below
        // decides whether that is the one we meant.
        match start_ticks(id.pid) {
            Ok(ticks) if ticks == id.start_ticks => Ok(Some(pidfd)),
            Ok(_) => Ok(None),
            Err(e) if is_gone(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The pid this pidfd was opened for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `signal` to the process. `Ok(false)` when it has already exited.
    pub fn signal(&self, signal: i32) -> io::Result<bool> {
        match sys_pidfd_send_signal(self.fd.as_raw_fd(), signal, 0) {
            Ok(()) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` to the process group this process leads, so that the
    /// worker's children go with it. Falls back to the process alone when
    /// it leads no group or the kernel predates group signals through a
    /// pidfd (Linux 6.9). `Ok(false)` when the process has already exited.
    pub fn signal_group(&self, signal: i32) -> io::Result<bool> {
        let leads_group = stat(self.pid).is_ok_and(|s| s.pgrp == self.pid);
        if leads_group {
            match sys_pidfd_send_signal(self.fd.as_raw_fd(), signal, PIDFD_SIGNAL_PROCESS_GROUP) {
                Ok(()) => return Ok(true),
                Err(e) if is_gone(&e) => return Ok(false),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(e),
            }
        }
        self.signal(signal)
    }

    /// True once the process has exited (the pidfd polls readable).
    pub fn has_exited(&self) -> bool {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        // A zero timeout never blocks.
        let now = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut fds, Some(&now)).is_ok_and(|ready| ready > 0)
    }

    /// Resolves when the process has exited. It does not reap it: a child
    /// of this process must still be waited for.
    pub async fn exited(&self) {
        match watch_readable(self.fd.as_fd()) {
            Ok(watched) => match watched.readable().await {
                // A pidfd stays readable once the process has exited.
                Ok(mut guard) => guard.retain_ready(),
                Err(e) => self.poll_exit(e).await,
            },
            Err(e) => self.poll_exit(e).await,
        }
    }

    /// The fallback when the reactor cannot watch the pidfd: look every
    /// [`EXIT_POLL_INTERVAL`].
    async fn poll_exit(&self, why: io::Error) {
        tracing::warn!(
            "cannot watch pid {} with the reactor ({why}); polling",
            self.pid
        );
        while !self.has_exited() {
            tokio::time::sleep(EXIT_POLL_INTERVAL).await;
        }
    }
}

/// How often [`Pidfd::exited`] looks when it has to poll.
const EXIT_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

/// True for the errors that mean "no such process".
fn is_gone(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// Sends `signal` to every process of the session that `leader` leads or
/// led (a shim's session), each through a pidfd checked to still belong to
/// it; to the leader itself only when `with_leader`. Used to clear out what
/// a worker left behind (children holding its output pipes) when it is
/// killed or its shim is gone. Returns how many were signalled.
///
/// The kernel does not reuse a number while it still names a session with
/// members, so when the leader's pid now belongs to another process, the
/// old session is empty and nothing is signalled: the new owner's session
/// is never touched.
pub fn signal_session(leader: ProcessId, with_leader: bool, signal: i32) -> io::Result<usize> {
    let session = leader.pid;
    let leader_fd = match Pidfd::open(session) {
        Ok(pidfd) => match start_ticks(session) {
            Ok(ticks) if ticks == leader.start_ticks => Some(pidfd),
            Ok(_) => return Ok(0),
            Err(e) if is_gone(&e) => None,
            Err(e) => return Err(e),
        },
        Err(e) if is_gone(&e) => None,
        Err(e) => return Err(e),
    };
    let mut signalled = 0;
    // The leader goes first, so that it cannot react to its members' end.
    if let (true, Some(leader_fd)) = (with_leader, leader_fd) {
        if leader_fd.signal(signal)? {
            signalled += 1;
        }
    }
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == session || pid == std::process::id() {
            continue;
        }
        if !stat(pid).is_ok_and(|s| s.session == session) {
            continue;
        }
        let Ok(pidfd) = Pidfd::open(pid) else {
            continue;
        };
        // Checked again through the pinned process: the pid may have been
        // reused between the first look and the open.
        if stat(pid).is_ok_and(|s| s.session == session) && pidfd.signal(signal)? {
            signalled += 1;
        }
    }
    Ok(signalled)
}

/// `PIDFD_SIGNAL_PROCESS_GROUP` from linux/pidfd.h (Linux 6.9).
const PIDFD_SIGNAL_PROCESS_GROUP: u32 = 1 << 2;

/// `pidfd_send_signal(2)` as is: rustix's takes no flags (the process
/// group one is needed) and no signal 0.
#[allow(unsafe_code)]
fn sys_pidfd_send_signal(pidfd: RawFd, signal: i32, flags: u32) -> io::Result<()> {
    // SAFETY: a null siginfo pointer is allowed (the kernel then fills it
    // in as for kill(2)); the other arguments are plain integers and the
    // descriptor is borrowed from a live `Pidfd`.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            flags,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[allow(unsafe_code)]
fn watch_readable(fd: BorrowedFd<'_>) -> io::Result<AsyncFd<BorrowedFd<'_>>> {
    // SAFETY: the descriptor is borrowed for the whole life of the
    // `AsyncFd`, so it stays open and names the same pidfd until the
    // `AsyncFd` is dropped, and a `BorrowedFd` always returns that same
    // descriptor.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::process::Command;
    use std::time::Duration;

    use super::*;

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let line = "42 (a) b (c) R 1 42 42 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 0 0";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                pgrp: 42,
                session: 42,
                start_ticks: 987_654,
                cpu_ticks: 0,
            })
        );
        assert_eq!(parse_stat("42 (x) R 1"), None);
    }

    #[test]
    fn usage_is_read_from_its_proc_files() {
        assert_eq!(uptime_ticks("12345.67 999.00\n"), Some(1_234_567));
        assert_eq!(uptime_ticks("5.5 1\n"), Some(550));
        assert_eq!(uptime_ticks("x"), None);
        let stat = Stat {
            pgrp: 1,
            session: 1,
            start_ticks: 1000,
            cpu_ticks: 50,
        };
        assert_eq!(cpu_per_mille(stat, 1200), 250, "50 of 200 ticks: 25.0%");
        assert_eq!(cpu_per_mille(stat, 1000), 50_000, "no time lived yet");
        let status = "Name:\tsleep\nVmPeak:\t  1 kB\nVmRSS:\t    1536 kB\n";
        assert_eq!(rss_bytes(status), Some(1536 * 1024));
        assert_eq!(rss_bytes("Name: x\n"), None);
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(15), "SIGTERM");
        assert_eq!(signal_name(64), "64");
    }

    #[test]
    fn a_live_process_has_usage_and_a_gone_one_none() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let id = identify(child.id()).unwrap();
        let usage = usage(id).unwrap();
        assert!(usage.rss_bytes > 0);
        let wrong = ProcessId {
            start_ticks: id.start_ticks + 1,
            ..id
        };
        assert_eq!(super::usage(wrong), None);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(super::usage(id), None);
    }

    #[test]
    fn start_ticks_of_this_process_and_a_child() {
        let me = start_ticks(std::process::id()).unwrap();
        assert!(me > 0);
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let theirs = start_ticks(child.id()).unwrap();
        assert!(theirs >= me, "a child starts after its parent");
        // The same process reads the same start time every time.
        assert_eq!(start_ticks(child.id()).unwrap(), theirs);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            start_ticks(child.id()).map_err(|e| e.kind()),
            Err(io::ErrorKind::NotFound)
        );
    }

    #[test]
    fn boot_id_is_a_uuid() {
        let id = boot_id().unwrap();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(id, boot_id().unwrap());
    }

    #[tokio::test]
    async fn pidfd_signals_a_child_and_sees_it_exit() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pidfd = Pidfd::open(child.id()).unwrap();
        assert!(!pidfd.has_exited());
        assert!(pidfd.signal(libc::SIGKILL).unwrap());
        tokio::time::timeout(Duration::from_secs(5), pidfd.exited())
            .await
            .expect("exit seen within 5s");
        assert!(pidfd.has_exited());
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
        // Reaped: the pidfd still names that process, and signalling it
        // reports it gone instead of reaching anyone else.
        assert!(!pidfd.signal(libc::SIGKILL).unwrap());
    }

    #[test]
    fn session_signals_reach_members_but_never_a_reused_leader_pid() {
        // A shell leading its own session, with a child in it.
        let mut leader = Command::new("setsid")
            .args(["sh", "-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let id = identify(leader.id()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !stat(id.pid).is_ok_and(|s| s.session == id.pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "setsid did not happen"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let wrong = ProcessId {
            start_ticks: id.start_ticks + 1,
            ..id
        };
        assert_eq!(signal_session(wrong, true, libc::SIGKILL).unwrap(), 0);
        let members = loop {
            let n = signal_session(id, false, 0).unwrap();
            if n > 0 || std::time::Instant::now() > deadline {
                break n;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(members, 1, "the sleep, not the leader");
        assert_eq!(signal_session(id, true, libc::SIGKILL).unwrap(), 2);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(leader.wait().unwrap().signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_wrong_start_time_is_not_verified() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let id = identify(child.id()).unwrap();
        assert!(Pidfd::open_verified(id).unwrap().is_some());
        let wrong = ProcessId {
            start_ticks: id.start_ticks + 1,
            ..id
        };
        assert!(Pidfd::open_verified(wrong).unwrap().is_none());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(Pidfd::open_verified(id).unwrap().is_none());
    }
}
