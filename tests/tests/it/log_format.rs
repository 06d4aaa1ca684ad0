//! `--log-format json`: every line the daemon writes to stderr, from start
//! to shutdown, is one JSON object with a level and a message.

use tether_tests::Sandbox;

use crate::systemd_support::{tetherd, Tetherd};

#[test]
fn json_log_format_writes_only_json_lines() {
    let sb = Sandbox::new();
    let mut daemon = Tetherd::start(
        tetherd(&sb, "d.log", &["--log-format", "json"]),
        &sb,
        "d.log",
    );
    sb.publish("s", "hello\n");
    daemon.signal(tether_tests::Signal::Term);
    let status = daemon.wait(std::time::Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let log = daemon.log();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 3, "too few lines:\n{log}");
    for line in &lines {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(value["level"].is_string(), "{line}");
        assert!(value["fields"]["message"].is_string(), "{line}");
    }
    assert!(
        log.contains("listening") && log.contains("tetherd stopped"),
        "{log}"
    );
}

#[test]
fn the_log_format_is_read_from_the_config_file() {
    let sb = Sandbox::new();
    let path = sb.file("tetherd.toml");
    std::fs::write(&path, "log_format = \"json\"\n").unwrap();
    let daemon = Tetherd::start(
        tetherd(&sb, "d.log", &["--config", path.to_str().unwrap()]),
        &sb,
        "d.log",
    );
    let log = daemon.log();
    let first = log.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "{log}"
    );
}
