//! `attach`, `run --attach` and `wait` end once the execution has ended and
//! every frame is printed, with the worker's last exit code: its code,
//! 128+N for signal N, 125 when the execution is `lost`.

use std::time::Duration;

use tether_tests::process::{send_signal, Signal};
use tether_tests::procs;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn attach_prints_the_output_and_exits_with_the_workers_code() {
    let sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "echo out; echo err >&2; while [ ! -e go ]; do sleep 0.05; done; echo last; exit 3",
    );
    let mut attach = sup.sb().spawn("attach", &["attach", &id]);
    sup.wait_line(&id, "out", TIMEOUT);
    std::fs::write(sup.sb().file("go"), b"").unwrap();
    attach.assert_exit(3, TIMEOUT);
    assert_eq!(attach.stdout(), "out\nlast\n");
    let theirs: Vec<String> = attach
        .stderr()
        .lines()
        .filter(|l| !l.starts_with("tether: "))
        .map(str::to_owned)
        .collect();
    assert_eq!(theirs, ["err"]);

    // Attaching after the end prints it all again and exits the same.
    let again = sup.sb().run(&["attach", &id]);
    again.assert_code(3);
    assert_eq!(again.stdout, "out\nlast\n");
}

#[test]
fn run_attach_exits_with_the_workers_code() {
    let sup = Supervised::start();
    let dir = sup.sb().path().display().to_string();
    let out = sup.sb().run(&[
        "run",
        "--attach",
        "--restart",
        "never",
        "--cwd",
        &dir,
        "--",
        "sh",
        "-c",
        "echo hi; exit 3",
    ]);
    out.assert_code(3);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{:?}", out.stdout);
    assert_eq!(lines[1], "hi");
}

#[test]
fn a_worker_killed_by_signal_9_makes_attach_exit_137() {
    let sup = Supervised::start();
    let id = sup.run_sh(&["--restart", "never"], "echo up; exec sleep 300");
    let worker = sup.wait_running(&id, TIMEOUT);
    let mut attach = sup.sb().spawn("attach", &["attach", &id]);
    sup.wait_line(&id, "up", TIMEOUT);
    send_signal(worker, Signal::Kill);
    attach.assert_exit(137, TIMEOUT);
    assert_eq!(attach.stdout(), "up\n");
    sup.sb().run(&["wait", &id]).assert_code(137);
}

#[test]
fn a_lost_execution_makes_attach_exit_125() {
    let sup = Supervised::start();
    let id = sup.run_sh(&["--restart", "never"], "echo up; exec sleep 300");
    let worker = sup.wait_running(&id, TIMEOUT);
    let shim = procs::parent_of(worker);
    let mut attach = sup.sb().spawn("attach", &["attach", &id]);
    sup.wait_line(&id, "up", TIMEOUT);
    send_signal(shim, Signal::Kill);
    attach.assert_exit(125, TIMEOUT);
    assert_eq!(sup.info(&id)["state"], "lost");
    send_signal(worker, Signal::Kill);
}

#[test]
fn wait_blocks_until_each_has_ended_and_exits_like_the_last() {
    let sup = Supervised::start();
    let gate = "while [ ! -e go ]; do sleep 0.05; done";
    let zero = sup.run_sh(&["--restart", "never"], &format!("{gate}; exit 0"));
    let five = sup.run_sh(&["--restart", "never"], &format!("{gate}; exit 5"));
    let mut wait = sup.sb().spawn("wait", &["wait", &zero, &five]);
    std::thread::sleep(Duration::from_millis(500));
    assert!(wait.is_running(), "wait ended early: {}", wait.stderr());
    std::fs::write(sup.sb().file("go"), b"").unwrap();
    wait.assert_exit(5, TIMEOUT);
    sup.sb().run(&["wait", &five, &zero]).assert_code(0);
    sup.sb().run(&["wait", "no-such-execution"]).assert_code(3);
}

#[test]
fn attach_with_n_starts_at_the_last_frames_and_follows() {
    let sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "echo a; echo b; echo c; while [ ! -e go ]; do sleep 0.05; done; echo d",
    );
    sup.wait_line(&id, "c", TIMEOUT);
    let mut attach = sup.sb().spawn("attach", &["attach", &id, "-n", "2"]);
    // "b\nc\n" printed before the worker goes on.
    attach.wait_stdout_len(4, TIMEOUT);
    std::fs::write(sup.sb().file("go"), b"").unwrap();
    attach.assert_exit(0, TIMEOUT);
    assert_eq!(attach.stdout(), "b\nc\nd\n");
}
