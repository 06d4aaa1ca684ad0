//! Local security, bounded memory under hostile input: connections that
//! declare large messages and send little of them cost what they sent;
//! past `max_partial_bytes` those that sent the least are closed; a message
//! that stops arriving is cut off after the stall timeout, an idle
//! connection between messages is not; a reader that starts a message it
//! may not send is refused before its body is read; and other clients are
//! served throughout.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tether_protocol::{Capabilities, ErrorCode, Request, Response};
use tether_tests::raw::{append_frame, RawConn};
use tether_tests::remote::{test_users, READER, READERS_GROUP};
use tether_tests::wait::wait_until;
use tether_tests::{cli, Sandbox};

/// The daemon's stall timeout (fixed by the contract).
const STALL: Duration = Duration::from_secs(30);

/// A connection that said Hello and sent the first `bytes` bytes of
/// `frame`, all of them read by the daemon.
fn partial_sender(sb: &Sandbox, frame: &[u8], bytes: usize) -> RawConn {
    let mut conn = RawConn::open(&sb.socket());
    conn.hello(Capabilities::DURABLE);
    conn.send_bytes(&frame[..bytes]).unwrap();
    wait_until(Duration::from_secs(30), "the daemon to read", || {
        conn.unread_by_peer().unwrap() == 0
    });
    conn
}

/// Publishing and reading back a stream works.
fn assert_served(sb: &Sandbox, stream: &str) {
    sb.publish(stream, "one\ntwo\n");
    let out = sb.run(&["tail", stream]);
    out.assert_success();
    assert_eq!(out.stdout, "one\ntwo\n");
}

/// 200 connections each declare a 16 MiB append and send 1 MiB of it: the
/// daemon holds about what they sent, serves others meanwhile, keeps an
/// idle connection, and closes each stalled one after the stall timeout.
#[test]
fn stalled_partial_messages_cost_what_was_sent_and_are_closed() {
    let sb = Sandbox::new();
    let daemon = sb.start_daemon();
    let frame = append_frame("s", 16 << 20);
    let sent = 1 << 20;
    let mut idle = RawConn::open(&sb.socket());
    idle.hello(Capabilities::DURABLE);
    let started = Instant::now();
    let mut stalled: Vec<RawConn> = (0..200)
        .map(|_| partial_sender(&sb, &frame, sent))
        .collect();

    let mem = daemon.memory();
    assert!(
        mem.peak_mib() < 600,
        "200 partial messages of 1 MiB took the daemon to {} MiB",
        mem.peak_mib()
    );
    assert_served(&sb, "others");
    assert!(stalled.iter().all(RawConn::is_quiet), "closed too early");

    // The first sender's stall timeout is near: its answer, and each
    // after it, comes within the read timeout.
    std::thread::sleep((started + STALL).saturating_duration_since(Instant::now()));
    for conn in &mut stalled {
        let error = conn.expect_error();
        assert_eq!(error.code, ErrorCode::MALFORMED);
        assert_eq!(
            error.message,
            format!(
                "the connection sent {sent} of the {} bytes of a message, then nothing for 30s",
                frame.len()
            )
        );
        conn.expect_closed();
    }
    idle.send(&Request::Status).unwrap();
    assert!(matches!(idle.expect_response(), Response::Status(_)));
}

/// Past `max_partial_bytes`, the connections that have sent the least of
/// their messages are closed, as many as it takes; the others go on.
#[test]
fn past_the_partial_budget_the_least_sent_are_closed() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon_with_env(&[("TETHER_MAX_PARTIAL_BYTES", "8388608")]);
    let frame = append_frame("s", 16 << 20);
    let mib = 1 << 20;
    // 6.5 MiB held: within the budget.
    let a = partial_sender(&sb, &frame, 3 * mib);
    let b = partial_sender(&sb, &frame, 2 * mib);
    let mut c = partial_sender(&sb, &frame, mib);
    let mut d = partial_sender(&sb, &frame, mib / 2);
    assert!([&a, &b, &c, &d].iter().all(|conn| conn.is_quiet()));
    // 2.5 MiB more pass it: d, then c, hold the least.
    let e = partial_sender(&sb, &frame, 5 * mib / 2);
    for (conn, held) in [(&mut c, mib), (&mut d, mib / 2)] {
        let error = conn.expect_error();
        assert_eq!(error.code, ErrorCode::TOO_MANY_CONNECTIONS);
        assert_eq!(
            error.message,
            format!(
                "partly received messages passed max_partial_bytes (8388608 bytes across \
                 connections); this connection, {held} bytes into its message, was among \
                 those that had sent the least"
            )
        );
        conn.expect_closed();
    }
    assert_served(&sb, "others");
    assert!([&a, &b, &e].iter().all(|conn| conn.is_quiet()));
}

/// A reader that starts an append is refused as soon as the append's
/// kind arrives: the daemon does not wait for (or read) the rest.
#[test]
fn a_reader_starting_a_large_append_is_refused_at_once() {
    let Some((reader, _)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon_with_env(&[
        ("TETHER_READERS_GROUP", READERS_GROUP),
        ("TETHER_SOCKET_MODE", "666"),
    ]);
    // Other users must be able to reach the socket inside the sandbox.
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether-it-partial"));
    // The length prefix and the first byte of the body: the kind.
    cmd.arg(sb.socket()).arg("5");
    cmd.uid(reader.uid).gid(reader.gid).current_dir("/");
    let out = cli::run(cmd, b"", Duration::from_secs(60));
    out.assert_success();
    assert_eq!(
        out.stdout,
        format!(
            "permission_denied: permission denied: uid {} ({READER}) is in the readers group \
             and may only read (tail without --consumer, streams, ps, status, checkpoint \
             list/load); Append is refused\n",
            reader.uid
        )
    );
}
