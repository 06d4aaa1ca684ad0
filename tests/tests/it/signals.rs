//! SIGTERM and SIGINT end a following `tether tail` cleanly with its cursor
//! file in step, and end `tetherd` cleanly with its data kept.

use std::time::Duration;

use tether_tests::process::StdinFeeder;
use tether_tests::text::{assert_same_lines, lines, LINE_LEN};
use tether_tests::{raw, Background, Sandbox, Signal};

const STREAM: &str = "cursor";
const BEFORE: u64 = 500;
const TOTAL: u64 = 3000;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Stops a `tail -f --cursor-file` with `signal` while lines are arriving,
/// then resumes it from the cursor file: together the two runs print every
/// line exactly once.
fn follower_stopped_by_signal_resumes_exactly(signal: Signal) {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=BEFORE));
    let cursor = sb.file("cursor");
    let cursor_arg = cursor.to_str().unwrap();

    let mut follower = sb.spawn(
        "follower",
        &["tail", STREAM, "-f", "--cursor-file", cursor_arg],
    );
    follower.wait_stdout_len(BEFORE * LINE_LEN, TIMEOUT);
    let mut publisher = Background::spawn("publisher", sb.tether(&["publish", STREAM]), sb.path());
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(lines(BEFORE + 1..=TOTAL));
    feeder.finish();
    follower.wait_stdout_len((BEFORE + 100) * LINE_LEN, TIMEOUT);

    follower.signal(signal);
    follower.assert_exit(0, TIMEOUT);
    let printed = follower.stdout();
    assert_eq!(
        printed.len() as u64 % LINE_LEN,
        0,
        "the last line was cut short: {:?}",
        &printed[printed.len().saturating_sub(20)..]
    );
    let last = printed.len() as u64 / LINE_LEN;
    assert_same_lines(&printed, &lines(1..=last), "tail -f before the signal");
    let stored = std::fs::read_to_string(&cursor).unwrap();
    assert_eq!(stored.trim(), last.to_string(), "cursor file {stored:?}");

    publisher.assert_exit(0, TIMEOUT);
    raw::assert_stored(&sb.socket(), STREAM, TOTAL);
    let out = sb.run(&["tail", STREAM, "--cursor-file", cursor_arg]);
    out.assert_success();
    assert_same_lines(
        &out.stdout,
        &lines(last + 1..=TOTAL),
        "tail resumed from the cursor file",
    );
    let stored = std::fs::read_to_string(&cursor).unwrap();
    assert_eq!(stored.trim(), TOTAL.to_string(), "cursor file {stored:?}");
}

#[test]
fn sigterm_stops_tail_with_cursor_in_step_and_resume_repeats_nothing() {
    follower_stopped_by_signal_resumes_exactly(Signal::Term);
}

#[test]
fn sigint_stops_tail_with_cursor_in_step_and_resume_repeats_nothing() {
    follower_stopped_by_signal_resumes_exactly(Signal::Int);
}

#[test]
fn daemon_exits_zero_on_sigterm_and_keeps_its_data() {
    let sb = Sandbox::new();
    let mut daemon = sb.start_daemon();
    sb.publish(STREAM, &lines(1..=10));

    let status = daemon.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "tetherd exited with {status} on SIGTERM"
    );

    daemon.restart();
    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_eq!(out.stdout, lines(1..=10));
}
