//! Output as it happens: a Python worker is unbuffered by default, and
//! `run --pty` makes a C-stdio program flush each line, while without it
//! the same program holds its stdout back. A worker on a pseudo-terminal
//! still inherits only stdin, stdout and stderr.
//!
//! Nothing here is timed: "as it happens" is shown by the line arriving
//! while the worker is still running (it sleeps afterwards), and "held
//! back" by a later unbuffered line on stderr arriving without it.

use std::time::Duration;

use tether_tests::supervise::{payloads, Supervised};
use tether_tests::wait::wait_until;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A perl worker: one line to stdout (buffered by C-stdio rules), then one
/// to stderr (always unbuffered), then a long sleep.
const PERL: &str = "print STDOUT \"to stdout\\n\"; print STDERR \"to stderr\\n\"; sleep 600";

#[test]
fn an_unbuffered_python_workers_first_line_is_followed_while_it_runs() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let mut cmd = sb.tether(&[
        "run",
        "--json",
        "--",
        "python3",
        "-c",
        "import time; print('first line'); time.sleep(600)",
    ]);
    // Python's own default (a block buffer on a pipe) unless tether sets
    // PYTHONUNBUFFERED for the worker.
    cmd.env_remove("PYTHONUNBUFFERED");
    let out = tether_tests::cli::run(cmd, b"", tether_tests::sandbox::RUN_TIMEOUT);
    out.assert_success();
    let value: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let id = value["id"].as_str().unwrap().to_owned();
    let mut tail = sb.spawn("tail", &["tail", "-f", &id]);
    wait_until(TIMEOUT, "tail -f to show the first line", || {
        tail.stdout().contains("first line\n")
    });
    assert!(tail.is_running(), "tail -f ended: {}", tail.stderr());
    let info = sup.info(&id);
    assert_eq!(info["state"], "running", "{info}");
}

#[test]
fn a_pty_shows_a_c_stdio_line_while_the_worker_runs() {
    let sup = Supervised::start();
    let id = sup.run(&["--pty", "--", "perl", "-e", PERL]);
    let mut tail = sup.sb().spawn("tail", &["tail", "-f", &id]);
    // Plain tail shows the lifecycle events too, before the output.
    wait_until(TIMEOUT, "tail -f to show both lines", || {
        tail.stdout().ends_with("to stdout\nto stderr\n")
    });
    // Both went through the one terminal, as stdout, in order.
    let frames = sup.frames(&id);
    assert_eq!(payloads(&frames, "stdout"), ["to stdout", "to stderr"]);
    assert!(payloads(&frames, "stderr").is_empty());
    assert!(tail.is_running(), "tail -f ended: {}", tail.stderr());
    assert_eq!(sup.info(&id)["state"], "running");
}

#[test]
fn without_a_pty_a_c_stdio_program_holds_its_stdout_back() {
    let sup = Supervised::start();
    let id = sup.run(&["--", "perl", "-e", PERL]);
    wait_until(TIMEOUT, "the stderr line", || {
        payloads(&sup.frames(&id), "stderr") == ["to stderr"]
    });
    // The stdout line was written before the stderr one but is still in
    // the worker's buffer: it never reached the pipe.
    assert!(sup.stdout_lines(&id).is_empty());
    assert_eq!(sup.info(&id)["state"], "running");
}

#[test]
fn a_worker_on_a_pty_inherits_only_its_three_descriptors() {
    let sup = Supervised::start();
    let id = sup.run(&[
        "--pty",
        "--restart",
        "never",
        "--",
        "sh",
        "-c",
        "ls -1 /proc/$$/fd",
    ]);
    sup.wait_state(&id, "completed", TIMEOUT);
    assert_eq!(sup.stdout_lines(&id), ["0", "1", "2"]);
}
