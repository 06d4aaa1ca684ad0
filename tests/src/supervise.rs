//! Supervised workers under test: a sandbox with a daemon, `tether run`,
//! `tether ps --json` polled until a condition holds, and the execution's
//! stream split into output lines and lifecycle events.
//!
//! Shims run in their own sessions and outlive the daemon by design, so a
//! test that ends (or fails) would leave them and their workers behind.
//! [`Supervised`] therefore kills, when dropped, the daemon first (so that
//! nothing restarts) and then every shim whose output goes to the sandbox's
//! state directory and every process whose `TETHER_SOCKET` is the sandbox's
//! socket.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::Daemon;
use crate::procs;
use crate::sandbox::Sandbox;

/// How often [`Supervised::wait_for`] asks `tether ps` again.
const POLL: Duration = Duration::from_millis(100);

/// A sandbox with a daemon that supervises workers.
#[derive(Debug)]
pub struct Supervised {
    // Dropped by hand in `Drop`, before the sandbox goes.
    daemon: Option<Daemon>,
    sandbox: Sandbox,
}

impl Default for Supervised {
    fn default() -> Self {
        Self::start()
    }
}

/// One frame of an execution's stream, from `tether tail --json`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The frame's seq in the execution's stream.
    pub seq: u64,
    /// Microseconds since the epoch.
    pub ts_micros: u64,
    /// `stdout`, `stderr` or `event`.
    pub kind: String,
    /// The line (or piece of a line, or event text).
    pub payload: String,
}

impl Supervised {
    /// A new sandbox with a running daemon.
    pub fn start() -> Self {
        Self::on(Sandbox::new())
    }

    /// A running daemon on `sandbox` (set up beforehand, e.g. on a small
    /// disk).
    pub fn on(sandbox: Sandbox) -> Self {
        let daemon = sandbox.start_daemon();
        Self::with(sandbox, daemon)
    }

    /// `daemon`, started on `sandbox` by the caller in a way of its own.
    pub fn with(sandbox: Sandbox, daemon: Daemon) -> Self {
        Self {
            daemon: Some(daemon),
            sandbox,
        }
    }

    /// The sandbox.
    pub fn sb(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The daemon, to crash or restart it.
    pub fn daemon(&mut self) -> &mut Daemon {
        self.daemon
            .as_mut()
            .unwrap_or_else(|| panic!("the daemon was already dropped"))
    }

    /// `tether run --json ARGS...`: asserts exit 0 and returns the id.
    pub fn run(&self, args: &[&str]) -> String {
        let mut full = vec!["run", "--json"];
        full.extend_from_slice(args);
        let out = self.sandbox.run(&full);
        out.assert_success();
        let value: Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("`tether run --json` printed {:?}: {e}", out.stdout));
        value["id"]
            .as_str()
            .unwrap_or_else(|| panic!("`tether run --json` printed no id: {value}"))
            .to_owned()
    }

    /// `tether run --json --cwd SANDBOX OPTIONS... -- sh -c SCRIPT`: a shell
    /// worker working in the sandbox; asserts exit 0 and returns the id.
    pub fn run_sh(&self, options: &[&str], script: &str) -> String {
        let dir = self.sandbox.path().display().to_string();
        let mut args = vec!["--cwd", dir.as_str()];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        self.run(&args)
    }

    /// `tether ps --json ID`, parsed.
    pub fn info(&self, id: &str) -> Value {
        let out = self.sandbox.run(&["ps", "--json", id]);
        out.assert_success();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(lines.len(), 1, "`tether ps --json {id}` printed {lines:?}");
        serde_json::from_str(lines[0])
            .unwrap_or_else(|e| panic!("`tether ps --json {id}` printed {:?}: {e}", lines[0]))
    }

