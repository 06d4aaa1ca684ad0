//! The `tetherd` binary's command line: version, usage errors, refusals
//! that happen before any socket is bound.

use std::process::Command;

fn tetherd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tetherd"))
}

#[test]
fn version_flag_prints_the_package_version() {
    let out = tetherd().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("tetherd {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = tetherd().arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
}

#[test]
fn unusable_state_dir_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = tetherd()
        .arg("--state-dir")
        .arg(&file)
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot create state directory {}", file.display())),
        "{stderr}"
    );
}
