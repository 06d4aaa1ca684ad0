//! The `sd_notify` protocol: the test binds the datagram socket a service
//! manager would and reads what the daemon reports.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

use tether_tests::{raw, Sandbox, Signal};

use crate::systemd_support::{tetherd, Tetherd};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The next datagram, as text.
fn next(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no notification arrived: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Reads datagrams until one holds `line`; returns those before it.
fn until(socket: &UnixDatagram, line: &str) -> Vec<String> {
    let mut before = Vec::new();
    loop {
        let msg = next(socket);
        if msg.lines().any(|l| l == line) {
            return before;
        }
        before.push(msg);
    }
}

#[test]
fn ready_comes_after_the_socket_accepts_then_watchdog_pings_then_stopping_on_sigterm() {
    let sb = Sandbox::new();
    let path = sb.file("notify");
    let notify = UnixDatagram::bind(&path).unwrap();
    notify.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut cmd = tetherd(&sb, "tetherd.log", &[]);
    cmd.env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", "200000");
    let mut daemon = Tetherd::spawn(cmd, &sb, "tetherd.log");

    let before = until(&notify, "READY=1");
    // At READY=1 the socket must serve at once: no retry here.
    let info = raw::status(&sb.socket())
        .unwrap_or_else(|e| panic!("READY=1 was sent before the socket served: {e}"));
    assert_eq!(info.pid, daemon.pid());
    for msg in &before {
        assert!(
            msg.starts_with("STATUS="),
            "before READY=1 only status lines are expected, got {msg:?}"
        );
    }

    // WATCHDOG_USEC=200ms: a ping every 100ms; five must come well within 10s.
    let start = Instant::now();
    let mut pings = 0;
    while pings < 5 {
        if next(&notify) == "WATCHDOG=1" {
            pings += 1;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "only {pings} watchdog pings in 10s:\n{}",
            daemon.log()
        );
    }

    daemon.signal(Signal::Term);
    until(&notify, "STOPPING=1");
    let status = daemon.wait(TIMEOUT);
    assert!(
        status.success(),
        "tetherd exited with {status}:\n{}",
        daemon.log()
    );
}

#[test]
fn abstract_notify_socket_receives_ready_and_no_watchdog_is_sent_unasked() {
    let sb = Sandbox::new();
    let name = format!("tether-test-notify-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let notify = UnixDatagram::bind_addr(&addr).unwrap();
    notify.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut cmd = tetherd(&sb, "tetherd.log", &[]);
    cmd.env("NOTIFY_SOCKET", format!("@{name}"));
    let mut daemon = Tetherd::spawn(cmd, &sb, "tetherd.log");

    until(&notify, "READY=1");
    raw::status(&sb.socket()).expect("READY=1 was sent before the socket served");
    daemon.signal(Signal::Term);
    let before = until(&notify, "STOPPING=1");
    assert!(
        before.iter().all(|m| m != "WATCHDOG=1"),
        "watchdog pings without WATCHDOG_USEC: {before:?}"
    );
    assert!(daemon.wait(TIMEOUT).success(), "{}", daemon.log());
}
