//! Local security, the parts about files: state files are the owner's
//! alone (0600) whatever the mode of the directory they are in, and even
//! when they were left looser before the daemon started; an existing
//! directory's mode is left as it is, and `--socket` naming a file that is
//! not a socket is refused rather than deleted.

use std::os::unix::fs::PermissionsExt;

use tether_tests::damage::{self, LOCK_FILE, LOG_FILE, STORE_FILE};
use tether_tests::Sandbox;

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn state_files_are_the_owners_alone_in_an_open_directory() {
    let sb = Sandbox::new();
    let state = sb.state_dir();
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut d = sb.start_daemon();
    sb.publish("s1", "a line\n");
    assert!(d.terminate().success());
    for name in [STORE_FILE, LOG_FILE, LOCK_FILE] {
        assert_eq!(mode(&state.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&state), 0o755, "an existing directory is not chmodded");
}

#[test]
fn a_store_left_open_to_others_is_narrowed_to_0600_at_start_and_said_once() {
    let sb = Sandbox::new();
    let state = sb.state_dir();
    let mut d = sb.start_daemon();
    sb.publish("s1", "a line\n");
    assert!(d.terminate().success());
    // As an older version, or a person, may have left them.
    for name in [STORE_FILE, LOG_FILE, LOCK_FILE] {
        std::fs::set_permissions(state.join(name), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    d.restart();
    for name in [STORE_FILE, LOG_FILE, LOCK_FILE] {
        assert_eq!(mode(&state.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&state), 0o755, "an existing directory is not chmodded");
    // The data is still there, and a later start has nothing to say.
    let out = sb.run(&["tail", "s1"]);
    out.assert_success();
    assert_eq!(out.stdout, "a line\n");
    assert!(d.terminate().success());
    d.restart();
    assert!(d.terminate().success());
    let logs = d.logs();
    for name in [STORE_FILE, LOG_FILE, LOCK_FILE] {
        let said = format!(
            "{} had mode 0644: narrowed to 0600, as state files are the owner's alone",
            state.join(name).display()
        );
        assert_eq!(logs.matches(&said).count(), 1, "{said:?} in:\n{logs}");
    }
}

#[test]
fn a_socket_path_naming_another_file_is_refused_and_the_file_kept() {
    let sb = Sandbox::new();
    std::fs::write(sb.socket(), "keep me\n").unwrap();
    let out = damage::start_refused(&sb);
    out.assert_code(1);
    assert!(
        out.stderr.contains(&format!(
            "tetherd: error: configuration: {} exists and is not a socket; refusing to replace it \
             (choose another --socket)",
            sb.socket().display()
        )),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(sb.socket()).unwrap(), "keep me\n");
}
