//! An execution's inbox: `tether send` queues durably, `tether recv` in
//! the worker prints each message and only then has it removed, so that
//! through daemon `kill -9`s and a killed worker every message arrives, in
//! order, and one comes twice only right after a crash (same id). `send`
//! reads stdin without words; `recv --all` prints every waiting message;
//! `recv --timeout` on an empty inbox exits 1; a full inbox, or an ended
//! execution, refuses `send` with exit 1.

use std::time::Duration;

use tether_tests::supervise::{pid_of, Supervised};

use crate::gates_support::{assert_output, kill_attempt_1, tether_env, TIMEOUT};

/// Prints each message with its id into `got.txt`, one `recv` at a time,
/// forever; a failing `recv` fails the attempt.
const RECEIVER: &str = r#"while :; do
  "$TETHER" --connect-timeout 5m recv --print-id >> got.txt || exit 1
done"#;

/// The `ID<TAB>MESSAGE` lines the receiver has written so far.
fn received(sup: &Supervised) -> Vec<(u64, String)> {
    let text = std::fs::read_to_string(sup.sb().file("got.txt")).unwrap_or_default();
    text.lines()
        .map(|line| {
            let (id, msg) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("`recv --print-id` wrote {line:?}, no tab"));
            let id = id
                .parse()
                .unwrap_or_else(|_| panic!("`recv --print-id` wrote {line:?}, no id"));
            (id, msg.to_owned())
        })
        .collect()
}

/// `received` with each run of one id (a redelivery after a crash) kept
/// once.
fn deduped(got: &[(u64, String)]) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = Vec::new();
    for item in got {
        if out.last().map(|last| last.0) != Some(item.0) {
            out.push(item.clone());
        }
    }
    out
}

