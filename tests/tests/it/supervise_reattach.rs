//! Workers outlive the daemon: while `tetherd` is `kill -9`'d and
//! restarted, the worker keeps running (it is never restarted), its shim
//! holds back what it cannot deliver and the worker blocks on a full pipe
//! rather than losing output, and every line arrives exactly once, in
//! order, once the daemon is back.

use std::time::{Duration, Instant};

use tether_tests::raw;
use tether_tests::supervise::{number, payloads, pid_of, Supervised};
use tether_tests::text::assert_same_lines;
use tether_tests::wait::wait_until;
use tether_tests::{mem, procs};

const STEP_TIMEOUT: Duration = Duration::from_secs(60);

const LINES: u64 = 50_000;
/// The worker prints in bursts of this many lines with a pause after each,
/// so that its output spans the daemon's crashes.
const BURST: u64 = 1_250;
const PAUSE: &str = "0.2";
/// The daemon is killed once the stream has reached each of these seqs.
const KILL_AT: [u64; 3] = [9_000, 21_000, 33_000];
/// How long the daemon stays down after each crash.
const DOWN: Duration = Duration::from_millis(400);

fn numbered(n: u64) -> String {
    format!("n-{n:07}")
}

#[test]
fn a_worker_keeps_running_through_three_daemon_crashes_and_no_line_is_lost_or_repeated() {
    let mut sup = Supervised::start();
    let socket = sup.sb().socket();
    // The pid file is appended to: a second start of the worker would
    // leave a second line.
    let script = format!(
        "echo $$ >> worker.pid; i=1; while [ $i -le {LINES} ]; do \
         printf 'n-%07d\\n' $i; \
         if [ $((i % {BURST})) -eq 0 ]; then sleep {PAUSE}; fi; \
         i=$((i + 1)); done"
    );
    let id = sup.run_sh(&["--name", "numbers"], &script);
    let pid = sup.wait_running(&id, STEP_TIMEOUT);

    for (k, target) in KILL_AT.iter().enumerate() {
        wait_until(
            STEP_TIMEOUT,
            &format!("seq {target} before crash {}", k + 1),
            || raw::last_seq(&socket, &id) >= *target,
        );
        sup.daemon().kill9();
        let started_down = Instant::now();
        assert!(
            procs::is_running(pid),
            "the worker (pid {pid}) died with the daemon (crash {})",
            k + 1
        );
        std::thread::sleep(DOWN.saturating_sub(started_down.elapsed()));
        sup.daemon().restart();
        let info = sup.info(&id);
        assert!(
            info["state"] == "running" || info["state"] == "completed",
            "after crash {} the execution is {info}",
            k + 1
        );
        assert_eq!(
            number(&info, "attempt"),
            1,
            "a new attempt after crash {}: {info}",
            k + 1
        );
        if info["state"] == "running" {
            assert_eq!(
                pid_of(&info),
                pid,
                "the worker pid changed after crash {}",
                k + 1
            );
        }
        eprintln!(
            "crash {}: killed at seq >= {target}, back after {:?}",
            k + 1,
            started_down.elapsed()
        );
    }

    let info = sup.wait_state(&id, "completed", STEP_TIMEOUT);
    assert_eq!(
        (number(&info, "attempt"), number(&info, "restarts")),
        (1, 0),
        "{info}"
    );
    assert_eq!(info["last_exit"]["code"], 0, "{info}");

    let pids = std::fs::read_to_string(sup.sb().file("worker.pid")).unwrap();
    assert_eq!(
        pids,
        format!("{pid}\n"),
        "the worker was started more than once"
    );

    let expected: String = (1..=LINES).map(|n| numbered(n) + "\n").collect();
    let frames = sup.frames(&id);
    let mut stdout = payloads(&frames, "stdout").join("\n");
    stdout.push('\n');
    assert_same_lines(&stdout, &expected, "stdout frames after three crashes");
    let events = payloads(&frames, "event");
    let starts = events
        .iter()
        .filter(|e| e.starts_with("starting attempt"))
        .count();
    assert_eq!(starts, 1, "events: {events:#?}");
    assert!(
        !events
            .iter()
            .any(|e| e.starts_with("lost") || e.starts_with("restarting")),
        "events: {events:#?}"
    );

    // The plain `tail` prints every frame's payload: the event lines are
    // the only ones besides the worker's.
    let out = sup.sb().run(&["tail", &id]);
    out.assert_success();
    let plain: String = out
        .stdout
        .lines()
        .filter(|l| !events.iter().any(|e| e == l))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_same_lines(&plain, &expected, "plain `tether tail` after three crashes");
}

/// Lines the fast worker writes; far more than a shim may hold back.
const FAST_LINES: u64 = 100_000;
/// How long the daemon stays down while the fast worker writes.
const DOWN_LONG: Duration = Duration::from_secs(5);

#[test]
fn with_the_daemon_down_a_fast_worker_blocks_and_loses_nothing() {
    let mut sup = Supervised::start();
    // `seq` writes at full speed once `go` exists; `done` marks the end.
    let script = format!(
        "echo ready; while [ ! -e go ]; do sleep 0.05; done; seq -w 1 {FAST_LINES}; touch done"
    );
    let id = sup.run_sh(&[], &script);
    let pid = sup.wait_running(&id, STEP_TIMEOUT);
    sup.wait_line(&id, "ready", STEP_TIMEOUT);

    sup.daemon().kill9();
    std::fs::write(sup.sb().file("go"), "").unwrap();
    std::thread::sleep(DOWN_LONG);
    let done = sup.sb().file("done");
    assert!(
        !done.exists(),
        "the worker wrote all {FAST_LINES} lines while the daemon was down: \
         its output was not held back"
    );
    assert!(
        procs::is_running(pid),
        "the worker (pid {pid}) is gone while the daemon was down"
    );

    // For the record: what holding back output costs the shim.
    let shim = procs::parent_of(pid);
    if let Ok(memory) = mem::read(shim) {
        eprintln!(
            "shim pid {shim} after {DOWN_LONG:?} without a daemon: rss {} KiB, peak {} KiB",
            memory.rss_kib, memory.hwm_kib
        );
    }

    sup.daemon().restart();
    let info = sup.wait_state(&id, "completed", STEP_TIMEOUT);
    assert!(done.exists(), "completed, but the worker never finished");
    assert_eq!(number(&info, "attempt"), 1, "{info}");

    let width = FAST_LINES.to_string().len();
    let mut expected = String::from("ready\n");
    for n in 1..=FAST_LINES {
        expected.push_str(&format!("{n:0width$}\n"));
    }
    let mut stdout = sup.stdout_lines(&id).join("\n");
    stdout.push('\n');
    assert_same_lines(&stdout, &expected, "stdout after 5 s without a daemon");
}
