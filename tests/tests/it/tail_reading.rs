//! Reading output like a log: plain `tail` keeps a worker's stdout and
//! stderr apart, `-t` dates each line, `--since`/`--until` take times and
//! ages, and `tail -f` waits for a stream that does not exist yet and ends
//! with an execution.

use std::time::Duration;

use serde_json::Value;
use tether_tests::sandbox::Sandbox;
use tether_tests::supervise::Supervised;

const TIMEOUT: Duration = Duration::from_secs(60);

/// `(ts, payload)` of every frame of `stream`, from `tail --json`.
fn dated(sb: &Sandbox, stream: &str) -> Vec<(String, String)> {
    let out = sb.run(&["tail", "--json", stream]);
    out.assert_success();
    out.stdout
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            (
                v["ts"].as_str().unwrap().to_owned(),
                v["payload"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The lines of `text` that are not tether's own (lifecycle events).
fn worker_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with("tether: "))
        .collect()
}

#[test]
fn plain_tail_writes_stdout_lines_to_stdout_and_stderr_lines_to_stderr() {
    let sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "echo out-1; echo err-1 >&2; echo out-2; echo err-2 >&2",
    );
    sup.wait_state(&id, "completed", TIMEOUT);
    let out = sup.sb().run(&["tail", &id]);
    out.assert_success();
    assert_eq!(out.stdout, "out-1\nout-2\n");
    assert_eq!(worker_lines(&out.stderr), ["err-1", "err-2"]);
    assert!(
        out.stderr.contains("tether: started"),
        "no lifecycle event on stderr: {:?}",
        out.stderr
    );
}

#[test]
fn timestamps_prefix_each_line_with_its_stored_time_in_rfc_3339_utc() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish("log", "first\nsecond\n");
    let frames = dated(&sb, "log");
    let out = sb.run(&["tail", "-t", "log"]);
    out.assert_success();
    let expected: String = frames.iter().map(|(ts, p)| format!("{ts} {p}\n")).collect();
    assert_eq!(out.stdout, expected);
    for (ts, _) in &frames {
        // 2026-11-25T10:00:00.123456Z: UTC, six fractional digits.
        assert_eq!(ts.len(), 27, "{ts}");
        assert!(ts.ends_with('Z') && ts.as_bytes()[10] == b'T', "{ts}");
    }
}

#[test]
fn since_and_until_take_times_and_leave_out_frames_outside_them() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish("log", "early\n");
    // Frames a second apart at least, so that their times differ.
    std::thread::sleep(Duration::from_millis(1100));
    sb.publish("log", "late\n");
    let frames = dated(&sb, "log");
    let (early, late) = (&frames[0].0, &frames[1].0);
    assert!(early < late, "{frames:?}");

    let since = sb.run(&["tail", "log", "--since", late]);
    since.assert_success();
    assert_eq!(since.stdout, "late\n");
    let until = sb.run(&["tail", "log", "--until", early]);
    until.assert_success();
    assert_eq!(until.stdout, "early\n");
    // Whole seconds, as people type them, work too.
    let second = &early[..19];
    let from_second = sb.run(&["tail", "log", "--since", &format!("{second}Z")]);
    assert_eq!(from_second.stdout, "early\nlate\n");
    // With -f the first frame past --until ends it, with exit 0.
    let follow = sb.run(&["tail", "log", "-f", "--until", early]);
    follow.assert_success();
    assert_eq!(follow.stdout, "early\n");
}

#[test]
fn since_and_until_take_ages() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    sb.publish("log", "old\n");
    std::thread::sleep(Duration::from_secs(6));
    sb.publish("log", "new\n");
    // "old" is 6 s old or more; "new" far less than 3 s when the tails start.
    let since = sb.run(&["tail", "log", "--since", "3s"]);
    since.assert_success();
    assert_eq!(since.stdout, "new\n");
    let until = sb.run(&["tail", "log", "--until", "3s"]);
    until.assert_success();
    assert_eq!(until.stdout, "old\n");
    let all = sb.run(&["tail", "log", "--since", "10m"]);
    assert_eq!(all.stdout, "old\nnew\n");
}

#[test]
fn a_bad_time_is_a_usage_error_naming_what_is_accepted() {
    let sb = Sandbox::new();
    let out = sb.run(&["tail", "log", "--since", "yesterday"]);
    out.assert_code(2);
    assert!(
        out.stderr
            .contains("2026-11-25T10:00:00Z or an age like 10m"),
        "{}",
        out.stderr
    );
}

#[test]
fn tail_follow_waits_for_a_stream_that_does_not_exist_yet() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    let mut tail = sb.spawn("tail", &["tail", "-f", "later", "--count", "2"]);
    // Give it time to find no stream (the test passes either way, but
    // then proves less).
    std::thread::sleep(Duration::from_millis(500));
    assert!(tail.is_running(), "tail -f exited: {}", tail.stderr());
    sb.publish("later", "one\ntwo\n");
    tail.assert_exit(0, TIMEOUT);
    assert_eq!(tail.stdout(), "one\ntwo\n");

    let out = sb.run(&["tail", "never-made"]);
    out.assert_code(3);
}

#[test]
fn tail_follow_of_an_execution_ends_with_exit_0_once_it_has_ended() {
    let sup = Supervised::start();
    let id = sup.run_sh(
        &["--restart", "never"],
        "echo a; while [ ! -e go ]; do sleep 0.05; done; echo b; exit 7",
    );
    let mut tail = sup.sb().spawn("tail", &["tail", "-f", &id]);
    sup.wait_line(&id, "a", TIMEOUT);
    std::fs::write(sup.sb().file("go"), b"").unwrap();
    tail.assert_exit(0, TIMEOUT);
    assert_eq!(tail.stdout(), "a\nb\n");
}