/// Waits until `n` distinct messages have been received.
fn wait_received(sup: &Supervised, id: &str, n: usize) {
    let what = format!("{n} messages received by {id}");
    let start = std::time::Instant::now();
    while deduped(&received(sup)).len() < n {
        if start.elapsed() > TIMEOUT {
            panic!(
                "timed out after {TIMEOUT:?} waiting for {what}; got.txt:\n{:#?}\nps: {}\n\
                 stream:\n{}",
                received(sup),
                sup.info(id),
                sup.describe(id)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn message(n: usize) -> String {
    format!("msg-{n:02}")
}

/// `tether send ID msg-NN` for each n, each asserted to print nothing.
fn send_range(sup: &Supervised, id: &str, range: std::ops::RangeInclusive<usize>) {
    for n in range {
        assert_output(&sup.sb().run(&["send", id, &message(n)]), 0, "", "");
    }
}

#[test]
fn every_message_arrives_in_order_through_daemon_and_worker_crashes() {
    let mut sup = Supervised::start();
    let env = tether_env();
    let id = sup.run_sh(&["--restart", "on-failure", "--env", &env], RECEIVER);
    let first_pid = sup.wait_running(&id, TIMEOUT);

    send_range(&sup, &id, 1..=4);
    wait_received(&sup, &id, 2);
    sup.daemon().kill9();
    sup.daemon().restart();

    send_range(&sup, &id, 5..=10);
    wait_received(&sup, &id, 10);
    kill_attempt_1(&id, first_pid);
    let info = sup.wait_for(&id, "running attempt 2", TIMEOUT, |v| {
        v["attempt"] == 2 && v["state"] == "running" && v["pid"].is_u64()
    });
    assert_ne!(pid_of(&info), first_pid);

    // Sent, then a crash at once: the messages were durable when `send`
    // returned, and the receiver may be anywhere among them.
    send_range(&sup, &id, 11..=15);
    sup.daemon().kill9();
    sup.daemon().restart();
    send_range(&sup, &id, 16..=20);
    wait_received(&sup, &id, 20);

    let got = received(&sup);
    let once = deduped(&got);
    let messages: Vec<String> = once.iter().map(|(_, m)| m.clone()).collect();
    let want: Vec<String> = (1..=20).map(message).collect();
    assert_eq!(
        messages, want,
        "every message once, in order; got.txt: {got:#?}"
    );
    assert!(
        once.windows(2).all(|w| w[0].0 < w[1].0),
        "ids rise and an id repeats only next to itself: {got:#?}"
    );
    assert!(
        got.len() - once.len() <= 3,
        "at most one redelivery per crash (three crashes): {got:#?}"
    );
    // Nothing is left in the inbox.
    let out = sup
        .sb()
        .run(&["recv", "--execution", &id, "--timeout", "1s"]);
    out.assert_code(1);
}

#[test]
fn send_reads_stdin_and_recv_prints_one_all_or_none() {
    let sup = Supervised::start();
    let sb = sup.sb();
    let id = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&id, TIMEOUT);

    let stdin = sb.run_with_stdin(&["send", &id], b"line one\nline two\n");
    assert_output(&stdin, 0, "", "");
    assert_output(&sb.run(&["send", &id, "hello", "world"]), 0, "", "");
    let bare = sb.run_with_stdin(&["send", &id], b"no newline");
    assert_output(&bare, 0, "", "");

    // One message without --all; the rest with it, each ending in a
    // newline (added only where it had none).
    assert_output(
        &sb.run(&["recv", "--execution", &id]),
        0,
        "line one\nline two\n",
        "",
    );
    assert_output(
        &sb.run(&["recv", "--execution", &id, "--all"]),
        0,
        "hello world\nno newline\n",
        "",
    );
    assert_output(
        &sb.run(&["recv", "--execution", &id, "--timeout", "1s"]),
        1,
        "",
        &format!("tether: no message for {id} within 1s\n"),
    );

    // --print-id: each message after its id and a tab; ids rise.
    assert_output(&sb.run(&["send", &id, "first"]), 0, "", "");
    assert_output(&sb.run(&["send", &id, "second"]), 0, "", "");
    let out = sb.run(&["recv", "--execution", &id, "--all", "--print-id"]);
    out.assert_success();
    let lines: Vec<(u64, &str)> = out
        .stdout
        .lines()
        .map(|l| {
            let (n, m) = l
                .split_once('\t')
                .unwrap_or_else(|| panic!("no tab in {l:?}"));
            (n.parse().unwrap_or_else(|_| panic!("no id in {l:?}")), m)
        })
        .collect();
    assert_eq!(
        lines.iter().map(|l| l.1).collect::<Vec<_>>(),
        ["first", "second"],
        "{}",
        out.stdout
    );
    assert!(lines[0].0 < lines[1].0, "{}", out.stdout);
}

#[test]
fn a_full_inbox_or_an_ended_execution_refuses_send_with_exit_1() {
    let sb = tether_tests::Sandbox::new();
    let daemon = sb.start_daemon_with_args(&["--inbox-max-messages", "3"]);
    let sup = Supervised::with(sb, daemon);
    let sb = sup.sb();
    let id = sup.run(&["--restart", "never", "--", "sleep", "600"]);
    sup.wait_running(&id, TIMEOUT);

    for m in ["m1", "m2", "m3"] {
        assert_output(&sb.run(&["send", &id, m]), 0, "", "");
    }
    let full = sb.run(&["send", &id, "m4"]);
    full.assert_code(1);
    assert_eq!(full.stdout, "");
    assert!(
        full.stderr.starts_with("tether: ") && full.stderr.contains("full"),
        "the refusal says the inbox is full: {:?}",
        full.stderr
    );
    // Receiving one makes room for one.
    assert_output(&sb.run(&["recv", "--execution", &id]), 0, "m1\n", "");
    assert_output(&sb.run(&["send", &id, "m4"]), 0, "", "");
    assert_output(
        &sb.run(&["recv", "--execution", &id, "--all"]),
        0,
        "m2\nm3\nm4\n",
        "",
    );

    let ended = sup.run(&["--restart", "never", "--", "true"]);
    sup.wait_state(&ended, "completed", TIMEOUT);
    let out = sb.run(&["send", &ended, "late"]);
    out.assert_code(1);
    assert_eq!(out.stdout, "");
}
