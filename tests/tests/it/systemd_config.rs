//! The config file and its environment overrides: bad keys, bad values and
//! missing files are clear errors; SIGHUP applies a changed retention limit.

use std::time::Duration;

use tether_tests::text::lines;
use tether_tests::{cli, raw, Sandbox, Signal};

use crate::systemd_support::{tetherd, Tetherd};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `tetherd ARGS...` expecting it to refuse to start; returns stderr.
fn refused(sb: &Sandbox, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut cmd = tetherd(sb, "refused.log", args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cli::run(cmd, b"", TIMEOUT);
    assert_eq!(
        out.code,
        Some(1),
        "tetherd should have refused to start: {out:?}"
    );
    assert!(!sb.socket().exists(), "a refused daemon bound its socket");
    out.stderr
}

fn config_file(sb: &Sandbox, text: &str) -> String {
    let path = sb.file("tetherd.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn an_unknown_key_is_an_error_naming_the_key_and_the_file() {
    let sb = Sandbox::new();
    let file = config_file(&sb, "[retention]\nmax_frame = 10\n");
    let err = refused(&sb, &["--config", &file], &[]);
    assert!(err.contains("max_frame"), "{err}");
    assert!(err.contains(&file), "{err}");
}

#[test]
fn a_bad_value_is_an_error_naming_the_key() {
    let sb = Sandbox::new();
    let file = config_file(&sb, "[socket]\nmode = 0o1777\n");
    let err = refused(&sb, &["--config", &file], &[]);
    assert!(err.contains("socket.mode"), "{err}");

    let file = config_file(&sb, "max_connections = \"many\"\n");
    let err = refused(&sb, &["--config", &file], &[]);
    assert!(err.contains("max_connections"), "{err}");
}

#[test]
fn a_missing_config_file_named_on_the_command_line_is_an_error_naming_it() {
    let sb = Sandbox::new();
    let missing = sb.file("absent.toml");
    let missing = missing.to_str().unwrap();
    let err = refused(&sb, &["--config", missing], &[]);
    assert!(
        err.contains(missing) && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn a_bad_environment_override_is_an_error_naming_the_variable() {
    let sb = Sandbox::new();
    let err = refused(&sb, &[], &[("TETHER_RETENTION_MAX_FRAMES", "lots")]);
    assert!(err.contains("TETHER_RETENTION_MAX_FRAMES"), "{err}");
}

#[test]
fn the_default_config_file_is_read_from_the_service_config_dir() {
    let sb = Sandbox::new();
    let dir = sb.path().join("etc-tether");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tetherd.toml"), "bogus = 1\n").unwrap();
    let dir = dir.to_str().unwrap();
    let err = refused(&sb, &[], &[("CONFIGURATION_DIRECTORY", dir)]);
    assert!(err.contains("bogus"), "{err}");
}

#[test]
fn sighup_applies_a_changed_retention_limit_and_logs_what_needs_a_restart() {
    let sb = Sandbox::new();
    let file = config_file(&sb, "[retention]\nmax_frames = 1000\n");
    let mut daemon = Tetherd::start(
        tetherd(&sb, "tetherd.log", &["--config", &file]),
        &sb,
        "tetherd.log",
    );
    sb.publish("kept", &lines(1..=50));
    raw::assert_stored(&sb.socket(), "kept", 50);

    config_file(&sb, "max_connections = 7\n[retention]\nmax_frames = 10\n");
    daemon.hup();
    let start = std::time::Instant::now();
    loop {
        // Each append gives retention a reason to look at the stream.
        sb.publish("kept", &lines(1..=1));
        let info = raw::stream_info(&sb.socket(), "kept").unwrap();
        if info.frames <= 10 {
            break;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "retention of 10 frames not applied after SIGHUP: {info:?}\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = daemon.log();
    assert!(
        log.contains("max_connections") && log.contains("restart"),
        "the reload did not say max_connections needs a restart:\n{log}"
    );
    daemon.signal(Signal::Term);
    assert!(daemon.wait(TIMEOUT).success(), "{}", daemon.log());
}
