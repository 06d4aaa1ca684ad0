//! Who may use a daemon: peer credentials checked on every connection. A
//! user who is neither the daemon's owner nor root is refused; a member of
//! the configured readers group may read but not act. Both refusals are
//! clear messages and exit 1.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use tether_tests::remote::{test_users, TestUser, READERS_GROUP};
use tether_tests::text::lines;
use tether_tests::{cli, daemon, raw, Background, Output, Sandbox};

const STREAM: &str = "shared";

/// A daemon that serves `READERS_GROUP` read-only, on a socket that every
/// local user can connect to, so that the daemon (not the file mode) is
/// what decides.
fn open_daemon(sb: &Sandbox) -> Background {
    let mut cmd = daemon::command(&sb.socket(), &sb.state_dir());
    cmd.env("TETHER_READERS_GROUP", READERS_GROUP)
        .env("TETHER_SOCKET_MODE", "666");
    let process = Background::spawn("tetherd", cmd, sb.path());
    let started = Instant::now();
    while raw::status(&sb.socket()).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "tetherd did not serve: {}",
            process.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Other users must be able to reach the socket inside the sandbox.
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    process
}

/// `tether ARGS...` run as `user`.
fn run_as(sb: &Sandbox, user: TestUser, args: &[&str]) -> Output {
    let mut cmd = sb.tether_with_timeout("5s", args);
    cmd.uid(user.uid).gid(user.gid).current_dir("/");
    cli::run(cmd, b"", Duration::from_secs(60))
}

#[test]
fn a_user_outside_the_readers_group_is_refused_with_exit_1() {
    let Some((_, stranger)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = open_daemon(&sb);
    sb.publish(STREAM, &lines(1..=3));

    for args in [&["status"][..], &["tail", STREAM], &["ps"]] {
        let out = run_as(&sb, stranger, args);
        out.assert_code(1);
        assert!(out.stderr.contains("permission denied"), "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!("uid {}", stranger.uid)),
            "{}",
            out.stderr
        );
        assert!(out.stderr.contains(READERS_GROUP), "{}", out.stderr);
        assert_eq!(out.stdout, "");
    }
}

#[test]
fn a_reader_can_tail_and_list_but_not_run_or_publish() {
    let Some((reader, _)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = open_daemon(&sb);
    sb.publish(STREAM, &lines(1..=3));

    let tail = run_as(&sb, reader, &["tail", STREAM]);
    tail.assert_success();
    assert_eq!(tail.stdout, lines(1..=3));
    run_as(&sb, reader, &["streams"]).assert_success();
    run_as(&sb, reader, &["status"]).assert_success();
    run_as(&sb, reader, &["ps", "--all"]).assert_success();

    let refused = run_as(&sb, reader, &["run", "--", "true"]);
    refused.assert_code(1);
    assert!(
        refused.stderr.contains("may only read") && refused.stderr.contains("Run"),
        "{}",
        refused.stderr
    );

    let mut publish = sb.tether_with_timeout("5s", &["publish", STREAM]);
    publish.uid(reader.uid).gid(reader.gid).current_dir("/");
    let out = cli::run(publish, lines(4..=4).as_bytes(), Duration::from_secs(60));
    out.assert_code(1);
    assert!(out.stderr.contains("may only read"), "{}", out.stderr);

    let consumer = run_as(&sb, reader, &["tail", STREAM, "--consumer", "c1"]);
    consumer.assert_code(1);
    assert!(
        consumer.stderr.contains("--consumer"),
        "{}",
        consumer.stderr
    );

    // Nothing the reader tried changed the stream.
    assert_eq!(sb.run(&["tail", STREAM]).stdout, lines(1..=3));
}

#[test]
fn the_owner_keeps_full_access_to_an_open_socket() {
    let sb = Sandbox::new();
    let _daemon = open_daemon(&sb);
    sb.publish(STREAM, &lines(1..=2));
    let out = sb.run(&["run", "--", "true"]);
    out.assert_success();
}
