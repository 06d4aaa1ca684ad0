//! The `tether` binary's command-line surface: help, usage errors and the
//! "cannot reach the daemon" exit code, none of which need a daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn tether(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .env_remove("TETHER_SOCKET")
        .output()
        .expect("run tether")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn help_exits_zero_and_lists_the_commands() {
    let output = tether(&["--help"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let text = String::from_utf8(output.stdout).unwrap();
    for command in ["publish", "tail", "streams", "status"] {
        assert!(text.contains(command), "help lacks {command}:\n{text}");
    }
}

#[test]
fn an_unknown_flag_is_a_usage_error() {
    let output = tether(&["status", "--no-such-flag"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("--no-such-flag"));
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let output = tether(&["--connect-timeout", "soon", "status"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("500ms"), "{}", stderr(&output));
}

#[test]
fn no_daemon_exits_4_after_the_timeout_naming_the_socket() {
    let started = Instant::now();
    let output = tether(&[
        "--socket",
        "/nonexistent/s.sock",
        "--connect-timeout",
        "200ms",
        "status",
    ]);
    let elapsed = started.elapsed();
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("/nonexistent/s.sock"), "{message}");
    assert!(message.contains("No such file or directory"), "{message}");
    assert!(
        elapsed >= Duration::from_millis(200),
        "gave up after {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn tail_and_publish_also_exit_4_without_a_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let socket = socket.to_str().unwrap();
    for args in [
        vec!["tail", "s"],
        vec!["tail", "-f", "s"],
        vec!["publish", "s"],
        vec!["streams"],
    ] {
        let mut argv = vec!["--socket", socket, "--connect-timeout", "100ms"];
        argv.extend(args.iter().copied());
        let output = tether(&argv);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{args:?}: {}",
            stderr(&output)
        );
    }
}
