//! Socket activation: the test plays systemd. It binds the listening socket
//! itself and hands it to each daemon as descriptor 3, so connections made
//! while no daemon runs wait in the kernel and are served by the next one.

use std::os::unix::net::UnixListener;
use std::time::Duration;

use tether_protocol::{Capabilities, Hello, Request, Response, PROTOCOL_VERSION};
use tether_tests::process::StdinFeeder;
use tether_tests::text::{assert_same_lines, lines, LINE_LEN};
use tether_tests::{raw, Background, RawConn, Sandbox, Signal};

use crate::systemd_support::{activated, Tetherd};

const STREAM: &str = "activated";
const BEFORE: u64 = 300;
const TOTAL: u64 = 1200;
const WAITING_CLIENTS: usize = 8;
const TIMEOUT: Duration = Duration::from_secs(60);

fn hello() -> Request {
    Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::NONE,
        client: "systemd-activation-test".to_owned(),
    })
}

#[test]
fn inherited_socket_serves_every_connection_across_kill9_and_tail_prints_each_frame_once() {
    let sb = Sandbox::new();
    let listener = UnixListener::bind(sb.socket()).unwrap();
    let mut first = Tetherd::start(
        activated(&sb, "tetherd-1.log", &listener),
        &sb,
        "tetherd-1.log",
    );
    sb.publish(STREAM, &lines(1..=BEFORE));
    let mut follower = sb.spawn("follower", &["tail", STREAM, "-f"]);
    follower.wait_stdout_len(BEFORE * LINE_LEN, TIMEOUT);

    first.kill9();
    // No daemon runs now. Every connection is still accepted by the kernel
    // (never refused), and what is written to it waits there.
    let mut waiting = Vec::new();
    for i in 0..WAITING_CLIENTS {
        let mut conn = RawConn::connect(&sb.socket())
            .unwrap_or_else(|e| panic!("connection {i} refused while no daemon ran: {e}"));
        conn.send(&hello()).unwrap();
        waiting.push(conn);
    }
    let mut publisher = Background::spawn("publisher", sb.tether(&["publish", STREAM]), sb.path());
    let feeder = StdinFeeder::new(publisher.take_stdin());
    feeder.feed(lines(BEFORE + 1..=TOTAL));
    feeder.finish();
    std::thread::sleep(Duration::from_millis(300));

    let mut second = Tetherd::start(
        activated(&sb, "tetherd-2.log", &listener),
        &sb,
        "tetherd-2.log",
    );
    for (i, conn) in waiting.iter_mut().enumerate() {
        match conn.expect_response() {
            Response::HelloOk(_) => {}
            other => panic!("connection {i} made while no daemon ran got {other:?}"),
        }
    }
    publisher.assert_exit(0, TIMEOUT);
    raw::assert_stored(&sb.socket(), STREAM, TOTAL);
    follower.wait_stdout_len(TOTAL * LINE_LEN, TIMEOUT);
    // Give a duplicate the chance to show up before comparing.
    std::thread::sleep(Duration::from_millis(300));
    assert_same_lines(
        &follower.stdout(),
        &lines(1..=TOTAL),
        "tail -f across the restart",
    );

    second.signal(Signal::Term);
    let status = second.wait(TIMEOUT);
    assert!(
        status.success(),
        "tetherd exited with {status}:\n{}",
        second.log()
    );
    assert!(
        sb.socket().exists(),
        "the daemon removed the inherited socket's file on exit"
    );
}

#[test]
fn a_socket_passed_to_another_pid_is_ignored_and_the_daemon_binds_its_own() {
    let sb = Sandbox::new();
    let mut cmd = crate::systemd_support::tetherd(&sb, "tetherd.log", &[]);
    // Inherited from a parent that was activated: not meant for this daemon.
    cmd.env("LISTEN_PID", "1").env("LISTEN_FDS", "1");
    let mut daemon = Tetherd::start(cmd, &sb, "tetherd.log");
    daemon.signal(Signal::Term);
    assert!(daemon.wait(TIMEOUT).success(), "{}", daemon.log());
    assert!(
        !sb.socket().exists(),
        "a socket the daemon bound itself is removed on exit"
    );
}
