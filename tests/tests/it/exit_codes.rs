//! The client's exit codes: 2 usage, 3 not found, 4 daemon unreachable.

use std::time::Duration;

use tether_tests::{cli, Sandbox};

#[test]
fn tail_of_a_missing_stream_exits_3() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();

    let out = sb.run(&["tail", "nosuch"]);
    out.assert_code(3);
    assert_eq!(out.stdout, "");
    assert!(
        out.stderr.contains("nosuch"),
        "stderr does not name the stream: {:?}",
        out.stderr
    );
}

#[test]
fn tail_without_a_daemon_exits_4_after_the_connect_timeout() {
    let sb = Sandbox::new();

    let cmd = sb.tether_with_timeout("1s", &["tail", "anything"]);
    let out = cli::run(cmd, b"", Duration::from_secs(60));
    out.assert_code(4);
    assert_eq!(out.stdout, "");
    assert!(
        out.elapsed >= Duration::from_secs(1),
        "gave up after {:?}, before the 1 s connect timeout",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(30),
        "took {:?} to give up",
        out.elapsed
    );
    assert!(!out.stderr.is_empty(), "no message on stderr");
}

#[test]
fn missing_stream_argument_is_a_usage_error() {
    let sb = Sandbox::new();

    let out = sb.run(&["tail"]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let sb = Sandbox::new();

    let out = sb.run(&["status", "--no-such-flag"]);
    out.assert_code(2);
    assert_eq!(out.stdout, "");
}
