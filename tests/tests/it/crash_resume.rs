//! Guarantees 1-3 under fire: a publisher and followers keep going while the
//! daemon is `kill -9`'d and restarted, and every line arrives exactly once,
//! in order.

use std::time::Duration;

use tether_tests::process::StdinFeeder;
use tether_tests::raw;
use tether_tests::text::{assert_same_lines, lines, LINE_LEN};
use tether_tests::wait::wait_until;
use tether_tests::{Daemon, Sandbox, Signal};

const STREAM: &str = "crash";
const LINES: u64 = 100_000;
const KILLS: u64 = 6;
/// The input goes in as `KILLS + 1` chunks: a kill lands while each of the
/// first `KILLS` chunks is being stored.
const CHUNK: u64 = LINES.div_ceil(KILLS + 1);
const STEP_TIMEOUT: Duration = Duration::from_secs(90);

#[test]
fn publish_and_tail_survive_repeated_kill_9_with_every_line_exactly_once() {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon();
    survive_kills(&sb, daemon);
}

/// The same with a log of 256 KiB, which the frames wrap about ten
/// times: the chunks it keeps for the store are copied in as it wraps
/// back to them, and the kills land anywhere in that.
#[test]
fn every_line_exactly_once_through_kill_9_while_the_log_wraps() {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon_with_env(&[("TETHER_LOG_CAPACITY", "262144")]);
    survive_kills(&sb, daemon);
}

/// Publishes [`LINES`] lines, followed by two `tail -f`s, while the daemon
/// is killed [`KILLS`] times; every line must arrive exactly once.
fn survive_kills(sb: &Sandbox, mut daemon: Daemon) {
    let socket = sb.socket();
    let input = lines(1..=LINES);
    let chunk_of = |k: u64| -> String {
        let first = k * CHUNK + 1;
        lines(first..=LINES.min(first + CHUNK - 1))
    };

    let mut publisher = tether_tests::Background::spawn(
        "publisher",
        sb.tether_with_timeout("60s", &["publish", STREAM, "--producer", "P"]),
        sb.path(),
    );
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(chunk_of(0));

    // `tail -f` needs the stream to exist; it follows from the first frame on.
    wait_until(STEP_TIMEOUT, "the stream's first frame", || {
        raw::last_seq(&socket, STREAM) >= 1
    });
    let cursor = sb.file("cursor");
    let cursor_arg = cursor.to_str().unwrap();
    let mut follower = sb.spawn(
        "follower",
        &["tail", STREAM, "-f", "--cursor-file", cursor_arg],
    );
    let mut late_follower = None;

    for k in 0..KILLS {
        // Kill once this chunk is partly stored, so the publisher has frames
        // in flight and the followers are mid-stream.
        let target = k * CHUNK + CHUNK / 4;
        wait_until(
            STEP_TIMEOUT,
            &format!("seq {target} before kill {}", k + 1),
            || raw::last_seq(&socket, STREAM) >= target,
        );
        let before = raw::last_seq(&socket, STREAM);
        daemon.kill9();
        eprintln!("kill {}: last seq {before}, fed {}", k + 1, (k + 1) * CHUNK);
        feeder.feed(chunk_of(k + 1));
        daemon.restart();
        if k == 2 {
            // A second follower that joins half-way and lives through the
            // remaining crashes without a cursor file.
            let count = LINES.to_string();
            late_follower =
                Some(sb.spawn("late", &["tail", STREAM, "-f", "--count", count.as_str()]));
        }
    }
    feeder.finish();
    publisher.assert_exit(0, STEP_TIMEOUT);
    raw::assert_stored(&socket, STREAM, LINES);

    let total = LINES * LINE_LEN;
    follower.wait_stdout_len(total, STEP_TIMEOUT);
    // Anything printed twice would arrive right behind the last line.
    std::thread::sleep(Duration::from_millis(500));
    follower.signal(Signal::Term);
    follower.assert_exit(0, STEP_TIMEOUT);
    assert_same_lines(
        &follower.stdout(),
        &input,
        "tail -f --cursor-file through 6 crashes",
    );
    let stored = std::fs::read_to_string(&cursor).unwrap();
    assert_eq!(stored.trim(), LINES.to_string(), "cursor file {stored:?}");

    let mut late = late_follower.unwrap();
    late.assert_exit(0, STEP_TIMEOUT);
    assert_same_lines(&late.stdout(), &input, "tail -f --count started half-way");

    let out = sb.run(&["tail", STREAM]);
    out.assert_success();
    assert_same_lines(&out.stdout, &input, "tail after the last restart");
}

#[test]
fn acknowledged_frames_survive_kill_9() {
    let sb = Sandbox::new();
    let mut daemon = sb.start_daemon();
    sb.publish("acked", &lines(1..=1000));

    daemon.kill9();
    daemon.restart();

    let out = sb.run(&["tail", "acked"]);
    out.assert_success();
    assert_same_lines(&out.stdout, &lines(1..=1000), "tail after kill -9");
    sb.publish("acked", &lines(1001..=1002));
    let out = sb.run(&["tail", "acked", "--from-seq", "1001"]);
    out.assert_success();
    assert_eq!(
        out.stdout,
        lines(1001..=1002),
        "seqs continue after a crash"
    );
}
