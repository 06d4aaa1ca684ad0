//! A worker line's time is when its shim read it, not when the daemon
//! stored it: lines a worker prints while the daemon is down keep their
//! own times once they are delivered. The daemon keeps a producer's time
//! but never one later than its own clock.

use std::time::Duration;

use bytes::Bytes;
use tether_protocol::time::now_micros;
use tether_protocol::{AppendStamped, Capabilities, FrameKind, Request, Response};
use tether_tests::raw::RawConn;
use tether_tests::sandbox::Sandbox;
use tether_tests::supervise::{gap, parse_frame, payloads, Supervised};
use tether_tests::wait::wait_until;

const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn lines_printed_while_the_daemon_is_down_keep_the_times_they_were_read() {
    let mut sup = Supervised::start();
    // The worker prints nothing until `go` exists, then a line a second,
    // and says when it is done; the daemon is down all that while.
    let script = "while [ ! -e go ]; do sleep 0.05; done; \
                  for i in 1 2 3 4; do echo line-$i; [ $i -lt 4 ] && sleep 1; done; \
                  touch done";
    let id = sup.run_sh(&["--restart", "never"], script);
    sup.wait_running(&id, STEP_TIMEOUT);
    let status = sup.daemon().terminate();
    assert!(
        status.success(),
        "tetherd exited with {status:?} on SIGTERM"
    );

    std::fs::write(sup.sb().file("go"), b"").unwrap();
    let done = sup.sb().file("done");
    wait_until(STEP_TIMEOUT, "the worker to print its lines", || {
        done.exists()
    });
    sup.daemon().restart();
    sup.wait_state(&id, "completed", STEP_TIMEOUT);

    let frames = sup.frames(&id);
    let lines: Vec<_> = frames.iter().filter(|f| f.kind == "stdout").collect();
    assert_eq!(
        payloads(&frames, "stdout"),
        ["line-1", "line-2", "line-3", "line-4"],
        "{}",
        sup.describe(&id)
    );
    for pair in lines.windows(2) {
        assert!(
            pair[0].ts_micros < pair[1].ts_micros,
            "times not increasing: {:?}",
            lines
        );
    }
    let spread = gap(lines[0], lines[3]);
    assert!(
        spread >= Duration::from_secs(2),
        "the four lines, printed a second apart while the daemon was down, are \
         dated only {spread:?} apart: {lines:?}"
    );
}

/// A producer's time is kept when it is in the past, and never stored
/// later than the daemon's own clock.
#[test]
fn a_stamped_time_is_kept_but_never_later_than_the_daemons_clock() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    let mut conn = RawConn::open(&sb.socket());
    let granted = conn.hello(Capabilities::APPEND_STAMPED).capabilities;
    assert!(
        granted.contains(Capabilities::APPEND_STAMPED),
        "{granted:?}"
    );
    let before = now_micros();
    for (seq, ts_micros) in [(1, 1_000_000), (2, u64::MAX / 2)] {
        conn.send(&Request::AppendStamped(AppendStamped {
            stream: "stamped".into(),
            producer: "p".into(),
            producer_seq: seq,
            kind: FrameKind::Stdout,
            payload: Bytes::from_static(b"x"),
            ts_micros,
        }))
        .unwrap();
        match conn.expect_response() {
            Response::Appended(a) => assert_eq!(a.producer_seq, seq),
            other => panic!("expected Appended, got {other:?}"),
        }
    }
    let after = now_micros();
    let out = sb.run(&["tail", "--json", "stamped"]);
    out.assert_success();
    let frames: Vec<_> = out.stdout.lines().map(parse_frame).collect();
    assert_eq!(frames[0].ts_micros, 1_000_000);
    assert!(
        (before..=after).contains(&frames[1].ts_micros),
        "a time in the future was stored as {} (clock {before}..{after})",
        frames[1].ts_micros
    );
}
