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

/// `DEV:INODE` of `path`, as systemd writes `JOURNAL_STREAM`.
fn journal_stream_of(path: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).unwrap();
    format!("{}:{}", meta.dev(), meta.ino())
}

/// Whether a journal listens on this machine (CI has none).
fn journal_present() -> bool {
    std::path::Path::new("/run/systemd/journal/socket").exists()
}

#[test]
fn a_journal_stream_naming_stderr_logs_to_the_journal_or_falls_back_to_stderr() {
    let sb = Sandbox::new();
    let mut cmd = tetherd(&sb, "d.log", &[]);
    // The command opened (and so created) its stderr file already.
    cmd.env("JOURNAL_STREAM", journal_stream_of(&sb.file("d.log")));
    let daemon = Tetherd::start(cmd, &sb, "d.log");
    let log = daemon.log();
    if journal_present() {
        assert!(!log.contains("listening"), "logged to stderr:\n{log}");
        return;
    }
    assert!(log.contains("cannot reach the journal"), "{log}");
    // The journal reads stderr and adds its own times: none of ours.
    for line in log.lines() {
        let level = line.split_whitespace().next().unwrap_or_default();
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&level),
            "not a bare level first: {line:?}"
        );
    }
}

#[test]
fn a_journal_stream_naming_another_file_is_ignored() {
    let sb = Sandbox::new();
    let mut cmd = tetherd(&sb, "d.log", &[]);
    let other = sb.file("other");
    std::fs::write(&other, "").unwrap();
    cmd.env("JOURNAL_STREAM", journal_stream_of(&other));
    let daemon = Tetherd::start(cmd, &sb, "d.log");
    let log = daemon.log();
    assert!(!log.contains("journal"), "{log}");
    // Text lines with their time first.
    let first = log.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("20") && first.contains("listening"),
        "{log}"
    );
}
