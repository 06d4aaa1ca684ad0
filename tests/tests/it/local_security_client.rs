//! Local security, the client's side: a socket directory another user
//! could write to, or made, is refused by both binaries; a process that
//! listens as another user is refused before anything is sent to it;
//! permission denied ends a command at once; the missing daemon is named
//! once, then retried; the directories tetherd makes are 0700 (0750 for
//! readers); and `--json` never alters a payload's bytes.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tether_tests::remote::{test_users, TestUser, READER, READERS_GROUP, STRANGER};
use tether_tests::wait::wait_until;
use tether_tests::{bins, cli, daemon, Background, Output, Sandbox};

/// Deadline for a command expected to end at once; far shorter than the
/// retry windows given, so that a command that retried would miss it.
const AT_ONCE: Duration = Duration::from_secs(60);
/// A retry window no test waits for.
const LONG_WINDOW: &str = "10m";

/// What the listener prints for the sentinel connection the tests make
/// after the client has finished: `sentinel` in hex.
const SENTINEL_HEX: &str = "73656e74696e656c";

/// Removes a directory when dropped, so that a failing test does not
/// leave another user's `/tmp/tether-$UID` behind.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

/// `tether ARGS...` with no path from the environment, run as `user`
/// (root when `None`), from `/`.
fn tether_as(user: Option<TestUser>, args: &[&str]) -> Command {
    let mut cmd = Command::new(bins::tether());
    cmd.args(args).current_dir("/");
    for var in [
        "TETHER_SOCKET",
        "TETHER_HOST",
        "RUNTIME_DIRECTORY",
        "XDG_RUNTIME_DIR",
    ] {
        cmd.env_remove(var);
    }
    if let Some(user) = user {
        cmd.uid(user.uid).gid(user.gid);
    }
    cmd
}

/// The listener, run as `user`, bound at `socket`, once it listens.
fn listen_as(user: TestUser, socket: &Path, log_dir: &Path) -> Background {
    let mut cmd = Command::new(bins::listener());
    cmd.arg(socket).uid(user.uid).gid(user.gid).current_dir("/");
    let listener = Background::spawn("listener", cmd, log_dir);
    wait_until(Duration::from_secs(60), "the listener to listen", || {
        listener.stdout() == "listening\n"
    });
    listener
}

/// Connects to the listener as root, sends `sentinel` and closes, then
/// returns everything the listener recorded once it has recorded that:
/// connections are served in order, so whatever a client sent before is
/// recorded above it.
fn listener_record(listener: &Background, socket: &Path) -> String {
    use std::io::Write;
    let mut conn = std::os::unix::net::UnixStream::connect(socket).unwrap();
    conn.write_all(b"sentinel").unwrap();
    drop(conn);
    wait_until(Duration::from_secs(60), "the listener's record", || {
        listener.stdout().contains(SENTINEL_HEX)
    });
    listener.stdout()
}

#[test]
fn a_fallback_directory_made_by_another_user_is_refused_before_connecting() {
    let Some((victim, attacker)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let dir = PathBuf::from(format!("/tmp/tether-{}", victim.uid));
    let _ = std::fs::remove_dir_all(&dir);
    let _cleanup = RemoveOnDrop(dir.clone());
    // The attacker got there first, with a directory the victim may enter.
    std::fs::create_dir(&dir).unwrap();
    chmod(&dir, 0o755);
    chown(&dir, attacker.uid, attacker.gid);
    let socket = dir.join("tether.sock");
    let listener = listen_as(attacker, &socket, sb.path());

    // The victim runs with no socket named anywhere: the fallback path.
    let cmd = tether_as(Some(victim), &["--connect-timeout", LONG_WINDOW, "status"]);
    let out = cli::run(cmd, b"", AT_ONCE);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "tether: refusing socket directory {}: it is owned by uid {} ({STRANGER}), not by \
             uid {} ({READER}) who runs this; another user may have made it to catch the \
             socket (remove it, or choose another socket path)\n",
            dir.display(),
            attacker.uid,
            victim.uid
        )
    );
    assert_eq!(out.stdout, "");
    // Not even a connection reached the attacker.
    assert_eq!(
        listener_record(&listener, &socket),
        format!("listening\nconnection 1: 8 bytes {SENTINEL_HEX}\n")
    );
}

