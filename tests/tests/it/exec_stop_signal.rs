//! Stopping a whole worker: `stop` signals the worker's process group, so
//! a subprocess the worker started goes too, and `run --stop-signal`
//! chooses the first signal (KILL still follows after the timeout).

use std::time::Duration;

use tether_tests::procs;
use tether_tests::supervise::{assert_event_order, Supervised};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn stop_ends_the_subprocesses_the_worker_started() {
    let sup = Supervised::start();
    let id = sup.run_sh(&[], "sleep 1000 & echo $! > child.pid; echo ready; wait");
    sup.wait_running(&id, TIMEOUT);
    sup.wait_line(&id, "ready", TIMEOUT);
    let child: u32 = std::fs::read_to_string(sup.sb().file("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(procs::is_running(child), "the subprocess runs");

    let out = sup.sb().run(&["stop", &id, "--timeout", "30s"]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    assert!(
        procs::wait_gone(child, TIMEOUT),
        "the worker's subprocess (pid {child}) survived `tether stop`"
    );
    let table = sup.sb().run(&["ps", "--all"]);
    let row = table.stdout.lines().nth(1).unwrap_or_default();
    assert!(row.ends_with("stopped"), "{}", table.stdout);
}

#[test]
fn the_stop_signal_is_the_one_the_run_chose() {
    let sup = Supervised::start();
    let script = "trap 'echo got-int; exit 0' INT; trap 'echo got-term; exit 0' TERM; \
                  echo ready; while :; do sleep 0.1; done";
    let id = sup.run_sh(&["--stop-signal", "INT"], script);
    sup.wait_running(&id, TIMEOUT);
    sup.wait_line(&id, "ready", TIMEOUT);
    let out = sup.sb().run(&["stop", &id, "--timeout", "60s"]);
    out.assert_success();
    assert_eq!(out.stdout, "cancelled\n");
    let lines = sup.stdout_lines(&id);
    assert_eq!(lines, ["ready", "got-int"]);
    assert_event_order(
        &sup.frames(&id),
        &["stopping: SIGINT, then SIGKILL after 60s", "cancelled"],
    );

    let out = sup
        .sb()
        .run(&["run", "--stop-signal", "SEGV", "--", "true"]);
    out.assert_code(2);
    assert!(out.stderr.contains("TERM, INT, HUP"), "{}", out.stderr);
}
