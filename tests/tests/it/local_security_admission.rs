//! Local security, no lockout: a connection without a complete Hello is
//! closed after 5 s; a refused user is answered at once and holds no slot;
//! one uid holds at most `max_connections_per_uid` connections, and 32 are
//! kept for root and the daemon's own user. So thousands of idle
//! connections of another user leave the owner's `tether status` working.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rustix::process::{getrlimit, setrlimit, Resource};
use tether_protocol::codec::encode_frame;
use tether_protocol::{Capabilities, ErrorCode, Hello, Request, PROTOCOL_VERSION};
use tether_tests::remote::{test_users, TestUser, READER, READERS_GROUP, STRANGER};
use tether_tests::{cli, raw, wait, Background, Daemon, RawConn, Sandbox};

/// Deadline for the helper processes to open and judge all their
/// connections (thousands of them, on a loaded debug build).
const OPENED: Duration = Duration::from_secs(300);

/// A daemon that serves `READERS_GROUP` read-only, on a socket every local
/// user can reach, with `env` set for it.
fn open_daemon(sb: &Sandbox, env: &[(&str, &str)]) -> Daemon {
    let mut env = env.to_vec();
    env.extend([
        ("TETHER_READERS_GROUP", READERS_GROUP),
        ("TETHER_SOCKET_MODE", "666"),
    ]);
    let daemon = sb.start_daemon_with_env(&env);
    std::fs::set_permissions(sb.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    daemon
}

/// `tether-it-idle SOCKET N ARGS...` run as `user`, its output in the
/// sandbox as `NAME.out`.
fn idle(sb: &Sandbox, name: &str, user: TestUser, n: usize, args: &[&str]) -> Background {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tether-it-idle"));
    cmd.arg(sb.socket())
        .arg(n.to_string())
        .args(args)
        .uid(user.uid)
        .gid(user.gid)
        .current_dir("/");
    Background::spawn(name, cmd, sb.path())
}

/// What `tether-it-idle` printed once it holds all its connections.
fn answers(process: &mut Background) -> String {
    wait::wait_until(OPENED, "tether-it-idle to hold its connections", || {
        assert!(
            process.is_running(),
            "tether-it-idle exited: {}",
            process.stderr()
        );
        process.stdout().ends_with("holding\n")
    });
    process.stdout()
}

/// The `connections: N` line of the owner's `tether status`.
fn connections_line(sb: &Sandbox) -> String {
    let out = sb.run(&["status"]);
    out.assert_success();
    out.stdout
        .lines()
        .find(|l| l.starts_with("connections:"))
        .unwrap_or_else(|| panic!("no connections line in {:?}", out.stdout))
        .to_owned()
}

/// The sentence a user outside the readers group is refused with.
fn denial(stranger: TestUser) -> String {
    format!(
        "permission denied: uid {} ({STRANGER}) may not use this daemon; it serves its owner \
         (uid 0), root and members of the readers group \"{READERS_GROUP}\"",
        stranger.uid
    )
}

/// The refusal of a reader over its own limit of `cap` connections.
fn over_cap(reader: TestUser, cap: usize) -> String {
    format!(
        "uid {} ({READER}) holds its maximum of {cap} connections (max_connections_per_uid); \
         close one or try again later",
        reader.uid
    )
}

/// Lets this process and the daemons it starts open as many files as the
/// hard limit allows: thousands of connections are thousands of
/// descriptors, in the daemon as in the helper processes.
fn raise_open_file_limit(needed: u64) {
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = limit.maximum;
    setrlimit(Resource::Nofile, limit).unwrap();
    let hard = limit.maximum.unwrap_or(u64::MAX);
    assert!(
        hard >= needed,
        "this test needs an open-file limit of {needed}, the hard limit is {hard}"
    );
}

#[test]
fn a_connection_without_a_complete_hello_is_closed_after_five_seconds() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    let hello = encode_frame(&Request::Hello(Hello {
        version: PROTOCOL_VERSION,
        capabilities: Capabilities::NONE,
        client: "half a hello".to_owned(),
    }))
    .unwrap();
    let started = Instant::now();
    let mut silent = RawConn::open(&sb.socket());
    let mut half = RawConn::open(&sb.socket());
    half.send_bytes(&hello[..hello.len() / 2]).unwrap();
    // Each read waits at most 20 s (RawConn's deadline): far more than 5 s.
    for conn in [&mut silent, &mut half] {
        let error = conn.expect_error();
        assert_eq!(
            (error.code, error.message.as_str()),
            (ErrorCode::HELLO_REQUIRED, "no Hello within 5s")
        );
        conn.expect_closed();
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_refused_user_is_answered_at_once_and_holds_no_slot() {
    let Some((_, stranger)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let daemon = open_daemon(&sb, &[("TETHER_MAX_CONNECTIONS", "40")]);
    // Five times the limit, each waiting for an answer without a Hello:
    // were a refusal to wait for the Hello timeout, this would take 17
    // minutes and say hello_required.
    let mut strangers = idle(&sb, "stranger", stranger, 200, &["--listen"]);
    assert_eq!(
        answers(&mut strangers),
        format!("permission_denied 200: {}\nholding\n", denial(stranger))
    );
    // The strangers still hold their ends; the owner is served, alone.
    assert_eq!(connections_line(&sb), "connections: 1");
    // One line in the log says so, not 200: a flood of refusals must not
    // flood the journal.
    let logs = daemon.logs();
    let refusals: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("refusing connection"))
        .collect();
    assert_eq!(refusals.len(), 1, "{logs}");
    assert!(refusals[0].contains(&denial(stranger)), "{logs}");
}

#[test]
fn thousands_of_idle_connections_of_other_users_leave_the_owner_served() {
    let Some((reader, stranger)) = test_users() else {
        return;
    };
    raise_open_file_limit(12_000);
    let sb = Sandbox::new();
    // The default limits: 4096 connections, a quarter of them per uid.
    let _daemon = open_daemon(&sb, &[]);
    let mut strangers = idle(&sb, "stranger", stranger, 5000, &["--listen"]);
    let mut readers = idle(&sb, "reader", reader, 5000, &["--hello"]);
    assert_eq!(
        answers(&mut strangers),
        format!("permission_denied 5000: {}\nholding\n", denial(stranger))
    );
    assert_eq!(
        answers(&mut readers),
        format!(
            "hello_ok 1024\ntoo_many_connections 3976: {}\nholding\n",
            over_cap(reader, 1024)
        )
    );
    // The reader's 1024 sessions and the owner's own.
    assert_eq!(connections_line(&sb), "connections: 1025");
}

#[test]
fn a_reader_beyond_its_cap_is_refused_naming_the_cap() {
    let Some((reader, _)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = open_daemon(&sb, &[("TETHER_MAX_CONNECTIONS_PER_UID", "3")]);
    let mut first = idle(&sb, "first", reader, 5, &["--hello"]);
    assert_eq!(
        answers(&mut first),
        format!(
            "hello_ok 3\ntoo_many_connections 2: {}\nholding\n",
            over_cap(reader, 3)
        )
    );
    // The CLI does not wait for a slot: a refusal at the limit is the
    // answer, given at once (the retry window here is ten minutes).
    let mut status = sb.tether_with_timeout("10m", &["status"]);
    status.uid(reader.uid).gid(reader.gid).current_dir("/");
    let out = cli::run(status, b"", Duration::from_secs(120));
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!("tether: {} (too_many_connections)\n", over_cap(reader, 3))
    );
    // Root is not capped.
    let _root: Vec<RawConn> = (0..5)
        .map(|_| {
            let mut conn = RawConn::open(&sb.socket());
            conn.hello(Capabilities::NONE);
            conn
        })
        .collect();
    // Slots come back when their sessions end.
    first.close_stdin();
    first.wait(Duration::from_secs(60));
    wait_for_connections(&sb.socket(), 5 + 1);
    let mut again = idle(&sb, "again", reader, 3, &["--hello"]);
    assert_eq!(answers(&mut again), "hello_ok 3\nholding\n");
}

#[test]
fn thirty_two_connections_are_kept_for_root_and_the_owner() {
    let Some((reader, _)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = open_daemon(
        &sb,
        &[
            ("TETHER_MAX_CONNECTIONS", "64"),
            ("TETHER_MAX_CONNECTIONS_PER_UID", "1000"),
        ],
    );
    let mut readers = idle(&sb, "reader", reader, 40, &["--hello"]);
    assert_eq!(
        answers(&mut readers),
        "hello_ok 32\ntoo_many_connections 8: the daemon is serving its maximum of 32 \
         connections for users other than root and its owner (max_connections 64 less 32 \
         kept for them); try again later\nholding\n"
    );
    let _root: Vec<RawConn> = (0..31)
        .map(|_| {
            let mut conn = RawConn::open(&sb.socket());
            conn.hello(Capabilities::NONE);
            conn
        })
        .collect();
    // Root's status makes 64; then one more connection fits, and no other.
    assert_eq!(connections_line(&sb), "connections: 64");
    let mut last = RawConn::open(&sb.socket());
    last.hello(Capabilities::NONE);
    let mut over = RawConn::open(&sb.socket());
    let error = over.expect_error();
    assert_eq!(
        (error.code, error.message.as_str()),
        (
            ErrorCode::TOO_MANY_CONNECTIONS,
            "the daemon is serving its maximum of 64 connections; try again later"
        )
    );
}

/// Waits until the daemon counts `n` sessions (the asking one included).
fn wait_for_connections(socket: &Path, n: u64) {
    wait::wait_until(Duration::from_secs(60), "the sessions to end", || {
        raw::status(socket).is_ok_and(|s| s.connections == n)
    });
}