    /// Polls `tether ps --json ID` until `cond` holds and returns that
    /// row; panics after `timeout` with the last row and the stream.
    pub fn wait_for(
        &self,
        id: &str,
        what: &str,
        timeout: Duration,
        mut cond: impl FnMut(&Value) -> bool,
    ) -> Value {
        let start = Instant::now();
        loop {
            let info = self.info(id);
            if cond(&info) {
                return info;
            }
            if start.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {id} to be {what}; last ps row:\n\
                     {info}\nstream:\n{}\nshim log:\n{}",
                    self.describe(id),
                    self.shim_log(id)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until the execution is in `state`.
    pub fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> Value {
        self.wait_for(id, state, timeout, |v| v["state"] == state)
    }

    /// Waits until the execution is `running` with a worker pid; returns
    /// the pid.
    pub fn wait_running(&self, id: &str, timeout: Duration) -> u32 {
        let info = self.wait_for(id, "running with a pid", timeout, |v| {
            v["state"] == "running" && v["pid"].is_u64()
        });
        pid_of(&info)
    }

    /// Every frame of the execution's stream (`tether tail --json ID`).
    pub fn frames(&self, id: &str) -> Vec<Frame> {
        let out = self.sandbox.run(&["tail", "--json", id]);
        out.assert_success();
        out.stdout.lines().map(parse_frame).collect()
    }

    /// The payloads of the lifecycle events, in order.
    pub fn events(&self, id: &str) -> Vec<String> {
        payloads(&self.frames(id), "event")
    }

    /// The worker's stdout lines, in order.
    pub fn stdout_lines(&self, id: &str) -> Vec<String> {
        payloads(&self.frames(id), "stdout")
    }

    /// Waits until the worker has printed `line` to stdout.
    pub fn wait_line(&self, id: &str, line: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.stdout_lines(id).iter().any(|l| l == line) {
            if start.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {id} to print {line:?}; stream:\n{}",
                    self.describe(id)
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// The stream as `seq kind payload` lines (long payloads shortened),
    /// for failure messages.
    pub fn describe(&self, id: &str) -> String {
        let out = self.sandbox.run(&["tail", "--json", id]);
        if out.code != Some(0) {
            return format!("(tail failed: {})", out.stderr);
        }
        out.stdout
            .lines()
            .map(parse_frame)
            .map(|f| {
                let mut payload = f.payload;
                if payload.len() > 120 {
                    payload.truncate(120);
                    payload.push_str("...");
                }
                format!("  {} {} {payload}\n", f.seq, f.kind)
            })
            .collect()
    }

    /// The shim's own diagnostics for the execution (empty when none).
    pub fn shim_log(&self, id: &str) -> String {
        let path = self.shim_log_path(id);
        std::fs::read_to_string(path).unwrap_or_default()
    }

    fn shim_log_path(&self, id: &str) -> PathBuf {
        self.sandbox
            .state_dir()
            .join("shims")
            .join(format!("{id}.log"))
    }

    /// Kills every shim and worker of this sandbox (see the module docs).
    /// The daemon must be down, or it would restart them.
    pub fn kill_all_workers(&self) {
        let state_dir = self.sandbox.state_dir();
        let socket_var = format!("TETHER_SOCKET={}", self.sandbox.socket().display());
        // Twice: a shim may start a worker between the scan and its death.
        for _ in 0..2 {
            for pid in procs::all_pids() {
                if pid == std::process::id() {
                    continue;
                }
                let is_shim = [1, 2].iter().any(|&fd| {
                    procs::fd_target(pid, fd).is_some_and(|p| p.starts_with(&state_dir))
                });
                let is_worker = || procs::environ(pid).contains(&socket_var);
                if is_shim || is_worker() {
                    let _ = procs::kill9(pid);
                }
            }
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        // The daemon goes first so that it cannot restart what is killed.
        drop(self.daemon.take());
        self.kill_all_workers();
    }
}

/// The `pid` of a `tether ps --json` row, panicking when there is none.
pub fn pid_of(info: &Value) -> u32 {
    info["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .unwrap_or_else(|| panic!("no worker pid in {info}"))
}

/// A number field of a `tether ps --json` row.
pub fn number(info: &Value, field: &str) -> u64 {
    info[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no number {field:?} in {info}"))
}

/// The payloads of the frames of `kind`, in order.
pub fn payloads(frames: &[Frame], kind: &str) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.kind == kind)
        .map(|f| f.payload.clone())
        .collect()
}

/// The first event starting with `prefix` at or after index `from`, and
/// its index.
pub fn find_event<'a>(
    frames: &'a [Frame],
    from: usize,
    prefix: &str,
) -> Option<(usize, &'a Frame)> {
    frames
        .iter()
        .enumerate()
        .skip(from)
        .find(|(_, f)| f.kind == "event" && f.payload.starts_with(prefix))
}

/// Asserts that events starting with `prefixes` occur in this order (other
/// frames may come between them); returns the matching frames.
pub fn assert_event_order<'a>(frames: &'a [Frame], prefixes: &[&str]) -> Vec<&'a Frame> {
    let mut from = 0;
    let mut found = Vec::new();
    for prefix in prefixes {
        match find_event(frames, from, prefix) {
            Some((i, frame)) => {
                found.push(frame);
                from = i + 1;
            }
            None => {
                let events: Vec<&str> = frames
                    .iter()
                    .filter(|f| f.kind == "event")
                    .map(|f| f.payload.as_str())
                    .collect();
                panic!(
                    "no event starting with {prefix:?} after the ones before it \
                     (looking for {prefixes:?} in order); events:\n{events:#?}"
                );
            }
        }
    }
    found
}

/// Parses one line of `tether tail --json`.
pub fn parse_frame(line: &str) -> Frame {
    let v: Value = serde_json::from_str(line)
        .unwrap_or_else(|e| panic!("`tail --json` printed {line:?}: {e}"));
    let text = |field: &str| -> String {
        v[field]
            .as_str()
            .unwrap_or_else(|| panic!("no {field:?} in {line}"))
            .to_owned()
    };
    Frame {
        seq: v["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("no seq in {line}")),
        ts_micros: rfc3339_micros(&text("ts")),
        kind: text("kind"),
        payload: text("payload"),
    }
}

/// Microseconds since the epoch of a UTC RFC 3339 time such as
/// `2026-11-22T04:02:35.570855Z`.
pub fn rfc3339_micros(ts: &str) -> u64 {
    let bad = || -> ! { panic!("not a UTC RFC 3339 time: {ts:?}") };
    let ts = ts.strip_suffix('Z').unwrap_or_else(|| bad());
    let (date, time) = ts.split_once('T').unwrap_or_else(|| bad());
    let num = |s: &str| -> i64 { s.parse().unwrap_or_else(|_| bad()) };
    let d: Vec<i64> = date.split('-').map(num).collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(num).collect();
    if d.len() != 3 || t.len() != 3 {
        bad();
    }
    // Fractional digits scaled to microseconds.
    let mut frac = frac.to_owned();
    frac.truncate(6);
    while frac.len() < 6 {
        frac.push('0');
    }
    let days = days_from_civil(d[0], d[1], d[2]);
    let secs = days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2];
    u64::try_from(secs * 1_000_000 + num(&frac)).unwrap_or_else(|_| bad())
}

/// Days from 1970-01-01 to the given proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The time between two frames.
pub fn gap(earlier: &Frame, later: &Frame) -> Duration {
    Duration::from_micros(later.ts_micros.saturating_sub(earlier.ts_micros))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn rfc3339_times_become_epoch_micros() {
        assert_eq!(rfc3339_micros("1970-01-01T00:00:00.000001Z"), 1);
        assert_eq!(
            rfc3339_micros("2023-11-14T22:13:20.000000Z"),
            1_700_000_000_000_000
        );
        assert_eq!(
            rfc3339_micros("2000-03-01T00:00:01.5Z"),
            951_868_801_500_000
        );
    }

    #[test]
    fn events_are_found_in_order() {
        let frame = |kind: &str, payload: &str| Frame {
            seq: 0,
            ts_micros: 0,
            kind: kind.into(),
            payload: payload.into(),
        };
        let frames = vec![
            frame("event", "starting attempt 1: x"),
            frame("stdout", "exited 1"),
            frame("event", "exited 1"),
        ];
        assert_eq!(
            assert_event_order(&frames, &["starting", "exited"]).len(),
            2
        );
        let late =
            std::panic::catch_unwind(|| assert_event_order(&frames, &["exited", "starting"]));
        assert!(late.is_err());
    }
}