#[test]
fn a_listener_run_by_another_user_is_refused_before_anything_is_sent() {
    let Some((victim, attacker)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    chmod(sb.path(), 0o711);
    // The attacker listens in a directory that passes every check: made
    // by the attacker, then given to root, 0755.
    let dir = sb.file("imp");
    std::fs::create_dir(&dir).unwrap();
    chown(&dir, attacker.uid, attacker.gid);
    let socket = dir.join("s");
    let listener = listen_as(attacker, &socket, sb.path());
    chown(&dir, 0, 0);
    chmod(&dir, 0o755);

    let socket_arg = socket.to_str().unwrap();
    let expected = format!(
        "tether: refusing the daemon at {}: the process listening there runs as uid {} \
         ({STRANGER}), who is neither root, nor uid {} ({READER}) who runs this, nor uid 0 \
         (root) who owns {}; nothing was sent to it\n",
        socket.display(),
        attacker.uid,
        victim.uid,
        dir.display()
    );
    for command in ["status", "dial-stdio"] {
        let args = [
            "--socket",
            socket_arg,
            "--connect-timeout",
            LONG_WINDOW,
            command,
        ];
        let out = cli::run(tether_as(Some(victim), &args), b"hello?", AT_ONCE);
        out.assert_code(1);
        assert_eq!(out.stderr, expected, "{command}");
        assert_eq!(out.stdout, "", "{command}");
    }
    // Each connected and read the listener's credentials, and sent nothing.
    assert_eq!(
        listener_record(&listener, &socket),
        format!(
            "listening\nconnection 1: 0 bytes \nconnection 2: 0 bytes \n\
             connection 3: 8 bytes {SENTINEL_HEX}\n"
        )
    );
}

#[test]
fn a_socket_directory_others_can_write_to_is_refused_by_both_binaries() {
    for mode in [0o770, 0o1777] {
        let sb = Sandbox::new();
        let dir = sb.file("open");
        std::fs::create_dir(&dir).unwrap();
        chmod(&dir, mode);
        let socket = dir.join("s");
        let why = format!(
            "refusing socket directory {}: it is writable by users other than its owner, \
             uid 0 (root), and root (mode {mode:04o}); anyone who can write there can put a \
             socket in the daemon's place",
            dir.display()
        );

        let mut cmd = daemon::command(&socket, &sb.state_dir());
        cmd.env_remove("TETHER_CONFIG");
        let out = cli::run(cmd, b"", AT_ONCE);
        out.assert_code(1);
        assert!(
            out.stderr
                .lines()
                .any(|line| line == format!("tetherd: error: {why}")),
            "{}",
            out.stderr
        );
        assert!(!socket.exists(), "tetherd bound a socket in {mode:o}");
        assert_eq!(mode_of(&dir), mode, "the directory was chmodded");

        let args = [
            "--socket",
            socket.to_str().unwrap(),
            "--connect-timeout",
            LONG_WINDOW,
            "status",
        ];
        let out = cli::run(tether_as(None, &args), b"", AT_ONCE);
        out.assert_code(1);
        assert_eq!(out.stderr, format!("tether: {why}\n"));
    }
}

fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[test]
fn permission_denied_on_connect_exits_1_at_once() {
    let Some((reader, _)) = test_users() else {
        return;
    };
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    // The user may reach the socket (0600, root's) but not connect to it.
    chmod(sb.path(), 0o711);
    let socket = sb.socket();
    let args = [
        "--socket",
        socket.to_str().unwrap(),
        "--connect-timeout",
        LONG_WINDOW,
        "status",
    ];
    let out = cli::run(tether_as(Some(reader), &args), b"", AT_ONCE);
    out.assert_code(1);
    assert_eq!(
        out.stderr,
        format!(
            "tether: cannot connect to {}: permission denied: the socket or its directory \
             does not let uid {} ({READER}) in\n",
            socket.display(),
            reader.uid
        )
    );
}

#[test]
fn no_daemon_is_named_once_then_retried_quietly_until_exit_4() {
    let sb = Sandbox::new();
    let socket = sb.file("absent.sock");
    for (timeout, args) in [
        ("300ms", &["status"][..]),
        ("1500ms", &["tail", "-f", "s"][..]),
    ] {
        let mut cmd = tether_as(None, &["--socket", socket.to_str().unwrap()]);
        cmd.args(["--connect-timeout", timeout]).args(args);
        let out: Output = cli::run(cmd, b"", AT_ONCE);
        out.assert_code(4);
        let shown = match timeout {
            "300ms" => "300ms",
            _ => "1.5s",
        };
        assert_eq!(
            out.stderr,
            format!(
                "tether: no daemon at {path} (retrying for {shown}; start one with 'tetherd' \
                 or 'systemctl start tetherd')\n\
                 tether: cannot reach tetherd at {path} (gave up after {shown}): No such file \
                 or directory (os error 2)\n",
                path = socket.display()
            )
        );
    }
}

#[test]
fn json_output_keeps_bytes_that_are_not_utf8_as_base64() {
    let sb = Sandbox::new();
    let _daemon = sb.start_daemon();
    // Latin-1 "café", then UTF-8 "café".
    let out = sb.run_with_stdin(&["publish", "bytes"], b"caf\xe9\ncaf\xc3\xa9\n");
    out.assert_success();
    let out = sb.run(&["tail", "bytes", "--json"]);
    out.assert_success();
    let lines: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{}", out.stdout);
    let keys = |value: &serde_json::Value| -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(
        keys(&lines[0]),
        ["kind", "payload_b64", "seq", "stream", "ts"]
    );
    assert_eq!(lines[0]["payload_b64"], "Y2Fm6Q==");
    assert_eq!(keys(&lines[1]), ["kind", "payload", "seq", "stream", "ts"]);
    assert_eq!(lines[1]["payload"], "café");
}

#[test]
fn socket_directories_the_daemon_makes_are_0700_or_0750_for_readers() {
    use std::os::unix::fs::MetadataExt;
    // The readers' group exists once the test users do.
    if test_users().is_none() {
        return;
    }
    let sb = Sandbox::new();
    let socket = sb.file("a/b/s");
    let mut d = daemon::Daemon::start(&socket, &sb.state_dir(), sb.path());
    assert_eq!(mode_of(&sb.file("a")), 0o700);
    assert_eq!(mode_of(&sb.file("a/b")), 0o700);
    assert_eq!(mode_of(&socket), 0o600);
    assert!(d.terminate().success());

    let socket = sb.file("r/s");
    let state = sb.file("r-state");
    let env = [("TETHER_READERS_GROUP", READERS_GROUP)];
    let mut d = daemon::Daemon::start_with_env(&socket, &state, sb.path(), &env);
    let readers_gid = group_id(READERS_GROUP);
    let dir = std::fs::metadata(sb.file("r")).unwrap();
    assert_eq!((dir.mode() & 0o7777, dir.gid()), (0o750, readers_gid));
    let sock = std::fs::metadata(&socket).unwrap();
    assert_eq!((sock.mode() & 0o7777, sock.gid()), (0o660, readers_gid));
    assert!(d.terminate().success());
}

/// The gid of group `name`, from `getent group`.
fn group_id(name: &str) -> u32 {
    let out = Command::new("getent")
        .args(["group", name])
        .output()
        .unwrap();
    let line = String::from_utf8(out.stdout).unwrap();
    line.split(':').nth(2).unwrap().trim().parse().unwrap()
}
