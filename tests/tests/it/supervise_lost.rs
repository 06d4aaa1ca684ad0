//! A shim that dies without reporting its worker's exit makes the
//! execution `lost`, and the restart policy decides what follows: whether
//! the daemon sees the shim die, or finds it dead (or its pid taken by an
//! unrelated process) when it starts again. A stale pid is never taken for
//! a live shim, and never signalled.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use tether_tests::procs;
use tether_tests::supervise::{assert_event_order, number, pid_of, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A worker that records its pid (appending, so restarts show) and then
/// sleeps as the same process.
fn sleeper(pid_file: &str) -> String {
    format!("echo $$ >> {pid_file}; echo up; exec sleep 300")
}

/// The shim of a running worker: the worker's parent, checked by name.
fn shim_of(worker: u32) -> u32 {
    let shim = procs::parent_of(worker);
    let stat = procs::stat(shim).unwrap_or_else(|| panic!("shim pid {shim} is gone"));
    assert_eq!(
        stat.comm, "tether-shim",
        "the parent of worker {worker} should be its shim"
    );
    shim
}

/// Two running executions of the same sleeper, one restarted on failure
/// (the default) and one never, with their workers' and shims' pids.
struct Pair {
    again: String,
    never: String,
    again_worker: u32,
    never_worker: u32,
    again_shim: u32,
    never_shim: u32,
}

fn start_pair(sup: &Supervised) -> Pair {
    let again = sup.run_sh(&[], &sleeper("again.pids"));
    let never = sup.run_sh(&["--restart", "never"], &sleeper("never.pids"));
    let again_worker = sup.wait_running(&again, TIMEOUT);
    let never_worker = sup.wait_running(&never, TIMEOUT);
    let again_shim = shim_of(again_worker);
    let never_shim = shim_of(never_worker);
    Pair {
        again,
        never,
        again_worker,
        never_worker,
        again_shim,
        never_shim,
    }
}

#[test]
fn after_kill_9_of_a_shim_the_execution_is_lost_and_restarted_per_policy() {
    let sup = Supervised::start();
    let Pair {
        again,
        never,
        again_worker,
        never_worker,
        again_shim,
        never_shim,
    } = start_pair(&sup);

    procs::kill9(again_shim).unwrap();
    procs::kill9(never_shim).unwrap();

    // on-failure: lost, then a new attempt with a new worker.
    let info = sup.wait_for(&again, "running attempt 2", TIMEOUT, |v| {
        v["state"] == "running" && v["attempt"] == 2 && v["pid"].is_u64()
    });
    let new_worker = pid_of(&info);
    assert_ne!(new_worker, again_worker, "{info}");
    assert_eq!(number(&info, "restarts"), 1, "{info}");
    assert_event_order(
        &sup.frames(&again),
        &[
            "started pid",
            &format!("lost: shim pid {again_shim}"),
            "restarting in",
            "starting attempt 2",
            "started pid",
        ],
    );
    assert!(
        procs::wait_gone(again_worker, Duration::from_secs(10)),
        "the first worker (pid {again_worker}) still runs next to attempt 2"
    );
    let pids = std::fs::read_to_string(sup.sb().file("again.pids")).unwrap();
    assert_eq!(pids, format!("{again_worker}\n{new_worker}\n"));

    // never: lost is final.
    let info = sup.wait_state(&never, "lost", TIMEOUT);
    assert!(info["pid"].is_null(), "a lost execution has no pid: {info}");
    assert_eq!(number(&info, "attempt"), 1, "{info}");
    assert_event_order(
        &sup.frames(&never),
        &[&format!("lost: shim pid {never_shim}")],
    );
    assert!(
        procs::wait_gone(never_worker, Duration::from_secs(10)),
        "the worker (pid {never_worker}) of the lost execution still runs"
    );
    std::thread::sleep(Duration::from_millis(800));
    let info = sup.info(&never);
    assert_eq!(
        (info["state"].as_str(), number(&info, "attempt")),
        (Some("lost"), 1),
        "restart never was restarted: {info}"
    );
}

/// Starts a process at pid `want`, in its own session and named
/// `tether-shim` (a symlink to `sleep`), so that only its start time tells
/// it from the dead shim. `None` when the pid cannot be steered (not root,
/// or other processes kept taking it).
fn impostor_at(want: u32, dir: &Path) -> Option<Child> {
    let sleep = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let link = dir.join("tether-shim");
    if !link.exists() {
        std::os::unix::fs::symlink(sleep, &link).ok()?;
    }
    for _ in 0..50 {
        procs::steer_next_pid(want).ok()?;
        // `setsid` (not a group leader here) execs the program in place.
        let mut child = Command::new("setsid").arg(&link).arg("120").spawn().ok()?;
        if child.id() == want {
            return Some(child);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    None
}

#[test]
fn a_dead_shim_or_its_reused_pid_is_found_lost_when_the_daemon_starts() {
    let mut sup = Supervised::start();
    // Orphaned shims and workers come to this process, which can then
    // reap them so that their pids are free to be reused.
    let subreaper = procs::become_subreaper().is_ok();
    let Pair {
        again,
        never,
        again_worker,
        never_worker,
        again_shim,
        never_shim,
    } = start_pair(&sup);

    sup.daemon().kill9();
    for pid in [again_shim, never_shim, again_worker, never_worker] {
        procs::kill9(pid).unwrap();
    }
    for pid in [again_shim, never_shim, again_worker, never_worker] {
        assert!(
            procs::wait_gone(pid, Duration::from_secs(10)),
            "pid {pid} survived kill -9"
        );
    }
    let reaped = subreaper
        && [again_shim, again_worker]
            .iter()
            .all(|&pid| procs::reap(pid, Duration::from_secs(10)));
    let mut impostor = if reaped {
        impostor_at(again_shim, sup.sb().path())
    } else {
        None
    };
    match &impostor {
        Some(_) => eprintln!("shim pid {again_shim} now belongs to an unrelated process"),
        None => eprintln!(
            "could not hand shim pid {again_shim} to another process \
             (subreaper {subreaper}, reaped {reaped}); testing dead shims only"
        ),
    }

    sup.daemon().restart();

    let info = sup.wait_for(&again, "running attempt 2", TIMEOUT, |v| {
        assert!(
            !(v["state"] == "running" && v["pid"] == again_worker),
            "the daemon reports the dead worker pid {again_worker} as running: {v}"
        );
        v["state"] == "running" && v["attempt"] == 2 && v["pid"].is_u64()
    });
    assert_ne!(pid_of(&info), again_worker);
    assert_event_order(
        &sup.frames(&again),
        &[
            &format!("lost: shim pid {again_shim}"),
            "restarting in",
            "starting attempt 2",
            "started pid",
        ],
    );

    let info = sup.wait_state(&never, "lost", TIMEOUT);
    assert!(info["pid"].is_null(), "a lost execution has no pid: {info}");
    assert_event_order(
        &sup.frames(&never),
        &[&format!("lost: shim pid {never_shim}")],
    );

    if let Some(child) = impostor.as_mut() {
        assert!(
            matches!(child.try_wait(), Ok(None)),
            "the process that reused shim pid {again_shim} was signalled: {:?}",
            child.try_wait()
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}
